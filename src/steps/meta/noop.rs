//! `noop`: its action (why nothing is done, or a wait) and its span.

use serde::{Deserialize, Serialize};

use crate::store::records::present;
use crate::store::Span;

/// How the reason of a `noop` that records a coordinator `wait` starts.
pub const WAIT_PREFIX: &str = "waiting:";

/// `noop`: end the trace, recording why nothing is done (the reason is the action's `reason`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NoopMeta {
    /// For a coordinator `wait`: the condition waited for (the next event's coordinator sees it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub waiting_for: Option<String>,
    /// For a wait: what it is about, as [`subject_key`] gives it (`#12`, `refs/heads/main`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subject: Option<String>,
    /// The event came from an untrusted author: no agent may look at this trace, not even to
    /// summarize it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub untrusted: bool,
    /// The trace was a `/rover` command: nothing to summarize (its record says what it did).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub command: bool,
    /// A rule ended the trace (no model decided): its reason says it all, and no model is
    /// asked to summarize it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub rule: bool,
}

/// The `noop` span's meta: why nothing is done, a one-line summary of what the trace evaluated
/// and where the summary came from, and for a wait what it waited for.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NoopSpanMeta {
    /// The action's reason.
    #[serde(default)]
    pub reason: String,
    #[serde(default)]
    pub summary: String,
    #[serde(default)]
    pub summary_source: SummarySource,
    /// For a coordinator `wait`: the condition waited for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub waiting_for: Option<String>,
    /// With `waitingFor`: what the wait is about ([`subject_key`]), `null` when nothing.
    #[serde(
        default,
        deserialize_with = "present",
        skip_serializing_if = "Option::is_none"
    )]
    pub subject: Option<Option<String>>,
    /// The summarizing agent's call, answered or failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent: Option<crate::store::AgentMeta>,
}

impl NoopSpanMeta {
    /// What a noop span recorded (nothing, for a span whose meta has other shapes).
    pub fn of(span: &Span) -> NoopSpanMeta {
        crate::store::from_meta(&span.meta).unwrap_or_default()
    }
}

/// Where a noop's summary came from (`summarySource`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum SummarySource {
    /// The summarizing agent.
    #[serde(rename = "agent")]
    Agent,
    /// The chain of span summaries (no agent, or the agent failed).
    #[default]
    #[serde(rename = "span summaries")]
    SpanSummaries,
    /// The chain of span summaries, because no agent may look at an untrusted event.
    #[serde(rename = "span summaries (untrusted event: no agent)")]
    SpanSummariesUntrusted,
}
