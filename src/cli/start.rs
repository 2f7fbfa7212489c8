//! `rover autopilot start`, the command line's half: which project the daemon serves (the
//! repository, `--repo`, `--project-id`), or outside a checkout the repositories of a daemon
//! file (`--config FILE`, default `~/.config/rover/daemon.json`), then the daemon itself
//! (`daemon::start`, `daemon::start_fleet`), whose errors become the command's.

use std::path::PathBuf;
use std::process::ExitCode;

use super::{CliError, Context};
use crate::config::DaemonFile;
use crate::daemon::StartOptions;
use crate::project::ProjectError;

/// `daemon_file`: the one `Context::daemon_file` found (`--config`, or the default outside a
/// checkout).
pub fn start(
    ctx: &Context,
    daemon_file: Option<PathBuf>,
    options: StartOptions,
) -> Result<ExitCode, CliError> {
    if let Some(path) = daemon_file {
        let file = DaemonFile::load(&path)?;
        return Ok(crate::daemon::start_fleet(&file, options, &ctx.host)?);
    }
    match ctx.project() {
        Ok(project) => Ok(crate::daemon::start(project, options, ctx.host.clone())?),
        Err(CliError::Project(ProjectError::NotARepository { dir })) => Err(CliError::Usage(format!(
            "{} is not inside a git repository: run rover in your repository, pass --project-id ID (and --repo OWNER/NAME), or list the repositories one daemon serves in a daemon file (--config FILE; default ~/.config/rover/daemon.json, see docs/configuration.md)",
            dir.display()
        ))),
        Err(e) => Err(e),
    }
}
