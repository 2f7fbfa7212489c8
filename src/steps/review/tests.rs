use super::*;
use crate::agents::ReviewFinding;
use crate::steps::history::testing::Builder;
use crate::store::{AgentUsage, SpanStatus};

fn review(branch: &str, head: &str, verdict: ReviewVerdict) -> TaskReview {
    TaskReview {
        workflow_action_id: Uuid::new_v4(),
        title: format!("task on {branch}"),
        branch: branch.to_owned(),
        head: head.to_owned(),
        criteria: vec!["prints --json".into(), "has a test".into()],
        verdict,
        summary: "read it".into(),
        findings: if verdict == ReviewVerdict::Changes {
            vec![ReviewFinding {
                file: "src/main.rs".into(),
                line: Some(12),
                what: "no test for --json".into(),
                why: "criterion: has a test".into(),
            }]
        } else {
            Vec::new()
        },
        container: Some("rover-x-review-0".into()),
        agent: None,
        carried: false,
    }
}

fn review_span(b: &mut Builder, status: SpanStatus, reviews: Vec<TaskReview>) -> Uuid {
    let meta = ReviewSpanMeta {
        reviews,
        agent: None,
    };
    b.span(StepKind::Review, status, Meta::new(), meta.to_meta())
}

use crate::store::Meta;

#[test]
fn every_task_approved_goes_to_the_push_with_the_branches_the_resolver_chose() {
    let asked = ReviewMeta {
        branches: vec!["rover/a".into(), "rover/b".into()],
    };
    let meta = ReviewSpanMeta {
        reviews: vec![
            review("rover/a", "aaaa", ReviewVerdict::Approve),
            TaskReview {
                carried: true,
                ..review("rover/b", "bbbb", ReviewVerdict::Approve)
            },
        ],
        agent: None,
    };
    let done = finished(&asked, &meta, Uuid::new_v4());
    assert_eq!(done.status, SpanStatus::Completed);
    assert!(
        done.summary
            .starts_with("approve: 1 task(s) read, 1 approved earlier"),
        "{}",
        done.summary
    );
    let next = &done.actions[0];
    assert_eq!(next.kind, StepKind::Push);
    let push: PushMeta = crate::store::from_meta(&next.meta).unwrap();
    assert_eq!(push.branches, asked.branches);
}

#[test]
fn a_changes_verdict_hands_the_resolver_the_task_and_its_findings() {
    let asked = ReviewMeta {
        branches: vec!["rover/a".into()],
    };
    let changes = review("rover/a", "aaaa", ReviewVerdict::Changes);
    let span_id = Uuid::new_v4();
    let done = finished(
        &asked,
        &ReviewSpanMeta {
            reviews: vec![changes.clone()],
            agent: None,
        },
        span_id,
    );
    assert!(
        done.summary
            .starts_with("changes: task on rover/a (1 finding)"),
        "{}",
        done.summary
    );
    let next = &done.actions[0];
    assert_eq!(next.kind, StepKind::Resolve);
    let resolve: ResolveMeta = crate::store::from_meta(&next.meta).unwrap();
    let handed = resolve.review.expect("the findings are handed on");
    assert_eq!(handed.span_id, span_id);
    assert_eq!(handed.workflow_action_id, changes.workflow_action_id);
    assert_eq!(handed.branch, "rover/a");
    assert_eq!(
        handed.findings,
        "- src/main.rs:12: no test for --json (criterion: has a test)\n"
    );
}

#[test]
fn only_an_approval_of_the_same_head_on_the_same_branch_is_carried() {
    let mut b = Builder::new();
    review_span(
        &mut b,
        SpanStatus::Completed,
        vec![
            review("rover/a", "aaaa", ReviewVerdict::Approve),
            review("rover/b", "bbbb", ReviewVerdict::Changes),
        ],
    );
    assert!(approved_before(&b.view, "rover/a", "aaaa").is_some());
    assert!(
        approved_before(&b.view, "rover/a", "a2a2").is_none(),
        "a new head is read again"
    );
    assert!(
        approved_before(&b.view, "rover/b", "bbbb").is_none(),
        "changes are no approval"
    );
    assert!(approved_before(&b.view, "rover/c", "aaaa").is_none());
}

#[test]
fn a_review_without_verdict_since_the_last_commit_lets_the_next_push_go_unreviewed() {
    let mut b = Builder::new();
    let wf = b.bare(StepKind::Workflow, SpanStatus::Completed);
    b.commit(wf, SpanStatus::Completed);
    assert!(!failed_since_last_commit(&b.view));
    review_span(&mut b, SpanStatus::Failed, Vec::new());
    assert!(failed_since_last_commit(&b.view));
    // A new commit calls for a review again.
    b.commit(wf, SpanStatus::Completed);
    assert!(!failed_since_last_commit(&b.view));
    review_span(
        &mut b,
        SpanStatus::Completed,
        vec![review("rover/a", "a", ReviewVerdict::Approve)],
    );
    assert!(!failed_since_last_commit(&b.view));
}

#[test]
fn the_pull_request_section_lists_the_criteria_checked_and_the_rounds_of_changes() {
    let mut b = Builder::new();
    assert_eq!(pr_section(&b.view), None);
    review_span(
        &mut b,
        SpanStatus::Completed,
        vec![review("rover/a", "aaaa111", ReviewVerdict::Changes)],
    );
    assert_eq!(pr_section(&b.view), None, "no approval yet");
    review_span(
        &mut b,
        SpanStatus::Completed,
        vec![review(
            "rover/a",
            "bbbb2222333344445555",
            ReviewVerdict::Approve,
        )],
    );
    let section = pr_section(&b.view).expect("a section");
    assert!(section.starts_with("## Self-review\n"), "{section}");
    assert!(
        section.contains("- **task on rover/a** (`bbbb22223333`): approved after one round of changes. read it\n"),
        "{section}"
    );
    assert!(
        section.contains("  - [x] prints --json\n  - [x] has a test\n"),
        "{section}"
    );
}

#[test]
fn the_span_counts_every_call_it_made_for_the_budget() {
    let call = |usd: f64, input: u64| {
        AgentMeta::Used(AgentUsage {
            turns: Some(2),
            cost_usd: Some(usd),
            input_tokens: input,
            output_tokens: 10,
            ..AgentUsage::default()
        })
    };
    let total = add_usage(None, &call(0.5, 100));
    let total = add_usage(Some(total), &call(0.25, 50));
    let usage = total.usage().unwrap();
    assert_eq!(usage.cost_usd, Some(0.75));
    assert_eq!(usage.input_tokens, 150);
    assert_eq!(usage.output_tokens, 20);
    assert_eq!(usage.turns, Some(4));
    let failed = AgentMeta::Failed(crate::store::AgentFailure {
        error: "boom".into(),
        error_class: "invalidAnswer".into(),
    });
    assert_eq!(add_usage(Some(total.clone()), &failed), total);
}
