//! The proxy server: accepts relayed connections on the unix socket, reads each one's preamble,
//! and serves the agent's HTTP on it with hyper (keep-alive, `CONNECT` upgrades), routing each
//! request to the model reverse proxy or the egress proxy.

use std::convert::Infallible;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use http::{Method, Request, Response, StatusCode};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{UnixListener, UnixStream};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::Instrument;

use super::config::ProxyConfig;
use super::error::ProxyError;
use super::grant::{Grant, Provider};
use super::limits::{Limits, OutBody, RunSlots, HEADER_TIMEOUT, MAX_CONNECTIONS_PER_RUN};
use super::preamble::{read_preamble, RunRef};
use super::reserve::Reservations;
use super::respond::{text, ProxyBody};
use super::{egress, model};
use crate::agents::CodexPrices;

/// How long a new connection may take to send its preamble.
const PREAMBLE_TIMEOUT: Duration = Duration::from_secs(10);
/// How long shutdown waits for requests in flight before `serve` returns.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(30);

/// The upstream HTTP client: pooled keep-alive connections, http and https.
pub(crate) type UpstreamClient = Client<HttpsConnector<HttpConnector>, OutBody>;

/// What every connection shares, as one connection sees it: the server's configuration with
/// the proxy dir of the connection's run's store (the server's own dir, or its store's under a
/// server shared by many repositories), and the bounds and reservations of the whole server.
pub(crate) struct Shared {
    pub config: ProxyConfig,
    pub client: UpstreamClient,
    /// Cancelled when the server shuts down: open tunnels close.
    pub shutdown: CancellationToken,
    /// The memory and concurrency bounds, shared and per run.
    pub limits: Arc<Limits>,
    /// What model requests in flight reserved of their budgets.
    pub reservations: Arc<Reservations>,
    /// The store key of the connection's run (none: the server's own dir).
    key: Option<String>,
}

impl Shared {
    fn new(config: ProxyConfig, shutdown: CancellationToken) -> Result<Shared, ProxyError> {
        config.validate()?;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = hyper_rustls::HttpsConnectorBuilder::new();
        let builder = match builder.with_provider_and_native_roots(provider.clone()) {
            Ok(builder) => builder,
            // Plain-http upstreams (tests, a local gateway) need no roots.
            Err(e) if config.any_https() => return Err(ProxyError::TlsRoots(e)),
            Err(_) => hyper_rustls::HttpsConnectorBuilder::new().with_tls_config(
                rustls::ClientConfig::builder_with_provider(provider)
                    .with_safe_default_protocol_versions()
                    .map_err(|e| ProxyError::TlsRoots(std::io::Error::other(e)))?
                    .with_root_certificates(rustls::RootCertStore::empty())
                    .with_no_client_auth(),
            ),
        };
        let connector = builder.https_or_http().enable_http1().build();
        let client = Client::builder(TokioExecutor::new())
            .pool_idle_timeout(Duration::from_secs(60))
            .build(connector);
        Ok(Shared {
            config,
            client,
            shutdown,
            limits: Arc::new(Limits::default()),
            reservations: Arc::new(Reservations::default()),
            key: None,
        })
    }

    /// What a connection of the run `named` works with: its store's proxy dir, and the codex
    /// prices of its grant when it has its own (a repository of a daemon file).
    fn for_run(&self, named: &RunRef, codex_prices: Option<CodexPrices>) -> Shared {
        let mut config = self.config.clone();
        config.dir = named.store_dir(&self.config.dir);
        if let Some(prices) = codex_prices {
            config.prices.openai = prices;
        }
        Shared {
            config,
            client: self.client.clone(),
            shutdown: self.shutdown.clone(),
            limits: self.limits.clone(),
            reservations: self.reservations.clone(),
            key: named.key.clone(),
        }
    }

    /// The proxy dir of the connection's run's store: its grants and ledgers, the runs its
    /// spend is counted from.
    pub fn dir(&self) -> &Path {
        &self.config.dir
    }

    /// The slots of `run` of this connection's store (runs of two stores never share them).
    pub fn run_slots(&self, run: &str, max_requests: Option<u32>) -> Arc<RunSlots> {
        match &self.key {
            Some(key) => self.limits.run(&format!("{key}/{run}"), max_requests),
            None => self.limits.run(run, max_requests),
        }
    }
}

/// Serve relayed connections from `listener` until `shutdown` is cancelled, then let requests
/// in flight finish (up to 30 s) and return. One connection's failure never stops the server.
pub async fn serve(
    config: ProxyConfig,
    listener: UnixListener,
    shutdown: CancellationToken,
) -> Result<(), ProxyError> {
    let shared = Arc::new(Shared::new(config, shutdown.clone())?);
    tracing::info!(dir = %shared.dir().display(), "the model and egress proxy is serving");
    let tracker = TaskTracker::new();
    let mut next_id: u64 = 0;
    loop {
        tokio::select! {
            () = shutdown.cancelled() => break,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    next_id += 1;
                    let span = tracing::debug_span!("proxy_connection", id = next_id);
                    tracker.spawn(connection(shared.clone(), stream).instrument(span));
                }
                Err(e) => {
                    // Out of file descriptors and the like: pause instead of spinning.
                    tracing::warn!(error = %e, "the proxy cannot accept a connection");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            },
        }
    }
    tracker.close();
    if tokio::time::timeout(SHUTDOWN_GRACE, tracker.wait())
        .await
        .is_err()
    {
        tracing::warn!("the proxy stopped with requests still in flight");
    }
    Ok(())
}

/// One relayed connection: its preamble, then HTTP until either side closes.
async fn connection(server: Arc<Shared>, mut stream: UnixStream) {
    let named = match tokio::time::timeout(PREAMBLE_TIMEOUT, read_preamble(&mut stream)).await {
        Ok(Ok(named)) => named,
        Ok(Err(e)) => return refuse_connection(stream, &e.to_string()).await,
        Err(_) => {
            return refuse_connection(stream, "no preamble line within 10 seconds").await;
        }
    };
    let run = named.run.clone();
    // The run's own store: its grant, and every file its requests read or write.
    let dir = named.store_dir(server.dir());
    let known = {
        let run = run.clone();
        off_runtime(move || Grant::load(&dir, &run)).await
    };
    let grant = match known {
        Ok(Some(grant)) => grant,
        Ok(None) => {
            return refuse_connection(stream, &format!("run {run:?} has no grant")).await;
        }
        Err(e) => {
            tracing::warn!(run, error = %e, "cannot read a run's grant");
            return refuse_connection(stream, &format!("cannot read the grant of run {run:?}"))
                .await;
        }
    };
    let shared = Arc::new(server.for_run(&named, grant.codex_prices.clone()));
    let Some(_open) = shared.run_slots(&run, grant.max_requests).connection() else {
        return refuse_connection(
            stream,
            &format!("run {run:?} has {MAX_CONNECTIONS_PER_RUN} connections open already"),
        )
        .await;
    };
    let service = {
        let shared = shared.clone();
        let run: Arc<str> = run.as_str().into();
        service_fn(move |req| {
            let shared = shared.clone();
            let run = run.clone();
            async move { Ok::<_, Infallible>(route(shared, &run, req).await) }
        })
    };
    let conn = http1::Builder::new()
        .keep_alive(true)
        .timer(TokioTimer::new())
        .header_read_timeout(HEADER_TIMEOUT)
        .max_buf_size(256 * 1024)
        .serve_connection(TokioIo::new(stream), service)
        .with_upgrades();
    tokio::pin!(conn);
    let result = tokio::select! {
        result = conn.as_mut() => result,
        () = shared.shutdown.cancelled() => {
            conn.as_mut().graceful_shutdown();
            conn.await
        }
    };
    if let Err(e) = result {
        tracing::debug!(run, error = %e, "a proxied connection ended with an error");
    }
}

/// Send a one-shot 403 on a connection that is not a run's and close it.
async fn refuse_connection(mut stream: UnixStream, reason: &str) {
    tracing::warn!(reason, "the proxy refused a connection");
    let body = format!("rover's proxy refused this connection: {reason}\n");
    let head = format!(
        "HTTP/1.1 403 Forbidden\r\ncontent-type: text/plain; charset=utf-8\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
        body.len()
    );
    let _ = stream.write_all(head.as_bytes()).await;
    let _ = stream.write_all(body.as_bytes()).await;
    let _ = stream.shutdown().await;
    // Closing a unix socket with unread input resets it, and the client would lose the answer:
    // read what it sent (bounded, briefly) before closing.
    let mut sink = [0u8; 8192];
    let mut left = 1usize << 20;
    let drain = async {
        while left > 0 {
            match stream.read(&mut sink).await {
                Ok(0) | Err(_) => break,
                Ok(n) => left = left.saturating_sub(n),
            }
        }
    };
    let _ = tokio::time::timeout(Duration::from_secs(1), drain).await;
}

/// Send a request to the part that handles it.
async fn route(shared: Arc<Shared>, run: &str, req: Request<Incoming>) -> Response<ProxyBody> {
    if req.method() == Method::CONNECT {
        return egress::connect(shared, run, req).await;
    }
    if req.uri().scheme().is_some() || req.uri().authority().is_some() {
        return egress::absolute(shared, run, req).await;
    }
    let path = req.uri().path();
    if path == super::workspace::WORKSPACE_PATH {
        return super::workspace::handle(shared, run, req).await;
    }
    for provider in [Provider::Anthropic, Provider::Openai] {
        let prefix = format!("/{}", provider.name());
        if let Some(rest) = path.strip_prefix(&prefix) {
            if rest.is_empty() || rest.starts_with('/') {
                return model::forward(shared, run, provider, req).await;
            }
        }
    }
    text(
        StatusCode::NOT_FOUND,
        "rover's proxy serves /anthropic/... and /openai/... (the model APIs), /rover/workspace (a shipped workspace) and proxy requests (CONNECT, http://...) only",
    )
}

/// Run blocking file work (grants, ledgers, locks) on the blocking pool.
pub(crate) async fn off_runtime<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, ProxyError> + Send + 'static,
) -> Result<T, ProxyError> {
    tokio::task::spawn_blocking(f)
        .await
        .unwrap_or_else(|e| match e.try_into_panic() {
            Ok(panic) => std::panic::resume_unwind(panic),
            Err(_) => Err(ProxyError::Cancelled),
        })
}
