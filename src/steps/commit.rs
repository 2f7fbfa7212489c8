//! The `commit` step, deterministic path first: a failed task is recorded, not committed; a
//! worktree without changes is recorded; otherwise everything is staged and committed with the
//! `git` CLI (hooks and signing run, never `--no-verify`) with a message from the agent (commit
//! prompt) or a fallback from the task. A failing commit is an `error` span with the command,
//! exit code, stdout and stderr. Every outcome hands over to `resolve`.

use std::fmt::Write as _;
use std::sync::Arc;

use async_trait::async_trait;
use serde_json::json;
use uuid::Uuid;

use super::meta::{self, CommitMeta, TaskStatus, WorkflowMeta};
use super::tasks::{self, git_error, short, store_error, TaskRecord};
use super::Services;
use crate::agents::{self, AgentStep, CommitMessageResult, PromptVars};
use crate::git::{self, CommitOutcome, DiffSummary};
use crate::orchestrator::{blocking, Finished, NextAction, Outcome, Step, StepContext, StepError};
use crate::store::{Meta, SpanStatus, StepKind, StepRun};

/// Key of the resolve action's meta naming the workflow action.
pub const RESOLVE_WORKFLOW_KEY: &str = "workflowActionId";

pub struct CommitStep {
    services: Arc<Services>,
}

impl CommitStep {
    pub fn new(services: Arc<Services>) -> CommitStep {
        CommitStep { services }
    }

    fn resolve(workflow: Option<Uuid>, reason: &str) -> NextAction {
        let mut action = NextAction::new(StepKind::Resolve, reason);
        if let Some(id) = workflow {
            action
                .meta
                .insert(RESOLVE_WORKFLOW_KEY.into(), json!(id.to_string()));
        }
        action
    }

    /// The workflow action this commit is about: from the meta, else the producing span's action.
    async fn workflow_action(ctx: &StepContext, run: &StepRun, meta: &CommitMeta) -> Option<Uuid> {
        if let Some(id) = meta.workflow_action_id {
            return Some(id);
        }
        let span_id = run.action.span_id;
        blocking(ctx.store.clone(), move |s| s.read_span(span_id))
            .await
            .ok()
            .filter(|s| s.step == StepKind::Workflow)
            .and_then(|s| s.action_id)
    }

    /// A message from the agent, else `title` + summary. Returns the message, its source, the
    /// agent's error (when it fell back) and the agent call's usage.
    async fn message(
        &self,
        task: &TaskRecord,
        worktree: &std::path::Path,
        workflow: Option<&WorkflowMeta>,
        summary: Option<&str>,
        diff: &DiffSummary,
    ) -> (
        String,
        &'static str,
        Option<String>,
        Option<serde_json::Value>,
    ) {
        let title = workflow
            .map(|w| w.title.clone())
            .or_else(|| task.title.clone())
            .unwrap_or_else(|| format!("Rover task {}", short(task.action_id)));
        let mut fallback = title.chars().take(72).collect::<String>();
        if let Some(s) = summary.filter(|s| !s.trim().is_empty()) {
            fallback.push_str("\n\n");
            fallback.push_str(s.trim());
        }
        let mut task_text = format!("Title: {title}\n");
        if let Some(w) = workflow {
            let _ = writeln!(task_text, "Description: {}", w.description);
        }
        if let Some(s) = summary {
            let _ = writeln!(task_text, "Agent summary: {s}");
        }
        let diff_text = format!(
            "{} file(s) changed, {} insertion(s), {} deletion(s)\n{}",
            diff.files_changed,
            diff.insertions,
            diff.deletions,
            diff.files
                .iter()
                .map(|f| format!("- {f}"))
                .collect::<Vec<_>>()
                .join("\n")
        );
        let vars = PromptVars::from([
            ("task".to_owned(), task_text),
            ("diff".to_owned(), diff_text),
        ]);
        let settings = self.services.agent_settings().clone();
        let dir = worktree.to_path_buf();
        let attribution = self.services.config.attribution;
        let request = tokio::task::spawn_blocking(move || {
            agents::step_request(&settings, AgentStep::Commit, &dir, &vars, attribution)
        })
        .await;
        let request = match request {
            Ok(Ok(r)) => r,
            Ok(Err(e)) => return (fallback, "fallback", Some(e.to_string()), None),
            Err(e) => return (fallback, "fallback", Some(e.to_string()), None),
        };
        match agents::run_structured::<CommitMessageResult>(self.services.agent.as_ref(), request)
            .await
        {
            Ok(answer) => (
                answer.value.message(),
                "agent",
                None,
                Some(super::agent_call::usage_meta(&answer)),
            ),
            Err(e) => (fallback, "fallback", Some(e.to_string()), None),
        }
    }
}

#[async_trait]
impl Step for CommitStep {
    fn kind(&self) -> StepKind {
        StepKind::Commit
    }

    fn max_parallel(&self) -> usize {
        3
    }

    async fn process(&self, ctx: &StepContext, run: &StepRun) -> Result<Outcome, StepError> {
        let meta: CommitMeta = meta::read(&run.action)
            .map_err(|e| StepError::fatal(format!("the commit action's meta is invalid: {e}")))?;
        let workflow_id = Self::workflow_action(ctx, run, &meta).await;
        let hand_over = |reason: &str| Self::resolve(workflow_id, reason);

        if meta.task_status != TaskStatus::Completed {
            let what = match meta.task_status {
                TaskStatus::Failed => "failed",
                _ => "could not finish",
            };
            let summary = format!("nothing committed: the task {what}");
            return Ok(Outcome::Finished(
                Finished::completed(summary)
                    .meta("committed", false)
                    .meta("taskStatus", meta.task_status)
                    .meta("workflowActionId", workflow_id)
                    .meta("taskSummary", &meta.summary)
                    .then(hand_over(
                        "the task did not complete; the resolver decides what next",
                    )),
            ));
        }

        let Some(workflow_id) = workflow_id else {
            return Err(StepError::fatal(
                "the commit action names no workflow action, so there is no worktree to commit",
            ));
        };
        let task = tasks::load_task(&ctx.store, workflow_id)
            .await
            .map_err(|e| store_error("cannot read the task mappings", &e))?
            .ok_or_else(|| {
                StepError::fatal(format!(
                    "workflow {workflow_id} has no task mapping (cleaned up?); nothing to commit"
                ))
                .detail("workflowActionId", workflow_id)
            })?;
        let Some(worktree) = task.worktree.clone() else {
            return Err(StepError::fatal("the task mapping names no worktree"));
        };
        let workflow_meta = blocking(ctx.store.clone(), move |s| s.read_action(workflow_id))
            .await
            .ok()
            .and_then(|a| meta::read::<WorkflowMeta>(&a).ok());

        let ws = tasks::workspace(&self.services)
            .await
            .map_err(|e| git_error("cannot open the repository", &e))?;
        let diff = ws
            .uncommitted_summary(&worktree)
            .await
            .map_err(|e| git_error("cannot read the worktree's changes", &e))?;
        let base = Finished::completed("")
            .meta("workflowActionId", workflow_id)
            .meta("branchName", &task.branch)
            .meta("worktreePath", worktree.display().to_string())
            .meta("diff", &diff);
        if diff.is_empty() {
            let mut done = base
                .meta("committed", false)
                .meta("noChanges", true)
                .then(hand_over(
                    "the task changed nothing; the resolver decides what next",
                ));
            done.summary = format!("no changes to commit on {}", task.branch);
            return Ok(Outcome::Finished(done));
        }

        let (raw, source, agent_error, usage) = self
            .message(
                &task,
                &worktree,
                workflow_meta.as_ref(),
                meta.summary.as_deref(),
                &diff,
            )
            .await;
        let message = git::commit_message(&raw, self.services.config.attribution);
        let base = base
            .meta("message", &message)
            .meta("messageSource", source)
            .meta("messageAgentError", &agent_error)
            .meta("agent", &usage);
        match ws.commit_all(&worktree, &message).await {
            Ok(CommitOutcome::Committed { sha }) => {
                let mut done = base
                    .meta("committed", true)
                    .meta("sha", &sha)
                    .then(hand_over("committed; the resolver decides what next"));
                done.summary = format!(
                    "committed {} on {}: {}",
                    &sha[..sha.len().min(12)],
                    task.branch,
                    message.lines().next().unwrap_or_default()
                );
                Ok(Outcome::Finished(done))
            }
            Ok(CommitOutcome::NoChanges) => {
                let mut done =
                    base.meta("committed", false)
                        .meta("noChanges", true)
                        .then(hand_over(
                            "the task changed nothing; the resolver decides what next",
                        ));
                done.summary = format!("no changes to commit on {}", task.branch);
                Ok(Outcome::Finished(done))
            }
            Err(e) => {
                let error = git_error("the commit failed", &e).detail("branch", &task.branch);
                if error.retryable {
                    // A lock file or similar: the orchestrator runs the commit again later.
                    return Err(error);
                }
                let mut meta = Meta::new();
                meta.extend(base.meta);
                meta.insert("committed".into(), json!(false));
                meta.insert("error".into(), error.to_meta());
                Ok(Outcome::Finished(Finished {
                    status: SpanStatus::Error,
                    summary: error.message.clone(),
                    meta,
                    actions: vec![hand_over(
                        "the commit failed; the resolver diagnoses it (the error is in the commit span)",
                    )],
                }))
            }
        }
    }
}
