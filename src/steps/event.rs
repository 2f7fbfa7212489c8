//! The `event` step: turns an event (a GitHub event from the poller, or a local request from
//! `rover autopilot submit`) into the root span of a new trace and its first `coordinate` action.
//!
//! GitHub events get ids derived from the project and the GitHub event id (the webhook delivery
//! id for a webhook), so an event ingested twice (a crash between writing the trace and the
//! cursor, GitHub serving it again, a redelivered webhook) lands on the same trace instead of
//! starting a second one. An event that comes both by webhook and by polling (two different ids)
//! is recognised by its content key (`NormalizedEvent::dedupe_key`) and also starts one trace.

use chrono::Utc;
use uuid::Uuid;

use super::meta::{EventMeta, EventSource};
use crate::github::{
    poll_once, Channel, GitHub, GitHubError, NormalizedEvent, PollCursor, Poller, Visibility,
};
use crate::store::{
    Action, AutopilotStore, Meta, Span, SpanStatus, StepKind, StoreError, TraceCreated,
};

/// The key under which `cursor.json` keeps the poller's ETag and seen ids.
pub const POLL_CURSOR_KEY: &str = "poll";

/// A one-line label: `IssuesEvent opened #12 by alice`.
pub fn label(event: &NormalizedEvent) -> String {
    let mut parts = vec![event.kind.as_str().to_owned()];
    if let Some(action) = event.action.and_then(|a| serde_json::to_value(a).ok()) {
        parts.push(action.as_str().unwrap_or_default().to_owned());
    }
    match (event.number, &event.git_ref) {
        (Some(n), _) => parts.push(format!("#{n}")),
        (None, Some(git_ref)) => {
            parts.push(format!("to {}", git_ref.trim_start_matches("refs/heads/")));
        }
        (None, None) => {}
    }
    parts.push(format!("by {}", event.actor));
    if let (None, Some(sha)) = (event.number, &event.commit_sha) {
        parts.push(format!("({})", &sha[..sha.len().min(7)]));
    }
    parts.join(" ")
}

/// The root span and first action of the trace for a GitHub event (deterministic ids).
pub fn github_trace(project_id: &str, event: &NormalizedEvent) -> (Span, Action) {
    let root_id = Uuid::new_v5(
        &Uuid::NAMESPACE_URL,
        format!("rover:{project_id}:github-event:{}", event.id).as_bytes(),
    );
    let meta = EventMeta {
        source: EventSource::Github,
        label: label(event),
        kind: event.kind.as_str().to_owned(),
        action: event
            .action
            .and_then(|a| serde_json::to_value(a).ok())
            .and_then(|v| v.as_str().map(str::to_owned)),
        channel: event.channel.clone(),
        visibility: event.visibility,
        event: Some(event.clone()),
        request: None,
    };
    build(root_id, &meta, format!("new {} event", event.kind.as_str()))
}

/// The root span and first action of the trace for a local request (private, answered in the
/// trace itself).
pub fn local_trace(request: &str, actor: &str) -> (Span, Action) {
    let first_line = request
        .lines()
        .find(|l| !l.trim().is_empty())
        .unwrap_or_default();
    let short: String = first_line.chars().take(80).collect();
    let meta = EventMeta {
        source: EventSource::Local,
        label: format!("local request by {actor}: {short}"),
        kind: "LocalRequest".into(),
        action: None,
        channel: Channel::Local,
        visibility: Visibility::Private,
        event: None,
        request: Some(request.to_owned()),
    };
    build(Uuid::new_v4(), &meta, "new local request".into())
}

fn build(root_id: Uuid, meta: &EventMeta, reason: String) -> (Span, Action) {
    let now = Utc::now();
    let mut root = Span::root(root_id, now, meta.to_meta());
    root.finish(SpanStatus::Completed, meta.label.clone(), Meta::new(), now)
        .expect("a new span finishes");
    let mut first = Action::new(StepKind::Coordinate, &root, reason, Meta::new(), now);
    first.id = Uuid::new_v5(&root_id, b"coordinate");
    (root, first)
}

/// The path an event came by (recorded with its content key).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Via {
    Poll,
    Webhook,
}

impl Via {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Poll => "poll",
            Self::Webhook => "webhook",
        }
    }
}

/// What ingesting one GitHub event did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ingested {
    /// A new trace started.
    New(Uuid),
    /// The event (same id) had already started this trace.
    Duplicate(Uuid),
    /// The same event had already come by the other path and started this trace.
    OtherPath(Uuid),
}

/// Start the trace of a GitHub event (its root span and `coordinate` action) unless it already
/// has one; the poller and the webhook both come through here. Blocking (store I/O).
pub fn ingest_event(
    store: &AutopilotStore,
    project_id: &str,
    event: &NormalizedEvent,
    via: Via,
) -> Result<Ingested, StoreError> {
    let (root, first) = github_trace(project_id, event);
    let created = store.create_event_trace(
        &root,
        Some(&first),
        &event.id,
        event.dedupe_key.as_deref(),
        via.as_str(),
    )?;
    Ok(match created {
        TraceCreated::New => {
            tracing::info!(trace = %root.id, event = %event.id, via = via.as_str(), label = %label(event), "new trace");
            Ingested::New(root.id)
        }
        TraceCreated::Existing(trace) => Ingested::Duplicate(trace),
        TraceCreated::OtherPath(trace) => {
            tracing::info!(trace = %trace, event = %event.id, via = via.as_str(), key = event.dedupe_key.as_deref().unwrap_or(""), "event already ingested by the other path");
            Ingested::OtherPath(trace)
        }
    })
}

/// What one GitHub poll did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct IngestReport {
    pub polled: bool,
    pub not_modified: bool,
    pub new_traces: Vec<Uuid>,
    pub skipped: usize,
}

#[derive(Debug, thiserror::Error)]
pub enum IngestError {
    #[error(transparent)]
    GitHub(#[from] GitHubError),
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// The poller, resumed from `cursor.json` (its ETag and the ids it has seen).
pub fn resume_poller(
    store: &AutopilotStore,
    settings: crate::github::PollSettings,
) -> Result<Poller, StoreError> {
    let cursor = store.read_cursor()?;
    let poll: PollCursor = cursor
        .extra
        .get(POLL_CURSOR_KEY)
        .and_then(|v| serde_json::from_value(v.clone()).ok())
        .unwrap_or_default();
    Ok(Poller::new(settings, poll))
}

/// Poll GitHub once if due and start a trace for every new relevant event.
pub async fn poll_github(
    store: &AutopilotStore,
    project_id: &str,
    github: &dyn GitHub,
    poller: &mut Poller,
) -> Result<IngestReport, IngestError> {
    let Some(result) = poll_once(github, poller, Utc::now()).await? else {
        return Ok(IngestReport::default());
    };
    let mut report = IngestReport {
        polled: true,
        not_modified: result.not_modified,
        skipped: result.skipped,
        ..IngestReport::default()
    };
    let poll_cursor = serde_json::to_value(poller.cursor()).unwrap_or_default();
    let store = store.clone();
    let project_id = project_id.to_owned();
    let events = result.new_events;
    report.new_traces = tokio::task::spawn_blocking(move || {
        let mut new = Vec::new();
        for event in &events {
            if let Ingested::New(trace) = ingest_event(&store, &project_id, event, Via::Poll)? {
                new.push(trace);
            }
        }
        // The poller's ETag and seen ids go with the cursor, after the traces exist.
        store.transact(|txn| {
            txn.cursor_mut()?
                .extra
                .insert(POLL_CURSOR_KEY.into(), poll_cursor);
            Ok(())
        })?;
        Ok::<_, StoreError>(new)
    })
    .await
    .expect("ingestion does not panic")?;
    Ok(report)
}
