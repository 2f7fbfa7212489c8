//! Cancel and retry from a trace's page (`--allow-actions` only): a POST with the page's CSRF
//! token from the dashboard's own origin, done by `steps::intervene` as `rover autopilot cancel`
//! and `retry` do it, recorded with `by: dashboard`, and the daemon woken to act on it now.

use axum::extract::{Path, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{Html, IntoResponse, Response};
use serde::Deserialize;

use super::html::message;
use super::{Dash, Shared};
use crate::store::CloseCommand;

/// Who the trace says acted.
pub const BY: &str = "dashboard";

#[derive(Deserialize)]
pub struct ActionForm {
    #[serde(default)]
    csrf: String,
    #[serde(default)]
    reason: String,
}

#[derive(Clone, Copy)]
enum Act {
    Cancel,
    Retry,
}

pub async fn cancel(
    State(shared): State<Shared>,
    Path(id): Path<String>,
    headers: HeaderMap,
    axum::Form(form): axum::Form<ActionForm>,
) -> Response {
    act(shared, id, &headers, form, Act::Cancel).await
}

pub async fn retry(
    State(shared): State<Shared>,
    Path(id): Path<String>,
    headers: HeaderMap,
    axum::Form(form): axum::Form<ActionForm>,
) -> Response {
    act(shared, id, &headers, form, Act::Retry).await
}

async fn act(
    shared: Shared,
    id: String,
    headers: &HeaderMap,
    form: ActionForm,
    what: Act,
) -> Response {
    if !shared.allow_actions {
        return refused(
            "this dashboard is read-only: start it with --allow-actions to cancel and retry",
        );
    }
    if let Some(why) = shared.auth.refuses_post(headers, &form.csrf) {
        return refused(why);
    }
    super::blocking(shared, move |dash| {
        match run(dash, &id, &form.reason, what) {
            Ok(trace) => (
                StatusCode::SEE_OTHER,
                [(header::LOCATION, format!("/trace/{trace}"))],
            )
                .into_response(),
            Err(e) => super::failure(&e),
        }
    })
    .await
}

fn refused(why: &str) -> Response {
    (StatusCode::FORBIDDEN, Html(message("Refused", why))).into_response()
}

fn run(
    dash: &Dash,
    id: &str,
    reason: &str,
    what: Act,
) -> Result<uuid::Uuid, super::super::CliError> {
    let opened = dash.sources.open(&dash.ctx);
    let (source, trace) = opened.find_trace(id)?;
    let store = &source.store;
    let reason: String = reason
        .chars()
        .filter(|c| !c.is_control())
        .take(200)
        .collect();
    match what {
        Act::Cancel => {
            crate::steps::intervene::close_trace(store, trace, CloseCommand::Cancel, &reason, BY)?;
        }
        Act::Retry => {
            let reason = (!reason.is_empty()).then_some(reason.as_str());
            crate::steps::intervene::retry_trace(store, trace, None, BY, reason)?;
        }
    }
    super::super::wake_daemon(store);
    Ok(trace)
}
