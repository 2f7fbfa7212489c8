//! Collecting detached runs: watching their containers (limits, stuck agents), reading an
//! exited one's logs into the artifacts, gates and diff, the span's outcome, and removing the
//! container once that outcome is recorded.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use chrono::Utc;
use uuid::Uuid;

use super::{run_limit, verdict, Collected, RunEnd, WorkflowSpanMeta, WorkflowStep, AGENT_LOG};
use crate::agents::{self, AgentStep, WorkflowResult};
use crate::orchestrator::{Completion, Finished, StepContext, StepError};
use crate::sandbox::gates::run_gates;
use crate::sandbox::{self, ContainerStatus, Sandbox};
use crate::steps::meta::{CollectedMeta, GatesMeta};
use crate::steps::meta::{OutcomeSpanMeta, TaskStatus};
use crate::steps::tasks::{self, store_error, Task};
use crate::store::blocking;
use crate::store::{AutopilotStore, ErrorMeta, PendingAction, Span, SpanStatus, StepKind};

impl WorkflowStep {
    pub(super) async fn monitor_runs(
        &self,
        ctx: &StepContext,
    ) -> Result<Vec<Completion>, StepError> {
        let Some(sandbox) = self.services.sandbox.clone() else {
            return Ok(Vec::new());
        };
        self.remove_collected(ctx, sandbox.as_ref()).await;
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
                    // Past the run limit and still no engine: end the run rather than wait forever.
                    let summary = format!(
                        "cannot check the sandbox container {container} and its time is up: {e}"
                    );
                    let span_meta = WorkflowSpanMeta {
                        error: Some(container_error(&summary, e.is_retryable(), &container)),
                        ..task_meta(&task, &container, None)
                    };
                    let finished = Finished {
                        status: SpanStatus::Error,
                        summary: summary.clone(),
                        meta: crate::store::Meta::new(),
                        actions: Vec::new(),
                    }
                    .with_meta_record(&span_meta)
                    .then(Self::commit_action(
                        task.action_id,
                        TaskStatus::Error,
                        &summary,
                    ));
                    done.push(Completion {
                        action_id: task.action_id,
                        finished,
                    });
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
            let (finished, logs_saved) = self
                .collect(
                    ctx,
                    sandbox.as_ref(),
                    &task,
                    &span,
                    Ended {
                        status,
                        timed_out,
                        stuck,
                        closed_by_hand: closed.as_deref(),
                    },
                )
                .await;
            self.stuck.forget(task.action_id);
            if logs_saved {
                let collected = Collected {
                    span_id: span.id,
                    container: container.clone(),
                };
                let mut list = self
                    .collected
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
                if !list.contains(&collected) {
                    list.push(collected);
                }
            }
            done.push(Completion {
                action_id: task.action_id,
                finished,
            });
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
                let entry = Collected {
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

    /// Collects one exited (or vanished, or overdue) container into a finished span; also says
    /// whether its logs are durably in the artifacts (so the container may go once the span is
    /// recorded).
    pub(super) async fn collect(
        &self,
        ctx: &StepContext,
        sandbox: &dyn Sandbox,
        task: &Task,
        span: &Span,
        ended: Ended<'_>,
    ) -> (Finished, bool) {
        let Ended {
            status,
            timed_out,
            stuck,
            closed_by_hand,
        } = ended;
        let container = task.mapping.container_id.clone().unwrap_or_default();
        let artifacts = ctx.store.artifacts_dir(span.id);
        let log = artifacts.join(AGENT_LOG);
        let err_log = sandbox::stderr_path(&log);
        let mut notes: Vec<String> = Vec::new();
        if let Err(e) = tokio::fs::create_dir_all(&artifacts).await {
            notes.push(format!("cannot create {}: {e}", artifacts.display()));
        }
        // The container may go once its logs are durably in the artifacts (and its span is
        // recorded final, see `remove_collected`).
        let mut logs_saved = false;
        let mut logs = None;
        if status != ContainerStatus::Gone {
            // The follower (see `stuck_for`) wrote the log as it came, its true head and tail;
            // without one that saw the container to its end, the engine's copy is read now.
            let followed = self
                .stuck
                .finish_following(task.action_id, FOLLOWER_GRACE)
                .await;
            let read = match followed {
                Some(stats) => Ok(stats),
                None => {
                    sandbox
                        .logs_to_file(&container, &log, self.log_limit())
                        .await
                }
            };
            match read {
                Ok(stats) => {
                    logs = Some(stats);
                    match sync_files(&[log.clone(), err_log.clone()]).await {
                        Ok(()) => logs_saved = true,
                        Err(e) => {
                            notes.push(format!("cannot make the container's logs durable: {e}"));
                        }
                    }
                }
                Err(e) => notes.push(format!("cannot read the container's logs: {e}")),
            }
        }
        let stderr = crate::sandbox::logcap::read_tail(&err_log, STDERR_TAIL_READ).await;
        let stderr_tail = tail(&String::from_utf8_lossy(&stderr), 2000);
        let agent_settings = self.services.agent_settings();
        let kind = agent_settings.agent;
        let mut parsed = parse_log(kind, &log).await;
        if let (Ok(response), agents::AgentKind::Codex) = (&mut parsed, kind) {
            // codex reports tokens only: priced here so the budgets see USD.
            let model = agent_settings.model_for(AgentStep::Workflow);
            agent_settings
                .codex_prices
                .fill_cost(model.as_deref(), response);
        }
        let result = parsed
            .as_ref()
            .map_err(ToString::to_string)
            .and_then(agents::extract::<WorkflowResult>);
        let over_log_limit = logs.and_then(|l| l.over_limit_summary("the sandbox", &log));
        // What the proxy saw; the run's token stops working now.
        let wire = if self.services.config.autopilot.sandbox.egress().is_none() {
            None
        } else {
            super::network::end_run(&ctx.store, &container).await
        };
        let wire_stop = wire.as_ref().and_then(|l| l.stopped);

        let (mut task_status, mut summary) = verdict(&RunEnd {
            container: &container,
            status,
            result: &result,
            stuck,
            timed_out,
            stuck_after_secs: self.services.config.autopilot.budget.stuck_after_secs,
            limit: run_limit(&self.services),
            memory_mb: self.services.config.autopilot.sandbox.memory_mb,
            stderr_tail: &stderr_tail,
            over_log_limit: over_log_limit.as_deref(),
            closed_by_hand,
        });

        if let Some(stop) = &wire_stop {
            if task_status != TaskStatus::Completed {
                task_status = TaskStatus::Failed;
                summary = format!(
                    "stopped by budget at the wire: the trace had spent {} of its stop limit {} (autopilot.budget.trace.usd) when rover's proxy refused the agent's next model request; the agent said: {summary}",
                    crate::budget::usd(stop.spend_usd),
                    crate::budget::usd(stop.stop_usd)
                );
            }
        }

        // A shipped workspace comes back (checked) before anything reads the worktree.
        let (workspace, refused) = self.take_back(ctx, sandbox, task, status).await;
        if let Some(e) = &refused {
            task_status = TaskStatus::Failed;
            summary.clone_from(&e.message);
        }

        let mut gate_warnings = None;
        let mut gates_ran = None;
        // Gates, only for work the agent calls done.
        if task_status == TaskStatus::Completed {
            if let Some(worktree) = &task.mapping.worktree_path {
                let gates = &self.services.config.autopilot.sandbox.gates;
                let mut base = self.base_spec(
                    vec!["true".into()],
                    worktree,
                    self.labels(task.mapping.trace_id, task.action_id),
                );
                // The gates run in the image the agent ran in.
                base.image = crate::steps::history::image_of(span).unwrap_or(base.image);
                match run_gates(sandbox, &base, gates, &artifacts.join("gates")).await {
                    Ok(report) => {
                        if report.failed_required() {
                            task_status = TaskStatus::Failed;
                            let failed: Vec<String> = report
                                .results()
                                .iter()
                                .filter(|r| r.required && !r.passed())
                                .map(|r| r.command.join(" "))
                                .collect();
                            summary = format!(
                                "a required gate did not pass ({}); the agent said: {summary}",
                                failed.join("; ")
                            );
                        }
                        gate_warnings = Some(
                            report
                                .warnings()
                                .iter()
                                .map(|r| {
                                    format!("optional gate `{}` did not pass", r.command.join(" "))
                                })
                                .collect(),
                        );
                        gates_ran = Some(GatesMeta::of(&report));
                    }
                    Err(e) => {
                        task_status = TaskStatus::Error;
                        summary = format!("the verification gates could not run: {e}");
                    }
                }
            }
        }

        // Every container over the worktree has exited: its git metadata must still be rover's,
        // or nothing of this task is trusted (and nothing of it is committed).
        let mut tampered = None;
        if let Some(worktree) = &task.mapping.worktree_path {
            if let Ok(ws) = tasks::workspace(&self.services).await {
                if let Err(e) = ws.verify_worktree(worktree).await {
                    if crate::steps::sandboxed::is_tampered(&e) {
                        tracing::warn!(worktree = %worktree.display(), error = %e, "a sandbox tampered with the worktree's git metadata");
                        task_status = TaskStatus::Failed;
                        summary = e.to_string();
                        tampered = Some(crate::steps::sandboxed::tampered(
                            "the sandbox tampered with the worktree",
                            &e,
                        ));
                    }
                }
            }
        }
        let scratch = ctx
            .store
            .artifacts_dir(task.mapping.workflow_span_id)
            .join("git");
        let _ = tokio::fs::remove_dir_all(&scratch).await;

        let diff = match (&task.mapping.worktree_path, &task.mapping.fork_point) {
            _ if tampered.is_some() => None,
            (Some(worktree), Some(fork)) => match tasks::workspace(&self.services).await {
                Ok(ws) => ws
                    .diff_summary(worktree, fork)
                    .await
                    .map_err(|e| notes.push(format!("no diff summary: {e}")))
                    .ok(),
                Err(e) => {
                    notes.push(format!("no diff summary: {e}"));
                    None
                }
            },
            _ => None,
        };

        let (exit_code, oom_killed) = match status {
            ContainerStatus::Exited { code, oom_killed } => (Some(code), oom_killed),
            _ => (None, false),
        };
        let was_tampered = tampered.is_some();
        let error = match tampered.or(refused) {
            Some(error) => Some(error.to_meta()),
            None => (task_status == TaskStatus::Error)
                .then(|| container_error(&summary, false, &container)),
        };
        let span_meta = WorkflowSpanMeta {
            outcome: OutcomeSpanMeta {
                tampered: was_tampered,
                ..OutcomeSpanMeta::default()
            },
            collected: Some(CollectedMeta {
                exit_code,
                oom_killed,
                timed_out,
                stuck,
                log_path: log,
                stderr_path: err_log,
                stderr_tail,
                diff,
                task_status,
                result: result.ok(),
                agent: wire_usage(
                    parsed
                        .as_ref()
                        .ok()
                        .map(crate::steps::agent_call::response_usage),
                    wire.as_ref(),
                ),
                gate_warnings,
                gates: gates_ran,
                logs,
                notes: (!notes.is_empty()).then_some(notes),
                network: wire,
                workspace,
            }),
            error,
            ..task_meta(task, &container, Some(status))
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
            closed_by_hand: closed_by_hand.is_some(),
            budget_stopped: wire_stop.is_some(),
            ..crate::store::RunSpanMeta::default()
        })
        .then(Self::commit_action(task.action_id, task_status, &summary));
        (finished, logs_saved)
    }
}

impl WorkflowStep {
    /// Removes the containers collected earlier whose span is now recorded final (their logs
    /// are in the artifacts). One whose span still runs (its finish was not recorded) stays:
    /// `monitor` collects it again.
    pub(super) async fn remove_collected(&self, ctx: &StepContext, sandbox: &dyn Sandbox) {
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
                    super::network::forget_run(&ctx.store, sandbox, &entry.container).await;
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

    /// The most bytes kept of one output stream of a run (`autopilot.sandbox.logLimitMb`).
    fn log_limit(&self) -> u64 {
        self.services.config.autopilot.sandbox.limits().log_bytes
    }
}

/// How long `collect` waits for the follower of an exited container to read what is left and
/// put its files together.
const FOLLOWER_GRACE: Duration = Duration::from_secs(30);

/// How much of the end of the agent's stderr is read for the span's `stderrTail`.
const STDERR_TAIL_READ: u64 = 8 * 1024;

/// The agent's output parsed from its log, a line at a time (never the whole file in memory).
async fn parse_log(
    kind: agents::AgentKind,
    log: &Path,
) -> Result<agents::AgentResponse, agents::ParseError> {
    let log = log.to_path_buf();
    let parsed = tokio::task::spawn_blocking(move || match std::fs::File::open(&log) {
        Ok(file) => agents::parse_output_reader(kind, std::io::BufReader::new(file), true),
        Err(_) => agents::parse_output_reader(kind, std::io::empty(), true),
    })
    .await;
    parsed.unwrap_or_else(|e| {
        Err(agents::ParseError::Invalid {
            reason: format!("the parser stopped: {e}"),
        })
    })
}

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

/// Makes written files durable (data and their directory entries).
pub(super) async fn sync_files(paths: &[PathBuf]) -> std::io::Result<()> {
    let paths = paths.to_vec();
    tokio::task::spawn_blocking(move || {
        for path in &paths {
            std::fs::File::open(path)?.sync_all()?;
        }
        let mut dirs: Vec<&Path> = paths.iter().filter_map(|p| p.parent()).collect();
        dirs.dedup();
        for dir in dirs {
            std::fs::File::open(dir)?.sync_all()?;
        }
        Ok(())
    })
    .await
    .map_err(std::io::Error::other)?
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
fn task_meta(task: &Task, container: &str, status: Option<ContainerStatus>) -> WorkflowSpanMeta {
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
fn container_error(message: &str, retryable: bool, container: &str) -> ErrorMeta {
    StepError {
        retryable,
        ..StepError::fatal(message)
    }
    .detail("container", container)
    .to_meta()
}

/// The run's figures for the budgets: the agent's own, unless rover's proxy saw it spend more
/// (an agent cut off before its report, or one that under-reports): then the proxy's.
fn wire_usage(
    reported: Option<crate::store::AgentMeta>,
    wire: Option<&crate::proxy::Ledger>,
) -> Option<crate::store::AgentMeta> {
    use crate::store::{AgentMeta, AgentUsage};
    let Some(wire) = wire.filter(|w| w.usd > 0.0 || w.requests > 0) else {
        return reported;
    };
    match reported {
        Some(AgentMeta::Used(mut usage)) => {
            if usage.cost_usd.unwrap_or(0.0) < wire.usd {
                usage.cost_usd = Some(wire.usd);
            }
            Some(AgentMeta::Used(usage))
        }
        _ => Some(AgentMeta::Used(AgentUsage {
            turns: None,
            cost_usd: Some(wire.usd),
            input_tokens: wire.usage.input,
            output_tokens: wire.usage.output,
            cached_tokens: wire.usage.cached,
            attempts: None,
            first_error: None,
        })),
    }
}
