//! The `review` step's records: what a review action asks (the branches the resolver decided to
//! push), what its span says of each task it read (the head, the verdict, the findings, the
//! cost), and what a `changes` verdict hands the resolver.

use std::fmt::Write as _;

use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::agents::{ReviewFinding, ReviewVerdict};
use crate::store::{AgentMeta, Meta, Span, StepKind};

/// A `review` action: the trace's work the resolver decided to push, read before the push.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ReviewMeta {
    /// The branches the push sends (handed on to the push unchanged).
    #[serde(default)]
    pub branches: Vec<String>,
}

/// What the reviewer said of one task's change.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TaskReview {
    /// The task's (latest) workflow action.
    pub workflow_action_id: Uuid,
    pub title: String,
    pub branch: String,
    /// The commit of the task's branch the reviewer read.
    pub head: String,
    /// The acceptance criteria it was read against.
    #[serde(default)]
    pub criteria: Vec<String>,
    pub verdict: ReviewVerdict,
    pub summary: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub findings: Vec<ReviewFinding>,
    /// The reviewer's container.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub container: Option<String>,
    /// The call's figures.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent: Option<AgentMeta>,
    /// An approval of this head in an earlier review of the trace: not read again.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub carried: bool,
}

impl TaskReview {
    /// The findings as the workflow agent's instructions and the trace's answer read them.
    pub fn findings_text(&self) -> String {
        let mut text = String::new();
        for f in &self.findings {
            let place = match f.line {
                Some(line) => format!("{}:{line}", f.file),
                None => f.file.clone(),
            };
            let _ = writeln!(text, "- {place}: {} ({})", f.what.trim(), f.why.trim());
        }
        text
    }
}

/// The `review` span's record.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ReviewSpanMeta {
    /// Every task read (or carried over), in the plan's order; a `changes` verdict ends the
    /// list (the tasks after it are read in the next round).
    #[serde(default)]
    pub reviews: Vec<TaskReview>,
    /// The figures of every call of the span together (what the budget counts).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent: Option<AgentMeta>,
}

impl ReviewSpanMeta {
    /// What a `review` span recorded, if it is one that reads as this record.
    pub fn of(span: &Span) -> Option<ReviewSpanMeta> {
        (span.step == StepKind::Review)
            .then(|| crate::store::from_meta(&span.meta).ok())
            .flatten()
    }

    /// The task that needs changes, if the review found one.
    pub fn changes(&self) -> Option<&TaskReview> {
        self.reviews
            .iter()
            .find(|r| r.verdict == ReviewVerdict::Changes)
    }

    pub fn to_meta(&self) -> Meta {
        crate::store::to_meta(self)
    }
}

/// What a `changes` verdict hands the resolver (`ResolveMeta::review`): the task to iterate on
/// and the findings as its instructions.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ReviewChanges {
    /// The review span.
    pub span_id: Uuid,
    /// The task's latest workflow action.
    pub workflow_action_id: Uuid,
    pub branch: String,
    pub title: String,
    /// The findings, one per line (`file:line: what (why)`).
    pub findings: String,
}
