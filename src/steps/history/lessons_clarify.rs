//! What a planner's clarification teaches: a plan of one trace that asked a question instead
//! of planning (`decision: clarify`, the question in its span), and a later trace on the same
//! issue or pull request whose event is a person's answer (a comment) and whose plan then
//! planned tasks (`decision: tasks`): the answer unblocked it. Read from the typed plan spans
//! and events; whether each trace's author passed the trust check is the caller's to ask
//! ([`super::trusted_author`]).

use uuid::Uuid;

use super::lessons::one_line;
use crate::github::EventKind;
use crate::steps::meta::{self, Decision, EventMeta, PlanMeta, PlanSpanMeta};
use crate::store::{Span, StepKind, TraceView};

/// A question the planner asked, and the answer after which it planned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Clarified {
    /// The planner's question (untrusted: a model wrote it).
    pub question: String,
    /// The person's answer (untrusted: a person wrote it on GitHub).
    pub answer: String,
    /// The plan that asked (in the asking trace), the answer's event (the answering trace's
    /// root) and the plan that planned after it.
    pub asked: Uuid,
    pub answered: Uuid,
    pub planned: Uuid,
    /// The directive the answering trace planned.
    pub directive: String,
}

/// The issue or pull request number of a trace's GitHub event.
fn subject(view: &TraceView) -> Option<u64> {
    EventMeta::of(view.root()?).ok()?.event?.number
}

/// The latest plan of `view` that decided `decision`.
fn plan_that<'v>(view: &'v TraceView, decision: &Decision) -> Option<(&'v Span, PlanSpanMeta)> {
    view.spans
        .iter()
        .rev()
        .filter(|s| s.step == StepKind::Plan && s.status.is_final())
        .map(|s| (s, PlanSpanMeta::of(s)))
        .find(|(_, m)| m.decided.decision.as_ref() == Some(decision))
}

/// Whether `view` is a person's comment that a plan of the trace turned into tasks: the trace
/// that may answer an earlier clarification (its issue or pull request number).
pub fn planned_after_comment(view: &TraceView) -> Option<u64> {
    let event = EventMeta::of(view.root()?).ok()?.event?;
    let comment = matches!(
        event.kind,
        EventKind::IssueComment | EventKind::PullRequestReviewComment
    );
    (comment && plan_that(view, &Decision::Tasks).is_some()).then_some(event.number?)
}

/// The question `asking` (an earlier trace) asked on the issue or pull request that
/// `answering`'s comment is about, answered by that comment and followed by a plan of tasks.
/// None when either part is missing, or the answer came before the question.
pub fn clarified(asking: &TraceView, answering: &TraceView) -> Option<Clarified> {
    let number = planned_after_comment(answering)?;
    if subject(asking) != Some(number) || asking.trace_id() == answering.trace_id() {
        return None;
    }
    let (asked, meta) = plan_that(asking, &Decision::Clarify)?;
    let question: String = meta.clarification.filter(|q| !q.trim().is_empty())?;
    let root = answering.root()?;
    if root.timestamp < asked.completed.unwrap_or(asked.timestamp) {
        return None;
    }
    let answer = EventMeta::of(root)
        .ok()?
        .event?
        .body
        .filter(|b| !b.trim().is_empty())?;
    let (planned, _) = plan_that(answering, &Decision::Tasks)?;
    let directive = planned
        .action_id
        .and_then(|id| answering.actions.iter().find(|a| a.id == id))
        .and_then(|a| meta::read::<PlanMeta>(a).ok())
        .map(|p| one_line(&p.directive))
        .unwrap_or_default();
    Some(Clarified {
        question: one_line(&question),
        answer: one_line(&answer),
        asked: asked.id,
        answered: root.id,
        planned: planned.id,
        directive,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::steps::history::testing::Builder;
    use crate::store::SpanStatus;

    fn plan(b: &mut Builder, decision: &str, question: Option<&str>) -> Uuid {
        let mut out = crate::store::to_meta(&PlanSpanMeta {
            clarification: question.map(str::to_owned),
            ..PlanSpanMeta::default()
        });
        out.insert("decision".into(), decision.into());
        let action = crate::store::to_meta(&PlanMeta {
            directive: "Speed up the export".into(),
            ..PlanMeta::default()
        });
        b.span(StepKind::Plan, SpanStatus::Completed, action, out)
    }

    #[test]
    fn a_question_answered_on_the_same_issue_then_planned_is_clarified() {
        let mut asking = Builder::new();
        asking.comment_event(EventKind::Issues, 15, "alice", "Make it faster");
        let asked = plan(
            &mut asking,
            "clarify",
            Some("Which is slow: export or import?"),
        );
        let mut answering = Builder::new();
        answering.clock = asking.clock + chrono::TimeDelta::minutes(5);
        answering.comment_event(EventKind::IssueComment, 15, "alice", "The export.");
        assert!(
            clarified(&asking.view, &answering.view).is_none(),
            "not planned yet"
        );
        let planned = plan(&mut answering, "tasks", None);
        let got = clarified(&asking.view, &answering.view).expect("clarified");
        assert_eq!(got.question, "Which is slow: export or import?");
        assert_eq!(got.answer, "The export.");
        assert_eq!(got.asked, asking.span_of(asked));
        assert_eq!(got.answered, answering.view.trace_id());
        assert_eq!(got.planned, answering.span_of(planned));
        assert_eq!(got.directive, "Speed up the export");
        // Another issue's comment answers nothing here.
        let mut other = Builder::new();
        other.clock = answering.clock;
        other.comment_event(EventKind::IssueComment, 16, "alice", "The export.");
        plan(&mut other, "tasks", None);
        assert!(clarified(&asking.view, &other.view).is_none());
        // A plan that did not ask: nothing to learn.
        let mut planned_at_once = Builder::new();
        planned_at_once.comment_event(EventKind::Issues, 15, "alice", "Make it faster");
        plan(&mut planned_at_once, "tasks", None);
        assert!(clarified(&planned_at_once.view, &answering.view).is_none());
    }
}
