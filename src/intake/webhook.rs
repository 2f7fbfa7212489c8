//! Webhook deliveries as a source (`rover autopilot start --webhook ADDR`): serves `POST /github`.
//!
//! A delivery is verified (`X-Hub-Signature-256`), normalized like a polled event
//! (`github::webhook`) and written to the store (root span and `coordinate` action, through the
//! same [`super::ingest`] as every source) before the 2xx goes out, so a crash after the answer
//! loses nothing and a store error (500) makes GitHub's redelivery worth trying. A CI outcome
//! (`check_run`, `check_suite`, `workflow_run`, `status`) makes no trace: it goes to the queue
//! as a signal ([`super::ci`]), which makes the runs waiting on that commit due now, and the
//! answer says how many. Plain HTTP: put it behind a TLS-terminating proxy.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::body::Body;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;
use axum::Router;
use futures_util::StreamExt;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use super::ci::{ingest_ci, CiOutcome};
use super::{ingest, label, skipped_delivery, Arrival, Ingested, Queue, Via};
use crate::github::webhook::{parse_delivery, verify_signature, Delivery, MAX_BODY_BYTES};
use crate::github::NormalizeOptions;
use crate::store::{AutopilotStore, IntakeRecord};

/// What the handler needs; shared by every request.
pub struct WebhookState {
    pub store: AutopilotStore,
    /// Where a delivery's trace starts.
    pub entry: super::Entry,
    /// `owner/name` of the watched repository; deliveries for another one are skipped.
    pub repo: Option<String>,
    pub normalize: NormalizeOptions,
    /// Where what came in goes on: woken after an event is stored, handed CI outcomes.
    pub queue: Arc<dyn Queue>,
}

/// One repository's endpoint: deliveries verified with `secret`, then handed to `state`.
pub struct Endpoint {
    pub secret: Vec<u8>,
    pub state: Arc<WebhookState>,
}

/// A bound webhook listener, not serving yet: one repository's endpoint, or the daemon file's
/// routed one (`super::webhook_routes`).
pub struct WebhookServer {
    listener: TcpListener,
    app: Router,
}

impl WebhookServer {
    /// Bind `addr` (port 0: the OS picks one) for one repository.
    pub async fn bind(addr: SocketAddr, endpoint: Endpoint) -> std::io::Result<Self> {
        Self::bind_app(addr, router(Arc::new(endpoint))).await
    }

    /// Bind `addr` to serve `app`'s routes.
    pub(super) async fn bind_app(addr: SocketAddr, app: Router) -> std::io::Result<Self> {
        let listener = TcpListener::bind(addr).await?;
        Ok(Self { listener, app })
    }

    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    /// Serve until `shutdown`: then stop accepting and finish the requests in flight.
    pub async fn serve(self, shutdown: CancellationToken) -> std::io::Result<()> {
        axum::serve(self.listener, self.app)
            .with_graceful_shutdown(shutdown.cancelled_owned())
            .await
    }
}

/// The routes: `POST /github`, bodies up to GitHub's 25 MB (larger: 413).
pub fn router(endpoint: Arc<Endpoint>) -> Router {
    Router::new()
        .route("/github", post(github))
        // The body is read (and limited) by the handler itself.
        .layer(DefaultBodyLimit::disable())
        .with_state(endpoint)
}

/// Read the body, up to `limit` bytes: `Err(413)` past it (by `Content-Length` before reading,
/// or while reading a body sent without one), `Err(400)` when the connection fails.
async fn read_body(
    headers: &HeaderMap,
    body: Body,
    limit: usize,
) -> Result<Vec<u8>, (StatusCode, String)> {
    let too_large = || {
        (
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("the body is larger than {limit} bytes\n"),
        )
    };
    let declared = header(headers, "content-length").and_then(|v| v.trim().parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit as u64) {
        return Err(too_large());
    }
    let mut out = Vec::with_capacity(declared.map_or(0, |n| usize::try_from(n).unwrap_or(0)));
    let mut stream = body.into_data_stream();
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(|e| {
            (
                StatusCode::BAD_REQUEST,
                format!("cannot read the body: {e}\n"),
            )
        })?;
        if out.len() + chunk.len() > limit {
            return Err(too_large());
        }
        out.extend_from_slice(&chunk);
    }
    Ok(out)
}

pub(super) fn header<'h>(headers: &'h HeaderMap, name: &str) -> Option<&'h str> {
    headers.get(name).and_then(|v| v.to_str().ok())
}

/// A delivery whose body was read and whose signature matches: its headers as sent (empty when
/// missing) and its body, not parsed yet.
pub(super) struct Verified {
    pub delivery: String,
    pub event: String,
    pub body: Vec<u8>,
}

/// Read the body (bounded) and check its signature with `secret`, before anything is parsed:
/// a refusal is the answer to send.
pub(super) async fn verified(
    secret: &[u8],
    headers: &HeaderMap,
    body: Body,
) -> Result<Verified, (StatusCode, String)> {
    let body = match read_body(headers, body, MAX_BODY_BYTES).await {
        Ok(body) => body,
        Err(refusal) => {
            tracing::warn!(delivery = header(headers, "x-github-delivery").unwrap_or(""), status = %refusal.0, "webhook delivery refused");
            return Err(refusal);
        }
    };
    let delivery = header(headers, "x-github-delivery")
        .unwrap_or("")
        .to_owned();
    let event = header(headers, "x-github-event").unwrap_or("").to_owned();
    if let Err(e) = verify_signature(secret, &body, header(headers, "x-hub-signature-256")) {
        tracing::warn!(delivery = %delivery, event = %event, bytes = body.len(), error = &e as &dyn std::error::Error, "webhook delivery refused");
        return Err((StatusCode::UNAUTHORIZED, format!("{e}\n")));
    }
    Ok(Verified {
        delivery,
        event,
        body,
    })
}

async fn github(
    State(endpoint): State<Arc<Endpoint>>,
    headers: HeaderMap,
    body: Body,
) -> (StatusCode, String) {
    match verified(&endpoint.secret, &headers, body).await {
        Ok(delivery) => handle(&endpoint.state, delivery).await,
        Err(refusal) => refusal,
    }
}

/// What becomes of a verified delivery for the repository of `st`: answered, skipped (and
/// recorded in its intake log), or stored as a trace before the answer.
pub(super) async fn handle(st: &Arc<WebhookState>, verified: Verified) -> (StatusCode, String) {
    let Verified {
        delivery,
        event,
        body,
    } = verified;
    if delivery.is_empty() || event.is_empty() {
        tracing::warn!(delivery = %delivery, event = %event, "webhook delivery without X-GitHub-Delivery or X-GitHub-Event");
        return (
            StatusCode::BAD_REQUEST,
            "X-GitHub-Delivery and X-GitHub-Event are required\n".into(),
        );
    }
    let parsed = parse_delivery(
        &event,
        &delivery,
        &body,
        st.repo.as_deref(),
        &st.normalize,
        chrono::Utc::now(),
    );
    let normalized = match parsed {
        Ok(Delivery::Ping) => {
            tracing::info!(delivery = %delivery, "webhook ping");
            record(
                st,
                skipped_delivery(&event, &delivery, &body, "ping: the webhook says hello"),
            )
            .await;
            return (StatusCode::OK, "pong\n".into());
        }
        Ok(Delivery::Skipped(why)) => {
            tracing::info!(delivery = %delivery, event = %event, reason = %why, "webhook delivery skipped");
            record(st, skipped_delivery(&event, &delivery, &body, &why)).await;
            return (StatusCode::ACCEPTED, format!("skipped: {why}\n"));
        }
        Err(why) => {
            tracing::warn!(delivery = %delivery, event = %event, reason = %why, "malformed webhook delivery");
            record(
                st,
                skipped_delivery(
                    &event,
                    &delivery,
                    &body,
                    &format!("malformed payload: {why}"),
                ),
            )
            .await;
            return (StatusCode::BAD_REQUEST, format!("malformed: {why}\n"));
        }
        Ok(Delivery::Ci { sha, what }) => {
            // Only a hint: the runs waiting on that commit look at GitHub now.
            return match ingest_ci(st.queue.as_ref(), CiOutcome::new(&sha, what.clone())).await {
                Ok(n) => {
                    tracing::info!(delivery = %delivery, %sha, %what, woken = n, "webhook ci outcome");
                    (
                        StatusCode::ACCEPTED,
                        format!("{what} for {sha}: {n} ci watch(es) look now\n"),
                    )
                }
                Err(e) => {
                    tracing::error!(delivery = %delivery, %sha, error = &e as &dyn std::error::Error, "cannot hand a ci outcome to the queue");
                    (
                        StatusCode::INTERNAL_SERVER_ERROR,
                        "cannot read the store; redeliver it later\n".into(),
                    )
                }
            };
        }
        Ok(Delivery::Event(normalized)) => normalized,
    };
    // Persist before answering: the 200 promises the event is in the store.
    let ingested = {
        let st = st.clone();
        let normalized = normalized.clone();
        tokio::task::spawn_blocking(move || {
            let arrival = Arrival::Github {
                event: &normalized,
                via: Via::Webhook,
            };
            ingest(&st.store, &st.entry, arrival)
        })
        .await
    };
    // Its intake record went into the store with it.
    match ingested {
        Ok(Ok(Ingested::New(trace))) => {
            println!("webhook: {} (delivery {delivery})", label(&normalized));
            st.queue.wake();
            (StatusCode::OK, format!("ingested: trace {trace}\n"))
        }
        Ok(Ok(Ingested::Duplicate(trace))) => {
            tracing::info!(delivery = %delivery, trace = %trace, "webhook delivery already ingested");
            (
                StatusCode::OK,
                format!("duplicate delivery: already ingested as trace {trace}\n"),
            )
        }
        Ok(Ok(Ingested::OtherPath(trace))) => (
            StatusCode::OK,
            format!("duplicate event: already ingested by polling or reconcile as trace {trace}\n"),
        ),
        Ok(Err(e)) => {
            tracing::error!(delivery = %delivery, error = &e as &dyn std::error::Error, "cannot store a webhook delivery");
            (
                StatusCode::INTERNAL_SERVER_ERROR,
                "cannot store the event; redeliver it later\n".into(),
            )
        }
        Err(e) => {
            tracing::error!(delivery = %delivery, error = &e as &dyn std::error::Error, "storing a webhook delivery panicked");
            (
                StatusCode::INTERNAL_SERVER_ERROR,
                "cannot store the event; redeliver it later\n".into(),
            )
        }
    }
}

/// Append to the intake log; a failure is logged, never fails the delivery (the event itself is
/// already stored, or was never to be).
async fn record(st: &Arc<WebhookState>, record: IntakeRecord) {
    let store = st.store.clone();
    let result = tokio::task::spawn_blocking(move || store.append_intake(&[record])).await;
    match result {
        Ok(Ok(())) => {}
        Ok(Err(e)) => {
            tracing::error!(
                error = &e as &dyn std::error::Error,
                "cannot record a webhook delivery in the intake log"
            );
        }
        Err(e) => tracing::error!(
            error = &e as &dyn std::error::Error,
            "recording a webhook delivery panicked"
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_body_past_the_limit_is_413_with_or_without_a_length() {
        let mut headers = HeaderMap::new();
        let read = |h: HeaderMap, n: usize| async move {
            read_body(&h, Body::from(vec![b'x'; n]), 8).await
        };
        assert_eq!(read(headers.clone(), 8).await.expect("fits").len(), 8);
        assert_eq!(
            read(headers.clone(), 9).await.expect_err("too big").0,
            StatusCode::PAYLOAD_TOO_LARGE
        );
        headers.insert("content-length", "9".parse().expect("a header value"));
        assert_eq!(
            read(headers, 0).await.expect_err("declared too big").0,
            StatusCode::PAYLOAD_TOO_LARGE
        );
    }
}
