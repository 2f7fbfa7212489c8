//! The environment subsystem's error type.

use std::path::PathBuf;

/// What stops rover from having a repository's environment image.
#[derive(Debug, thiserror::Error)]
pub enum EnvironmentError {
    /// The definition on the default branch cannot be used as it is.
    #[error("{path} on the default branch cannot be used: {reason}")]
    Definition { path: String, reason: String },
    /// A program rover needs for the build is not there.
    #[error("cannot run `{program}`: {hint}")]
    Program {
        program: String,
        hint: String,
        #[source]
        source: std::io::Error,
    },
    /// A step of the build failed; `reproduce` runs it again by hand.
    #[error("the environment build failed at `{step}` (log: {}): {output}; to run it again: {reproduce}", log.display())]
    Build {
        step: String,
        output: String,
        log: PathBuf,
        reproduce: String,
    },
    /// The build took longer than `autopilot.sandbox.environment.buildTimeoutSecs`.
    #[error("the environment build passed its limit of {secs} s (autopilot.sandbox.environment.buildTimeoutSecs) at `{step}`; log: {}; to run it again: {reproduce}", log.display())]
    Timeout {
        step: String,
        secs: u64,
        log: PathBuf,
        reproduce: String,
    },
    /// Reading the default branch failed.
    #[error("cannot read the default branch's environment definition")]
    Git(#[from] crate::git::GitError),
    /// A file of the build could not be written.
    #[error("cannot write {}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

impl EnvironmentError {
    /// The command that reproduces a failed build step, when there is one.
    pub fn reproduce(&self) -> Option<&str> {
        match self {
            Self::Build { reproduce, .. } | Self::Timeout { reproduce, .. } => Some(reproduce),
            _ => None,
        }
    }
}
