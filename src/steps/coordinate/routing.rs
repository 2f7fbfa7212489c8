//! The one action an agent's decision becomes, and the task mappings it was shown.

use std::fmt::Write as _;

use super::rover_pr::RoverPr;
use super::{Gathered, WaitPolicy};
use crate::agents::{untrusted_block, CoordinateDecision, CoordinateResult};
use crate::orchestrator::NextAction;
use crate::steps::agent_call::MappedTask;
use crate::steps::meta::{
    workflow_meta, CoordinateMeta, NoopMeta, NotifyMeta, NotifyPurpose, PlanMeta, WaitMeta,
    WAIT_PREFIX,
};
use crate::store::StepKind;

/// Rover's task mappings for the prompt, their names in untrusted blocks: task ids come from
/// the planner, branch names from task titles and events.
pub(super) fn render_mappings(mappings: &[MappedTask], rover_pr: Option<&RoverPr>) -> String {
    let mut out = String::new();
    if let Some(pr) = rover_pr {
        let tasks = pr
            .tasks
            .iter()
            .map(|(_, t)| format!("`{t}`"))
            .collect::<Vec<_>>()
            .join(", ");
        let _ = writeln!(
            out,
            "This event is about a pull request rover opened: its head branch belongs to rover's task(s).\n{}\n",
            untrusted_block(
                "the pull request's branch and tasks",
                &format!("head branch `{}`, task(s) {tasks}", pr.branch)
            )
        );
    }
    if mappings.is_empty() {
        out.push_str("(rover owns no tasks right now)\n");
        return out;
    }
    let mut list = String::new();
    for MappedTask {
        key, mapping: m, ..
    } in mappings
    {
        let _ = writeln!(
            list,
            "- task `{}`: branch `{}` (workflow action {key}, trace {})",
            m.task_id, m.branch_name, m.trace_id
        );
    }
    out.push_str(&untrusted_block("rover's task mappings", &list));
    out
}

/// The one action for the agent's decision.
pub(super) fn route(
    result: &CoordinateResult,
    gathered: &Gathered,
    mappings: &[MappedTask],
    policy: WaitPolicy,
) -> NextAction {
    let reasoning = result.reasoning.trim();
    let text = |v: &Option<String>| v.as_deref().unwrap_or_default().trim().to_owned();
    match result.decision {
        CoordinateDecision::Noop => {
            NextAction::new(StepKind::Noop, reasoning).with_meta(&NoopMeta::default())
        }
        CoordinateDecision::Plan => {
            let pr = gathered.rover_pr.as_ref();
            NextAction::new(StepKind::Plan, reasoning).with_meta(&PlanMeta {
                directive: text(&result.directive),
                existing_task: pr.and_then(RoverPr::existing_task),
                branch: pr.map(|p| p.branch.clone()),
            })
        }
        CoordinateDecision::Workflow => match &result.task {
            Some(task) => {
                let mut meta = workflow_meta(task, Vec::new());
                if let Some(pr) = &gathered.rover_pr {
                    meta.iterate_on = pr.existing_task();
                    meta.branch = Some(pr.branch.clone());
                }
                NextAction::new(StepKind::Workflow, format!("{}: {}", task.title, reasoning))
                    .with_meta(&meta)
            }
            // `validate` requires a task; kept total for safety.
            None => NextAction::new(
                StepKind::Noop,
                format!("the coordinator chose a workflow without a task: {reasoning}"),
            )
            .with_meta(&NoopMeta::default()),
        },
        CoordinateDecision::Notify => {
            NextAction::new(StepKind::Notify, reasoning).with_meta(&NotifyMeta {
                purpose: NotifyPurpose::Answer,
                message: Some(text(&result.message)),
                ..NotifyMeta::default()
            })
        }
        CoordinateDecision::Flag => NextAction::new(
            StepKind::Notify,
            format!("flagged for a human: {}", text(&result.condition)),
        )
        .with_meta(&NotifyMeta {
            purpose: NotifyPurpose::Flag,
            message: Some(format!(
                "A maintainer should take a look before rover does anything here: {}",
                text(&result.condition)
            )),
            ..NotifyMeta::default()
        }),
        CoordinateDecision::Wait => {
            let condition = text(&result.condition);
            let round = gathered.wait_round + 1;
            if round > policy.max {
                return NextAction::new(
                    StepKind::Noop,
                    format!(
                        "{WAIT_PREFIX} {condition} (not re-evaluated again: this trace already waited {} time(s), the most `pipeline.maxWaits` allows)",
                        gathered.wait_round
                    ),
                )
                .with_meta(&NoopMeta {
                    waiting_for: Some(condition),
                    subject: gathered.subject.clone(),
                    ..NoopMeta::default()
                });
            }
            let secs = i64::try_from(policy.secs).unwrap_or(i64::MAX);
            let at =
                policy.now + chrono::Duration::try_seconds(secs).unwrap_or(chrono::Duration::MAX);
            let woken_by = gathered.subject.as_deref().map_or_else(String::new, |s| {
                format!(", or sooner by the next event about {s}")
            });
            NextAction::new(
                StepKind::Coordinate,
                format!(
                    "{WAIT_PREFIX} {condition} (re-evaluated at {}{woken_by})",
                    at.format("%Y-%m-%d %H:%M:%S UTC")
                ),
            )
            .with_meta(&CoordinateMeta {
                wait: Some(WaitMeta {
                    condition,
                    subject: gathered.subject.clone(),
                    head_sha: gathered.head_sha.clone(),
                    since: policy.now,
                    round,
                }),
                ci: None,
                not_before: Some(at),
            })
        }
        CoordinateDecision::Cleanup => {
            let wanted = text(&result.task_id);
            let mut cleanup = gathered
                .rover_pr
                .as_ref()
                .map(RoverPr::cleanup)
                .unwrap_or_default();
            for t in mappings {
                if t.mapping.task_id == wanted || t.key == wanted {
                    if let Some(id) = t.workflow_action_id {
                        if !cleanup.tasks.contains(&id) {
                            cleanup.tasks.push(id);
                        }
                    }
                    cleanup
                        .branch
                        .get_or_insert_with(|| t.mapping.branch_name.clone());
                }
            }
            if cleanup.tasks.is_empty() {
                NextAction::new(
                    StepKind::Noop,
                    format!("the coordinator asked to clean up task `{wanted}`, which rover does not know: {reasoning}"),
                )
                .with_meta(&NoopMeta::default())
            } else {
                NextAction::new(StepKind::Cleanup, reasoning).with_meta(&cleanup)
            }
        }
    }
}
