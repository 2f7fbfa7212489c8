//! The `StepOrchestrator`: the only scheduler. It drains the pending queue of the store and
//! dispatches each action to the step that handles its type, within each step's `maxParallel`
//! and per-trace exclusivity, runs `monitor()`s before reading the queue, drains again as soon as
//! any step finishes, and turns every error or panic into an `error` span and the fail-forward
//! action the spec asks for. Steps never call each other; they talk through the store.

mod progress;
mod step;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, Utc};
use tokio::sync::{broadcast, Notify, Semaphore};
use tokio::task::AbortHandle;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use uuid::Uuid;

pub use progress::Progress;
pub use step::{
    Completion, Finished, NextAction, Outcome, Readiness, Step, StepContext, StepError,
};

use tracing::Instrument;

use crate::budget::{Budget, Ledger, BREAKER_KEY};
use crate::steps::meta::{NotifyMeta, NotifyPurpose};
use crate::store::{
    Action, AutopilotStore, ClosedTrace, Meta, PendingAction, Recovery, Span, SpanStatus, StepKind,
    StepRun, StoreError,
};

/// Tunables of the orchestrator.
#[derive(Debug, Clone)]
pub struct OrchestratorSettings {
    /// The safety-net drain when nothing else wakes the loop.
    pub fallback_interval: Duration,
    /// Runs started on one action before it is given up (interruptions and retryable errors).
    pub max_attempts: u32,
    /// First backoff after a retryable error; doubled each attempt, capped at five minutes.
    pub retry_backoff: Duration,
    /// How long running steps get to finish at shutdown before they are cut off.
    pub shutdown_grace: Duration,
}

impl Default for OrchestratorSettings {
    fn default() -> OrchestratorSettings {
        OrchestratorSettings {
            fallback_interval: Duration::from_secs(30),
            max_attempts: 3,
            retry_backoff: Duration::from_secs(5),
            shutdown_grace: Duration::from_secs(20),
        }
    }
}

/// A run in progress.
struct Running {
    step: StepKind,
    trace_id: Uuid,
    span: Span,
    abort: Option<AbortHandle>,
    /// Cancelled when a budget stops the run's trace.
    stop: CancellationToken,
}

/// A trace a budget stopped: its running agents are cancelled, its queued actions are closed,
/// and it ends with one budget notify.
struct Stopped {
    reason: String,
    notified: bool,
    /// Closed by a person (`rover autopilot cancel`/`fail`), who also queued its answer.
    human: bool,
}

#[derive(Default)]
struct InFlight {
    runs: HashMap<Uuid, Running>,
    /// (step, trace) pairs holding a per-trace exclusive step.
    exclusive: HashSet<(StepKind, Uuid)>,
}

struct Inner {
    ctx: StepContext,
    steps: BTreeMap<StepKind, Arc<dyn Step>>,
    permits: BTreeMap<StepKind, Arc<Semaphore>>,
    settings: OrchestratorSettings,
    in_flight: Mutex<InFlight>,
    wake: Notify,
    tracker: TaskTracker,
    progress: broadcast::Sender<Progress>,
    reported_dead: Mutex<HashSet<Uuid>>,
    waiting: Mutex<HashMap<Uuid, String>>,
    internal_errors: AtomicUsize,
    budget: Option<Budget>,
    stopped: Mutex<HashMap<Uuid, Stopped>>,
    started_at: Mutex<HashMap<Uuid, DateTime<Utc>>>,
}

/// See the module documentation.
#[derive(Clone)]
pub struct StepOrchestrator {
    inner: Arc<Inner>,
}

/// What one drain did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct DrainReport {
    pub started: usize,
    pub completed_detached: usize,
    /// Runnable actions left queued because their step was full.
    pub deferred: usize,
    /// The earliest time a backed-off action becomes runnable.
    pub next_due: Option<DateTime<Utc>>,
}

impl StepOrchestrator {
    pub fn new(
        store: AutopilotStore,
        steps: Vec<Arc<dyn Step>>,
        settings: OrchestratorSettings,
    ) -> StepOrchestrator {
        let mut by_kind = BTreeMap::new();
        let mut permits = BTreeMap::new();
        for step in steps {
            debug_assert!(
                !by_kind.contains_key(&step.kind()),
                "two steps handle {}",
                step.kind()
            );
            permits.insert(
                step.kind(),
                Arc::new(Semaphore::new(step.max_parallel().max(1))),
            );
            by_kind.insert(step.kind(), step);
        }
        let (progress, _) = broadcast::channel(1024);
        StepOrchestrator {
            inner: Arc::new(Inner {
                ctx: StepContext {
                    store,
                    cancel: CancellationToken::new(),
                },
                steps: by_kind,
                permits,
                settings,
                in_flight: Mutex::new(InFlight::default()),
                wake: Notify::new(),
                tracker: TaskTracker::new(),
                progress,
                reported_dead: Mutex::new(HashSet::new()),
                waiting: Mutex::new(HashMap::new()),
                internal_errors: AtomicUsize::new(0),
                budget: None,
                stopped: Mutex::new(HashMap::new()),
                started_at: Mutex::new(HashMap::new()),
            }),
        }
    }

    /// Enforce `budget` (limits, circuit breaker, caps); call before the first drain.
    #[must_use]
    pub fn with_budget(mut self, budget: Budget) -> StepOrchestrator {
        Arc::get_mut(&mut self.inner)
            .expect("with_budget is called before the orchestrator is shared")
            .budget = Some(budget);
        self
    }

    pub fn store(&self) -> &AutopilotStore {
        &self.inner.ctx.store
    }

    /// Live progress events (step started/finished, notices) for the console and tests.
    pub fn subscribe(&self) -> broadcast::Receiver<Progress> {
        self.inner.progress.subscribe()
    }

    /// Ask the loop to drain now (new work was enqueued).
    pub fn wake(&self) {
        self.inner.wake.notify_one();
    }

    /// How many step runs hit an internal error (an error or panic inside a step).
    pub fn internal_errors(&self) -> usize {
        self.inner.internal_errors.load(Ordering::Relaxed)
    }

    /// Runs in progress in this process.
    pub fn in_flight(&self) -> usize {
        self.inner
            .in_flight
            .lock()
            .expect("in-flight lock")
            .runs
            .len()
    }

    /// Why queued actions are waiting (resolver `wait`, unmet dependencies).
    pub fn waiting(&self) -> HashMap<Uuid, String> {
        self.inner.waiting.lock().expect("waiting lock").clone()
    }

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
        let mut report = DrainReport::default();
        for step in self.inner.steps.values() {
            match step.monitor(&self.inner.ctx).await {
                Ok(done) => {
                    for completion in done {
                        report.completed_detached += 1;
                        self.inner
                            .clone()
                            .finish_detached(step.kind(), completion)
                            .await;
                    }
                }
                Err(e) => {
                    tracing::warn!(step = %step.kind(), error = %e, "monitor failed");
                    self.inner
                        .notice(format!("{} monitor failed: {e}", step.kind()));
                }
            }
        }
        let state = blocking(self.store().clone(), AutopilotStore::read_state).await?;
        let now = Utc::now();
        let mut ledger = self.inner.load_ledger().await;
        // Fair across traces: entries of traces with fewer runs in flight go first, FIFO within.
        if let (Some(budget), Some(ledger)) = (&self.inner.budget, &ledger) {
            let detached: HashSet<Uuid> = state
                .pending
                .iter()
                .filter(|p| p.running_span_id.is_some())
                .map(|p| p.trace_id)
                .collect();
            self.inner
                .check_running_traces(budget, ledger, detached, now)
                .await;
        }
        // Closed by a person: stop what still runs (only traces with work left can have any).
        let live: HashSet<Uuid> = state.pending.iter().map(|p| p.trace_id).collect();
        for (trace_id, closed) in state.closed.iter().filter(|(t, _)| live.contains(t)) {
            self.inner.close_trace(*trace_id, &closed.describe()).await;
        }
        let mut candidates: Vec<&PendingAction> = state
            .pending
            .iter()
            .filter(|p| p.running_span_id.is_none())
            .collect();
        {
            let flight = self.inner.in_flight.lock().expect("in-flight lock");
            let mut per_trace: HashMap<Uuid, usize> = HashMap::new();
            for run in flight.runs.values() {
                *per_trace.entry(run.trace_id).or_default() += 1;
            }
            candidates.sort_by_key(|p| per_trace.get(&p.trace_id).copied().unwrap_or(0));
        }
        for pending in candidates {
            if let Some(at) = pending.not_before.filter(|t| *t > now) {
                report.next_due = Some(report.next_due.map_or(at, |d| d.min(at)));
                continue;
            }
            let Some(step) = self.inner.steps.get(&pending.action).cloned() else {
                self.inner.report_dead_letter(pending);
                continue;
            };
            let claimed = self
                .inner
                .in_flight
                .lock()
                .expect("in-flight lock")
                .runs
                .contains_key(&pending.action_id);
            if claimed {
                continue;
            }
            let mut skip = state
                .closed
                .get(&pending.trace_id)
                .filter(|_| !pending.action.is_terminal())
                .map(ClosedTrace::describe);
            if let (None, Some(budget), Some(ledger)) = (&skip, &self.inner.budget, ledger.as_mut())
            {
                match self.inner.budget_gate(budget, ledger, pending, now).await {
                    Gate::Go => {}
                    Gate::Wait(reason) => {
                        self.inner
                            .waiting
                            .lock()
                            .expect("waiting lock")
                            .insert(pending.action_id, reason);
                        continue;
                    }
                    Gate::Skip(reason) => skip = Some(reason),
                }
            }
            // A slot first, then readiness: a step may reserve something when it says it is
            // ready (the workflow step, a sandbox), and must then really run.
            let Ok(permit) = self.inner.permits[&pending.action]
                .clone()
                .try_acquire_owned()
            else {
                report.deferred += 1;
                continue;
            };
            let busy_trace = step.exclusive_per_trace()
                && self
                    .inner
                    .in_flight
                    .lock()
                    .expect("in-flight lock")
                    .exclusive
                    .contains(&(pending.action.clone(), pending.trace_id));
            if busy_trace {
                report.deferred += 1;
                continue;
            }
            // Not ready (the resolver's `wait`, unmet dependencies): stays queued, no span.
            let readiness = if skip.is_some() {
                Ok(Readiness::Ready)
            } else {
                step.ready(&self.inner.ctx, pending).await
            };
            match readiness {
                Ok(Readiness::Ready) => {
                    self.inner
                        .waiting
                        .lock()
                        .expect("waiting lock")
                        .remove(&pending.action_id);
                }
                Ok(Readiness::Wait(reason)) => {
                    self.inner
                        .waiting
                        .lock()
                        .expect("waiting lock")
                        .insert(pending.action_id, reason);
                    continue;
                }
                Err(e) => {
                    tracing::warn!(step = %step.kind(), error = %e, "readiness check failed; running the step anyway");
                }
            }
            {
                let mut flight = self.inner.in_flight.lock().expect("in-flight lock");
                if flight.runs.contains_key(&pending.action_id) {
                    continue;
                }
                let key = (pending.action.clone(), pending.trace_id);
                if step.exclusive_per_trace() && flight.exclusive.contains(&key) {
                    report.deferred += 1;
                    continue;
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
                    },
                );
            }
            report.started += 1;
            let inner = self.inner.clone();
            let action_id = pending.action_id;
            let pending = pending.clone();
            let handle = self.inner.tracker.spawn(async move {
                inner.clone().run_action(step, pending, skip).await;
                drop(permit);
                inner.release_in_flight(action_id);
                inner.wake.notify_one();
            });
            // The task may already be done; then there is nothing left to abort.
            if let Some(run) = self
                .inner
                .in_flight
                .lock()
                .expect("in-flight lock")
                .runs
                .get_mut(&action_id)
            {
                run.abort = Some(handle.abort_handle());
            }
        }
        Ok(report)
    }

    /// The daemon's loop: drain, then sleep until a step finishes, work is enqueued, a backoff
    /// expires or the fallback timer fires; until `shutdown` is cancelled. Then stop taking
    /// work, give running steps the grace period, and mark what is cut off as interrupted.
    pub async fn run(&self, shutdown: CancellationToken) -> Result<(), StoreError> {
        loop {
            let report = match self.drain().await {
                Ok(r) => r,
                Err(e) => {
                    // The store is unreadable (corrupt state.json): say so, keep the daemon up, retry.
                    tracing::error!(error = %e, "drain failed");
                    self.inner.notice(format!("drain failed: {e}"));
                    DrainReport::default()
                }
            };
            let mut sleep = self.inner.settings.fallback_interval;
            if let Some(due) = report.next_due {
                let until = (due - Utc::now()).to_std().unwrap_or_default();
                sleep = sleep.min(until + Duration::from_millis(5));
            }
            tokio::select! {
                () = shutdown.cancelled() => break,
                () = self.inner.wake.notified() => {}
                () = tokio::time::sleep(sleep) => {}
            }
        }
        self.shutdown().await
    }

    /// For `--once`: drain until nothing is runnable now and no run is in progress.
    pub async fn run_until_idle(&self, shutdown: CancellationToken) -> Result<(), StoreError> {
        loop {
            // Idle only if nothing ran while the drain read the queue: a run that finishes
            // during the drain queues its next actions after that read.
            let busy = self.in_flight();
            let report = self.drain().await?;
            if busy == 0
                && report.started == 0
                && self.in_flight() == 0
                && report.completed_detached == 0
            {
                break;
            }
            tokio::select! {
                () = shutdown.cancelled() => break,
                () = self.inner.wake.notified() => {}
                () = tokio::time::sleep(self.inner.settings.fallback_interval) => {}
            }
        }
        self.shutdown().await
    }

    /// Stop taking work; let runs finish within the grace period; cut off the rest, recording
    /// an `error` span ("interrupted") and leaving the action queued for the next start.
    pub async fn shutdown(&self) -> Result<(), StoreError> {
        self.inner.tracker.close();
        if tokio::time::timeout(
            self.inner.settings.shutdown_grace,
            self.inner.tracker.wait(),
        )
        .await
        .is_ok()
        {
            return Ok(());
        }
        self.inner.ctx.cancel.cancel();
        let cut: Vec<(Uuid, Running)> = self
            .inner
            .in_flight
            .lock()
            .expect("in-flight lock")
            .runs
            .drain()
            .collect();
        for (action_id, run) in cut {
            if let Some(abort) = &run.abort {
                abort.abort();
            }
            self.inner.interrupt(action_id, run.span).await?;
        }
        Ok(())
    }
}

/// What the budget says about a queued action.
enum Gate {
    Go,
    /// Keep it queued, with the reason shown by `status`.
    Wait(String),
    /// Its trace was stopped by a budget: close it without running the step.
    Skip(String),
}

/// The first action of a trace (produced by its root event span): running it starts the trace.
fn is_new_trace(pending: &PendingAction) -> bool {
    pending.action == StepKind::Coordinate && pending.span_id == pending.trace_id
}

/// The span meta key marking a run closed because its trace was stopped.
fn stop_key(human: bool) -> &'static str {
    if human {
        "closedByHand"
    } else {
        "budgetStopped"
    }
}

fn budget_notify(reason: &str) -> NextAction {
    let meta = NotifyMeta {
        purpose: NotifyPurpose::Budget,
        message: Some(format!(
            "rover stopped this work because a budget limit was reached: {reason}"
        )),
        failed_step: None,
        error: Some(reason.to_owned()),
        pr_url: None,
        breaker_note: None,
    };
    NextAction::new(
        StepKind::Notify,
        format!("a budget stopped the trace: {reason}"),
    )
    .with_meta(&meta)
}

/// Stands in for the span until `begin_step` has written it (a nil id: nothing to interrupt).
fn placeholder_span(pending: &PendingAction) -> Span {
    let mut span = Span::root(Uuid::nil(), Utc::now(), Meta::new());
    span.step = pending.action.clone();
    span.trace_id = Some(pending.trace_id);
    span.action_id = Some(pending.action_id);
    span
}

impl Inner {
    fn notice(&self, text: String) {
        let _ = self.progress.send(Progress::Notice(text));
    }

    /// The budget ledger, when a budget is enforced (unreadable: said, and no gate this drain).
    async fn load_ledger(&self) -> Option<Ledger> {
        self.budget.as_ref()?;
        let store = self.ctx.store.clone();
        match tokio::task::spawn_blocking(move || Ledger::load(&store)).await {
            Ok(Ok(l)) => Some(l),
            Ok(Err(e)) => {
                tracing::error!(error = %e, "cannot read the budget ledger");
                self.notice(format!("cannot read the budget ledger: {e}"));
                None
            }
            Err(_) => None,
        }
    }

    /// When a trace started (its event span's time), cached.
    async fn trace_started(&self, trace_id: Uuid) -> DateTime<Utc> {
        if let Some(t) = self.started_at.lock().expect("started lock").get(&trace_id) {
            return *t;
        }
        let store = self.ctx.store.clone();
        let at = blocking(store, move |s| s.read_span(trace_id))
            .await
            .map_or_else(|_| Utc::now(), |root| root.timestamp);
        self.started_at
            .lock()
            .expect("started lock")
            .insert(trace_id, at);
        at
    }

    async fn budget_gate(
        &self,
        budget: &Budget,
        ledger: &mut Ledger,
        pending: &PendingAction,
        now: DateTime<Utc>,
    ) -> Gate {
        let trace_id = pending.trace_id;
        if pending.action.is_terminal() {
            return Gate::Go;
        }
        if let Some(s) = self.stopped.lock().expect("stopped lock").get(&trace_id) {
            return Gate::Skip(s.reason.clone());
        }
        let standing = budget.standing(ledger, now);
        if is_new_trace(pending) {
            if let Some(reason) = standing.new_traces_wait.into_iter().next() {
                return Gate::Wait(reason);
            }
            ledger.trace_starts.push(now); // counts against the cap within this drain too
            return Gate::Go;
        }
        if let Some(reason) = standing.stopped {
            self.stop_trace(trace_id, &reason).await;
            return Gate::Skip(reason);
        }
        if pending.action == StepKind::Push {
            if let Some(reason) = standing.pushes_wait {
                return Gate::Wait(reason);
            }
        }
        if budget.trace_limit_stops() {
            let started = self.trace_started(trace_id).await;
            if let Some((_, reason)) = budget.trace_over(ledger.trace(trace_id), started, now) {
                self.stop_trace(trace_id, &reason).await;
                return Gate::Skip(reason);
            }
        }
        Gate::Go
    }

    /// Traces with runs in flight (in this process or detached) stop when a period limit with
    /// `stop` is reached or they ran past a trace limit (the wall time grows while they run).
    async fn check_running_traces(
        &self,
        budget: &Budget,
        ledger: &Ledger,
        mut traces: HashSet<Uuid>,
        now: DateTime<Utc>,
    ) {
        traces.extend(
            self.in_flight
                .lock()
                .expect("in-flight lock")
                .runs
                .values()
                .map(|r| r.trace_id)
                .collect::<Vec<_>>(),
        );
        // A period limit with `stop`: every running trace stops.
        let period_stop = budget.standing(ledger, now).stopped;
        for trace_id in traces {
            if let Some(reason) = &period_stop {
                self.stop_trace(trace_id, reason).await;
                continue;
            }
            if !budget.trace_limit_stops() {
                continue;
            }
            let started = self.trace_started(trace_id).await;
            if let Some((_, reason)) = budget.trace_over(ledger.trace(trace_id), started, now) {
                self.stop_trace(trace_id, &reason).await;
            }
        }
    }

    /// Mark a trace stopped by a budget, cancel its running agents and stop its detached work
    /// (workflow containers).
    async fn stop_trace(&self, trace_id: Uuid, reason: &str) {
        if !self.mark_stopped(trace_id, reason) {
            return;
        }
        // Stopped before a restart: its budget notify is already in the store, so the trace
        // is not answered twice.
        if self.has_budget_notify(trace_id).await {
            if let Some(s) = self
                .stopped
                .lock()
                .expect("stopped lock")
                .get_mut(&trace_id)
            {
                s.notified = true;
            }
        }
        for step in self.steps.values() {
            let n = step.stop_detached(&self.ctx, trace_id).await;
            if n > 0 {
                tracing::warn!(trace = %trace_id, step = %step.kind(), runs = n, "stopped detached runs for a budget");
            }
        }
    }

    /// Whether the trace already holds a budget notify (from before a restart).
    async fn has_budget_notify(&self, trace_id: Uuid) -> bool {
        let store = self.ctx.store.clone();
        let purpose = serde_json::to_value(NotifyPurpose::Budget).expect("an enum serializes");
        blocking(store, move |s| s.load_trace(trace_id))
            .await
            .is_ok_and(|view| {
                view.actions.iter().any(|a| {
                    a.action == StepKind::Notify && a.meta.get("purpose") == Some(&purpose)
                })
            })
    }

    /// A trace a person closed (`state.json`'s `closed`): its runs stop like a budget's, and
    /// nothing but its answer (queued by the command) runs.
    async fn close_trace(&self, trace_id: Uuid, reason: &str) {
        if !self.mark_stopped_by(trace_id, reason, true) {
            return;
        }
        for step in self.steps.values() {
            let n = step.stop_detached(&self.ctx, trace_id).await;
            if n > 0 {
                tracing::warn!(trace = %trace_id, step = %step.kind(), runs = n, "stopped detached runs of a closed trace");
            }
        }
    }

    /// Mark a trace stopped and cancel its in-process runs; returns whether it was new.
    fn mark_stopped(&self, trace_id: Uuid, reason: &str) -> bool {
        self.mark_stopped_by(trace_id, reason, false)
    }

    fn mark_stopped_by(&self, trace_id: Uuid, reason: &str, human: bool) -> bool {
        let fresh = match self.stopped.lock().expect("stopped lock").entry(trace_id) {
            std::collections::hash_map::Entry::Occupied(_) => false,
            std::collections::hash_map::Entry::Vacant(v) => {
                v.insert(Stopped {
                    reason: reason.to_owned(),
                    notified: human,
                    human,
                });
                true
            }
        };
        if fresh && human {
            tracing::warn!(trace = %trace_id, %reason, "the trace was closed by hand");
            self.notice(format!("trace {} {reason}", crate::trace::short(trace_id)));
        } else if fresh {
            tracing::warn!(trace = %trace_id, %reason, "a budget stops the trace");
            self.notice(format!(
                "budget: trace {} stopped: {reason}",
                crate::trace::short(trace_id)
            ));
        }
        if !fresh {
            return false;
        }
        // Terminal steps (the budget notify among them) are left to finish.
        for run in self
            .in_flight
            .lock()
            .expect("in-flight lock")
            .runs
            .values()
            .filter(|r| r.trace_id == trace_id && !r.step.is_terminal())
        {
            run.stop.cancel();
        }
        true
    }

    fn stop_reason(&self, trace_id: Uuid) -> String {
        self.stopped
            .lock()
            .expect("stopped lock")
            .get(&trace_id)
            .map_or_else(
                || "a budget limit was reached".to_owned(),
                |s| s.reason.clone(),
            )
    }

    /// The trace's budget notify, once per trace.
    fn claim_budget_notify(&self, trace_id: Uuid) -> Option<NextAction> {
        let mut stopped = self.stopped.lock().expect("stopped lock");
        let entry = stopped.get_mut(&trace_id)?;
        if entry.notified {
            return None;
        }
        entry.notified = true;
        Some(budget_notify(&entry.reason))
    }

    /// Whether a person closed the trace (rather than a budget stopping it).
    fn closed_by_hand(&self, trace_id: Uuid) -> bool {
        self.stopped
            .lock()
            .expect("stopped lock")
            .get(&trace_id)
            .is_some_and(|s| s.human)
    }

    /// Close a run of a stopped trace: an error span that says so, and the budget notify.
    async fn finish_stopped(&self, run: &StepRun, reason: &str) {
        let human = self.closed_by_hand(run.pending.trace_id);
        let message = if human {
            format!("not run: the trace was {reason}")
        } else {
            format!("stopped by a budget: {reason}")
        };
        let mut finished = Finished {
            status: SpanStatus::Error,
            summary: message.clone(),
            meta: Meta::new(),
            actions: self
                .claim_budget_notify(run.pending.trace_id)
                .into_iter()
                .collect(),
        };
        finished.meta.insert(stop_key(human).into(), true.into());
        finished.meta.insert(
            "error".into(),
            serde_json::json!({"message": message, "retryable": false}),
        );
        self.finish(run, finished).await;
    }

    /// A failure notify that will trip the circuit breaker carries the breaker's announcement
    /// (in this run's copy of the action), so its trace is answered once.
    async fn add_breaker_note(&self, run: &mut StepRun) {
        let Some(budget) = &self.budget else { return };
        // Only a failure notify can trip the breaker: no ledger read for the others.
        if run
            .action
            .meta
            .get("purpose")
            .and_then(serde_json::Value::as_str)
            != Some("failure")
        {
            return;
        }
        let Some(ledger) = self.load_ledger().await else {
            return;
        };
        if let Some(note) = budget.breaker_note(&ledger, run.pending.trace_id, &run.action.meta) {
            run.action.meta.insert("breakerNote".into(), note.into());
        }
    }

    /// Count a finished span in the budget ledger and act on what it means: warnings noted in
    /// the span, traces stopped, the circuit breaker tripped.
    async fn account(&self, run: &StepRun, span: &mut Span, next: &mut Vec<NextAction>) {
        let Some(budget) = self.budget.clone() else {
            return;
        };
        let trace_id = run.pending.trace_id;
        let breaker_notify = budget.settings().circuit_breaker.notify;
        // Only spans with an agent call, a push or a trace's end change the ledger; the rest
        // cost no I/O here.
        let counts = crate::budget::SpanUsage::of(span).is_some()
            || span.step.is_terminal()
            || span.step == StepKind::Push;
        let verdict = if counts {
            let started = if budget.settings().trace.wall_secs.is_some() {
                self.trace_started(trace_id).await
            } else {
                span.timestamp
            };
            let store = self.ctx.store.clone();
            let counted = span.clone();
            let action_meta = run.action.meta.clone();
            let now = Utc::now();
            let verdict = tokio::task::spawn_blocking(move || {
                Ledger::update(&store, |l| {
                    budget.after_span(l, &counted, &action_meta, started, now)
                })
            })
            .await;
            match verdict {
                Ok(Ok(v)) => v,
                Ok(Err(e)) => {
                    tracing::error!(error = %e, "cannot update the budget ledger");
                    self.notice(format!("cannot update the budget ledger: {e}"));
                    return;
                }
                Err(_) => return,
            }
        } else {
            crate::budget::SpanVerdict::default()
        };
        if !verdict.warnings.is_empty() {
            for w in &verdict.warnings {
                tracing::warn!(trace = %trace_id, warning = %w, "budget limit reached");
                self.notice(format!("budget warning: {w}"));
            }
            span.meta
                .insert("budgetWarnings".into(), serde_json::json!(verdict.warnings));
        }
        if let Some(reason) = &verdict.stop_all {
            let traces: HashSet<Uuid> = self
                .in_flight
                .lock()
                .expect("in-flight lock")
                .runs
                .values()
                .map(|r| r.trace_id)
                .chain([trace_id])
                .collect();
            for t in traces {
                self.stop_trace(t, reason).await;
            }
        }
        if let Some(reason) = &verdict.stop_trace {
            self.stop_trace(trace_id, reason).await;
        }
        let stopped = self
            .stopped
            .lock()
            .expect("stopped lock")
            .contains_key(&trace_id);
        let already =
            span.meta.contains_key(stop_key(false)) || span.meta.contains_key(stop_key(true));
        if stopped && !span.step.is_terminal() && !already {
            // The trace goes no further: its next steps give way to the budget notify (or,
            // closed by a person, to the answer the command queued).
            next.clear();
            next.extend(self.claim_budget_notify(trace_id));
            span.meta
                .insert(stop_key(self.closed_by_hand(trace_id)).into(), true.into());
        }
        if let Some(tripped) = verdict.tripped {
            let text = crate::budget::breaker_message(&tripped.reason);
            // Announced by the failure notify that tripped it: no second answer.
            let announced = run.action.meta.contains_key("breakerNote");
            tracing::error!(trace = %trace_id, reason = %tripped.reason, "circuit breaker open: no new traces until `rover autopilot resume`");
            self.notice(text.clone());
            span.meta
                .insert("circuitBreakerTripped".into(), true.into());
            if breaker_notify && !announced {
                let meta = NotifyMeta {
                    purpose: NotifyPurpose::Flag,
                    message: Some(format!("rover paused itself: {text}.")),
                    failed_step: None,
                    error: None,
                    pr_url: None,
                    breaker_note: None,
                };
                let mut action = NextAction::new(StepKind::Notify, text).with_meta(&meta);
                action.meta.insert(BREAKER_KEY.into(), true.into());
                next.push(action);
            }
        }
    }

    fn release_in_flight(&self, action_id: Uuid) {
        let mut flight = self.in_flight.lock().expect("in-flight lock");
        if let Some(run) = flight.runs.remove(&action_id) {
            flight.exclusive.remove(&(run.step, run.trace_id));
        }
    }

    fn report_dead_letter(&self, pending: &PendingAction) {
        if self
            .reported_dead
            .lock()
            .expect("dead-letter lock")
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

    async fn run_action(
        self: Arc<Self>,
        step: Arc<dyn Step>,
        pending: PendingAction,
        skip: Option<String>,
    ) {
        let kind = step.kind();
        let store = self.ctx.store.clone();
        let action_id = pending.action_id;
        let begin_kind = kind.clone();
        let mut run = match blocking(store, move |s| s.begin_step(action_id, &begin_kind)).await {
            Ok(run) => run,
            Err(StoreError::NotPending(_)) => return, // taken by another process meanwhile
            Err(e) => {
                self.internal_errors.fetch_add(1, Ordering::Relaxed);
                tracing::error!(step = %kind, error = %e, "cannot start a step run");
                self.notice(format!("cannot start {kind}: {e}"));
                return;
            }
        };
        let stop = {
            let mut flight = self.in_flight.lock().expect("in-flight lock");
            match flight.runs.get_mut(&action_id) {
                Some(r) => {
                    r.span = run.span.clone();
                    r.stop.clone()
                }
                None => CancellationToken::new(),
            }
        };
        let _ = self.progress.send(Progress::Started {
            trace_id: run.pending.trace_id,
            step: kind.clone(),
            span_id: run.span.id,
        });

        if let Some(reason) = skip {
            self.finish_stopped(&run, &reason).await;
            return;
        }
        if kind == StepKind::Notify {
            self.add_breaker_note(&mut run).await;
        }
        if self.budget.is_some() && is_new_trace(&run.pending) && run.pending.attempts == 1 {
            let store = self.ctx.store.clone();
            let now = Utc::now();
            let recorded = tokio::task::spawn_blocking(move || {
                Ledger::update(&store, |l| {
                    l.prune(now);
                    l.trace_starts.push(now);
                })
            })
            .await;
            if !matches!(recorded, Ok(Ok(()))) {
                tracing::warn!(trace = %run.pending.trace_id, "cannot record a trace start in the budget ledger");
            }
        }

        if run.pending.attempts > self.settings.max_attempts {
            let error = StepError::fatal(format!(
                "gave up after {} attempts; the earlier runs of this action are in the trace",
                self.settings.max_attempts
            ));
            self.finish_with_error(&run, &error).await;
            return;
        }

        // The step runs in its own task so that a panic is caught as a `JoinError`.
        let task_step = step.clone();
        let ctx = self.ctx.clone();
        let task_run = run.clone();
        // Every log line of the run carries its trace, step, span and action ids, so that
        // `log.jsonl` joins with `rover autopilot trace`.
        let log_span = tracing::info_span!(
            "step",
            trace = %run.pending.trace_id,
            step = %kind,
            span = %run.span.id,
            action = %action_id,
            attempt = run.pending.attempts,
        );
        let mut handle = tokio::spawn(
            async move {
                tracing::info!("step started");
                let result = task_step.process(&ctx, &task_run).await;
                match &result {
                    Ok(Outcome::Finished(f)) => {
                        tracing::info!(status = %f.status, summary = %f.summary, "step finished");
                    }
                    Ok(Outcome::Detached { .. }) => tracing::info!("step detached"),
                    Err(e) => {
                        tracing::warn!(error = %e.message, retryable = e.retryable, "step failed");
                    }
                }
                result
            }
            .instrument(log_span),
        );
        let joined = tokio::select! {
            joined = &mut handle => joined,
            () = stop.cancelled() => {
                // A budget stopped the trace: dropping the step's future kills its agent.
                handle.abort();
                let _ = handle.await;
                let reason = self.stop_reason(run.pending.trace_id);
                self.finish_stopped(&run, &reason).await;
                return;
            }
        };
        let result = match joined {
            Ok(result) => result,
            Err(join) if join.is_panic() => {
                let payload = join.into_panic();
                let text = payload
                    .downcast_ref::<&str>()
                    .map(|s| (*s).to_owned())
                    .or_else(|| payload.downcast_ref::<String>().cloned())
                    .unwrap_or_else(|| "a panic without a message".into());
                Err(
                    StepError::fatal(format!("the {kind} step panicked: {text}"))
                        .detail("panic", true),
                )
            }
            Err(_) => Err(StepError::retryable(format!(
                "the {kind} step was cancelled"
            ))),
        };
        match result {
            Ok(Outcome::Finished(finished)) => self.finish(&run, finished).await,
            Ok(Outcome::Detached { meta }) => {
                let mut span = run.span.clone();
                span.meta.extend(meta);
                let store = self.ctx.store.clone();
                if let Err(e) = blocking(store, move |s| s.write_span(&span)).await {
                    tracing::error!(error = %e, "cannot record detached run");
                }
            }
            Err(error) => self.handle_error(&run, error).await,
        }
    }

    async fn handle_error(&self, run: &StepRun, error: StepError) {
        if error.retryable && run.pending.attempts < self.settings.max_attempts {
            let exp = 2u32.saturating_pow(run.pending.attempts.saturating_sub(1));
            let delay = (self.settings.retry_backoff * exp).min(Duration::from_secs(300));
            let now = Utc::now();
            let backoff = now + chrono::Duration::from_std(delay).unwrap_or_default();
            // A time GitHub named (a rate limit's reset) wins over a shorter backoff, within
            // an hour (GitHub's limits reset hourly; a wrong clock must not park work for days).
            let not_before = match error.retry_not_before {
                Some(at) => backoff.max(at.min(now + chrono::Duration::hours(1))),
                None => backoff,
            };
            let mut span = run.span.clone();
            let mut meta = Meta::new();
            meta.insert("error".into(), error.to_meta());
            meta.insert(
                "retryAt".into(),
                serde_json::json!(not_before.to_rfc3339_opts(chrono::SecondsFormat::Millis, true)),
            );
            let summary = format!(
                "{}; will retry (attempt {} of {})",
                error.message, run.pending.attempts, self.settings.max_attempts
            );
            if span
                .finish(SpanStatus::Error, summary.clone(), meta, Utc::now())
                .is_err()
            {
                return;
            }
            let _ = self.progress.send(Progress::Finished {
                trace_id: run.pending.trace_id,
                step: span.step.clone(),
                span_id: span.id,
                status: SpanStatus::Error,
                summary,
            });
            let store = self.ctx.store.clone();
            let action_id = run.action.id;
            if let Err(e) = blocking(store, move |s| {
                s.release_step(action_id, Some(&span), Some(not_before))
            })
            .await
            {
                tracing::error!(error = %e, "cannot release a step run for retry");
            }
            return;
        }
        self.internal_errors.fetch_add(1, Ordering::Relaxed);
        self.finish_with_error(run, &error).await;
    }

    /// The error span and the fail-forward action(s).
    async fn finish_with_error(&self, run: &StepRun, error: &StepError) {
        tracing::warn!(step = %run.span.step, trace = %run.pending.trace_id, error = %error.message, "step failed with an error");
        let mut finished = Finished {
            status: SpanStatus::Error,
            summary: error.message.clone(),
            meta: Meta::new(),
            actions: fail_forward(&run.span.step, run.action.id, error),
        };
        finished.meta.insert("error".into(), error.to_meta());
        self.finish(run, finished).await;
    }

    async fn finish(&self, run: &StepRun, finished: Finished) {
        let mut span = run.span.clone();
        let now = Utc::now();
        let summary = finished.summary.clone();
        if let Err(e) = span.finish(finished.status, finished.summary, finished.meta, now) {
            tracing::error!(error = %e, "cannot finish a span");
            return;
        }
        let trace_id = run.pending.trace_id;
        let mut next = finished.actions;
        if self.budget.is_some() {
            self.account(run, &mut span, &mut next).await;
        }
        let actions: Vec<Action> = next
            .into_iter()
            .map(|a| {
                let mut action = Action::new(a.kind, &span, a.reason, a.meta, now);
                if let Some(id) = a.id {
                    action.id = id;
                }
                action
            })
            .collect();
        let store = self.ctx.store.clone();
        let written = span.clone();
        if let Err(e) = blocking(store, move |s| s.complete_step(&written, &actions)).await {
            self.internal_errors.fetch_add(1, Ordering::Relaxed);
            tracing::error!(error = %e, "cannot record a finished step; it will be recovered at the next start");
            self.notice(format!("cannot record a finished {}: {e}", span.step));
            return;
        }
        let _ = self.progress.send(Progress::Finished {
            trace_id,
            step: span.step.clone(),
            span_id: span.id,
            status: span.status,
            summary,
        });
    }

    async fn finish_detached(self: Arc<Self>, kind: StepKind, completion: Completion) {
        let store = self.ctx.store.clone();
        let action_id = completion.action_id;
        let found = blocking(store.clone(), move |s| {
            let state = s.read_state()?;
            let pending = state
                .pending_for(action_id)
                .cloned()
                .ok_or(StoreError::NotPending(action_id))?;
            let span_id = pending
                .running_span_id
                .ok_or(StoreError::NotPending(action_id))?;
            let span = s.read_span(span_id)?;
            let action = s.read_action(action_id)?;
            Ok::<_, StoreError>(StepRun {
                pending,
                action,
                span,
            })
        })
        .await;
        match found {
            Ok(run) => self.finish(&run, completion.finished).await,
            Err(e) => {
                tracing::warn!(step = %kind, error = %e, "a detached run finished but is no longer claimed");
            }
        }
    }

    async fn interrupt(&self, action_id: Uuid, span: Span) -> Result<(), StoreError> {
        if span.id.is_nil() {
            return Ok(()); // cut off before its span existed: the action simply stays queued
        }
        let mut span = span;
        let mut meta = Meta::new();
        meta.insert("interrupted".into(), true.into());
        if span
            .finish(
                SpanStatus::Error,
                "interrupted by shutdown; it will run again at the next start",
                meta,
                Utc::now(),
            )
            .is_err()
        {
            return Ok(());
        }
        blocking(self.ctx.store.clone(), move |s| {
            s.release_step(action_id, Some(&span), None)
        })
        .await
    }
}

/// Where a step that could not finish hands over, so no trace ends silently: a workflow still
/// goes to commit → resolve, a commit to resolve, a deciding step to a notify that says why.
/// Terminal steps end the trace with their error span.
pub fn fail_forward(step: &StepKind, action_id: Uuid, error: &StepError) -> Vec<NextAction> {
    let failure = crate::steps::meta::NotifyMeta::failure(step, &error.message);
    match step {
        StepKind::Workflow => vec![NextAction::new(StepKind::Commit, "the workflow could not finish; the committer records that and hands over to the resolver")
            .with_meta(&crate::steps::meta::CommitMeta::after_error(action_id))],
        StepKind::Commit => vec![NextAction::new(StepKind::Resolve, "the commit step could not finish; the resolver decides what to do")],
        StepKind::Coordinate | StepKind::Plan | StepKind::Resolve | StepKind::Push | StepKind::Event => {
            vec![NextAction::new(StepKind::Notify, format!("the {step} step failed: {}", error.message)).with_meta(&failure)]
        }
        StepKind::Notify | StepKind::Noop | StepKind::Cleanup | StepKind::Other(_) => Vec::new(),
    }
}

/// Store work off the async runtime: it lives with the store; re-exported for the steps that
/// still import it from here.
pub use crate::store::blocking;
