//! Reading `state.json` and its queue entries without `serde(flatten)`.
//!
//! [`State`] and [`PendingAction`] keep the keys rover does not know (`extra`, written back
//! unchanged). Derived with `serde(flatten)`, serde first buffers the whole object as untyped
//! content and then reads it a second time: for the state that is the whole queue, paid by every
//! separate process that reads it (`submit`, `status`, a cron `--once`). These visitors read each
//! key once: a known one straight into its field, any other into `extra`. What they accept and
//! refuse is what the derived code did (missing and duplicate fields, versions, times).

use std::collections::BTreeMap;
use std::fmt;
use std::marker::PhantomData;

use chrono::{DateTime, Utc};
use serde::de::{self, Deserializer, MapAccess, Visitor};
use serde::Deserialize;
use serde_json::{Map, Value};
use uuid::Uuid;

use super::records::{check_version, iso, PendingAction, State, StepKind};

/// A time in the store's ISO-8601 format.
struct Iso(DateTime<Utc>);

impl<'de> Deserialize<'de> for Iso {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        iso::deserialize(d).map(Iso)
    }
}

/// An optional time (`null` while unset).
struct IsoOption(Option<DateTime<Utc>>);

impl<'de> Deserialize<'de> for IsoOption {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        iso::option::deserialize(d).map(IsoOption)
    }
}

/// A record version this rover reads (`1.x`).
pub(super) struct Version(pub(super) String);

impl<'de> Deserialize<'de> for Version {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        check_version(d).map(Version)
    }
}

/// A key: one of `known` (its index), or another one, kept by name.
enum Key {
    Known(usize),
    Other(String),
}

struct KeySeed(&'static [&'static str]);

impl<'de> de::DeserializeSeed<'de> for KeySeed {
    type Value = Key;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Key, D::Error> {
        d.deserialize_identifier(self)
    }
}

impl Visitor<'_> for KeySeed {
    type Value = Key;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a field name")
    }
    fn visit_str<E: de::Error>(self, v: &str) -> Result<Key, E> {
        Ok(match self.0.iter().position(|k| *k == v) {
            Some(i) => Key::Known(i),
            None => Key::Other(v.to_owned()),
        })
    }
}

/// One field's slot: set once (a second value is an error, as serde's derive says it).
fn set<'de, A: MapAccess<'de>, T: Deserialize<'de>>(
    slot: &mut Option<T>,
    map: &mut A,
    name: &'static str,
) -> Result<(), A::Error> {
    if slot.is_some() {
        return Err(de::Error::duplicate_field(name));
    }
    *slot = Some(map.next_value()?);
    Ok(())
}

fn required<T, E: de::Error>(slot: Option<T>, name: &'static str) -> Result<T, E> {
    slot.ok_or_else(|| E::missing_field(name))
}

/// Another key: kept in `extra` (the last value of a repeated one wins, as with `flatten`).
fn keep<'de, A: MapAccess<'de>>(
    extra: &mut Map<String, Value>,
    map: &mut A,
    key: String,
) -> Result<(), A::Error> {
    let value: Value = map.next_value()?;
    extra.insert(key, value);
    Ok(())
}

const STATE_FIELDS: &[&str] = &["version", "updatedAt", "pending", "taskMappings", "closed"];

impl<'de> Deserialize<'de> for State {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_map(StateVisitor)
    }
}

struct StateVisitor;

impl<'de> Visitor<'de> for StateVisitor {
    type Value = State;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("the state object")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<State, A::Error> {
        let (mut version, mut updated_at, mut pending, mut task_mappings, mut closed) =
            (None::<Version>, None::<Iso>, None, None, None);
        let mut extra = Map::new();
        while let Some(key) = map.next_key_seed(KeySeed(STATE_FIELDS))? {
            match key {
                Key::Known(0) => set(&mut version, &mut map, "version")?,
                Key::Known(1) => set(&mut updated_at, &mut map, "updatedAt")?,
                Key::Known(2) => set(&mut pending, &mut map, "pending")?,
                Key::Known(3) => set(&mut task_mappings, &mut map, "taskMappings")?,
                Key::Known(_) => set(&mut closed, &mut map, "closed")?,
                Key::Other(key) => keep(&mut extra, &mut map, key)?,
            }
        }
        Ok(State {
            version: required(version, "version")?.0,
            updated_at: required(updated_at, "updatedAt")?.0,
            pending: required(pending, "pending")?,
            task_mappings: required(task_mappings, "taskMappings")?,
            closed: closed.unwrap_or_else(BTreeMap::new),
            extra,
        })
    }
}

const PENDING_FIELDS: &[&str] = &[
    "traceId",
    "actionId",
    "spanId",
    "action",
    "summary",
    "createdAt",
    "attempts",
    "runningSpanId",
    "notBefore",
    "supersededBy",
];

impl<'de> Deserialize<'de> for PendingAction {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_map(PendingVisitor(PhantomData))
    }
}

struct PendingVisitor(PhantomData<PendingAction>);

impl<'de> Visitor<'de> for PendingVisitor {
    type Value = PendingAction;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a pending queue entry")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<PendingAction, A::Error> {
        let (mut trace_id, mut action_id, mut span_id) = (None::<Uuid>, None::<Uuid>, None::<Uuid>);
        let (mut action, mut summary, mut created_at) =
            (None::<StepKind>, None::<String>, None::<Iso>);
        let mut attempts = None::<u32>;
        let mut running_span_id = None::<Option<Uuid>>;
        let mut not_before = None::<IsoOption>;
        let mut superseded_by = None::<Option<Uuid>>;
        let mut extra = Map::new();
        while let Some(key) = map.next_key_seed(KeySeed(PENDING_FIELDS))? {
            match key {
                Key::Known(0) => set(&mut trace_id, &mut map, "traceId")?,
                Key::Known(1) => set(&mut action_id, &mut map, "actionId")?,
                Key::Known(2) => set(&mut span_id, &mut map, "spanId")?,
                Key::Known(3) => set(&mut action, &mut map, "action")?,
                Key::Known(4) => set(&mut summary, &mut map, "summary")?,
                Key::Known(5) => set(&mut created_at, &mut map, "createdAt")?,
                Key::Known(6) => set(&mut attempts, &mut map, "attempts")?,
                Key::Known(7) => set(&mut running_span_id, &mut map, "runningSpanId")?,
                Key::Known(8) => set(&mut not_before, &mut map, "notBefore")?,
                Key::Known(_) => set(&mut superseded_by, &mut map, "supersededBy")?,
                Key::Other(key) => keep(&mut extra, &mut map, key)?,
            }
        }
        Ok(PendingAction {
            trace_id: required(trace_id, "traceId")?,
            action_id: required(action_id, "actionId")?,
            span_id: required(span_id, "spanId")?,
            action: required(action, "action")?,
            summary: required(summary, "summary")?,
            created_at: required(created_at, "createdAt")?.0,
            attempts: attempts.unwrap_or(0),
            running_span_id: running_span_id.flatten(),
            not_before: not_before.and_then(|t| t.0),
            superseded_by: superseded_by.flatten(),
            extra,
        })
    }
}
