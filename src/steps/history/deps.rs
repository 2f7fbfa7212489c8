//! Where a workflow's `dependsOn` stand: waiting, done (fork from its branch), blocked on
//! the resolver, or failed.

use uuid::Uuid;

use crate::steps::meta::{self, CommitMeta, WorkflowMeta};
use crate::steps::tasks;
use crate::store::{SpanStatus, StepKind, TraceView};

/// Where a dependency stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Dependency {
    /// Still queued, running, or its commit is not done yet.
    Waiting(String),
    /// Done and committed: fork from its branch.
    Done {
        branch: String,
        title: String,
        summary: String,
    },
    /// It failed, and the resolver may still iterate on it (its commit or a resolve is queued
    /// or running): this task waits, and the resolver does not wait for it.
    Blocked(String),
    /// It failed for good (or is unknown): this task cannot run.
    Failed(String),
}

/// The latest iteration of workflow action `dep` (the resolver's `iterate`/`retry` make a new
/// workflow action with `iterateOn` naming the one before): what a dependent builds on.
fn latest_iteration(view: &TraceView, dep: Uuid) -> Uuid {
    let mut latest = dep;
    // Bounded by the number of actions, so a cycle in foreign data cannot loop.
    for _ in 0..view.actions.len() {
        let next = view.actions.iter().find(|a| {
            a.action == StepKind::Workflow
                && meta::read::<WorkflowMeta>(a).is_ok_and(|m| m.iterate_on == Some(latest))
        });
        match next {
            Some(a) => latest = a.id,
            None => break,
        }
    }
    latest
}

/// Where dependency `dep` of a task in trace `view` stands: its latest iteration's state, and a
/// failure is only final once no commit or resolve of the trace that could iterate it is left.
pub fn dependency_state(view: &TraceView, state: &crate::store::State, dep: Uuid) -> Dependency {
    match iteration_state(view, state, latest_iteration(view, dep)) {
        Dependency::Failed(reason) if resolver_pending(view) => {
            Dependency::Blocked(format!("{reason}; waiting for the resolver"))
        }
        other => other,
    }
}

/// Whether a commit or resolve of the trace is queued or running (the resolver may still
/// iterate on a failed task).
fn resolver_pending(view: &TraceView) -> bool {
    view.pending
        .iter()
        .any(|p| matches!(p.action, StepKind::Commit | StepKind::Resolve))
}

fn iteration_state(view: &TraceView, state: &crate::store::State, dep: Uuid) -> Dependency {
    let title = view
        .actions
        .iter()
        .find(|a| a.id == dep)
        .and_then(|a| meta::read::<WorkflowMeta>(a).ok())
        .map(|m| m.title);
    let Some(title) = title else {
        return Dependency::Failed(format!(
            "it depends on workflow action {dep}, which is not a workflow of this trace"
        ));
    };
    if view.pending.iter().any(|p| p.action_id == dep) {
        return Dependency::Waiting(format!("dependency `{title}` has not finished"));
    }
    let Some(span) = view
        .spans
        .iter()
        .rev()
        .find(|s| s.action_id == Some(dep) && s.status.is_final())
    else {
        return Dependency::Waiting(format!("dependency `{title}` has not run yet"));
    };
    let summary = span.summary.clone().unwrap_or_default();
    if span.status != SpanStatus::Completed {
        return Dependency::Failed(format!(
            "dependency `{title}` ended {}: {summary}",
            span.status
        ));
    }
    let commits: Vec<Uuid> = view
        .actions
        .iter()
        .filter(|a| {
            a.action == StepKind::Commit
                && (a.span_id == span.id
                    || meta::read::<CommitMeta>(a).is_ok_and(|m| m.workflow_action_id == Some(dep)))
        })
        .map(|a| a.id)
        .collect();
    if view.pending.iter().any(|p| commits.contains(&p.action_id)) {
        return Dependency::Waiting(format!("dependency `{title}` is not committed yet"));
    }
    if let Some(commit) = view
        .spans
        .iter()
        .rev()
        .find(|s| s.action_id.is_some_and(|a| commits.contains(&a)) && s.status.is_final())
    {
        if commit.status != SpanStatus::Completed {
            return Dependency::Failed(format!(
                "the commit of dependency `{title}` ended {}: {}",
                commit.status,
                commit.summary.clone().unwrap_or_default()
            ));
        }
    }
    match tasks::task_of(state, dep) {
        Some(task) => Dependency::Done {
            branch: task.mapping.branch_name,
            title,
            summary,
        },
        None => Dependency::Failed(format!(
            "dependency `{title}` has no task mapping any more (cleaned up?)"
        )),
    }
}
