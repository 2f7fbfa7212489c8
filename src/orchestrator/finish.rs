//! Finishing a run: the finished span and the actions it produced, counted by the budget gate and
//! recorded in one hand-over (`complete_step`); for detached runs, once collected (`collect`).

use std::collections::HashSet;
use std::sync::atomic::Ordering;

use chrono::Utc;

use super::progress::Progress;
use super::step::Finished;
use super::Inner;
use crate::store::blocking;
use crate::store::{Action, StepRun};

impl Inner {
    pub(super) async fn finish(&self, run: &StepRun, finished: Finished) {
        let mut span = run.span.clone();
        let now = Utc::now();
        let summary = finished.summary.clone();
        if let Err(e) = span.finish(finished.status, finished.summary, finished.meta, now) {
            tracing::error!(error = &e as &dyn std::error::Error, "cannot finish a span");
            return;
        }
        let trace_id = run.pending.trace_id;
        let mut next = finished.actions;
        let halt = self
            .gate
            .account(run, &mut span, &mut next, || {
                self.flight()
                    .runs
                    .values()
                    .map(|r| r.trace_id)
                    .collect::<HashSet<_>>()
            })
            .await;
        self.halt(halt).await;
        let actions: Vec<Action> = next
            .into_iter()
            .map(|a| {
                let mut action = Action::new(a.kind, &span, a.reason, a.meta, now);
                if let Some(id) = a.id {
                    action.id = id;
                }
                action
            })
            .collect();
        let store = self.ctx.store.clone();
        let written = span.clone();
        if let Err(e) = blocking(store, move |s| s.complete_step(&written, &actions)).await {
            self.internal_errors.fetch_add(1, Ordering::Relaxed);
            tracing::error!(
                error = &e as &dyn std::error::Error,
                "cannot record a finished step; it will be recovered at the next start"
            );
            self.notice(format!("cannot record a finished {}: {e}", span.step));
            return;
        }
        if self.pipeline.ends_trace(&span.step) {
            let (pipeline, store) = (self.pipeline.clone(), self.ctx.store.clone());
            let _ =
                tokio::task::spawn_blocking(move || pipeline.trace_ended(&store, trace_id)).await;
        }
        let _ = self.progress.send(Progress::Finished {
            trace_id,
            step: span.step.clone(),
            span_id: span.id,
            status: span.status,
            summary,
        });
    }

    /// Close a run of a stopped trace: an error span that says so, and the budget notify.
    pub(super) async fn finish_stopped(&self, run: &StepRun, reason: &str) {
        let finished = self.gate.stopped_run(run.pending.trace_id, reason);
        self.finish(run, finished).await;
    }
}
