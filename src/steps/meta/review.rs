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

/// Most findings handed on from one review (the rest are counted): the reviewer's answer is
/// model output, bounded before it reaches another prompt, a thread or a pull request.
pub const MAX_FINDINGS_HANDED: usize = 20;
/// Most characters of one field of a finding, or of a review's summary, handed on.
pub const MAX_FIELD_CHARS: usize = 400;

impl TaskReview {
    /// The findings as the workflow agent's instructions and the trace's answer read them: one
    /// line each, at most [`MAX_FINDINGS_HANDED`], each field at most [`MAX_FIELD_CHARS`].
    pub fn findings_text(&self) -> String {
        let mut text = String::new();
        for f in self.findings.iter().take(MAX_FINDINGS_HANDED) {
            let place = match f.line {
                Some(line) => format!("{}:{line}", clip(&f.file)),
                None => clip(&f.file),
            };
            let _ = writeln!(text, "- {place}: {} ({})", clip(&f.what), clip(&f.why));
        }
        if self.findings.len() > MAX_FINDINGS_HANDED {
            let _ = writeln!(
                text,
                "- ... and {} more findings",
                self.findings.len() - MAX_FINDINGS_HANDED
            );
        }
        text
    }

    /// The reviewer's summary on one bounded line.
    pub fn summary_line(&self) -> String {
        clip(&self.summary)
    }
}

/// `text` on one line (line breaks and control characters as spaces), trimmed, at most
/// [`MAX_FIELD_CHARS`] characters with `…` marking a cut.
fn clip(text: &str) -> String {
    let flat: String = text
        .trim()
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    if flat.chars().count() <= MAX_FIELD_CHARS {
        return flat;
    }
    let mut cut: String = flat.chars().take(MAX_FIELD_CHARS).collect();
    cut.push('…');
    cut
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
