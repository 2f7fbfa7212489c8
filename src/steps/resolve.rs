//! The `resolve` step: looks at a whole trace after its commits and decides how it goes on.
//!
//! Quick exits come first and need no AI: a workflow or commit of the trace still queued or
//! running keeps the action queued (`ready` → `Wait`); a resolve that finds another resolve of
//! the trace already decided after the last commit finishes as superseded (several commits of
//! one trace each produce a resolve, only one decides); retries exhausted → `fail`. Otherwise
//! the agent (no tools, in rover's empty host dir) reads the trace with its error output (a red
//! CI of the pushed pull request among them) and the failed task's change, and answers `push | notify | iterate | retry | fail`. A `retry` may ask
//! for corrective commands: rover runs them in a sandbox container over the task's worktree,
//! never on the host. A worktree a sandbox tampered with ends the trace without an agent, and so
//! does a push refused because what it would send holds secrets (a secret in a commit stays in
//! the branch's history: no commit on top removes it).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use async_trait::async_trait;
use serde_json::Value;
use uuid::Uuid;

use super::agent_call::{self, TRACE_SOURCE};
use super::meta::{
    self, CommitMeta, CommitSpanMeta, ConflictSpanMeta, CorrectiveRuns, DecisionSpanMeta,
    NotifyMeta, NotifyPurpose, OutcomeSpanMeta, PushConflict, PushMeta, ResolveQuickExit,
    ResolveSpanMeta, ResolveWaitMeta, SecretsFound, SecretsSpanMeta, WorkflowMeta, WorkflowType,
};
use super::tasks::mapping_worktree;
use super::Services;
use crate::agents::{
    truncate_marked, untrusted_block, AgentStep, PromptVars, ResolveDecision, ResolveResult,
    RetryStep,
};
use crate::orchestrator::{Finished, NextAction, Outcome, Readiness, Step, StepContext, StepError};
use crate::store::blocking;
use crate::store::{
    Action, ErrorMeta, PendingAction, Span, SpanStatus, StepKind, StepRun, TaskMapping, TraceView,
};

/// Longest error detail of one span quoted in the prompt.
const MAX_ERROR_CHARS: usize = 16 * 1024;
/// Longest trace listing in the prompt.
const MAX_TRACE_CHARS: usize = 48 * 1024;
/// Longest diff of the failed task in the prompt.
const MAX_CHANGES_BYTES: usize = 24 * 1024;

/// The resolver step.
pub struct ResolveStep {
    services: Arc<Services>,
}

impl ResolveStep {
    pub fn new(services: Arc<Services>) -> ResolveStep {
        ResolveStep { services }
    }

    /// Runs the resolver's corrective commands in a sandbox over `worktree`; what ran (or why
    /// nothing could), for the span and the next resolver.
    async fn corrective(
        &self,
        ctx: &StepContext,
        run: &StepRun,
        worktree: Option<&Path>,
        result: &ResolveResult,
    ) -> Result<CorrectiveRuns, StepError> {
        let commands: Vec<String> = result
            .corrective_commands
            .iter()
            .map(|c| c.command.clone())
            .collect();
        let not_run = |why: String| CorrectiveRuns::not_run(why, commands.clone());
        let Some(worktree) = worktree else {
            return Ok(not_run(
                "the trace has no task worktree to run them in".into(),
            ));
        };
        let sandbox = match super::sandboxed::sandbox(&self.services) {
            Ok(sandbox) => sandbox,
            Err(e) => return Ok(not_run(e.message)),
        };
        let image = super::sandboxed::trace_image(ctx, &self.services, run.pending.trace_id).await;
        if let Err(e) = sandbox.ensure_image(&image).await {
            return Ok(not_run(e.to_string()));
        }
        let ws = super::tasks::workspace(&self.services)
            .await
            .map_err(|e| super::tasks::git_error("cannot open the repository", &e))?;
        let mut base = super::sandboxed::bare_spec(
            &self.services,
            vec!["true".into()],
            worktree,
            super::sandboxed::labels(&self.services, run.pending.trace_id, run.action.id),
        );
        base.image.clone_from(&image);
        let work_dir = ctx.store.artifacts_dir(run.span.id).join("corrective");
        let runs = super::sandboxed::run_corrective(
            &self.services,
            &ws,
            sandbox.as_ref(),
            base,
            &commands,
            &work_dir,
            &Services::sandbox_objects_dir(&ctx.store),
        )
        .await?;
        Ok(CorrectiveRuns::ran(runs))
    }
}

/// What the resolver sees of a trace: the view plus the task mappings of its workflows.
struct TraceState {
    view: TraceView,
    mappings: BTreeMap<String, TaskMapping>,
}

async fn load_state(ctx: &StepContext, trace_id: Uuid) -> Result<TraceState, StepError> {
    let (view, all) = blocking(ctx.store.clone(), move |s| {
        Ok((s.load_trace(trace_id)?, s.read_state()?.task_mappings))
    })
    .await
    .map_err(|e| StepError::from_error(&e, true))?;
    crate::store::replay_record::note_mappings(&all);
    let mappings = all
        .into_iter()
        .filter(|(_, m)| m.trace_id == trace_id)
        .collect();
    Ok(TraceState { view, mappings })
}

/// Whether a queued or running action of `kind` belongs to the trace (other than `except`).
fn busy(
    view: &TraceView,
    kinds: &[StepKind],
    except: Uuid,
    ignore: impl Fn(&PendingAction) -> bool,
) -> Option<String> {
    let queued = view
        .pending
        .iter()
        .find(|p| p.action_id != except && kinds.contains(&p.action) && !ignore(p));
    if let Some(p) = queued {
        let state = if p.running_span_id.is_some() {
            "running"
        } else {
            "queued"
        };
        return Some(format!(
            "waiting for the {} action {} ({state})",
            p.action, p.action_id
        ));
    }
    view.spans
        .iter()
        .find(|s| s.status == SpanStatus::Running && kinds.contains(&s.step))
        .map(|s| format!("waiting for the running {} span {}", s.step, s.id))
}

/// Whether queued workflow `action_id` waits on a failed dependency the resolver may iterate.
fn waits_for_the_resolver(state: &TraceState, action_id: Uuid) -> bool {
    let Some(meta) = state
        .view
        .actions
        .iter()
        .find(|a| a.id == action_id)
        .and_then(|a| meta::read::<WorkflowMeta>(a).ok())
    else {
        return false;
    };
    let mut queue = crate::store::State::new(chrono::Utc::now());
    queue.task_mappings.clone_from(&state.mappings);
    meta.depends_on.iter().any(|dep| {
        matches!(
            super::history::dependency_state(&state.view, &queue, *dep),
            super::history::Dependency::Blocked(_)
        )
    })
}

fn action_of<'v>(view: &'v TraceView, span: &Span) -> Option<&'v Action> {
    let id = span.action_id?;
    view.actions.iter().find(|a| a.id == id)
}

fn decision_of(span: &Span) -> Option<String> {
    DecisionSpanMeta::of(span).decision
}

/// A resolve of the trace (not `current`) that decided after the last commit finished, after
/// the last red CI of a pushed pull request, or after a consolidation conflict (each calls for
/// a new decision).
fn superseding(view: &TraceView, current: Uuid) -> Option<Uuid> {
    let last_commit = view
        .spans
        .iter()
        .filter(|s| {
            (s.step == StepKind::Commit && s.status.is_final())
                || DecisionSpanMeta::is_red_ci(s)
                // A consolidation conflict also calls for a new decision.
                || (s.step == StepKind::Push && ConflictSpanMeta::of(s).is_some())
                // So does a push refused for secrets.
                || (s.step == StepKind::Push && SecretsSpanMeta::of(s).is_some())
        })
        .filter_map(|s| s.completed)
        .max()?;
    view.spans
        .iter()
        .filter(|s| s.step == StepKind::Resolve && s.id != current && s.status.is_final())
        // A `wait` asked for another look: it decided nothing this one would repeat.
        .filter(|s| {
            let decided = DecisionSpanMeta::of(s);
            decided.decision.is_some_and(|d| d != "wait") && decided.superseded_by.is_none()
        })
        .find(|s| s.timestamp >= last_commit)
        .map(|s| s.id)
}

/// Whether the trace committed work after its last push (or has no push yet): work a limit on
/// iterations must not throw away.
fn unpushed_commit(view: &TraceView) -> bool {
    let last_push = view
        .spans
        .iter()
        .filter(|s| s.step == StepKind::Push && s.status == SpanStatus::Completed)
        .map(|s| s.timestamp)
        .max();
    view.spans
        .iter()
        .filter(|s| s.step == StepKind::Commit && s.status == SpanStatus::Completed)
        .filter(|s| CommitSpanMeta::read(&s.meta).is_ok_and(|m| m.committed))
        .any(|s| last_push.is_none_or(|pushed| s.timestamp > pushed))
}

/// How many `iterate` and `retry` decisions the trace's resolves made so far.
pub fn retries_so_far(view: &TraceView) -> u32 {
    let n = view
        .spans
        .iter()
        .filter(|s| s.step == StepKind::Resolve)
        .filter(|s| matches!(decision_of(s).as_deref(), Some("iterate" | "retry")))
        .count();
    u32::try_from(n).unwrap_or(u32::MAX)
}

/// The latest span of `kind` that did not complete.
fn last_unsuccessful(view: &TraceView, kind: &StepKind) -> Option<Span> {
    view.spans
        .iter()
        .rev()
        .find(|s| &s.step == kind && matches!(s.status, SpanStatus::Failed | SpanStatus::Error))
        .cloned()
}

/// The latest span that did not complete among workflow, commit and push.
fn last_failure(view: &TraceView) -> Option<Span> {
    view.spans
        .iter()
        .rev()
        .find(|s| {
            matches!(
                s.step,
                StepKind::Workflow | StepKind::Commit | StepKind::Push
            ) && matches!(s.status, SpanStatus::Failed | SpanStatus::Error)
        })
        .cloned()
}

/// The workflow action a commit span worked for.
fn workflow_of_commit(view: &TraceView, commit: &Span) -> Option<Uuid> {
    action_of(view, commit)
        .and_then(|a| meta::read::<CommitMeta>(a).ok())
        .and_then(|m| m.workflow_action_id)
}

/// The branches of the trace's completed commits, in order, each once.
pub fn committed_branches(
    view: &TraceView,
    mappings: &BTreeMap<String, TaskMapping>,
) -> Vec<String> {
    // In the plan's order of the workflow actions (not the order the commits finished), so the
    // target branch and the PR title do not depend on which parallel task was faster.
    let mut workflows: Vec<Uuid> = view
        .spans
        .iter()
        .filter(|s| s.step == StepKind::Commit && s.status == SpanStatus::Completed)
        .filter_map(|span| workflow_of_commit(view, span))
        .collect();
    let position = |id: &Uuid| {
        view.actions
            .iter()
            .position(|a| a.id == *id)
            .unwrap_or(usize::MAX)
    };
    workflows.sort_by_key(position);
    let mut branches: Vec<String> = Vec::new();
    for workflow in workflows {
        let branch = mappings
            .get(&workflow.to_string())
            .map(|m| m.branch_name.clone())
            .or_else(|| {
                view.actions
                    .iter()
                    .find(|a| a.id == workflow)
                    .and_then(|a| meta::read::<WorkflowMeta>(a).ok())
                    .and_then(|m| m.branch)
            });
        if let Some(branch) = branch {
            if !branches.contains(&branch) {
                branches.push(branch);
            }
        }
    }
    branches
}

/// The workflow action to iterate on or retry: the one behind the latest unsuccessful workflow
/// or commit, else the latest workflow.
fn failed_workflow(view: &TraceView) -> Option<(Uuid, WorkflowMeta)> {
    let from_span = |span: &Span| -> Option<Uuid> {
        match span.step {
            StepKind::Workflow => span.action_id,
            StepKind::Commit => workflow_of_commit(view, span),
            _ => None,
        }
    };
    // A task that never started because its dependency failed is not the one to iterate: the
    // dependency is (it has the worktree and the failure).
    let never_started = |span: &Span| OutcomeSpanMeta::of(span).dependency_failed.is_some();
    let candidate = view
        .spans
        .iter()
        .rev()
        .filter(|s| matches!(s.status, SpanStatus::Failed | SpanStatus::Error))
        .filter(|s| !never_started(s))
        .find_map(from_span)
        .or_else(|| {
            view.spans
                .iter()
                .rev()
                .find(|s| s.step == StepKind::Workflow)
                .and_then(|s| s.action_id)
        })?;
    let action = view.actions.iter().find(|a| a.id == candidate)?;
    let meta = meta::read::<WorkflowMeta>(action).ok()?;
    Some((candidate, meta))
}

/// The failed task's worktree (else the trace's latest), with the task's fork point: where
/// corrective commands run and whose change the prompt shows.
fn task_worktree(
    view: &TraceView,
    mappings: &BTreeMap<String, TaskMapping>,
) -> Option<(PathBuf, Option<String>)> {
    let mapping = failed_workflow(view)
        .and_then(|(id, _)| mappings.get(&id.to_string()))
        .filter(|m| mapping_worktree(m).is_some())
        .or_else(|| {
            mappings
                .values()
                .rev()
                .find(|m| mapping_worktree(m).is_some())
        })?;
    Some((mapping_worktree(mapping)?, mapping.fork_point.clone()))
}

/// A span that recorded a worktree tampered with by its sandbox.
fn tampered_span(view: &TraceView) -> Option<&Span> {
    view.spans.iter().find(|s| OutcomeSpanMeta::is_tampered(s))
}

/// The trace's latest push, when it was refused for the secrets it would have sent: the span,
/// its branch and what it found. A later push that went through clears it (a person rewrote
/// the branch's history and retried).
fn refused_for_secrets(view: &TraceView) -> Option<(&Span, String, SecretsFound)> {
    let push = view
        .spans
        .iter()
        .rev()
        .find(|s| s.step == StepKind::Push && s.status.is_final())?;
    let (branch, found) = SecretsSpanMeta::of(push)?;
    Some((push, branch, found))
}

/// The trace as the prompt lists it: one line per span with its summary and key meta, as one
/// untrusted block (summaries, reasons and titles quote agents, events and commands).
fn render_trace(view: &TraceView) -> String {
    let mut out = String::new();
    for span in &view.spans {
        let summary = span.summary.as_deref().unwrap_or("(no summary)");
        let _ = write!(out, "- {} [{}] {}", span.step, span.status, summary.trim());
        if let Some(decision) = decision_of(span) {
            let _ = write!(out, " (decision: {decision})");
        }
        if let Some(action) = action_of(view, span) {
            let _ = write!(out, "\n  reason: {}", action.reason.trim());
            if span.step == StepKind::Workflow {
                if let Ok(m) = meta::read::<WorkflowMeta>(action) {
                    let _ = write!(out, "\n  task: {}", m.title);
                }
            }
        }
        out.push('\n');
    }
    for pending in &view.pending {
        let _ = writeln!(out, "- {} [queued] {}", pending.action, pending.summary);
    }
    untrusted_block(TRACE_SOURCE, &truncate_marked(&out, MAX_TRACE_CHARS))
}

/// The error details of every span that did not complete (command, exit code, stderr...).
fn render_errors(view: &TraceView) -> String {
    let mut out = String::new();
    for span in view
        .spans
        .iter()
        .filter(|s| matches!(s.status, SpanStatus::Failed | SpanStatus::Error))
    {
        let _ = writeln!(out, "### {} [{}] span {}", span.step, span.status, span.id);
        let detail = ErrorMeta::of_any(span)
            .and_then(|error| serde_json::to_value(error).ok())
            .unwrap_or_else(|| Value::Object(span.meta.clone()));
        let text = serde_json::to_string_pretty(&detail).unwrap_or_default();
        // Messages and output of commands, hooks, gates and agents: data.
        out.push_str(&untrusted_block(
            &format!("the {} step's error", span.step),
            &truncate_marked(&text, MAX_ERROR_CHARS),
        ));
        out.push_str("\n\n");
    }
    if out.is_empty() {
        "No step failed.".to_owned()
    } else {
        out
    }
}

fn has_review_workflow(view: &TraceView) -> bool {
    view.actions
        .iter()
        .filter(|a| a.action == StepKind::Workflow)
        .filter_map(|a| meta::read::<WorkflowMeta>(a).ok())
        .any(|m| m.workflow_type != WorkflowType::Swe)
}

/// The finished span and actions for an agent's decision, and the decision taken (`fail` when
/// the agent's decision could not be carried out).
struct Decided {
    finished: Finished,
    decision: ResolveDecision,
    /// What the decision wrote so far of the span's meta (`process` adds the answer's part).
    span_meta: ResolveSpanMeta,
}

impl Decided {
    fn new(finished: Finished, decision: ResolveDecision) -> Decided {
        Decided {
            finished,
            decision,
            span_meta: ResolveSpanMeta::default(),
        }
    }
}

/// A decision as the span's `decision` records it (its name as serialized).
fn decision_name(decision: ResolveDecision) -> &'static str {
    match decision {
        ResolveDecision::Wait => "wait",
        ResolveDecision::Push => "push",
        ResolveDecision::Notify => "notify",
        ResolveDecision::Iterate => "iterate",
        ResolveDecision::Retry => "retry",
        ResolveDecision::Fail => "fail",
    }
}

/// The span meta's `decision` part for `decision`.
fn decision_meta(decision: ResolveDecision) -> DecisionSpanMeta {
    DecisionSpanMeta {
        decision: Some(decision_name(decision).to_owned()),
        ..DecisionSpanMeta::default()
    }
}

fn fail_finished(view: &TraceView, summary: String, why: &str) -> Finished {
    let failed_step = last_failure(view).map_or(StepKind::Resolve, |s| s.step);
    let mut notify = NotifyMeta::failure(&failed_step, why);
    notify.message = Some(why.to_owned());
    Finished::completed(summary).then(
        NextAction::new(StepKind::Notify, format!("the trace failed: {why}")).with_meta(&notify),
    )
}

/// The resolver answered `wait` (it runs only when no workflow or commit of the trace is busy,
/// so it waits on something outside rover, e.g. CI): a decision like the others, and a resolve
/// of the trace scheduled `secs` later; after `max` waits the trace fails, saying so. Returns the
/// finished span and its meta.
fn scheduled_wait(
    view: &TraceView,
    result: &ResolveResult,
    secs: u64,
    max: u32,
) -> (Finished, ResolveSpanMeta) {
    let reasoning = result.reasoning.trim();
    let waits = view
        .spans
        .iter()
        .filter(|s| s.step == StepKind::Resolve && decision_of(s).as_deref() == Some("wait"))
        .count();
    let round = u32::try_from(waits).unwrap_or(u32::MAX).saturating_add(1);
    if round > max {
        let why = format!(
            "the resolver kept answering wait ({waits} waits, the limit is {max}): {reasoning}"
        );
        let span_meta = ResolveSpanMeta {
            decision: decision_meta(ResolveDecision::Fail),
            reasoning: Some(reasoning.to_owned()),
            quick_exit: Some(ResolveQuickExit::MaxWaits),
            ..ResolveSpanMeta::default()
        };
        return (fail_finished(view, format!("fail: {why}"), &why), span_meta);
    }
    let at = chrono::Utc::now()
        + chrono::Duration::seconds(i64::try_from(secs).unwrap_or(i64::MAX).min(86_400 * 30));
    // Whole seconds, as people read it in the action.
    let at = chrono::Timelike::with_nanosecond(&at, 0).unwrap_or(at);
    let at_text = at.to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
    let next = NextAction::new(
        StepKind::Resolve,
        format!("look again after waiting (wait {round} of at most {max}): {reasoning}"),
    )
    .with_meta(&super::meta::ResolveMeta {
        not_before: Some(at),
        ..super::meta::ResolveMeta::default()
    });
    let finished = Finished::completed(format!("wait until {at_text}: {reasoning}")).then(next);
    let span_meta = ResolveSpanMeta {
        decision: decision_meta(ResolveDecision::Wait),
        reasoning: Some(reasoning.to_owned()),
        wait: Some(ResolveWaitMeta {
            round,
            max,
            not_before: at_text,
        }),
        corrective_commands: Some(Vec::new()),
        ..ResolveSpanMeta::default()
    };
    (finished, span_meta)
}

/// The conflict of the trace's latest failure, when that failure is a push that could not
/// consolidate the task branches.
fn latest_conflict(view: &TraceView) -> Option<PushConflict> {
    let latest = view
        .spans
        .iter()
        .filter(|s| matches!(s.status, SpanStatus::Failed | SpanStatus::Error))
        .max_by_key(|s| s.completed.unwrap_or(s.timestamp))?;
    ConflictSpanMeta::of(latest)
}

/// Whether the trace's latest failure is a consolidation conflict with no commit after it
/// (a push would meet the same conflict).
fn conflict_unchanged(view: &TraceView) -> bool {
    if latest_conflict(view).is_none() {
        return false;
    }
    let conflict_at = view
        .spans
        .iter()
        .filter(|s| s.step == StepKind::Push && ConflictSpanMeta::of(s).is_some())
        .filter_map(|s| s.completed)
        .max();
    !view.spans.iter().any(|s| {
        s.step == StepKind::Commit
            && s.status == SpanStatus::Completed
            && s.completed.zip(conflict_at).is_some_and(|(c, at)| c > at)
    })
}

/// Iterate on the task whose branch conflicts: rover merges the other side into its worktree
/// (conflict markers left in the files) and the agent resolves them, keeping both changes.
fn iterate_on_conflict(
    view: &TraceView,
    mappings: &BTreeMap<String, TaskMapping>,
    conflict: &PushConflict,
    result: &ResolveResult,
) -> Option<Decided> {
    let reasoning = result.reasoning.trim();
    // The latest workflow on the conflicting branch (an iteration reuses its branch).
    let (id, original) = view
        .spans
        .iter()
        .rev()
        .filter(|s| s.step == StepKind::Workflow)
        .filter_map(|s| s.action_id)
        .find_map(|id| {
            let mapping = mappings.get(&id.to_string())?;
            (mapping.branch_name == conflict.source_branch).then_some(id)
        })
        .and_then(|id| {
            let action = view.actions.iter().find(|a| a.id == id)?;
            Some((id, meta::read::<WorkflowMeta>(action).ok()?))
        })?;
    let mut instructions = result.instructions.clone().unwrap_or_default();
    if !instructions.is_empty() {
        instructions.push_str("\n\n");
    }
    let _ = write!(
        instructions,
        "This task's branch `{}` conflicts with `{}`, which holds the other tasks' work. rover has merged `{}` into this worktree; the conflicting files are: {}. Resolve every conflict marker so that both changes are kept, and make sure the result still does what this task asks.",
        conflict.source_branch,
        conflict.target,
        conflict.target,
        conflict.files.join(", ")
    );
    let workflow = WorkflowMeta {
        depends_on: Vec::new(),
        iterate_on: Some(id),
        branch: Some(conflict.source_branch.clone()),
        instructions: Some(instructions),
        merge_from: Some(conflict.target.clone()),
        ..original
    };
    let finished = Finished::completed(format!("iterate: {reasoning}")).then(
        NextAction::new(
            StepKind::Workflow,
            format!(
                "resolve the conflict of {} with {}: {reasoning}",
                workflow.title, conflict.target
            ),
        )
        .with_meta(&workflow),
    );
    Some(Decided {
        finished,
        decision: ResolveDecision::Iterate,
        span_meta: ResolveSpanMeta {
            iterate_on: Some(id),
            conflict: Some(conflict.clone()),
            ..ResolveSpanMeta::default()
        },
    })
}

/// What the resolver's answer leads to (`wait` is scheduled by [`scheduled_wait`] first).
fn decide(
    view: &TraceView,
    mappings: &BTreeMap<String, TaskMapping>,
    result: &ResolveResult,
) -> Result<Decided, StepError> {
    let reasoning = result.reasoning.trim().to_owned();
    let finished = match result.decision {
        ResolveDecision::Wait => {
            return Err(StepError::retryable(
                "the resolver agent answered `wait` although no workflow or commit of the trace is queued or running; asking again later",
            )
            .detail("reasoning", &reasoning));
        }
        ResolveDecision::Push if conflict_unchanged(view) => {
            let files = latest_conflict(view)
                .map(|c| c.files.join(", "))
                .unwrap_or_default();
            let why = format!(
                "the task branches still conflict (in {files}) and nothing was committed since: pushing again cannot succeed ({reasoning})"
            );
            return Ok(Decided {
                finished: fail_finished(view, format!("fail: {why}"), &why),
                decision: ResolveDecision::Fail,
                span_meta: ResolveSpanMeta {
                    quick_exit: Some(ResolveQuickExit::ConflictUnchanged),
                    ..ResolveSpanMeta::default()
                },
            });
        }
        ResolveDecision::Push => {
            let branches = committed_branches(view, mappings);
            Finished::completed(format!("push: {reasoning}")).then(
                NextAction::new(
                    StepKind::Push,
                    format!("push the trace's work: {reasoning}"),
                )
                .with_meta(&PushMeta { branches }),
            )
        }
        ResolveDecision::Notify => {
            let purpose = if has_review_workflow(view) {
                NotifyPurpose::Review
            } else {
                NotifyPurpose::Answer
            };
            let notify = NotifyMeta {
                purpose,
                message: result.message.clone().or_else(|| Some(reasoning.clone())),
                ..NotifyMeta::default()
            };
            Finished::completed(format!("notify: {reasoning}")).then(
                NextAction::new(StepKind::Notify, format!("report the outcome: {reasoning}"))
                    .with_meta(&notify),
            )
        }
        ResolveDecision::Iterate => {
            if let Some(conflict) = latest_conflict(view) {
                if let Some(on_conflict) = iterate_on_conflict(view, mappings, &conflict, result) {
                    return Ok(on_conflict);
                }
            }
            let Some((failed_id, original)) = failed_workflow(view) else {
                return Ok(Decided::new(
                    fail_finished(
                        view,
                        format!("fail: the agent asked to iterate but the trace has no workflow ({reasoning})"),
                        &reasoning,
                    ),
                    ResolveDecision::Fail,
                ));
            };
            let branch = mappings
                .get(&failed_id.to_string())
                .map(|m| m.branch_name.clone())
                .or(original.branch.clone());
            let workflow = WorkflowMeta {
                depends_on: Vec::new(),
                iterate_on: Some(failed_id),
                branch,
                instructions: result.instructions.clone(),
                merge_from: None,
                ..original
            };
            let finished = Finished::completed(format!("iterate: {reasoning}")).then(
                NextAction::new(
                    StepKind::Workflow,
                    format!("iterate on {}: {reasoning}", workflow.title),
                )
                .with_meta(&workflow),
            );
            return Ok(Decided {
                finished,
                decision: ResolveDecision::Iterate,
                span_meta: ResolveSpanMeta {
                    iterate_on: Some(failed_id),
                    ..ResolveSpanMeta::default()
                },
            });
        }
        ResolveDecision::Retry => {
            let step = result.retry_step.unwrap_or(RetryStep::Commit);
            match retry_action(view, mappings, step, &reasoning) {
                Some(action) => {
                    Finished::completed(format!("retry {}: {reasoning}", action.kind)).then(action)
                }
                None => {
                    return Ok(Decided::new(
                        fail_finished(
                            view,
                            format!("fail: the agent asked to retry a {step:?} but the trace has none to retry ({reasoning})"),
                            &reasoning,
                        ),
                        ResolveDecision::Fail,
                    ));
                }
            }
        }
        ResolveDecision::Fail => {
            let why = result.message.clone().unwrap_or_else(|| reasoning.clone());
            fail_finished(view, format!("fail: {reasoning}"), &why)
        }
    };
    Ok(Decided::new(finished, result.decision))
}

/// The re-enqueued action for a `retry`: the latest unsuccessful action of that step, same meta.
fn retry_action(
    view: &TraceView,
    mappings: &BTreeMap<String, TaskMapping>,
    step: RetryStep,
    reasoning: &str,
) -> Option<NextAction> {
    let kind = match step {
        RetryStep::Commit => StepKind::Commit,
        RetryStep::Workflow => StepKind::Workflow,
        RetryStep::Push => StepKind::Push,
    };
    let span = last_unsuccessful(view, &kind)
        .or_else(|| view.spans.iter().rev().find(|s| s.step == kind).cloned())?;
    let action = action_of(view, &span)?;
    let mut next = NextAction::new(
        kind.clone(),
        format!("retry after fixing the environment: {reasoning}"),
    );
    next.meta.clone_from(&action.meta);
    if kind == StepKind::Workflow {
        // The same task again: reuse its branch and worktree.
        if let Ok(mut workflow) = meta::read::<WorkflowMeta>(action) {
            workflow.iterate_on = Some(action.id);
            workflow.depends_on.clear();
            if let Some(m) = mappings.get(&action.id.to_string()) {
                workflow.branch = Some(m.branch_name.clone());
            }
            next = next.with_meta(&workflow);
        }
    }
    Some(next)
}

#[async_trait]
impl Step for ResolveStep {
    fn kind(&self) -> StepKind {
        StepKind::Resolve
    }

    fn max_parallel(&self) -> usize {
        3
    }

    fn exclusive_per_trace(&self) -> bool {
        true
    }

    async fn ready(
        &self,
        ctx: &StepContext,
        pending: &PendingAction,
    ) -> Result<Readiness, StepError> {
        let state = load_state(ctx, pending.trace_id).await?;
        Ok(
            match busy(
                &state.view,
                &[StepKind::Workflow, StepKind::Commit],
                pending.action_id,
                // A task whose dependency failed waits for this resolver to iterate on it.
                |p| p.running_span_id.is_none() && waits_for_the_resolver(&state, p.action_id),
            ) {
                Some(why) => Readiness::Wait(why),
                None => Readiness::Ready,
            },
        )
    }

    async fn process(&self, ctx: &StepContext, run: &StepRun) -> Result<Outcome, StepError> {
        let state = load_state(ctx, run.pending.trace_id).await?;
        let view = &state.view;
        if let Some(other) = superseding(view, run.span.id) {
            let span_meta = ResolveSpanMeta {
                decision: DecisionSpanMeta {
                    superseded_by: Some(other.to_string()),
                    ..DecisionSpanMeta::default()
                },
                ..ResolveSpanMeta::default()
            };
            return Ok(Outcome::Finished(
                Finished::completed(format!("superseded by {other}")).with_meta_record(&span_meta),
            ));
        }
        // A push refused for secrets ends the trace: they are in the branch's history, which a
        // commit on top cannot change, and no agent is asked (its answer could quote them).
        if let Some((span, branch, found)) = refused_for_secrets(view) {
            let why = format!(
                "the push of `{branch}` was refused: it would have sent {}. A secret in a commit stays in the branch's history, so no commit on top can remove it; nothing was pushed and the trace stops here",
                found.describe()
            );
            let span_meta = ResolveSpanMeta {
                decision: decision_meta(ResolveDecision::Fail),
                reasoning: Some(why.clone()),
                quick_exit: Some(ResolveQuickExit::SecretsInPush),
                secrets_span: Some(span.id),
                ..ResolveSpanMeta::default()
            };
            let finished = fail_finished(view, format!("fail: {why}"), &why);
            return Ok(Outcome::Finished(finished.with_meta_record(&span_meta)));
        }

        let max = self.services.config.autopilot.pipeline.max_retries;
        let retries = retries_so_far(view);
        // The limit stops the next iterate or retry, never the push of work it allowed: with
        // none left and nothing committed since the last push, no agent is asked.
        let out_of_retries = retries >= max;
        let gave_up = |retries: u32| {
            let why = format!(
                "gave up after {retries} iterate/retry attempts (the limit is {max}); the last failure is in the trace"
            );
            let span_meta = ResolveSpanMeta {
                decision: decision_meta(ResolveDecision::Fail),
                reasoning: Some(why.clone()),
                retries: Some(retries),
                max_retries: Some(max),
                quick_exit: Some(ResolveQuickExit::MaxRetries),
                corrective_commands: Some(Vec::new()),
                ..ResolveSpanMeta::default()
            };
            fail_finished(view, format!("fail: {why}"), &why).with_meta_record(&span_meta)
        };
        if out_of_retries && !unpushed_commit(view) {
            return Ok(Outcome::Finished(gave_up(retries)));
        }

        // A sandbox that changed the worktree's git metadata ends the trace: its work is not
        // trusted, and no agent is asked (its output could be the attacker's).
        if let Some(span) = tampered_span(view) {
            let why = format!(
                "the sandbox of the {} step tampered with the worktree's git metadata; its work was not committed and the trace stops here",
                span.step
            );
            let span_meta = ResolveSpanMeta {
                decision: decision_meta(ResolveDecision::Fail),
                reasoning: Some(why.clone()),
                quick_exit: Some(ResolveQuickExit::Tampered),
                tampered_span: Some(span.id),
                ..ResolveSpanMeta::default()
            };
            let finished = fail_finished(view, format!("fail: {why}"), &why);
            return Ok(Outcome::Finished(finished.with_meta_record(&span_meta)));
        }

        // The repository's environment did not build: no agent ran, and another attempt would
        // build the same definition again; the span holds the error and the command to rerun it.
        if let Some(span) = view
            .spans
            .iter()
            .find(|s| super::history::environment_failed(s))
        {
            let why = format!(
                "the repository's environment did not build, so no agent ran: {}",
                span.summary
                    .as_deref()
                    .unwrap_or_default()
                    .trim_start_matches("not started: ")
            );
            let span_meta = ResolveSpanMeta {
                decision: decision_meta(ResolveDecision::Fail),
                reasoning: Some(why.clone()),
                quick_exit: Some(ResolveQuickExit::EnvironmentBuild),
                environment_span: Some(span.id),
                ..ResolveSpanMeta::default()
            };
            let finished = fail_finished(view, format!("fail: {why}"), &why);
            return Ok(Outcome::Finished(finished.with_meta_record(&span_meta)));
        }

        let task = task_worktree(view, &state.mappings);
        let ws = super::tasks::workspace(&self.services).await.ok();
        let changes = match (&task, &ws) {
            (Some((worktree, Some(fork))), Some(ws)) => ws
                .diff_patch(worktree, fork, MAX_CHANGES_BYTES)
                .await
                .map_or_else(
                    |e| {
                        // git's message can quote the worktree's paths.
                        format!(
                            "(the change cannot be shown)\n{}",
                            untrusted_block("git", &e.to_string())
                        )
                    },
                    |patch| untrusted_block("the task's worktree", &patch),
                ),
            _ => "(no task worktree)".to_owned(),
        };
        let mut vars = PromptVars::new();
        vars.insert("trace".into(), render_trace(view));
        vars.insert("errors".into(), render_errors(view));
        vars.insert("changes".into(), changes);
        vars.insert(
            "retries".into(),
            if out_of_retries {
                format!("{retries} of at most {max} iterate/retry decisions used: none is left, so `iterate` and `retry` end the trace; push the work already committed, notify, or fail.")
            } else {
                format!("{retries} of at most {max} iterate/retry decisions used.")
            },
        );
        let dir = agent_call::host_workdir_path(&ctx.store);
        let answer = agent_call::ask::<ResolveResult>(
            &self.services,
            ctx,
            run.span.id,
            AgentStep::Resolve,
            vars,
        )
        .await
        .map_err(|e| agent_call::agent_error(AgentStep::Resolve, &e).detail("workdir", &dir))?;
        let usage = agent_call::usage_meta(&answer);
        let result = answer.value;
        if result.decision == ResolveDecision::Wait {
            let pipeline = &self.services.config.autopilot.pipeline;
            let (finished, span_meta) =
                scheduled_wait(view, &result, pipeline.wait_secs, pipeline.max_waits);
            let span_meta = ResolveSpanMeta {
                agent: Some(usage),
                ..span_meta
            };
            return Ok(Outcome::Finished(finished.with_meta_record(&span_meta)));
        }
        if out_of_retries
            && matches!(
                result.decision,
                ResolveDecision::Iterate | ResolveDecision::Retry
            )
        {
            let mut finished = gave_up(retries);
            let mut span_meta = ResolveSpanMeta::read(&finished.meta).unwrap_or_default();
            span_meta.agent = Some(usage);
            span_meta.agent_decision = Some(result.decision);
            finished = finished.with_meta_record(&span_meta);
            return Ok(Outcome::Finished(finished));
        }
        let Decided {
            finished,
            decision,
            span_meta,
        } = decide(view, &state.mappings, &result)?;
        // The fix the resolver asked for runs in the sandbox over the task's worktree, before
        // the retry it prepares; never on the host.
        let corrective_runs =
            if decision == ResolveDecision::Retry && !result.corrective_commands.is_empty() {
                Some(
                    self.corrective(ctx, run, task.as_ref().map(|t| t.0.as_path()), &result)
                        .await?,
                )
            } else {
                None
            };
        let span_meta = ResolveSpanMeta {
            decision: decision_meta(decision),
            agent_decision: Some(result.decision),
            reasoning: Some(result.reasoning.clone()),
            corrective_commands: Some(result.corrective_commands.clone()),
            corrective_runs,
            instructions: Some(result.instructions.clone()),
            retry_step: Some(result.retry_step),
            message: Some(result.message.clone()),
            retries: Some(retries),
            max_retries: Some(max),
            workdir: Some(dir.display().to_string()),
            agent: Some(usage),
            ..span_meta
        };
        Ok(Outcome::Finished(finished.with_meta_record(&span_meta)))
    }
}

#[cfg(test)]
mod tests {
    use chrono::{DateTime, TimeDelta, Utc};

    use super::*;
    use crate::store::{Meta, TraceIndex};

    /// A trace built span by span, each a minute after the previous one.
    struct Builder {
        view: TraceView,
        clock: DateTime<Utc>,
    }

    impl Builder {
        fn new() -> Builder {
            let clock = Utc::now();
            let mut root = Span::root(Uuid::new_v4(), clock, Meta::new());
            root.finish(SpanStatus::Completed, "event", Meta::new(), clock)
                .expect("finish");
            let index = TraceIndex::new(&root, "test".into());
            Builder {
                view: TraceView {
                    index,
                    spans: vec![root],
                    actions: Vec::new(),
                    pending: Vec::new(),
                    missing: Vec::new(),
                },
                clock,
            }
        }

        /// Adds a finished span of `step` for a new action with `meta`; returns the action id.
        fn span(&mut self, step: StepKind, status: SpanStatus, meta: Meta, out: Meta) -> Uuid {
            let parent = self.view.spans.last().expect("root").clone();
            let action = Action::new(step.clone(), &parent, "test", meta, self.clock);
            let mut span = Span::start(step, &action, self.view.trace_id(), self.clock);
            self.clock += TimeDelta::minutes(1);
            span.finish(status, "done", out, self.clock)
                .expect("finish");
            self.clock += TimeDelta::minutes(1);
            let id = action.id;
            self.view.actions.push(action);
            self.view.spans.push(span);
            id
        }

        fn commit(&mut self, workflow: Uuid, status: SpanStatus) -> Uuid {
            let meta = CommitMeta {
                workflow_action_id: Some(workflow),
                task_status: meta::TaskStatus::Completed,
                summary: None,
            };
            let meta = match serde_json::to_value(meta) {
                Ok(Value::Object(m)) => m,
                _ => Meta::new(),
            };
            self.span(StepKind::Commit, status, meta, Meta::new())
        }

        fn resolve(&mut self, decision: &str) -> Uuid {
            let mut out = Meta::new();
            out.insert("decision".into(), decision.into());
            self.span(StepKind::Resolve, SpanStatus::Completed, Meta::new(), out)
        }

        fn span_of(&self, action: Uuid) -> Uuid {
            self.view
                .spans
                .iter()
                .find(|s| s.action_id == Some(action))
                .expect("span")
                .id
        }
    }

    fn mapping(trace: Uuid, branch: &str) -> TaskMapping {
        TaskMapping::new(branch, branch, trace, Uuid::new_v4())
    }

    #[test]
    fn a_resolve_after_the_last_commit_supersedes_later_ones() {
        let mut b = Builder::new();
        let wf_a = b.span(
            StepKind::Workflow,
            SpanStatus::Completed,
            Meta::new(),
            Meta::new(),
        );
        b.commit(wf_a, SpanStatus::Completed);
        let wf_b = b.span(
            StepKind::Workflow,
            SpanStatus::Completed,
            Meta::new(),
            Meta::new(),
        );
        b.commit(wf_b, SpanStatus::Completed);
        let first = b.resolve("push");
        // The second resolve of the trace (its span is still running).
        let current = Uuid::new_v4();
        assert_eq!(superseding(&b.view, current), Some(b.span_of(first)));
        // A commit after that resolve (an iteration) makes the next resolve decide again.
        b.commit(wf_b, SpanStatus::Completed);
        assert_eq!(superseding(&b.view, current), None);
    }

    #[test]
    fn only_iterate_and_retry_count_as_retries() {
        let mut b = Builder::new();
        assert_eq!(retries_so_far(&b.view), 0);
        b.resolve("iterate");
        b.resolve("push");
        b.resolve("retry");
        b.resolve("fail");
        assert_eq!(retries_so_far(&b.view), 2);
    }

    #[test]
    fn branches_come_from_completed_commits_once_each() {
        let mut b = Builder::new();
        let trace = b.view.trace_id();
        let wf_a = b.span(
            StepKind::Workflow,
            SpanStatus::Completed,
            Meta::new(),
            Meta::new(),
        );
        let wf_b = b.span(
            StepKind::Workflow,
            SpanStatus::Failed,
            Meta::new(),
            Meta::new(),
        );
        b.commit(wf_a, SpanStatus::Completed);
        b.commit(wf_b, SpanStatus::Error);
        b.commit(wf_a, SpanStatus::Completed);
        let mappings: BTreeMap<String, TaskMapping> = [
            (wf_a.to_string(), mapping(trace, "rover/a")),
            (wf_b.to_string(), mapping(trace, "rover/b")),
        ]
        .into_iter()
        .collect();
        assert_eq!(committed_branches(&b.view, &mappings), vec!["rover/a"]);
    }

    #[test]
    fn iterate_reuses_the_failed_task_and_its_branch() {
        let mut b = Builder::new();
        let trace = b.view.trace_id();
        let task = WorkflowMeta {
            title: "parser".into(),
            description: "d".into(),
            depends_on: vec![Uuid::new_v4()],
            ..WorkflowMeta::default()
        };
        let meta = match serde_json::to_value(&task) {
            Ok(Value::Object(m)) => m,
            _ => Meta::new(),
        };
        let wf = b.span(StepKind::Workflow, SpanStatus::Failed, meta, Meta::new());
        b.commit(wf, SpanStatus::Completed);
        let mappings: BTreeMap<String, TaskMapping> =
            [(wf.to_string(), mapping(trace, "rover/parser"))]
                .into_iter()
                .collect();
        let result = ResolveResult {
            decision: ResolveDecision::Iterate,
            reasoning: "wrong approach".into(),
            instructions: Some("try a table".into()),
            retry_step: None,
            message: None,
            corrective_commands: Vec::new(),
        };
        let decided = decide(&b.view, &mappings, &result).expect("decided");
        assert_eq!(decided.decision, ResolveDecision::Iterate);
        let next = &decided.finished.actions[0];
        assert_eq!(next.kind, StepKind::Workflow);
        let again: WorkflowMeta = crate::store::from_meta(&next.meta).expect("meta");
        assert_eq!(again.iterate_on, Some(wf));
        assert_eq!(again.branch.as_deref(), Some("rover/parser"));
        assert_eq!(again.instructions.as_deref(), Some("try a table"));
        assert!(again.depends_on.is_empty());
        assert_eq!(again.title, "parser");
    }

    #[test]
    fn a_retry_with_nothing_to_retry_becomes_a_failure_notify() {
        let b = Builder::new();
        let result = ResolveResult {
            decision: ResolveDecision::Retry,
            reasoning: "fixed".into(),
            instructions: None,
            retry_step: Some(RetryStep::Push),
            message: None,
            corrective_commands: Vec::new(),
        };
        let decided = decide(&b.view, &BTreeMap::new(), &result).expect("decided");
        assert_eq!(decided.decision, ResolveDecision::Fail);
        let next = &decided.finished.actions[0];
        assert_eq!(next.kind, StepKind::Notify);
        assert_eq!(next.meta["purpose"], Value::from("failure"));
    }

    #[test]
    fn a_tampered_worktree_is_found_by_its_flag_or_its_error() {
        let mut b = Builder::new();
        let workflow = b.span(
            StepKind::Workflow,
            SpanStatus::Completed,
            Meta::new(),
            Meta::new(),
        );
        b.commit(workflow, SpanStatus::Completed);
        assert!(tampered_span(&b.view).is_none());
        let mut error = Meta::new();
        error.insert(
            "error".into(),
            serde_json::json!({"message": "tampered: ...", "tampered": true}),
        );
        b.span(StepKind::Commit, SpanStatus::Error, Meta::new(), error);
        assert_eq!(
            tampered_span(&b.view).map(|s| s.step.clone()),
            Some(StepKind::Commit)
        );
        let mut b = Builder::new();
        let mut flag = Meta::new();
        flag.insert("tampered".into(), true.into());
        b.span(StepKind::Workflow, SpanStatus::Failed, Meta::new(), flag);
        assert!(tampered_span(&b.view).is_some());
    }

    #[test]
    fn a_push_refused_for_secrets_calls_for_a_decision_until_a_later_push_goes_through() {
        let mut b = Builder::new();
        let workflow = b.span(
            StepKind::Workflow,
            SpanStatus::Completed,
            Meta::new(),
            Meta::new(),
        );
        b.commit(workflow, SpanStatus::Completed);
        b.resolve("push");
        assert!(refused_for_secrets(&b.view).is_none());
        let refused = crate::store::to_meta(&meta::PushSpanMeta {
            status: Some(meta::PushStatus::Secrets),
            branch: Some("rover/a".into()),
            secrets_found: Some(SecretsFound {
                findings: Vec::new(),
                more: 1,
            }),
            ..meta::PushSpanMeta::default()
        });
        b.span(StepKind::Push, SpanStatus::Failed, Meta::new(), refused);
        let (span, branch, found) = refused_for_secrets(&b.view).expect("refused");
        assert_eq!(
            (span.step.clone(), branch.as_str(), found.more),
            (StepKind::Push, "rover/a", 1)
        );
        // The resolve that decided the push does not supersede the one the refusal calls for.
        assert_eq!(superseding(&b.view, Uuid::new_v4()), None);
        // A person rewrote the branch and retried: the push went through.
        b.span(
            StepKind::Push,
            SpanStatus::Completed,
            Meta::new(),
            Meta::new(),
        );
        assert!(refused_for_secrets(&b.view).is_none());
    }

    #[test]
    fn the_prompt_lists_the_trace_and_the_error_details() {
        let mut b = Builder::new();
        let wf = b.span(
            StepKind::Workflow,
            SpanStatus::Completed,
            Meta::new(),
            Meta::new(),
        );
        let mut error = Meta::new();
        error.insert(
            "error".into(),
            serde_json::json!({"command": ["git", "commit"], "exitCode": 1,
                "stderr": "pre-commit: eslint: not found"}),
        );
        b.commit(wf, SpanStatus::Completed);
        b.span(StepKind::Commit, SpanStatus::Error, Meta::new(), error);
        let trace = render_trace(&b.view);
        assert!(trace.contains("- commit [error] done"), "{trace}");
        let errors = render_errors(&b.view);
        assert!(errors.contains("eslint: not found"), "{errors}");
        assert!(errors.contains("\"exitCode\": 1"), "{errors}");
        assert_eq!(render_errors(&Builder::new().view), "No step failed.");
    }

    #[test]
    fn the_recorded_decision_is_named_as_the_agent_answers_it() {
        for d in [
            ResolveDecision::Wait,
            ResolveDecision::Push,
            ResolveDecision::Notify,
            ResolveDecision::Iterate,
            ResolveDecision::Retry,
            ResolveDecision::Fail,
        ] {
            assert_eq!(
                Value::from(decision_name(d)),
                serde_json::to_value(d).expect("serializes")
            );
        }
    }
}
