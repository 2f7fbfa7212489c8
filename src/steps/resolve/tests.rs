use chrono::{DateTime, TimeDelta, Utc};
use serde_json::Value;

use super::decision::decision_name;
use super::past::committed_branches;
use super::*;
use crate::agents::RetryStep;
use crate::steps::meta::{self, CommitMeta, SecretsFound, WorkflowMeta};
use crate::store::{Action, Meta, Span, SpanStatus, TraceIndex};

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
