//! What the resolver asks of its trace's past: what is still busy, what a span decided, the
//! retries so far, the last failure, the committed branches, the failed workflow and its
//! worktree, a tampered or refused push, a code review, a conflict that came back.

use std::collections::BTreeMap;
use std::path::PathBuf;

use uuid::Uuid;

use super::TraceState;
use crate::steps::meta::{
    self, CommitMeta, CommitSpanMeta, ConflictSpanMeta, DecisionSpanMeta, OutcomeSpanMeta,
    PushConflict, SecretsFound, SecretsSpanMeta, WorkflowMeta, WorkflowType,
};
use crate::steps::tasks::mapping_worktree;
use crate::store::{Action, PendingAction, Span, SpanStatus, StepKind, TaskMapping, TraceView};

/// Whether a queued or running action of `kind` belongs to the trace (other than `except`).
pub(super) fn busy(
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
pub(super) fn waits_for_the_resolver(state: &TraceState, action_id: Uuid) -> bool {
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
            crate::steps::history::dependency_state(&state.view, &queue, *dep),
            crate::steps::history::Dependency::Blocked(_)
        )
    })
}

pub(super) fn action_of<'v>(view: &'v TraceView, span: &Span) -> Option<&'v Action> {
    let id = span.action_id?;
    view.actions.iter().find(|a| a.id == id)
}

pub(super) fn decision_of(span: &Span) -> Option<String> {
    DecisionSpanMeta::of(span).decision
}

/// A resolve of the trace (not `current`) that decided after the last commit finished, after
/// the last red CI of a pushed pull request, or after a consolidation conflict (each calls for
/// a new decision).
pub(super) fn superseding(view: &TraceView, current: Uuid) -> Option<Uuid> {
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
pub(super) fn unpushed_commit(view: &TraceView) -> bool {
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
pub(super) fn last_unsuccessful(view: &TraceView, kind: &StepKind) -> Option<Span> {
    view.spans
        .iter()
        .rev()
        .find(|s| &s.step == kind && matches!(s.status, SpanStatus::Failed | SpanStatus::Error))
        .cloned()
}

/// The latest span that did not complete among workflow, commit and push.
pub(super) fn last_failure(view: &TraceView) -> Option<Span> {
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
pub(super) fn workflow_of_commit(view: &TraceView, commit: &Span) -> Option<Uuid> {
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
pub(super) fn failed_workflow(view: &TraceView) -> Option<(Uuid, WorkflowMeta)> {
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
pub(super) fn task_worktree(
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
pub(super) fn tampered_span(view: &TraceView) -> Option<&Span> {
    view.spans.iter().find(|s| OutcomeSpanMeta::is_tampered(s))
}

/// The trace's latest push, when it was refused for the secrets it would have sent: the span,
/// its branch and what it found. A later push that went through clears it (a person rewrote
/// the branch's history and retried).
pub(super) fn refused_for_secrets(view: &TraceView) -> Option<(&Span, String, SecretsFound)> {
    let push = view
        .spans
        .iter()
        .rev()
        .find(|s| s.step == StepKind::Push && s.status.is_final())?;
    let (branch, found) = SecretsSpanMeta::of(push)?;
    Some((push, branch, found))
}

pub(super) fn has_review_workflow(view: &TraceView) -> bool {
    view.actions
        .iter()
        .filter(|a| a.action == StepKind::Workflow)
        .filter_map(|a| meta::read::<WorkflowMeta>(a).ok())
        .any(|m| m.workflow_type != WorkflowType::Swe)
}

/// The conflict of the trace's latest failure, when that failure is a push that could not
/// consolidate the task branches.
pub(super) fn latest_conflict(view: &TraceView) -> Option<PushConflict> {
    let latest = view
        .spans
        .iter()
        .filter(|s| matches!(s.status, SpanStatus::Failed | SpanStatus::Error))
        .max_by_key(|s| s.completed.unwrap_or(s.timestamp))?;
    ConflictSpanMeta::of(latest)
}

/// Whether the trace's latest failure is a consolidation conflict with no commit after it
/// (a push would meet the same conflict).
pub(super) fn conflict_unchanged(view: &TraceView) -> bool {
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
