//! Collecting a detached run as a run of its own. Once a step's `monitor` found a detached run
//! ended, the collection runs in a task of the tracker (the drain goes on meanwhile) under a
//! `collect` span below the run's span: written `running` and listed in the trace as it starts,
//! closed with how the collection went (the step's checks and errors in full), and only then
//! the run's end handed over as any run's. An error or panic fails the `collect` span with the
//! full error and the run fails forward (a retryable error is collected again after a backoff,
//! within the attempts). A collection cut off (a shutdown, a crash: closed at the next start)
//! is closed as interrupted and the run, still claimed, is collected again: its work stays
//! until its span is final.

use std::panic::AssertUnwindSafe;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use futures_util::FutureExt;
use tokio_util::sync::CancellationToken;
use tokio_util::task::AbortOnDropHandle;
use tracing::Instrument;
use uuid::Uuid;

use super::progress::Progress;
use super::run::{join_error, panic_text};
use super::step::{Completion, Finished, Step, StepError};
use super::{DrainReport, Inner, Running};
use crate::store::blocking;
use crate::store::{
    AutopilotStore, Meta, PendingAction, RunSpanMeta, Span, SpanStatus, StepKind, StepRun,
    StoreError,
};

/// The `step` of a collection's span.
pub const COLLECT: &str = "collect";

/// The span kind of a collection: `collect` (no step consumes it: it has no action).
pub fn collect_kind() -> StepKind {
    StepKind::Other(COLLECT.to_owned())
}

/// Whether `span` records the collection of a detached run (its parent is the run's span).
pub fn is_collection(span: &Span) -> bool {
    span.action_id.is_none() && span.step.as_str() == COLLECT
}

impl Inner {
    /// Starts collecting `completion` in a task of its own, unless it is being collected already
    /// or backed off after a retryable error (then `report.next_due` says when). True if started.
    pub(super) fn start_collection(
        self: &Arc<Self>,
        step: &Arc<dyn Step>,
        completion: Completion,
        report: &mut DrainReport,
    ) -> bool {
        let action_id = completion.action_id;
        let now = Utc::now();
        let due = self.recollect().get(&action_id).copied();
        if let Some(at) = due.filter(|at| *at > now) {
            report.next_due = Some(report.next_due.map_or(at, |d| d.min(at)));
            return false;
        }
        {
            let mut flight = self.flight();
            if flight.runs.contains_key(&action_id) {
                return false;
            }
            let mut placeholder = Span::root(Uuid::nil(), now, Meta::new());
            placeholder.step = collect_kind();
            flight.runs.insert(
                action_id,
                Running {
                    step: step.kind(),
                    trace_id: Uuid::nil(),
                    span: placeholder,
                    abort: None,
                    stop: CancellationToken::new(),
                    collecting: true,
                },
            );
        }
        let inner = self.clone();
        let step = step.clone();
        let handle = self.tracker.spawn(async move {
            let collect = inner.clone().collect_run(step, completion);
            let panicked = AssertUnwindSafe(collect).catch_unwind().await.err();
            if let Some(text) = panicked.map(|p| panic_text(&*p)) {
                inner.task_panicked(action_id, &text).await;
            }
            inner.release_in_flight(action_id);
            inner.wake.notify_one();
        });
        if let Some(run) = self.flight().runs.get_mut(&action_id) {
            run.abort = Some(handle.abort_handle());
        }
        true
    }

    fn recollect(
        &self,
    ) -> std::sync::MutexGuard<'_, std::collections::HashMap<Uuid, DateTime<Utc>>> {
        self.recollect
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    async fn collect_run(self: Arc<Self>, step: Arc<dyn Step>, completion: Completion) {
        let kind = step.kind();
        let action_id = completion.action_id;
        let (seen, meta) = (completion.seen.clone(), completion.meta.clone());
        let begun = blocking(self.ctx.store.clone(), move |s| {
            begin_collection(s, action_id, seen, meta)
        })
        .await;
        let (run, span) = match begun {
            Ok(Some(begun)) => begun,
            // Handed over meanwhile (or closed by a person): nothing left to collect.
            Ok(None) => return,
            Err(e) => {
                self.internal_errors.fetch_add(1, Ordering::Relaxed);
                tracing::error!(step = %kind, action = %action_id, error = &e as &dyn std::error::Error, "cannot start collecting a detached run; a later monitor tries again");
                self.notice(format!(
                    "cannot start collecting a detached {kind} run: {e}"
                ));
                return;
            }
        };
        if let Some(r) = self.flight().runs.get_mut(&action_id) {
            r.trace_id = run.pending.trace_id;
            r.span = span.clone();
        }
        let _ = self.progress.send(Progress::Started {
            trace_id: run.pending.trace_id,
            step: span.step.clone(),
            span_id: span.id,
        });
        let attempt = RunSpanMeta::of(&span).attempt.unwrap_or(1);
        // Every log line of the collection carries its ids, as a step run's do.
        let log_span = tracing::info_span!(
            "collect",
            trace = %run.pending.trace_id,
            step = %kind,
            span = %span.id,
            run_span = %run.span.id,
            action = %action_id,
            attempt,
            trace_id = %crate::store::otel::trace_id_hex(run.pending.trace_id),
            span_id = %crate::store::otel::span_id_hex(span.id),
        );
        let (ctx, task_run, task_step) = (self.ctx.clone(), run.clone(), step.clone());
        // Its own task, so that a panic of the step's collection is caught as a `JoinError`;
        // aborted with this one (a collection cut off at shutdown stops, its span closed).
        let joined = AbortOnDropHandle::new(tokio::spawn(
            async move {
                tracing::info!("collection started");
                let result = task_step.collect(&ctx, &task_run, &completion).await;
                match &result {
                    Ok(c) => tracing::info!(status = %c.collection.status, summary = %c.collection.summary, "collection finished"),
                    Err(e) => tracing::warn!(error = %e.message, retryable = e.retryable, "collection failed"),
                }
                result
            }
            .instrument(log_span),
        ))
        .await;
        let result = joined.unwrap_or_else(|join| {
            Err(join_error(
                join,
                &format!("the collection of the {kind} run"),
            ))
        });
        match result {
            Ok(collected) => {
                // The collection's span first: a crash before the hand-over leaves the run
                // claimed and its work in place, and it is collected again.
                if self.close_collection(span, collected.collection).await {
                    self.finish(&run, collected.run).await;
                    self.recollect().remove(&action_id);
                    self.flight().detached.remove(&action_id);
                }
            }
            Err(error) => self.collection_failed(&run, span, attempt, error).await,
        }
    }

    /// A collection that returned an error or panicked: its span fails with the whole error;
    /// the run is collected again later (a retryable error, within the attempts) or fails
    /// forward with the error, naming the collection.
    async fn collection_failed(&self, run: &StepRun, span: Span, attempt: u32, error: StepError) {
        let action_id = run.pending.action_id;
        let mut meta = Meta::new();
        error.to_meta().put_into(&mut meta);
        if error.retryable && attempt < self.settings.max_attempts {
            let exp = 2u32.saturating_pow(attempt.saturating_sub(1));
            let delay = (self.settings.retry_backoff * exp).min(Duration::from_secs(300));
            let at = Utc::now() + chrono::Duration::from_std(delay).unwrap_or_default();
            RunSpanMeta {
                retry_at: Some(at),
                attempt: Some(attempt),
                ..RunSpanMeta::default()
            }
            .put_into(&mut meta);
            let summary = format!(
                "{}; the run is collected again (attempt {attempt} of {})",
                error.message, self.settings.max_attempts
            );
            self.close_collection(
                span,
                Finished {
                    status: SpanStatus::Error,
                    summary,
                    meta,
                    actions: Vec::new(),
                },
            )
            .await;
            self.recollect().insert(action_id, at);
            return;
        }
        self.internal_errors.fetch_add(1, Ordering::Relaxed);
        let collect_span = span.id;
        let closed = self
            .close_collection(
                span,
                Finished {
                    status: SpanStatus::Error,
                    summary: error.message.clone(),
                    meta,
                    actions: Vec::new(),
                },
            )
            .await;
        if !closed {
            return; // not recorded: the run stays claimed and is collected again
        }
        let error = StepError {
            message: format!(
                "collecting this run failed (collect span {}): {}",
                crate::trace::short(collect_span),
                error.message
            ),
            ..error
        };
        self.finish_with_error(run, &error).await;
        self.recollect().remove(&action_id);
        self.flight().detached.remove(&action_id);
    }

    /// Closes a collection's span as `finished` says (its actions are not the collection's).
    /// False when it could not be recorded (said in the log and the console).
    async fn close_collection(&self, span: Span, finished: Finished) -> bool {
        let mut span = span;
        let summary = finished.summary.clone();
        if let Err(e) = span.finish(finished.status, finished.summary, finished.meta, Utc::now()) {
            tracing::error!(
                error = &e as &dyn std::error::Error,
                "cannot finish a collect span"
            );
            return false;
        }
        let written = span.clone();
        if let Err(e) = blocking(self.ctx.store.clone(), move |s| record(s, &written)).await {
            self.internal_errors.fetch_add(1, Ordering::Relaxed);
            tracing::error!(
                error = &e as &dyn std::error::Error,
                "cannot record a collection; the run is collected again"
            );
            self.notice(format!("cannot record a collection: {e}"));
            return false;
        }
        let _ = self.progress.send(Progress::Finished {
            trace_id: span.trace().unwrap_or_default(),
            step: span.step.clone(),
            span_id: span.id,
            status: span.status,
            summary,
        });
        true
    }

    /// A collection cut off (at shutdown, or by a panic of its task): its span closed as
    /// `error` ("interrupted", saying why); the run stays claimed and is collected again.
    pub(super) async fn interrupt_collection(
        &self,
        span: Span,
        why: &str,
    ) -> Result<(), StoreError> {
        if span.id.is_nil() {
            return Ok(()); // cut off before its span existed
        }
        let mut span = span;
        let mut meta = Meta::new();
        RunSpanMeta {
            interrupted: true,
            ..RunSpanMeta::default()
        }
        .put_into(&mut meta);
        if span
            .finish(SpanStatus::Error, why, meta, Utc::now())
            .is_err()
        {
            return Ok(());
        }
        blocking(self.ctx.store.clone(), move |s| record(s, &span)).await
    }

    /// The orchestrator's own task of a run or a collection panicked (a bug in rover; a step's
    /// panics are caught around the step): said in the log and the console, counted, and the
    /// run closed as interrupted so that its action runs again (a collection: collected again).
    pub(super) async fn task_panicked(&self, action_id: Uuid, text: &str) {
        self.internal_errors.fetch_add(1, Ordering::Relaxed);
        tracing::error!(action = %action_id, panic = %text, "an orchestrator task panicked");
        self.notice(format!(
            "rover's task for action {} panicked ({text}); its run is closed as interrupted and runs again",
            crate::trace::short(action_id)
        ));
        let running = self
            .flight()
            .runs
            .get(&action_id)
            .map(|r| (r.span.clone(), r.collecting));
        let Some((span, collecting)) = running else {
            return;
        };
        let why = format!("interrupted: rover's task for this run panicked ({text})");
        let closed = if collecting {
            self.interrupt_collection(span, &format!("{why}; the run is collected again"))
                .await
        } else {
            self.interrupt(action_id, span, &format!("{why}; it runs again"))
                .await
        };
        if let Err(e) = closed {
            tracing::error!(
                error = &e as &dyn std::error::Error,
                "cannot close the run of a panicked task; it is recovered at the next start"
            );
        }
    }
}

/// Reads the claimed run of `action_id` and starts its collection: the `collect` span,
/// `running`, written and listed in the trace (so `trace` shows it while it runs, and the next
/// start finds it if it is cut off). `None` when the run is no longer claimed by a running span.
fn begin_collection(
    store: &AutopilotStore,
    action_id: Uuid,
    seen: String,
    meta: Meta,
) -> Result<Option<(StepRun, Span)>, StoreError> {
    let state = store.read_state()?;
    let Some(pending) = state.pending_for(action_id).cloned() else {
        return Ok(None);
    };
    let Some(span_id) = pending.running_span_id else {
        return Ok(None);
    };
    let span = store.read_span(span_id)?;
    if span.status.is_final() {
        return Ok(None); // a hand-over cut off: restart recovery completes it
    }
    let action = store.read_action(action_id)?;
    // Collections of this run before (cut off, or failed and retried): this one is the next.
    let before = store
        .load_trace(pending.trace_id)?
        .spans
        .iter()
        .filter(|s| is_collection(s) && s.parent_id == Some(span.id))
        .count();
    let mut attempt = u32::try_from(before).unwrap_or(u32::MAX).saturating_add(1);
    // A file of this attempt's id that the trace does not list is a collection a crash cut
    // off before it was listed: recovery closes it, and this one is the next attempt.
    while store.span_path(collection_id(span.id, attempt)).is_file() {
        attempt = attempt.saturating_add(1);
    }
    let now = Utc::now();
    let mut collection = Span::root(collection_id(span.id, attempt), now, meta);
    collection.step = collect_kind();
    collection.parent_id = Some(span.id);
    collection.trace_id = Some(pending.trace_id);
    collection.summary = Some(seen);
    if attempt > 1 {
        RunSpanMeta {
            attempt: Some(attempt),
            ..RunSpanMeta::default()
        }
        .put_into(&mut collection.meta);
    }
    record(store, &collection)?;
    Ok(Some((
        StepRun {
            pending,
            action,
            span,
        },
        collection,
    )))
}

/// The id of the `attempt`th collection of the run whose span is `run_span`: known from the
/// two alone, so that restart recovery finds a collection's span file even when a crash came
/// between writing it and listing it in its trace.
pub fn collection_id(run_span: Uuid, attempt: u32) -> Uuid {
    Uuid::new_v5(&run_span, format!("collect-{attempt}").as_bytes())
}

/// Writes a collection's span and lists it in its trace.
fn record(store: &AutopilotStore, span: &Span) -> Result<(), StoreError> {
    store.write_span(span)?;
    let trace_id = span.trace().expect("a collect span carries its trace id");
    store.transact(|txn| txn.add_to_trace(trace_id, &[span.id], &[], Utc::now()))
}

/// Restart recovery: the collections of `pending`'s running span that a stop cut off, closed
/// as interrupted (the run is collected again, or runs again if its work is gone). Returns
/// their ids.
pub(super) fn close_cut_collections(
    store: &AutopilotStore,
    pending: &PendingAction,
) -> Result<Vec<Uuid>, StoreError> {
    let Some(run_span) = pending.running_span_id else {
        return Ok(Vec::new());
    };
    let view = store.load_trace(pending.trace_id)?;
    let ours: Vec<Span> = view
        .spans
        .into_iter()
        .filter(|s| is_collection(s) && s.parent_id == Some(run_span))
        .collect();
    let listed: Vec<Uuid> = ours.iter().map(|s| s.id).collect();
    let mut cut: Vec<Span> = ours.into_iter().filter(|s| !s.status.is_final()).collect();
    // A crash between writing a collection's span and listing it leaves its file unlisted: the
    // collections' ids are known (`collection_id`), each attempt's looked for. A collection is
    // the attempt after those listed when it starts, and one crash cuts off at most one, so the
    // attempts listed and one more are enough.
    let attempts = listed.len().saturating_add(1);
    for attempt in 1..=u32::try_from(attempts).unwrap_or(u32::MAX) {
        let id = collection_id(run_span, attempt);
        if listed.contains(&id) {
            continue;
        }
        let span = match store.read_span(id) {
            Ok(span) if is_collection(&span) && span.parent_id == Some(run_span) => span,
            Ok(_) | Err(StoreError::SpanNotFound(_)) => continue,
            Err(e) => return Err(e),
        };
        if span.status.is_final() {
            // Closed, then cut off before it was listed: only listed now.
            let trace_id = pending.trace_id;
            store.transact(|txn| txn.add_to_trace(trace_id, &[span.id], &[], Utc::now()))?;
        } else {
            cut.push(span);
        }
    }
    let mut closed = Vec::new();
    for span in cut {
        let mut span = span;
        let mut meta = Meta::new();
        RunSpanMeta {
            interrupted: true,
            ..RunSpanMeta::default()
        }
        .put_into(&mut meta);
        span.finish(
            SpanStatus::Error,
            "interrupted: rover stopped before this collection finished; the run is collected again (or runs again if its work is gone)",
            meta,
            Utc::now(),
        )?;
        record(store, &span)?;
        closed.push(span.id);
    }
    Ok(closed)
}
