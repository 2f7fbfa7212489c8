//! The `StepOrchestrator`: the only scheduler. It drains the pending queue of the store and
//! dispatches each action to the step that handles its type, within each step's `maxParallel`
//! and per-trace exclusivity, runs `monitor()`s before reading the queue, drains again as soon as
//! any step finishes, and turns every error or panic into an `error` span and the fail-forward
//! action the pipeline asks for. Steps never call each other; they talk through the store.
//!
//! One job a file: `drain` (recovery, monitors, admission and dispatch), `run` (one run, its
//! errors and retries), `collect` (collecting a detached run in a run of its own, under a
//! `collect` span), `finish` (the hand-over), `budget` (the [`BudgetGate`]), `pipeline` (the
//! policy the steps supply: fail-forward and the answers of stopped traces), `signal` (intake's
//! `Queue`: new work and CI outcomes), `step` (the contract).

mod budget;
mod collect;
mod drain;
mod finish;
mod pipeline;
mod progress;
mod run;
mod signal;
mod slots;
mod step;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use chrono::{DateTime, Utc};
use tokio::sync::{broadcast, Notify, Semaphore};
use tokio::task::AbortHandle;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use uuid::Uuid;

use budget::{BudgetGate, Halt};
pub use collect::{collect_kind, is_collection, COLLECT};
pub use pipeline::{NoPipeline, Pipeline};
pub use progress::Progress;
pub use slots::{Bid, Decision, ScoreWeights, SlotBoard, SlotFacts, SlotSeat, SlotSettings, Waker};
pub use step::{
    Collected, Completion, Finished, NextAction, Outcome, Readiness, Step, StepContext, StepError,
};

use crate::budget::Budget;
use crate::store::{AutopilotStore, Meta, PendingAction, Span, StepKind, StoreError};

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

/// A run in progress: a step run, or the collection of a detached run of `step`.
struct Running {
    step: StepKind,
    trace_id: Uuid,
    /// The run's span, or the collection's `collect` span.
    span: Span,
    abort: Option<AbortHandle>,
    /// Cancelled when a budget (or a person) stops the run's trace.
    stop: CancellationToken,
    /// A collection (`collect.rs`): cut off, its span is closed and the run stays claimed, to be
    /// collected again.
    collecting: bool,
}

/// The runs in progress in this process (from their claim until `process` returned and the
/// outcome is recorded); shared with [`StepContext::in_process`].
#[derive(Default)]
pub(crate) struct InFlight {
    runs: HashMap<Uuid, Running>,
    /// (step, trace) pairs holding a per-trace exclusive step.
    exclusive: HashSet<(StepKind, Uuid)>,
    /// Runs that detached here, of steps whose detached runs hold their slots, until `monitor`
    /// collects them (see `drain`).
    detached: HashMap<Uuid, StepKind>,
}

impl InFlight {
    fn contains(&self, action_id: Uuid) -> bool {
        self.runs.contains_key(&action_id)
    }
}

struct Inner {
    ctx: StepContext,
    steps: BTreeMap<StepKind, Arc<dyn Step>>,
    permits: BTreeMap<StepKind, Arc<Semaphore>>,
    settings: OrchestratorSettings,
    wake: Arc<Notify>,
    tracker: TaskTracker,
    progress: broadcast::Sender<Progress>,
    reported_dead: Mutex<HashSet<Uuid>>,
    waiting: Mutex<HashMap<Uuid, String>>,
    /// What `waiting.json` holds, as this process last wrote it.
    published_waiting: Mutex<Option<std::collections::BTreeMap<Uuid, String>>>,
    internal_errors: AtomicUsize,
    pipeline: Arc<dyn Pipeline>,
    gate: BudgetGate,
    /// Detached runs whose collection failed with a retryable error: not collected again before.
    recollect: Mutex<HashMap<Uuid, DateTime<Utc>>>,
    /// The daemon's agent slots and the name this orchestrator's repository bids under; its
    /// seat is taken at the first drain and left when the orchestrator is dropped.
    slots: Option<(Arc<SlotBoard>, String)>,
    seat: std::sync::OnceLock<SlotSeat>,
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
    /// Collections of detached runs started (each runs as its own task).
    pub completed_detached: usize,
    /// Runnable actions left queued because their step was full.
    pub deferred: usize,
    /// The earliest time a backed-off action becomes runnable.
    pub next_due: Option<DateTime<Utc>>,
}

impl StepOrchestrator {
    /// A scheduler of `steps` without a pipeline policy ([`NoPipeline`]: nothing fails forward);
    /// rover's daemon adds the steps' one with [`StepOrchestrator::with_pipeline`].
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
        let pipeline: Arc<dyn Pipeline> = Arc::new(NoPipeline);
        let wake = Arc::new(Notify::new());
        StepOrchestrator {
            inner: Arc::new(Inner {
                ctx: StepContext {
                    store: store.clone(),
                    cancel: CancellationToken::new(),
                    in_flight: Arc::default(),
                    progress: Some(progress.clone()),
                    wake: wake.clone(),
                },
                steps: by_kind,
                permits,
                settings,
                wake,
                tracker: TaskTracker::new(),
                progress: progress.clone(),
                reported_dead: Mutex::new(HashSet::new()),
                waiting: Mutex::new(HashMap::new()),
                published_waiting: Mutex::new(None),
                internal_errors: AtomicUsize::new(0),
                pipeline: pipeline.clone(),
                gate: BudgetGate::new(store, pipeline, progress),
                recollect: Mutex::new(HashMap::new()),
                slots: None,
                seat: std::sync::OnceLock::new(),
            }),
        }
    }

    fn inner_mut(&mut self) -> &mut Inner {
        Arc::get_mut(&mut self.inner).expect("configured before the orchestrator is shared")
    }

    /// Start the runs of the steps that take an agent slot only with one of `board`'s, bidding
    /// as `repository` (see `slots`); call before the first drain. Without it, those runs are
    /// bound by their step's `maxParallel` alone.
    #[must_use]
    pub fn with_slots(mut self, board: Arc<SlotBoard>, repository: &str) -> StepOrchestrator {
        self.inner_mut().slots = Some((board, repository.to_owned()));
        self
    }

    /// Enforce `budget` (limits, circuit breaker, caps); call before the first drain.
    #[must_use]
    pub fn with_budget(mut self, budget: Budget) -> StepOrchestrator {
        self.inner_mut().gate.set_budget(budget);
        self
    }

    /// The pipeline's policy (fail-forward, the answers of stopped traces), supplied by the
    /// steps (`steps::pipeline()`); call before the first drain.
    #[must_use]
    pub fn with_pipeline(mut self, pipeline: Arc<dyn Pipeline>) -> StepOrchestrator {
        let inner = self.inner_mut();
        inner.gate.set_pipeline(pipeline.clone());
        inner.pipeline = pipeline;
        self
    }

    pub fn store(&self) -> &AutopilotStore {
        &self.inner.ctx.store
    }

    /// Live progress events (step started/finished, notices) for the console and tests.
    pub fn subscribe(&self) -> broadcast::Receiver<Progress> {
        self.inner.progress.subscribe()
    }

    /// The progress feed without keeping it open: subscribe through it while the orchestrator
    /// lives (the console, restarted after a panic, subscribes again).
    pub fn progress_feed(&self) -> broadcast::WeakSender<Progress> {
        self.inner.progress.downgrade()
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
        self.inner.flight().runs.len()
    }

    /// Why queued actions are waiting (resolver `wait`, unmet dependencies, detached runs
    /// holding their step's slots).
    pub fn waiting(&self) -> HashMap<Uuid, String> {
        self.inner
            .waiting
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
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
                    tracing::error!(error = &e as &dyn std::error::Error, "drain failed");
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
        let cut: Vec<(Uuid, Running)> = self.inner.flight().runs.drain().collect();
        for (action_id, run) in cut {
            if let Some(abort) = &run.abort {
                abort.abort();
            }
            if run.collecting {
                self.inner
                    .interrupt_collection(
                        run.span,
                        "interrupted by shutdown; the run is collected again at the next start",
                    )
                    .await?;
            } else {
                self.inner
                    .interrupt(
                        action_id,
                        run.span,
                        "interrupted by shutdown; it will run again at the next start",
                    )
                    .await?;
            }
        }
        Ok(())
    }
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

    fn flight(&self) -> MutexGuard<'_, InFlight> {
        self.ctx.flight()
    }

    fn release_in_flight(&self, action_id: Uuid) {
        let mut flight = self.flight();
        if let Some(run) = flight.runs.remove(&action_id) {
            if !run.collecting {
                flight.exclusive.remove(&(run.step, run.trace_id));
            }
        }
    }

    /// Traces the budget gate stopped: cancel their runs here (terminal steps, the budget
    /// notify among them, are left to finish) and stop their detached work (containers).
    async fn halt(&self, halt: Halt) {
        for trace_id in halt.0 {
            for run in self
                .flight()
                .runs
                .values()
                .filter(|r| r.trace_id == trace_id && !self.pipeline.ends_trace(&r.step))
            {
                run.stop.cancel();
            }
            for step in self.steps.values() {
                let n = step.stop_detached(&self.ctx, trace_id).await;
                if n > 0 {
                    tracing::warn!(trace = %trace_id, step = %step.kind(), runs = n, "stopped detached runs of a stopped trace");
                }
            }
        }
    }
}
