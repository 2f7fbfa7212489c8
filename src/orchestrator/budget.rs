//! The `BudgetGate`: budget enforcement (limits, circuit breaker, caps) and traces closed by a
//! person, behind one narrow interface. The scheduler asks it whether a queued action may run
//! ([`BudgetGate::admit`]), tells it when a run starts and finishes ([`BudgetGate::on_start`],
//! [`BudgetGate::account`]), and gets back the traces it stopped: the scheduler then cancels their
//! runs and stops their detached work. The gate never touches runs itself.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};

use chrono::{DateTime, Utc};
use tokio::sync::broadcast;
use uuid::Uuid;

use super::pipeline::Pipeline;
use super::progress::Progress;
use super::step::{Finished, NextAction};
use crate::budget::{Budget, Ledger};
use crate::store::blocking;
use crate::store::{
    AutopilotStore, ErrorMeta, Meta, PendingAction, RunSpanMeta, Span, SpanStatus, StepKind,
    StepRun,
};

/// What the budget says about a queued action.
pub(super) enum Gate {
    Go,
    /// Keep it queued, with the reason shown by `status`.
    Wait(String),
    /// Its trace was stopped (by a budget or a person): close it without running the step.
    Skip(String),
}

/// Traces the gate has just stopped: the scheduler cancels their runs and detached work.
#[must_use]
pub(super) struct Halt(pub Vec<Uuid>);

/// A trace a budget stopped: its running agents are cancelled, its queued actions are closed,
/// and it ends with one budget notify.
struct Stopped {
    reason: String,
    notified: bool,
    /// Closed by a person (`rover autopilot cancel`/`fail`), who also queued its answer.
    human: bool,
}

#[derive(Default)]
struct Traces {
    stopped: HashMap<Uuid, Stopped>,
    /// When each trace started (its event span's time), cached.
    started_at: HashMap<Uuid, DateTime<Utc>>,
}

/// See the module documentation.
pub(super) struct BudgetGate {
    store: AutopilotStore,
    budget: Option<Budget>,
    pipeline: Arc<dyn Pipeline>,
    progress: broadcast::Sender<Progress>,
    traces: Mutex<Traces>,
}

/// The first action of a trace (produced by its root event span): running it starts the trace.
pub(super) fn is_new_trace(pending: &PendingAction) -> bool {
    pending.action == StepKind::Coordinate && pending.span_id == pending.trace_id
}

/// The span meta marking a run closed because its trace was stopped: by a person, or by a
/// budget.
fn stop_meta(human: bool) -> RunSpanMeta {
    RunSpanMeta {
        budget_stopped: !human,
        closed_by_hand: human,
        ..RunSpanMeta::default()
    }
}

impl BudgetGate {
    pub(super) fn new(
        store: AutopilotStore,
        pipeline: Arc<dyn Pipeline>,
        progress: broadcast::Sender<Progress>,
    ) -> BudgetGate {
        BudgetGate {
            store,
            budget: None,
            pipeline,
            progress,
            traces: Mutex::new(Traces::default()),
        }
    }

    pub(super) fn set_budget(&mut self, budget: Budget) {
        self.budget = Some(budget);
    }

    pub(super) fn set_pipeline(&mut self, pipeline: Arc<dyn Pipeline>) {
        self.pipeline = pipeline;
    }

    fn notice(&self, text: String) {
        let _ = self.progress.send(Progress::Notice(text));
    }

    fn traces(&self) -> std::sync::MutexGuard<'_, Traces> {
        self.traces
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Start of a drain: the ledger (when a budget is enforced; unreadable: said, and no gate
    /// this drain), and the running traces (`running`: with runs in this process or detached)
    /// stopped by a period limit with `stop` or past a trace limit.
    pub(super) async fn begin_drain(
        &self,
        running: HashSet<Uuid>,
        now: DateTime<Utc>,
    ) -> (Option<Ledger>, Halt) {
        let Some(ledger) = self.load_ledger().await else {
            return (None, Halt(Vec::new()));
        };
        let budget = self.budget.as_ref().expect("a ledger only with a budget");
        let mut halt = Vec::new();
        // A period limit with `stop`: every running trace stops.
        let period_stop = budget.standing(&ledger, now).stopped;
        for trace_id in running {
            if let Some(reason) = &period_stop {
                halt.extend(self.stop_trace(trace_id, reason).await);
                continue;
            }
            if !budget.trace_limit_stops() {
                continue;
            }
            let started = self.trace_started(trace_id).await;
            if let Some((_, reason)) = budget.trace_over(ledger.trace(trace_id), started, now) {
                halt.extend(self.stop_trace(trace_id, &reason).await);
            }
        }
        (Some(ledger), Halt(halt))
    }

    async fn load_ledger(&self) -> Option<Ledger> {
        self.budget.as_ref()?;
        let store = self.store.clone();
        match tokio::task::spawn_blocking(move || Ledger::load(&store)).await {
            Ok(Ok(l)) => Some(l),
            Ok(Err(e)) => {
                tracing::error!(
                    error = &e as &dyn std::error::Error,
                    "cannot read the budget ledger"
                );
                self.notice(format!("cannot read the budget ledger: {e}"));
                None
            }
            Err(_) => None,
        }
    }

    /// May `pending` run now? (Terminal steps always may.)
    pub(super) async fn admit(
        &self,
        ledger: &mut Ledger,
        pending: &PendingAction,
        now: DateTime<Utc>,
    ) -> (Gate, Halt) {
        let go = |gate| (gate, Halt(Vec::new()));
        let Some(budget) = &self.budget else {
            return go(Gate::Go);
        };
        let trace_id = pending.trace_id;
        if self.pipeline.ends_trace(&pending.action) {
            return go(Gate::Go);
        }
        if let Some(s) = self.traces().stopped.get(&trace_id) {
            return go(Gate::Skip(s.reason.clone()));
        }
        let standing = budget.standing(ledger, now);
        if is_new_trace(pending) {
            if let Some(reason) = standing.new_traces_wait.into_iter().next() {
                return go(Gate::Wait(reason));
            }
            ledger.trace_starts.push(now); // counts against the cap within this drain too
            return go(Gate::Go);
        }
        if let Some(reason) = standing.stopped {
            let halt = self.stop_trace(trace_id, &reason).await;
            return (Gate::Skip(reason), Halt(halt.into_iter().collect()));
        }
        if pending.action == StepKind::Push {
            if let Some(reason) = standing.pushes_wait {
                return go(Gate::Wait(reason));
            }
        }
        if budget.trace_limit_stops() {
            let started = self.trace_started(trace_id).await;
            if let Some((_, reason)) = budget.trace_over(ledger.trace(trace_id), started, now) {
                let halt = self.stop_trace(trace_id, &reason).await;
                return (Gate::Skip(reason), Halt(halt.into_iter().collect()));
            }
        }
        go(Gate::Go)
    }

    /// A trace a person closed (`state.json`'s `closed`): its runs stop like a budget's, and
    /// nothing but its answer (queued by the command) runs. Returns it if it is newly closed.
    pub(super) fn close_by_hand(&self, trace_id: Uuid, reason: &str) -> Halt {
        Halt(
            self.mark_stopped(trace_id, reason, true)
                .then_some(trace_id)
                .into_iter()
                .collect(),
        )
    }

    /// Mark a trace stopped by a budget; returns it if it is newly stopped.
    async fn stop_trace(&self, trace_id: Uuid, reason: &str) -> Option<Uuid> {
        if !self.mark_stopped(trace_id, reason, false) {
            return None;
        }
        // Stopped before a restart: its budget notify is already in the store, so the trace
        // is not answered twice.
        if self.has_budget_notify(trace_id).await {
            if let Some(s) = self.traces().stopped.get_mut(&trace_id) {
                s.notified = true;
            }
        }
        Some(trace_id)
    }

    /// Whether the trace already holds a budget notify (from before a restart).
    async fn has_budget_notify(&self, trace_id: Uuid) -> bool {
        let store = self.store.clone();
        let pipeline = self.pipeline.clone();
        blocking(store, move |s| s.load_trace(trace_id))
            .await
            .is_ok_and(|view| view.actions.iter().any(|a| pipeline.is_budget_answer(a)))
    }

    fn mark_stopped(&self, trace_id: Uuid, reason: &str, human: bool) -> bool {
        let fresh = match self.traces().stopped.entry(trace_id) {
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
        fresh
    }

    /// Why the trace was stopped (for a run cancelled by the stop).
    pub(super) fn stop_reason(&self, trace_id: Uuid) -> String {
        self.traces().stopped.get(&trace_id).map_or_else(
            || "a budget limit was reached".to_owned(),
            |s| s.reason.clone(),
        )
    }

    /// The trace's budget notify, once per trace.
    fn claim_budget_notify(&self, trace_id: Uuid) -> Option<NextAction> {
        let reason = {
            let mut traces = self.traces();
            let entry = traces.stopped.get_mut(&trace_id)?;
            if entry.notified {
                return None;
            }
            entry.notified = true;
            entry.reason.clone()
        };
        self.pipeline.budget_stopped(&reason)
    }

    /// Whether a person closed the trace (rather than a budget stopping it).
    fn closed_by_hand(&self, trace_id: Uuid) -> bool {
        self.traces()
            .stopped
            .get(&trace_id)
            .is_some_and(|s| s.human)
    }

    /// How a run of a stopped trace ends: an error span that says so, and the budget notify.
    pub(super) fn stopped_run(&self, trace_id: Uuid, reason: &str) -> Finished {
        let human = self.closed_by_hand(trace_id);
        let message = if human {
            format!("stopped by hand: the trace was {reason}")
        } else {
            format!("stopped by a budget: {reason}")
        };
        let mut finished = Finished {
            status: SpanStatus::Error,
            summary: message.clone(),
            meta: Meta::new(),
            actions: self.claim_budget_notify(trace_id).into_iter().collect(),
        };
        stop_meta(human).put_into(&mut finished.meta);
        ErrorMeta {
            message,
            retryable: false,
            tampered: false,
            details: Meta::new(),
        }
        .put_into(&mut finished.meta);
        finished
    }

    /// A run starts: a failure answer that will trip the circuit breaker carries the breaker's
    /// announcement (in this run's copy of the action), so its trace is answered once; a trace's
    /// first run counts against the trace cap.
    pub(super) async fn on_start(&self, run: &mut StepRun) {
        let Some(budget) = &self.budget else { return };
        // Only a failure answer can trip the breaker: no ledger read for the others.
        if self.pipeline.is_failure_answer(&run.action) {
            if let Some(ledger) = self.load_ledger().await {
                if let Some(note) =
                    budget.breaker_note(&ledger, run.pending.trace_id, &run.action.meta)
                {
                    self.pipeline.add_breaker_note(&mut run.action.meta, note);
                }
            }
        }
        if is_new_trace(&run.pending) && run.pending.attempts == 1 {
            let store = self.store.clone();
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
    }

    /// When a trace started (its event span's time), cached.
    async fn trace_started(&self, trace_id: Uuid) -> DateTime<Utc> {
        if let Some(t) = self.traces().started_at.get(&trace_id) {
            return *t;
        }
        let store = self.store.clone();
        let at = blocking(store, move |s| s.read_span(trace_id))
            .await
            .map_or_else(|_| Utc::now(), |root| root.timestamp);
        self.traces().started_at.insert(trace_id, at);
        at
    }

    /// Count a finished span in the budget ledger and act on what it means: warnings noted in
    /// the span, traces stopped (`running`: the traces with runs in this process, for a limit
    /// that stops everything), the circuit breaker tripped. A stopped trace's next steps give
    /// way to its budget notify.
    pub(super) async fn account(
        &self,
        run: &StepRun,
        span: &mut Span,
        next: &mut Vec<NextAction>,
        running: impl FnOnce() -> HashSet<Uuid>,
    ) -> Halt {
        let mut halt = Vec::new();
        let Some(budget) = self.budget.clone() else {
            return Halt(halt);
        };
        let trace_id = run.pending.trace_id;
        let breaker_notify = budget.settings().circuit_breaker.notify;
        // Only spans with an agent call, a push or a trace's end change the ledger; the rest
        // cost no I/O here.
        let counts = crate::budget::SpanUsage::of(span).is_some()
            || self.pipeline.ends_trace(&span.step)
            || span.step == StepKind::Push;
        let verdict = if counts {
            let started = if budget.settings().trace.wall_secs.is_some() {
                self.trace_started(trace_id).await
            } else {
                span.timestamp
            };
            let store = self.store.clone();
            let counted = span.clone();
            let action_meta = run.action.meta.clone();
            let gives_verdict = self.pipeline.gives_verdict(&span.step);
            let now = Utc::now();
            let verdict = tokio::task::spawn_blocking(move || {
                Ledger::update(&store, |l| {
                    budget.after_span(l, &counted, gives_verdict, &action_meta, started, now)
                })
            })
            .await;
            match verdict {
                Ok(Ok(v)) => v,
                Ok(Err(e)) => {
                    tracing::error!(
                        error = &e as &dyn std::error::Error,
                        "cannot update the budget ledger"
                    );
                    self.notice(format!("cannot update the budget ledger: {e}"));
                    return Halt(halt);
                }
                Err(_) => return Halt(halt),
            }
        } else {
            crate::budget::SpanVerdict::default()
        };
        if !verdict.warnings.is_empty() {
            for w in &verdict.warnings {
                tracing::warn!(trace = %trace_id, warning = %w, "budget limit reached");
                self.notice(format!("budget warning: {w}"));
            }
            RunSpanMeta {
                budget_warnings: verdict.warnings.clone(),
                ..RunSpanMeta::default()
            }
            .put_into(&mut span.meta);
        }
        if let Some(reason) = &verdict.stop_all {
            let mut traces = running();
            traces.insert(trace_id);
            for t in traces {
                halt.extend(self.stop_trace(t, reason).await);
            }
        }
        if let Some(reason) = &verdict.stop_trace {
            halt.extend(self.stop_trace(trace_id, reason).await);
        }
        let stopped = self.traces().stopped.contains_key(&trace_id);
        let already = RunSpanMeta::of(span).stopped();
        if stopped && !self.pipeline.ends_trace(&span.step) {
            // The trace goes no further: its next steps give way to the budget notify (or,
            // closed by a person, to the answer the command queued). A span marked stopped
            // already (a run closed by hand) loses its next steps all the same: a cancel,
            // a fail or a budget stop is followed by the answer alone, whatever finished first.
            if already {
                // Its answer (the budget notify `stopped_run` claimed) stays; nothing else.
                next.retain(|action| self.pipeline.ends_trace(&action.kind));
            } else {
                next.clear();
                stop_meta(self.closed_by_hand(trace_id)).put_into(&mut span.meta);
            }
            next.extend(self.claim_budget_notify(trace_id));
        }
        if let Some(tripped) = verdict.tripped {
            let text = crate::budget::breaker_message(&tripped.reason);
            // Announced by the failure notify that tripped it: no second answer.
            let announced = self.pipeline.has_breaker_note(&run.action.meta);
            tracing::error!(trace = %trace_id, reason = %tripped.reason, "circuit breaker open: no new traces until `rover autopilot resume`");
            self.notice(text.clone());
            RunSpanMeta {
                circuit_breaker_tripped: true,
                ..RunSpanMeta::default()
            }
            .put_into(&mut span.meta);
            if breaker_notify && !announced {
                next.extend(self.pipeline.breaker_tripped(&text));
            }
        }
        Halt(halt)
    }
}
