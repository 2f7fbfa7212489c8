//! The model reverse proxy: `/anthropic/...` and `/openai/...` requests authenticated with the
//! run's token, allowed only on the calls the agent CLIs make ([`super::routes`]), within the
//! run's share of the proxy ([`super::limits`]), with their worst case reserved against every
//! budget stop limit ([`super::reserve`]), then sent upstream with the real credential and
//! streamed back metered.

use std::sync::Arc;

use bytes::Bytes;

use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Request, Response, Uri, Version};
use http_body_util::BodyExt;
use hyper::body::Incoming;

use super::config::{Credential, Upstream};
use super::daemon_wide::{self, DaemonHold, DaemonRefusal};
use super::grant::{Grant, Provider, DEFAULT_MAX_REQUESTS};
use super::ledger::Ledger;
use super::limits::{read_body, BodyRefusal, BodyRoom, OutBody, RunSlots};
use super::metered::{Exchange, MeteredBody};
use super::reserve::{admit, worst_case, OverLimit, Refused, Reservation, Worst};
use super::respond::{model_error, ModelRefusal, ProxyBody};
use super::routes::{route, Route};
use super::server::{off_runtime, Shared};
use super::usage::UsageParser;

/// The largest request body the proxy reads (it must read it to know the model).
pub const MAX_REQUEST_BYTES: usize = 32 << 20;
/// The flag Anthropic requires next to an OAuth access token.
pub const OAUTH_BETA: &str = "oauth-2025-04-20";

/// An answer the agent gets instead of the upstream's: a refusal, already recorded.
type Refusal = Response<ProxyBody>;

/// Forward one model request of `run` to `provider`.
pub(crate) async fn forward(
    shared: Arc<Shared>,
    run: &str,
    provider: Provider,
    req: Request<Incoming>,
) -> Response<ProxyBody> {
    if req.headers().contains_key(header::UPGRADE) {
        // codex tries a WebSocket first and falls back to SSE at once on a 426 (other answers
        // cost it several reconnects).
        let mut refused = model_error(
            provider,
            ModelRefusal::Upstream,
            "rover's proxy serves the model API over HTTP only; use server-sent events",
        );
        *refused.status_mut() = http::StatusCode::UPGRADE_REQUIRED;
        return refused;
    }
    match forward_granted(shared, run, provider, req).await {
        Ok(response) | Err(response) => response,
    }
}

/// The steps of [`forward`] after the upgrade check, each of which may refuse the request.
async fn forward_granted(
    shared: Arc<Shared>,
    run: &str,
    provider: Provider,
    req: Request<Incoming>,
) -> Result<Response<ProxyBody>, Refusal> {
    let grant = load_grant(&shared, run, provider).await?;
    let (rest, route, upstream) = allowed_route(&shared, &grant, provider, &req).await?;
    let slots = shared.run_slots(run, grant.max_requests);
    let Some(slot) = slots.request() else {
        let reason = format!(
            "rover: run {run} has {} model requests in flight already (autopilot.sandbox.modelConcurrency); retry when one ends",
            grant.max_requests.unwrap_or(DEFAULT_MAX_REQUESTS)
        );
        refuse(&shared, &grant, &reason).await;
        return Err(model_error(provider, ModelRefusal::Busy, &reason));
    };

    let (parts, body) = req.into_parts();
    let declared = parts
        .headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    let read = read_request(&shared, &grant, &slots, provider, body, declared).await?;
    let model = request_model(&read.0);
    let worst = if route.metered {
        worst_case(&shared.config.prices, provider, model.as_deref(), &read.0)
    } else {
        Worst::default()
    };
    let reservation = reserve(&shared, &grant, run, provider, worst).await?;
    let daemon = if route.metered {
        reserve_daemon_wide(&shared, &grant, run, provider, worst).await?
    } else {
        None
    };

    let bytes_up = read.0.len() as u64;
    let outgoing =
        upstream_request(&shared, &grant, provider, &upstream, &rest, parts, read).await?;
    let response = send(&shared, &grant, run, provider, outgoing).await?;
    let (mut parts, body) = response.into_parts();
    strip_hop_by_hop(&mut parts.headers);
    let content_type = parts
        .headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok());
    let parser = UsageParser::new(provider, content_type);
    let exchange = Exchange {
        shared: shared.clone(),
        grant,
        provider,
        model,
        bytes_up,
        held: Some((slot, reservation)),
        daemon,
    };
    let body = MeteredBody::new(body, parser, exchange);
    Ok(Response::from_parts(parts, BodyExt::boxed_unsync(body)))
}

/// The grant of `run`, read off the runtime; a run without one is refused.
async fn load_grant(shared: &Shared, run: &str, provider: Provider) -> Result<Grant, Refusal> {
    let dir = shared.dir().to_owned();
    let owned = run.to_owned();
    match off_runtime(move || Grant::load(&dir, &owned)).await {
        Ok(Some(grant)) => Ok(grant),
        Ok(None) => Err(model_error(
            provider,
            ModelRefusal::Auth,
            &format!("rover: run {run} has no grant any more; its token no longer works"),
        )),
        Err(e) => {
            tracing::error!(run, error = %e, "cannot read a run's grant");
            Err(model_error(
                provider,
                ModelRefusal::Upstream,
                &format!("rover's proxy cannot read the grant of run {run}; see the proxy's log"),
            ))
        }
    }
}

/// The request's path after `/<provider>`, its route and the upstream it goes to, once the
/// token is the run's and the call is one the agents make.
async fn allowed_route(
    shared: &Shared,
    grant: &Grant,
    provider: Provider,
    req: &Request<Incoming>,
) -> Result<(String, Route, Upstream), Refusal> {
    if let Err(reason) = authorize(grant, provider, req.headers()) {
        refuse(shared, grant, &reason).await;
        return Err(model_error(provider, ModelRefusal::Auth, &reason));
    }
    let rest = req
        .uri()
        .path_and_query()
        .map_or("", |pq| pq.as_str())
        .strip_prefix(&format!("/{}", provider.name()))
        .unwrap_or("")
        .to_owned();
    let route = match route(provider, req.method(), &rest) {
        Ok(route) => route,
        Err(reason) => {
            refuse(shared, grant, &reason).await;
            return Err(model_error(provider, ModelRefusal::Forbidden, &reason));
        }
    };
    let Some(upstream) = shared.config.upstream(provider).cloned() else {
        let reason = format!(
            "rover's proxy has no {} upstream configured; give rover the {} credential",
            provider.name(),
            provider.name()
        );
        refuse(shared, grant, &reason).await;
        return Err(model_error(provider, ModelRefusal::Upstream, &reason));
    };
    Ok((rest, route, upstream))
}

/// The request body, read within the run's share (see [`read_body`]).
async fn read_request(
    shared: &Shared,
    grant: &Grant,
    slots: &RunSlots,
    provider: Provider,
    body: Incoming,
    declared: Option<u64>,
) -> Result<(Bytes, BodyRoom), Refusal> {
    match read_body(&shared.limits, slots, body, declared).await {
        Ok(read) => Ok(read),
        Err(refusal) => {
            let reason = refusal.reason();
            refuse(shared, grant, &reason).await;
            let kind = match refusal {
                BodyRefusal::TooLarge => ModelRefusal::TooLarge,
                BodyRefusal::Busy => ModelRefusal::Busy,
                BodyRefusal::Slow | BodyRefusal::Broken => ModelRefusal::Incomplete,
            };
            Err(model_error(provider, kind, &reason))
        }
    }
}

/// Reserve the request's worst case against the budget; a stop limit reached is recorded in
/// the run's ledger.
async fn reserve(
    shared: &Arc<Shared>,
    grant: &Grant,
    run: &str,
    provider: Provider,
    worst: Worst,
) -> Result<Option<Reservation>, Refusal> {
    match admit(shared, grant, worst).await {
        Ok(reservation) => {
            if let Some(held) = &reservation {
                tracing::debug!(
                    run,
                    usd = held.usd,
                    tokens = held.tokens,
                    "reserved a model request's worst case"
                );
            }
            Ok(reservation)
        }
        Err(Refused::Over(over)) => Err(refuse_over(shared, grant, run, provider, over).await),
        Err(Refused::Unreadable(e)) => {
            // Without the spend the cap cannot be checked: refuse rather than overspend.
            tracing::error!(run, error = %e, "cannot read the spend");
            let reason = "rover's proxy cannot read the trace's spend, so the request was not sent; see the proxy's log";
            refuse(shared, grant, reason).await;
            Err(model_error(provider, ModelRefusal::Upstream, reason))
        }
    }
}

/// A request refused at a budget stop limit: the stop recorded in the run's ledger.
async fn refuse_over(
    shared: &Arc<Shared>,
    grant: &Grant,
    run: &str,
    provider: Provider,
    over: OverLimit,
) -> Refusal {
    let dir = shared.dir().to_owned();
    let noted = {
        let (grant, over) = (grant.clone(), over.clone());
        off_runtime(move || {
            Ledger::update(&dir, &grant, |ledger| {
                ledger.record_refusal(&over.reason);
                ledger.record_stop(over.stopped);
            })
        })
        .await
    };
    if let Err(e) = noted {
        tracing::error!(run, error = %e, "cannot record a budget stop in the run's ledger");
    }
    tracing::warn!(
        run,
        reason = %over.reason,
        "a model request was refused at a budget stop limit"
    );
    model_error(provider, ModelRefusal::Budget, &over.reason)
}

/// Reserve the request's worst case against the daemon's day and month stop limits, shared
/// with the proxies of every repository the daemon serves (none when this proxy serves a
/// daemon of one checkout); a limit reached is recorded in the run's ledger as a per-store
/// stop limit is.
async fn reserve_daemon_wide(
    shared: &Arc<Shared>,
    grant: &Grant,
    run: &str,
    provider: Provider,
    worst: Worst,
) -> Result<Option<DaemonHold>, Refusal> {
    let Some(dir) = shared.config.daemon_dir.clone() else {
        return Ok(None);
    };
    let owned = run.to_owned();
    match off_runtime(move || Ok(daemon_wide::admit(&dir, &owned, worst))).await {
        Ok(Ok(held)) => Ok(held),
        Ok(Err(DaemonRefusal::Over(over))) => {
            Err(refuse_over(shared, grant, run, provider, over).await)
        }
        Ok(Err(DaemonRefusal::Unreadable(e))) | Err(e) => {
            tracing::error!(run, error = %e, "cannot read the daemon's spend");
            let reason = "rover's proxy cannot read the daemon's spend across its repositories, so the request was not sent; see the proxy's log";
            refuse(shared, grant, reason).await;
            Err(model_error(provider, ModelRefusal::Upstream, reason))
        }
    }
}

/// The request as it goes upstream: to the upstream's URL, with the real credential.
async fn upstream_request(
    shared: &Shared,
    grant: &Grant,
    provider: Provider,
    upstream: &Upstream,
    rest: &str,
    parts: http::request::Parts,
    (body, room): (Bytes, BodyRoom),
) -> Result<Request<OutBody>, Refusal> {
    let target: Uri = match upstream.target(rest).parse() {
        Ok(uri) => uri,
        Err(e) => {
            let reason = format!("rover: the request's path does not make an upstream URL: {e}");
            refuse(shared, grant, &reason).await;
            return Err(model_error(provider, ModelRefusal::Upstream, &reason));
        }
    };
    let mut headers = parts.headers;
    strip_request_headers(&mut headers);
    add_credential(&mut headers, provider, &upstream.credential);
    let mut outgoing = Request::new(OutBody::new(body, Some(room)));
    *outgoing.method_mut() = parts.method;
    *outgoing.uri_mut() = target;
    *outgoing.version_mut() = Version::HTTP_11;
    *outgoing.headers_mut() = headers;
    Ok(outgoing)
}

/// Send the request upstream; an upstream that cannot be reached is a refusal.
async fn send(
    shared: &Shared,
    grant: &Grant,
    run: &str,
    provider: Provider,
    outgoing: Request<OutBody>,
) -> Result<Response<Incoming>, Refusal> {
    match shared.client.request(outgoing).await {
        Ok(response) => Ok(response),
        Err(e) => {
            let reason = format!(
                "rover's proxy could not reach the {} API: {e}",
                provider.name()
            );
            tracing::warn!(run, error = ?e, "an upstream model request failed");
            refuse(shared, grant, &reason).await;
            Err(model_error(provider, ModelRefusal::Upstream, &reason))
        }
    }
}

/// Whether the request carries this run's token and the run may use `provider`; the refusal
/// says why not.
fn authorize(grant: &Grant, provider: Provider, headers: &HeaderMap) -> Result<(), String> {
    let bearer = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| {
            v.strip_prefix("Bearer ")
                .or_else(|| v.strip_prefix("bearer "))
        })
        .map(str::trim);
    let api_key = headers
        .get("x-api-key")
        .and_then(|v| v.to_str().ok())
        .map(str::trim);
    let token = match provider {
        Provider::Anthropic => api_key.or(bearer),
        Provider::Openai => bearer,
    };
    let Some(token) = token else {
        return Err(format!(
            "rover: no run token in the request; send the token rover gave this sandbox as {}",
            match provider {
                Provider::Anthropic => "x-api-key or Authorization: Bearer",
                Provider::Openai => "Authorization: Bearer",
            }
        ));
    };
    if !grant.accepts(token) {
        return Err(format!(
            "rover: the token is not run {}'s; only the token rover gave this sandbox works here",
            grant.run
        ));
    }
    if grant.ended {
        return Err(format!(
            "rover: run {} has ended; its token no longer works",
            grant.run
        ));
    }
    if !grant.providers.contains(&provider) {
        return Err(format!(
            "rover: run {} may not use the {} API (its agent was given: {})",
            grant.run,
            provider.name(),
            if grant.providers.is_empty() {
                "none".to_owned()
            } else {
                grant
                    .providers
                    .iter()
                    .map(|p| p.name())
                    .collect::<Vec<_>>()
                    .join(", ")
            }
        ));
    }
    Ok(())
}

/// Record a refused model request in the run's ledger (errors are logged: the refusal stands).
async fn refuse(shared: &Shared, grant: &Grant, reason: &str) {
    tracing::info!(run = grant.run, reason, "a model request was refused");
    let dir = shared.dir().to_owned();
    let (grant, reason) = (grant.clone(), reason.to_owned());
    let run = grant.run.clone();
    let written =
        off_runtime(move || Ledger::update(&dir, &grant, |ledger| ledger.record_refusal(&reason)))
            .await;
    if let Err(e) = written {
        tracing::error!(run, error = %e, "cannot record a refusal in the run's ledger");
    }
}

/// The `model` of a JSON request body.
fn request_model(body: &[u8]) -> Option<String> {
    #[derive(serde::Deserialize)]
    struct Model {
        model: Option<String>,
    }
    serde_json::from_slice::<Model>(body).ok()?.model
}

/// Remove what must not reach the upstream: the agent's credentials, proxy and hop-by-hop
/// headers, `host` (the client sets the upstream's), the length (recomputed) and
/// `accept-encoding` (a compressed response could not be read for usage).
fn strip_request_headers(headers: &mut HeaderMap) {
    strip_hop_by_hop(headers);
    for name in [
        header::HOST,
        header::AUTHORIZATION,
        header::CONTENT_LENGTH,
        header::ACCEPT_ENCODING,
    ] {
        headers.remove(name);
    }
    headers.remove("x-api-key");
    let proxied: Vec<HeaderName> = headers
        .keys()
        .filter(|name| name.as_str().starts_with("proxy-"))
        .cloned()
        .collect();
    for name in proxied {
        headers.remove(name);
    }
}

/// Remove the hop-by-hop headers (RFC 9110 7.6.1), those `connection` names included.
pub(crate) fn strip_hop_by_hop(headers: &mut HeaderMap) {
    let named: Vec<HeaderName> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|name| HeaderName::from_bytes(name.trim().as_bytes()).ok())
        .collect();
    for name in named {
        headers.remove(name);
    }
    for name in [
        "connection",
        "keep-alive",
        "proxy-connection",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
    ] {
        headers.remove(name);
    }
}

/// Add the real credential of the upstream.
fn add_credential(headers: &mut HeaderMap, provider: Provider, credential: &Credential) {
    let bearer = |secret: &str| {
        let mut value = HeaderValue::from_str(&format!("Bearer {secret}"))
            .unwrap_or(HeaderValue::from_static(""));
        value.set_sensitive(true);
        value
    };
    match (provider, credential) {
        (Provider::Anthropic, Credential::ApiKey(key)) => {
            let mut value = HeaderValue::from_str(key).unwrap_or(HeaderValue::from_static(""));
            value.set_sensitive(true);
            headers.insert("x-api-key", value);
        }
        (Provider::Anthropic, Credential::OAuthToken(token)) => {
            headers.insert(header::AUTHORIZATION, bearer(token));
            let betas: Vec<String> = headers
                .get_all("anthropic-beta")
                .iter()
                .filter_map(|v| v.to_str().ok())
                .flat_map(|v| v.split(','))
                .map(|b| b.trim().to_owned())
                .filter(|b| !b.is_empty())
                .collect();
            if !betas.iter().any(|b| b == OAUTH_BETA) {
                let joined = betas
                    .into_iter()
                    .chain([OAUTH_BETA.to_owned()])
                    .collect::<Vec<_>>()
                    .join(",");
                if let Ok(value) = HeaderValue::from_str(&joined) {
                    headers.insert("anthropic-beta", value);
                }
            }
        }
        (Provider::Openai, Credential::ApiKey(key) | Credential::OAuthToken(key)) => {
            headers.insert(header::AUTHORIZATION, bearer(key));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn agent_credentials_and_hop_headers_are_replaced() {
        let mut headers = HeaderMap::new();
        for (name, value) in [
            ("authorization", "Bearer rover-run-x"),
            ("x-api-key", "rover-run-x"),
            ("proxy-authorization", "Basic abc"),
            ("connection", "keep-alive, x-hop"),
            ("x-hop", "1"),
            ("host", "relay:8080"),
            ("accept-encoding", "gzip"),
            ("anthropic-beta", "a-1, b-2"),
            ("anthropic-version", "2023-06-01"),
        ] {
            headers.append(name, HeaderValue::from_static(value));
        }
        strip_request_headers(&mut headers);
        add_credential(
            &mut headers,
            Provider::Anthropic,
            &Credential::OAuthToken("oat".into()),
        );
        let mut names: Vec<&str> = headers.keys().map(HeaderName::as_str).collect();
        names.sort_unstable();
        assert_eq!(
            names,
            ["anthropic-beta", "anthropic-version", "authorization"]
        );
        assert_eq!(headers["authorization"], "Bearer oat");
        assert_eq!(headers["anthropic-beta"], "a-1,b-2,oauth-2025-04-20");
    }
}
