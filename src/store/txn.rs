//! A read-modify-write of the shared files under the store lock. Files are loaded on first use
//! and written back on commit only if they changed: caches first, the state and `cursor.json`
//! last, so a crash in between leaves caches ahead of the queue, never the queue ahead of them.
//!
//! Queue changes made through [`Txn::push_pending`], [`Txn::remove_pending`] and
//! [`Txn::pending_mut`] are appended to the journal as one record; any other change to the state
//! ([`Txn::state_mut`]) rewrites `state.json` whole (a compaction).

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use chrono::{DateTime, Utc};
use serde::de::DeserializeOwned;
use serde::Serialize;
use uuid::Uuid;

use super::error::{Result, StoreError};
use super::fsio::{quarantine, read_json, write_json_atomic};
use super::intake::IntakeRecord;
use super::journal::{self, Cached, Op};
use super::records::{Cursor, PendingAction, Span, State, TraceEntry, TraceIndex};
use super::{traces, AutopilotStore};

struct Loaded<T> {
    value: T,
    dirty: bool,
}

/// Open transaction; see [`AutopilotStore::transact`].
pub struct Txn<'a> {
    store: &'a AutopilotStore,
    /// The handle's state from its last transaction, until this one loads the state.
    cached: Option<Cached>,
    state: Option<Cached>,
    /// Queue changes to journal, in order; entries changed in place are put at commit.
    ops: Vec<Op>,
    /// New entries pushed before the state was loaded ([`Txn::push_new_pending`]).
    fresh: Vec<PendingAction>,
    touched: BTreeSet<Uuid>,
    /// The state changed otherwise: write it whole.
    whole: bool,
    compact: bool,
    cursor: Option<Loaded<Cursor>>,
    /// Traces started in this transaction, listed in the recent-traces log on commit.
    new_traces: Vec<TraceEntry>,
    indexes: BTreeMap<Uuid, Loaded<Option<TraceIndex>>>,
    /// Intake records to append once the rest is written, still under the lock.
    intake: Vec<IntakeRecord>,
}

/// Load a shared file for modification: missing → `fresh`, corrupt → a copy is kept aside and
/// the error names both.
fn load_shared<T: DeserializeOwned>(path: &Path, fresh: impl FnOnce() -> T) -> Result<T> {
    match read_json(path) {
        Ok(Some(v)) => Ok(v),
        Ok(None) => Ok(fresh()),
        Err(StoreError::Unreadable { path, reason }) => Err(quarantine(&path, reason)),
        Err(e) => Err(e),
    }
}

fn save<T: Serialize>(path: &Path, loaded: Option<&Loaded<T>>) -> Result<()> {
    match loaded {
        Some(l) if l.dirty => write_json_atomic(path, &l.value),
        _ => Ok(()),
    }
}

impl<'a> Txn<'a> {
    pub(super) fn new(store: &'a AutopilotStore, cached: Option<Cached>) -> Txn<'a> {
        Txn {
            store,
            cached,
            state: None,
            ops: Vec::new(),
            fresh: Vec::new(),
            touched: BTreeSet::new(),
            whole: false,
            compact: false,
            cursor: None,
            new_traces: Vec::new(),
            indexes: BTreeMap::new(),
            intake: Vec::new(),
        }
    }

    /// Append `record` to the intake log with this update: after the traces and the cursor are
    /// written and before the lock goes, so an arrival that sees this update's trace or event
    /// key is logged after this record. Failing to append only loses the record (logged).
    pub fn record_intake(&mut self, record: IntakeRecord) {
        self.intake.push(record);
    }

    /// The state, for reading.
    pub fn state(&mut self) -> Result<&State> {
        Ok(&self.loaded()?.state)
    }

    /// The state, for changing anything (written back whole on commit). Queue changes go through
    /// [`Txn::push_pending`], [`Txn::remove_pending`] and [`Txn::pending_mut`], which journal.
    pub fn state_mut(&mut self) -> Result<&mut State> {
        self.whole = true;
        Ok(&mut self.loaded()?.state)
    }

    /// Write the whole state to `state.json` on commit and start the journal afresh.
    pub fn compact(&mut self) -> Result<()> {
        let path = self.store.state_path();
        let c = self.loaded()?;
        // Already folded: `state.json` is on disk and no journal record follows it.
        self.compact = !(c.pos.seq == journal::state_seq(&c.state) && path.is_file());
        Ok(())
    }

    fn loaded(&mut self) -> Result<&mut Cached> {
        if self.state.is_none() {
            let cached = self.cached.take();
            let mut c = journal::load(self.store, true, cached)?;
            // Pushed before the load: queued now, as `push_pending` would have (first in order).
            for p in std::mem::take(&mut self.fresh) {
                if c.state.pending_for(p.action_id).is_none() {
                    c.state.pending.push(p.clone());
                    self.ops.push(Op::Put(p));
                }
            }
            self.state = Some(c);
        }
        Ok(self.state.as_mut().expect("just loaded"))
    }

    pub fn cursor_mut(&mut self) -> Result<&mut Cursor> {
        if self.cursor.is_none() {
            let value = load_shared(&self.store.cursor_path(), || Cursor::new(Utc::now()))?;
            self.cursor = Some(Loaded {
                value,
                dirty: false,
            });
        }
        let l = self.cursor.as_mut().expect("just loaded");
        l.dirty = true;
        Ok(&mut l.value)
    }

    /// Append to the queue unless the action is already queued. Returns whether it was added.
    pub fn push_pending(&mut self, pending: PendingAction) -> Result<bool> {
        if self.state()?.pending_for(pending.action_id).is_some() {
            return Ok(false);
        }
        self.loaded()?.state.pending.push(pending.clone());
        self.touched.remove(&pending.action_id);
        self.ops.push(Op::Put(pending));
        Ok(true)
    }

    /// Append an entry nobody else can have queued (the first action of a trace whose id was
    /// just made): as [`Txn::push_pending`], but a handle that holds no state (a separate
    /// process: `submit`) appends it to the journal without reading the queue, unless this
    /// transaction reads the state anyway or the files are out of the ordinary
    /// (`journal::append_new`).
    pub fn push_new_pending(&mut self, pending: PendingAction) -> Result<()> {
        if self.state.is_some() || self.cached.is_some() {
            self.push_pending(pending)?;
        } else if !self.fresh.iter().any(|p| p.action_id == pending.action_id) {
            self.fresh.push(pending);
        }
        Ok(())
    }

    pub fn remove_pending(&mut self, action_id: Uuid) -> Result<Option<PendingAction>> {
        let Some(at) = self
            .state()?
            .pending
            .iter()
            .position(|p| p.action_id == action_id)
        else {
            return Ok(None);
        };
        self.touched.remove(&action_id);
        self.ops.push(Op::Remove(action_id));
        Ok(Some(self.loaded()?.state.pending.remove(at)))
    }

    pub fn pending_mut(&mut self, action_id: Uuid) -> Result<Option<&mut PendingAction>> {
        if self.state()?.pending_for(action_id).is_none() {
            return Ok(None);
        }
        self.touched.insert(action_id);
        Ok(self.loaded()?.state.pending_for_mut(action_id))
    }

    /// A trace's index, loading it (or rebuilding it if it is unreadable: it is a cache).
    pub fn trace_index(&mut self, trace_id: Uuid) -> Result<Option<&TraceIndex>> {
        if !self.indexes.contains_key(&trace_id) {
            let path = self.store.trace_index_path(trace_id);
            let value = match read_json::<TraceIndex>(&path) {
                Ok(v) => v,
                Err(StoreError::Unreadable { .. }) => traces::rebuild_one(self.store, trace_id)?,
                Err(e) => return Err(e),
            };
            let dirty = false;
            self.indexes.insert(trace_id, Loaded { value, dirty });
        }
        Ok(self.indexes.get(&trace_id).and_then(|l| l.value.as_ref()))
    }

    /// Create the index of a new trace (kept if it exists) and list it in the traces cache.
    pub fn create_trace_index(&mut self, root: &Span, event: String) -> Result<()> {
        if self.trace_index(root.id)?.is_none() {
            let index = TraceIndex::new(root, event.clone());
            self.indexes.insert(
                root.id,
                Loaded {
                    value: Some(index),
                    dirty: true,
                },
            );
        }
        let entry = TraceEntry {
            trace_id: root.id,
            created_at: root.timestamp,
            event,
        };
        if !self.new_traces.iter().any(|e| e.trace_id == entry.trace_id) {
            self.new_traces.push(entry);
        }
        Ok(())
    }

    /// Add spans and actions to a trace's index (a trace without an index is left alone: it was
    /// created by another implementation and is found by a scan).
    pub fn add_to_trace(
        &mut self,
        trace_id: Uuid,
        spans: &[Uuid],
        actions: &[Uuid],
        now: DateTime<Utc>,
    ) -> Result<()> {
        self.trace_index(trace_id)?;
        if let Some(l) = self.indexes.get_mut(&trace_id) {
            if let Some(index) = l.value.as_mut() {
                l.dirty |= index.add(spans, actions, now);
            }
        }
        Ok(())
    }

    /// Write back what changed; returns the state for the handle to keep (`None` if this
    /// transaction never loaded it).
    pub(super) fn commit(self) -> Result<Option<Cached>> {
        let now = Utc::now();
        for (id, l) in &self.indexes {
            if let (true, Some(index)) = (l.dirty, &l.value) {
                write_json_atomic(&self.store.trace_index_path(*id), index)?;
            }
        }
        traces::record_new(self.store, &self.new_traces)?;
        let mut ops = self.ops;
        let mut kept = self.state.or(self.cached);
        if kept.is_none() && !self.fresh.is_empty() {
            kept = append_fresh(self.store, &self.fresh, &mut ops, now)?;
        }
        let mut stale = false;
        if let Some(c) = kept.as_mut() {
            for id in &self.touched {
                if let Some(p) = c.state.pending_for(*id) {
                    ops.push(Op::Put(p.clone()));
                }
            }
            if self.whole || self.compact {
                if self.whole {
                    c.state.updated_at = now;
                }
                journal::compact(self.store, c)?;
            } else if !ops.is_empty() && journal::append(self.store, c, ops, now)? {
                // The operation is durable in the journal: a compaction that fails now is
                // retried by the next one, and this handle reads the files afresh.
                if let Err(e) = journal::compact(self.store, c) {
                    tracing::warn!(
                        error = &e as &dyn std::error::Error,
                        "cannot fold the queue journal into state.json"
                    );
                    stale = true;
                }
            }
        }
        if stale {
            kept = None;
        }
        let mut cursor = self.cursor;
        if let Some(l) = cursor.as_mut().filter(|l| l.dirty) {
            l.value.updated_at = now;
        }
        save(&self.store.cursor_path(), cursor.as_ref())?;
        if let Err(e) = self.store.append_intake_locked(&self.intake) {
            tracing::warn!(
                error = &e as &dyn std::error::Error,
                "cannot record an arrival in the intake log"
            );
        }
        Ok(kept)
    }
}

/// Journal the entries of [`Txn::push_new_pending`] without reading the queue; when the
/// files are out of the ordinary, the state is read and returned with them as `ops`, for the
/// usual append.
fn append_fresh(
    store: &AutopilotStore,
    fresh: &[PendingAction],
    ops: &mut Vec<Op>,
    now: DateTime<Utc>,
) -> Result<Option<Cached>> {
    let puts = fresh.iter().cloned().map(Op::Put).collect();
    match journal::append_new(store, puts, now)? {
        journal::Blind::Appended(false) => Ok(None),
        journal::Blind::Appended(true) => {
            // The record is durable: a fold that fails now is retried by the next one.
            let folded =
                journal::load(store, true, None).and_then(|mut c| journal::compact(store, &mut c));
            if let Err(e) = folded {
                tracing::warn!(
                    error = &e as &dyn std::error::Error,
                    "cannot fold the queue journal into state.json"
                );
            }
            Ok(None)
        }
        journal::Blind::Unusual => {
            let mut c = journal::load(store, true, None)?;
            for p in fresh {
                if c.state.pending_for(p.action_id).is_none() {
                    c.state.pending.push(p.clone());
                    ops.push(Op::Put(p.clone()));
                }
            }
            Ok(Some(c))
        }
    }
}
