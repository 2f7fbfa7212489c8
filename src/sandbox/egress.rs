//! `autopilot.sandbox.egress`: what an agent container may reach.
//!
//! Every agent runs on a network of its own that Docker makes `internal` (no route out, no
//! address of the host on it): the only other member is rover's relay, which hands each
//! connection to rover's proxy. The proxy forwards model requests with the real key (the
//! container holds a token worthless elsewhere) and lets `HTTPS_PROXY`/`HTTP_PROXY` traffic
//! through only to what this setting allows, recording every connection.

use serde::{Deserialize, Serialize};

use crate::proxy::Egress as EgressPolicy;

/// What an agent container may reach besides the model API through rover's proxy.
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize, schemars::JsonSchema)]
#[serde(untagged)]
pub enum Egress {
    /// `"model-only"` (the default), `"none"` or `"open"`.
    Mode(EgressMode),
    /// `{"allow": ["pypi.org", "*.pythonhosted.org", "registry.example:8443"]}`: the model API
    /// and these hosts (port 443 or 80 unless one is named), through the proxy.
    Allow {
        /// Host names, `*.suffix` patterns, or `host:port`.
        allow: Vec<String>,
    },
    #[default]
    #[serde(skip)]
    DefaultModelOnly,
}

/// The named egress modes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum EgressMode {
    /// The model API through rover's proxy, nothing else.
    ModelOnly,
    /// No network at all: not even the model API (fake agents, fully offline runs).
    None,
    /// Anything the engine's network reaches (the host's addresses included), plus the model
    /// API through rover's proxy; connections are not recorded.
    Open,
}

impl Egress {
    /// The policy a run's grant carries.
    pub fn policy(&self) -> EgressPolicy {
        match self {
            Egress::Mode(EgressMode::ModelOnly) | Egress::DefaultModelOnly => {
                EgressPolicy::ModelOnly
            }
            Egress::Mode(EgressMode::None) => EgressPolicy::Closed,
            Egress::Mode(EgressMode::Open) => EgressPolicy::Open,
            Egress::Allow { allow } => EgressPolicy::Allow {
                hosts: allow.clone(),
            },
        }
    }

    /// No network at all: the container runs with Docker's `none` network and no proxy.
    pub fn is_none(&self) -> bool {
        matches!(self, Egress::Mode(EgressMode::None))
    }

    /// The engine's network reaches out directly (today's `bridge`).
    pub fn is_open(&self) -> bool {
        matches!(self, Egress::Mode(EgressMode::Open))
    }

    /// The setting as written in `rover.json`, for messages and spans.
    pub fn describe(&self) -> String {
        match self {
            Egress::Mode(EgressMode::ModelOnly) | Egress::DefaultModelOnly => "model-only".into(),
            Egress::Mode(EgressMode::None) => "none".into(),
            Egress::Mode(EgressMode::Open) => "open".into(),
            Egress::Allow { allow } => format!("allow {}", allow.join(", ")),
        }
    }

    /// Checks the allow-list entries: a host name, `*.suffix` or `host:port`, no scheme, path
    /// or blank.
    pub fn validate(&self) -> Result<(), String> {
        let Egress::Allow { allow } = self else {
            return Ok(());
        };
        for entry in allow {
            let (host, port) = match entry.rsplit_once(':') {
                Some((h, p)) if !h.contains(':') => (h, Some(p)),
                _ => (entry.as_str(), None),
            };
            let host_ok = !host.is_empty()
                && host
                    .trim_start_matches("*.")
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-'))
                && !host.trim_start_matches("*.").is_empty();
            let port_ok = port.is_none_or(|p| p.parse::<u16>().is_ok_and(|p| p > 0));
            if !host_ok || !port_ok {
                return Err(format!(
                    "autopilot.sandbox.egress.allow: `{entry}` is not a host name, `*.suffix` or `host:port` (no scheme, path or spaces)"
                ));
            }
        }
        Ok(())
    }
}

impl Serialize for Egress {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Egress::Allow { allow } => {
                use serde::ser::SerializeMap;
                let mut map = s.serialize_map(Some(1))?;
                map.serialize_entry("allow", allow)?;
                map.end()
            }
            other => s.serialize_str(&other.describe()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_modes_and_the_allow_list_parse_and_anything_else_is_refused() {
        let parse = |t: &str| serde_json::from_str::<Egress>(t);
        assert_eq!(
            parse("\"model-only\"").unwrap().policy(),
            EgressPolicy::ModelOnly
        );
        assert_eq!(Egress::default().policy(), EgressPolicy::ModelOnly);
        assert!(parse("\"none\"").unwrap().is_none());
        assert!(parse("\"open\"").unwrap().is_open());
        let allow =
            parse(r#"{"allow": ["pypi.org", "*.pythonhosted.org", "r.example:8443"]}"#).unwrap();
        allow.validate().unwrap();
        assert_eq!(
            serde_json::to_value(allow.policy()).unwrap(),
            serde_json::json!({"mode": "allow", "hosts": ["pypi.org", "*.pythonhosted.org", "r.example:8443"]})
        );
        assert!(parse("\"bridge\"").is_err());
        assert!(parse(r#"{"allow": "pypi.org"}"#).is_err());
        for bad in [
            "https://pypi.org",
            "pypi.org/simple",
            "a b",
            "",
            "x:0",
            "*.",
        ] {
            let e = Egress::Allow {
                allow: vec![bad.to_owned()],
            };
            assert!(e.validate().is_err(), "{bad}");
        }
        assert_eq!(
            serde_json::to_value(Egress::default()).unwrap(),
            "model-only"
        );
    }
}
