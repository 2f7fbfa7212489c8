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
}

impl Default for EnvironmentSettings {
    fn default() -> Self {
        Self {
            from_repository: true,
            devcontainer_cli: "devcontainer".to_owned(),
            inputs: Vec::new(),
            build_timeout_secs: 3600,
        }
    }
}
