//! The GitHub subsystem's error type: what went wrong, said so a user knows what to do.

use chrono::{DateTime, Utc};

/// Everything that can go wrong talking to GitHub.
#[derive(Debug, thiserror::Error)]
pub enum GitHubError {
    /// No token in the environment.
    #[error("no github token: set GITHUB_TOKEN or GH_TOKEN")]
    MissingToken,
    /// The GitHub App's private key cannot be used.
    #[error("the GitHub App's private key {} (ROVER_GITHUB_APP_KEY_FILE) is not usable: {detail}", .path.display())]
    AppKey {
        path: std::path::PathBuf,
        detail: String,
    },
    /// 401 to a request signed with the app's JWT: the key is not the app's, or the app id is
    /// wrong.
    #[error("github rejected the app's JWT on {what} (401): is ROVER_GITHUB_APP_KEY_FILE a private key of app {app_id} (github.appId), and is this machine's clock right?")]
    AppRejected { what: String, app_id: u64 },
    /// The app has no installation on the repository.
    #[error("the GitHub App {app} is not installed on {repo}: install it on the repository (its settings page, Install App), or set github.installationId")]
    NotInstalled { app: String, repo: String },
    /// The configured API URL or repository is not usable.
    #[error("invalid github setting {what}: {detail}")]
    Config { what: String, detail: String },
    /// 401: the token is wrong, expired or revoked.
    #[error(
        "github rejected the token on {what} (401 bad credentials): check GITHUB_TOKEN or GH_TOKEN (for a GitHub App: that it is still installed on the repository)"
    )]
    BadCredentials { what: String },
    /// 404: the thing does not exist or the token cannot see it.
    #[error(
        "github has no {what} (404): check the repository name and that the token can read it"
    )]
    NotFound { what: String },
    /// Primary or secondary rate limit: wait until `until`.
    #[error("github rate limit hit on {what}: wait until {until}")]
    RateLimited { what: String, until: DateTime<Utc> },
    /// 403 that is not a rate limit: the token lacks a permission.
    #[error("github refused {what} (403): {message}; check the token's permissions")]
    Forbidden { what: String, message: String },
    /// 422: GitHub understood the request and refused it.
    #[error("github validation failed on {what}: {message}{}", format_errors(.errors))]
    Validation {
        what: String,
        message: String,
        errors: Vec<String>,
    },
    /// 5xx: GitHub had a problem; try again later.
    #[error("github server error {status} on {what}: retry later")]
    Server { what: String, status: u16 },
    /// Any other unexpected status.
    #[error("github answered {what} with status {status}: {message}")]
    Status {
        what: String,
        status: u16,
        message: String,
    },
    /// The request did not get an answer (connection, timeout, TLS).
    #[error("could not reach github for {what}: is the api url right and the network up?")]
    Transport {
        what: String,
        #[source]
        source: octocrab::Error,
    },
    /// No complete answer within the request timeout.
    #[error("github did not answer {what} within {secs}s: retry later")]
    Timeout { what: String, secs: u64 },
    /// The answer did not have the expected shape.
    #[error("github answered {what} with something unexpected: {detail}")]
    Malformed { what: String, detail: String },
}

fn format_errors(errors: &[String]) -> String {
    if errors.is_empty() {
        String::new()
    } else {
        format!(" ({})", errors.join("; "))
    }
}

impl crate::error::Kinded for GitHubError {
    /// Credentials, permissions and names are the user's settings; what may pass is
    /// unavailable; an answer rover does not understand is internal.
    fn kind(&self) -> crate::error::ErrorKind {
        use crate::error::ErrorKind;
        match self {
            Self::MissingToken
            | Self::AppKey { .. }
            | Self::AppRejected { .. }
            | Self::NotInstalled { .. }
            | Self::Config { .. }
            | Self::BadCredentials { .. }
            | Self::NotFound { .. }
            | Self::Forbidden { .. } => ErrorKind::Config,
            Self::RateLimited { .. }
            | Self::Server { .. }
            | Self::Transport { .. }
            | Self::Timeout { .. } => ErrorKind::Unavailable,
            Self::Validation { .. } | Self::Status { .. } | Self::Malformed { .. } => {
                ErrorKind::Internal
            }
        }
    }
}

impl GitHubError {
    /// Whether trying the same request again later may succeed.
    pub fn is_retryable(&self) -> bool {
        matches!(
            self,
            Self::RateLimited { .. }
                | Self::Server { .. }
                | Self::Transport { .. }
                | Self::Timeout { .. }
        )
    }

    /// When a retry makes sense at the earliest, if GitHub said so.
    pub fn retry_at(&self) -> Option<DateTime<Utc>> {
        match self {
            Self::RateLimited { until, .. } => Some(*until),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn validation_message_lists_errors_and_is_not_retryable() {
        let err = GitHubError::Validation {
            what: "create pull request".into(),
            message: "Validation Failed".into(),
            errors: vec!["A pull request already exists for o:b.".into()],
        };
        assert_eq!(
            err.to_string(),
            "github validation failed on create pull request: Validation Failed (A pull request already exists for o:b.)"
        );
        assert!(!err.is_retryable());
        assert!(GitHubError::Server {
            what: "x".into(),
            status: 502
        }
        .is_retryable());
    }
}
