//! Errors of the proxy's files and startup; each says what to do.

use std::io;
use std::path::{Path, PathBuf};

use crate::store::StoreError;

#[derive(Debug, thiserror::Error)]
pub enum ProxyError {
    #[error("cannot {op} {path}")]
    Io {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("{path} does not parse ({reason}); the daemon rewrites grants, the proxy ledgers: remove it if it stays broken")]
    Unreadable { path: PathBuf, reason: String },
    #[error("{run:?} is not a run name: use 1 to 128 of A-Z a-z 0-9 _ . - (not . or ..)")]
    BadRun { run: String },
    #[error("the {provider} upstream {url:?} is not an http:// or https:// base URL: {reason}")]
    BadUpstream {
        provider: &'static str,
        url: String,
        reason: String,
    },
    #[error("the {provider} credential is empty or has characters an HTTP header cannot carry: check the key rover was given")]
    BadCredential { provider: &'static str },
    #[error("cannot load the system's TLS root certificates for the https upstreams: install the ca-certificates package in the proxy's image")]
    TlsRoots(#[source] io::Error),
    #[error("the proxy's settings are wrong: {reason}")]
    Config { reason: String },
    #[error("the proxy's blocking file work was cut off (the runtime is shutting down)")]
    Cancelled,
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl ProxyError {
    /// An I/O error about `path`, for `map_err`.
    pub(crate) fn io(op: &'static str, path: &Path) -> impl FnOnce(io::Error) -> ProxyError {
        let path = path.to_owned();
        move |source| ProxyError::Io { op, path, source }
    }

    /// Whether trying again may help (a busy or flaky disk; not a bad file or setting).
    pub fn is_retryable(&self) -> bool {
        matches!(
            self,
            ProxyError::Io { .. } | ProxyError::Store(StoreError::Io { .. })
        )
    }
}
