//! What the trace's self-reviews said: an approval a new review carries over, a review that
//! gave no verdict since the last commit, and what the pull request body says was checked.

use crate::agents::ReviewVerdict;
use crate::steps::meta::{ReviewSpanMeta, TaskReview};
use crate::store::{Span, SpanStatus, StepKind, TraceView};

/// An approval of `head` on `branch` by an earlier review of the trace.
pub fn approved_before(view: &TraceView, branch: &str, head: &str) -> Option<TaskReview> {
    view.spans
        .iter()
        .rev()
        .filter_map(ReviewSpanMeta::of)
        .flat_map(|m| m.reviews)
        .find(|r| r.branch == branch && r.head == head && r.verdict == ReviewVerdict::Approve)
}

/// Whether the latest review of the trace after its last completed commit gave no verdict
/// (failed or errored): a push the resolver decides then goes without another review.
pub fn review_failed_since_last_commit(view: &TraceView) -> bool {
    let last_commit = view
        .spans
        .iter()
        .filter(|s| s.step == StepKind::Commit && s.status.is_final())
        .filter_map(|s| s.completed)
        .max();
    latest_review(view)
        .filter(|s| last_commit.is_none_or(|c| s.timestamp >= c))
        .is_some_and(|s| matches!(s.status, SpanStatus::Failed | SpanStatus::Error))
}

fn latest_review(view: &TraceView) -> Option<&Span> {
    view.spans
        .iter()
        .rev()
        .find(|s| s.step == StepKind::Review && s.status.is_final())
}

/// What the pull request body says of the self-review: each task the latest review approved,
/// at which head, against what, and after how many rounds of changes. `None` without one.
pub fn self_review_section(view: &TraceView) -> Option<String> {
    let latest = ReviewSpanMeta::of(latest_review(view)?)?;
    if latest.reviews.is_empty() || latest.changes().is_some() {
        return None;
    }
    let mut text = String::from("## Self-review\n\nrover's reviewer read each task's diff against its acceptance criteria before the push:\n\n");
    for review in &latest.reviews {
        let rounds = view
            .spans
            .iter()
            .filter_map(ReviewSpanMeta::of)
            .filter_map(|m| m.changes().cloned())
            .filter(|c| c.branch == review.branch)
            .count();
        let after = match rounds {
            0 => String::new(),
            1 => " after one round of changes".to_owned(),
            n => format!(" after {n} rounds of changes"),
        };
        let _ = std::fmt::Write::write_fmt(
            &mut text,
            format_args!(
                "- **{}** (`{}`): approved{after}. {}\n",
                review.title.trim(),
                crate::git::short_sha(&review.head),
                review.summary_line()
            ),
        );
        for criterion in &review.criteria {
            let _ = std::fmt::Write::write_fmt(
                &mut text,
                format_args!("  - [x] {}\n", criterion.trim()),
            );
        }
    }
    Some(text)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::steps::history::testing::{task_review as review, Builder};

    #[test]
    fn only_an_approval_of_the_same_head_on_the_same_branch_is_carried() {
        let mut b = Builder::new();
        b.review(
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
        assert!(!review_failed_since_last_commit(&b.view));
        b.review(SpanStatus::Failed, Vec::new());
        assert!(review_failed_since_last_commit(&b.view));
        // A new commit calls for a review again.
        b.commit(wf, SpanStatus::Completed);
        assert!(!review_failed_since_last_commit(&b.view));
        b.review(
            SpanStatus::Completed,
            vec![review("rover/a", "a", ReviewVerdict::Approve)],
        );
        assert!(!review_failed_since_last_commit(&b.view));
    }

    #[test]
    fn the_pull_request_section_lists_the_criteria_checked_and_the_rounds_of_changes() {
        let mut b = Builder::new();
        assert_eq!(self_review_section(&b.view), None);
        b.review(
            SpanStatus::Completed,
            vec![review("rover/a", "aaaa111", ReviewVerdict::Changes)],
        );
        assert_eq!(self_review_section(&b.view), None, "no approval yet");
        b.review(
            SpanStatus::Completed,
            vec![review(
                "rover/a",
                "bbbb2222333344445555",
                ReviewVerdict::Approve,
            )],
        );
        let section = self_review_section(&b.view).expect("a section");
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
}
