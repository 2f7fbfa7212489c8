//! From the agent's answer (or a rule) to the one action the trace goes on with.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use crate::agents::{ResolveDecision, ResolveResult, RetryStep};
use crate::orchestrator::{Finished, NextAction, StepError};
use crate::steps::history::{
    committed_branches, conflict_unchanged, failed_workflow, has_review_workflow, last_failure,
    latest_conflict, latest_workflow_on_branch, resolver_waits, retry_target,
};
use crate::steps::meta;
use crate::steps::meta::{
    DecisionSpanMeta, NotifyMeta, NotifyPurpose, PushConflict, PushMeta, ResolveQuickExit,
    ResolveSpanMeta, ResolveWaitMeta, ReviewChanges, ReviewMeta, WorkflowMeta,
};
use crate::store::{StepKind, TaskMapping, TraceView};

/// The finished span and actions for an agent's decision, and the decision taken (`fail` when
/// the agent's decision could not be carried out).
pub(super) struct Decided {
    pub(super) finished: Finished,
    pub(super) decision: ResolveDecision,
    /// What the decision wrote so far of the span's meta (`process` adds the answer's part).
    pub(super) span_meta: ResolveSpanMeta,
}

impl Decided {
    pub(super) fn new(finished: Finished, decision: ResolveDecision) -> Decided {
        Decided {
            finished,
            decision,
            span_meta: ResolveSpanMeta::default(),
        }
    }
}

/// The span meta's `decision` part for `decision`.
pub(super) fn decision_meta(decision: ResolveDecision) -> DecisionSpanMeta {
    DecisionSpanMeta {
        decision: Some(decision.into()),
        ..DecisionSpanMeta::default()
    }
}

pub(super) fn fail_finished(view: &TraceView, summary: String, why: &str) -> Finished {
    let failed_step = last_failure(view).map_or(StepKind::Resolve, |s| s.step.clone());
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
pub(super) fn scheduled_wait(
    view: &TraceView,
    result: &ResolveResult,
    secs: u64,
    max: u32,
) -> (Finished, ResolveSpanMeta) {
    let reasoning = result.reasoning.trim();
    let waits = resolver_waits(view);
    let round = waits.saturating_add(1);
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
    .with_meta(&crate::steps::meta::ResolveMeta {
        not_before: Some(at),
        ..crate::steps::meta::ResolveMeta::default()
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

/// Iterate on the task whose branch conflicts: rover merges the other side into its worktree
/// (conflict markers left in the files) and the agent resolves them, keeping both changes.
pub(super) fn iterate_on_conflict(
    view: &TraceView,
    mappings: &BTreeMap<String, TaskMapping>,
    conflict: &PushConflict,
    result: &ResolveResult,
) -> Option<Decided> {
    let reasoning = result.reasoning.trim();
    // The latest workflow on the conflicting branch (an iteration reuses its branch).
    let (id, original) = latest_workflow_on_branch(view, mappings, &conflict.source_branch)?;
    let mut instructions = result.instructions.clone().unwrap_or_default();
    if !instructions.is_empty() {
        instructions.push_str("\n\n");
    }
    let holds = if conflict.base {
        "the base branch its pull request merges into, which moved on since the push"
    } else {
        "which holds the other tasks' work"
    };
    let _ = write!(
        instructions,
        "This task's branch `{}` conflicts with `{}`, {holds}. rover has merged `{}` into this worktree; the conflicting files are: {}. Resolve every conflict marker so that both changes are kept, and make sure the result still does what this task asks.",
        conflict.source_branch,
        conflict.target,
        conflict.target,
        // Paths are the repository's: quoted, a newline in one cannot start a line of the
        // prompt.
        conflict
            .files
            .iter()
            .map(|f| format!("{f:?}"))
            .collect::<Vec<_>>()
            .join(", ")
    );
    let workflow = WorkflowMeta {
        depends_on: Vec::new(),
        iterate_on: Some(id),
        branch: Some(conflict.source_branch.clone()),
        instructions: Some(instructions),
        // The base by its remote-tracking ref (the merge step fetched it); another task's
        // branch by its local name.
        merge_from: Some(if conflict.base {
            format!("refs/remotes/{}", conflict.target)
        } else {
            conflict.target.clone()
        }),
        revert: None,
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

/// The self-review asked for changes to a task: it iterates with the findings as its
/// instructions (no agent is asked: the review is the diagnosis), or, with no iterate left,
/// the trace ends as given up with the findings in its answer.
pub(super) fn iterate_on_review(
    view: &TraceView,
    mappings: &BTreeMap<String, TaskMapping>,
    review: &ReviewChanges,
    retries: super::quick::Retries,
) -> Finished {
    let base = ResolveSpanMeta {
        quick_exit: Some(ResolveQuickExit::ReviewChanges),
        review_span: Some(review.span_id),
        retries: Some(retries.used),
        max_retries: Some(retries.max),
        corrective_commands: Some(Vec::new()),
        ..ResolveSpanMeta::default()
    };
    let findings = review.findings.trim_end();
    let task = latest_workflow_on_branch(view, mappings, &review.branch).or_else(|| {
        view.actions
            .iter()
            .find(|a| a.id == review.workflow_action_id)
            .and_then(|a| meta::read::<WorkflowMeta>(a).ok())
            .map(|m| (review.workflow_action_id, m))
    });
    let gave_up = |why: String| {
        let span_meta = ResolveSpanMeta {
            decision: decision_meta(ResolveDecision::Fail),
            reasoning: Some(why.clone()),
            ..base.clone()
        };
        fail_finished(view, format!("fail: {why}"), &why).with_meta_record(&span_meta)
    };
    if retries.out() {
        return gave_up(format!(
            "gave up after {} iterate/retry attempts (the limit is {}): the self-review still asks for changes to {}:\n{findings}",
            retries.used, retries.max, review.title
        ));
    }
    let Some((id, original)) = task else {
        return gave_up(format!(
            "the self-review asked for changes to {}, but the trace has no such task to iterate on:\n{findings}",
            review.title
        ));
    };
    let instructions = format!(
        "rover's self-review read this change before the push and asked for changes. Make them, and keep what already meets the acceptance criteria. Its findings:\n{}",
        crate::agents::untrusted_block("rover's self-review", findings)
    );
    let workflow = WorkflowMeta {
        depends_on: Vec::new(),
        iterate_on: Some(id),
        branch: Some(review.branch.clone()),
        instructions: Some(instructions.clone()),
        merge_from: None,
        revert: None,
        ..original
    };
    let why = format!("the self-review asked for changes to {}", review.title);
    let span_meta = ResolveSpanMeta {
        decision: decision_meta(ResolveDecision::Iterate),
        reasoning: Some(why.clone()),
        iterate_on: Some(id),
        instructions: Some(Some(instructions)),
        ..base
    };
    Finished::completed(format!("iterate: {why}"))
        .with_meta_record(&span_meta)
        .then(
            NextAction::new(
                StepKind::Workflow,
                format!("iterate on {}: {why}", workflow.title),
            )
            .with_meta(&workflow),
        )
}

/// What the resolver's answer leads to (`wait` is scheduled by [`scheduled_wait`] first);
/// `self_review`: a push goes through the self-review first.
pub(super) fn decide(
    view: &TraceView,
    mappings: &BTreeMap<String, TaskMapping>,
    result: &ResolveResult,
    self_review: bool,
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
            // The self-review reads the work first, unless the last one since the last commit
            // could not give a verdict (the resolver saw why, and decided to push anyway).
            let next =
                if self_review && !crate::steps::history::review_failed_since_last_commit(view) {
                    NextAction::new(
                        StepKind::Review,
                        format!("review the trace's work before the push: {reasoning}"),
                    )
                    .with_meta(&ReviewMeta { branches })
                } else {
                    NextAction::new(
                        StepKind::Push,
                        format!("push the trace's work: {reasoning}"),
                    )
                    .with_meta(&PushMeta { branches })
                };
            Finished::completed(format!("push: {reasoning}")).then(next)
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
                revert: None,
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
pub(super) fn retry_action(
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
    let action = retry_target(view, &kind)?;
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
