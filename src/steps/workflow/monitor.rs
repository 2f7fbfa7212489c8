//! The workflow's detached runs, looked at through the agent run service: which of the
//! step's tasks have a run to look at (the service follows its log and stops it past its limits),
//! the runs that ended handed to the orchestrator to collect (`collect.rs`, in a run of its own
//! under a `collect` span), the logs of runs stopped for their trace, and the release of
//! collected runs once their span is final.

use std::time::Duration;

use chrono::Utc;
use uuid::Uuid;

use super::{run_limit, CollectedContainer, WorkflowStep, AGENT_LOG};
use crate::agent_run::{AgentRuns, DetachedRun, Look};
use crate::orchestrator::{Completion, StepContext, StepError};
use crate::steps::meta::CollectSpanMeta;
use crate::steps::tasks::{self, store_error, Task};
use crate::store::blocking;
use crate::store::{AutopilotStore, PendingAction, Span, SpanStatus, StepKind};

impl WorkflowStep {
    pub(super) async fn monitor_runs(
        &self,
        ctx: &StepContext,
    ) -> Result<Vec<Completion>, StepError> {
        let Some(sandbox) = self.services.sandbox.clone() else {
            return Ok(Vec::new());
        };
        let runs = self.agent_runs(&ctx.store, sandbox);
        self.release_collected(ctx, &runs).await;
        let state = blocking(ctx.store.clone(), AutopilotStore::read_state)
            .await
            .map_err(|e| store_error("cannot read the state", &e))?;
        let mut done = Vec::new();
        // A run's end is collected at once, not at the next fallback tick.
        let on_end = ctx.waker();
        for task in tasks::all_tasks(&state) {
            let Some(pending) = state.pending_for(task.action_id) else {
                continue;
            };
            if pending.action != StepKind::Workflow
                || pending.running_span_id != Some(task.mapping.workflow_span_id)
                || ctx.in_process(task.action_id)
            {
                continue;
            }
            let Some(container) = task.mapping.container_id.clone() else {
                continue;
            };
            let span_id = task.mapping.workflow_span_id;
            let Ok(span) = blocking(ctx.store.clone(), move |s| s.read_span(span_id)).await else {
                continue;
            };
            if span.status != SpanStatus::Running {
                continue;
            }
            let elapsed = (Utc::now() - span.timestamp).to_std().unwrap_or_default();
            let log = ctx.store.artifacts_dir(span_id).join(AGENT_LOG);
            let after = self.services.config.autopilot.budget.stuck_after_secs;
            let run = DetachedRun {
                id: task.action_id,
                container: &container,
                log: &log,
                log_bytes: self.log_limit(),
                elapsed,
                limit: run_limit(&self.services),
                stuck_after: (after > 0).then(|| Duration::from_secs(after)),
                worktree: task.mapping.worktree_path.as_deref(),
                on_end: Some(&on_end),
            };
            let (status, timed_out, stuck) = match runs.look(&self.watch, &run).await {
                Look::Running => continue,
                Look::Unreachable { error } => {
                    // The collection ends the run rather than wait forever.
                    let record = CollectSpanMeta {
                        container_id: container.clone(),
                        unreachable: Some(error),
                        ..CollectSpanMeta::default()
                    };
                    done.push(
                        Completion::new(task.action_id, record.seen()).with_meta_record(&record),
                    );
                    continue;
                }
                Look::Ended {
                    status,
                    timed_out,
                    stuck,
                } => (status, timed_out, stuck),
            };
            // A trace a person closed: its run ends as stopped by hand, not as the agent's failure.
            let closed = state
                .closed
                .get(&task.mapping.trace_id)
                .map(crate::store::ClosedTrace::describe);
            // Collected by the orchestrator in a run of its own (`Step::collect`).
            let record = CollectSpanMeta {
                container_id: container.clone(),
                container_status: Some(status),
                timed_out,
                stuck,
                closed_by_hand: closed,
                ..CollectSpanMeta::default()
            };
            done.push(Completion::new(task.action_id, record.seen()).with_meta_record(&record));
        }
        Ok(done)
    }

    pub(super) async fn stop_runs(&self, ctx: &StepContext, trace_id: Uuid) -> usize {
        let Some(sandbox) = self.services.sandbox.clone() else {
            return 0;
        };
        let runs = self.agent_runs(&ctx.store, sandbox);
        let Ok(state) = blocking(ctx.store.clone(), AutopilotStore::read_state).await else {
            return 0;
        };
        let mut stopped = 0;
        for task in tasks::all_tasks(&state) {
            let running = state
                .pending_for(task.action_id)
                .is_some_and(|p| p.running_span_id == Some(task.mapping.workflow_span_id));
            if task.mapping.trace_id != trace_id || !running {
                continue;
            }
            if let Some(container) = &task.mapping.container_id {
                match runs.stop(container).await {
                    Ok(()) => {
                        stopped += 1;
                        self.keep_stopped_logs(ctx, &runs, &task, container).await;
                    }
                    Err(e) => {
                        tracing::warn!(container = %container, error = %e, "cannot stop a workflow container for a budget");
                    }
                }
            }
        }
        stopped
    }

    /// The logs of a container stopped for its trace (a budget, a person's `cancel`) go into its
    /// span's artifacts, and the container is removed once that span is recorded final, as a
    /// collected run's is (whichever closes the span: the monitor, or the orchestrator closing
    /// the run of a stopped trace).
    async fn keep_stopped_logs(
        &self,
        ctx: &StepContext,
        runs: &AgentRuns,
        task: &Task,
        container: &str,
    ) {
        let span_id = task.mapping.workflow_span_id;
        let log = ctx.store.artifacts_dir(span_id).join(AGENT_LOG);
        let kept = runs
            .take_log(
                &self.watch,
                task.action_id,
                container,
                &log,
                self.log_limit(),
            )
            .await;
        match kept {
            Ok(_) => {
                let entry = CollectedContainer {
                    span_id,
                    container: container.to_owned(),
                };
                let mut list = self
                    .collected
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
                if !list.contains(&entry) {
                    list.push(entry);
                }
            }
            Err(e) => {
                tracing::warn!(container = %container, error = %e, "cannot keep the logs of a stopped workflow container; it stays until gc");
            }
        }
    }

    pub(super) async fn run_alive(
        &self,
        ctx: &StepContext,
        pending: &PendingAction,
        span: &Span,
    ) -> bool {
        let Some(sandbox) = self.services.sandbox.clone() else {
            return false;
        };
        let Ok(Some(task)) = tasks::load_task(&ctx.store, pending.action_id).await else {
            return false;
        };
        let Some(container) = task.mapping.container_id else {
            return false;
        };
        if task.mapping.workflow_span_id != span.id {
            return false;
        }
        // An exited container still holds the work: `monitor` collects it, never a second run;
        // so does a swarm task lost with its node (collected as lost: a failure the resolver
        // sees). A container created but never started (a kill between create and start) holds
        // nothing: the run starts over, and `start` replaces it.
        self.agent_runs(&ctx.store, sandbox)
            .holds_work(&container)
            .await
    }

    /// Removes the containers collected earlier whose span is now recorded final (their logs
    /// are in the artifacts). One whose span still runs (its finish was not recorded) stays:
    /// `monitor` collects it again.
    pub(super) async fn release_collected(&self, ctx: &StepContext, runs: &AgentRuns) {
        let entries = self
            .collected
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone();
        for entry in entries {
            let span_id = entry.span_id;
            let recorded = blocking(ctx.store.clone(), move |s| s.read_span(span_id))
                .await
                .map(|span| span.status.is_final());
            match recorded {
                Ok(true) => {}
                Ok(false) => continue,
                Err(e) => {
                    tracing::warn!(span = %span_id, error = %e, "cannot read a collected workflow span; its container stays for now");
                    continue;
                }
            }
            let store = ctx.store.clone();
            let released = runs
                .release(&entry.container, move |trace| {
                    crate::steps::run_authority::recorded_spend(&store, trace)
                })
                .await;
            match released {
                Ok(()) => {
                    remove_scratch(&ctx.store, entry.span_id).await;
                    self.collected
                        .lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner)
                        .retain(|c| *c != entry);
                }
                Err(e) => {
                    tracing::warn!(container = %entry.container, error = %e, "cannot remove a collected workflow container; trying again later");
                }
            }
        }
    }
}

/// Removes the scratch git of the run whose span is `span_id` (`artifacts/<span>/git`: the
/// container's git and the git file its workspace came back against), once its span is final.
pub(super) async fn remove_scratch(store: &crate::store::AutopilotStore, span_id: Uuid) {
    let scratch = store.artifacts_dir(span_id).join("git");
    match tokio::fs::remove_dir_all(&scratch).await {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => {
            tracing::warn!(path = %scratch.display(), error = %e, "cannot remove a collected run's scratch git");
        }
    }
}
