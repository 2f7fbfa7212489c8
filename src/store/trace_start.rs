//! Starting a trace: its root span, its first action queued and its index, in one locked
//! update, idempotent by the root's id; a GitHub event's also matched by its content key against
//! `cursor.json` (the same event by another path). The callers are intake's (`intake::ingest`).

use chrono::Utc;
use uuid::Uuid;

use super::error::Result;
use super::fsio::read_json;
use super::records::{Action, KeyMatch, Span};
use super::txn::Txn;
use super::AutopilotStore;

/// What [`AutopilotStore::create_event_trace_in`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TraceCreated {
    /// A new trace (its id is the root span's).
    New,
    /// The event had already started this trace (the same id again: a replay, a re-poll).
    Existing(Uuid),
    /// The same event had already come by the other path and started this trace.
    OtherPath(Uuid),
}

/// The one line a trace is listed by (`traces.json`, `trace`): its root span's summary, where
/// intake writes the event's label (`IssuesEvent opened #12 by alice`), else `event`. The store
/// reads no step's meta for it.
pub fn event_label(root: &Span) -> String {
    root.summary
        .as_deref()
        .filter(|s| !s.trim().is_empty())
        .unwrap_or("event")
        .to_owned()
}

impl AutopilotStore {
    /// Start a trace: its root `event` span (already finished), its first action, and the event
    /// ids it consumed (recorded in the cursor).
    ///
    /// Idempotent, so that an event ingested again after a crash (same deterministic ids) finishes
    /// what the crash cut off instead of starting a second trace; a trace whose first action was
    /// already taken by a step is left alone. Returns whether the trace is new.
    pub fn create_trace(
        &self,
        root: &Span,
        first: Option<&Action>,
        event_ids: &[String],
    ) -> Result<bool> {
        self.transact(|txn| self.create_trace_in(txn, root, first, event_ids))
    }

    /// Start a trace whose root id was just made (`Uuid::new_v4`: a local request) in
    /// transaction `txn`: its first action is journaled without reading the queue (see
    /// [`Txn::push_new_pending`]), the arrival recorded by the caller in the same update.
    /// Returns whether the trace is new.
    pub fn create_new_trace_in(
        &self,
        txn: &mut Txn<'_>,
        root: &Span,
        first: Option<&Action>,
    ) -> Result<bool> {
        self.start_trace_in(txn, root, first, &[], true)
    }

    /// Start the trace of a GitHub event in transaction `txn`, unless the same event already
    /// started one.
    ///
    /// Like [`AutopilotStore::create_trace`] (idempotent by the root's deterministic id), and in
    /// the same locked update the event's content key (`key`, if it has one) is matched against
    /// the keys in `cursor.json`: the same event arriving by the other path (`via`: `poll` or
    /// `webhook`, whose ids differ) is folded into the trace it already started. The caller
    /// records the arrival in the intake log with the same update ([`Txn::record_intake`]).
    pub fn create_event_trace_in(
        &self,
        txn: &mut Txn<'_>,
        root: &Span,
        first: Option<&Action>,
        event_id: &str,
        key: Option<&str>,
        via: &str,
    ) -> Result<TraceCreated> {
        txn.cursor_mut()?.insert(event_id);
        let matched = match key {
            Some(key) => txn
                .cursor_mut()?
                .match_event_key(key, via, event_id, root.id),
            None => KeyMatch::New,
        };
        Ok(match matched {
            KeyMatch::Same(trace) => TraceCreated::Existing(trace),
            KeyMatch::OtherPath(trace) => TraceCreated::OtherPath(trace),
            KeyMatch::New if self.create_trace_in(txn, root, first, &[])? => TraceCreated::New,
            KeyMatch::New => TraceCreated::Existing(root.id),
        })
    }

    /// Start a trace whose root id is deterministic in transaction `txn`, idempotent by that id
    /// (a trace started before keeps its first records). Returns whether the trace is new.
    pub fn create_trace_in(
        &self,
        txn: &mut Txn<'_>,
        root: &Span,
        first: Option<&Action>,
        event_ids: &[String],
    ) -> Result<bool> {
        self.start_trace_in(txn, root, first, event_ids, false)
    }

    /// [`AutopilotStore::create_trace_in`]; `new_id`: the root's id was just made
    /// (`Uuid::new_v4`, a local request), so a trace without an index cannot have its first
    /// action queued yet, and a separate process queues it without reading the queue.
    fn start_trace_in(
        &self,
        txn: &mut Txn<'_>,
        root: &Span,
        first: Option<&Action>,
        event_ids: &[String],
        new_id: bool,
    ) -> Result<bool> {
        let now = Utc::now();
        for id in event_ids {
            txn.cursor_mut()?.insert(id);
        }
        let existed = match txn.trace_index(root.id)? {
            Some(index) if index.spans.len() > 1 => return Ok(false),
            Some(_) => true,
            None => false,
        };
        // What is already on disk wins: a re-ingested event keeps its first records.
        let root = if let Some(on_disk) = read_json::<Span>(&self.span_path(root.id))? {
            on_disk
        } else {
            self.write_span(root)?;
            root.clone()
        };
        let first = match first {
            Some(a) => Some(
                if let Some(on_disk) = read_json::<Action>(&self.action_path(a.id))? {
                    on_disk
                } else {
                    self.write_action(a)?;
                    a.clone()
                },
            ),
            None => None,
        };
        txn.create_trace_index(&root, event_label(&root))?;
        if let Some(first) = &first {
            txn.add_to_trace(root.id, &[], &[first.id], now)?;
            if new_id && !existed {
                txn.push_new_pending(first.pending(root.id, now))?;
            } else {
                txn.push_pending(first.pending(root.id, now))?;
            }
        }
        Ok(!existed)
    }
}
