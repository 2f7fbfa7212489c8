//! What a person's review teaches: a `pull_request_review` that asked for changes (the root
//! event of its trace, `changes_requested`), handled by an iteration of the pull request's task
//! that completed, and confirmed by a later merge of that pull request or a person's approval
//! of it, in the same trace (a merge rover made, a `/rover merge`) or in a later one (an
//! `approved` review, the pull request closed merged). Read from the typed event and spans;
//! whether each trace's author passed the trust check is the caller's to ask
//! ([`super::trusted_author`]).

use uuid::Uuid;

use super::lessons::one_line;
use crate::github::{EventAction, EventKind, NormalizedEvent};
use crate::steps::meta::{
    self, EventMeta, Intervention, MergeOutcome, MergeSpanMeta, WorkflowMeta,
};
use crate::store::{Span, SpanStatus, StepKind, TraceView};

/// A person's review that asked for changes, and what confirmed the changes made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PersonReviewFix {
    /// The reviewer's login.
    pub reviewer: String,
    pub pr_number: u64,
    /// What the review said, on one line (untrusted text: a person wrote it on GitHub).
    pub findings: String,
    /// The trace of the review, its root span and the run that iterated on its findings.
    pub asked_trace: Uuid,
    pub asked: Uuid,
    pub iterated: Uuid,
    /// The span that confirmed it (a merge, an approval, the approving event's root) and
    /// what it concluded: `approved` or `merged`.
    pub confirmed: Uuid,
    pub conclusion: &'static str,
    /// The title of the task iterated on.
    pub task: String,
}

/// The GitHub event at the root of `view`.
fn root_event(view: &TraceView) -> Option<(&Span, NormalizedEvent)> {
    let root = view.root()?;
    Some((root, EventMeta::of(root).ok()?.event?))
}

/// The pull request a trace's root event approved or merged, if it is one: an `approved`
/// review, or the pull request closed merged.
pub fn confirms_pull_request(view: &TraceView) -> Option<u64> {
    let (_, event) = root_event(view)?;
    let approved = event.kind == EventKind::PullRequestReview
        && event.review_state.as_deref() == Some("approved");
    let merged = event.kind == EventKind::PullRequest
        && event.action == Some(EventAction::Closed)
        && event.merged == Some(true);
    (approved || merged).then_some(event.number?)
}

/// The review that asked for changes at the root of `view`, and the completed run that
/// iterated on the pull request's task after it.
fn asked(view: &TraceView) -> Option<(&Span, NormalizedEvent, &Span, String)> {
    let (root, event) = root_event(view)?;
    if event.kind != EventKind::PullRequestReview
        || event.review_state.as_deref() != Some("changes_requested")
        || event.body.as_deref().is_none_or(|b| b.trim().is_empty())
    {
        return None;
    }
    let (run, task) = view
        .spans
        .iter()
        .filter(|s| s.step == StepKind::Workflow && s.status == SpanStatus::Completed)
        .find_map(|s| {
            let action = view.actions.iter().find(|a| Some(a.id) == s.action_id)?;
            let task = meta::read::<WorkflowMeta>(action).ok()?;
            task.iterate_on.is_some().then_some((s, task.title))
        })?;
    Some((root, event, run, task))
}

/// What in `confirmed` (the review's own trace or a later one) confirms the changes made on
/// pull request `number` after `run`: its span and `approved` or `merged`.
fn confirmation<'v>(
    confirmed: &'v TraceView,
    same_trace: bool,
    number: u64,
    run: &Span,
) -> Option<(&'v Span, &'static str)> {
    let after = run.completed.unwrap_or(run.timestamp);
    if !same_trace {
        let root = confirmed.root().filter(|r| r.timestamp >= after)?;
        let (_, event) = root_event(confirmed)?;
        let conclusion = if event.kind == EventKind::PullRequestReview {
            "approved"
        } else {
            "merged"
        };
        return (confirms_pull_request(confirmed) == Some(number)).then_some((root, conclusion));
    }
    confirmed
        .spans
        .iter()
        .filter(|s| s.timestamp >= after)
        .find_map(|s| {
            let merged = s.step == StepKind::Merge
                && MergeSpanMeta::of(s).merge_outcome == Some(MergeOutcome::Merged)
                && MergeSpanMeta::of(s).pr_number == Some(number);
            if merged {
                return Some((s, "merged"));
            }
            (Intervention::of(s) == Some(Intervention::Approve)).then_some((s, "approved"))
        })
}

/// The person's review at the root of `asked` that asked for changes, handled by an iteration
/// and confirmed in `confirmed` (the same trace, or a later trace whose root event approved or
/// merged the pull request). None when any of it is missing.
pub fn person_review_fix(asked_view: &TraceView, confirmed: &TraceView) -> Option<PersonReviewFix> {
    let (root, event, run, task) = asked(asked_view)?;
    let number = event.number?;
    let same = asked_view.trace_id() == confirmed.trace_id();
    let (span, conclusion) = confirmation(confirmed, same, number, run)?;
    Some(PersonReviewFix {
        reviewer: one_line(&event.actor),
        pr_number: number,
        findings: one_line(event.body.as_deref().unwrap_or_default()),
        asked_trace: asked_view.trace_id(),
        asked: root.id,
        iterated: run.id,
        confirmed: span.id,
        conclusion,
        task,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::steps::history::testing::Builder;
    use crate::steps::meta::WorkflowMeta;
    use crate::store::Meta;

    #[test]
    fn a_review_that_asked_for_changes_iterated_and_merged_is_a_fix() {
        let mut b = Builder::new();
        b.review_event(7, "alice", "changes_requested", "Add a CHANGELOG entry.");
        assert!(
            person_review_fix(&b.view, &b.view).is_none(),
            "no iteration yet"
        );
        let run = b.workflow(
            &WorkflowMeta {
                title: "Parse csv".into(),
                iterate_on: Some(Uuid::new_v4()),
                ..WorkflowMeta::default()
            },
            SpanStatus::Completed,
        );
        assert!(
            person_review_fix(&b.view, &b.view).is_none(),
            "not merged yet"
        );
        let merge = b.span(
            StepKind::Merge,
            SpanStatus::Completed,
            Meta::new(),
            crate::store::to_meta(&MergeSpanMeta {
                merge_outcome: Some(MergeOutcome::Merged),
                pr_number: Some(7),
                ..MergeSpanMeta::default()
            }),
        );
        let fix = person_review_fix(&b.view, &b.view).expect("a fix");
        assert_eq!(fix.reviewer, "alice");
        assert_eq!(fix.pr_number, 7);
        assert_eq!(fix.findings, "Add a CHANGELOG entry.");
        assert_eq!(
            fix.asked,
            b.view.trace_id(),
            "the root span's id is the trace's"
        );
        assert_eq!(fix.iterated, b.span_of(run));
        assert_eq!(fix.confirmed, b.span_of(merge));
        assert_eq!(fix.conclusion, "merged");
        assert_eq!(fix.task, "Parse csv");
    }

    #[test]
    fn a_later_approval_of_the_same_pull_request_confirms_it_and_another_does_not() {
        let mut asked = Builder::new();
        asked.review_event(7, "alice", "changes_requested", "Quote the fields.");
        asked.workflow(
            &WorkflowMeta {
                title: "Parse csv".into(),
                iterate_on: Some(Uuid::new_v4()),
                ..WorkflowMeta::default()
            },
            SpanStatus::Completed,
        );
        let later = |number: u64, state: &str| {
            let mut b = Builder::new();
            b.clock = asked.clock + chrono::TimeDelta::minutes(5);
            b.review_event(number, "alice", state, "Looks good.");
            b
        };
        let approved = later(7, "approved");
        let fix = person_review_fix(&asked.view, &approved.view).expect("a fix");
        assert_eq!(fix.conclusion, "approved");
        assert_eq!(fix.confirmed, approved.view.trace_id());
        assert_eq!(fix.asked_trace, asked.view.trace_id());
        assert!(person_review_fix(&asked.view, &later(8, "approved").view).is_none());
        assert!(person_review_fix(&asked.view, &later(7, "commented").view).is_none());
        // A review that only commented asked for nothing.
        let mut commented = Builder::new();
        commented.review_event(7, "alice", "commented", "Nice.");
        assert!(person_review_fix(&commented.view, &approved.view).is_none());
    }
}
