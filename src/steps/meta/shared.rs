//! Parts of span meta that several steps write and others read: the decision of a deciding
//! step, how a task's run went wrong, where a message came from.

use serde::{Deserialize, Serialize};
use uuid::Uuid;

use super::Decision;
use crate::store::{Span, StepKind};

/// Where a message came from: the agent, or the deterministic fallback when the agent failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum MessageSource {
    Agent,
    Fallback,
    /// Written by rule, no agent asked (a revert's).
    Rule,
}

/// What decided a `coordinate` run's outcome (`meta.decidedBy` of its span).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DecidedBy {
    /// The coordinator agent.
    Agent,
    /// A fixed rule (a merged rover pull request is cleaned up).
    Rule,
    /// The trust check: an untrusted author's event is a `noop`.
    Trust,
    /// A look at the CI of a pull request rover pushed.
    Ci,
    /// A scheduled re-evaluation of a wait that a newer trace took over.
    Wait,
    /// A `/rover` command on the thread (`steps::command`).
    Command,
    /// A value this rover does not write (another implementation's).
    #[serde(other)]
    Other,
}

/// The part of a deciding span's meta (`coordinate`, `resolve`, `plan`) that later runs read
/// back: what was decided, by what, and whether a newer trace took the decision over. The
/// steps write these keys with the rest of their span meta.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DecisionSpanMeta {
    /// `noop`, `plan`, ... for the coordinator; `push`, `fail`, ... for the resolver.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decision: Option<Decision>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decided_by: Option<DecidedBy>,
    /// The trace that took a scheduled re-evaluation over.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub superseded_by: Option<String>,
}

impl DecisionSpanMeta {
    /// What a span recorded of its decision (nothing, for a span whose meta has other shapes
    /// under these keys).
    pub fn of(span: &Span) -> DecisionSpanMeta {
        crate::store::from_meta(&span.meta).unwrap_or_default()
    }

    /// Whether a coordinator's look at CI found it red (a failed `coordinate` decided by CI).
    pub fn is_red_ci(span: &Span) -> bool {
        span.step == StepKind::Coordinate
            && span.status == crate::store::SpanStatus::Failed
            && DecisionSpanMeta::of(span).decided_by == Some(DecidedBy::Ci)
    }
}

/// What the resolver reads of any span about how a task's run went wrong, written by the
/// steps that find it (`workflow`, `commit`): the task never started because a dependency
/// failed, or its sandbox tampered with the worktree's git metadata.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct OutcomeSpanMeta {
    /// The dependency (a workflow action of the same plan) whose failure kept this task from
    /// starting: not the task to iterate on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dependency_failed: Option<Uuid>,
    /// The sandbox changed the worktree's git metadata: nothing of it is trusted.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub tampered: bool,
}

impl OutcomeSpanMeta {
    /// What a span recorded (nothing, for a span whose meta has other shapes under these keys).
    pub fn of(span: &Span) -> OutcomeSpanMeta {
        crate::store::from_meta(&span.meta).unwrap_or_default()
    }

    /// Whether the span's sandbox tampered with the worktree, by its flag or its error's.
    pub fn is_tampered(span: &Span) -> bool {
        OutcomeSpanMeta::of(span).tampered
            || crate::store::ErrorMeta::of(span).is_some_and(|e| e.tampered)
    }
}

/// What telemetry labels any step's span with, whichever step wrote it: the branch it worked
/// on (`branchName` of a workflow, `branch` of a commit or push, `branches` of a consolidated
/// push), the pull request rover had already (`roverPr.prNumber`), and why it decided
/// (`reasoning` of a deciding step, else a `reason`). A key of another shape reads as none.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LabelsSpanMeta {
    #[serde(default, deserialize_with = "lenient")]
    pub branch_name: Option<String>,
    #[serde(default, deserialize_with = "lenient")]
    pub branch: Option<String>,
    #[serde(default, deserialize_with = "lenient")]
    pub branches: Option<Vec<serde_json::Value>>,
    #[serde(default, deserialize_with = "lenient")]
    pub rover_pr: Option<PrNumberMeta>,
    #[serde(default, deserialize_with = "lenient")]
    pub reasoning: Option<String>,
    #[serde(default, deserialize_with = "lenient")]
    pub reason: Option<String>,
}

/// A pull request's number, where a record names one.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PrNumberMeta {
    #[serde(default, deserialize_with = "lenient")]
    pub pr_number: Option<u64>,
}

impl LabelsSpanMeta {
    /// What `span` says.
    pub fn of(span: &Span) -> LabelsSpanMeta {
        crate::store::from_meta(&span.meta).unwrap_or_default()
    }

    /// The branch: `branchName`, else `branch`.
    pub fn branch(&self) -> Option<&str> {
        self.branch_name.as_deref().or(self.branch.as_deref())
    }

    /// The names among `branches` (a name that is no string is left out).
    pub fn branch_names(&self) -> Vec<&str> {
        self.branches
            .iter()
            .flatten()
            .filter_map(serde_json::Value::as_str)
            .collect()
    }

    /// Why: `reasoning`, else `reason`.
    pub fn why(&self) -> Option<&str> {
        self.reasoning.as_deref().or(self.reason.as_deref())
    }
}

/// A value that does not read as its record reads as none (another step's shape).
fn lenient<'de, D, T>(d: D) -> Result<Option<T>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: serde::de::DeserializeOwned,
{
    let value = serde_json::Value::deserialize(d)?;
    Ok(serde_json::from_value(value).ok())
}
