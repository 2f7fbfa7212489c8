//! `autopilot/cursor.json`: the events already turned into traces, and where polling and
//! reconciling stand.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use uuid::Uuid;

use super::{check_version, iso, version, CURSOR_CAPACITY, EVENT_KEYS_CAPACITY};

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
