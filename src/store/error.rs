//! Errors of the store: every one names the file it is about and says what to do.

use std::io;
use std::path::PathBuf;

use uuid::Uuid;

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("cannot {op} {path}")]
    Io {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("{path} is corrupt: {reason}; it was moved aside to {kept} and nothing was overwritten; repair or remove it, then retry")]
    Corrupt {
        path: PathBuf,
        reason: String,
        kept: PathBuf,
    },
    #[error("{path} does not parse: {reason}")]
    Unreadable { path: PathBuf, reason: String },
    #[error("no rover store at {path}: is the project id right? (`rover autopilot traces --project-id ID`, or run inside the repository)")]
    MissingStore { path: PathBuf },
    #[error("no span, action or trace matches {id:?}")]
    UnknownId { id: String },
    #[error("{id:?} is ambiguous: it matches {}; give more characters", .matches.join(", "))]
    AmbiguousId { id: String, matches: Vec<String> },
    #[error("{id:?} is too short: give at least {min} characters of an id")]
    ShortId { id: String, min: usize },
    #[error("span {0} not found")]
    SpanNotFound(Uuid),
    #[error("action {0} not found")]
    ActionNotFound(Uuid),
    #[error("no pending action {0} in the queue")]
    NotPending(Uuid),
    #[error(transparent)]
    Lifecycle(#[from] super::records::SpanLifecycleError),
    #[error("another rover daemon for this project is running (pid {pid}); stop it first, or inspect it with `rover autopilot status`")]
    DaemonRunning { pid: String },
}

impl StoreError {
    pub(crate) fn io(
        op: &'static str,
        path: impl Into<PathBuf>,
    ) -> impl FnOnce(io::Error) -> StoreError {
        let path = path.into();
        move |source| StoreError::Io { op, path, source }
    }
}

pub type Result<T, E = StoreError> = std::result::Result<T, E>;

impl crate::error::Kinded for StoreError {
    fn kind(&self) -> crate::error::ErrorKind {
        use crate::error::ErrorKind;
        match self {
            StoreError::Io { .. } | StoreError::Lifecycle(_) => ErrorKind::Internal,
            StoreError::Corrupt { .. } | StoreError::Unreadable { .. } => ErrorKind::Corrupt,
            StoreError::MissingStore { .. }
            | StoreError::UnknownId { .. }
            | StoreError::SpanNotFound(_)
            | StoreError::ActionNotFound(_) => ErrorKind::NotFound,
            StoreError::AmbiguousId { .. } | StoreError::ShortId { .. } => ErrorKind::Usage,
            StoreError::NotPending(_) => ErrorKind::Refused,
            StoreError::DaemonRunning { .. } => ErrorKind::Unavailable,
        }
    }
}
