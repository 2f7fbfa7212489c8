//! `rover autopilot start`, the command line's half: which project the daemon serves (the
//! repository, `--repo`, `--project-id`), then the daemon itself (`daemon::start`), whose
//! errors become the command's.

use std::process::ExitCode;

use super::{CliError, Context};
use crate::daemon::StartOptions;

pub fn start(ctx: &Context, options: StartOptions) -> Result<ExitCode, CliError> {
    let project = ctx.project()?;
    Ok(crate::daemon::start(project, options, ctx.host.clone())?)
}
