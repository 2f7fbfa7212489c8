//! rover's process environment, read once: [`HostEnv::from_process`] at start (the daemon, a
//! command of the CLI) takes a snapshot that is handed down to whatever decides by a variable
//! (where Docker is, the GitHub API's URL, the model keys the proxy adds, what a sandbox may
//! be given, the telemetry's endpoint). Nothing below the CLI and the daemon reads the
//! process environment itself (`tests/it/layers.rs` checks it), so a test builds any
//! configuration with [`HostEnv::from_pairs`] without setting a variable of its process.

use std::collections::BTreeMap;
use std::ffi::{OsStr, OsString};
use std::sync::Arc;

/// A snapshot of environment variables. Cheap to clone.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct HostEnv {
    vars: Arc<BTreeMap<OsString, OsString>>,
}

impl HostEnv {
    /// The process's environment as it is now: the one place rover reads it.
    pub fn from_process() -> HostEnv {
        HostEnv {
            vars: Arc::new(std::env::vars_os().collect()),
        }
    }

    /// An environment of exactly these variables (tests, a child's environment).
    pub fn from_pairs<K: Into<OsString>, V: Into<OsString>>(
        pairs: impl IntoIterator<Item = (K, V)>,
    ) -> HostEnv {
        HostEnv {
            vars: Arc::new(
                pairs
                    .into_iter()
                    .map(|(k, v)| (k.into(), v.into()))
                    .collect(),
            ),
        }
    }

    /// This environment with `name` set to `value`.
    #[must_use]
    pub fn with(&self, name: impl Into<OsString>, value: impl Into<OsString>) -> HostEnv {
        let mut vars = (*self.vars).clone();
        vars.insert(name.into(), value.into());
        HostEnv {
            vars: Arc::new(vars),
        }
    }

    /// The value of `name` when set and valid UTF-8 (as `std::env::var` gives it).
    pub fn var(&self, name: &str) -> Option<String> {
        self.vars
            .get(OsStr::new(name))
            .and_then(|v| v.to_str())
            .map(str::to_owned)
    }

    /// The value of `name` when set, whatever its bytes (as `std::env::var_os` gives it).
    pub fn var_os(&self, name: &str) -> Option<&OsStr> {
        self.vars.get(OsStr::new(name)).map(OsString::as_os_str)
    }

    /// The value of `name` when set to something other than blanks.
    pub fn non_empty(&self, name: &str) -> Option<String> {
        self.var(name).filter(|v| !v.trim().is_empty())
    }

    /// Whether `name` is set to something other than blanks.
    pub fn is_set(&self, name: &str) -> bool {
        self.non_empty(name).is_some()
    }

    /// Every variable whose name and value are valid UTF-8.
    pub fn vars(&self) -> impl Iterator<Item = (&str, &str)> {
        self.vars
            .iter()
            .filter_map(|(k, v)| Some((k.to_str()?, v.to_str()?)))
    }
}

impl std::fmt::Debug for HostEnv {
    /// The names only: values may be secrets.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_set().entries(self.vars.keys()).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_snapshot_answers_as_the_environment_does_and_never_shows_values() {
        let env = HostEnv::from_pairs([("A", "1"), ("BLANK", "  ")]);
        assert_eq!(env.var("A").as_deref(), Some("1"));
        assert_eq!(env.var("B"), None);
        assert!(env.is_set("A"));
        assert!(!env.is_set("BLANK"));
        assert_eq!(env.var("BLANK").as_deref(), Some("  "));
        let more = env.with("B", "2");
        assert_eq!(more.var("B").as_deref(), Some("2"));
        assert_eq!(env.var("B"), None, "the original is unchanged");
        assert_eq!(format!("{more:?}"), r#"{"A", "B", "BLANK"}"#);
        assert_eq!(more.vars().count(), 3);
    }
}
