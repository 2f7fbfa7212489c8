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
    poll_once, Channel, GitHub, GitHubError, NormalizedEvent, Poller, SkippedEvent, Visibility,
};

use crate::store::{
    Action, AutopilotStore, IntakeOutcome, IntakeRecord, Meta, Span, SpanStatus, StepKind,
    StoreError, TraceCreated, Txn,
};

/// A one-line label: `IssuesEvent opened #12 by alice`.
pub fn label(event: &NormalizedEvent) -> String {
    let mut parts = vec![event.kind.as_str().to_owned()];
    if let Some(action) = event.action {
        parts.push(action.as_str().to_owned());
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
        action: action_str(event),
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

/// The intake record of a local request (`submit`): `via: "local"`, ingested into `trace`.
pub fn local_record(trace: Uuid, actor: &str) -> IntakeRecord {
    let mut r = IntakeRecord::new("local", IntakeOutcome::Ingested, Utc::now());
    r.kind = Some("LocalRequest".to_owned());
    r.actor = Some(actor.to_owned());
    r.trace_id = Some(trace);
    r
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
    /// The list APIs, swept for what the feed missed.
    Reconcile,
}

impl Via {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Poll => "poll",
            Self::Webhook => "webhook",
            Self::Reconcile => "reconcile",
        }
    }
}

fn action_str(event: &NormalizedEvent) -> Option<String> {
    event.action.map(|a| a.as_str().to_owned())
}

/// The intake record of an event rover normalized (`outcome` and `reason` to fill in).
pub fn event_record(event: &NormalizedEvent, via: Via, outcome: IntakeOutcome) -> IntakeRecord {
    let mut r = IntakeRecord::new(via.as_str(), outcome, Utc::now());
    r.event_id = Some(event.id.clone());
    r.kind = Some(event.kind.as_str().to_owned());
    r.action = action_str(event);
    r.number = event.number;
    r.actor = Some(event.actor.clone());
    r
}

/// The intake record of what [`ingest_event`] did with an event.
pub fn ingested_record(event: &NormalizedEvent, via: Via, ingested: Ingested) -> IntakeRecord {
    let (outcome, reason, trace) = match ingested {
        Ingested::New(t) => (IntakeOutcome::Ingested, None, t),
        Ingested::Duplicate(t) => (
            IntakeOutcome::Duplicate,
            Some("already ingested: this event started a trace before".to_owned()),
            t,
        ),
        Ingested::OtherPath(t) => (
            IntakeOutcome::Duplicate,
            Some("already ingested: the same event came by another path".to_owned()),
            t,
        ),
    };
    let mut r = event_record(event, via, outcome);
    r.reason = reason;
    r.trace_id = Some(trace);
    r
}

/// The intake record of a feed item skipped by normalization.
pub fn skipped_record(skipped: &SkippedEvent, via: Via) -> IntakeRecord {
    let mut r = IntakeRecord::new(via.as_str(), IntakeOutcome::Skipped, Utc::now())
        .reason(skipped.reason.to_string());
    r.event_id.clone_from(&skipped.id);
    r.kind.clone_from(&skipped.kind);
    r.action.clone_from(&skipped.action);
    r.number = skipped.number;
    r.actor.clone_from(&skipped.actor);
    r
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
/// has one; the webhook and reconcile come through here, the poller through
/// [`ingest_event_in`]. What became of the event goes into the intake log in the same locked
/// update (so arrivals are listed in the order the store saw them), except a reconcile sweep
/// finding its own event again, which the first sweep recorded. Blocking (store I/O).
pub fn ingest_event(
    store: &AutopilotStore,
    project_id: &str,
    event: &NormalizedEvent,
    via: Via,
) -> Result<Ingested, StoreError> {
    store.transact(|txn| {
        let ingested = ingest_event_in(store, txn, project_id, event, via)?;
        if !matches!((via, ingested), (Via::Reconcile, Ingested::Duplicate(_))) {
            txn.record_intake(ingested_record(event, via, ingested));
        }
        Ok(ingested)
    })
}

/// [`ingest_event`] within a transaction, without the intake record.
pub fn ingest_event_in(
    store: &AutopilotStore,
    txn: &mut Txn<'_>,
    project_id: &str,
    event: &NormalizedEvent,
    via: Via,
) -> Result<Ingested, StoreError> {
    let (root, first) = github_trace(project_id, event);
    let created = store.create_event_trace_in(
        txn,
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
    /// How many pages of the feed were read.
    pub pages: usize,
    /// Relevant events of the backlog not processed on the first start.
    pub backlog_skipped: usize,
    /// Why events may have been missed, when they may have been (a reconcile is due).
    pub gap: Option<String>,
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
    // A `poll` that does not parse fails the read of `cursor.json`, naming the file.
    let poll = store.read_cursor()?.poll.unwrap_or_default();
    Ok(Poller::new(settings, poll))
}

/// Poll GitHub once if due and start a trace for every new relevant event; every event not
/// acted on is recorded in `intake.jsonl` with its reason.
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
        pages: result.pages,
        backlog_skipped: result.backlog.len(),
        gap: result.gap.clone(),
        ..IngestReport::default()
    };
    let poll_cursor = poller.cursor().clone();
    let store = store.clone();
    let project_id = project_id.to_owned();
    report.new_traces = tokio::task::spawn_blocking(move || {
        let mut new = Vec::new();
        let mut records: Vec<IntakeRecord> = result
            .new_skipped
            .iter()
            .map(|s| skipped_record(s, Via::Poll))
            .collect();
        if !result.backlog.is_empty() {
            let reason = "backlog: already in the feed at the first start (`rover autopilot start --backlog N` processes the N most recent)";
            for event in &result.backlog {
                records.push(
                    event_record(event, Via::Poll, IntakeOutcome::Skipped).reason(reason),
                );
            }
            records.push(
                IntakeRecord::new(Via::Poll.as_str(), IntakeOutcome::Notice, Utc::now())
                    .reason(backlog_notice(result.backlog.len())),
            );
        }
        if let Some(gap) = &result.gap {
            records.push(
                IntakeRecord::new(Via::Poll.as_str(), IntakeOutcome::Notice, Utc::now())
                    .reason(format!("gap: {gap}")),
            );
        }
        // One locked update: the new traces, the poller's ETag and seen ids, and the intake
        // records (the skipped and notices first, then each event's), so an arrival by another
        // path is logged after them; a crash before it leaves the poll to be done again.
        store.transact(|txn| {
            for record in records {
                txn.record_intake(record);
            }
            for event in &result.new_events {
                let ingested = ingest_event_in(&store, txn, &project_id, event, Via::Poll)?;
                if let Ingested::New(trace) = ingested {
                    new.push(trace);
                }
                txn.record_intake(ingested_record(event, Via::Poll, ingested));
            }
            txn.cursor_mut()?.poll = Some(poll_cursor);
            Ok(())
        })?;
        Ok::<_, StoreError>(new)
    })
    .await
    .expect("ingestion does not panic")?;
    Ok(report)
}

/// What the first start says about the backlog it skipped.
pub fn backlog_notice(skipped: usize) -> String {
    format!(
        "first start: skipped {skipped} backlog event(s) already in the feed; to process the N most recent, restart with `rover autopilot start --backlog N` (or set autopilot.github.poll.backlog before a first start); `rover autopilot events` lists them"
    )
}
