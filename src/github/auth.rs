//! How rover authenticates to GitHub: a token from the environment (a personal or machine
//! user's token, `GITHUB_TOKEN`/`GH_TOKEN`), or a GitHub App whose installation tokens rover
//! mints and renews itself (`github::app`). [`GitHubAuth`] hands the API client and `git push`
//! a token valid now, whichever it is.

use std::sync::Arc;

use super::app::AppTokens;
use super::error::GitHubError;
use super::settings::{TOKEN_ENV, TOKEN_ENV_FALLBACK};
use crate::host_env::HostEnv;

/// The tokens taken out of the environment by [`seal_token`], if it ran: each variable's value.
static SEALED: std::sync::OnceLock<Vec<(&'static str, String)>> = std::sync::OnceLock::new();

/// The non-empty values of `GITHUB_TOKEN` and `GH_TOKEN` in `host`, in that order, with their
/// names.
fn env_tokens(host: &HostEnv) -> Vec<(&'static str, String)> {
    [TOKEN_ENV, TOKEN_ENV_FALLBACK]
        .into_iter()
        .filter_map(|name| Some((name, host.var(name)?.trim().to_owned())))
        .filter(|(_, v)| !v.is_empty())
        .collect()
}

/// Every GitHub token rover was given (`GITHUB_TOKEN` and `GH_TOKEN` both, when both were set
/// and differ: rover uses the first but holds both), with the variable each came from: as
/// [`seal_token`] kept them when it ran, else from `host`.
pub fn held_tokens(host: &HostEnv) -> Vec<(&'static str, String)> {
    match SEALED.get() {
        Some(sealed) => sealed.clone(),
        None => env_tokens(host),
    }
}

/// Takes the GitHub token out of the process: keeps its value in memory, removes `GITHUB_TOKEN`
/// and `GH_TOKEN` from the environment (no child inherits them), and marks the process
/// non-dumpable, so processes of the same user (hooks, agents) cannot read it from
/// `/proc/<pid>/environ` or memory, nor attach a debugger. Call it first thing in `main`,
/// before any thread exists, with the environment as the process started (`host`).
pub fn seal_token(host: &HostEnv) {
    let tokens = env_tokens(host);
    for name in [TOKEN_ENV, TOKEN_ENV_FALLBACK] {
        std::env::remove_var(name);
    }
    let _ = SEALED.set(tokens);
    if let Err(e) = nix::sys::prctl::set_dumpable(false) {
        tracing::warn!(
            error = &e as &dyn std::error::Error,
            "cannot mark the process non-dumpable"
        );
    }
}

/// The token from `GITHUB_TOKEN`, else `GH_TOKEN` (as [`seal_token`] kept it, when it ran);
/// empty values do not count.
pub fn token_from_env(host: &HostEnv) -> Result<String, GitHubError> {
    held_tokens(host)
        .into_iter()
        .next()
        .map(|(_, token)| token)
        .ok_or(GitHubError::MissingToken)
}

/// The credential behind every GitHub request and every `git push`/`fetch` rover makes.
/// Cheap to clone; `Debug` never shows a token.
#[derive(Clone)]
pub enum GitHubAuth {
    /// One token for the whole run (a personal or machine user's token).
    Token(Arc<str>),
    /// A GitHub App's installation tokens, minted and renewed by rover.
    App(Arc<AppTokens>),
}

impl std::fmt::Debug for GitHubAuth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Token(_) => f.write_str("GitHubAuth::Token([redacted secret])"),
            Self::App(app) => write!(f, "GitHubAuth::App({app:?})"),
        }
    }
}

impl From<&str> for GitHubAuth {
    fn from(token: &str) -> Self {
        Self::Token(Arc::from(token))
    }
}

impl From<String> for GitHubAuth {
    fn from(token: String) -> Self {
        Self::Token(Arc::from(token))
    }
}

impl GitHubAuth {
    /// A token valid now (an app's is renewed first when it is close to its expiry).
    pub async fn token(&self) -> Result<String, GitHubError> {
        match self {
            Self::Token(token) => Ok(token.to_string()),
            Self::App(app) => app.token().await,
        }
    }

    /// GitHub answered 401 to `token`: an app's is dropped so the next call mints a new one.
    /// Returns whether asking again may help.
    pub async fn rejected(&self, token: &str) -> bool {
        match self {
            Self::Token(_) => false,
            Self::App(app) => app.forget(token).await,
        }
    }

    /// Every token handed out so far (the one token, or each installation token minted): never
    /// let into a sandbox.
    pub fn known_tokens(&self) -> Vec<String> {
        match self {
            Self::Token(token) => vec![token.to_string()],
            Self::App(app) => app.minted(),
        }
    }

    /// The app, when rover runs as one.
    pub fn app(&self) -> Option<&AppTokens> {
        match self {
            Self::Token(_) => None,
            Self::App(app) => Some(app),
        }
    }
}
