//! One webhook endpoint for every repository a daemon file serves (`rover autopilot start
//! --config FILE --webhook ADDR`): each delivery is verified with the one secret before anything
//! is parsed, then routed by its `repository.full_name` (not case-sensitive, as GitHub's names
//! are) to that repository's intake ([`super::webhook::handle`], its own store, normalize
//! options and trust), as its own `--webhook` would have taken it.
//!
//! The table of [`Routes`] changes while the server runs: a repository adds itself when it is
//! served and is marked failing (or removed) when it stops, so one added or dropped at runtime is
//! routed or not without a restart. A delivery for a repository not served, or being retried, is
//! answered 404 with a short JSON body and recorded as one JSON line of the refused log
//! (`<data dir>/daemon/refused.jsonl`); the poller catches up with a failing one once it is
//! served again. `installation` and `installation_repositories` (sent to a GitHub App, with no
//! repository) are answered 202 and wake whoever re-lists the installed repositories.

use std::collections::HashMap;
use std::io::Write as _;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, PoisonError, RwLock};

use axum::body::Body;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{header::CONTENT_TYPE, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::Router;
use chrono::{SecondsFormat, Utc};
use serde_json::{json, Value};

use super::webhook::{handle, verified, Verified, WebhookServer, WebhookState};

/// The refused log's reason for a repository the daemon does not serve.
pub const NOT_SERVED: &str = "not served by this daemon";
/// The longest text a field of the refused log keeps (they come from the delivery, untrusted).
const FIELD_CHARS: usize = 200;
/// The longest reason the refused log keeps (a failing repository's reason may be long).
const REASON_CHARS: usize = 500;

/// Where a served repository's deliveries go.
#[derive(Clone)]
enum Route {
    /// Served: handed to its intake.
    Serving(Arc<WebhookState>),
    /// Set up or tried again: refused, saying why.
    Failing(String),
}

/// The served repositories by `owner/name` (kept lowercase): shared by the server and every
/// repository, each changing its own entry.
#[derive(Clone, Default)]
pub struct Routes(Arc<RwLock<HashMap<String, Route>>>);

impl Routes {
    /// Deliveries for `repo` go to `state` from now on.
    pub fn serve(&self, repo: &str, state: WebhookState) {
        self.set(repo, Some(Route::Serving(Arc::new(state))));
    }

    /// Deliveries for `repo` are refused, saying `why` (set up, or tried again after a failure).
    pub fn failing(&self, repo: &str, why: &str) {
        self.set(repo, Some(Route::Failing(why.to_owned())));
    }

    /// `repo` is no longer served: its deliveries are refused as any unknown repository's.
    pub fn remove(&self, repo: &str) {
        self.set(repo, None);
    }

    fn set(&self, repo: &str, route: Option<Route>) {
        let mut table = self.0.write().unwrap_or_else(PoisonError::into_inner);
        let key = repo.to_ascii_lowercase();
        match route {
            Some(route) => table.insert(key, route),
            None => table.remove(&key),
        };
    }

    fn route(&self, repo: &str) -> Option<Route> {
        let table = self.0.read().unwrap_or_else(PoisonError::into_inner);
        table.get(&repo.to_ascii_lowercase()).cloned()
    }
}

/// The routed endpoint: the one secret, the table, the refused log.
pub struct RoutedEndpoint {
    pub secret: Vec<u8>,
    pub routes: Routes,
    /// `<data dir>/daemon/refused.jsonl`.
    pub refused_log: PathBuf,
    /// Woken by `installation` and `installation_repositories`: re-list the installed
    /// repositories now (`None`: nobody lists them; the events are answered all the same).
    pub installations: Option<Arc<tokio::sync::Notify>>,
    /// One line at a time into the refused log.
    pub refused_lock: Mutex<()>,
}

impl WebhookServer {
    /// Bind `addr` for every repository of `endpoint`'s table.
    pub async fn bind_routed(addr: SocketAddr, endpoint: RoutedEndpoint) -> std::io::Result<Self> {
        let app = Router::new()
            .route("/github", post(routed))
            .layer(DefaultBodyLimit::disable())
            .with_state(Arc::new(endpoint));
        Self::bind_app(addr, app).await
    }
}

/// Verified, then routed by the repository it names.
async fn routed(
    State(endpoint): State<Arc<RoutedEndpoint>>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let delivery = match verified(&endpoint.secret, &headers, body).await {
        Ok(delivery) => delivery,
        Err(refusal) => return refusal.into_response(),
    };
    if delivery.event.is_empty() {
        return (
            StatusCode::BAD_REQUEST,
            "X-GitHub-Event is required\n".to_owned(),
        )
            .into_response();
    }
    if matches!(
        delivery.event.as_str(),
        "installation" | "installation_repositories"
    ) {
        tracing::info!(delivery = %delivery.delivery, event = %delivery.event, "an installation changed");
        let answer = match &endpoint.installations {
            Some(relist) => {
                relist.notify_one();
                "the installed repositories are listed again\n"
            }
            None => "noted: this daemon serves the repositories its daemon file lists\n",
        };
        return (StatusCode::ACCEPTED, answer.to_owned()).into_response();
    }
    let repo = full_name(&delivery.body);
    let route = repo.as_deref().and_then(|r| endpoint.routes.route(r));
    match (route, repo) {
        (Some(Route::Serving(state)), _) => handle(&state, delivery).await.into_response(),
        _ if delivery.event == "ping" => (StatusCode::OK, "pong\n".to_owned()).into_response(),
        (Some(Route::Failing(why)), repo) => {
            refuse(&endpoint, &delivery, repo, format!("failing: {why}")).await
        }
        (None, repo) => refuse(&endpoint, &delivery, repo, NOT_SERVED.to_owned()).await,
    }
}

/// The delivery's `repository.full_name`, if it is a JSON object that names one.
fn full_name(body: &[u8]) -> Option<String> {
    #[derive(serde::Deserialize)]
    struct Named {
        repository: Option<Value>,
    }
    let named: Named = serde_json::from_slice(body).ok()?;
    let name = named.repository?.get("full_name")?.as_str()?.to_owned();
    Some(name)
}

/// A 404 with a short JSON body, and the refusal recorded.
async fn refuse(
    endpoint: &Arc<RoutedEndpoint>,
    delivery: &Verified,
    repo: Option<String>,
    reason: String,
) -> Response {
    let line = refused_line(delivery, repo.as_deref(), &reason, Utc::now());
    tracing::warn!(delivery = %delivery.delivery, event = %delivery.event, repo = repo.as_deref().unwrap_or(""), reason = %reason, "webhook delivery refused: its repository is not served");
    let written = {
        let endpoint = endpoint.clone();
        tokio::task::spawn_blocking(move || append_refused(&endpoint, &line)).await
    };
    match written {
        Ok(Ok(())) => {}
        Ok(Err(e)) => tracing::error!(error = %e, "cannot record a refused webhook delivery"),
        Err(e) => tracing::error!(error = %e, "recording a refused webhook delivery panicked"),
    }
    let body = json!({"refused": bounded(&reason, REASON_CHARS), "repo": repo.map(|r| bounded(&r, FIELD_CHARS))});
    (
        StatusCode::NOT_FOUND,
        [(CONTENT_TYPE, "application/json")],
        format!("{body}\n"),
    )
        .into_response()
}

/// One line of the refused log: when, the delivery, its event, its repository and why.
fn refused_line(
    delivery: &Verified,
    repo: Option<&str>,
    reason: &str,
    at: chrono::DateTime<Utc>,
) -> String {
    let id = Some(delivery.delivery.as_str()).filter(|d| !d.is_empty());
    let record = json!({
        "at": at.to_rfc3339_opts(SecondsFormat::Millis, true),
        "deliveryId": id.map(|d| bounded(d, FIELD_CHARS)),
        "event": bounded(&delivery.event, FIELD_CHARS),
        "repo": repo.map(|r| bounded(r, FIELD_CHARS)),
        "reason": bounded(reason, REASON_CHARS),
    });
    format!("{record}\n")
}

/// Appends `line` in one write, under the endpoint's lock, to a file opened for appending.
fn append_refused(endpoint: &RoutedEndpoint, line: &str) -> std::io::Result<()> {
    let _one_at_a_time = endpoint
        .refused_lock
        .lock()
        .unwrap_or_else(PoisonError::into_inner);
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&endpoint.refused_log)?;
    file.write_all(line.as_bytes())
}

/// `text` without control characters, cut to `max` characters (it comes from a delivery).
fn bounded(text: &str, max: usize) -> String {
    text.chars().filter(|c| !c.is_control()).take(max).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refused_line_has_its_fields_bounded_and_free_of_control_characters() {
        let delivery = Verified {
            delivery: String::new(),
            event: "issues\n{\"forged\":1}".to_owned(),
            body: Vec::new(),
        };
        let long = "x".repeat(10_000);
        let at = chrono::DateTime::parse_from_rfc3339("2026-11-29T21:00:00Z")
            .expect("a time")
            .with_timezone(&Utc);
        let line = refused_line(&delivery, Some(&long), NOT_SERVED, at);
        assert!(
            line.ends_with('\n') && line.matches('\n').count() == 1,
            "{line}"
        );
        let record: Value = serde_json::from_str(&line).expect("one JSON line");
        assert_eq!(record["at"], "2026-11-29T21:00:00.000Z");
        assert_eq!(record["deliveryId"], Value::Null);
        assert_eq!(record["event"], "issues{\"forged\":1}");
        assert_eq!(record["repo"].as_str().expect("a name").len(), FIELD_CHARS);
        assert_eq!(record["reason"], NOT_SERVED);
        let keys: Vec<&String> = record.as_object().expect("an object").keys().collect();
        assert_eq!(keys.len(), 5, "{keys:?}");
    }

    #[test]
    fn routes_are_found_whatever_the_case_and_change_while_they_are_used() {
        let routes = Routes::default();
        routes.failing("Octo-Org/API", "starting");
        assert!(
            matches!(routes.route("octo-org/api"), Some(Route::Failing(why)) if why == "starting")
        );
        routes.remove("octo-org/api");
        assert!(routes.route("OCTO-ORG/API").is_none());
    }

    #[test]
    fn only_a_json_object_with_a_repository_name_is_routed() {
        assert_eq!(
            full_name(br#"{"repository": {"full_name": "a/b"}}"#).as_deref(),
            Some("a/b")
        );
        assert_eq!(full_name(br#"{"repository": {"full_name": 3}}"#), None);
        assert_eq!(full_name(br#"{"installation": {"id": 1}}"#), None);
        assert_eq!(full_name(b"payload=%7B%7D"), None);
        assert_eq!(full_name(b"[1]"), None);
    }
}
