//! Intake: everything that brings work to rover, and the one path it takes into the store.
//!
//! Four sources: the events feed (`poll`), webhook deliveries (`webhook`; for every repository
//! of a daemon file at one endpoint, routed by repository: `webhook_routes`), sweeps of the list
//! APIs for what those two missed (`reconcile`), and local requests (`rover autopilot submit`,
//! [`Arrival::Local`]). Each hands what it took in to [`ingest`] (or [`ingest_in`], within a
//! locked update the source makes anyway, as the poller does with its cursor): the one function
//! that builds the trace's root `event` span and first action (of the step [`Entry`] names), dedups (the
//! event's id, and its content key for the same event by another path), enqueues, and records
//! what became of it in `intake.jsonl`, all in one locked update. Who may trigger work is judged
//! later, by the coordinate step (`steps::trust_check`); intake only drops rover's own events
//! and what GitHub sends that rover does not react to (`github::events`).
//!
//! A CI outcome (`ci`) starts no trace: it is a [`Signal`] handed to the [`Queue`], whose
//! scheduler (the orchestrator) asks the steps which of their scheduled runs wait on it and
//! makes those due now.
//!
//! ```text
//!  events feed ─ poll ──────┐
//!  deliveries ── webhook ───┤                      ┌─ state.json (queue) ─▶ drain ─▶ steps
//!  list APIs ─── reconcile ─┼─▶ ingest ─▶ store ───┼─ spans/ actions/ traces
//!  submit ────── local ─────┘   (dedup)            └─ cursor.json, intake.jsonl
//!  CI outcome ── webhook ─────▶ Signal ─▶ Queue (orchestrator) ─▶ Step::woken_by ─▶ due now
//! ```
//!
//! GitHub's wire formats (events, deliveries, list APIs) are parsed at the edge, in `github`;
//! the daemon only runs the sources as supervised components.

pub mod ci;
mod meta;
pub mod poll;
pub mod reconcile;
mod record;
mod root;
pub mod webhook;
pub mod webhook_routes;

use async_trait::async_trait;
use uuid::Uuid;

pub use ci::{CiOutcome, Signal};
pub use meta::{EventMeta, EventSource, Reverting, RED_MAIN_FIX, RED_MAIN_REVERT};
pub use record::{event_record, ingested_record, local_record, skipped_delivery, skipped_record};
pub use root::{github_trace, label, local_trace, red_main_trace};

use crate::github::{GitHubError, NormalizedEvent};
use crate::store::{AutopilotStore, StepKind, StoreError, TraceCreated, Txn};

/// Where a new trace starts: the project its ids derive from, and the pipeline's first step
/// (the steps declare it, `steps::kinds::FIRST_STEP`; intake names no step).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub project_id: String,
    pub first_step: StepKind,
}

impl Entry {
    pub fn new(project_id: impl Into<String>, first_step: StepKind) -> Entry {
        Entry {
            project_id: project_id.into(),
            first_step,
        }
    }
}

/// The path an event came by (recorded with its content key and in `intake.jsonl`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Via {
    Poll,
    Webhook,
    /// The list APIs, swept for what the feed missed.
    Reconcile,
    /// `rover autopilot submit`.
    Local,
}

impl Via {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Poll => "poll",
            Self::Webhook => "webhook",
            Self::Reconcile => "reconcile",
            Self::Local => "local",
        }
    }
}

/// What came in, from any source.
#[derive(Debug, Clone, Copy)]
pub enum Arrival<'a> {
    /// A GitHub event, from the feed, a webhook delivery or a reconcile sweep (`via`).
    Github {
        event: &'a NormalizedEvent,
        via: Via,
    },
    /// A local request (`rover autopilot submit`): private, answered in the trace.
    Local { request: &'a str, actor: &'a str },
    /// rover's own request to fix the base branch its merge commit `sha` left red, following
    /// trace `origin` (`lifecycle.onRedMain: "fix"`); the same one twice starts one trace.
    RedMain {
        origin: Uuid,
        sha: &'a str,
        request: &'a str,
        /// A revert of the merge rather than a fix (`lifecycle.onRedMain: "revert"`).
        reverts: Option<&'a meta::Reverting>,
    },
}

/// What ingesting one arrival did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ingested {
    /// A new trace started.
    New(Uuid),
    /// The event (same id) had already started this trace.
    Duplicate(Uuid),
    /// The same event had already come by the other path and started this trace.
    OtherPath(Uuid),
}

impl Ingested {
    /// The trace the arrival started or was folded into.
    pub fn trace(self) -> Uuid {
        match self {
            Self::New(t) | Self::Duplicate(t) | Self::OtherPath(t) => t,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum IngestError {
    #[error(transparent)]
    GitHub(#[from] GitHubError),
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Where the sources hand on what they took in: the scheduler (the orchestrator implements
/// it). Kept narrow so intake never names the orchestrator or a step.
#[async_trait]
pub trait Queue: Send + Sync {
    /// New work is in the store: look at the queue now.
    fn wake(&self);

    /// A signal that concerns scheduled runs (a CI outcome): make the runs that wait on it due
    /// now, persisted before this returns. Returns how many were made due.
    async fn signal(&self, signal: &Signal) -> Result<usize, StoreError>;
}

/// Ingest one arrival in its own locked update (see [`ingest_in`]). Blocking (store I/O).
pub fn ingest(
    store: &AutopilotStore,
    entry: &Entry,
    arrival: Arrival<'_>,
) -> Result<Ingested, StoreError> {
    store.transact(|txn| ingest_in(store, txn, entry, arrival))
}

/// The one path into the store: start the trace of an arrival (its root span and first
/// action, enqueued) unless the same event already has one, and record what became of it in
/// the intake log in the same locked update (so arrivals are listed in the order the store saw
/// them), except a reconcile sweep finding its own event again, which the first sweep recorded.
///
/// A GitHub event's ids derive from the project and the event id (the delivery id for a
/// webhook), so an event ingested twice (a crash between writing the trace and the cursor,
/// GitHub serving it again, a redelivered webhook) lands on the same trace; the same event by
/// two paths (two ids) is recognised by its content key (`NormalizedEvent::dedupe_key`).
pub fn ingest_in(
    store: &AutopilotStore,
    txn: &mut Txn<'_>,
    entry: &Entry,
    arrival: Arrival<'_>,
) -> Result<Ingested, StoreError> {
    match arrival {
        Arrival::Github { event, via } => {
            let ingested = ingest_event_in(store, txn, entry, event, via)?;
            if !matches!((via, ingested), (Via::Reconcile, Ingested::Duplicate(_))) {
                txn.record_intake(ingested_record(event, via, ingested));
            }
            Ok(ingested)
        }
        Arrival::Local { request, actor } => {
            let (root, first) = local_trace(&entry.first_step, request, actor);
            store.create_new_trace_in(txn, &root, Some(&first))?;
            txn.record_intake(local_record(root.id, actor));
            tracing::info!(trace = %root.id, via = Via::Local.as_str(), "new trace");
            Ok(Ingested::New(root.id))
        }
        Arrival::RedMain {
            origin,
            sha,
            request,
            reverts,
        } => {
            let kind = if reverts.is_some() {
                meta::RED_MAIN_REVERT
            } else {
                meta::RED_MAIN_FIX
            };
            let (root, first) = red_main_trace(entry, origin, sha, request, reverts.cloned());
            if !store.create_trace_in(txn, &root, Some(&first), &[])? {
                return Ok(Ingested::Duplicate(root.id));
            }
            let mut record = local_record(root.id, "rover");
            record.kind = Some(kind.to_owned());
            txn.record_intake(record);
            tracing::info!(trace = %root.id, follows = %origin, "new trace: a fix of the base branch rover's merge left red");
            Ok(Ingested::New(root.id))
        }
    }
}

/// A GitHub event into the store within `txn`, without its intake record.
fn ingest_event_in(
    store: &AutopilotStore,
    txn: &mut Txn<'_>,
    entry: &Entry,
    event: &NormalizedEvent,
    via: Via,
) -> Result<Ingested, StoreError> {
    let (root, first) = github_trace(entry, event);
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
