//! What can keep an agent run from starting, or its workspace from coming back.

use std::path::PathBuf;

use crate::proxy::ProxyError;
use crate::sandbox::SandboxError;

/// Why a run could not be prepared or started.
#[derive(Debug, thiserror::Error)]
pub enum AgentRunError {
    /// The run's grant could not be written in rover's proxy dir.
    #[error("cannot write the run's grant in {}", proxy_dir.display())]
    Grant {
        proxy_dir: PathBuf,
        #[source]
        source: ProxyError,
    },
    /// The sandbox refused or failed (the network, the container).
    #[error("the sandbox failed for container {container}")]
    Sandbox {
        container: String,
        #[source]
        source: SandboxError,
    },
    /// The workspace a shipped run returned was refused (an entry that would reach outside
    /// the worktree, a link, a special file, past the size limits) or could not be read.
    #[error("the workspace container {container} returned was not taken back")]
    Returned {
        container: String,
        #[source]
        source: SandboxError,
    },
    /// A blocking task of the run stopped (a panic or the runtime shutting down).
    #[error("{0} stopped")]
    Stopped(String),
}

impl AgentRunError {
    /// Whether trying again later may succeed (a sandbox error that says so).
    pub fn is_retryable(&self) -> bool {
        match self {
            AgentRunError::Sandbox { source, .. } | AgentRunError::Returned { source, .. } => {
                source.is_retryable()
            }
            AgentRunError::Grant { .. } | AgentRunError::Stopped(_) => false,
        }
    }
}
