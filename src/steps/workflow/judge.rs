//! The parts of a collection ([`super::collect`]): the run's logs read, its answer parsed, and
//! what can still change its verdict (a stop at the wire, a refused workspace, the gates, the
//! tamper check), then the diff, and the two records it all comes to.

use std::path::{Path, PathBuf};

use super::collect::{container_error, failed_gate, task_meta, CollectionEnd, Ended};
use super::{WorkflowSpanMeta, WorkflowStep, AGENT_LOG};
use crate::agent_run::{AgentRuns, LogNotKept};
use crate::agents::{self, AgentStep, WorkflowResult};
use crate::orchestrator::{Finished, StepError};
use crate::sandbox::gates::run_gates;
use crate::sandbox::{self, ContainerStatus, LogStats, Sandbox};
use crate::steps::meta::{CollectedMeta, GatesMeta, OutcomeSpanMeta, TaskStatus};
use crate::steps::tasks::{self, Task};
use crate::store::{AgentMeta, SpanStatus};

/// The run's verdict as the collection goes: its status and summary.
pub(super) struct Judged {
    pub task_status: TaskStatus,
    pub summary: String,
}

impl Judged {
    /// Rover's proxy refused the agent's next model request on a budget: work not done is
    /// failed, and says so.
    pub fn stopped_at_the_wire(&mut self, stop: &crate::agent_run::WireStop) {
        if self.task_status != TaskStatus::Completed {
            self.task_status = TaskStatus::Failed;
            self.summary = format!(
                "stopped by budget at the wire: {} when rover's proxy refused the agent's next model request; the agent said: {}",
                stop.describe(),
                self.summary
            );
        }
    }

    /// The workspace that did not come back or was refused (`refused`): it fails work the agent
    /// calls done. A run that ended without its work (stopped by hand or by a budget, timed
    /// out, failed, its node lost) keeps that verdict and the refusal is a note; nothing of it
    /// reaches the worktree either way. Returns the refusal that failed the run.
    pub fn workspace_refused(
        &mut self,
        refused: Option<StepError>,
        notes: &mut Vec<String>,
    ) -> Option<StepError> {
        match refused {
            Some(e) if self.task_status != TaskStatus::Completed => {
                notes.push(format!("the workspace was not taken back: {}", e.message));
                None
            }
            Some(e) => {
                self.task_status = TaskStatus::Failed;
                self.summary.clone_from(&e.message);
                Some(e)
            }
            None => None,
        }
    }
}

/// The run's logs as the collection read them.
pub(super) struct LogsRead {
    pub log: PathBuf,
    pub err_log: PathBuf,
    pub stats: Option<LogStats>,
    /// Durably in the artifacts: the container may go once the run's span is recorded.
    pub saved: bool,
    /// What went wrong on the way, for the span.
    pub notes: Vec<String>,
    /// Why the collection itself failed, when it did (its span's error, in full).
    pub error: Option<StepError>,
}

/// What the gates said.
#[derive(Default)]
pub(super) struct GatesRun {
    pub warnings: Option<Vec<String>>,
    pub ran: Option<GatesMeta>,
    /// The first required gate that did not pass.
    pub failed: Option<StepError>,
    /// They could not run.
    pub error: Option<StepError>,
}

impl WorkflowStep {
    /// The container's logs into the artifacts, taken by the agent run service: the follower's
    /// copy, its true head and tail, or without one that saw the container to its end the
    /// engine's, read now.
    pub(super) async fn read_logs(
        &self,
        runs: &AgentRuns,
        task: &Task,
        status: ContainerStatus,
        container: &str,
        artifacts: &Path,
    ) -> LogsRead {
        let log = artifacts.join(AGENT_LOG);
        let mut read = LogsRead {
            err_log: sandbox::stderr_path(&log),
            log,
            stats: None,
            saved: false,
            notes: Vec::new(),
            error: None,
        };
        if let Err(e) = tokio::fs::create_dir_all(artifacts).await {
            read.notes
                .push(format!("cannot create {}: {e}", artifacts.display()));
        }
        if status == ContainerStatus::Gone {
            read.error = Some(
                StepError::fatal(format!(
                    "the sandbox container {container} is gone: the agent's result cannot be read (removed by hand?)"
                ))
                .detail("container", container),
            );
            return read;
        }
        match runs
            .take_log(
                &self.watch,
                task.action_id,
                container,
                &read.log,
                self.log_limit(),
            )
            .await
        {
            Ok(stats) => {
                read.stats = Some(stats);
                read.saved = true;
            }
            Err(LogNotKept::NotDurable { stats, error }) => {
                read.stats = Some(stats);
                read.notes
                    .push(format!("cannot make the container's logs durable: {error}"));
            }
            Err(e @ LogNotKept::Unread(_)) => {
                let text = e.to_string();
                read.notes.push(text.clone());
                read.error = Some(
                    StepError::fatal(format!("{text}; the agent's result is unread"))
                        .detail("container", container)
                        .detail("log", &read.log),
                );
            }
        }
        read
    }

    /// The agent's answer parsed from its log, priced when its CLI reports tokens only (codex),
    /// so the budgets see USD.
    pub(super) async fn parse_answer(
        &self,
        log: &Path,
    ) -> Result<agents::AgentResponse, agents::ParseError> {
        let settings = self.services.agent_settings();
        let kind = settings.agent;
        let mut parsed = crate::steps::run_authority::parse_log(kind, log).await;
        if let Ok(response) = &mut parsed {
            let model = settings.model_for(AgentStep::Workflow);
            kind.cli()
                .fill_cost(&settings.codex_prices, model.as_deref(), response);
        }
        parsed
    }

    /// The verification gates, only for work the agent calls done, in the image it ran in.
    pub(super) async fn gates(
        &self,
        sandbox: &dyn Sandbox,
        task: &Task,
        span: &crate::store::Span,
        artifacts: &Path,
        container: &str,
        judged: &mut Judged,
    ) -> GatesRun {
        let mut run = GatesRun::default();
        let Some(worktree) = task
            .mapping
            .worktree_path
            .as_ref()
            .filter(|_| judged.task_status == TaskStatus::Completed)
        else {
            return run;
        };
        let gates = &self.services.config.autopilot.sandbox.gates;
        let mut base = self.base_spec(
            vec!["true".into()],
            worktree,
            self.labels(task.mapping.trace_id, task.action_id),
        );
        base.image = crate::steps::history::image_of(span).unwrap_or(base.image);
        match run_gates(sandbox, &base, gates, &artifacts.join("gates")).await {
            Ok(report) => {
                if report.failed_required() {
                    run.failed = failed_gate(&report);
                    judged.task_status = TaskStatus::Failed;
                    let failed: Vec<String> = report
                        .results()
                        .iter()
                        .filter(|r| r.required && !r.passed())
                        .map(|r| r.command.join(" "))
                        .collect();
                    judged.summary = format!(
                        "a required gate did not pass ({}); the agent said: {}",
                        failed.join("; "),
                        judged.summary
                    );
                }
                run.warnings = Some(
                    report
                        .warnings()
                        .iter()
                        .map(|r| format!("optional gate `{}` did not pass", r.command.join(" ")))
                        .collect(),
                );
                run.ran = Some(GatesMeta::of(&report));
            }
            Err(e) => {
                judged.task_status = TaskStatus::Error;
                judged.summary = format!("the verification gates could not run: {e}");
                run.error = Some(
                    StepError::from_error(&e, e.is_retryable()).detail("container", container),
                );
            }
        }
        run
    }

    /// Every container over the worktree has exited: its git metadata must still be rover's,
    /// or nothing of this task is trusted (and nothing of it is committed).
    pub(super) async fn tamper_check(&self, task: &Task, judged: &mut Judged) -> Option<StepError> {
        let worktree = task.mapping.worktree_path.as_ref()?;
        let ws = tasks::workspace(&self.services).await.ok()?;
        let e = ws.verify_worktree(worktree).await.err()?;
        if !crate::steps::sandboxed::is_tampered(&e) {
            return None;
        }
        tracing::warn!(worktree = %worktree.display(), error = %e, "a sandbox tampered with the worktree's git metadata");
        judged.task_status = TaskStatus::Failed;
        judged.summary = e.to_string();
        Some(crate::steps::sandboxed::tampered(
            "the sandbox tampered with the worktree",
            &e,
        ))
    }

    /// What the task changed since its fork point (none for a tampered worktree).
    pub(super) async fn diff(
        &self,
        task: &Task,
        tampered: bool,
        notes: &mut Vec<String>,
    ) -> Option<crate::git::DiffSummary> {
        let (Some(worktree), Some(fork)) = (&task.mapping.worktree_path, &task.mapping.fork_point)
        else {
            return None;
        };
        if tampered {
            return None;
        }
        match tasks::workspace(&self.services).await {
            Ok(ws) => ws
                .diff_summary(worktree, fork)
                .await
                .map_err(|e| notes.push(format!("no diff summary: {e}")))
                .ok(),
            Err(e) => {
                notes.push(format!("no diff summary: {e}"));
                None
            }
        }
    }
}

/// Everything a collection found, for its two records.
pub(super) struct Collection<'a> {
    pub task: &'a Task,
    pub container: &'a str,
    pub ended: Ended<'a>,
    pub judged: Judged,
    pub read: LogsRead,
    pub stderr_tail: String,
    pub result: Option<WorkflowResult>,
    pub agent: Option<AgentMeta>,
    pub gates: GatesRun,
    pub tampered: Option<StepError>,
    pub refused: Option<StepError>,
    pub diff: Option<crate::git::DiffSummary>,
    pub wire: Option<crate::agent_run::WireLedger>,
    pub budget_stopped: bool,
    pub workspace: Option<sandbox::returned::Applied>,
}

/// The run's outcome (its span's end, the hand-over to commit) and the collection's.
pub(super) fn collected(c: Collection<'_>) -> (Finished, CollectionEnd) {
    let Judged {
        task_status,
        summary,
    } = c.judged;
    let (exit_code, oom_killed) = match c.ended.status {
        ContainerStatus::Exited { code, oom_killed } => (Some(code), oom_killed),
        _ => (None, false),
    };
    let was_tampered = c.tampered.is_some();
    let end = CollectionEnd {
        task_status,
        gates: c.gates.ran.clone(),
        read_error: c.read.error,
        check_failed: c.gates.failed.map(|e| e.to_meta()).or_else(|| {
            c.tampered
                .as_ref()
                .or(c.refused.as_ref())
                .map(StepError::to_meta)
        }),
        summary: summary.clone(),
    };
    let error = match c.tampered.or(c.refused) {
        Some(error) => Some(error.to_meta()),
        None => (task_status == TaskStatus::Error)
            .then(|| container_error(&summary, false, c.container)),
    };
    let notes = c.read.notes;
    let span_meta = WorkflowSpanMeta {
        outcome: OutcomeSpanMeta {
            tampered: was_tampered,
            ..OutcomeSpanMeta::default()
        },
        collected: Some(CollectedMeta {
            exit_code,
            oom_killed,
            timed_out: c.ended.timed_out,
            stuck: c.ended.stuck,
            log_path: c.read.log,
            stderr_path: c.read.err_log,
            stderr_tail: c.stderr_tail,
            diff: c.diff,
            task_status,
            result: c.result,
            agent: c.agent,
            gate_warnings: c.gates.warnings,
            gates: c.gates.ran,
            logs: c.read.stats,
            notes: (!notes.is_empty()).then_some(notes),
            network: c.wire,
            workspace: c.workspace,
        }),
        error,
        ..task_meta(c.task, c.container, Some(c.ended.status))
    };
    let finished = Finished {
        status: match task_status {
            TaskStatus::Completed => SpanStatus::Completed,
            TaskStatus::Failed => SpanStatus::Failed,
            TaskStatus::Error => SpanStatus::Error,
        },
        summary: summary.clone(),
        meta: crate::store::Meta::new(),
        actions: Vec::new(),
    }
    .with_meta_record(&span_meta)
    .with_meta_record(&crate::store::RunSpanMeta {
        closed_by_hand: c.ended.closed_by_hand.is_some(),
        budget_stopped: c.budget_stopped,
        ..crate::store::RunSpanMeta::default()
    })
    .then(WorkflowStep::commit_action(
        c.task.action_id,
        task_status,
        &summary,
    ));
    (finished, end)
}
