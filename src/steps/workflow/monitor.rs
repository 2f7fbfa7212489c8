//! Watching detached runs: their containers (limits, stuck agents), the runs that ended handed
//! to the orchestrator to collect (`collect.rs`, in a run of its own under a `collect` span),
//! the logs of containers stopped for their trace, and the removal of collected containers once
//! their span is final.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use chrono::Utc;
use uuid::Uuid;

use super::collect::{sync_files, FOLLOWER_GRACE};
use super::{run_limit, CollectedContainer, WorkflowStep, AGENT_LOG};
use crate::orchestrator::{Completion, StepContext, StepError};
use crate::sandbox::{self, ContainerStatus, Sandbox};
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
        self.remove_collected(ctx, &sandbox).await;
        let state = blocking(ctx.store.clone(), AutopilotStore::read_state)
            .await
            .map_err(|e| store_error("cannot read the state", &e))?;
        let mut done = Vec::new();
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
            let mut status = match sandbox.status(&container).await {
                Ok(s) => s,
                Err(e) => {
                    tracing::warn!(container = %container, error = %e, "cannot check a workflow container");
                    let elapsed = (Utc::now() - span.timestamp).to_std().unwrap_or_default();
                    if elapsed < run_limit(&self.services) {
                        continue;
                    }
                    // Past the run limit and still no engine: the collection ends the run
                    // rather than wait forever.
                    let record = CollectSpanMeta {
                        container_id: container.clone(),
                        unreachable: Some(e.to_string()),
                        ..CollectSpanMeta::default()
                    };
                    done.push(
                        Completion::new(task.action_id, record.seen()).with_meta_record(&record),
                    );
                    continue;
                }
            };
            let mut timed_out = false;
            let mut stuck = false;
            if matches!(status, ContainerStatus::Running | ContainerStatus::Created) {
                if let Some(idle) = self.stuck_for(ctx, &sandbox, &task, &container).await {
                    tracing::warn!(container = %container, idle_secs = idle.as_secs(), "workflow agent is stuck; stopping it");
                    if let Err(e) = sandbox.kill(&container).await {
                        tracing::warn!(container = %container, error = %e, "cannot kill a stuck container");
                        continue;
                    }
                    status = sandbox
                        .wait(&container)
                        .await
                        .unwrap_or(ContainerStatus::Gone);
                    stuck = true;
                }
            }
            if matches!(status, ContainerStatus::Exited { .. }) {
                // `wait` on an exited container answers at once and looks again for a late OOM flag.
                status = sandbox.wait(&container).await.unwrap_or(status);
            }
            if matches!(status, ContainerStatus::Running | ContainerStatus::Created) {
                let limit = run_limit(&self.services);
                let elapsed = (Utc::now() - span.timestamp).to_std().unwrap_or_default();
                if elapsed < limit {
                    continue;
                }
                tracing::warn!(container = %container, ?limit, "workflow sandbox exceeded its limit; killing it");
                if let Err(e) = sandbox.kill(&container).await {
                    tracing::warn!(container = %container, error = %e, "cannot kill an overdue container");
                    continue;
                }
                status = sandbox
                    .wait(&container)
                    .await
                    .unwrap_or(ContainerStatus::Gone);
                timed_out = true;
            }
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
                match sandbox.kill(container).await {
                    Ok(()) => {
                        stopped += 1;
                        self.keep_stopped_logs(ctx, sandbox.as_ref(), &task, container)
                            .await;
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
        sandbox: &dyn Sandbox,
        task: &Task,
        container: &str,
    ) {
        let span_id = task.mapping.workflow_span_id;
        let artifacts = ctx.store.artifacts_dir(span_id);
        let log = artifacts.join(AGENT_LOG);
        let _ = tokio::fs::create_dir_all(&artifacts).await;
        let read = match self
            .stuck
            .finish_following(task.action_id, FOLLOWER_GRACE)
            .await
        {
            Some(stats) => Ok(stats),
            None => {
                sandbox
                    .logs_to_file(container, &log, self.log_limit())
                    .await
            }
        };
        let kept = match read {
            Ok(_) => sync_files(&[log.clone(), sandbox::stderr_path(&log)])
                .await
                .map_err(|e| e.to_string()),
            Err(e) => Err(e.to_string()),
        };
        match kept {
            Ok(()) => {
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
        matches!(
            sandbox.status(&container).await,
            Ok(ContainerStatus::Running
                | ContainerStatus::Exited { .. }
                | ContainerStatus::NodeLost)
        )
    }

    /// Removes the containers collected earlier whose span is now recorded final (their logs
    /// are in the artifacts). One whose span still runs (its finish was not recorded) stays:
    /// `monitor` collects it again.
    pub(super) async fn remove_collected(&self, ctx: &StepContext, sandbox: &Arc<dyn Sandbox>) {
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
            match sandbox.remove(&entry.container).await {
                Ok(_) => {
                    let store = ctx.store.clone();
                    self.agent_runs(&ctx.store, sandbox.clone())
                        .forget(&entry.container, move |trace| {
                            crate::steps::run_authority::recorded_spend(&store, trace)
                        })
                        .await;
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

    /// How long a running container has shown no activity (log output, a changed file in its
    /// worktree), when that is past `autopilot.budget.stuckAfterSecs`.
    pub(super) async fn stuck_for(
        &self,
        ctx: &StepContext,
        sandbox: &Arc<dyn Sandbox>,
        task: &Task,
        container: &str,
    ) -> Option<Duration> {
        let log = self.follow_log(ctx, sandbox, task, container);
        let after = self.services.config.autopilot.budget.stuck_after_secs;
        if after == 0 {
            return None;
        }
        // Its size on disk is the output seen so far (the tail files change past the head).
        let log_bytes = crate::sandbox::logcap::bytes_on_disk(&log).await
            + crate::sandbox::logcap::bytes_on_disk(&crate::sandbox::stderr_path(&log)).await;
        let newest = match task.mapping.worktree_path.clone() {
            Some(dir) => {
                tokio::task::spawn_blocking(move || crate::budget::newest_change(&dir, 50_000))
                    .await
                    .ok()
                    .flatten()
            }
            None => None,
        };
        let idle = self.stuck.observe(task.action_id, log_bytes, newest);
        (idle >= Duration::from_secs(after)).then_some(idle)
    }

    /// Starts the follower of a run's log unless one runs (or saw the log whole), and returns
    /// the log's path. The follower writes the log into the span's artifacts as it comes,
    /// capped, and stops a container whose output passes the limit at once; `collect` takes its
    /// file when it saw the container to its end.
    pub(super) fn follow_log(
        &self,
        ctx: &StepContext,
        sandbox: &Arc<dyn Sandbox>,
        task: &Task,
        container: &str,
    ) -> PathBuf {
        let log = ctx
            .store
            .artifacts_dir(task.mapping.workflow_span_id)
            .join(AGENT_LOG);
        let sandbox = sandbox.clone();
        let container = container.to_owned();
        let path = log.clone();
        let limit = self.log_limit();
        self.stuck.follow(task.action_id, async move {
            if let Some(dir) = path.parent() {
                tokio::fs::create_dir_all(dir).await.ok()?;
            }
            let stats = sandbox.logs_to_file(&container, &path, limit).await.ok()?;
            // A stream that broke off while the container still runs is not its whole log.
            let ended = tokio::time::timeout(Duration::from_secs(10), sandbox.wait(&container));
            matches!(
                ended.await,
                Ok(Ok(ContainerStatus::Exited { .. } | ContainerStatus::Gone))
            )
            .then_some(stats)
        });
        log
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
