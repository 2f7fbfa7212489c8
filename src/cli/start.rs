//! `rover autopilot start`, the command line's half: which project the daemon serves (the
//! repository, `--repo`, `--project-id`), then the daemon itself (`daemon::start`), whose
//! errors become the command's.

use std::process::ExitCode;

use super::{CliError, Context};
use crate::daemon::{StartError, StartOptions};

pub fn start(ctx: &Context, options: StartOptions) -> Result<ExitCode, CliError> {
    let project = ctx.project()?;
    crate::daemon::start(project, options).map_err(CliError::from)
}

impl From<StartError> for CliError {
    fn from(e: StartError) -> CliError {
        match e {
            StartError::Project(e) => CliError::Project(e),
            StartError::Store(e) => CliError::Store(e),
            StartError::Refused(reason) => CliError::Refused(reason),
        }
    }
}
