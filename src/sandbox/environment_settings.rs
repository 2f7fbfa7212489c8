//! `EnvironmentSettings`: `autopilot.sandbox.environment` in `rover.json` (what
//! [`crate::environment`] builds from; kept with the sandbox's settings it is part of).

use serde::Deserialize;

/// How rover builds a repository's own sandbox image (see docs/sandbox.md).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct EnvironmentSettings {
    /// Build the image from the repository's default branch (`.devcontainer/devcontainer.json`,
    /// `.rover/setup.sh` or `autopilot.sandbox.setup`); `false` runs everything in
    /// `autopilot.sandbox.image` as it is.
    pub from_repository: bool,
    /// The dev container CLI (`@devcontainers/cli`, 0.89.0 tested): a path or a name on PATH.
    pub devcontainer_cli: String,
    /// More paths of the default branch whose content defines the environment (files, or
    /// directories for everything under them), besides the devcontainer files, the setup script
    /// and the lockfiles rover knows: a change to one rebuilds the image.
    pub inputs: Vec<String>,
    /// Longest one build may take, in seconds; then it is stopped and the task fails.
    pub build_timeout_secs: u64,
    /// Names of variables of rover's environment a definition may read with
    /// `${localEnv:NAME}` (or `${env:NAME}`); a definition that reads any other is refused. The
    /// dev container CLI gets these (with their values) besides the few it always gets.
    pub local_env: Vec<String>,
}

impl Default for EnvironmentSettings {
    fn default() -> Self {
        Self {
            from_repository: true,
            devcontainer_cli: "devcontainer".to_owned(),
            inputs: Vec::new(),
            build_timeout_secs: 3600,
            local_env: Vec::new(),
        }
    }
}

impl EnvironmentSettings {
    /// What `rover.json` cannot say: a `localEnv` entry that is not a variable name, or that
    /// names a credential rover keeps from every container (a GitHub or registry token, a model
    /// key).
    pub fn validate(&self) -> Result<(), String> {
        for name in &self.local_env {
            let mut chars = name.chars();
            let valid = chars
                .next()
                .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
                && chars.all(|c| c.is_ascii_alphanumeric() || c == '_');
            if !valid {
                return Err(format!(
                    "autopilot.sandbox.environment.localEnv: `{name}` is not a variable name (letters, digits and `_`, not starting with a digit)"
                ));
            }
            if super::ALWAYS_REFUSED_ENV
                .iter()
                .chain(super::MODEL_ENV_REFUSED)
                .any(|r| r.eq_ignore_ascii_case(name))
            {
                return Err(format!(
                    "autopilot.sandbox.environment.localEnv: `{name}` is a credential rover keeps out of every container, and a definition that reads it would hand it to a setup that has the network; remove it"
                ));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn local_env_takes_variable_names_and_no_credential() {
        let settings: EnvironmentSettings =
            serde_json::from_str(r#"{"localEnv": ["NPM_CONFIG_REGISTRY", "_X1"]}"#).expect("valid");
        assert_eq!(settings.local_env, ["NPM_CONFIG_REGISTRY", "_X1"]);
        assert!(settings.validate().is_ok());
        assert!(EnvironmentSettings::default().local_env.is_empty());
        for bad in [
            "1X",
            "A-B",
            "",
            "HOME:x",
            "A B",
            "GITHUB_TOKEN",
            "anthropic_api_key",
        ] {
            let settings = EnvironmentSettings {
                local_env: vec![bad.to_owned()],
                ..EnvironmentSettings::default()
            };
            let err = settings.validate().expect_err(bad);
            assert!(err.contains("localEnv"), "{bad}: {err}");
        }
    }
}
