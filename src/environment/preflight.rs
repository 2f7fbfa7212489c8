//! What `start` checks of the repository's environment before it takes any work: a default
//! branch that declares one (`.devcontainer/devcontainer.json`, `.rover/setup.sh` or
//! `autopilot.sandbox.setup`) is built with the dev container CLI, so that CLI must answer now,
//! not at the first trace.

use std::path::Path;
use std::time::Duration;

use super::definition::define;
use super::record::EnvSource;
use crate::git::Workspace;
use crate::host_env::HostEnv;
use crate::sandbox::SandboxSettings;

/// The one command that installs the dev container CLI rover is tested with.
pub const INSTALL_CLI: &str = "npm install -g @devcontainers/cli@0.89.0";

/// How long `devcontainer --version` may take.
const VERSION_LIMIT: Duration = Duration::from_secs(60);

/// What the default branch of the repository at `root` declares, with the dev container CLI's
/// version: `Ok(None)` when it declares nothing (or cannot be read yet: the first trace says
/// why); `Err` with what to do when the CLI does not answer. `host` is rover's environment.
pub async fn check(
    root: &Path,
    settings: &SandboxSettings,
    host: &HostEnv,
) -> Result<Option<(EnvSource, String)>, String> {
    let Ok(ws) = Workspace::open(root).await else {
        return Ok(None);
    };
    let definition = match define(&ws, settings, host).await {
        Ok(Some(definition)) => definition,
        Ok(None) => return Ok(None),
        Err(e) => {
            tracing::warn!(error = %crate::error::error_chain(&e), "the default branch's environment definition cannot be used; its traces will fail saying why");
            return Ok(None);
        }
    };
    let declared = match (definition.source, &definition.config_path) {
        (EnvSource::SetupCommands, _) => "autopilot.sandbox.setup".to_owned(),
        (_, Some(path)) => format!("`{path}`"),
        (_, None) => format!("`{}`", super::SETUP_SCRIPT),
    };
    let cli = &settings.environment.devcontainer_cli;
    let refused = |why: String| {
        format!(
            "this repository declares its environment ({declared} on its default branch), which rover builds with the dev container CLI, and `{cli} --version` {why}: install it with `{INSTALL_CLI}` (or set autopilot.sandbox.environment.devcontainerCli to its path; environment.fromRepository false runs autopilot.sandbox.image as it is)"
        )
    };
    let output = tokio::process::Command::new(cli)
        .arg("--version")
        .env_clear()
        .envs(crate::sandbox::build_env(host))
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true)
        .output();
    let output = match tokio::time::timeout(VERSION_LIMIT, output).await {
        Ok(Ok(output)) => output,
        Ok(Err(e)) => return Err(refused(format!("cannot run ({e})"))),
        Err(_) => {
            return Err(refused(format!(
                "did not answer in {} s",
                VERSION_LIMIT.as_secs()
            )))
        }
    };
    if !output.status.success() {
        let stderr = String::from_utf8_lossy(&output.stderr);
        return Err(refused(format!(
            "failed ({}): {}",
            output.status,
            stderr.trim().chars().take(300).collect::<String>()
        )));
    }
    let version = String::from_utf8_lossy(&output.stdout).trim().to_owned();
    Ok(Some((definition.source, version)))
}
