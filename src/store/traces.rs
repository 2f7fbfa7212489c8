//! Reading traces: a trace's spans, actions and pending entries through its index (cost grows
//! with the trace, not with the store), id and prefix resolution, the recent-traces list, and the
//! rebuild of these caches from the span and action files.

use std::collections::{BTreeMap, HashSet};
use std::fs;
use std::path::Path;

use chrono::Utc;
use serde::Serialize;
use uuid::Uuid;

use super::error::{Result, StoreError};
use super::fsio::{read_json, write_json_atomic};
use super::records::{
    Action, PendingAction, Span, SpanStatus, StepKind, TraceEntry, TraceIndex, TracesCache,
    TRACES_CACHE_CAPACITY,
};
use super::{event_label, traces_log, AutopilotStore, StoreLock};

/// The shortest id prefix accepted.
pub const MIN_PREFIX: usize = 8;

/// How a trace stands.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase", tag = "state")]
pub enum TraceOutcome {
    /// Work is queued or in progress.
    Running,
    /// Nothing queued, nothing running, and no terminal step: the pipeline stopped short.
    Stalled,
    /// Ended with a terminal step.
    Finished { step: StepKind, status: SpanStatus },
}

impl TraceOutcome {
    pub fn label(&self) -> String {
        match self {
            TraceOutcome::Running => "running".into(),
            TraceOutcome::Stalled => "stalled".into(),
            TraceOutcome::Finished { step, status } if *status == SpanStatus::Completed => {
                step.to_string()
            }
            TraceOutcome::Finished { step, status } => format!("{step} ({status})"),
        }
    }
}

/// Everything recorded about one trace.
#[derive(Debug, Clone)]
pub struct TraceView {
    pub index: TraceIndex,
    /// In creation order.
    pub spans: Vec<Span>,
    pub actions: Vec<Action>,
    pub pending: Vec<PendingAction>,
    /// Ids listed by the index whose files are gone (reported, never hidden).
    pub missing: Vec<Uuid>,
}

impl TraceView {
    pub fn trace_id(&self) -> Uuid {
        self.index.trace_id
    }

    pub fn root(&self) -> Option<&Span> {
        self.spans.iter().find(|s| s.id == self.index.trace_id)
    }

    /// Where the trace stands: running while anything is queued or running; otherwise finished
    /// by its latest span whose step `ends_trace` (the pipeline declares which steps end a trace:
    /// `steps::kinds::trace_outcome`), or stalled without one.
    pub fn outcome_by(&self, ends_trace: impl Fn(&StepKind) -> bool) -> TraceOutcome {
        if !self.pending.is_empty() || self.spans.iter().any(|s| s.status == SpanStatus::Running) {
            return TraceOutcome::Running;
        }
        self.spans
            .iter()
            .filter(|s| ends_trace(&s.step))
            .max_by_key(|s| s.completed.unwrap_or(s.timestamp))
            .map_or(TraceOutcome::Stalled, |s| TraceOutcome::Finished {
                step: s.step.clone(),
                status: s.status,
            })
    }

    /// The actions a span produced, in creation order.
    pub fn actions_of(&self, span_id: Uuid) -> impl Iterator<Item = &Action> {
        self.actions.iter().filter(move |a| a.span_id == span_id)
    }

    pub fn is_pending(&self, action_id: Uuid) -> bool {
        self.pending.iter().any(|p| p.action_id == action_id)
    }
}

pub(super) fn load(store: &AutopilotStore, trace_id: Uuid) -> Result<TraceView> {
    // The index is a cache: a missing or unreadable one is rebuilt by a scan.
    let index = match read_json::<TraceIndex>(&store.trace_index_path(trace_id)) {
        Ok(Some(index)) => index,
        Ok(None) | Err(StoreError::Unreadable { .. }) => {
            rebuild_one(store, trace_id)?.ok_or_else(|| StoreError::UnknownId {
                id: trace_id.to_string(),
            })?
        }
        Err(e) => return Err(e),
    };
    let state = store.read_state()?;
    let pending: Vec<PendingAction> = state
        .pending
        .into_iter()
        .filter(|p| p.trace_id == trace_id)
        .collect();
    let mut span_ids = index.spans.clone();
    for p in &pending {
        if let Some(id) = p.running_span_id.filter(|id| !span_ids.contains(id)) {
            span_ids.push(id);
        }
    }
    let mut missing = Vec::new();
    let mut spans = Vec::with_capacity(span_ids.len());
    for id in span_ids {
        match read_json::<Span>(&store.span_path(id))? {
            Some(span) => spans.push(span),
            // A running span's file is written just after it is claimed: not missing yet.
            None if pending.iter().any(|p| p.running_span_id == Some(id)) => {}
            None => missing.push(id),
        }
    }
    spans.sort_by_key(|s| s.timestamp);
    let mut actions = Vec::with_capacity(index.actions.len());
    for id in &index.actions {
        match read_json::<Action>(&store.action_path(*id))? {
            Some(action) => actions.push(action),
            None => missing.push(*id),
        }
    }
    actions.sort_by_key(|a| a.timestamp);
    Ok(TraceView {
        index,
        spans,
        actions,
        pending,
        missing,
    })
}

/// The trace of a span, walking `parentId` when the span does not record it.
fn trace_of_span(store: &AutopilotStore, span: &Span) -> Result<Uuid> {
    if let Some(id) = span.trace() {
        return Ok(id);
    }
    let mut seen = HashSet::new();
    let mut current = span.clone();
    while let Some(parent) = current.parent_id {
        if !seen.insert(parent) {
            return Err(StoreError::Unreadable {
                path: store.span_path(parent),
                reason: "parentId chain loops".into(),
            });
        }
        current = store.read_span(parent)?;
        if let Some(id) = current.trace_id {
            return Ok(id);
        }
    }
    Ok(current.id)
}

fn trace_of_action(store: &AutopilotStore, action: &Action) -> Result<Uuid> {
    match action.trace_id {
        Some(id) => Ok(id),
        None => trace_of_span(store, &store.read_span(action.span_id)?),
    }
}

pub(super) fn resolve(store: &AutopilotStore, id: &str) -> Result<Uuid> {
    let id = id.trim().to_ascii_lowercase();
    if let Ok(uuid) = Uuid::parse_str(&id) {
        return resolve_full(store, uuid)?.ok_or(StoreError::UnknownId { id });
    }
    if id.len() < MIN_PREFIX {
        return Err(StoreError::ShortId {
            id,
            min: MIN_PREFIX,
        });
    }
    if !id.chars().all(|c| c.is_ascii_hexdigit() || c == '-') {
        return Err(StoreError::UnknownId { id });
    }
    let mut matches = BTreeMap::new();
    if let Some(found) = super::ids::lookup(&store.ids_dir(), &id)
        .map_err(StoreError::io("read", store.ids_dir()))?
    {
        for (kind, uuid) in found {
            matches.entry(uuid.to_string()).or_insert(kind.name());
        }
    }
    // Nothing in the index (an old store, or an id whose append a crash cut off): scan.
    if matches.is_empty() {
        for (dir, kind) in [
            (store.trace_index_dir(), "trace"),
            (store.spans_dir(), "span"),
            (store.actions_dir(), "action"),
        ] {
            for name in file_stems(&dir)? {
                if name.starts_with(&id) {
                    matches.entry(name).or_insert(kind);
                }
            }
        }
    }
    match matches.len() {
        0 => Err(StoreError::UnknownId { id }),
        1 => {
            let (name, _) = matches.into_iter().next().expect("one match");
            let uuid =
                Uuid::parse_str(&name).map_err(|_| StoreError::UnknownId { id: name.clone() })?;
            resolve_full(store, uuid)?.ok_or(StoreError::UnknownId { id: name })
        }
        _ => Err(StoreError::AmbiguousId {
            id,
            matches: matches
                .into_iter()
                .map(|(name, kind)| format!("{kind} {name}"))
                .collect(),
        }),
    }
}

fn resolve_full(store: &AutopilotStore, id: Uuid) -> Result<Option<Uuid>> {
    if store.trace_index_path(id).is_file() {
        return Ok(Some(id));
    }
    if let Some(span) = read_json::<Span>(&store.span_path(id))? {
        return trace_of_span(store, &span).map(Some);
    }
    if let Some(action) = read_json::<Action>(&store.action_path(id))? {
        return trace_of_action(store, &action).map(Some);
    }
    Ok(None)
}

/// The `<uuid>` stems of the `<uuid>.json` files of a directory (temp and corrupt files skipped).
fn file_stems(dir: &Path) -> Result<Vec<String>> {
    let entries = match fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(StoreError::io("list", dir)(e)),
    };
    let mut out = Vec::new();
    for entry in entries {
        let entry = entry.map_err(StoreError::io("list", dir))?;
        let name = entry.file_name();
        if let Some(stem) = name.to_str().and_then(|n| n.strip_suffix(".json")) {
            if !stem.starts_with('.') {
                out.push(stem.to_owned());
            }
        }
    }
    Ok(out)
}

/// The recent-traces list: `traces.json` plus the traces logged since (`traces.jsonl`), or the
/// same list rebuilt from the root spans when `traces.json` is missing (a store written by
/// another implementation of the format, or the cache deleted) or either file is unreadable;
/// the flag says whether `traces.json` needs writing.
pub(super) fn load_cache(store: &AutopilotStore) -> Result<(TracesCache, bool)> {
    let log = match traces_log::read(&store.traces_log_path()) {
        Ok(log) => log,
        Err(StoreError::Unreadable { .. }) => return Ok((rebuild_cache(store)?, true)),
        Err(e) => return Err(e),
    };
    match read_json::<TracesCache>(&store.traces_path()) {
        Ok(Some(mut cache)) => {
            let now = Utc::now();
            let mut changed = false;
            for entry in log {
                changed |= cache.add(entry, now);
            }
            Ok((cache, changed))
        }
        Ok(None) if file_stems(&store.spans_dir())?.is_empty() => {
            Ok((TracesCache::new(Utc::now()), true))
        }
        Ok(None) | Err(StoreError::Unreadable { .. }) => Ok((rebuild_cache(store)?, true)),
        Err(e) => Err(e),
    }
}

/// List newly started traces (the caller holds the store lock): a line each appended to
/// `traces.jsonl`, whatever the list's length; every [`traces_log::COMPACT_LINES`] traces, or
/// when `traces.json` is missing, the log is folded into `traces.json` instead.
pub(super) fn record_new(store: &AutopilotStore, entries: &[TraceEntry]) -> Result<()> {
    if entries.is_empty() {
        return Ok(());
    }
    let log_path = store.traces_log_path();
    let (lines, valid) = traces_log::count(&log_path)?;
    if lines + entries.len() < traces_log::COMPACT_LINES && store.traces_path().is_file() {
        return traces_log::append(&log_path, valid, entries);
    }
    let (mut cache, _) = load_cache(store)?;
    let now = Utc::now();
    for entry in entries {
        cache.add(entry.clone(), now);
    }
    cache.updated_at = now;
    write_cache(store, &cache)
}

/// Write `traces.json` whole, then drop the log it now includes (a crash in between leaves
/// entries in both, which readers count once).
fn write_cache(store: &AutopilotStore, cache: &TracesCache) -> Result<()> {
    write_json_atomic(&store.traces_path(), cache)?;
    traces_log::remove(&store.traces_log_path())
}

pub(super) fn recent(store: &AutopilotStore, limit: usize) -> Result<Vec<TraceEntry>> {
    let (cache, _) = load_cache(store)?;
    let mut entries = if limit > cache.traces.len() && cache.traces.len() >= TRACES_CACHE_CAPACITY {
        all_entries(store)?
    } else {
        cache.traces
    };
    entries.reverse();
    entries.truncate(limit);
    Ok(entries)
}

/// Every trace with an index, oldest first.
fn all_entries(store: &AutopilotStore) -> Result<Vec<TraceEntry>> {
    let mut entries = Vec::new();
    for stem in file_stems(&store.trace_index_dir())? {
        let Ok(id) = Uuid::parse_str(&stem) else {
            continue;
        };
        match read_json::<TraceIndex>(&store.trace_index_path(id)) {
            Ok(Some(index)) => entries.push(TraceEntry {
                trace_id: index.trace_id,
                created_at: index.created_at,
                event: index.event,
            }),
            Ok(None) => {}
            // An unreadable index: the root span says the same.
            Err(StoreError::Unreadable { .. }) => {
                if let Some(root) = read_json::<Span>(&store.span_path(id))? {
                    entries.push(TraceEntry {
                        trace_id: id,
                        created_at: root.timestamp,
                        event: event_label(&root),
                    });
                }
            }
            Err(e) => return Err(e),
        }
    }
    entries.sort_by_key(|e| e.created_at);
    Ok(entries)
}

/// The traces cache from the root spans, the source of truth (the per-trace indexes may be
/// missing too).
pub(super) fn rebuild_cache(store: &AutopilotStore) -> Result<TracesCache> {
    let mut cache = TracesCache::new(Utc::now());
    let mut entries = Vec::new();
    for stem in file_stems(&store.spans_dir())? {
        let Ok(id) = Uuid::parse_str(&stem) else {
            continue;
        };
        if let Some(root) =
            read_json::<Span>(&store.span_path(id))?.filter(|s| s.parent_id.is_none())
        {
            entries.push(TraceEntry {
                trace_id: root.id,
                created_at: root.timestamp,
                event: event_label(&root),
            });
        }
    }
    entries.sort_by_key(|e| e.created_at);
    let skip = entries.len().saturating_sub(TRACES_CACHE_CAPACITY);
    cache.traces = entries.into_iter().skip(skip).collect();
    Ok(cache)
}

/// Scan every span and action and group them by trace.
fn scan(store: &AutopilotStore) -> Result<BTreeMap<Uuid, TraceIndex>> {
    let mut spans = Vec::new();
    for stem in file_stems(&store.spans_dir())? {
        let Ok(id) = Uuid::parse_str(&stem) else {
            continue;
        };
        if let Some(span) = read_json::<Span>(&store.span_path(id))? {
            spans.push(span);
        }
    }
    let mut by_trace: BTreeMap<Uuid, TraceIndex> = BTreeMap::new();
    spans.sort_by_key(|s| s.timestamp);
    for span in spans.iter().filter(|s| s.parent_id.is_none()) {
        by_trace.insert(span.id, TraceIndex::new(span, event_label(span)));
    }
    for span in spans.iter().filter(|s| s.parent_id.is_some()) {
        let trace = trace_of_span(store, span)?;
        if let Some(index) = by_trace.get_mut(&trace) {
            index.add(&[span.id], &[], span.completed.unwrap_or(span.timestamp));
        }
    }
    let mut actions = Vec::new();
    for stem in file_stems(&store.actions_dir())? {
        let Ok(id) = Uuid::parse_str(&stem) else {
            continue;
        };
        if let Some(action) = read_json::<Action>(&store.action_path(id))? {
            actions.push(action);
        }
    }
    actions.sort_by_key(|a| a.timestamp);
    for action in &actions {
        let trace = trace_of_action(store, action)?;
        if let Some(index) = by_trace.get_mut(&trace) {
            index.add(&[], &[action.id], action.timestamp);
        }
    }
    Ok(by_trace)
}

/// Rebuild one trace's index by a scan (rare: its index was lost or unreadable).
pub(super) fn rebuild_one(store: &AutopilotStore, trace_id: Uuid) -> Result<Option<TraceIndex>> {
    if !store.span_path(trace_id).is_file() {
        return Ok(None);
    }
    Ok(scan(store)?.remove(&trace_id))
}

pub(super) fn rebuild(store: &AutopilotStore) -> Result<usize> {
    let _lock = StoreLock::acquire(&store.lock_path())?;
    let by_trace = scan(store)?;
    let ids_dir = store.ids_dir();
    if ids_dir.is_dir() {
        fs::remove_dir_all(&ids_dir).map_err(StoreError::io("remove", &ids_dir))?;
    }
    for index in by_trace.values() {
        for id in &index.spans {
            store.index_id(super::IdKind::Span, *id);
        }
        for id in &index.actions {
            store.index_id(super::IdKind::Action, *id);
        }
    }
    for (id, index) in &by_trace {
        write_json_atomic(&store.trace_index_path(*id), index)?;
    }
    write_cache(store, &rebuild_cache(store)?)?;
    Ok(by_trace.len())
}
