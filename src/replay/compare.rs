//! What a replay compares of one step run: how it ended (status), what it decided (the span's
//! `decision`, or a merge's or a release's outcome), and the actions it handed on, each as its step with the key fields of its meta
//! ([`KEY_FIELDS`]). Free text (summaries, reasons, reasoning) and ids and times (they differ by
//! construction in a replay) are not compared.

use serde::Serialize;
use serde_json::Value;

use crate::steps::meta::{lifecycle_outcome, Decision, DecisionSpanMeta};
use crate::store::{Action, Meta, RunSpanMeta, Span, SpanStatus, StepKind};

/// The action meta keys compared: the notify's purpose, the workflow's type, the branch and task
/// an iteration works on, the noop's kind, the retry's step.
pub const KEY_FIELDS: &[&str] = &[
    "purpose",
    "workflowType",
    "iterateOn",
    "existingTask",
    "branch",
    "untrusted",
    "rule",
    "command",
    "retryStep",
];

/// One run's outcome, as compared.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct StepDecision {
    pub status: SpanStatus,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub decision: Option<Decision>,
    /// Each action handed on: `step` or `step(key=value, ...)`.
    pub next: Vec<String>,
    /// An error the orchestrator retries: the action stays queued for another run.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub retried: bool,
    /// What a step that decides without a `decision` did (a merge, a release): `merged`,
    /// `waiting`, `released v1.2.3`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub outcome: Option<String>,
}

impl StepDecision {
    /// What a recorded span decided, with the actions it produced.
    pub fn recorded<'a>(span: &Span, actions: impl Iterator<Item = &'a Action>) -> StepDecision {
        StepDecision {
            status: span.status,
            decision: DecisionSpanMeta::of(span).decision,
            next: actions.map(|a| next_label(&a.action, &a.meta)).collect(),
            retried: RunSpanMeta::of(span).retry_at.is_some(),
            outcome: lifecycle_outcome(&span.meta),
        }
    }

    /// What a replayed run decided: its status, span meta and actions.
    pub fn replayed<'a>(
        status: SpanStatus,
        meta: &Meta,
        actions: impl Iterator<Item = (&'a StepKind, &'a Meta)>,
    ) -> StepDecision {
        StepDecision {
            status,
            decision: crate::store::from_meta::<DecisionSpanMeta>(meta)
                .unwrap_or_default()
                .decision,
            next: actions.map(|(kind, meta)| next_label(kind, meta)).collect(),
            retried: false,
            outcome: lifecycle_outcome(meta),
        }
    }

    /// One line: `completed, decided plan → plan(...)`.
    pub fn line(&self) -> String {
        let mut out = self.status.as_str().to_owned();
        if let Some(d) = &self.decision {
            out.push_str(", decided ");
            out.push_str(d.as_str());
        }
        if let Some(outcome) = &self.outcome {
            out.push_str(", ");
            out.push_str(outcome);
        }
        if self.retried {
            out.push_str(" → retried later");
        } else if self.next.is_empty() {
            out.push_str(" → (nothing)");
        } else {
            out.push_str(" → ");
            out.push_str(&self.next.join(", "));
        }
        out
    }
}

/// An action as compared: its step and the key fields its meta has.
pub fn next_label(kind: &StepKind, meta: &Meta) -> String {
    let fields: Vec<String> = KEY_FIELDS
        .iter()
        .filter_map(|key| {
            let value = meta.get(*key)?;
            let shown = match value {
                Value::Null | Value::Bool(false) => return None,
                Value::String(s) => s.clone(),
                other => other.to_string(),
            };
            Some(format!("{key}={shown}"))
        })
        .collect();
    if fields.is_empty() {
        kind.to_string()
    } else {
        format!("{kind}({})", fields.join(", "))
    }
}

/// How the replayed outcome differs from the recorded one; empty when it does not.
pub fn differences(recorded: &StepDecision, replayed: &StepDecision) -> Vec<String> {
    let mut out = Vec::new();
    if recorded.status != replayed.status {
        out.push(format!(
            "status: recorded {}, now {}",
            recorded.status.as_str(),
            replayed.status.as_str()
        ));
    }
    if recorded.decision != replayed.decision {
        let show = |d: &Option<Decision>| d.as_ref().map_or("(none)", Decision::as_str).to_owned();
        out.push(format!(
            "decision: recorded {}, now {}",
            show(&recorded.decision),
            show(&replayed.decision)
        ));
    }
    if recorded.outcome != replayed.outcome {
        let show = |o: &Option<String>| o.clone().unwrap_or_else(|| "(none)".to_owned());
        out.push(format!(
            "outcome: recorded {}, now {}",
            show(&recorded.outcome),
            show(&replayed.outcome)
        ));
    }
    if recorded.retried != replayed.retried {
        let show = |r: bool| if r { "retried later" } else { "not retried" };
        out.push(format!(
            "retry: recorded {}, now {}",
            show(recorded.retried),
            show(replayed.retried)
        ));
    }
    if recorded.next != replayed.next {
        let show = |n: &[String]| {
            if n.is_empty() {
                "(nothing)".to_owned()
            } else {
                n.join(", ")
            }
        };
        out.push(format!(
            "next: recorded {}, now {}",
            show(&recorded.next),
            show(&replayed.next)
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn meta(value: Value) -> Meta {
        match value {
            Value::Object(map) => map,
            _ => Meta::new(),
        }
    }

    #[test]
    fn labels_keep_the_key_fields_only() {
        let m = meta(
            json!({"purpose": "ready", "message": "free text", "untrusted": false, "rule": true}),
        );
        assert_eq!(
            next_label(&StepKind::Notify, &m),
            "notify(purpose=ready, rule=true)"
        );
        assert_eq!(next_label(&StepKind::Plan, &Meta::new()), "plan");
    }

    #[test]
    fn the_same_outcome_has_no_difference_and_text_does_not_count() {
        let recorded_meta = meta(json!({"decision": "plan", "reasoning": "one text"}));
        let replayed_meta = meta(json!({"decision": "plan", "reasoning": "another text"}));
        let plan = (StepKind::Plan, meta(json!({"directive": "do it"})));
        let plan_again = (
            StepKind::Plan,
            meta(json!({"directive": "do it otherwise"})),
        );
        let a = StepDecision::replayed(
            SpanStatus::Completed,
            &recorded_meta,
            [(&plan.0, &plan.1)].into_iter(),
        );
        let b = StepDecision::replayed(
            SpanStatus::Completed,
            &replayed_meta,
            [(&plan_again.0, &plan_again.1)].into_iter(),
        );
        assert!(differences(&a, &b).is_empty());
        assert_eq!(a.line(), "completed, decided plan → plan");
    }

    #[test]
    fn a_retried_error_differs_from_a_handed_over_one() {
        let retried = StepDecision {
            retried: true,
            ..StepDecision::replayed(SpanStatus::Error, &Meta::new(), std::iter::empty())
        };
        let notify = (StepKind::Notify, meta(json!({"purpose": "failure"})));
        let handed_over = StepDecision::replayed(
            SpanStatus::Error,
            &Meta::new(),
            [(&notify.0, &notify.1)].into_iter(),
        );
        assert_eq!(retried.line(), "error → retried later");
        assert_eq!(
            differences(&retried, &handed_over),
            vec![
                "retry: recorded retried later, now not retried".to_owned(),
                "next: recorded (nothing), now notify(purpose=failure)".to_owned()
            ]
        );
    }

    #[test]
    fn a_changed_decision_status_or_next_step_is_each_named() {
        let resolve = (StepKind::Resolve, Meta::new());
        let notify = (StepKind::Notify, meta(json!({"purpose": "failure"})));
        let red = StepDecision::replayed(
            SpanStatus::Failed,
            &meta(json!({"decision": "resolve"})),
            [(&resolve.0, &resolve.1)].into_iter(),
        );
        let gave_up = StepDecision::replayed(
            SpanStatus::Failed,
            &meta(json!({"decision": "resolve"})),
            [(&notify.0, &notify.1)].into_iter(),
        );
        assert_eq!(
            differences(&red, &gave_up),
            vec!["next: recorded resolve, now notify(purpose=failure)".to_owned()]
        );
        let noop = StepDecision::replayed(
            SpanStatus::Completed,
            &meta(json!({"decision": "noop"})),
            std::iter::empty(),
        );
        let diffs = differences(&red, &noop);
        assert_eq!(diffs.len(), 3, "{diffs:?}");
        assert!(diffs[0].starts_with("status: recorded failed, now completed"));
        assert!(diffs[1].contains("recorded resolve, now noop"));
        assert!(diffs[2].ends_with("now (nothing)"));
    }
}
