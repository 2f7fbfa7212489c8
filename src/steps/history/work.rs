//! Where the trace's work stands: what is still busy, its tasks in the plan's order, what was
//! committed and pushed, the task a retry or a conflict goes back to, the image its runs used.

use std::collections::BTreeMap;
use std::path::PathBuf;

use uuid::Uuid;

use super::failures::{failed_workflow, last_unsuccessful};
use crate::steps::meta::{
    self, CommitMeta, CommitSpanMeta, WorkflowMeta, WorkflowSpanMeta, WorkflowType,
};
use crate::steps::tasks::mapping_worktree;
use crate::store::{Action, PendingAction, Span, SpanStatus, StepKind, TaskMapping, TraceView};

/// What keeps a step waiting: a queued or running action of one of `kinds` (other than
/// `except`, and not one `ignore` lets pass), or a running span of one of them; `None` when
/// nothing does.
pub fn busy(
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
pub fn waits_for_the_resolver(
    view: &TraceView,
    mappings: &BTreeMap<String, TaskMapping>,
    action_id: Uuid,
) -> bool {
    let Some(meta) = view
        .actions
        .iter()
        .find(|a| a.id == action_id)
        .and_then(|a| meta::read::<WorkflowMeta>(a).ok())
    else {
        return false;
    };
    let mut queue = crate::store::State::new(chrono::Utc::now());
    queue.task_mappings.clone_from(mappings);
    meta.depends_on.iter().any(|dep| {
        matches!(
            super::dependency_state(view, &queue, *dep),
            super::Dependency::Blocked(_)
        )
    })
}

/// The trace's action named by `id`: its whole id, or a prefix of at least 8 characters.
pub fn action_named<'v>(view: &'v TraceView, id: &str) -> Option<&'v Action> {
    view.actions.iter().find(|a| {
        let full = a.id.to_string();
        full == id || (id.len() >= 8 && full.starts_with(id))
    })
}

/// The action `span` ran.
pub fn action_of<'v>(view: &'v TraceView, span: &Span) -> Option<&'v Action> {
    let id = span.action_id?;
    view.actions.iter().find(|a| a.id == id)
}

/// The workflow action a commit span worked for.
pub fn workflow_of_commit(view: &TraceView, commit: &Span) -> Option<Uuid> {
    action_of(view, commit)
        .and_then(|a| meta::read::<CommitMeta>(a).ok())
        .and_then(|m| m.workflow_action_id)
}

/// Whether the trace committed work after its last push (or has no push yet): work a limit on
/// iterations must not throw away.
pub fn unpushed_commit(view: &TraceView) -> bool {
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

/// Where workflow action `id` stands in the plan: its position among the trace's actions.
fn plan_position(view: &TraceView, id: Uuid) -> Option<usize> {
    view.actions.iter().position(|a| a.id == id)
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
    workflows.sort_by_key(|id| plan_position(view, *id).unwrap_or(usize::MAX));
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

/// The trace's tasks (its task mappings, keyed by workflow action) in the plan's order of their
/// workflow actions, each with its action's meta; a mapping of no action of the trace is left
/// out. The order is the plan's, not the one the parallel runs happened to start in: a pull
/// request's title and target branch must not depend on timing.
pub fn tasks_in_plan_order(
    view: &TraceView,
    mappings: BTreeMap<String, TaskMapping>,
) -> Vec<(TaskMapping, Option<WorkflowMeta>)> {
    let mut tasks: Vec<(usize, (TaskMapping, Option<WorkflowMeta>))> = mappings
        .into_iter()
        .filter_map(|(key, mapping)| {
            let position = plan_position(view, Uuid::parse_str(&key).ok()?)?;
            let meta = meta::read::<WorkflowMeta>(&view.actions[position]).ok();
            Some((position, (mapping, meta)))
        })
        .collect();
    tasks.sort_by_key(|(position, _)| *position);
    tasks.into_iter().map(|(_, t)| t).collect()
}

/// Whether the trace planned a review (a workflow of another type than `swe`).
pub fn has_review_workflow(view: &TraceView) -> bool {
    view.actions
        .iter()
        .filter(|a| a.action == StepKind::Workflow)
        .filter_map(|a| meta::read::<WorkflowMeta>(a).ok())
        .any(|m| m.workflow_type != WorkflowType::Swe)
}

/// The latest workflow run on `branch` (an iteration reuses its task's branch), with its
/// action's meta: the task a conflict on that branch goes back to.
pub fn latest_workflow_on_branch(
    view: &TraceView,
    mappings: &BTreeMap<String, TaskMapping>,
    branch: &str,
) -> Option<(Uuid, WorkflowMeta)> {
    let id = view
        .spans
        .iter()
        .rev()
        .filter(|s| s.step == StepKind::Workflow)
        .filter_map(|s| s.action_id)
        .find(|id| {
            mappings
                .get(&id.to_string())
                .is_some_and(|m| m.branch_name == branch)
        })?;
    let action = view.actions.iter().find(|a| a.id == id)?;
    Some((id, meta::read::<WorkflowMeta>(action).ok()?))
}

/// The action a `retry` of `kind` runs again: the one of the latest unsuccessful span of that
/// step, else of its latest span.
pub fn retry_target<'v>(view: &'v TraceView, kind: &StepKind) -> Option<&'v Action> {
    let span = last_unsuccessful(view, kind)
        .or_else(|| view.spans.iter().rev().find(|s| &s.step == kind))?;
    action_of(view, span)
}

/// The failed task's worktree (else that of the trace's latest task that has one), with the
/// task's fork point: where corrective commands run and whose change a prompt shows.
pub fn task_worktree(
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

/// The image a launched run used (its gates run in the same one); `None` for a span that does
/// not say.
pub fn image_of(span: &Span) -> Option<String> {
    let meta: WorkflowSpanMeta = crate::store::from_meta(&span.meta).ok()?;
    meta.environment
        .map(|e| e.image)
        .or_else(|| meta.launched.map(|l| l.image))
        .filter(|image| !image.is_empty())
}

/// The image the trace's latest workflow run used: where its hooks and corrective commands run,
/// so they find the tools the agent and the gates had.
pub fn latest_image(view: &TraceView) -> Option<String> {
    view.spans
        .iter()
        .rev()
        .filter(|s| s.step == StepKind::Workflow)
        .find_map(image_of)
}

/// What the latest run of workflow `action_id` that named its branch recorded (branch,
/// worktree, container): the task of a mapping already gone.
pub fn recorded_task(view: &TraceView, action_id: Uuid) -> Option<(&Span, WorkflowSpanMeta)> {
    view.spans
        .iter()
        .rev()
        .filter(|s| s.action_id == Some(action_id))
        .find_map(|s| {
            let meta = WorkflowSpanMeta::read(&s.meta).ok()?;
            meta.branch_name.is_some().then_some((s, meta))
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::steps::history::testing::Builder;
    use crate::store::Meta;

    fn mapping(trace: Uuid, branch: &str) -> TaskMapping {
        TaskMapping::new(branch, branch, trace, Uuid::new_v4())
    }

    fn task(title: &str) -> WorkflowMeta {
        WorkflowMeta {
            title: title.into(),
            ..WorkflowMeta::default()
        }
    }

    fn mappings(of: &[(Uuid, TaskMapping)]) -> BTreeMap<String, TaskMapping> {
        of.iter()
            .map(|(id, m)| (id.to_string(), m.clone()))
            .collect()
    }

    #[test]
    fn a_queued_or_running_action_of_the_kinds_keeps_a_step_busy() {
        let mut b = Builder::new();
        let except = Uuid::new_v4();
        assert_eq!(busy(&b.view, &[StepKind::Commit], except, |_| false), None);
        let wf = b.bare(StepKind::Workflow, SpanStatus::Completed);
        let action = b.view.actions.last().expect("action").clone();
        b.view
            .pending
            .push(action.pending(b.view.trace_id(), b.clock));
        let why = busy(&b.view, &[StepKind::Workflow], except, |_| false).expect("busy");
        assert!(
            why.contains(&wf.to_string()) && why.contains("queued"),
            "{why}"
        );
        assert_eq!(busy(&b.view, &[StepKind::Workflow], wf, |_| false), None);
        assert_eq!(busy(&b.view, &[StepKind::Workflow], except, |_| true), None);
        assert_eq!(busy(&b.view, &[StepKind::Commit], except, |_| false), None);
        b.view.spans.last_mut().expect("span").status = SpanStatus::Running;
        b.view.pending.clear();
        let why = busy(&b.view, &[StepKind::Workflow], except, |_| false).expect("busy");
        assert!(why.contains("running workflow span"), "{why}");
    }

    #[test]
    fn an_action_is_named_by_its_id_or_a_prefix_of_eight_characters_or_more() {
        let mut b = Builder::new();
        let id = b.bare(StepKind::Workflow, SpanStatus::Completed);
        let full = id.to_string();
        for (name, found) in [
            (full.as_str(), true),
            (&full[..8], true),
            (&full[..7], false),
            ("00000000", false),
        ] {
            assert_eq!(
                action_named(&b.view, name).map(|a| a.id == id),
                found.then_some(true),
                "{name}"
            );
        }
    }

    #[test]
    fn branches_come_from_completed_commits_once_each_in_plan_order() {
        let mut b = Builder::new();
        let trace = b.view.trace_id();
        let wf_a = b.bare(StepKind::Workflow, SpanStatus::Completed);
        let wf_b = b.bare(StepKind::Workflow, SpanStatus::Completed);
        let wf_c = b.bare(StepKind::Workflow, SpanStatus::Failed);
        b.commit(wf_b, SpanStatus::Completed);
        b.commit(wf_c, SpanStatus::Error);
        b.commit(wf_a, SpanStatus::Completed);
        b.commit(wf_a, SpanStatus::Completed);
        let m = mappings(&[
            (wf_a, mapping(trace, "rover/a")),
            (wf_b, mapping(trace, "rover/b")),
            (wf_c, mapping(trace, "rover/c")),
        ]);
        assert_eq!(committed_branches(&b.view, &m), vec!["rover/a", "rover/b"]);
        let order: Vec<String> = tasks_in_plan_order(&b.view, m)
            .into_iter()
            .map(|(m, _)| m.branch_name)
            .collect();
        assert_eq!(order, ["rover/a", "rover/b", "rover/c"]);
    }

    #[test]
    fn a_commit_after_the_last_push_is_unpushed_work() {
        let mut b = Builder::new();
        assert!(!unpushed_commit(&b.view));
        let committed = crate::store::to_meta(&CommitSpanMeta {
            committed: true,
            ..CommitSpanMeta::default()
        });
        let wf = b.bare(StepKind::Workflow, SpanStatus::Completed);
        b.span(
            StepKind::Commit,
            SpanStatus::Completed,
            Meta::new(),
            committed.clone(),
        );
        assert!(unpushed_commit(&b.view));
        b.bare(StepKind::Push, SpanStatus::Completed);
        assert!(!unpushed_commit(&b.view));
        // A commit that found nothing to commit is no work.
        b.commit(wf, SpanStatus::Completed);
        assert!(!unpushed_commit(&b.view));
        b.span(
            StepKind::Commit,
            SpanStatus::Completed,
            Meta::new(),
            committed,
        );
        assert!(unpushed_commit(&b.view));
    }

    #[test]
    fn a_retry_goes_back_to_the_latest_unsuccessful_run_of_its_step_else_the_latest() {
        let mut b = Builder::new();
        assert!(retry_target(&b.view, &StepKind::Push).is_none());
        let failed = b.bare(StepKind::Push, SpanStatus::Failed);
        b.bare(StepKind::Push, SpanStatus::Completed);
        assert_eq!(
            retry_target(&b.view, &StepKind::Push).map(|a| a.id),
            Some(failed)
        );
        let mut b = Builder::new();
        b.bare(StepKind::Commit, SpanStatus::Completed);
        let last = b.bare(StepKind::Commit, SpanStatus::Completed);
        assert_eq!(
            retry_target(&b.view, &StepKind::Commit).map(|a| a.id),
            Some(last)
        );
    }

    #[test]
    fn a_conflict_goes_back_to_the_latest_workflow_on_its_branch() {
        let mut b = Builder::new();
        let trace = b.view.trace_id();
        let first = b.workflow(&task("parser"), SpanStatus::Completed);
        let other = b.workflow(&task("cli"), SpanStatus::Completed);
        let again = b.workflow(&task("parser again"), SpanStatus::Completed);
        let m = mappings(&[
            (first, mapping(trace, "rover/parser")),
            (other, mapping(trace, "rover/cli")),
            (again, mapping(trace, "rover/parser")),
        ]);
        let (id, meta) = latest_workflow_on_branch(&b.view, &m, "rover/parser").expect("found");
        assert_eq!((id, meta.title.as_str()), (again, "parser again"));
        assert!(latest_workflow_on_branch(&b.view, &m, "rover/none").is_none());
    }

    #[test]
    fn a_review_workflow_is_any_but_swe() {
        let mut b = Builder::new();
        b.workflow(&task("change"), SpanStatus::Completed);
        assert!(!has_review_workflow(&b.view));
        b.workflow(
            &WorkflowMeta {
                workflow_type: WorkflowType::CodeReview,
                ..task("review")
            },
            SpanStatus::Completed,
        );
        assert!(has_review_workflow(&b.view));
    }

    #[test]
    fn the_image_and_the_task_come_from_the_latest_workflow_run_that_recorded_them() {
        let mut b = Builder::new();
        assert_eq!(latest_image(&b.view), None);
        let first = crate::store::to_meta(&WorkflowSpanMeta {
            environment: Some(crate::environment::EnvironmentMeta::image(
                "rover/sandbox:1",
            )),
            branch_name: Some("rover/a".into()),
            ..WorkflowSpanMeta::default()
        });
        let wf = b.span(
            StepKind::Workflow,
            SpanStatus::Completed,
            Meta::new(),
            first,
        );
        let env = crate::store::to_meta(&WorkflowSpanMeta {
            environment: Some(crate::environment::EnvironmentMeta::image("rover/env:2")),
            ..WorkflowSpanMeta::default()
        });
        b.span(StepKind::Workflow, SpanStatus::Failed, Meta::new(), env);
        b.bare(StepKind::Workflow, SpanStatus::Completed);
        assert_eq!(latest_image(&b.view).as_deref(), Some("rover/env:2"));
        let (span, meta) = recorded_task(&b.view, wf).expect("recorded");
        assert_eq!(
            (span.action_id, meta.branch_name.as_deref()),
            (Some(wf), Some("rover/a"))
        );
        assert!(recorded_task(&b.view, Uuid::new_v4()).is_none());
    }
}
