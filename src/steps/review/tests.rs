use super::*;
use crate::steps::history::testing::task_review as review;
use crate::store::{AgentUsage, SpanStatus};

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

#[test]
fn trace_shows_each_verdict_and_finding_of_the_span_record_without_control_characters() {
    let mut b = crate::steps::history::testing::Builder::new();
    let mut changes = review("rover/a", "0123456789abcdef", ReviewVerdict::Changes);
    changes.findings[0].what = "no test\u{1b}[31m for --json".into();
    let carried = TaskReview {
        carried: true,
        ..review("rover/b", "fedcba9876543210", ReviewVerdict::Approve)
    };
    b.review(SpanStatus::Completed, vec![carried, changes]);
    let span = b.view.spans.last().unwrap();
    let shown = crate::trace::review_lines(span, "| ");
    assert_eq!(
        shown,
        "| approve: task on rover/b at fedcba987654 (approved earlier at this head): read it\n\
         | changes: task on rover/a at 0123456789ab: read it\n\
         |   - src/main.rs:12: no test[31m for --json (criterion: has a test)\n"
    );
}

#[test]
fn what_is_handed_on_of_a_reviewers_answer_is_bounded_and_on_one_line_per_finding() {
    let mut long = review("rover/a", "aaaa", ReviewVerdict::Changes);
    let finding = long.findings[0].clone();
    long.findings = (0..25)
        .map(|_| crate::agents::ReviewFinding {
            what: format!("line one\nline two {}", "x".repeat(5000)),
            ..finding.clone()
        })
        .collect();
    long.summary = format!("first\n{}", "y".repeat(5000));
    let text = long.findings_text();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), crate::steps::meta::MAX_FINDINGS_HANDED + 1);
    assert_eq!(lines.last().unwrap(), &"- ... and 5 more findings");
    assert!(
        lines[0].starts_with("- src/main.rs:12: line one line two xxx"),
        "{}",
        lines[0]
    );
    assert!(
        lines[0].chars().count() < 3 * crate::steps::meta::MAX_FIELD_CHARS,
        "{}",
        lines[0].len()
    );
    let summary = long.summary_line();
    assert!(
        summary.starts_with("first y") && summary.ends_with('…'),
        "{summary}"
    );
    assert_eq!(
        summary.chars().count(),
        crate::steps::meta::MAX_FIELD_CHARS + 1
    );
}
