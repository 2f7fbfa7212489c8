//! The `AutopilotStore`: spans, actions and the autopilot's shared files under
//! `$ROVER_DATA_DIR/projects/<projectId>/`.
//!
//! Guarantees (see `docs/store.md`): every write is atomic and durable; every read-modify-write of
//! the shared files runs under the store lock, across threads and processes; a file that does not
//! parse is an error that names it and is never replaced by defaults; multi-file updates are
//! ordered so that a crash leaves at worst a duplicate recognised by its id, never a lost pending
//! action.

mod blocking;
mod error;
pub mod fsio;
mod ids;
pub mod intake;
mod journal;
mod lock;
pub mod log;
pub mod otel;
pub mod outbox;
pub mod records;
mod records_de;
mod records_scan;
mod records_ser;
pub mod replay_record;
pub mod stats;
mod trace_start;
mod traces;
mod traces_log;
mod txn;
mod waiting;

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use chrono::{DateTime, Utc};
use uuid::Uuid;

pub use blocking::blocking;
pub use error::{Result, StoreError};
pub use ids::IdKind;
pub use intake::{IntakeOutcome, IntakeRecord};
pub use lock::{DaemonLock, StoreLock};
pub use records::{
    from_meta, to_meta, Action, AgentFailure, AgentMeta, AgentUsage, CloseCommand, ClosedTrace,
    Cursor, ErrorMeta, EventKeyEntry, KeyMatch, LogEntry, Meta, PendingAction, PollCursor,
    ReconcileCursor, RunSpanMeta, ScheduledMeta, Span, SpanStatus, State, StepKind, TaskMapping,
    TraceEntry, TraceIndex, TracesCache,
};
pub use trace_start::{event_label, TraceCreated};
pub use traces::{TraceOutcome, TraceView};
pub use traces_log::COMPACT_LINES as TRACES_LOG_LINES;
pub use txn::Txn;

use fsio::{ensure_dir, read_json, write_json_atomic};

/// The key rover adds to a span for the actions it produced, so a crash between finishing a span
/// and enqueueing its actions can be completed on restart ([`RunSpanMeta::action_ids`], which
/// reads and writes it; the name is for tests that check the file).
pub const PRODUCED_KEY: &str = "actionIds";

/// Name the actions a span produced in its meta ([`RunSpanMeta::action_ids`]).
fn produced_by(span: &mut Span, produced: &[Action]) {
    RunSpanMeta {
        action_ids: Some(produced.iter().map(|a| a.id).collect()),
        ..RunSpanMeta::default()
    }
    .put_into(&mut span.meta);
}

/// The agent's stdout inside a span's artifacts dir (stderr next to it, `.stderr`).
pub const AGENT_LOG: &str = "agent.log";

/// One project's store.
#[derive(Debug, Clone)]
pub struct AutopilotStore {
    root: PathBuf,
    /// The state as this handle (and its clones) last wrote it, reused by the next transaction
    /// when the files have not changed since: a queue operation then reads only the journal
    /// records appended since, whatever the queue's length.
    cached: Arc<Mutex<Option<journal::Cached>>>,
}

/// What a step run is about to process, as handed out by [`AutopilotStore::begin_step`].
#[derive(Debug, Clone)]
pub struct StepRun {
    pub pending: PendingAction,
    pub action: Action,
    pub span: Span,
}

impl AutopilotStore {
    /// Open the store of `project_id` under `data_dir`, creating its layout if needed.
    pub fn open(data_dir: &Path, project_id: &str) -> Result<AutopilotStore> {
        let store = AutopilotStore {
            root: data_dir.join("projects").join(project_id),
            cached: Arc::default(),
        };
        for dir in [
            store.spans_dir(),
            store.actions_dir(),
            store.trace_index_dir(),
        ] {
            ensure_dir(&dir)?;
        }
        Ok(store)
    }

    /// Open an existing store for inspection; a missing one is an error, never created.
    pub fn open_existing(data_dir: &Path, project_id: &str) -> Result<AutopilotStore> {
        let root = data_dir.join("projects").join(project_id);
        if !root.join("autopilot").is_dir() && !root.join("spans").is_dir() {
            return Err(StoreError::MissingStore { path: root });
        }
        Ok(AutopilotStore {
            root,
            cached: Arc::default(),
        })
    }

    pub fn root(&self) -> &Path {
        &self.root
    }
    pub fn spans_dir(&self) -> PathBuf {
        self.root.join("spans")
    }
    pub fn actions_dir(&self) -> PathBuf {
        self.root.join("actions")
    }
    pub fn autopilot_dir(&self) -> PathBuf {
        self.root.join("autopilot")
    }
    pub fn trace_index_dir(&self) -> PathBuf {
        self.autopilot_dir().join("traces")
    }
    pub fn state_path(&self) -> PathBuf {
        self.autopilot_dir().join("state.json")
    }
    pub fn cursor_path(&self) -> PathBuf {
        self.autopilot_dir().join("cursor.json")
    }
    pub fn traces_path(&self) -> PathBuf {
        self.autopilot_dir().join("traces.json")
    }
    /// The queue journal beside `state.json` (see `journal`).
    pub fn journal_path(&self) -> PathBuf {
        self.autopilot_dir().join("state.journal")
    }
    pub fn lock_path(&self) -> PathBuf {
        self.autopilot_dir().join("lock")
    }
    pub fn daemon_lock_path(&self) -> PathBuf {
        self.autopilot_dir().join("daemon.lock")
    }
    pub fn log_path(&self) -> PathBuf {
        self.autopilot_dir().join("log.jsonl")
    }
    /// `<store>/proxy`: rover's sandbox proxy's grants, ledgers and socket (`proxy`).
    pub fn proxy_dir(&self) -> PathBuf {
        self.root().join("proxy")
    }
    /// Where a span's bulky artifacts (agent transcripts, container logs) live.
    pub fn artifacts_dir(&self, span_id: Uuid) -> PathBuf {
        self.root.join("artifacts").join(span_id.to_string())
    }
    /// The log of the agent a span runs detached (its stdout, followed as it comes; stderr
    /// next to it, `.stderr`): [`AGENT_LOG`] in its artifacts.
    pub fn agent_log(&self, span_id: Uuid) -> PathBuf {
        self.artifacts_dir(span_id).join(AGENT_LOG)
    }
    pub fn span_path(&self, id: Uuid) -> PathBuf {
        self.spans_dir().join(format!("{id}.json"))
    }
    pub fn action_path(&self, id: Uuid) -> PathBuf {
        self.actions_dir().join(format!("{id}.json"))
    }
    pub fn ids_dir(&self) -> PathBuf {
        self.autopilot_dir().join("ids")
    }
    pub fn trace_index_path(&self, trace_id: Uuid) -> PathBuf {
        self.trace_index_dir().join(format!("{trace_id}.json"))
    }

    // ---- spans and actions -------------------------------------------------------------------

    /// Write a span file. A span already finished on disk is never overwritten.
    pub fn write_span(&self, span: &Span) -> Result<()> {
        let path = self.span_path(span.id);
        if let Some(existing) = read_json::<Span>(&path)? {
            if existing.status.is_final() && !same_json(&existing, span) {
                return Err(records::SpanLifecycleError::AlreadyFinal {
                    id: span.id,
                    status: existing.status,
                }
                .into());
            }
            write_json_atomic(&path, span)?;
            // Closed by this write (a rewrite of a closed span was exported already).
            if span.status.is_final() && !existing.status.is_final() {
                self.record_closed(span.id);
            }
            return Ok(());
        }
        write_json_atomic(&path, span)?;
        self.index_id(ids::IdKind::Span, span.id);
        if span.status.is_final() {
            self.record_closed(span.id);
        }
        Ok(())
    }

    /// Note a span closed for OpenTelemetry export (see `outbox`): a failure loses only its
    /// export, and is logged.
    fn record_closed(&self, id: Uuid) {
        if let Err(e) = outbox::record_closed(self, id) {
            tracing::warn!(error = &e as &dyn std::error::Error, %id, "cannot record a closed span for export");
        }
    }

    pub fn read_span(&self, id: Uuid) -> Result<Span> {
        read_json(&self.span_path(id))?.ok_or(StoreError::SpanNotFound(id))
    }

    /// Write an action file. Actions are immutable: rewriting identical content is a no-op,
    /// different content is refused.
    pub fn write_action(&self, action: &Action) -> Result<()> {
        let path = self.action_path(action.id);
        if let Some(existing) = read_json::<Action>(&path)? {
            if same_json(&existing, action) {
                return Ok(());
            }
            return Err(StoreError::Unreadable {
                path,
                reason: "an action with this id exists with other content; actions are immutable"
                    .into(),
            });
        }
        write_json_atomic(&path, action)?;
        self.index_id(ids::IdKind::Action, action.id);
        Ok(())
    }

    /// Add a new record's id to the prefix index (a cache: a failure only slows lookups down).
    pub fn index_id(&self, kind: ids::IdKind, id: Uuid) {
        if let Err(e) = ids::append(&self.ids_dir(), kind, id) {
            tracing::warn!(error = &e as &dyn std::error::Error, %id, "cannot update the id-prefix index");
        }
    }

    pub fn read_action(&self, id: Uuid) -> Result<Action> {
        read_json(&self.action_path(id))?.ok_or(StoreError::ActionNotFound(id))
    }

    // ---- shared files -------------------------------------------------------------------------

    /// Run `f` on the shared files under the store lock; what it changed is written back when it
    /// returns `Ok` (trace indexes and caches first, `state.json` and `cursor.json` last).
    pub fn transact<R>(&self, f: impl FnOnce(&mut Txn<'_>) -> Result<R>) -> Result<R> {
        ensure_dir(&self.autopilot_dir())?;
        let _lock = StoreLock::acquire(&self.lock_path())?;
        // Held with the store lock: threads of this process take that lock too, so this never
        // waits on more than the lock already does. A failed transaction drops the state.
        let mut cached = self
            .cached
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let mut txn = Txn::new(self, cached.take());
        let out = f(&mut txn)?;
        *cached = txn.commit()?;
        Ok(out)
    }

    /// The state as it is now: `state.json` with the journal's records applied (atomic files
    /// and checked appends need no lock to read). Every reader of the queue comes here. A
    /// missing file is an empty state; a corrupt one is an error naming it. The handle's cached
    /// state is reused when the files are the ones it knows (the daemon's drain reads the queue
    /// after every step: it then reads only the records appended since).
    pub fn read_state(&self) -> Result<State> {
        journal::read(self, &self.cached)
    }

    /// Fold the journal into `state.json` (the daemon does at start and stop), so that a reader
    /// of `state.json` alone sees the whole queue. Nothing is written when the journal holds no
    /// record `state.json` lacks (an idle `start --once` then costs nothing in the queue's size).
    pub fn compact_state(&self) -> Result<()> {
        self.transact(|txn: &mut Txn<'_>| txn.compact())
    }

    pub fn read_cursor(&self) -> Result<Cursor> {
        Ok(read_json(&self.cursor_path())?.unwrap_or_else(|| Cursor::new(Utc::now())))
    }

    // ---- the queue ----------------------------------------------------------------------------

    /// Durably record `action` and put it on the pending queue (idempotent by action id).
    pub fn enqueue(&self, action: &Action, trace_id: Uuid) -> Result<()> {
        self.write_action(action)?;
        self.transact(|txn| {
            let now = Utc::now();
            let pending = action.pending(trace_id, now);
            txn.push_pending(pending)?;
            txn.add_to_trace(trace_id, &[], &[action.id], now)?;
            Ok(())
        })
    }

    /// Remove an action from the pending queue; returns the entry, or `None` if it was not there.
    pub fn dequeue(&self, action_id: Uuid) -> Result<Option<PendingAction>> {
        self.transact(|txn| txn.remove_pending(action_id))
    }

    // ---- step runs ----------------------------------------------------------------------------

    /// Claim a pending action for a step run: count the attempt and record the running span in
    /// the queue, then write the `running` span. (The trace index lists the span once it is
    /// finished or released; until then the queue entry points at it.)
    pub fn begin_step(&self, action_id: Uuid, step: &StepKind) -> Result<StepRun> {
        let action = self.read_action(action_id)?;
        let now = Utc::now();
        let (pending, span) = self.transact(|txn| {
            let pending = txn
                .pending_mut(action_id)?
                .ok_or(StoreError::NotPending(action_id))?;
            let span = Span::start(step.clone(), &action, pending.trace_id, now);
            pending.attempts += 1;
            pending.running_span_id = Some(span.id);
            Ok((pending.clone(), span))
        })?;
        self.write_span(&span)?;
        Ok(StepRun {
            pending,
            action,
            span,
        })
    }

    /// Finish a step run: write the produced actions, then the finished span (naming them), then
    /// in one locked update dequeue the consumed action and enqueue the produced ones.
    ///
    /// A crash before the last update leaves the consumed action pending with a finished span;
    /// [`AutopilotStore::recover`] completes the hand-over from the span's recorded actions.
    pub fn complete_step(&self, span: &Span, produced: &[Action]) -> Result<()> {
        debug_assert!(span.status.is_final());
        for action in produced {
            self.write_action(action)?;
        }
        let mut span = span.clone();
        produced_by(&mut span, produced);
        self.write_span(&span)?;
        self.hand_over(&span, produced)
    }

    /// A newer trace (`by`) takes over the scheduled action `action_id`: it becomes due now and
    /// records `supersededBy`, so its step ends it at once, saying so. False when it is no
    /// longer queued or a run has it.
    pub fn supersede_pending(&self, action_id: Uuid, by: Uuid) -> Result<bool> {
        self.transact(|txn| {
            let Some(p) = txn.pending_mut(action_id)? else {
                return Ok(false);
            };
            if p.running_span_id.is_some() {
                return Ok(false);
            }
            p.not_before = None;
            p.superseded_by = Some(by);
            Ok(true)
        })
    }

    /// Make the scheduled action `action_id` due now (an event it waited for arrived). False
    /// when it is no longer queued or a run has it.
    pub fn wake_pending(&self, action_id: Uuid) -> Result<bool> {
        self.transact(|txn| {
            let Some(p) = txn.pending_mut(action_id)? else {
                return Ok(false);
            };
            if p.running_span_id.is_some() {
                return Ok(false);
            }
            p.not_before = None;
            Ok(true)
        })
    }

    /// Release a pending action without consuming it (the run was interrupted, or failed in a
    /// way worth retrying): it stays queued for a later run, not before `not_before`. The run's
    /// finished span is kept in the trace.
    pub fn release_step(
        &self,
        action_id: Uuid,
        span: Option<&Span>,
        not_before: Option<DateTime<Utc>>,
    ) -> Result<()> {
        if let Some(span) = span {
            self.write_span(span)?;
        }
        self.transact(|txn| {
            let trace_id = match txn.pending_mut(action_id)? {
                Some(p) => {
                    p.running_span_id = None;
                    p.not_before = not_before;
                    p.trace_id
                }
                None => return Ok(()),
            };
            if let Some(span) = span {
                txn.add_to_trace(trace_id, &[span.id], &[], Utc::now())?;
            }
            Ok(())
        })
    }

    fn hand_over(&self, span: &Span, produced: &[Action]) -> Result<()> {
        let trace_id = span.trace().expect("step spans carry their trace id");
        self.transact(|txn| {
            let now = Utc::now();
            if let Some(action_id) = span.action_id {
                txn.remove_pending(action_id)?;
            }
            for action in produced {
                txn.push_pending(action.pending(trace_id, now))?;
            }
            let ids: Vec<Uuid> = produced.iter().map(|a| a.id).collect();
            txn.add_to_trace(trace_id, &[span.id], &ids, now)?;
            Ok(())
        })
    }

    /// A person's intervention in a trace (`rover autopilot cancel`, `fail`, `retry`, ...):
    /// write the produced actions and the finished span naming them, then in one locked update
    /// take the queued (not running) actions `remove` selects off the queue, queue the produced
    /// ones and, with `close`, mark the trace closed. Returns the actions taken off the queue.
    pub fn intervene(
        &self,
        span: &Span,
        produced: &[Action],
        remove: impl Fn(&PendingAction) -> bool,
        close: Option<ClosedTrace>,
    ) -> Result<Vec<PendingAction>> {
        let trace_id = span
            .trace()
            .expect("an intervention span carries its trace id");
        for action in produced {
            self.write_action(action)?;
        }
        let mut span = span.clone();
        produced_by(&mut span, produced);
        self.write_span(&span)?;
        self.transact(|txn| {
            let now = Utc::now();
            let taken: Vec<Uuid> = txn
                .state()?
                .pending
                .iter()
                .filter(|p| p.running_span_id.is_none() && remove(p))
                .map(|p| p.action_id)
                .collect();
            let mut removed = Vec::new();
            for id in taken {
                removed.extend(txn.remove_pending(id)?);
            }
            for action in produced {
                txn.push_pending(action.pending(trace_id, now))?;
            }
            if let Some(closed) = close {
                let state = txn.state_mut()?;
                state.closed.insert(trace_id, closed);
                while state.closed.len() > records::CLOSED_CAPACITY {
                    let oldest = state
                        .closed
                        .iter()
                        .min_by_key(|(_, c)| c.at)
                        .map(|(id, _)| *id)
                        .expect("not empty");
                    state.closed.remove(&oldest);
                }
            }
            let ids: Vec<Uuid> = produced.iter().map(|a| a.id).collect();
            txn.add_to_trace(trace_id, &[span.id], &ids, now)?;
            Ok(removed)
        })
    }

    /// Restart recovery: finish the hand-over of step runs whose span finished before a crash,
    /// and close spans left `running` as `error` ("interrupted") so their action runs again.
    /// `still_running` says which running spans have live work outside this process (a
    /// container): those are left alone. Returns what was done, for the log.
    pub fn recover(
        &self,
        still_running: impl Fn(&PendingAction, &Span) -> bool,
    ) -> Result<Vec<Recovery>> {
        let state = self.read_state()?;
        let mut done = Vec::new();
        for pending in state.pending.iter().filter(|p| p.running_span_id.is_some()) {
            let span_id = pending.running_span_id.expect("filtered");
            let now = Utc::now();
            let found = read_json::<Span>(&self.span_path(span_id))?;
            // Only a span finished by `complete_step` names its produced actions; any other
            // finished span (interrupted, released) leaves its action queued.
            let produced_ids = found
                .as_ref()
                .filter(|s| s.status.is_final())
                .and_then(|s| RunSpanMeta::of(s).action_ids);
            match (found, produced_ids) {
                (Some(span), Some(ids)) => {
                    let produced = ids
                        .iter()
                        .map(|id| self.read_action(*id))
                        .collect::<Result<Vec<_>>>()?;
                    self.hand_over(&span, &produced)?;
                    done.push(Recovery::HandedOver {
                        span: span_id,
                        actions: ids.len(),
                    });
                }
                (Some(span), None) if span.status.is_final() => {
                    self.release_step(pending.action_id, Some(&span), None)?;
                    done.push(Recovery::Interrupted {
                        span: span_id,
                        action: pending.action_id,
                    });
                }
                (Some(span), None) if still_running(pending, &span) => {
                    done.push(Recovery::StillRunning { span: span_id });
                }
                (found, _) => {
                    let action = self.read_action(pending.action_id)?;
                    let mut span = found.unwrap_or_else(|| {
                        let mut s =
                            Span::start(action.action.clone(), &action, pending.trace_id, now);
                        s.id = span_id;
                        s
                    });
                    let mut meta = Meta::new();
                    RunSpanMeta {
                        interrupted: true,
                        attempt: Some(pending.attempts),
                        ..RunSpanMeta::default()
                    }
                    .put_into(&mut meta);
                    span.finish(
                        SpanStatus::Error,
                        "interrupted: rover stopped before this step finished; it will run again",
                        meta,
                        now,
                    )?;
                    self.release_step(pending.action_id, Some(&span), None)?;
                    done.push(Recovery::Interrupted {
                        span: span_id,
                        action: pending.action_id,
                    });
                }
            }
        }
        Ok(done)
    }

    /// The time-ordered list of the most recent traces (from the cache, rebuilt if unreadable).
    pub fn recent_traces(&self, limit: usize) -> Result<Vec<TraceEntry>> {
        traces::recent(self, limit)
    }

    /// Every span and action of a trace, with its pending actions.
    pub fn load_trace(&self, trace_id: Uuid) -> Result<TraceView> {
        traces::load(self, trace_id)
    }

    /// Find the trace of a trace, span or action id, or of an unambiguous prefix (8+ chars).
    pub fn resolve_trace_id(&self, id: &str) -> Result<Uuid> {
        traces::resolve(self, id)
    }

    /// Rebuild the trace indexes and the traces cache from the span and action files.
    pub fn rebuild_indexes(&self) -> Result<usize> {
        traces::rebuild(self)
    }

    /// Whether a daemon holds this project's daemon lock, and its pid.
    pub fn daemon_pid(&self) -> Option<String> {
        DaemonLock::holder(&self.daemon_lock_path())
    }

    /// Where [`AutopilotStore::sweep_temp_files_due`] notes its last full sweep (its time is the
    /// file's).
    pub fn temp_sweep_path(&self) -> PathBuf {
        self.autopilot_dir().join("temp-sweep")
    }

    /// [`AutopilotStore::sweep_temp_files`] at most once per `every`: listing the span, action and
    /// trace-index directories costs in proportion to the store's history, so a start between
    /// two full sweeps (a `start --once` under cron) sweeps only `autopilot/`. A leftover temp file
    /// is never read; it only waits for the next full sweep.
    pub fn sweep_temp_files_due(
        &self,
        min_age: std::time::Duration,
        every: std::time::Duration,
    ) -> Result<usize> {
        let marker = self.temp_sweep_path();
        let recent = fs::metadata(&marker)
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| t.elapsed().ok())
            .is_some_and(|age| age < every);
        if recent {
            return Ok(sweep_dir(&self.autopilot_dir(), min_age));
        }
        let n = self.sweep_temp_files(min_age)?;
        fsio::write_atomic(&marker, Utc::now().to_rfc3339().as_bytes())?;
        Ok(n)
    }

    /// Remove the temp files that interrupted writes left behind (`.tmp-*`, never anything
    /// else), once they are older than `min_age`: a younger one may be another process's write
    /// in progress.
    pub fn sweep_temp_files(&self, min_age: std::time::Duration) -> Result<usize> {
        let mut n = 0;
        for dir in [
            self.spans_dir(),
            self.actions_dir(),
            self.autopilot_dir(),
            self.trace_index_dir(),
        ] {
            n += sweep_dir(&dir, min_age);
        }
        Ok(n)
    }
}

/// Remove the `.tmp-*` files of `dir` older than `min_age`; a missing directory has none.
fn sweep_dir(dir: &Path, min_age: std::time::Duration) -> usize {
    let Ok(entries) = fs::read_dir(dir) else {
        return 0;
    };
    let mut n = 0;
    for entry in entries.flatten() {
        // The name first: a stat of every span and action file would cost far more.
        if !entry.file_name().to_string_lossy().starts_with(".tmp-") {
            continue;
        }
        let stale = entry
            .metadata()
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| t.elapsed().ok())
            .is_some_and(|age| age >= min_age);
        if stale && fs::remove_file(entry.path()).is_ok() {
            n += 1;
        }
    }
    n
}

/// Whether two records are the same once written (times are stored to the millisecond).
fn same_json<T: serde::Serialize>(a: &T, b: &T) -> bool {
    serde_json::to_value(a).ok() == serde_json::to_value(b).ok()
}

/// What restart recovery did for one pending action.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Recovery {
    /// The span had finished; its actions were enqueued and the consumed action dequeued.
    HandedOver { span: Uuid, actions: usize },
    /// The span was cut off; it is now `error` and the action will run again.
    Interrupted { span: Uuid, action: Uuid },
    /// The span's work goes on outside the process (a container); its step re-attaches.
    StillRunning { span: Uuid },
}
