//! The span of an intervention, not a step run: a person's `cancel`, `fail`, `retry`, `drop`
//! or `requeue` (`rover autopilot ...`, a `/rover` command) or the `gc` policy reclaiming an
//! ended trace, written by `steps::intervene`, `steps::gc` and the CLI through
//! [`Span::intervention`].

use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::store::{Span, StepKind};

/// What an intervention was: the step name of its span (`StepKind::Other`), as people type it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Intervention {
    /// A person cancelled the trace (`rover autopilot cancel`, `/rover stop`, a stop reaction).
    Cancel,
    /// A person failed the trace (`rover autopilot fail`).
    Fail,
    /// A person queued a failed action again (`rover autopilot retry`, `/rover retry`).
    Retry,
    /// A person dropped a dead letter.
    Drop,
    /// A person queued a dead letter again.
    Requeue,
    /// The `gc` policy reclaimed an ended trace's resources.
    Gc,
    /// A person approved the merge of the trace's pull request at a head (`/rover merge`).
    Approve,
}

impl Intervention {
    pub const ALL: [Intervention; 7] = [
        Intervention::Cancel,
        Intervention::Fail,
        Intervention::Retry,
        Intervention::Drop,
        Intervention::Requeue,
        Intervention::Gc,
        Intervention::Approve,
    ];

    /// The name its span's step has.
    pub fn as_str(self) -> &'static str {
        match self {
            Intervention::Cancel => "cancel",
            Intervention::Fail => "fail",
            Intervention::Retry => "retry",
            Intervention::Drop => "drop",
            Intervention::Requeue => "requeue",
            Intervention::Gc => "gc",
            Intervention::Approve => "approve",
        }
    }

    /// The intervention named `name`, if it is one.
    pub fn parse(name: &str) -> Option<Intervention> {
        Intervention::ALL.into_iter().find(|i| i.as_str() == name)
    }

    /// The intervention `span` records (none for a step run's span).
    pub fn of(span: &Span) -> Option<Intervention> {
        match &span.step {
            StepKind::Other(name) => Intervention::parse(name),
            _ => None,
        }
    }
}

/// The meta of a span that records an intervention, not a step run ([`Span::intervention`]): a
/// person's `cancel`, `fail`, `retry`, `drop` or `requeue`, or the `gc` policy reclaiming an
/// ended trace. Who did it, and what it was about.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct InterventionSpanMeta {
    /// The person (`$USER`, or `--by`) or `gc`.
    pub by: String,
    /// `cancel`/`fail`: the reason given (empty when none was).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// `cancel`/`fail`: the runs still in progress that the daemon stops (`notify (1a2b3c4d)`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stopping: Option<Vec<String>>,
    /// `retry`: the action retried.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retried: Option<Uuid>,
    /// `retry`: the new action; `drop`/`requeue`: the dead letter.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub action: Option<Uuid>,
    /// `drop`/`requeue`: the dead letter's action type.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub action_type: Option<StepKind>,
    /// `gc`: the retention the trace outlived.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retain_days: Option<u64>,
    /// `gc`: the workflow actions whose tasks are reclaimed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tasks: Option<Vec<Uuid>>,
    /// `approve`: the head of the pull request the approval is for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub head_sha: Option<String>,
}

impl InterventionSpanMeta {
    /// What an intervention span recorded (none for a span of another shape).
    pub fn of(span: &Span) -> Option<InterventionSpanMeta> {
        crate::store::from_meta(&span.meta).ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use serde_json::{json, Value};

    #[test]
    fn each_interventions_keys_read_and_write_back_unchanged() {
        let a = "0b6c43b4-3f0e-4e5e-9c39-1b7a0d6f2a11";
        let b = "5d1f8a52-0c6e-4f6a-8a43-2f0f3c1e9b22";
        for written in [
            json!({"by": "alice", "reason": "not needed", "stopping": ["workflow (0b6c43b4)"]}),
            json!({"by": "bob", "retried": a, "action": b}),
            json!({"by": "carol", "action": a, "actionType": "mystery"}),
            json!({"by": "gc", "retainDays": 0, "tasks": [a, b]}),
        ] {
            let record: InterventionSpanMeta =
                serde_json::from_value(written.clone()).expect("reads");
            let span = Span::intervention(Uuid::new_v4(), "cancel", "s".into(), &record);
            assert_eq!(Value::Object(span.meta.clone()), written);
            assert_eq!(InterventionSpanMeta::of(&span), Some(record));
        }
    }

    #[test]
    fn an_intervention_is_known_by_its_spans_step_name_only() {
        for kind in Intervention::ALL {
            let span = Span::intervention(Uuid::new_v4(), kind.as_str(), "s".into(), &json!({}));
            assert_eq!(Intervention::of(&span), Some(kind));
        }
        let span = Span::intervention(Uuid::new_v4(), "mystery", "s".into(), &json!({}));
        assert_eq!(Intervention::of(&span), None);
        let root = Span::root(
            Uuid::new_v4(),
            chrono::Utc::now(),
            crate::store::Meta::new(),
        );
        assert_eq!(Intervention::of(&root), None);
    }
}
