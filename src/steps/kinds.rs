//! What each step of the pipeline is, in one table: whether its span ends a trace, whether
//! every run of it keeps a replay record, its role in the OpenTelemetry export, and whether
//! its completed span carries the answer to the asker. The store keeps a step's name as data
//! ([`StepKind`]); what a name means to the pipeline is declared here, and the modules above
//! the steps (telemetry, replay, the daemon) ask this table instead of naming a step.

use crate::agents::AgentStep;
use crate::store::{Span, StepKind};

/// A step's declared properties.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StepTraits {
    /// Whether its span ends the trace (it hands over to no further step), and how.
    pub ends: Ends,
    /// Every run keeps a replay record, even one that read nothing (a deciding step: replay
    /// then knows the run needed nothing).
    pub always_recorded: bool,
    /// `gen_ai.operation.name`, `gen_ai.agent.name` and the agent step of a run that called its
    /// agent.
    pub genai: Option<(&'static str, &'static str, AgentStep)>,
    /// Its completed span holds the answer for whoever asked (a local request's answer is
    /// printed by the console).
    pub answers: bool,
    /// The reason of the action it consumed says what became of the trace (a decision not to
    /// act says why), so a listing of traces shows it beside the outcome.
    pub reason_is_outcome: bool,
}

const STEP: StepTraits = StepTraits {
    ends: Ends::No,
    always_recorded: false,
    genai: None,
    answers: false,
    reason_is_outcome: false,
};

/// How a step's span stands to the end of its trace.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ends {
    /// It hands over to a further step.
    No,
    /// It ends the trace with its verdict for the circuit breaker (an answer, a decision not to
    /// act).
    WithVerdict,
    /// It ends the trace without a verdict (housekeeping).
    Quietly,
}

/// The step every trace starts with (intake enqueues it with the root span).
pub const FIRST_STEP: StepKind = StepKind::Coordinate;

/// The table: every step of the pipeline and what it is.
const TABLE: [(StepKind, StepTraits); 12] = [
    (
        StepKind::Coordinate,
        StepTraits {
            always_recorded: true,
            genai: Some(("invoke_agent", "coordinator", AgentStep::Coordinate)),
            ..STEP
        },
    ),
    (
        StepKind::Plan,
        StepTraits {
            always_recorded: true,
            genai: Some(("plan", "planner", AgentStep::Plan)),
            ..STEP
        },
    ),
    (
        StepKind::Workflow,
        StepTraits {
            genai: Some(("invoke_agent", "worker", AgentStep::Workflow)),
            ..STEP
        },
    ),
    (
        StepKind::Commit,
        StepTraits {
            genai: Some(("invoke_agent", "committer", AgentStep::Commit)),
            ..STEP
        },
    ),
    (
        StepKind::Resolve,
        StepTraits {
            always_recorded: true,
            genai: Some(("invoke_agent", "resolver", AgentStep::Resolve)),
            ..STEP
        },
    ),
    (
        StepKind::Review,
        StepTraits {
            genai: Some(("invoke_agent", "reviewer", AgentStep::Review)),
            ..STEP
        },
    ),
    (
        StepKind::Push,
        StepTraits {
            genai: Some(("invoke_agent", "pusher", AgentStep::Push)),
            ..STEP
        },
    ),
    // No agent: the merge rules decide (`steps::merge::rules`) from GitHub's answers, the
    // clock and the store's recent merges, all in the replay record.
    (
        StepKind::Merge,
        StepTraits {
            always_recorded: true,
            ..STEP
        },
    ),
    // No agent: the tag and the notes come from GitHub's lists (`steps::release`).
    (
        StepKind::Release,
        StepTraits {
            always_recorded: true,
            ..STEP
        },
    ),
    (
        StepKind::Notify,
        StepTraits {
            ends: Ends::WithVerdict,
            genai: Some(("invoke_agent", "notifier", AgentStep::Notify)),
            answers: true,
            ..STEP
        },
    ),
    (
        StepKind::Noop,
        StepTraits {
            ends: Ends::WithVerdict,
            genai: Some(("invoke_agent", "summarizer", AgentStep::Summarize)),
            reason_is_outcome: true,
            ..STEP
        },
    ),
    (
        StepKind::Cleanup,
        StepTraits {
            ends: Ends::Quietly,
            ..STEP
        },
    ),
];

/// What `step` is (`None`: no step of this pipeline: the root `event`, an intervention, a name
/// another implementation wrote).
pub fn traits(step: &StepKind) -> Option<StepTraits> {
    TABLE.iter().find(|(k, _)| k == step).map(|(_, t)| *t)
}

/// Whether `step`'s span ends its trace.
pub fn ends_trace(step: &StepKind) -> bool {
    traits(step).is_some_and(|t| t.ends != Ends::No)
}

/// Where `view` stands, its end judged by this table: running, stalled, or finished by its
/// latest span of a step that ends a trace.
pub fn trace_outcome(view: &crate::store::TraceView) -> crate::store::TraceOutcome {
    view.outcome_by(ends_trace)
}

/// Whether `step`'s span, ending its trace, is the trace's verdict for the circuit breaker.
pub fn gives_verdict(step: &StepKind) -> bool {
    traits(step).is_some_and(|t| t.ends == Ends::WithVerdict)
}

/// Whether the reason of the action `step` consumed says what became of its trace.
pub fn reason_is_outcome(step: &StepKind) -> bool {
    traits(step).is_some_and(|t| t.reason_is_outcome)
}

/// Whether every run of `step` keeps a replay record.
pub fn always_recorded(step: &StepKind) -> bool {
    traits(step).is_some_and(|t| t.always_recorded)
}

/// The GenAI role of `step` when it called an agent.
pub fn telemetry_role(step: &StepKind) -> Option<(&'static str, &'static str, AgentStep)> {
    traits(step).and_then(|t| t.genai)
}

/// Whether `step`'s completed span carries the answer to the asker.
pub fn answers(step: &StepKind) -> bool {
    traits(step).is_some_and(|t| t.answers)
}

/// What a span posted on GitHub that people may react to: the pull request a push opened,
/// the comment a notify posted (as `(is a pull request, number or comment id)`).
pub fn posted(span: &Span) -> Option<Posted> {
    match span.step {
        StepKind::Push => crate::store::from_meta::<super::meta::PushSpanMeta>(&span.meta)
            .ok()
            .and_then(|m| m.pull_request.pr_number)
            .map(Posted::PullRequest),
        StepKind::Notify => super::meta::NotifySpanMeta::of(span)
            .and_then(|m| m.delivery)
            .and_then(|d| d.comment_id)
            .map(Posted::Comment),
        _ => None,
    }
}

/// Something rover posted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Posted {
    /// A pull request, by number.
    PullRequest(u64),
    /// An issue comment, by id.
    Comment(u64),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_step_is_in_the_table_and_only_steps_are() {
        for kind in StepKind::ALL.iter().filter(|k| **k != StepKind::Event) {
            assert!(traits(kind).is_some(), "{kind} has no traits");
        }
        let ends: Vec<&StepKind> = StepKind::ALL.iter().filter(|k| ends_trace(k)).collect();
        assert_eq!(
            ends,
            [&StepKind::Notify, &StepKind::Noop, &StepKind::Cleanup],
            "the steps that hand over to no further step"
        );
        assert!(traits(&StepKind::Event).is_none());
        assert!(traits(&StepKind::Other("cancel".into())).is_none());
        assert!(!ends_trace(&StepKind::Other("noop2".into())));
        // The circuit breaker counts answers and decisions not to act, not housekeeping.
        let verdicts: Vec<&StepKind> = StepKind::ALL.iter().filter(|k| gives_verdict(k)).collect();
        assert_eq!(verdicts, [&StepKind::Notify, &StepKind::Noop]);
        let explained: Vec<&StepKind> = StepKind::ALL
            .iter()
            .filter(|k| reason_is_outcome(k))
            .collect();
        assert_eq!(explained, [&StepKind::Noop]);
    }
}
