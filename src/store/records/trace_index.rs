//! `autopilot/traces/<traceId>.json` (which spans and actions make up a trace) and
//! `autopilot/traces.json` (the cache of recent traces).

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use super::span::Span;
use super::{check_version, iso, version};

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
