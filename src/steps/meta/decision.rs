//! What a deciding step decided (`meta.decision` of a `coordinate`, `resolve` or `plan` span):
//! one enum from the agent's parsed answer ([`CoordinateDecision`], [`ResolveDecision`])
//! through the span meta to every reader (the trace's history, the prompt, telemetry, replay),
//! written as the same lowercase word it always was.

use std::fmt;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::agents::{CoordinateDecision, ResolveDecision};

/// A deciding span's decision. Each step writes its own words (the coordinator's answers and
/// its rules', the resolver's, the planner's); `wait` and `notify` are words of both the
/// coordinator and the resolver.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Decision {
    /// `coordinate`: nothing to do (an untrusted author, a closed pull request, a CI look
    /// without outcome, the agent's answer).
    Noop,
    /// `coordinate`: the directive goes to the planner.
    Plan,
    /// `coordinate`: one task goes to a workflow.
    Workflow,
    /// `coordinate` or `resolve`: answer or report on the thread.
    Notify,
    /// `coordinate` or `resolve`: look again later.
    Wait,
    /// `coordinate`: a person should look.
    Flag,
    /// `coordinate`: tear a rover pull request's workspace down.
    Cleanup,
    /// `coordinate`: a look at CI found it red; the resolver decides.
    Resolve,
    /// `coordinate`: a look at CI found it green and the lifecycle mode merges.
    Merge,
    /// `coordinate`: the merge commit's checks passed on the base branch and the lifecycle
    /// releases: the `release` step tags it.
    Release,
    /// `coordinate`: a `/rover` command was taken.
    Command,
    /// `resolve`: push the trace's work.
    Push,
    /// `resolve`: run the workflow again with new instructions.
    Iterate,
    /// `resolve`: run the failed step again.
    Retry,
    /// `resolve`: the trace failed.
    Fail,
    /// `plan`: a question instead of a plan.
    Clarify,
    /// `plan`: nothing to do.
    Empty,
    /// `plan`: the tasks were planned.
    Tasks,
    /// A word this rover does not write (another implementation's), kept as it was written so
    /// the span still reads and shows it.
    Other(String),
}

impl Decision {
    /// Every word this rover writes, in the order above.
    pub const KNOWN: [Decision; 18] = [
        Decision::Noop,
        Decision::Plan,
        Decision::Workflow,
        Decision::Notify,
        Decision::Wait,
        Decision::Flag,
        Decision::Cleanup,
        Decision::Resolve,
        Decision::Merge,
        Decision::Release,
        Decision::Command,
        Decision::Push,
        Decision::Iterate,
        Decision::Retry,
        Decision::Fail,
        Decision::Clarify,
        Decision::Empty,
        Decision::Tasks,
    ];

    /// The word as written in `meta.decision`.
    pub fn as_str(&self) -> &str {
        match self {
            Decision::Noop => "noop",
            Decision::Plan => "plan",
            Decision::Workflow => "workflow",
            Decision::Notify => "notify",
            Decision::Wait => "wait",
            Decision::Flag => "flag",
            Decision::Cleanup => "cleanup",
            Decision::Resolve => "resolve",
            Decision::Merge => "merge",
            Decision::Release => "release",
            Decision::Command => "command",
            Decision::Push => "push",
            Decision::Iterate => "iterate",
            Decision::Retry => "retry",
            Decision::Fail => "fail",
            Decision::Clarify => "clarify",
            Decision::Empty => "empty",
            Decision::Tasks => "tasks",
            Decision::Other(word) => word,
        }
    }

    /// The decision written as `word` (a word this rover does not write is [`Decision::Other`]).
    pub fn parse(word: &str) -> Decision {
        Decision::KNOWN
            .iter()
            .find(|d| d.as_str() == word)
            .cloned()
            .unwrap_or_else(|| Decision::Other(word.to_owned()))
    }

    /// Whether a coordinator that decided this acted on its event (not `noop` nor `wait`).
    pub fn is_action(&self) -> bool {
        !matches!(self, Decision::Noop | Decision::Wait)
    }

    /// Whether a resolver that decided this spent one of the trace's `maxRetries`.
    pub fn is_retry(&self) -> bool {
        matches!(self, Decision::Iterate | Decision::Retry)
    }
}

impl From<CoordinateDecision> for Decision {
    fn from(decision: CoordinateDecision) -> Decision {
        match decision {
            CoordinateDecision::Noop => Decision::Noop,
            CoordinateDecision::Plan => Decision::Plan,
            CoordinateDecision::Workflow => Decision::Workflow,
            CoordinateDecision::Notify => Decision::Notify,
            CoordinateDecision::Wait => Decision::Wait,
            CoordinateDecision::Flag => Decision::Flag,
            CoordinateDecision::Cleanup => Decision::Cleanup,
        }
    }
}

impl From<ResolveDecision> for Decision {
    fn from(decision: ResolveDecision) -> Decision {
        match decision {
            ResolveDecision::Wait => Decision::Wait,
            ResolveDecision::Push => Decision::Push,
            ResolveDecision::Notify => Decision::Notify,
            ResolveDecision::Iterate => Decision::Iterate,
            ResolveDecision::Retry => Decision::Retry,
            ResolveDecision::Fail => Decision::Fail,
        }
    }
}

impl fmt::Display for Decision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Serialize for Decision {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for Decision {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Ok(Decision::parse(&String::deserialize(d)?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_word_reads_back_as_written_and_an_unknown_one_is_kept() {
        for decision in Decision::KNOWN {
            let json = serde_json::to_value(&decision).expect("writes");
            assert_eq!(json, serde_json::json!(decision.as_str()));
            let read: Decision = serde_json::from_value(json).expect("reads");
            assert_eq!(read, decision);
        }
        let other: Decision = serde_json::from_value(serde_json::json!("escalate")).expect("reads");
        assert_eq!(other, Decision::Other("escalate".into()));
        assert_eq!(
            serde_json::to_value(&other).expect("writes"),
            serde_json::json!("escalate")
        );
        assert!(serde_json::from_value::<Decision>(serde_json::json!(3)).is_err());
    }

    #[test]
    fn the_agents_answers_become_the_words_they_always_were() {
        for answer in [
            CoordinateDecision::Noop,
            CoordinateDecision::Plan,
            CoordinateDecision::Workflow,
            CoordinateDecision::Notify,
            CoordinateDecision::Wait,
            CoordinateDecision::Flag,
            CoordinateDecision::Cleanup,
        ] {
            assert_eq!(Decision::from(answer).as_str(), answer.as_str());
        }
        for answer in [
            ResolveDecision::Wait,
            ResolveDecision::Push,
            ResolveDecision::Notify,
            ResolveDecision::Iterate,
            ResolveDecision::Retry,
            ResolveDecision::Fail,
        ] {
            let word = serde_json::to_value(answer).expect("writes");
            assert_eq!(serde_json::json!(Decision::from(answer).as_str()), word);
        }
    }

    #[test]
    fn only_noop_and_wait_are_no_action_and_only_iterate_and_retry_spend_a_retry() {
        let acting: Vec<&str> = Decision::KNOWN
            .iter()
            .filter(|d| !d.is_action())
            .map(Decision::as_str)
            .collect();
        assert_eq!(acting, ["noop", "wait"]);
        let retries: Vec<&str> = Decision::KNOWN
            .iter()
            .filter(|d| d.is_retry())
            .map(Decision::as_str)
            .collect();
        assert_eq!(retries, ["iterate", "retry"]);
        assert!(Decision::Other("act".into()).is_action());
    }
}
