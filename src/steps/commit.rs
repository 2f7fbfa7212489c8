//! The `commit` step, deterministic path first: a failed task is recorded, not committed; a
//! worktree whose git metadata a container changed is refused (`tampered`); a worktree without
//! changes is recorded; otherwise everything is staged (libgit2: no filter, fsmonitor or hook
//! of the repository runs) and committed with the `git` CLI (signing and hooks apply, never
//! `--no-verify`) with a message from the agent (commit prompt, no tools) or a fallback from the
//! task. Hooks that are files the agent could change run in a sandbox container first (see
//! `git::HookPlan`). A failing commit is an `error` span with the command, exit code, stdout and
//! stderr. Every outcome hands over to `resolve`.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use async_trait::async_trait;
use uuid::Uuid;

use super::meta::{
    self, CommitMeta, CommitSpanMeta, MessageSource, ResolveMeta, TaskStatus, WorkflowMeta,
};
use super::tasks::{self, git_error, short, store_error, Task};
use super::{agent_call, sandboxed, Services};
use crate::agents::{untrusted_block, AgentStep, CommitMessageResult, PromptVars};
use crate::git::{self, CommitOutcome, DiffSummary, GitError, HookLocation, HookPlan, Workspace};
use crate::orchestrator::{Finished, NextAction, Outcome, Step, StepContext, StepError};
use crate::sandbox::hooks::HookVerdict;
use crate::store::blocking;
use crate::store::{AgentMeta, Meta, SpanStatus, StepKind, StepRun};

pub struct CommitStep {
    services: Arc<Services>,
}

impl CommitStep {
    pub fn new(services: Arc<Services>) -> CommitStep {
        CommitStep { services }
    }

    fn resolve(workflow: Option<Uuid>, reason: &str) -> NextAction {
        NextAction::new(StepKind::Resolve, reason).with_meta(&ResolveMeta {
            workflow_action_id: workflow,
            ..ResolveMeta::default()
        })
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

    /// A message from the agent, else `title` + summary (a revert's by rule). Returns the
    /// message, its source, and the agent call's usage or error (none without a call). The agent runs in rover's
    /// empty host dir with no tools: the change and recent subjects come in its prompt, marked
    /// as untrusted data.
    async fn message(
        &self,
        ctx: &StepContext,
        span_id: Uuid,
        task: &Task,
        change: &Change,
        workflow: Option<&WorkflowMeta>,
        summary: Option<&str>,
    ) -> (String, MessageSource, Option<AgentMeta>) {
        // A revert's message says what it takes back; no agent is asked.
        if let Some((sha, w)) = workflow.and_then(|w| w.revert.as_deref().map(|sha| (sha, w))) {
            return (
                format!(
                    "{}\n\nThis reverts commit {sha}.\n\n{}",
                    w.title, w.description
                ),
                MessageSource::Rule,
                None,
            );
        }
        let title = workflow
            .map(|w| w.title.clone())
            .or_else(|| task.mapping.title.clone())
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
        let diff = &change.summary;
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
            ("task".to_owned(), untrusted_block("the task", &task_text)),
            (
                "diff".to_owned(),
                untrusted_block("the worktree", &diff_text),
            ),
            (
                "patch".to_owned(),
                untrusted_block("the worktree", &change.patch),
            ),
            (
                "log".to_owned(),
                untrusted_block("the repository's history", &change.subjects.join("\n")),
            ),
        ]);
        match agent_call::ask::<CommitMessageResult>(
            &self.services,
            ctx,
            span_id,
            AgentStep::Commit,
            vars,
        )
        .await
        {
            Ok(answer) => (
                answer.value.message(),
                MessageSource::Agent,
                Some(agent_call::usage_meta(&answer)),
            ),
            Err(e) => (
                fallback,
                MessageSource::Fallback,
                Some(agent_call::failure_meta(&e)),
            ),
        }
    }

    /// Runs the commit hooks in a sandbox container: `Ok(message)` as the hooks left it, or the
    /// step error of a failing hook (in the shape of a failed git command).
    async fn sandbox_hooks(
        &self,
        ctx: &StepContext,
        run: &StepRun,
        ws: &Workspace,
        task: &Task,
        worktree: &Path,
        location: HookLocation,
        message: &str,
    ) -> Result<Result<String, StepError>, StepError> {
        let sandbox = sandboxed::sandbox(&self.services)?;
        let image = sandboxed::trace_image(ctx, &self.services, run.pending.trace_id).await;
        sandbox
            .ensure_image(&image)
            .await
            .map_err(|e| StepError::from_error(&e, e.is_retryable()).detail("image", &image))?;
        let mut base = sandboxed::bare_spec(
            &self.services,
            vec!["true".into()],
            worktree,
            sandboxed::labels(&self.services, task.mapping.trace_id, run.action.id),
        );
        base.image.clone_from(&image);
        let work_dir = ctx.store.artifacts_dir(run.span.id).join("hooks");
        let hooks = sandboxed::hook_container(
            ws,
            sandbox.as_ref(),
            base,
            location,
            &work_dir,
            &Services::sandbox_objects_dir(&ctx.store),
        )
        .await
        .map_err(|e| git_error("cannot prepare the sandbox's git for the hooks", &e))?;
        let verdict = hooks.commit(message).await;
        let _ = tokio::fs::remove_dir_all(work_dir.join("git")).await;
        let verdict = verdict
            .map_err(|e| StepError::from_error(&e, e.is_retryable()).detail("image", &image))?;
        Ok(match verdict {
            HookVerdict::Passed { message: edited } => {
                Ok(edited.filter(|m| !m.trim().is_empty()).map_or_else(
                    || message.to_owned(),
                    |m| git::commit_message(&m, self.services.config.attribution),
                ))
            }
            HookVerdict::Failed(failure) => {
                Err(git_error("the commit failed", &GitError::Command(failure)))
            }
        })
    }
}

/// What the commit message writer is shown of a task's change.
struct Change {
    summary: DiffSummary,
    patch: String,
    subjects: Vec<String>,
}

/// Longest diff text handed to the commit message writer.
const MAX_PATCH_BYTES: usize = 24 * 1024;

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
        if meta.task_status != TaskStatus::Completed {
            return Ok(Outcome::Finished(not_completed(&meta, workflow_id)));
        }
        let Some(workflow_id) = workflow_id else {
            return Err(StepError::fatal(
                "the commit action names no workflow action, so there is no worktree to commit",
            ));
        };
        let committing = self.prepare(ctx, workflow_id).await?;
        self.commit(ctx, run, &meta, &committing).await
    }
}

/// A completed task about to be committed.
struct Committing {
    workflow_id: Uuid,
    task: Task,
    worktree: PathBuf,
    workflow_meta: Option<WorkflowMeta>,
    ws: Workspace,
}

impl CommitStep {
    /// The task of `workflow_id`, its worktree and workflow meta, and the repository.
    async fn prepare(&self, ctx: &StepContext, workflow_id: Uuid) -> Result<Committing, StepError> {
        let task = tasks::load_task(&ctx.store, workflow_id)
            .await
            .map_err(|e| store_error("cannot read the task mappings", &e))?
            .ok_or_else(|| {
                StepError::fatal(format!(
                    "workflow {workflow_id} has no task mapping (cleaned up?); nothing to commit"
                ))
                .detail("workflowActionId", workflow_id)
            })?;
        let Some(worktree) = task.mapping.worktree_path.clone() else {
            return Err(StepError::fatal("the task mapping names no worktree"));
        };
        let workflow_meta = blocking(ctx.store.clone(), move |s| s.read_action(workflow_id))
            .await
            .ok()
            .and_then(|a| meta::read::<WorkflowMeta>(&a).ok());
        let ws = tasks::workspace(&self.services)
            .await
            .map_err(|e| git_error("cannot open the repository", &e))?;
        Ok(Committing {
            workflow_id,
            task,
            worktree,
            workflow_meta,
            ws,
        })
    }

    /// Stages the worktree, writes the message, runs the hooks and commits.
    async fn commit(
        &self,
        ctx: &StepContext,
        run: &StepRun,
        meta: &CommitMeta,
        c: &Committing,
    ) -> Result<Outcome, StepError> {
        // The span's meta, filled along the way and written with each outcome.
        let mut span_meta = CommitSpanMeta {
            workflow_action_id: Some(Some(c.workflow_id)),
            branch_name: Some(c.task.mapping.branch_name.clone()),
            worktree_path: Some(c.worktree.display().to_string()),
            ..CommitSpanMeta::default()
        };
        // Everything the sandbox wrote is staged by libgit2 (no filter, fsmonitor or hook runs);
        // a worktree whose git metadata changed is not committed at all.
        let staged = match c.ws.stage_all(&c.worktree).await {
            Ok(staged) => staged,
            Err(e) if sandboxed::is_tampered(&e) => {
                return Ok(failed(
                    span_meta,
                    &sandboxed::tampered("the task's worktree was tampered with", &e),
                    c.commit_failed(),
                ))
            }
            // Over a commit limit: nothing was staged; the resolver decides (the agent can
            // delete or ignore the file).
            Err(e @ (GitError::CommitLimit { .. } | GitError::RulesFile { .. })) => {
                return Ok(failed(
                    span_meta,
                    &git_error("the task's change is over a commit limit", &e),
                    c.commit_failed(),
                ))
            }
            Err(e) => return Err(git_error("cannot stage the worktree's changes", &e)),
        };
        let diff =
            c.ws.uncommitted_summary(&c.worktree)
                .await
                .map_err(|e| git_error("cannot read the worktree's changes", &e))?;
        span_meta.diff = Some(diff.clone());
        span_meta.skipped_nested_repositories = Some(staged.skipped);
        if !staged.changed {
            return Ok(c.no_changes(span_meta));
        }
        let change = c.change(diff).await;
        let (raw, source, agent) = self
            .message(
                ctx,
                run.span.id,
                &c.task,
                &change,
                c.workflow_meta.as_ref(),
                meta.summary.as_deref(),
            )
            .await;
        let mut message = git::commit_message(&raw, self.services.config.attribution);
        let plan =
            c.ws.hook_plan(&c.worktree, c.ws.hook_mode())
                .await
                .map_err(|e| git_error("cannot tell where the git hooks run", &e))?;
        span_meta.message_source = Some(source);
        span_meta.agent = agent;
        span_meta.hooks = Some(plan.clone());
        if let HookPlan::Sandbox { location, .. } = &plan {
            match self.hooks(ctx, run, c, location.clone(), message).await? {
                Ok(edited) => message = edited,
                Err((message, error)) => {
                    span_meta.message = Some(message);
                    return Ok(failed(span_meta, &error, c.commit_failed()));
                }
            }
        }
        span_meta.message = Some(message.clone());
        c.commit_staged(span_meta, &message, &plan).await
    }

    /// The commit hooks in a sandbox container, then what they changed staged again: the
    /// message as the hooks left it, or (inside) the message so far and the error the commit
    /// fails with.
    async fn hooks(
        &self,
        ctx: &StepContext,
        run: &StepRun,
        c: &Committing,
        location: HookLocation,
        message: String,
    ) -> Result<Result<String, (String, StepError)>, StepError> {
        let message = match self
            .sandbox_hooks(ctx, run, &c.ws, &c.task, &c.worktree, location, &message)
            .await?
        {
            Ok(edited) => edited,
            Err(error) => {
                let error = error.detail("branch", &c.task.mapping.branch_name);
                return Ok(Err((message, error)));
            }
        };
        // The hooks may have formatted files: stage again (the hooks' container may not have
        // touched the git metadata either).
        if let Err(e) = c.ws.stage_all(&c.worktree).await {
            let error = if sandboxed::is_tampered(&e) {
                sandboxed::tampered("a hook changed the worktree's git metadata", &e)
            } else {
                git_error("cannot stage what the hooks changed", &e)
            };
            return Ok(Err((message, error)));
        }
        Ok(Ok(message))
    }
}

impl Committing {
    /// What the commit message writer is shown of the change besides its summary: the patch
    /// and the recent subjects since the task's fork point.
    async fn change(&self, summary: DiffSummary) -> Change {
        let head = self.task.mapping.fork_point.clone();
        let patch = match &head {
            Some(fork) => self
                .ws
                .diff_patch(&self.worktree, fork, MAX_PATCH_BYTES)
                .await
                .unwrap_or_default(),
            None => String::new(),
        };
        let subjects = match &head {
            Some(fork) => self.ws.recent_subjects(fork, 10).await.unwrap_or_default(),
            None => Vec::new(),
        };
        Change {
            summary,
            patch,
            subjects,
        }
    }

    /// Commits what is staged with the `git` CLI; a failure the orchestrator can retry (a lock
    /// file or similar) is returned as the error.
    async fn commit_staged(
        &self,
        mut span_meta: CommitSpanMeta,
        message: &str,
        plan: &HookPlan,
    ) -> Result<Outcome, StepError> {
        let branch = &self.task.mapping.branch_name;
        match self
            .ws
            .commit_staged(&self.worktree, message, plan.host_dir())
            .await
        {
            Ok(CommitOutcome::Committed { sha }) => {
                let summary = format!(
                    "committed {} on {}: {}",
                    &sha[..sha.len().min(12)],
                    branch,
                    message.lines().next().unwrap_or_default()
                );
                span_meta.committed = true;
                span_meta.sha = Some(sha);
                let done = Finished::completed(summary)
                    .with_meta_record(&span_meta)
                    .then(self.hand_over("committed; the resolver decides what next"));
                Ok(Outcome::Finished(done))
            }
            Ok(CommitOutcome::NoChanges) => Ok(self.no_changes(span_meta)),
            Err(e) => {
                let error = git_error("the commit failed", &e).detail("branch", branch);
                if error.retryable {
                    // A lock file or similar: the orchestrator runs the commit again later.
                    return Err(error);
                }
                Ok(failed(span_meta, &error, self.commit_failed()))
            }
        }
    }

    fn hand_over(&self, reason: &str) -> NextAction {
        CommitStep::resolve(Some(self.workflow_id), reason)
    }

    fn commit_failed(&self) -> NextAction {
        self.hand_over(
            "the commit failed; the resolver diagnoses it (the error is in the commit span)",
        )
    }

    /// Nothing to commit: the span says so and the resolver decides.
    fn no_changes(&self, mut span_meta: CommitSpanMeta) -> Outcome {
        span_meta.no_changes = true;
        Outcome::Finished(
            Finished::completed(format!(
                "no changes to commit on {}",
                self.task.mapping.branch_name
            ))
            .with_meta_record(&span_meta)
            .then(self.hand_over("the task changed nothing; the resolver decides what next")),
        )
    }
}

/// A task that failed or could not finish: nothing is committed, the resolver decides.
fn not_completed(meta: &CommitMeta, workflow_id: Option<Uuid>) -> Finished {
    let what = match meta.task_status {
        TaskStatus::Failed => "failed",
        _ => "could not finish",
    };
    let summary = format!("nothing committed: the task {what}");
    let span_meta = CommitSpanMeta {
        committed: false,
        task_status: Some(meta.task_status),
        workflow_action_id: Some(workflow_id),
        task_summary: Some(meta.summary.clone()),
        ..CommitSpanMeta::default()
    };
    Finished::completed(summary)
        .with_meta_record(&span_meta)
        .then(CommitStep::resolve(
            workflow_id,
            "the task did not complete; the resolver decides what next",
        ))
}

/// The commit failed: an `error` span with the error in `meta.error`, handed over.
fn failed(mut span_meta: CommitSpanMeta, error: &StepError, hand_over: NextAction) -> Outcome {
    span_meta.committed = false;
    span_meta.outcome.tampered = error.tampered;
    let mut finished = Finished {
        status: SpanStatus::Error,
        summary: error.message.clone(),
        meta: Meta::new(),
        actions: vec![hand_over],
    }
    .with_meta_record(&span_meta);
    error.to_meta().put_into(&mut finished.meta);
    Outcome::Finished(finished)
}
