//! The records kept in the store, with the spec's field names: spans, actions, the state file
//! (pending queue and task mappings), the event cursor and the trace indexes.
//!
//! Fields the spec defines are typed and required; fields rover adds are optional on read so a
//! store written by another implementation still loads. Unknown fields of the shared files are
//! kept (`extra`) and written back unchanged.

use std::collections::BTreeMap;
use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::{Map, Value};
use uuid::Uuid;

/// The format version written on every record.
pub const VERSION: &str = "1.0";

/// How many processed event ids the cursor keeps (oldest evicted first).
pub const CURSOR_CAPACITY: usize = 200;

/// How many event content keys the cursor keeps (oldest evicted first): more than the 300 events
/// the feed serves, so an event the webhook brought is still known when the poller sees it.
pub const EVENT_KEYS_CAPACITY: usize = 1000;

/// Step-specific data of a span or an action.
pub type Meta = Map<String, Value>;

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
    Push,
    Notify,
    Noop,
    Cleanup,
    Other(String),
}

impl StepKind {
    /// The ten steps of the pipeline, in chain order.
    pub const ALL: [StepKind; 10] = [
        StepKind::Event,
        StepKind::Coordinate,
        StepKind::Plan,
        StepKind::Workflow,
        StepKind::Commit,
        StepKind::Resolve,
        StepKind::Push,
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
            StepKind::Push => "push",
            StepKind::Notify => "notify",
            StepKind::Noop => "noop",
            StepKind::Cleanup => "cleanup",
            StepKind::Other(name) => name,
        }
    }

    /// Terminal steps end a trace: they produce no action.
    pub fn is_terminal(&self) -> bool {
        matches!(self, StepKind::Notify | StepKind::Noop | StepKind::Cleanup)
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

pub mod iso;

/// Deserialize an `Option` that must be present (as `null` or a value), as the spec's nullable
/// fields are: serde would otherwise accept a missing field as `None`.
fn required<'de, D: Deserializer<'de>, T: Deserialize<'de>>(d: D) -> Result<Option<T>, D::Error> {
    Option::<T>::deserialize(d)
}

fn version() -> String {
    VERSION.to_owned()
}

pub(super) fn check_version<'de, D: Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    let v = String::deserialize(d)?;
    if v.split('.').next() == Some("1") {
        Ok(v)
    } else {
        Err(serde::de::Error::custom(format!(
            "unsupported record version {v:?} (this rover reads 1.x)"
        )))
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
    /// person's `cancel`/`retry`, the `gc` policy): step `command`, under the root span.
    pub fn intervention(
        trace_id: Uuid,
        command: &str,
        summary: String,
        record: &InterventionSpanMeta,
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

/// What the store reads of a root `event` span's meta to list the trace: the part of the event
/// step's `EventMeta` (`steps::meta`) that names the event. Every field is optional: a root
/// written by another implementation may lack them.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EventHeader {
    /// One line for lists: `IssuesEvent opened #12 by alice: title`.
    #[serde(
        default,
        deserialize_with = "text",
        skip_serializing_if = "Option::is_none"
    )]
    pub label: Option<String>,
    /// `IssuesEvent`, ..., or `LocalRequest`.
    #[serde(
        default,
        rename = "type",
        deserialize_with = "text",
        skip_serializing_if = "Option::is_none"
    )]
    pub kind: Option<String>,
    #[serde(
        default,
        deserialize_with = "text",
        skip_serializing_if = "Option::is_none"
    )]
    pub action: Option<String>,
}

/// A string, or none for a value of any other type.
fn text<'de, D: Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
    Ok(match Value::deserialize(d)? {
        Value::String(s) => Some(s),
        _ => None,
    })
}

impl EventHeader {
    /// The header of a root span's meta (a field of another type reads as missing).
    pub fn of(root: &Span) -> EventHeader {
        from_meta(&root.meta).unwrap_or_default()
    }

    /// The label, else `<type>.<action>`, else `<type>`, else `event`.
    pub fn label(&self) -> String {
        if let Some(label) = &self.label {
            return label.clone();
        }
        let kind = self.kind.as_deref().unwrap_or("event");
        match &self.action {
            Some(action) => format!("{kind}.{action}"),
            None => kind.to_owned(),
        }
    }
}

/// `true` only for the JSON value `true`.
fn flag<'de, D: Deserializer<'de>>(d: D) -> Result<bool, D::Error> {
    Ok(matches!(Value::deserialize(d)?, Value::Bool(true)))
}

/// `meta.agent` of a span whose step called an agent: the call's figures, or why it failed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum AgentMeta {
    /// The call could not be made or gave no usable answer (the step went on without it).
    Failed(AgentFailure),
    Used(AgentUsage),
}

impl AgentMeta {
    const KEY: &'static str = "agent";

    /// What a span recorded of its agent call, if it made one (a value that is no object is
    /// no call).
    pub fn of(span: &Span) -> Option<AgentMeta> {
        span.meta
            .get(Self::KEY)
            .filter(|v| v.is_object())
            .and_then(|v| serde_json::from_value(v.clone()).ok())
    }

    /// The figures of a call that answered.
    pub fn usage(&self) -> Option<&AgentUsage> {
        match self {
            AgentMeta::Used(u) => Some(u),
            AgentMeta::Failed(_) => None,
        }
    }
}

/// One agent call's figures as every step records them under `meta.agent`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AgentUsage {
    /// Model round trips, when the CLI reports them.
    #[serde(default)]
    pub turns: Option<u32>,
    /// USD as the CLI reports it (claude), else none.
    #[serde(default)]
    pub cost_usd: Option<f64>,
    #[serde(default)]
    pub input_tokens: u64,
    #[serde(default)]
    pub output_tokens: u64,
    #[serde(default)]
    pub cached_tokens: u64,
    /// How many answers a structured call took (1, or 2 after a rejected first answer).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attempts: Option<u32>,
    /// Why the first answer of a structured call was rejected.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first_error: Option<String>,
}

/// An agent call that failed, as a step that goes on without it records it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AgentFailure {
    /// The error with its causes.
    pub error: String,
    /// The agent error's class (`auth`, `invalidAnswer`, ...).
    pub error_class: String,
}

/// `meta.error` of a span that failed or errored: the message, whether a retry may help, and
/// the step's details (command, exit code, error class, ...).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ErrorMeta {
    pub message: String,
    #[serde(default)]
    pub retryable: bool,
    /// A sandbox changed the worktree's git metadata (the resolver ends the trace).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub tampered: bool,
    #[serde(flatten)]
    pub details: Map<String, Value>,
}

impl ErrorMeta {
    /// The span meta key it is stored under.
    pub const KEY: &'static str = "error";

    /// Store it in a span's meta under [`ErrorMeta::KEY`].
    pub fn put_into(&self, meta: &mut Meta) {
        if let Ok(value) = serde_json::to_value(self) {
            meta.insert(Self::KEY.to_owned(), value);
        }
    }

    /// The error a span recorded, if any.
    pub fn of(span: &Span) -> Option<ErrorMeta> {
        span.meta
            .get(Self::KEY)
            .and_then(|v| serde_json::from_value(v.clone()).ok())
    }

    /// A detail by name, as the step recorded it.
    pub fn detail(&self, key: &str) -> Option<&Value> {
        self.details.get(key)
    }

    /// The error a span recorded, also in the older shape: a bare message under
    /// [`ErrorMeta::KEY`] (spans written before the typed record), read as a message that is
    /// not retryable and has no details. For readers of any store, like `rover autopilot trace`.
    pub fn of_any(span: &Span) -> Option<ErrorMeta> {
        ErrorMeta::of(span).or_else(|| match span.meta.get(Self::KEY) {
            Some(Value::String(message)) => Some(ErrorMeta {
                message: message.clone(),
                retryable: false,
                tampered: false,
                details: Map::new(),
            }),
            _ => None,
        })
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
}

impl InterventionSpanMeta {
    /// What an intervention span recorded (none for a span of another shape).
    pub fn of(span: &Span) -> Option<InterventionSpanMeta> {
        InterventionSpanMeta::deserialize(&span.meta).ok()
    }
}

/// The keys the orchestrator and the store add to the meta of any step's span, next to the
/// step's own keys: how the run ended when the step did not end it itself (cut off, retried,
/// stopped by a budget or a person), what the budget warned of, and the actions it produced.
/// Every key is written only when it says something, so a span without any reads as the
/// default.
///
/// A key holding a value of another type reads as missing (it never spoils the others).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
#[allow(clippy::struct_excessive_bools)] // each flag is its own span meta key on disk
pub struct RunSpanMeta {
    /// The run was cut off (a shutdown, or a restart found it running) before its step
    /// finished: its action stays queued and runs again.
    #[serde(deserialize_with = "flag", skip_serializing_if = "std::ops::Not::not")]
    pub interrupted: bool,
    /// Which attempt at its action the run was (written by restart recovery on a run it cut
    /// off).
    #[serde(deserialize_with = "count", skip_serializing_if = "Option::is_none")]
    pub attempt: Option<u32>,
    /// A retryable error: when the action runs again.
    #[serde(
        deserialize_with = "time",
        serialize_with = "iso::option::serialize",
        skip_serializing_if = "Option::is_none"
    )]
    pub retry_at: Option<DateTime<Utc>>,
    /// The budget limits this run reached (warned of, not enforced).
    #[serde(deserialize_with = "texts", skip_serializing_if = "Vec::is_empty")]
    pub budget_warnings: Vec<String>,
    /// The run was closed because a budget stopped its trace.
    #[serde(deserialize_with = "flag", skip_serializing_if = "std::ops::Not::not")]
    pub budget_stopped: bool,
    /// The run was closed because a person closed its trace (`cancel`/`fail`).
    #[serde(deserialize_with = "flag", skip_serializing_if = "std::ops::Not::not")]
    pub closed_by_hand: bool,
    /// The run tripped the budget's circuit breaker: no new trace starts until `resume`.
    #[serde(deserialize_with = "flag", skip_serializing_if = "std::ops::Not::not")]
    pub circuit_breaker_tripped: bool,
    /// The actions the span produced, named by the store when it finishes the span (or an
    /// intervention), so a crash before they are queued is completed on restart. Present (and
    /// maybe empty) once the hand-over started. Its key is [`crate::store::PRODUCED_KEY`].
    #[serde(deserialize_with = "uuids", skip_serializing_if = "Option::is_none")]
    pub action_ids: Option<Vec<Uuid>>,
}

/// A count that fits a `u32`, or none for a value of any other type.
fn count<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u32>, D::Error> {
    Ok(Value::deserialize(d)?
        .as_u64()
        .and_then(|n| u32::try_from(n).ok()))
}

/// An RFC 3339 time, or none for a value of any other type.
fn time<'de, D: Deserializer<'de>>(d: D) -> Result<Option<DateTime<Utc>>, D::Error> {
    Ok(match Value::deserialize(d)? {
        Value::String(s) => DateTime::parse_from_rfc3339(&s)
            .ok()
            .map(|t| t.with_timezone(&Utc)),
        _ => None,
    })
}

/// The strings of an array (its other items skipped), or none for a value of any other type.
fn texts<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<String>, D::Error> {
    Ok(match Value::deserialize(d)? {
        Value::Array(items) => items
            .into_iter()
            .filter_map(|v| match v {
                Value::String(s) => Some(s),
                _ => None,
            })
            .collect(),
        _ => Vec::new(),
    })
}

/// A list of ids, or none for a value of any other shape.
fn uuids<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Vec<Uuid>>, D::Error> {
    Ok(serde_json::from_value(Value::deserialize(d)?).ok())
}

impl RunSpanMeta {
    /// What the orchestrator and the store recorded on a span (the default when nothing).
    pub fn of(span: &Span) -> RunSpanMeta {
        RunSpanMeta::read(&span.meta)
    }

    /// The same, from a span's meta.
    pub fn read(meta: &Meta) -> RunSpanMeta {
        RunSpanMeta::deserialize(meta).unwrap_or_default()
    }

    /// Merge its keys into a span's meta (the keys it does not set are left as they are).
    pub fn put_into(&self, meta: &mut Meta) {
        if let Ok(Value::Object(map)) = serde_json::to_value(self) {
            meta.extend(map);
        }
    }

    /// The run was closed because its trace was stopped (by a budget or by a person).
    pub fn stopped(&self) -> bool {
        self.budget_stopped || self.closed_by_hand
    }
}

#[cfg(test)]
mod action_schedule_tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn an_action_is_queued_not_before_its_notbefore_and_a_bad_value_is_due_at_once() {
        let root = Span::root(Uuid::new_v4(), Utc::now(), Meta::new());
        let mut meta = Meta::new();
        meta.insert("notBefore".into(), json!("2026-01-02T03:34:05Z"));
        let now = Utc::now();
        let action = Action::new(StepKind::Resolve, &root, "wait", meta, now);
        assert_eq!(
            action.pending(root.id, now).not_before,
            Some("2026-01-02T03:34:05Z".parse().expect("time"))
        );
        let mut bad = action.clone();
        bad.meta.insert("notBefore".into(), json!(17));
        assert_eq!(bad.pending(root.id, now).not_before, None);
        bad.meta.insert("notBefore".into(), json!("tomorrow"));
        assert_eq!(bad.pending(root.id, now).not_before, None);
    }
}

#[cfg(test)]
mod intervention_span_meta_tests {
    use super::*;
    use serde_json::json;

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
}

#[cfg(test)]
mod run_span_meta_tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn todays_keys_read_and_write_back_unchanged() {
        let written = [
            // Restart recovery of a run left running.
            json!({"interrupted": true, "attempt": 2}),
            // A shutdown cutting a run off.
            json!({"interrupted": true}),
            // A retryable error (next to the step's error).
            json!({"retryAt": "2026-11-23T17:10:00.123Z"}),
            // A budget warning, then the run closed by a budget and handed over.
            json!({
                "budgetWarnings": ["daily cost at 80% of $10.00", "trace turns at 80% of 50"],
                "budgetStopped": true,
                "actionIds": ["5f0c6a34-2d7e-4b55-9a63-0f1e2d3c4b5a"],
            }),
            // A run closed by a person, handing over nothing.
            json!({"closedByHand": true, "actionIds": []}),
            // A failure that tripped the circuit breaker.
            json!({"circuitBreakerTripped": true}),
            json!({}),
        ];
        for shape in written {
            let Value::Object(meta) = shape.clone() else {
                unreachable!()
            };
            let read = RunSpanMeta::read(&meta);
            assert_eq!(serde_json::to_value(&read).unwrap(), shape);
            let mut again = Meta::new();
            read.put_into(&mut again);
            assert_eq!(Value::Object(again), shape);
        }
    }

    #[test]
    fn a_record_round_trips_and_merges_over_the_step_keys() {
        let record = RunSpanMeta {
            interrupted: true,
            attempt: Some(3),
            retry_at: Some(
                DateTime::parse_from_rfc3339("2026-11-23T17:10:00.123Z")
                    .unwrap()
                    .with_timezone(&Utc),
            ),
            budget_warnings: vec!["w".into()],
            budget_stopped: true,
            closed_by_hand: false,
            circuit_breaker_tripped: true,
            action_ids: Some(vec![Uuid::new_v4()]),
        };
        let mut meta = Meta::new();
        meta.insert("stepKey".into(), json!("kept"));
        record.put_into(&mut meta);
        assert_eq!(meta["stepKey"], json!("kept"));
        assert!(meta.contains_key(crate::store::PRODUCED_KEY));
        assert_eq!(RunSpanMeta::read(&meta), record);
        assert!(record.stopped());
        assert_eq!(RunSpanMeta::read(&Meta::new()), RunSpanMeta::default());
    }

    #[test]
    fn a_key_of_another_type_reads_as_missing_and_spoils_nothing_else() {
        let Value::Object(meta) = json!({
            "interrupted": "yes", "attempt": -1, "retryAt": "soon", "budgetWarnings": ["w", 4],
            "budgetStopped": 1, "closedByHand": true, "actionIds": ["not an id"],
        }) else {
            unreachable!()
        };
        let read = RunSpanMeta::read(&meta);
        assert_eq!(
            read,
            RunSpanMeta {
                budget_warnings: vec!["w".into()],
                closed_by_hand: true,
                ..RunSpanMeta::default()
            }
        );
    }

    #[test]
    fn an_error_in_the_older_bare_message_shape_still_reads() {
        let mut span = Span::root(Uuid::new_v4(), Utc::now(), Meta::new());
        assert_eq!(ErrorMeta::of_any(&span), None);
        span.meta.insert(ErrorMeta::KEY.into(), json!("it broke"));
        assert_eq!(ErrorMeta::of(&span), None);
        let legacy = ErrorMeta::of_any(&span).unwrap();
        assert_eq!(legacy.message, "it broke");
        assert!(!legacy.retryable && !legacy.tampered && legacy.details.is_empty());
        let typed = ErrorMeta {
            message: "typed".into(),
            retryable: true,
            tampered: false,
            details: Map::new(),
        };
        typed.put_into(&mut span.meta);
        assert_eq!(ErrorMeta::of_any(&span), Some(typed));
    }
}

/// The part of a `push` span's meta that the budget ledger and `gc` read back: the pull
/// request the push opened or found. A push without one (a local event, no GitHub client)
/// records `prUrl: null`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PushPullRequest {
    /// Present as `null` when the push opened no pull request.
    #[serde(
        default,
        deserialize_with = "present",
        skip_serializing_if = "Option::is_none"
    )]
    pub pr_url: Option<Option<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pr_number: Option<u64>,
    /// Whether this push opened the pull request (it counts against the budget's PR cap).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pr_created: Option<bool>,
    /// The commit pushed (`null` when it could not be read back).
    #[serde(
        default,
        deserialize_with = "present",
        skip_serializing_if = "Option::is_none"
    )]
    pub head_sha: Option<Option<String>>,
}

/// A key that is present, as `null` or a value (a missing key stays `None`: `default`).
#[allow(clippy::option_option)] // present-but-null differs from missing on disk
pub fn present<'de, D: Deserializer<'de>, T: Deserialize<'de>>(
    d: D,
) -> Result<Option<Option<T>>, D::Error> {
    Option::<T>::deserialize(d).map(Some)
}

impl PushPullRequest {
    /// What a push span recorded of its pull request (nothing, for other shapes).
    pub fn of(span: &Span) -> PushPullRequest {
        from_meta(&span.meta).unwrap_or_default()
    }

    /// Whether the push has a pull request (a URL or a number).
    pub fn exists(&self) -> bool {
        self.pr_url.as_ref().is_some_and(Option::is_some) || self.pr_number.is_some()
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

/// An entry of the pending queue: which step should process which action. (Read by
/// `records_de`, which keeps unknown keys in `extra` without `serde(flatten)`'s second pass.)
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PendingAction {
    pub trace_id: Uuid,
    pub action_id: Uuid,
    /// The span that produced the action.
    pub span_id: Uuid,
    pub action: StepKind,
    pub summary: String,
    #[serde(with = "iso")]
    pub created_at: DateTime<Utc>,
    /// How many times a step run started on this action (rover's addition, bounds retries).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub attempts: u32,
    /// The span of the run in progress, if any (rover's addition, for restart recovery).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub running_span_id: Option<Uuid>,
    /// Not to be run before this time (rover's addition: backoff after a retryable error).
    #[serde(default, skip_serializing_if = "Option::is_none", with = "iso::option")]
    pub not_before: Option<DateTime<Utc>>,
    /// A newer trace took over this scheduled re-evaluation (rover's addition): its step ends
    /// it at once, saying which trace decides.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub superseded_by: Option<Uuid>,
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

#[allow(clippy::trivially_copy_pass_by_ref)] // serde's skip_serializing_if passes a reference
fn is_zero(n: &u32) -> bool {
    *n == 0
}

/// What rover knows about the workspace of a workflow action (`state.json` `taskMappings`,
/// keyed by the workflow action id): the spec's four fields, what rover's workflow step adds,
/// and any other key (another implementation's) kept as it was.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", from = "TaskMappingWire")]
pub struct TaskMapping {
    pub task_id: String,
    pub branch_name: String,
    pub trace_id: Uuid,
    pub workflow_span_id: Uuid,
    /// The sandbox container's name (names work wherever the engine takes an id).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub container_id: Option<String>,
    /// The task's git worktree (read from the legacy `worktree` key when this one is missing).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub worktree_path: Option<PathBuf>,
    /// The commit the branch forked from (diff summaries are taken against it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fork_point: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub title: Option<String>,
    /// Keys rover does not know, written back unchanged.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

impl TaskMapping {
    /// A mapping with the spec's four fields and nothing else.
    pub fn new(task_id: &str, branch_name: &str, trace_id: Uuid, workflow_span_id: Uuid) -> Self {
        TaskMapping {
            task_id: task_id.to_owned(),
            branch_name: branch_name.to_owned(),
            trace_id,
            workflow_span_id,
            container_id: None,
            worktree_path: None,
            fork_point: None,
            title: None,
            extra: Map::new(),
        }
    }
}

/// [`TaskMapping`] as stored, before the legacy `worktree` key is read as `worktreePath`.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct TaskMappingWire {
    task_id: String,
    branch_name: String,
    trace_id: Uuid,
    workflow_span_id: Uuid,
    #[serde(default)]
    container_id: Option<String>,
    #[serde(default)]
    worktree_path: Option<PathBuf>,
    #[serde(default)]
    fork_point: Option<String>,
    #[serde(default)]
    title: Option<String>,
    #[serde(flatten)]
    extra: Map<String, Value>,
}

/// The key older stores wrote the worktree under (kept in `extra`, read as `worktreePath`).
const LEGACY_WORKTREE_KEY: &str = "worktree";

impl From<TaskMappingWire> for TaskMapping {
    fn from(w: TaskMappingWire) -> Self {
        let legacy = || {
            w.extra
                .get(LEGACY_WORKTREE_KEY)
                .and_then(Value::as_str)
                .map(PathBuf::from)
        };
        TaskMapping {
            worktree_path: w.worktree_path.clone().or_else(legacy),
            task_id: w.task_id,
            branch_name: w.branch_name,
            trace_id: w.trace_id,
            workflow_span_id: w.workflow_span_id,
            container_id: w.container_id,
            fork_point: w.fork_point,
            title: w.title,
            extra: w.extra,
        }
    }
}

/// `autopilot/state.json`: the pending queue and the task mappings. (Read by `records_de`, as
/// [`PendingAction`] is.)
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct State {
    pub version: String,
    #[serde(with = "iso")]
    pub updated_at: DateTime<Utc>,
    pub pending: Vec<PendingAction>,
    /// Keyed by the workflow action id.
    pub task_mappings: BTreeMap<String, TaskMapping>,
    /// Traces a person closed (`rover autopilot cancel` / `fail`): nothing more of them runs
    /// but their answer (rover's addition).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub closed: BTreeMap<Uuid, ClosedTrace>,
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

/// How many closed traces `state.json` remembers (the oldest are forgotten: their work ended).
pub const CLOSED_CAPACITY: usize = 200;

/// A trace a person closed, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ClosedTrace {
    /// `cancel` or `fail`.
    pub command: String,
    pub by: String,
    pub reason: String,
    #[serde(with = "iso")]
    pub at: DateTime<Utc>,
}

impl ClosedTrace {
    /// One line for spans and logs: `cancelled by alice: no longer needed`.
    pub fn describe(&self) -> String {
        let verb = if self.command == "cancel" {
            "cancelled"
        } else {
            "failed"
        };
        if self.reason.is_empty() {
            format!("{verb} by {}", self.by)
        } else {
            format!("{verb} by {}: {}", self.by, self.reason)
        }
    }
}

impl State {
    pub fn new(now: DateTime<Utc>) -> State {
        State {
            version: version(),
            updated_at: now,
            pending: Vec::new(),
            task_mappings: BTreeMap::new(),
            closed: BTreeMap::new(),
            extra: Map::new(),
        }
    }

    pub fn pending_for(&self, action_id: Uuid) -> Option<&PendingAction> {
        self.pending.iter().find(|p| p.action_id == action_id)
    }

    pub fn pending_for_mut(&mut self, action_id: Uuid) -> Option<&mut PendingAction> {
        self.pending.iter_mut().find(|p| p.action_id == action_id)
    }
}

/// `autopilot/cursor.json`: event ids already turned into traces.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Cursor {
    #[serde(deserialize_with = "check_version")]
    pub version: String,
    #[serde(with = "iso")]
    pub updated_at: DateTime<Utc>,
    pub processed_event_ids: Vec<String>,
    /// Content keys of GitHub events turned into traces, so that one event reaching rover by two
    /// paths (webhook and polling, with different ids) starts one trace (rover's addition).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub event_keys: Vec<EventKeyEntry>,
    /// The GitHub poller's ETag and seen ids (rover's addition; absent before the first poll).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub poll: Option<PollCursor>,
    /// The reconcile sweep's watermark (rover's addition; absent before the first start).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reconcile: Option<ReconcileCursor>,
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

/// The reconcile watermark in `cursor.json`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct ReconcileCursor {
    /// When the last sweep started (the next one sweeps from a little before).
    pub last_run_at: Option<DateTime<Utc>>,
    /// What the last sweep swept from.
    pub since: Option<DateTime<Utc>>,
    /// The first start: nothing before it is swept (the backlog is the poller's to skip).
    pub not_before: Option<DateTime<Utc>>,
}

/// What the GitHub poller persists between runs: the ETag and the ids already ingested.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct PollCursor {
    pub etag: Option<String>,
    /// Most recent last.
    pub seen: std::collections::VecDeque<String>,
    /// Whether a first page was ever taken (the backlog was dealt with).
    pub primed: bool,
}

/// One GitHub event's content key in the cursor: what it is, how it came, which trace it started.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EventKeyEntry {
    /// The content key (see `NormalizedEvent::dedupe_key`).
    pub key: String,
    /// The path it came by (`poll`, `webhook`).
    pub via: String,
    /// Its id on that path (the event id, the delivery id).
    pub event_id: String,
    pub trace_id: Uuid,
    /// Whether the same event has since come by the other path (and was folded into this trace).
    #[serde(default)]
    pub paired: bool,
}

/// The outcome of matching an event's content key against the cursor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyMatch {
    /// Not seen by any path: the key is recorded for `trace_id`.
    New,
    /// The same event again on the same path (same id): its trace.
    Same(Uuid),
    /// The same event, first seen by the other path: that trace.
    OtherPath(Uuid),
}

impl Cursor {
    pub fn new(now: DateTime<Utc>) -> Cursor {
        Cursor {
            version: version(),
            updated_at: now,
            processed_event_ids: Vec::new(),
            event_keys: Vec::new(),
            poll: None,
            reconcile: None,
            extra: Map::new(),
        }
    }

    /// Match an event's content key against the keys recorded, and record it if it is new.
    ///
    /// The entries of one key that share a trace are one event seen by one or more paths
    /// (`poll`, `webhook`, `reconcile`). An arrival by a path that event has not come by yet is
    /// folded into its trace (the oldest such event first); so each path matches an event once,
    /// and two distinct events that share a key and each come by several paths still make two
    /// traces.
    pub fn match_event_key(
        &mut self,
        key: &str,
        via: &str,
        event_id: &str,
        trace_id: Uuid,
    ) -> KeyMatch {
        if let Some(e) = self
            .event_keys
            .iter()
            .find(|e| e.key == key && e.via == via && e.event_id == event_id)
        {
            return KeyMatch::Same(e.trace_id);
        }
        let mut traces: Vec<Uuid> = Vec::new();
        for e in self.event_keys.iter().filter(|e| e.key == key) {
            if !traces.contains(&e.trace_id) {
                traces.push(e.trace_id);
            }
        }
        let other = traces.into_iter().find(|t| {
            !self
                .event_keys
                .iter()
                .any(|e| e.key == key && e.trace_id == *t && e.via == via)
        });
        if let Some(t) = other {
            for e in self
                .event_keys
                .iter_mut()
                .filter(|e| e.key == key && e.trace_id == t)
            {
                e.paired = true;
            }
        }
        // Recorded either way, so this path's id is known next time (`Same`).
        self.event_keys.push(EventKeyEntry {
            key: key.to_owned(),
            via: via.to_owned(),
            event_id: event_id.to_owned(),
            trace_id: other.unwrap_or(trace_id),
            paired: other.is_some(),
        });
        let excess = self.event_keys.len().saturating_sub(EVENT_KEYS_CAPACITY);
        self.event_keys.drain(..excess);
        other.map_or(KeyMatch::New, KeyMatch::OtherPath)
    }

    pub fn contains(&self, event_id: &str) -> bool {
        self.processed_event_ids.iter().any(|id| id == event_id)
    }

    /// Record an id; the oldest ids are evicted past [`CURSOR_CAPACITY`]. Returns false if known.
    pub fn insert(&mut self, event_id: &str) -> bool {
        if self.contains(event_id) {
            return false;
        }
        self.processed_event_ids.push(event_id.to_owned());
        let excess = self
            .processed_event_ids
            .len()
            .saturating_sub(CURSOR_CAPACITY);
        self.processed_event_ids.drain(..excess);
        true
    }
}

/// `autopilot/traces/<traceId>.json`: which spans and actions make up one trace (a cache,
/// rebuildable from the span and action files).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TraceIndex {
    #[serde(deserialize_with = "check_version")]
    pub version: String,
    pub trace_id: Uuid,
    #[serde(with = "iso")]
    pub created_at: DateTime<Utc>,
    #[serde(with = "iso")]
    pub updated_at: DateTime<Utc>,
    /// A one-line label of the root event.
    pub event: String,
    pub spans: Vec<Uuid>,
    pub actions: Vec<Uuid>,
}

impl TraceIndex {
    pub fn new(root: &Span, event: String) -> TraceIndex {
        TraceIndex {
            version: version(),
            trace_id: root.id,
            created_at: root.timestamp,
            updated_at: root.timestamp,
            event,
            spans: vec![root.id],
            actions: Vec::new(),
        }
    }

    /// Add ids not yet listed; returns whether anything changed.
    pub fn add(&mut self, spans: &[Uuid], actions: &[Uuid], now: DateTime<Utc>) -> bool {
        let mut changed = false;
        for id in spans {
            if !self.spans.contains(id) {
                self.spans.push(*id);
                changed = true;
            }
        }
        for id in actions {
            if !self.actions.contains(id) {
                self.actions.push(*id);
                changed = true;
            }
        }
        if changed {
            self.updated_at = now.max(self.updated_at);
        }
        changed
    }
}

/// One entry of `autopilot/traces.json`, the cache of recent traces, newest last.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TraceEntry {
    pub trace_id: Uuid,
    #[serde(with = "iso")]
    pub created_at: DateTime<Utc>,
    pub event: String,
}

/// `autopilot/traces.json`: the most recent traces in creation order (a cache).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TracesCache {
    #[serde(deserialize_with = "check_version")]
    pub version: String,
    #[serde(with = "iso")]
    pub updated_at: DateTime<Utc>,
    pub traces: Vec<TraceEntry>,
}

/// How many traces `traces.json` keeps; older ones are found through `autopilot/traces/`.
pub const TRACES_CACHE_CAPACITY: usize = 1000;

impl TracesCache {
    pub fn new(now: DateTime<Utc>) -> TracesCache {
        TracesCache {
            version: version(),
            updated_at: now,
            traces: Vec::new(),
        }
    }

    /// Add a trace (kept sorted by creation time); returns whether anything changed.
    pub fn add(&mut self, entry: TraceEntry, now: DateTime<Utc>) -> bool {
        if self.traces.iter().any(|t| t.trace_id == entry.trace_id) {
            return false;
        }
        let at = self
            .traces
            .partition_point(|t| t.created_at <= entry.created_at);
        self.traces.insert(at, entry);
        let excess = self.traces.len().saturating_sub(TRACES_CACHE_CAPACITY);
        self.traces.drain(..excess);
        self.updated_at = now;
        true
    }
}

/// One line of `autopilot/log.jsonl`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LogEntry {
    #[serde(with = "iso")]
    pub timestamp: DateTime<Utc>,
    pub level: String,
    pub target: String,
    pub message: String,
    #[serde(default, skip_serializing_if = "Map::is_empty")]
    pub fields: Map<String, Value>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_event_key_pairs_once_with_the_other_path_and_never_with_its_own() {
        let mut c = Cursor::new(Utc::now());
        let (t1, t2, t3) = (Uuid::new_v4(), Uuid::new_v4(), Uuid::new_v4());
        assert_eq!(c.match_event_key("k", "webhook", "d1", t1), KeyMatch::New);
        // The same delivery again.
        assert_eq!(
            c.match_event_key("k", "webhook", "d1", t2),
            KeyMatch::Same(t1)
        );
        // Another delivery with the same key is another event on the same path.
        assert_eq!(c.match_event_key("k", "webhook", "d2", t2), KeyMatch::New);
        // The poller sees both: each pairs with one.
        assert_eq!(
            c.match_event_key("k", "poll", "e1", t3),
            KeyMatch::OtherPath(t1)
        );
        assert_eq!(
            c.match_event_key("k", "poll", "e2", t3),
            KeyMatch::OtherPath(t2)
        );
        // The poller serving e1 again finds its own record.
        assert_eq!(c.match_event_key("k", "poll", "e1", t3), KeyMatch::Same(t1));
        // A third one by polling only is new.
        assert_eq!(c.match_event_key("k", "poll", "e3", t3), KeyMatch::New);
        let json = serde_json::to_value(&c).unwrap();
        assert_eq!(json["eventKeys"][0]["via"], "webhook");
        assert_eq!(json["eventKeys"][0]["paired"], true);
        let back: Cursor = serde_json::from_value(json).unwrap();
        assert_eq!(back.event_keys, c.event_keys);
    }

    #[test]
    fn an_event_seen_by_three_paths_is_one_trace() {
        let mut c = Cursor::new(Utc::now());
        let (t1, t2, t3) = (Uuid::new_v4(), Uuid::new_v4(), Uuid::new_v4());
        assert_eq!(c.match_event_key("k", "reconcile", "r1", t1), KeyMatch::New);
        assert_eq!(
            c.match_event_key("k", "poll", "e1", t2),
            KeyMatch::OtherPath(t1)
        );
        assert_eq!(
            c.match_event_key("k", "webhook", "d1", t3),
            KeyMatch::OtherPath(t1)
        );
        // A second event with the key, by any path, is another trace.
        assert_eq!(c.match_event_key("k", "poll", "e2", t2), KeyMatch::New);
        assert_eq!(
            c.match_event_key("k", "reconcile", "r1", t3),
            KeyMatch::Same(t1)
        );
    }

    #[test]
    fn event_keys_are_bounded() {
        let mut c = Cursor::new(Utc::now());
        for i in 0..EVENT_KEYS_CAPACITY + 5 {
            c.match_event_key(&format!("k{i}"), "poll", &i.to_string(), Uuid::nil());
        }
        assert_eq!(c.event_keys.len(), EVENT_KEYS_CAPACITY);
        assert_eq!(c.event_keys[0].key, "k5");
    }
}
