//! The sandbox subsystem's error type.

use std::path::PathBuf;

/// Everything that can go wrong talking to the container engine or preparing a container.
#[derive(Debug, thiserror::Error)]
pub enum SandboxError {
    /// The engine does not answer.
    #[error("cannot reach the Docker engine at {host}; start it (as root: `bash tests/setup-docker.sh`, or `systemctl start docker`) or point DOCKER_HOST at a running one")]
    DaemonUnreachable {
        host: String,
        #[source]
        source: bollard::errors::Error,
    },
    /// The image is not present locally; rover never pulls.
    #[error("sandbox image `{image}` is not present in the local Docker engine; build it (see docs/sandbox.md) and set `autopilot.sandbox.image` in rover.json")]
    ImageMissing { image: String },
    /// A container with that name already exists (one container per action).
    #[error("a container named `{name}` already exists; re-attach to it by its labels instead of starting another")]
    Conflict {
        name: String,
        #[source]
        source: bollard::errors::Error,
    },
    /// An environment variable that must never reach a sandbox, or that is not allow-listed.
    #[error("refusing to pass `{name}` into the sandbox: {reason}")]
    EnvRefused { name: String, reason: &'static str },
    /// The worktree (or input dir) to mount cannot be used.
    #[error("cannot mount {} into the sandbox; does it exist?", path.display())]
    Mount {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The worktree's `.git` is not rover's any more; no container is started over it.
    #[error("tampered: {} in the worktree is not rover's git file ({what}); nothing of this worktree is trusted", path.display())]
    Tampered { path: PathBuf, what: String },
    /// Writing a log file or reading a file for an image failed.
    #[error("cannot write or read {}", path.display())]
    File {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// Building an image failed before reaching the engine.
    #[error("cannot build sandbox image `{image}`: {reason}")]
    ImageBuild { image: String, reason: String },
    /// rover's model and egress proxy, or a run's relay, is not answering.
    #[error("rover's sandbox proxy is not available: {reason}")]
    Proxy { reason: String },
    /// `autopilot.sandbox.backend` names a backend this build cannot run.
    #[error("the sandbox backend \"{backend}\" (autopilot.sandbox.backend) is not available in this build yet; set it to \"local\" (or remove it) to run sandboxes on the Docker engine at DOCKER_HOST")]
    BackendUnavailable { backend: &'static str },
    /// This backend cannot do what was asked (e.g. take back a workspace).
    #[error("the {backend} sandbox backend cannot {what}")]
    Unsupported {
        backend: &'static str,
        what: &'static str,
    },
    /// A workspace taken back from a container broke a rule; nothing of it was applied.
    #[error("refused the workspace the sandbox returned: entry `{entry}` {reason}; nothing of it was applied to the worktree")]
    Returned { entry: String, reason: String },
    /// The swarm backend cannot be used as configured.
    #[error("cannot run sandboxes on the swarm: {reason}")]
    Swarm { reason: String },
    /// A sandbox image could not be pushed to the registry the nodes pull from.
    #[error("cannot push sandbox image `{image}` to the registry `{registry}` (autopilot.sandbox.registry): {reason}; check that rover's engine reaches it and, for a registry that wants a login, ROVER_REGISTRY_USERNAME and ROVER_REGISTRY_PASSWORD")]
    Registry {
        image: String,
        registry: String,
        reason: String,
    },
    /// Any other engine error.
    #[error("docker `{operation}` failed for `{target}`")]
    Api {
        operation: &'static str,
        target: String,
        #[source]
        source: bollard::errors::Error,
    },
}

impl crate::error::Kinded for SandboxError {
    fn kind(&self) -> crate::error::ErrorKind {
        use crate::error::ErrorKind;
        match self {
            Self::DaemonUnreachable { .. } | Self::Registry { .. } => ErrorKind::Unavailable,
            Self::ImageMissing { .. } | Self::BackendUnavailable { .. } | Self::Swarm { .. } => {
                ErrorKind::Config
            }
            _ => ErrorKind::Internal,
        }
    }
}

impl SandboxError {
    /// Whether the same call may succeed later without anyone changing anything.
    pub fn is_retryable(&self) -> bool {
        match self {
            Self::DaemonUnreachable { .. } => true,
            Self::Api { source, .. } => match source {
                bollard::errors::Error::DockerResponseServerError { status_code, .. } => {
                    *status_code >= 500
                }
                bollard::errors::Error::RequestTimeoutError => true,
                _ => false,
            },
            _ => false,
        }
    }

    /// Classifies a bollard error: connection trouble becomes `DaemonUnreachable`.
    pub(crate) fn from_bollard(
        operation: &'static str,
        target: impl Into<String>,
        host: &str,
        source: bollard::errors::Error,
    ) -> Self {
        use bollard::errors::Error as E;
        match source {
            E::IOError { .. }
            | E::HyperLegacyError { .. }
            | E::SocketNotFoundError(_)
            | E::HyperResponseError { .. } => Self::DaemonUnreachable {
                host: host.to_string(),
                source,
            },
            other => Self::Api {
                operation,
                target: target.into(),
                source: other,
            },
        }
    }
}

/// The HTTP status of an engine answer, if it was one.
pub(crate) fn status_of(err: &bollard::errors::Error) -> Option<u16> {
    match err {
        bollard::errors::Error::DockerResponseServerError { status_code, .. } => Some(*status_code),
        _ => None,
    }
}
