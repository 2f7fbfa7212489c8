//! `spans/<id>.json`: a step's execution record, its step kind and status.

use std::fmt;
use std::str::FromStr;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::Value;
use uuid::Uuid;

use super::action::Action;
use super::{check_version, iso, required, version, Meta};

/// A pipeline step, also the type of the action that step consumes.
///
/// `Other` keeps an action type no step handles (a dead letter) instead of failing the parse.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum StepKind {
    Event,
    Coordinate,
    Plan,
    Workflow,
    Commit,
    Resolve,
    Review,
    Push,
    Merge,
    Release,
    Notify,
    Noop,
    Cleanup,
    Other(String),
}

impl StepKind {
    /// The steps of the pipeline (the root `event` first), in chain order.
    pub const ALL: [StepKind; 13] = [
        StepKind::Event,
        StepKind::Coordinate,
        StepKind::Plan,
        StepKind::Workflow,
        StepKind::Commit,
        StepKind::Resolve,
        StepKind::Review,
        StepKind::Push,
        StepKind::Merge,
        StepKind::Release,
        StepKind::Notify,
        StepKind::Noop,
        StepKind::Cleanup,
    ];

    pub fn as_str(&self) -> &str {
        match self {
            StepKind::Event => "event",
            StepKind::Coordinate => "coordinate",
            StepKind::Plan => "plan",
            StepKind::Workflow => "workflow",
            StepKind::Commit => "commit",
            StepKind::Resolve => "resolve",
            StepKind::Review => "review",
            StepKind::Push => "push",
            StepKind::Merge => "merge",
            StepKind::Release => "release",
            StepKind::Notify => "notify",
            StepKind::Noop => "noop",
            StepKind::Cleanup => "cleanup",
            StepKind::Other(name) => name,
        }
    }
}

impl fmt::Display for StepKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for StepKind {
    type Err = std::convert::Infallible;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ok(StepKind::ALL
            .iter()
            .find(|k| k.as_str() == s)
            .cloned()
            .unwrap_or_else(|| StepKind::Other(s.to_owned())))
    }
}

impl Serialize for StepKind {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for StepKind {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        if s.is_empty() {
            return Err(serde::de::Error::custom("step name is empty"));
        }
        Ok(s.parse().expect("infallible"))
    }
}

/// The outcome of a span.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SpanStatus {
    /// In progress; the only status a span is created with.
    Running,
    /// Finished successfully.
    Completed,
    /// Ran to completion with a negative outcome the pipeline knows how to handle.
    Failed,
    /// Could not finish: environment, crash, interruption.
    Error,
}

impl SpanStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            SpanStatus::Running => "running",
            SpanStatus::Completed => "completed",
            SpanStatus::Failed => "failed",
            SpanStatus::Error => "error",
        }
    }

    pub fn is_final(self) -> bool {
        self != SpanStatus::Running
    }
}

impl fmt::Display for SpanStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The record of one step's execution.
///
/// Created `running`, finalized once with a status, summary and completion time, immutable after.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Span {
    pub id: Uuid,
    #[serde(deserialize_with = "check_version")]
    pub version: String,
    #[serde(with = "iso")]
    pub timestamp: DateTime<Utc>,
    pub step: StepKind,
    #[serde(deserialize_with = "required")]
    pub parent_id: Option<Uuid>,
    pub status: SpanStatus,
    #[serde(with = "iso::option")]
    pub completed: Option<DateTime<Utc>>,
    #[serde(deserialize_with = "required")]
    pub summary: Option<String>,
    pub meta: Meta,
    /// The root event span's id (rover's addition: finds the trace without walking).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trace_id: Option<Uuid>,
    /// The action this span processes (rover's addition: the idempotency key of a step run).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub action_id: Option<Uuid>,
}

/// Why a span could not be finalized.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SpanLifecycleError {
    #[error("span {id} is already {status}; a finished span is immutable")]
    AlreadyFinal { id: Uuid, status: SpanStatus },
    #[error("span {id} cannot be finalized as running")]
    FinalizeAsRunning { id: Uuid },
}

/// A typed record as meta entries (a span's or an action's): its serialized fields. A record
/// that does not serialize to an object (a path that is not UTF-8) gives no entries and is
/// logged with its type, never silently lost.
pub fn to_meta<T: Serialize>(record: &T) -> Meta {
    match serde_json::to_value(record) {
        Ok(Value::Object(map)) => map,
        Ok(_) => {
            tracing::error!(
                record = std::any::type_name::<T>(),
                "a meta record is not an object; left out"
            );
            Meta::new()
        }
        Err(e) => {
            tracing::error!(
                record = std::any::type_name::<T>(),
                error = &e as &dyn std::error::Error,
                "a meta record does not serialize; left out"
            );
            Meta::new()
        }
    }
}

/// A typed record read from meta entries (keys it does not name are ignored), without copying
/// the meta.
pub fn from_meta<T: serde::de::DeserializeOwned>(meta: &Meta) -> serde_json::Result<T> {
    T::deserialize(meta)
}

impl Span {
    /// A finished span recording an intervention in trace `trace_id` that is no step run (a
    /// person's `cancel`/`retry`, the `gc` policy): step `command`, under the root span, its
    /// meta `record` (the steps' `InterventionSpanMeta`).
    pub fn intervention<T: Serialize>(
        trace_id: Uuid,
        command: &str,
        summary: String,
        record: &T,
    ) -> Span {
        let meta = to_meta(record);
        let now = Utc::now();
        let mut span = Span::root(Uuid::new_v4(), now, Meta::new());
        span.step = StepKind::Other(command.to_owned());
        span.parent_id = Some(trace_id);
        span.trace_id = Some(trace_id);
        span.finish(SpanStatus::Completed, summary, meta, now)
            .expect("a new span finishes");
        span
    }

    /// A root `event` span: the start of a trace, whose id is the trace id.
    pub fn root(id: Uuid, now: DateTime<Utc>, meta: Meta) -> Span {
        Span {
            id,
            version: version(),
            timestamp: now,
            step: StepKind::Event,
            parent_id: None,
            status: SpanStatus::Running,
            completed: None,
            summary: None,
            meta,
            trace_id: Some(id),
            action_id: None,
        }
    }

    /// A `running` span of `step` processing `action` (whose producer is the parent).
    pub fn start(step: StepKind, action: &Action, trace_id: Uuid, now: DateTime<Utc>) -> Span {
        Span {
            id: Uuid::new_v4(),
            version: version(),
            timestamp: now,
            step,
            parent_id: Some(action.span_id),
            status: SpanStatus::Running,
            completed: None,
            summary: None,
            meta: Meta::new(),
            trace_id: Some(trace_id),
            action_id: Some(action.id),
        }
    }

    /// Finalize: status, summary, completion time, and `meta` merged over the initial meta.
    pub fn finish(
        &mut self,
        status: SpanStatus,
        summary: impl Into<String>,
        meta: Meta,
        now: DateTime<Utc>,
    ) -> Result<(), SpanLifecycleError> {
        if self.status.is_final() {
            return Err(SpanLifecycleError::AlreadyFinal {
                id: self.id,
                status: self.status,
            });
        }
        if !status.is_final() {
            return Err(SpanLifecycleError::FinalizeAsRunning { id: self.id });
        }
        self.status = status;
        self.summary = Some(summary.into());
        self.completed = Some(now.max(self.timestamp));
        self.meta.extend(meta);
        Ok(())
    }

    /// The trace this span belongs to: the recorded trace id, or itself for a root.
    pub fn trace(&self) -> Option<Uuid> {
        self.trace_id.or(if self.parent_id.is_none() {
            Some(self.id)
        } else {
            None
        })
    }
}
