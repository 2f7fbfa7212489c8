//! The egress proxy: `CONNECT host:port` tunnels and absolute-form `http://` requests (what
//! `HTTPS_PROXY`/`HTTP_PROXY` clients send), authenticated with the run's token as the proxy
//! password, decided by the grant's egress policy, and recorded in the run's ledger.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use base64::Engine as _;
use http::header::{self, HeaderValue};
use http::uri::{Authority, PathAndQuery};
use http::{Request, Response, StatusCode, Uri};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

use super::grant::Grant;
use super::ledger::Ledger;
use super::model::strip_hop_by_hop;
use super::policy::{decide, show, Verdict};
use super::respond::{empty, text, ProxyBody};
use super::server::{off_runtime, Shared};

const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// A `CONNECT host:port` request.
pub(crate) async fn connect(
    shared: Arc<Shared>,
    run: &str,
    req: Request<Incoming>,
) -> Response<ProxyBody> {
    let grant = match admit(&shared, run, &req).await {
        Ok(grant) => grant,
        Err(refused) => return refused,
    };
    let Some((host, port)) = req.uri().authority().and_then(|a| destination(a, 443)) else {
        return text(
            StatusCode::BAD_REQUEST,
            "rover's proxy: CONNECT needs a host:port target (a host of at most 253 characters)",
        );
    };
    let stream = match open(&shared, &grant, &host, port).await {
        Ok(stream) => stream,
        Err(refused) => return refused,
    };
    let shutdown = shared.shutdown.clone();
    let target = show(&host, port);
    tokio::spawn(async move {
        let upgraded = match hyper::upgrade::on(req).await {
            Ok(upgraded) => upgraded,
            Err(e) => {
                tracing::debug!(target, error = %e, "a CONNECT tunnel was not upgraded");
                return;
            }
        };
        let mut client = TokioIo::new(upgraded);
        let mut stream = stream;
        tokio::select! {
            copied = tokio::io::copy_bidirectional(&mut client, &mut stream) => {
                if let Err(e) = copied {
                    tracing::debug!(target, error = %e, "a CONNECT tunnel ended with an error");
                }
            }
            () = shutdown.cancelled() => {}
        }
    });
    Response::new(empty())
}

/// An absolute-form request (`GET http://host/path`).
pub(crate) async fn absolute(
    shared: Arc<Shared>,
    run: &str,
    req: Request<Incoming>,
) -> Response<ProxyBody> {
    let grant = match admit(&shared, run, &req).await {
        Ok(grant) => grant,
        Err(refused) => return refused,
    };
    if req.uri().scheme_str() != Some("http") {
        return text(
            StatusCode::BAD_REQUEST,
            "rover's proxy forwards http:// requests; for https:// the client must use CONNECT",
        );
    }
    let Some(authority) = req.uri().authority().cloned() else {
        return text(
            StatusCode::BAD_REQUEST,
            "rover's proxy: the request URL has no host",
        );
    };
    let Some((host, port)) = destination(&authority, 80) else {
        return text(
            StatusCode::BAD_REQUEST,
            "rover's proxy: the request URL has no host",
        );
    };
    let stream = match open(&shared, &grant, &host, port).await {
        Ok(stream) => stream,
        Err(refused) => return refused,
    };
    let (mut sender, conn) = match hyper::client::conn::http1::handshake(TokioIo::new(stream)).await
    {
        Ok(pair) => pair,
        Err(e) => return bad_gateway(&host, port, &e),
    };
    tokio::spawn(async move {
        if let Err(e) = conn.await {
            tracing::debug!(error = %e, "an egress http connection ended with an error");
        }
    });
    let (mut parts, body) = req.into_parts();
    let path = parts
        .uri
        .path_and_query()
        .cloned()
        .unwrap_or_else(|| PathAndQuery::from_static("/"));
    parts.uri = Uri::from(path);
    strip_hop_by_hop(&mut parts.headers);
    parts.headers.remove(header::PROXY_AUTHORIZATION);
    if !parts.headers.contains_key(header::HOST) {
        if let Ok(value) = HeaderValue::from_str(authority.as_str()) {
            parts.headers.insert(header::HOST, value);
        }
    }
    match sender.send_request(Request::from_parts(parts, body)).await {
        Ok(response) => {
            let (mut parts, body) = response.into_parts();
            strip_hop_by_hop(&mut parts.headers);
            Response::from_parts(parts, body.map_err(Into::into).boxed_unsync())
        }
        Err(e) => bad_gateway(&host, port, &e),
    }
}

/// The run's grant if the request carries the run's token as its proxy password.
async fn admit(
    shared: &Shared,
    run: &str,
    req: &Request<Incoming>,
) -> Result<Grant, Response<ProxyBody>> {
    let dir = shared.dir().to_owned();
    let grant = {
        let run = run.to_owned();
        off_runtime(move || Grant::load(&dir, &run)).await
    };
    let grant = match grant {
        Ok(Some(grant)) => grant,
        Ok(None) => {
            return Err(text(
                StatusCode::FORBIDDEN,
                &format!("rover's proxy: run {run} has no grant any more"),
            ))
        }
        Err(e) => {
            tracing::error!(run, error = %e, "cannot read a run's grant");
            return Err(text(
                StatusCode::BAD_GATEWAY,
                &format!("rover's proxy cannot read the grant of run {run}; see the proxy's log"),
            ));
        }
    };
    let password = req
        .headers()
        .get(header::PROXY_AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(basic_password);
    let Some(password) = password else {
        return Err(proxy_auth_required(
            "rover's proxy needs Proxy-Authorization: Basic rover:<the run's token> (put it in HTTPS_PROXY's URL)",
        ));
    };
    if !grant.accepts(&password) {
        let reason = "the proxy password is not this run's token";
        record(shared, &grant, |ledger| ledger.record_refusal(reason)).await;
        return Err(proxy_auth_required(&format!("rover's proxy: {reason}")));
    }
    if grant.ended {
        return Err(text(
            StatusCode::FORBIDDEN,
            &format!("rover's proxy: run {run} has ended; its token no longer works"),
        ));
    }
    Ok(grant)
}

/// Decide on `host:port`, record the attempt, and connect to the checked address.
async fn open(
    shared: &Shared,
    grant: &Grant,
    host: &str,
    port: u16,
) -> Result<TcpStream, Response<ProxyBody>> {
    match decide(&grant.egress, host, port).await {
        Verdict::Deny(reason) => {
            let refusal = format!("egress to {} refused: {reason}", show(host, port));
            tracing::info!(run = grant.run, refusal, "an egress connection was refused");
            let (host_owned, reason_owned) = (host.to_owned(), reason.clone());
            record(shared, grant, move |ledger| {
                ledger.record_connection(&host_owned, port, false, Some(&reason_owned));
                ledger.record_refusal(&refusal);
            })
            .await;
            Err(text(
                StatusCode::FORBIDDEN,
                &format!(
                    "rover's sandbox network policy refused {} ({reason}); the project's autopilot.sandbox.egress setting allows destinations",
                    show(host, port)
                ),
            ))
        }
        Verdict::Allow(addrs) => {
            let host_owned = host.to_owned();
            record(shared, grant, move |ledger| {
                ledger.record_connection(&host_owned, port, true, None);
            })
            .await;
            connect_any(&addrs)
                .await
                .map_err(|e| bad_gateway(host, port, &e))
        }
    }
}

/// Connect to the first of `addrs` that answers.
async fn connect_any(addrs: &[SocketAddr]) -> std::io::Result<TcpStream> {
    let mut last = std::io::Error::other("no address");
    for addr in addrs {
        match tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(addr)).await {
            Ok(Ok(stream)) => {
                let _ = stream.set_nodelay(true);
                return Ok(stream);
            }
            Ok(Err(e)) => last = e,
            Err(_) => last = std::io::Error::new(std::io::ErrorKind::TimedOut, "timed out"),
        }
    }
    Err(last)
}

/// Update the run's ledger, logging a failure (the request's fate does not depend on it).
async fn record(shared: &Shared, grant: &Grant, change: impl FnOnce(&mut Ledger) + Send + 'static) {
    let dir = shared.dir().to_owned();
    let grant = grant.clone();
    let run = grant.run.clone();
    if let Err(e) = off_runtime(move || Ledger::update(&dir, &grant, change)).await {
        tracing::error!(run, error = %e, "cannot record an egress attempt in the run's ledger");
    }
}

/// The longest host name DNS allows; a longer one is no destination (and would swell the
/// ledger and the span, which record each host tried).
const MAX_HOST: usize = 253;

/// The host (lowercase, without IPv6 brackets or a trailing dot) and port of `authority`.
fn destination(authority: &Authority, default_port: u16) -> Option<(String, u16)> {
    let host = authority
        .host()
        .trim_start_matches('[')
        .trim_end_matches(']')
        .trim_end_matches('.')
        .to_ascii_lowercase();
    (!host.is_empty() && host.len() <= MAX_HOST)
        .then(|| (host, authority.port_u16().unwrap_or(default_port)))
}

/// The password of a `Basic` credential.
fn basic_password(value: &str) -> Option<String> {
    let (scheme, encoded) = value.trim().split_once(' ')?;
    if !scheme.eq_ignore_ascii_case("basic") {
        return None;
    }
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(encoded.trim())
        .ok()?;
    let decoded = String::from_utf8(decoded).ok()?;
    decoded
        .split_once(':')
        .map(|(_, password)| password.to_owned())
}

fn proxy_auth_required(line: &str) -> Response<ProxyBody> {
    let mut response = text(StatusCode::PROXY_AUTHENTICATION_REQUIRED, line);
    response.headers_mut().insert(
        header::PROXY_AUTHENTICATE,
        HeaderValue::from_static("Basic realm=\"rover\""),
    );
    response
}

fn bad_gateway(host: &str, port: u16, error: &dyn std::fmt::Display) -> Response<ProxyBody> {
    text(
        StatusCode::BAD_GATEWAY,
        &format!(
            "rover's proxy could not reach {}: {error}",
            show(host, port)
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proxy_passwords_come_from_basic_credentials() {
        let encoded = base64::engine::general_purpose::STANDARD.encode("rover:tok:en");
        assert_eq!(
            basic_password(&format!("Basic {encoded}")).as_deref(),
            Some("tok:en")
        );
        assert_eq!(basic_password("Bearer x"), None);
        assert_eq!(
            destination(&Authority::from_static("[::1]:8080"), 443),
            Some(("::1".into(), 8080))
        );
        assert_eq!(
            destination(&Authority::from_static("PyPI.org."), 443),
            Some(("pypi.org".into(), 443))
        );
        let long: Authority = format!("{}.example:443", "a".repeat(300))
            .parse()
            .expect("an authority");
        assert_eq!(destination(&long, 443), None);
    }
}
