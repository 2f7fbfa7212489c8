//! Collecting a detached run the monitor found ended (`Step::collect`, run by the orchestrator
//! as a run of its own under a `collect` span): the container's logs into the artifacts, the
//! parsed result, the verification gates, the tamper check and the diff, into the run's outcome
//! and the collection's own (its gates, and its error in full when it could not read the run).

use super::judge::{collected, Collection, Judged};
use super::{run_limit, verdict, RunEnd, WorkflowSpanMeta, WorkflowStep};
use crate::agent_run::AgentRuns;
use crate::agents::{self, WorkflowResult};
use crate::orchestrator::{Collected, Completion, Finished, StepContext, StepError};
use crate::sandbox::gates::GatesReport;
use crate::sandbox::{self, ContainerStatus};
use crate::steps::meta::{CollectSpanMeta, GatesMeta, TaskStatus};
use crate::steps::tasks::{self, store_error, Task};
use crate::store::{ErrorMeta, Meta, SpanStatus, StepRun};

impl WorkflowStep {
    /// `Step::collect`: the run `ended` names, collected into its outcome and the collection's.
    pub(super) async fn collect_run(
        &self,
        ctx: &StepContext,
        run: &StepRun,
        ended: &Completion,
    ) -> Result<Collected, StepError> {
        let record: CollectSpanMeta = crate::store::from_meta(&ended.meta).map_err(|e| {
            StepError::fatal(format!(
                "the monitor's record of the run is unreadable: {e}"
            ))
        })?;
        #[cfg(debug_assertions)]
        assert!(
            self.services
                .host
                .var("ROVER_TEST_PANIC")
                .is_none_or(|v| v != crate::orchestrator::COLLECT),
            "injected panic in a collection (ROVER_TEST_PANIC)"
        );
        let sandbox = self.sandbox()?;
        let task = tasks::load_task(&ctx.store, run.pending.action_id)
            .await
            .map_err(|e| store_error("cannot read the task of the run", &e))?
            .ok_or_else(|| {
                StepError::fatal("the workflow run has no task mapping; nothing to collect")
            })?;
        let container = record.container_id.clone();
        if let Some(why) = &record.unreachable {
            let summary =
                format!("cannot check the sandbox container {container} and its time is up: {why}");
            let error = container_error(&summary, true, &container);
            let span_meta = WorkflowSpanMeta {
                error: Some(error.clone()),
                ..task_meta(&task, &container, None)
            };
            let run = Finished {
                status: SpanStatus::Error,
                summary: summary.clone(),
                meta: Meta::new(),
                actions: Vec::new(),
            }
            .with_meta_record(&span_meta)
            .then(Self::commit_action(
                task.action_id,
                TaskStatus::Error,
                &summary,
            ));
            let mut collection = Finished {
                status: SpanStatus::Error,
                summary,
                meta: Meta::new(),
                actions: Vec::new(),
            };
            error.put_into(&mut collection.meta);
            return Ok(Collected { collection, run });
        }
        let ended = Ended {
            status: record.container_status.unwrap_or(ContainerStatus::Gone),
            timed_out: record.timed_out,
            stuck: record.stuck,
            closed_by_hand: record.closed_by_hand.as_deref(),
        };
        let (finished, end, logs_saved) = self
            .collect(
                ctx,
                &self.agent_runs(&ctx.store, sandbox),
                &task,
                &run.span,
                ended,
            )
            .await;
        let collected = Collected {
            collection: end.into_finished(record),
            run: finished,
        };
        self.watch.forget(task.action_id);
        if logs_saved {
            let entry = super::CollectedContainer {
                span_id: run.span.id,
                container,
            };
            let mut list = self
                .collected
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            if !list.contains(&entry) {
                list.push(entry);
            }
        }
        Ok(collected)
    }

    /// Collects one exited (or vanished, or overdue) container into the run's outcome and the
    /// collection's; also says whether its logs are durably in the artifacts (so the container
    /// may go once the run's span is recorded).
    async fn collect(
        &self,
        ctx: &StepContext,
        runs: &AgentRuns,
        task: &Task,
        span: &crate::store::Span,
        ended: Ended<'_>,
    ) -> (Finished, CollectionEnd, bool) {
        let container = task.mapping.container_id.clone().unwrap_or_default();
        let artifacts = ctx.store.artifacts_dir(span.id);
        let sandbox = runs.sandbox().as_ref();
        let mut read = self
            .read_logs(runs, task, ended.status, &container, &artifacts)
            .await;
        let stderr = crate::sandbox::logcap::read_tail(&read.err_log, STDERR_TAIL_READ).await;
        let stderr_tail = tail(&String::from_utf8_lossy(&stderr), 2000);
        let parsed = self.parse_answer(&read.log).await;
        let result = parsed
            .as_ref()
            .map_err(ToString::to_string)
            .and_then(agents::extract::<WorkflowResult>);
        let over_log_limit = read
            .stats
            .and_then(|l| l.over_limit_summary("the sandbox", &read.log));
        // What the proxy saw; the run's token stops working now.
        let wire = runs.end(&container).await;
        let wire_stop = wire.as_ref().and_then(|l| l.stopped.clone());
        let (task_status, summary) = verdict(&RunEnd {
            container: &container,
            status: ended.status,
            result: &result,
            stuck: ended.stuck,
            timed_out: ended.timed_out,
            stuck_after_secs: self.services.config.autopilot.budget.stuck_after_secs,
            limit: run_limit(&self.services),
            memory_mb: self.services.config.autopilot.sandbox.memory_mb,
            stderr_tail: &stderr_tail,
            over_log_limit: over_log_limit.as_deref(),
            closed_by_hand: ended.closed_by_hand,
        });
        let mut judged = Judged {
            task_status,
            summary,
        };
        if let Some(stop) = &wire_stop {
            judged.stopped_at_the_wire(stop);
        }
        // A shipped workspace comes back (checked) before anything reads the worktree.
        let (workspace, refused) = self.take_back(ctx, sandbox, task, ended.status).await;
        let refused = judged.workspace_refused(refused, &mut read.notes);
        let gates = self
            .gates(sandbox, task, span, &artifacts, &container, &mut judged)
            .await;
        if gates.error.is_some() {
            read.error = gates.error.clone();
        }
        let tampered = self.tamper_check(task, &mut judged).await;
        // The run's scratch git (with the git file a shipped workspace comes back against) stays
        // until the run's span is final (`release_collected`): a collection cut off before its
        // hand-over is done again, and takes the workspace back again.
        let diff = self.diff(task, tampered.is_some(), &mut read.notes).await;
        let agent = crate::steps::run_authority::wire_usage(
            parsed
                .as_ref()
                .ok()
                .map(crate::steps::agent_call::response_usage),
            wire.as_ref(),
        );
        let logs_saved = read.saved;
        let (finished, end) = collected(Collection {
            task,
            container: &container,
            ended,
            judged,
            read,
            stderr_tail,
            result: result.ok(),
            agent,
            gates,
            tampered,
            refused,
            diff,
            wire,
            budget_stopped: wire_stop.is_some(),
            workspace,
        });
        (finished, end, logs_saved)
    }
}

/// How the collection itself went, apart from the run's outcome.
pub(super) struct CollectionEnd {
    pub task_status: TaskStatus,
    pub gates: Option<GatesMeta>,
    /// It could not read the run (the container gone, its logs unreadable, the gates unable to
    /// run): the collection is an `error`.
    pub read_error: Option<StepError>,
    /// A check inside it failed (a required gate, the tamper check, the workspace's return):
    /// the collection is `failed`.
    pub check_failed: Option<ErrorMeta>,
    /// The run's summary.
    pub summary: String,
}

impl CollectionEnd {
    /// The `collect` span's end: its status, summary and meta (`record` with the task's status
    /// and the gates, and the error in full).
    fn into_finished(self, record: CollectSpanMeta) -> Finished {
        let record = CollectSpanMeta {
            task_status: Some(self.task_status),
            gates: self.gates,
            ..record
        };
        let mut finished = Finished::completed(format!(
            "collected: the run {}: {}",
            match self.task_status {
                TaskStatus::Completed => "completed",
                TaskStatus::Failed => "failed",
                TaskStatus::Error => "could not finish",
            },
            self.summary
        ));
        if let Some(error) = self.read_error {
            finished = Finished::completed(String::new()).with_error(&error);
            finished.status = SpanStatus::Error;
            finished.summary = error.message;
        } else if let Some(error) = self.check_failed {
            finished.status = SpanStatus::Failed;
            finished.summary = format!("collected, a check failed: {}", error.message);
            error.put_into(&mut finished.meta);
        }
        finished.with_meta_record(&record)
    }
}

/// The first required gate that did not pass, as an error with its command, exit code and
/// output (the gate's stdout then stderr, bounded).
pub(super) fn failed_gate(report: &GatesReport) -> Option<StepError> {
    let gate = report
        .results()
        .iter()
        .find(|r| r.required && !r.passed())?;
    let command = gate.command.join(" ");
    let (message, exit_code) = match &gate.outcome {
        sandbox::gates::GateOutcome::Failed { exit_code } => (
            format!("the required gate `{command}` failed with exit code {exit_code}"),
            Some(*exit_code),
        ),
        sandbox::gates::GateOutcome::TimedOut => {
            (format!("the required gate `{command}` timed out"), None)
        }
        sandbox::gates::GateOutcome::Passed => (
            format!("the required gate `{command}` printed past the log limit and was stopped"),
            None,
        ),
    };
    Some(
        StepError::fatal(message)
            .detail("command", &gate.command)
            .detail("exitCode", exit_code)
            .detail("stderr", &gate.output),
    )
}

impl WorkflowStep {
    /// The most bytes kept of one output stream of a run (`autopilot.sandbox.logLimitMb`).
    pub(super) fn log_limit(&self) -> u64 {
        self.services.config.autopilot.sandbox.limits().log_bytes
    }
}

/// How much of the end of the agent's stderr is read for the span's `stderrTail`.
const STDERR_TAIL_READ: u64 = 8 * 1024;

/// How a run's container ended, as the monitor saw it.
pub(super) struct Ended<'a> {
    pub status: ContainerStatus,
    /// Killed past its time limit.
    pub timed_out: bool,
    /// Stopped for showing no activity.
    pub stuck: bool,
    /// A person closed the trace (who and why), which stopped the run.
    pub closed_by_hand: Option<&'a str>,
}

pub(super) fn tail(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_owned();
    }
    let mut start = text.len() - max;
    while !text.is_char_boundary(start) {
        start += 1;
    }
    format!("[... cut by rover ...]{}", &text[start..])
}

/// The workflow span's typed keys for `task` and its container.
pub(super) fn task_meta(
    task: &Task,
    container: &str,
    status: Option<ContainerStatus>,
) -> WorkflowSpanMeta {
    WorkflowSpanMeta {
        task_id: Some(task.mapping.task_id.clone()),
        branch_name: Some(task.mapping.branch_name.clone()),
        worktree_path: task.mapping.worktree_path.clone(),
        container_id: Some(container.to_owned()),
        container_status: status,
        ..WorkflowSpanMeta::default()
    }
}

/// The error of a run that could not end normally, with its container.
pub(super) fn container_error(message: &str, retryable: bool, container: &str) -> ErrorMeta {
    StepError {
        retryable,
        ..StepError::fatal(message)
    }
    .detail("container", container)
    .to_meta()
}
