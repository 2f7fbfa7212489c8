//! The parts of a span's `meta` every layer reads or writes whatever the step: an agent call's
//! figures, an error, the keys the orchestrator adds to any span. (What one step writes is its
//! own record, in `steps::meta`; the root event's, in `intake`.)

use chrono::{DateTime, Utc};
use serde::{Deserialize, Deserializer, Serialize};
use serde_json::{Map, Value};
use uuid::Uuid;

use super::span::Span;
use super::{iso, Meta};

/// `true` only for the JSON value `true`.
pub(super) fn flag<'de, D: Deserializer<'de>>(d: D) -> Result<bool, D::Error> {
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
    /// How the run got its agent slot (`autopilot.daemon.maxRuns`): written by the scheduler
    /// on the runs of the steps that take one.
    #[serde(
        deserialize_with = "scheduled",
        skip_serializing_if = "Option::is_none"
    )]
    pub scheduled: Option<ScheduledMeta>,
}

/// `meta.scheduled`: why the scheduler gave a run an agent slot when it did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ScheduledMeta {
    /// Its score when it was chosen (docs/configuration.md, "The scheduler's score").
    pub score: i64,
    /// Each part of the score: `label critical: +300`, `retry 1: -50`.
    pub why: Vec<String>,
    /// The repository it ran for (`owner/name`, or the project id for a local checkout).
    pub repository: String,
    /// Agent slots taken across the daemon once it started, itself included.
    pub slots_taken: usize,
    /// The daemon's `maxRuns`.
    pub max_runs: usize,
    /// Runs that were waiting for a slot when it was chosen, itself excluded.
    pub passed_over: usize,
}

/// A scheduling record, or none for a value of another shape.
fn scheduled<'de, D: Deserializer<'de>>(d: D) -> Result<Option<ScheduledMeta>, D::Error> {
    Ok(serde_json::from_value(Value::deserialize(d)?).ok())
}

/// A count that fits a `u32`, or none for a value of any other type.
pub(super) fn count<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u32>, D::Error> {
    Ok(Value::deserialize(d)?
        .as_u64()
        .and_then(|n| u32::try_from(n).ok()))
}

/// An RFC 3339 time, or none for a value of any other type.
pub(super) fn time<'de, D: Deserializer<'de>>(d: D) -> Result<Option<DateTime<Utc>>, D::Error> {
    Ok(match Value::deserialize(d)? {
        Value::String(s) => DateTime::parse_from_rfc3339(&s)
            .ok()
            .map(|t| t.with_timezone(&Utc)),
        _ => None,
    })
}

/// The strings of an array (its other items skipped), or none for a value of any other type.
pub(super) fn texts<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<String>, D::Error> {
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
pub(super) fn uuids<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Vec<Uuid>>, D::Error> {
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

/// A key that is present, as `null` or a value (a missing key stays `None`: `default`).
#[allow(clippy::option_option)] // present-but-null differs from missing on disk
pub fn present<'de, D: Deserializer<'de>, T: Deserialize<'de>>(
    d: D,
) -> Result<Option<Option<T>>, D::Error> {
    Option::<T>::deserialize(d).map(Some)
}
