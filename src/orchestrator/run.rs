//! Running one action: claim it (`begin_step`), run its step in a task of its own (a panic is
//! caught), and hand the outcome to `finish`, to a retry with backoff, or to the detached runs.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use chrono::Utc;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;
use uuid::Uuid;

use super::progress::Progress;
use super::step::{Finished, Outcome, Step, StepError};
use super::Inner;
use crate::store::blocking;
use crate::store::{
    Meta, PendingAction, RunSpanMeta, ScheduledMeta, Span, SpanStatus, StepRun, StoreError,
};

impl Inner {
    pub(super) async fn run_action(
        self: Arc<Self>,
        step: Arc<dyn Step>,
        pending: PendingAction,
        skip: Option<String>,
        scheduled: Option<ScheduledMeta>,
    ) {
        let kind = step.kind();
        let store = self.ctx.store.clone();
        let action_id = pending.action_id;
        let begin_kind = kind.clone();
        let mut run = match blocking(store, move |s| s.begin_step(action_id, &begin_kind)).await {
            Ok(run) => run,
            Err(StoreError::NotPending(_)) => return, // taken by another process meanwhile
            Err(e) => {
                self.internal_errors.fetch_add(1, Ordering::Relaxed);
                tracing::error!(step = %kind, error = &e as &dyn std::error::Error, "cannot start a step run");
                self.notice(format!("cannot start {kind}: {e}"));
                return;
            }
        };
        let stop = match self.flight().runs.get_mut(&action_id) {
            Some(r) => {
                r.span = run.span.clone();
                r.stop.clone()
            }
            None => CancellationToken::new(),
        };
        let _ = self.progress.send(Progress::Started {
            trace_id: run.pending.trace_id,
            step: kind.clone(),
            span_id: run.span.id,
        });

        if let Some(reason) = skip {
            self.finish_stopped(&run, &reason).await;
            return;
        }
        if let Some(scheduled) = scheduled {
            self.record_scheduled(&mut run, scheduled).await;
        }
        self.gate.on_start(&mut run).await;

        if run.pending.attempts > self.settings.max_attempts {
            let error = StepError::fatal(format!(
                "gave up after {} attempts; the earlier runs of this action are in the trace",
                self.settings.max_attempts
            ));
            self.finish_with_error(&run, &error).await;
            return;
        }

        // The step runs in its own task so that a panic is caught as a `JoinError`.
        let task_step = step.clone();
        let ctx = self.ctx.clone();
        let task_run = run.clone();
        // Every log line of the run carries its trace, step, span and action ids, so that
        // `log.jsonl` joins with `rover autopilot trace`.
        let log_span = tracing::info_span!(
            "step",
            trace = %run.pending.trace_id,
            step = %kind,
            span = %run.span.id,
            action = %action_id,
            attempt = run.pending.attempts,
            // The OpenTelemetry ids of the same trace and span (docs/observability.md).
            trace_id = %crate::store::otel::trace_id_hex(run.pending.trace_id),
            span_id = %crate::store::otel::span_id_hex(run.span.id),
        );
        let mut handle = tokio::spawn(
            async move {
                tracing::info!("step started");
                // What the run reads from the world is kept for `rover autopilot replay`.
                let result = crate::store::replay_record::recording(
                    &ctx.store,
                    task_run.span.id,
                    task_step.always_recorded(),
                    task_step.process(&ctx, &task_run),
                )
                .await;
                match &result {
                    Ok(Outcome::Finished(f)) => {
                        tracing::info!(status = %f.status, summary = %f.summary, "step finished");
                    }
                    Ok(Outcome::Detached { .. }) => tracing::info!("step detached"),
                    Err(e) => {
                        tracing::warn!(error = %e.message, retryable = e.retryable, "step failed");
                    }
                }
                result
            }
            .instrument(log_span),
        );
        let joined = tokio::select! {
            joined = &mut handle => joined,
            () = stop.cancelled() => {
                // A budget stopped the trace: dropping the step's future kills its agent.
                handle.abort();
                if let Err(join) = handle.await {
                    if join.is_panic() {
                        let error = join_error(join, &format!("the {kind} step"));
                        tracing::error!(step = %kind, error = %error.message, "a stopped step panicked as it was stopped");
                    }
                }
                let reason = self.gate.stop_reason(run.pending.trace_id);
                self.finish_stopped(&run, &reason).await;
                return;
            }
        };
        let result =
            joined.unwrap_or_else(|join| Err(join_error(join, &format!("the {kind} step"))));
        match result {
            Ok(Outcome::Finished(finished)) => self.finish(&run, finished).await,
            Ok(Outcome::Detached { meta }) => {
                if step.detached_holds_slot() {
                    // Recorded before this run leaves the in-flight map: its slot stays taken.
                    self.flight().detached.insert(action_id, kind.clone());
                }
                let mut span = run.span.clone();
                span.meta.extend(meta);
                let store = self.ctx.store.clone();
                if let Err(e) = blocking(store, move |s| s.write_span(&span)).await {
                    tracing::error!(
                        error = &e as &dyn std::error::Error,
                        "cannot record detached run"
                    );
                }
            }
            Err(error) => self.handle_error(&run, error).await,
        }
    }

    /// `meta.scheduled` on the run's span, written now: a person sees why it got its agent
    /// slot while it runs, and it stays when the step finishes the span.
    async fn record_scheduled(&self, run: &mut StepRun, scheduled: ScheduledMeta) {
        let summary = format!(
            "agent slot {} of {}, score {}",
            scheduled.slots_taken, scheduled.max_runs, scheduled.score
        );
        RunSpanMeta {
            scheduled: Some(scheduled),
            ..RunSpanMeta::default()
        }
        .put_into(&mut run.span.meta);
        let span = run.span.clone();
        if let Err(e) = blocking(self.ctx.store.clone(), move |s| s.write_span(&span)).await {
            tracing::warn!(
                error = &e as &dyn std::error::Error,
                "cannot record why the run got its agent slot"
            );
        }
        tracing::info!(trace = %run.pending.trace_id, step = %run.pending.action, "{summary}");
    }

    async fn handle_error(&self, run: &StepRun, error: StepError) {
        if error.retryable && run.pending.attempts < self.settings.max_attempts {
            let exp = 2u32.saturating_pow(run.pending.attempts.saturating_sub(1));
            let delay = (self.settings.retry_backoff * exp).min(Duration::from_secs(300));
            let now = Utc::now();
            let backoff = now + chrono::Duration::from_std(delay).unwrap_or_default();
            // A time GitHub named (a rate limit's reset) wins over a shorter backoff, within
            // an hour (GitHub's limits reset hourly; a wrong clock must not park work for days).
            let not_before = match error.retry_not_before {
                Some(at) => backoff.max(at.min(now + chrono::Duration::hours(1))),
                None => backoff,
            };
            let mut span = run.span.clone();
            let mut meta = Meta::new();
            error.to_meta().put_into(&mut meta);
            RunSpanMeta {
                retry_at: Some(not_before),
                ..RunSpanMeta::default()
            }
            .put_into(&mut meta);
            let summary = format!(
                "{}; will retry (attempt {} of {})",
                error.message, run.pending.attempts, self.settings.max_attempts
            );
            if span
                .finish(SpanStatus::Error, summary.clone(), meta, Utc::now())
                .is_err()
            {
                return;
            }
            let _ = self.progress.send(Progress::Finished {
                trace_id: run.pending.trace_id,
                step: span.step.clone(),
                span_id: span.id,
                status: SpanStatus::Error,
                summary,
            });
            let store = self.ctx.store.clone();
            let action_id = run.action.id;
            if let Err(e) = blocking(store, move |s| {
                s.release_step(action_id, Some(&span), Some(not_before))
            })
            .await
            {
                tracing::error!(
                    error = &e as &dyn std::error::Error,
                    "cannot release a step run for retry"
                );
            }
            return;
        }
        self.internal_errors.fetch_add(1, Ordering::Relaxed);
        self.finish_with_error(run, &error).await;
    }

    /// The error span and the fail-forward action(s) the pipeline asks for.
    pub(super) async fn finish_with_error(&self, run: &StepRun, error: &StepError) {
        tracing::warn!(step = %run.span.step, trace = %run.pending.trace_id, error = %error.message, "step failed with an error");
        let mut finished = Finished {
            status: SpanStatus::Error,
            summary: error.message.clone(),
            meta: Meta::new(),
            actions: self
                .pipeline
                .fail_forward(&run.span.step, run.action.id, error),
        };
        error.to_meta().put_into(&mut finished.meta);
        self.finish(run, finished).await;
    }

    /// A run cut off (at shutdown, or by a panic of its task): an `error` span ("interrupted",
    /// saying why), its action left queued to run again.
    pub(super) async fn interrupt(
        &self,
        action_id: Uuid,
        span: Span,
        why: &str,
    ) -> Result<(), StoreError> {
        if span.id.is_nil() {
            return Ok(()); // cut off before its span existed: the action simply stays queued
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
        blocking(self.ctx.store.clone(), move |s| {
            s.release_step(action_id, Some(&span), None)
        })
        .await
    }
}

/// The error of a task that did not return: a panic (with its message) or a cancellation.
pub(super) fn join_error(join: tokio::task::JoinError, what: &str) -> StepError {
    if join.is_panic() {
        let text = panic_text(&*join.into_panic());
        StepError::fatal(format!("{what} panicked: {text}")).detail("panic", true)
    } else {
        StepError::retryable(format!("{what} was cancelled"))
    }
}

/// A panic's message.
pub(super) fn panic_text(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic without a message".into())
}
