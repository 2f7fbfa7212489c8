//! Draining the queue: restart recovery, `monitor()`s, then every runnable queued action that has
//! a free slot (its step's `maxParallel`, detached runs included where the step says so, and
//! per-trace exclusivity) and that the budget admits is started.

use std::collections::{HashMap, HashSet};
use std::panic::AssertUnwindSafe;
use std::sync::Arc;

use futures_util::FutureExt;

use chrono::{DateTime, Utc};
use tokio::sync::OwnedSemaphorePermit;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use super::budget::Gate;
use super::slots::{Bid, SlotSeat};
use super::step::{Readiness, Step};
use super::{placeholder_span, DrainReport, InFlight, Inner, Running, StepOrchestrator};
use crate::budget::Ledger;
use crate::store::blocking;
use crate::store::{
    AutopilotStore, ClosedTrace, PendingAction, Recovery, ScheduledMeta, SpanStatus, State,
    StepKind, StoreError,
};

impl StepOrchestrator {
    /// Restart recovery, before the first drain: finish cut-off hand-overs, close interrupted
    /// spans as `error` (their actions run again), leave detached work that still runs alone.
    pub async fn recover(&self) -> Result<Vec<Recovery>, StoreError> {
        let store = self.store().clone();
        let state = blocking(store.clone(), AutopilotStore::read_state).await?;
        let mut alive = HashSet::new();
        for pending in &state.pending {
            let Some(span_id) = pending.running_span_id else {
                continue;
            };
            let Ok(span) = blocking(store.clone(), move |s| s.read_span(span_id)).await else {
                continue;
            };
            if span.status != SpanStatus::Running {
                continue;
            }
            // Collections of this run a stop cut off: closed; the run is collected again.
            let (s, p) = (store.clone(), pending.clone());
            for id in blocking(s, move |s| super::collect::close_cut_collections(s, &p)).await? {
                self.inner.notice(format!(
                    "recovered: collection {} was cut off; its run is collected again",
                    crate::trace::short(id)
                ));
            }
            if let Some(step) = self.inner.steps.get(&pending.action) {
                if step.still_running(&self.inner.ctx, pending, &span).await {
                    alive.insert(span_id);
                }
            }
        }
        let done = blocking(store, move |s| {
            s.recover(|_, span| alive.contains(&span.id))
        })
        .await?;
        for r in &done {
            self.inner.notice(format!("recovered: {r:?}"));
        }
        Ok(done)
    }

    /// Run `monitor()`s, then start every runnable queued action that has a free slot.
    pub async fn drain(&self) -> Result<DrainReport, StoreError> {
        let inner = &self.inner;
        let mut report = DrainReport::default();
        inner.run_monitors(&mut report).await;
        let state = blocking(self.store().clone(), AutopilotStore::read_state).await?;
        let now = Utc::now();
        let mut ledger = inner.begin_drain(&state, now).await;
        let detached = inner.detached_runs(&state);
        let mut candidates = Vec::new();
        for pending in inner.fair_order(&state) {
            if let Some(at) = pending.not_before.filter(|t| *t > now) {
                report.next_due = Some(report.next_due.map_or(at, |d| d.min(at)));
                continue;
            }
            let Some(step) = inner.steps.get(&pending.action).cloned() else {
                inner.report_dead_letter(pending);
                continue;
            };
            if inner.flight().runs.contains_key(&pending.action_id) {
                continue;
            }
            let Admission::Go { skip } = inner.admit(&state, pending, ledger.as_mut(), now).await
            else {
                continue;
            };
            let Some(permit) = inner.free_slot(&step, pending, &detached, &mut report) else {
                continue;
            };
            let key = (pending.action.clone(), pending.trace_id);
            if step.exclusive_per_trace() && inner.flight().exclusive.contains(&key) {
                report.deferred += 1;
                continue;
            }
            if !inner.ready(&step, pending, skip.is_some()).await {
                continue;
            }
            if skip.is_none() && step.takes_agent_slot() && inner.slots.is_some() {
                candidates.push(Candidate {
                    step,
                    pending: pending.clone(),
                    key,
                    permit,
                });
                continue;
            }
            if !inner.claim(&step, pending, key, &mut report) {
                continue;
            }
            report.started += 1;
            inner.spawn_run(step, pending.clone(), skip, permit, None);
        }
        self.schedule(candidates, &detached, &mut report).await;
        inner.publish_waiting(&state).await;
        Ok(report)
    }

    /// The daemon's agent slots for the ready `candidates` of slot-taking steps: the board
    /// decides which start now (recording why on their spans) and which wait (saying why).
    /// Asked also without candidates, so that the runs this repository no longer holds free
    /// their slots for the others.
    async fn schedule(
        &self,
        candidates: Vec<Candidate>,
        detached: &HashMap<Uuid, StepKind>,
        report: &mut DrainReport,
    ) {
        let inner = &self.inner;
        let Some(seat) = self.seat() else {
            return;
        };
        let held = inner.agent_slots_held(detached);
        let now = Utc::now();
        let mut bids = Vec::with_capacity(candidates.len());
        for c in &candidates {
            let facts = c.step.slot_facts(&inner.ctx, &c.pending).await;
            let (score, why) = seat
                .settings()
                .weights
                .score(&facts, c.pending.created_at, now);
            bids.push(Bid {
                action_id: c.pending.action_id,
                queued_at: c.pending.created_at,
                score,
                why,
            });
        }
        let decision = seat.decide(held, bids);
        for (action_id, why) in decision.waiting {
            inner.set_waiting(action_id, Some(why));
            report.deferred += 1;
        }
        let mut granted: HashMap<Uuid, ScheduledMeta> = decision.granted.into_iter().collect();
        for c in candidates {
            // Not granted: its step's slot (`permit`) is given back here.
            let Some(scheduled) = granted.remove(&c.pending.action_id) else {
                continue;
            };
            if !inner.claim(&c.step, &c.pending, c.key, report) {
                continue;
            }
            inner.set_waiting(c.pending.action_id, None);
            report.started += 1;
            inner.spawn_run(c.step, c.pending, None, c.permit, Some(scheduled));
        }
    }

    /// This orchestrator's seat at the daemon's slot board, taken at the first drain (its
    /// waker holds the orchestrator weakly: a dropped orchestrator leaves the board).
    fn seat(&self) -> Option<&SlotSeat> {
        let (board, repository) = self.inner.slots.as_ref()?;
        Some(self.inner.seat.get_or_init(|| {
            let inner = Arc::downgrade(&self.inner);
            board.join(
                repository,
                Arc::new(move || {
                    if let Some(inner) = inner.upgrade() {
                        inner.wake.notify_one();
                    }
                }),
            )
        }))
    }
}

/// A ready action of a slot-taking step, holding its step's slot, waiting for the board.
struct Candidate {
    step: Arc<dyn Step>,
    pending: PendingAction,
    key: (StepKind, Uuid),
    permit: OwnedSemaphorePermit,
}

/// What the budget and a person's close say of a queued action.
enum Admission {
    /// It waits (the reason is in `waiting`).
    Wait,
    /// It runs, or is skipped for the reason given.
    Go { skip: Option<String> },
}

impl Inner {
    /// Every step's `monitor()`; the detached runs it finds done are collected in tasks of
    /// their own.
    async fn run_monitors(self: &Arc<Self>, report: &mut DrainReport) {
        for step in self.steps.values() {
            match step.monitor(&self.ctx).await {
                Ok(done) => {
                    for completion in done {
                        // Collected in a task of its own: the drain goes on meanwhile.
                        if self.start_collection(step, completion, report) {
                            report.completed_detached += 1;
                        }
                    }
                }
                Err(e) => {
                    tracing::warn!(step = %step.kind(), error = &e as &dyn std::error::Error, "monitor failed");
                    self.notice(format!("{} monitor failed: {e}", step.kind()));
                }
            }
        }
    }

    /// The budget's ledger for this drain (none when there is no budget); stops the runs of
    /// traces over a limit or closed by a person.
    async fn begin_drain(&self, state: &State, now: DateTime<Utc>) -> Option<Ledger> {
        // Traces with runs in flight here or detached: a budget may stop them.
        let running: HashSet<Uuid> = state
            .pending
            .iter()
            .filter(|p| p.running_span_id.is_some())
            .map(|p| p.trace_id)
            .chain(self.flight().runs.values().map(|r| r.trace_id))
            .collect();
        let (ledger, halt) = self.gate.begin_drain(running, now).await;
        self.halt(halt).await;
        // Closed by a person: stop what still runs (only traces with work left can have any).
        let live: HashSet<Uuid> = state.pending.iter().map(|p| p.trace_id).collect();
        for (trace_id, closed) in state.closed.iter().filter(|(t, _)| live.contains(t)) {
            let halt = self.gate.close_by_hand(*trace_id, &closed.describe());
            self.halt(halt).await;
        }
        ledger
    }

    /// The queue entries no run holds, fair across traces: entries of traces with fewer runs
    /// in flight go first, FIFO within.
    fn fair_order<'s>(&self, state: &'s State) -> Vec<&'s PendingAction> {
        let mut candidates: Vec<&PendingAction> = state
            .pending
            .iter()
            .filter(|p| p.running_span_id.is_none())
            .collect();
        let flight = self.flight();
        let mut per_trace: HashMap<Uuid, usize> = HashMap::new();
        for run in flight.runs.values() {
            *per_trace.entry(run.trace_id).or_default() += 1;
        }
        candidates.sort_by_key(|p| per_trace.get(&p.trace_id).copied().unwrap_or(0));
        candidates
    }

    /// Whether `pending` runs, waits or is skipped: a closed trace skips it (terminal actions
    /// excepted), then the budget decides.
    async fn admit(
        &self,
        state: &State,
        pending: &PendingAction,
        ledger: Option<&mut Ledger>,
        now: DateTime<Utc>,
    ) -> Admission {
        let mut skip = state
            .closed
            .get(&pending.trace_id)
            .filter(|_| !self.pipeline.ends_trace(&pending.action))
            .map(ClosedTrace::describe);
        // The daemon holds every repository's new work (its budget or circuit breaker): a new
        // trace waits as it does for its own repository's pause.
        let paused = self.slots.as_ref().and_then(|(board, _)| board.paused());
        if let Some(why) = paused.filter(|_| skip.is_none() && super::budget::is_new_trace(pending))
        {
            self.set_waiting(
                pending.action_id,
                Some(format!("new work is paused in every repository: {why}")),
            );
            return Admission::Wait;
        }
        if let (None, Some(ledger)) = (&skip, ledger) {
            let (gate, halt) = self.gate.admit(ledger, pending, now).await;
            self.halt(halt).await;
            match gate {
                Gate::Go => {}
                Gate::Wait(reason) => {
                    self.set_waiting(pending.action_id, Some(reason));
                    return Admission::Wait;
                }
                Gate::Skip(reason) => skip = Some(reason),
            }
        }
        Admission::Go { skip }
    }

    /// A slot of `step` for `pending`, unless its detached runs or its runs here take them all
    /// (deferred).
    fn free_slot(
        &self,
        step: &Arc<dyn Step>,
        pending: &PendingAction,
        detached: &HashMap<Uuid, StepKind>,
        report: &mut DrainReport,
    ) -> Option<OwnedSemaphorePermit> {
        // Detached runs that hold their step's slots (`Step::detached_holds_slot`).
        let permits = &self.permits[&pending.action];
        let held = if step.detached_holds_slot() {
            Some(self.flight().slots_taken(&pending.action, detached))
        } else {
            None
        };
        if let Some(held) = held.filter(|(busy, _)| *busy >= step.max_parallel().max(1)) {
            let held = held.1;
            report.deferred += 1;
            self.set_waiting(
                pending.action_id,
                Some(format!(
                    "{held} detached {} run(s) still running (maxParallel {}); waiting for one to finish",
                    pending.action,
                    step.max_parallel().max(1)
                )),
            );
            return None;
        }
        // A slot first, then readiness: a step may reserve something when it says it is
        // ready (the workflow step, a sandbox), and must then really run.
        let Ok(permit) = permits.clone().try_acquire_owned() else {
            report.deferred += 1;
            return None;
        };
        Some(permit)
    }

    /// Whether `pending` may start now (a skipped one always may). Not ready (the resolver's
    /// `wait`, unmet dependencies): it stays queued, no span.
    async fn ready(&self, step: &Arc<dyn Step>, pending: &PendingAction, skipped: bool) -> bool {
        let readiness = if skipped {
            Ok(Readiness::Ready)
        } else {
            step.ready(&self.ctx, pending).await
        };
        match readiness {
            Ok(Readiness::Ready) => self.set_waiting(pending.action_id, None),
            Ok(Readiness::Wait(reason)) => {
                self.set_waiting(pending.action_id, Some(reason));
                return false;
            }
            Err(e) => {
                tracing::warn!(step = %step.kind(), error = &e as &dyn std::error::Error, "readiness check failed; running the step anyway");
            }
        }
        true
    }

    /// Record `pending` as running here (and its trace's exclusive slot, if the step has one),
    /// unless a run took it or the slot meanwhile.
    fn claim(
        &self,
        step: &Arc<dyn Step>,
        pending: &PendingAction,
        key: (StepKind, Uuid),
        report: &mut DrainReport,
    ) -> bool {
        let mut flight = self.flight();
        if flight.runs.contains_key(&pending.action_id) {
            return false;
        }
        if step.exclusive_per_trace() && flight.exclusive.contains(&key) {
            report.deferred += 1;
            return false;
        }
        if step.exclusive_per_trace() {
            flight.exclusive.insert(key);
        }
        flight.runs.insert(
            pending.action_id,
            Running {
                step: pending.action.clone(),
                trace_id: pending.trace_id,
                span: placeholder_span(pending),
                abort: None,
                stop: CancellationToken::new(),
                collecting: false,
            },
        );
        true
    }

    /// Run `pending` in a task of the tracker; its slot is freed when the task ends, a panic
    /// included.
    fn spawn_run(
        self: &Arc<Self>,
        step: Arc<dyn Step>,
        pending: PendingAction,
        skip: Option<String>,
        permit: OwnedSemaphorePermit,
        scheduled: Option<ScheduledMeta>,
    ) {
        let task_inner = self.clone();
        let action_id = pending.action_id;
        let handle = self.tracker.spawn(async move {
            let run = task_inner
                .clone()
                .run_action(step, pending, skip, scheduled);
            // Its message only: the payload is not `Sync`, so it is not held across an await.
            let panicked = AssertUnwindSafe(run).catch_unwind().await.err();
            if let Some(text) = panicked.map(|p| super::run::panic_text(&*p)) {
                task_inner.task_panicked(action_id, &text).await;
            }
            drop(permit);
            task_inner.release_in_flight(action_id);
            task_inner.wake.notify_one();
        });
        // The task may already be done; then there is nothing left to abort.
        if let Some(run) = self.flight().runs.get_mut(&action_id) {
            run.abort = Some(handle.abort_handle());
        }
    }
}

impl InFlight {
    /// How many slots of `step` are taken, and by how many detached runs: its runs in this
    /// process, plus its detached runs, known from the queue read (`claimed`: entries claimed
    /// by a run, also from before a restart) or recorded when they detached here (the queue
    /// read may predate them).
    fn slots_taken(&self, step: &StepKind, claimed: &HashMap<Uuid, StepKind>) -> (usize, usize) {
        let here = self.runs.values().filter(|r| &r.step == step).count();
        let detached: HashSet<&Uuid> = claimed
            .iter()
            .chain(&self.detached)
            .filter(|(id, kind)| *kind == step && !self.runs.contains_key(id))
            .map(|(id, _)| id)
            .collect();
        (here + detached.len(), detached.len())
    }
}

impl Inner {
    /// Of the steps whose detached runs hold their slots, the queue entries claimed by a run (a
    /// running span) that no run in this process holds: detached work, until `monitor` collects
    /// it. Forgets recorded detached runs whose action has left the queue.
    fn detached_runs(&self, state: &State) -> HashMap<Uuid, StepKind> {
        let mut flight = self.flight();
        let queued: HashSet<Uuid> = state.pending.iter().map(|p| p.action_id).collect();
        flight.detached.retain(|id, _| queued.contains(id));
        state
            .pending
            .iter()
            .filter(|p| {
                p.running_span_id.is_some()
                    && !flight.runs.contains_key(&p.action_id)
                    && self
                        .steps
                        .get(&p.action)
                        .is_some_and(|s| s.detached_holds_slot())
            })
            .map(|p| (p.action_id, p.action.clone()))
            .collect()
    }

    /// The agent slots this repository holds: runs here (and collections) of slot-taking
    /// steps, and their detached runs.
    fn agent_slots_held(&self, detached: &HashMap<Uuid, StepKind>) -> usize {
        let takes = |kind: &StepKind| self.steps.get(kind).is_some_and(|s| s.takes_agent_slot());
        let flight = self.flight();
        let mut held: HashSet<Uuid> = flight
            .runs
            .iter()
            .filter(|(_, run)| takes(&run.step))
            .map(|(id, _)| *id)
            .collect();
        held.extend(
            detached
                .iter()
                .chain(&flight.detached)
                .filter(|(_, kind)| takes(kind))
                .map(|(id, _)| *id),
        );
        held.len()
    }

    /// Writes why queued actions wait (`waiting.json`, for `status`) when it changed: only
    /// actions still queued and not running are said.
    async fn publish_waiting(&self, state: &State) {
        let queued: HashSet<Uuid> = state
            .pending
            .iter()
            .filter(|p| p.running_span_id.is_none())
            .map(|p| p.action_id)
            .collect();
        let now: std::collections::BTreeMap<Uuid, String> = {
            let mut waiting = self
                .waiting
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            waiting.retain(|id, _| queued.contains(id));
            waiting.iter().map(|(k, v)| (*k, v.clone())).collect()
        };
        {
            let mut published = self
                .published_waiting
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            if published.as_ref() == Some(&now) {
                return;
            }
            *published = Some(now.clone());
        }
        let store = self.ctx.store.clone();
        // No reasons and no file: nothing to write (a store whose actions never waited has none).
        let write = move |s: &AutopilotStore| {
            if now.is_empty() && !s.waiting_path().exists() {
                return Ok(());
            }
            s.write_waiting(&now)
        };
        if let Err(e) = blocking(store, write).await {
            tracing::warn!(
                error = &e as &dyn std::error::Error,
                "cannot record why queued actions wait"
            );
        }
    }

    fn set_waiting(&self, action_id: Uuid, reason: Option<String>) {
        let mut waiting = self
            .waiting
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        match reason {
            Some(reason) => waiting.insert(action_id, reason),
            None => waiting.remove(&action_id),
        };
    }

    fn report_dead_letter(&self, pending: &PendingAction) {
        if self
            .reported_dead
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .insert(pending.action_id)
        {
            tracing::warn!(action = %pending.action_id, kind = %pending.action, trace = %pending.trace_id, "dead letter: no step handles this action type");
            self.notice(format!(
                "dead letter: action {} of type {:?} in trace {} has no step; it stays queued (see `rover autopilot status`)",
                crate::trace::short(pending.action_id),
                pending.action.as_str(),
                crate::trace::short(pending.trace_id)
            ));
        }
    }
}
