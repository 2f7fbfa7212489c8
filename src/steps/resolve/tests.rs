use std::collections::BTreeMap;

use serde_json::Value;

use super::*;
use crate::agents::RetryStep;
use crate::steps::history::testing::Builder;
use crate::steps::meta::{Decision, ResolveQuickExit, ResolveSpanMeta, WorkflowMeta};
use crate::store::{Meta, SpanStatus};

fn mapping(trace: Uuid, branch: &str) -> TaskMapping {
    TaskMapping::new(branch, branch, trace, Uuid::new_v4())
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
    let wf = b.workflow(&task, SpanStatus::Failed);
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
    let decided = decide(&b.view, &mappings, &result, false).expect("decided");
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
    let decided = decide(&b.view, &BTreeMap::new(), &result, false).expect("decided");
    assert_eq!(decided.decision, ResolveDecision::Fail);
    let next = &decided.finished.actions[0];
    assert_eq!(next.kind, StepKind::Notify);
    assert_eq!(next.meta["purpose"], Value::from("failure"));
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

fn answer(decision: ResolveDecision) -> ResolveResult {
    ResolveResult {
        decision,
        reasoning: "CI is still running".into(),
        instructions: None,
        retry_step: None,
        message: None,
        corrective_commands: Vec::new(),
    }
}

#[test]
fn a_wait_is_scheduled_until_the_trace_used_its_waits_then_it_fails() {
    let mut b = Builder::new();
    let wait = answer(ResolveDecision::Wait);
    let (finished, meta) = decision::scheduled_wait(&b.view, &wait, 60, 2);
    assert_eq!(meta.decision.decision, Some(Decision::Wait));
    assert_eq!(meta.wait.map(|w| w.round), Some(1));
    assert_eq!(finished.actions[0].kind, StepKind::Resolve);
    // Written as the word it always was.
    let written = crate::store::to_meta(&ResolveSpanMeta {
        decision: decision::decision_meta(ResolveDecision::Wait),
        ..ResolveSpanMeta::default()
    });
    assert_eq!(written["decision"], Value::from("wait"));
    b.span(
        StepKind::Resolve,
        SpanStatus::Completed,
        Meta::new(),
        written.clone(),
    );
    let (_, meta) = decision::scheduled_wait(&b.view, &wait, 60, 2);
    assert_eq!(meta.wait.map(|w| w.round), Some(2));
    b.span(
        StepKind::Resolve,
        SpanStatus::Completed,
        Meta::new(),
        written,
    );
    let (finished, meta) = decision::scheduled_wait(&b.view, &wait, 60, 2);
    assert_eq!(meta.decision.decision, Some(Decision::Fail));
    assert_eq!(meta.quick_exit, Some(ResolveQuickExit::MaxWaits));
    assert_eq!(finished.actions[0].kind, StepKind::Notify);
}

fn review_changes(workflow: Uuid) -> crate::steps::meta::ReviewChanges {
    crate::steps::meta::ReviewChanges {
        span_id: Uuid::new_v4(),
        workflow_action_id: workflow,
        branch: "rover/parser".into(),
        title: "parser".into(),
        findings: "- src/p.rs:3: no test (criterion: tested)\n".into(),
    }
}

#[test]
fn a_review_asking_for_changes_iterates_on_its_task_with_the_findings_and_counts_as_an_iterate() {
    let mut b = Builder::new();
    let trace = b.view.trace_id();
    let task = WorkflowMeta {
        title: "parser".into(),
        acceptance_criteria: vec!["tested".into()],
        ..WorkflowMeta::default()
    };
    let wf = b.workflow(&task, SpanStatus::Completed);
    b.commit(wf, SpanStatus::Completed);
    let mappings: BTreeMap<String, TaskMapping> =
        [(wf.to_string(), mapping(trace, "rover/parser"))]
            .into_iter()
            .collect();
    let finished = decision::iterate_on_review(
        &b.view,
        &mappings,
        &review_changes(wf),
        quick::Retries { used: 0, max: 3 },
    );
    let next = &finished.actions[0];
    assert_eq!(next.kind, StepKind::Workflow);
    let again: WorkflowMeta = crate::store::from_meta(&next.meta).expect("meta");
    assert_eq!(again.iterate_on, Some(wf));
    assert_eq!(again.branch.as_deref(), Some("rover/parser"));
    assert_eq!(again.acceptance_criteria, ["tested"]);
    let instructions = again.instructions.unwrap();
    assert!(instructions.contains("<untrusted-data"), "{instructions}");
    assert!(
        instructions.contains("- src/p.rs:3: no test (criterion: tested)"),
        "{instructions}"
    );
    let span = ResolveSpanMeta::read(&finished.meta).unwrap();
    assert_eq!(span.quick_exit, Some(ResolveQuickExit::ReviewChanges));
    assert_eq!(span.decision.decision, Some(Decision::Iterate));
    // Recorded so, it counts against maxRetries like any iterate.
    b.span(
        StepKind::Resolve,
        SpanStatus::Completed,
        Meta::new(),
        finished.meta.clone(),
    );
    assert_eq!(crate::steps::history::retries_so_far(&b.view), 1);
}

#[test]
fn a_review_asking_for_changes_past_max_retries_gives_up_with_the_findings_in_the_answer() {
    let mut b = Builder::new();
    let wf = b.workflow(&WorkflowMeta::default(), SpanStatus::Completed);
    let finished = decision::iterate_on_review(
        &b.view,
        &BTreeMap::new(),
        &review_changes(wf),
        quick::Retries { used: 2, max: 2 },
    );
    let next = &finished.actions[0];
    assert_eq!(next.kind, StepKind::Notify);
    let message = next.meta["message"].as_str().unwrap();
    assert!(
        message.starts_with("gave up after 2 iterate/retry attempts"),
        "{message}"
    );
    assert!(
        message.contains("- src/p.rs:3: no test (criterion: tested)"),
        "{message}"
    );
    let span = ResolveSpanMeta::read(&finished.meta).unwrap();
    assert_eq!(span.decision.decision, Some(Decision::Fail));
}

#[test]
fn a_push_goes_through_the_self_review_unless_the_last_one_gave_no_verdict() {
    let mut b = Builder::new();
    let trace = b.view.trace_id();
    let wf = b.workflow(&WorkflowMeta::default(), SpanStatus::Completed);
    b.commit(wf, SpanStatus::Completed);
    let mappings: BTreeMap<String, TaskMapping> = [(wf.to_string(), mapping(trace, "rover/x"))]
        .into_iter()
        .collect();
    let push = ResolveResult {
        decision: ResolveDecision::Push,
        reasoning: "done".into(),
        instructions: None,
        retry_step: None,
        message: None,
        corrective_commands: Vec::new(),
    };
    let kind = |view: &TraceView, on: bool| {
        decide(view, &mappings, &push, on).unwrap().finished.actions[0]
            .kind
            .clone()
    };
    assert_eq!(kind(&b.view, false), StepKind::Push);
    assert_eq!(kind(&b.view, true), StepKind::Review);
    b.bare(StepKind::Review, SpanStatus::Failed);
    assert_eq!(kind(&b.view, true), StepKind::Push);
}
