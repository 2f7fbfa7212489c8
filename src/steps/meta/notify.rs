//! `notify`: its action (why, and a drafted message) and its span (where the answer went).

use serde::{Deserialize, Serialize};

use crate::github::{Channel, Visibility};
use crate::store::{Meta, Span, StepKind};

use super::MessageSource;

/// Why a notify is sent (defined where the budget reads it as a trace's outcome).
pub use crate::budget::NotifyPurpose;

/// `notify`: answer on the channel the root event came from.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NotifyMeta {
    pub purpose: NotifyPurpose,
    /// A message drafted by the producing step (the notifier may rephrase it for the channel).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failed_step: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pr_url: Option<String>,
    /// Added by the orchestrator to the failure notify that trips the circuit breaker: posted
    /// after the message, so the trace is answered once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub breaker_note: Option<String>,
    /// Rover's own words posted after the message as they are (what was done with a person's
    /// pull request), so no rephrasing can leave them out.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
    /// Rover's own notify (the breaker's, a person's decision): not a trace outcome for the
    /// circuit breaker (`circuitBreaker`, read below the steps as `budget::NotifyHeader`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub circuit_breaker: bool,
    /// A pull request whose conversation gets the same answer (the one rover merged, when its
    /// merge left the base branch red), besides the trace's own channel.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub also_on_pull: Option<u64>,
}

impl NotifyMeta {
    /// The purpose of a notify action's meta, read alone (none when it does not parse).
    pub fn purpose_of(meta: &Meta) -> Option<NotifyPurpose> {
        #[derive(Deserialize)]
        struct Purpose {
            purpose: Option<NotifyPurpose>,
        }
        crate::store::from_meta::<Purpose>(meta)
            .ok()
            .and_then(|p| p.purpose)
    }
}

impl NotifyMeta {
    pub fn failure(step: &StepKind, error: &str) -> NotifyMeta {
        NotifyMeta {
            purpose: NotifyPurpose::Failure,
            message: None,
            failed_step: Some(step.to_string()),
            error: Some(error.to_owned()),
            pr_url: None,
            breaker_note: None,
            note: None,
            circuit_breaker: false,
            also_on_pull: None,
        }
    }
}

/// The `notify` span's meta: the message as sent and where it went. A local answer records
/// `channel: "local"`; a GitHub one the channel and the delivery ([`NotifyDelivery`]).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NotifySpanMeta {
    #[serde(default)]
    pub purpose: NotifyPurpose,
    #[serde(default)]
    pub visibility: Visibility,
    /// The message as posted (redacted for the channel).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message_source: Option<MessageSource>,
    /// The agent call's figures, or why it failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent: Option<crate::store::AgentMeta>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub channel: Option<NotifyChannel>,
    /// How the message was delivered on GitHub (none for the local channel).
    #[serde(flatten)]
    pub delivery: Option<NotifyDelivery>,
    /// The same answer on the pull request `alsoOnPull` names.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub also_delivered: Option<NotifyDelivery>,
}

impl NotifySpanMeta {
    /// What a notify span recorded (none, for a span whose meta has other shapes).
    pub fn of(span: &Span) -> Option<NotifySpanMeta> {
        crate::store::from_meta(&span.meta).ok()
    }

    /// The message, when it was answered on the local channel (the trace holds it).
    pub fn local_answer(&self) -> Option<&str> {
        self.channel
            .as_ref()
            .filter(|c| c.is_local())
            .and(self.message.as_deref())
    }
}

/// The channel a notify span records: `"local"`, a GitHub channel as [`Channel`] serializes
/// it, or another implementation's `{"type": "local"}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum NotifyChannel {
    Github(Channel),
    /// `local`.
    Named(String),
    Typed {
        #[serde(rename = "type")]
        kind: String,
    },
}

impl NotifyChannel {
    /// The local channel, as rover writes it.
    pub fn local() -> NotifyChannel {
        NotifyChannel::Named("local".into())
    }

    /// Whether the answer went to the local channel (the trace).
    pub fn is_local(&self) -> bool {
        match self {
            NotifyChannel::Github(channel) => *channel == Channel::Local,
            NotifyChannel::Named(name) | NotifyChannel::Typed { kind: name } => name == "local",
        }
    }
}

/// A GitHub delivery: where the post can be seen (`url` and `commentId` are `null` when
/// GitHub did not say), and whether an earlier post was found instead.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NotifyDelivery {
    pub url: Option<String>,
    pub comment_id: Option<u64>,
    pub already_posted: bool,
}
