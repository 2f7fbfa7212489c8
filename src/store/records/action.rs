//! `actions/<id>.json`: an intent for a next step, and what the store reads of its meta.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Map;
use uuid::Uuid;

use super::span::{Span, StepKind};
use super::span_meta::time;
use super::state::PendingAction;
use super::{check_version, iso, version, Meta};

/// An intent for a next step. Immutable once written.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Action {
    pub id: Uuid,
    #[serde(deserialize_with = "check_version")]
    pub version: String,
    #[serde(with = "iso")]
    pub timestamp: DateTime<Utc>,
    pub action: StepKind,
    pub span_id: Uuid,
    pub reason: String,
    pub meta: Meta,
    /// The trace the action belongs to (rover's addition).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trace_id: Option<Uuid>,
}

impl Action {
    pub fn new(
        action: StepKind,
        span: &Span,
        reason: impl Into<String>,
        meta: Meta,
        now: DateTime<Utc>,
    ) -> Action {
        Action {
            id: Uuid::new_v4(),
            version: version(),
            timestamp: now,
            action,
            span_id: span.id,
            reason: reason.into(),
            meta,
            trace_id: span.trace(),
        }
    }

    /// The queue entry that hands this action to its step; an action whose meta names a
    /// `notBefore` time ([`ActionSchedule`]: a scheduled re-evaluation) is not run before it.
    pub fn pending(&self, trace_id: Uuid, now: DateTime<Utc>) -> PendingAction {
        let not_before = ActionSchedule::of(self).not_before;
        PendingAction {
            trace_id,
            action_id: self.id,
            span_id: self.span_id,
            action: self.action.clone(),
            summary: self.reason.clone(),
            created_at: now,
            attempts: 0,
            running_span_id: None,
            not_before,
            superseded_by: None,
            extra: Map::new(),
        }
    }
}

/// The part of any action's meta the store reads to queue it: not to run before `notBefore`
/// (RFC 3339). The steps' action metas that schedule (`CoordinateMeta`, `ResolveMeta`) carry
/// the key with the same name and format.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ActionSchedule {
    /// A value that is not an RFC 3339 time reads as none: the action is due at once.
    #[serde(default, deserialize_with = "time")]
    pub not_before: Option<DateTime<Utc>>,
}

impl ActionSchedule {
    pub fn of(action: &Action) -> ActionSchedule {
        ActionSchedule::deserialize(&action.meta).unwrap_or_default()
    }
}
