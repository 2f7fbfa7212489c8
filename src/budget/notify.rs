//! What the budget and the circuit breaker read of a `notify` action: why it is sent (its
//! [`NotifyPurpose`], the notify step's own type) and whether it is rover's own notify (the
//! breaker's, a person's decision), which is no trace outcome.

use serde::{Deserialize, Deserializer, Serialize};
use serde_json::Value;

use crate::store::{from_meta, Meta};

/// Why a notify is sent; decides the message's shape and the channel's form (comment, review).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum NotifyPurpose {
    /// A direct answer or acknowledgement.
    #[default]
    Answer,
    /// A question the pipeline needs answered before it can go on.
    Clarify,
    /// Ask a human to look.
    Flag,
    /// Work was pushed: the PR and a summary.
    Pushed,
    /// Findings of a code review, posted as a PR review.
    Review,
    /// The trace could not do its job: why.
    Failure,
    /// A budget stopped the trace.
    Budget,
    /// CI passed on rover's pull request: it is ready for review.
    Ready,
    /// rover merged its pull request (`autopilot.lifecycle.mode`).
    Merged,
}

impl NotifyPurpose {
    /// The name as serialized.
    pub fn as_str(self) -> &'static str {
        match self {
            NotifyPurpose::Answer => "answer",
            NotifyPurpose::Clarify => "clarify",
            NotifyPurpose::Flag => "flag",
            NotifyPurpose::Pushed => "pushed",
            NotifyPurpose::Review => "review",
            NotifyPurpose::Failure => "failure",
            NotifyPurpose::Budget => "budget",
            NotifyPurpose::Ready => "ready",
            NotifyPurpose::Merged => "merged",
        }
    }
}

/// The part of the notify step's `NotifyMeta` (`steps::meta`) the budget reads. A field of
/// another type, or a purpose this build does not know, reads as missing.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NotifyHeader {
    #[serde(default, deserialize_with = "purpose")]
    pub purpose: Option<NotifyPurpose>,
    #[serde(default, deserialize_with = "flag")]
    pub circuit_breaker: bool,
}

fn purpose<'de, D: Deserializer<'de>>(d: D) -> Result<Option<NotifyPurpose>, D::Error> {
    Ok(serde_json::from_value(Value::deserialize(d)?).ok())
}

/// `true` only for the JSON value `true`.
fn flag<'de, D: Deserializer<'de>>(d: D) -> Result<bool, D::Error> {
    Ok(matches!(Value::deserialize(d)?, Value::Bool(true)))
}

impl NotifyHeader {
    /// The header of a notify action's meta.
    pub fn of(meta: &Meta) -> NotifyHeader {
        from_meta(meta).unwrap_or_default()
    }

    /// A notify of rover's failure to do the trace's job (not the breaker's own).
    pub fn is_failure(&self) -> bool {
        self.purpose == Some(NotifyPurpose::Failure) && !self.circuit_breaker
    }

    /// rover's own notify (the breaker's, a budget's, a person's decision): no trace outcome.
    pub fn is_rovers_own(&self) -> bool {
        self.circuit_breaker || self.purpose == Some(NotifyPurpose::Budget)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn header(meta: Value) -> NotifyHeader {
        let Value::Object(meta) = meta else { panic!() };
        NotifyHeader::of(&meta)
    }

    #[test]
    fn the_purpose_is_read_typed_and_anything_else_reads_as_missing() {
        assert_eq!(
            header(json!({"purpose": "failure"})).purpose,
            Some(NotifyPurpose::Failure)
        );
        assert!(header(json!({"purpose": "failure"})).is_failure());
        assert!(!header(json!({"purpose": "failure", "circuitBreaker": true})).is_failure());
        assert!(header(json!({"purpose": "budget"})).is_rovers_own());
        assert_eq!(header(json!({"purpose": "a-new-one"})).purpose, None);
        assert_eq!(header(json!({"purpose": 3})).purpose, None);
        assert!(!header(json!({"circuitBreaker": "yes"})).circuit_breaker);
        assert_eq!(header(json!({})), NotifyHeader::default());
    }
}
