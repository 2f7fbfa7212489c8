//! The one error type of the agents subsystem, classified so steps can choose retry or fail.

use std::path::PathBuf;
use std::time::Duration;

use chrono::{DateTime, Utc};

use super::cli::AgentKind;

/// Everything that can go wrong when calling an agent.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    /// The agent executable is missing.
    #[error(
        "the agent executable `{binary}` was not found: install it ({install}) or set {env_var} to its path"
    )]
    NotFound {
        /// The name or path that was tried.
        binary: String,
        /// The environment variable that overrides it.
        env_var: &'static str,
        /// How to install it.
        install: &'static str,
    },
    /// The process could not be started for another reason.
    #[error("could not start the agent `{binary}`: check that it is executable")]
    Spawn {
        /// The program.
        binary: String,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The model API rejected the credentials, or there are none.
    #[error("the agent could not authenticate with its model api ({message}): {}", agent.credentials_hint())]
    Auth {
        /// Which CLI, for the variable to name.
        agent: AgentKind,
        /// The CLI's message.
        message: String,
    },
    /// The model API rejected the request itself (HTTP 400/404/422: a refused schema, an unknown
    /// model): the same call fails the same way again.
    #[error("the agent's model api rejected the request ({message}); check the model name and the agent settings")]
    BadRequest {
        /// The CLI's message (for codex often the API's raw JSON error body).
        message: String,
    },
    /// The model API rate-limited the call.
    #[error("the agent was rate limited ({message}); retry after {}", reset.map_or_else(|| "a pause".to_owned(), |t| t.to_rfc3339()))]
    RateLimited {
        /// When the limit resets, when known.
        reset: Option<DateTime<Utc>>,
        /// The CLI's message.
        message: String,
    },
    /// The model API is overloaded or failing server-side.
    #[error("the agent's model api is overloaded or failing ({message}); retry later")]
    Overloaded {
        /// The CLI's message.
        message: String,
    },
    /// The absolute timeout passed.
    #[error(
        "the agent did not finish within {after:?}; raise the step timeout or simplify the task"
    )]
    Timeout {
        /// The limit.
        after: Duration,
    },
    /// No output for too long.
    #[error("the agent printed nothing for {after:?} and was stopped; it may be stuck")]
    Inactive {
        /// The limit.
        after: Duration,
    },
    /// The process was killed (SIGKILL or exit 137, usually out of memory).
    #[error("the agent was killed ({how}); it may have run out of memory")]
    Killed {
        /// `signal 9` or `exit 137`.
        how: String,
    },
    /// The turn limit was reached before an answer.
    #[error("the agent reached its turn limit ({message}); raise maxTurns or narrow the task")]
    MaxTurns {
        /// The CLI's message.
        message: String,
    },
    /// The output could not be understood.
    #[error("the agent's output could not be understood: {reason}")]
    BadOutput {
        /// What was wrong.
        reason: String,
        /// The raw stdout (bounded).
        raw: String,
    },
    /// The structured answer was invalid, even after one retry in the same session.
    #[error("the agent's answer does not match the expected result: {reason}")]
    InvalidAnswer {
        /// The validation error.
        reason: String,
        /// The raw answer.
        raw: String,
    },
    /// The CLI refused the invocation (usage error, untrusted directory, root restrictions).
    #[error("the agent cli refused to run (exit {exit:?}): {stderr}")]
    Refused {
        /// Exit code.
        exit: Option<i32>,
        /// The CLI's stderr (bounded).
        stderr: String,
    },
    /// The CLI failed for another reason.
    #[error("the agent failed (exit {exit:?}): {message}")]
    Failed {
        /// Exit code.
        exit: Option<i32>,
        /// The CLI's error message or the end of its stderr.
        message: String,
        /// The CLI's stderr (bounded).
        stderr: String,
    },
    /// A file next to the call (transcript, schema file) could not be written.
    #[error("could not write {path}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// A prompt template could not be rendered.
    #[error("could not render the {step} prompt: {reason}")]
    Prompt {
        /// The step.
        step: String,
        /// What was wrong.
        reason: String,
    },
}

impl crate::error::Kinded for AgentError {
    /// A missing or unauthenticated CLI is the user's setup; a busy model API passes; the rest
    /// is a run that failed.
    fn kind(&self) -> crate::error::ErrorKind {
        use crate::error::ErrorKind;
        match self {
            Self::NotFound { .. }
            | Self::Spawn { .. }
            | Self::Auth { .. }
            | Self::BadRequest { .. } => ErrorKind::Config,
            Self::RateLimited { .. } | Self::Overloaded { .. } | Self::Timeout { .. } => {
                ErrorKind::Unavailable
            }
            _ => ErrorKind::Internal,
        }
    }
}

impl AgentError {
    /// Whether running the same call again may succeed.
    pub fn is_retryable(&self) -> bool {
        match self {
            AgentError::RateLimited { .. }
            | AgentError::Overloaded { .. }
            | AgentError::Timeout { .. }
            | AgentError::Inactive { .. }
            | AgentError::Killed { .. }
            | AgentError::BadOutput { .. }
            | AgentError::Failed { .. } => true,
            AgentError::NotFound { .. }
            | AgentError::Spawn { .. }
            | AgentError::Auth { .. }
            | AgentError::BadRequest { .. }
            | AgentError::MaxTurns { .. }
            | AgentError::InvalidAnswer { .. }
            | AgentError::Refused { .. }
            | AgentError::Io { .. }
            | AgentError::Prompt { .. } => false,
        }
    }

    /// A short stable name of the class, for span meta.
    pub fn class(&self) -> &'static str {
        match self {
            AgentError::NotFound { .. } => "notFound",
            AgentError::Spawn { .. } => "spawn",
            AgentError::Auth { .. } => "auth",
            AgentError::BadRequest { .. } => "badRequest",
            AgentError::RateLimited { .. } => "rateLimited",
            AgentError::Overloaded { .. } => "overloaded",
            AgentError::Timeout { .. } => "timeout",
            AgentError::Inactive { .. } => "inactive",
            AgentError::Killed { .. } => "killed",
            AgentError::MaxTurns { .. } => "maxTurns",
            AgentError::BadOutput { .. } => "badOutput",
            AgentError::InvalidAnswer { .. } => "invalidAnswer",
            AgentError::Refused { .. } => "refused",
            AgentError::Failed { .. } => "failed",
            AgentError::Io { .. } => "io",
            AgentError::Prompt { .. } => "prompt",
        }
    }
}
