//! The contract between the orchestrator and the ten steps: what a step declares (its action
//! type, how many may run at once, per-trace exclusivity), what it is given (the action and its
//! running span) and what it returns (a finished span and the next actions, or work that goes on
//! outside the process).

use std::sync::{Arc, Mutex, MutexGuard};

use async_trait::async_trait;
use serde_json::Value;
use tokio_util::sync::CancellationToken;

use super::slots::SlotFacts;
use super::InFlight;
use crate::intake::Signal;
use crate::store::{
    Action, AutopilotStore, ErrorMeta, Meta, PendingAction, Span, SpanStatus, StepKind, StepRun,
};

/// What every step run may use.
#[derive(Clone)]
pub struct StepContext {
    pub store: AutopilotStore,
    /// Cancelled when the daemon shuts down (after the grace period) or a budget stops work.
    pub cancel: CancellationToken,
    /// The orchestrator's runs in progress (see [`StepContext::in_process`]).
    pub(super) in_flight: Arc<Mutex<InFlight>>,
    /// The console's feed (see [`StepContext::notice`]).
    pub(super) progress: Option<tokio::sync::broadcast::Sender<super::Progress>>,
    /// The orchestrator's wake: a drain soon (see [`StepContext::waker`]).
    pub(super) wake: Arc<tokio::sync::Notify>,
}

impl StepContext {
    /// A context for one run outside an orchestrator (a replay): nothing else in flight, no
    /// console, never cancelled.
    pub fn standalone(store: AutopilotStore) -> StepContext {
        StepContext {
            store,
            cancel: CancellationToken::new(),
            in_flight: Arc::default(),
            progress: None,
            wake: Arc::default(),
        }
    }

    /// Something that asks the orchestrator for a drain soon, from anywhere and at any later
    /// time: a step that leaves work running (a detached agent run) calls it when that work
    /// ends, so it is collected at once rather than at the next fallback tick.
    pub fn waker(&self) -> Arc<dyn Fn() + Send + Sync> {
        let wake = self.wake.clone();
        Arc::new(move || wake.notify_one())
    }

    /// Tells a person watching the console something about a step still running (a long
    /// build's progress).
    pub fn notice(&self, text: impl Into<String>) {
        if let Some(progress) = &self.progress {
            let _ = progress.send(super::Progress::Notice(text.into()));
        }
    }

    /// Whether a run of `action_id` is in progress in this process: claimed and its `process`
    /// not yet returned. A step's `monitor` leaves such a run alone (its detached work, if any,
    /// is not handed over yet).
    pub fn in_process(&self, action_id: uuid::Uuid) -> bool {
        self.flight().contains(action_id)
    }

    pub(super) fn flight(&self) -> MutexGuard<'_, InFlight> {
        self.in_flight
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// Whether a queued action can run now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Readiness {
    Ready,
    /// Not yet: keep the action queued, no span; the reason is shown by `status` and `trace`.
    Wait(String),
}

/// An action a step produces.
#[derive(Debug, Clone)]
pub struct NextAction {
    pub kind: StepKind,
    pub reason: String,
    pub meta: Meta,
    /// A preset id, when other actions of the same step refer to this one (a plan's
    /// `dependsOn`); otherwise the orchestrator picks one.
    pub id: Option<uuid::Uuid>,
}

impl NextAction {
    pub fn new(kind: StepKind, reason: impl Into<String>) -> NextAction {
        NextAction {
            kind,
            reason: reason.into(),
            meta: Meta::new(),
            id: None,
        }
    }

    #[must_use]
    pub fn with_id(mut self, id: uuid::Uuid) -> NextAction {
        self.id = Some(id);
        self
    }

    /// The typed meta of the action, serialized (shared by producer and consumer).
    #[must_use]
    pub fn with_meta<T: serde::Serialize>(mut self, meta: &T) -> NextAction {
        self.meta = crate::store::to_meta(meta);
        self
    }
}

/// How a finished run ends.
#[derive(Debug, Clone)]
pub struct Finished {
    pub status: SpanStatus,
    pub summary: String,
    pub meta: Meta,
    pub actions: Vec<NextAction>,
}

impl Finished {
    pub fn completed(summary: impl Into<String>) -> Finished {
        Finished {
            status: SpanStatus::Completed,
            summary: summary.into(),
            meta: Meta::new(),
            actions: Vec::new(),
        }
    }

    pub fn failed(summary: impl Into<String>) -> Finished {
        Finished {
            status: SpanStatus::Failed,
            summary: summary.into(),
            meta: Meta::new(),
            actions: Vec::new(),
        }
    }

    #[must_use]
    pub fn then(mut self, action: NextAction) -> Finished {
        self.actions.push(action);
        self
    }

    /// A typed span meta record, its serialized fields merged over the meta so far (the
    /// writer and the readers share the record's type and so its keys).
    /// The error as the span's `meta.error` ([`ErrorMeta`]), for a step that ends its own run
    /// on an error it can hand over.
    #[must_use]
    pub fn with_error(mut self, error: &StepError) -> Finished {
        error.to_meta().put_into(&mut self.meta);
        self
    }

    /// A record that does not serialize to an object (a path that is not UTF-8) is left out
    /// and logged, with its type ([`crate::store::to_meta`]).
    #[must_use]
    pub fn with_meta_record<T: serde::Serialize>(mut self, record: &T) -> Finished {
        self.meta.extend(crate::store::to_meta(record));
        self
    }
}

/// What `process` returns.
#[derive(Debug, Clone)]
pub enum Outcome {
    Finished(Finished),
    /// The work goes on outside this process (a sandboxed agent). The span stays `running` and
    /// the action stays claimed; the step's `monitor` finishes it later, also after a restart.
    Detached {
        meta: Meta,
    },
}

/// A detached run that `monitor` found ended. The orchestrator collects it in a run of its own
/// (a `collect` span under the run's span, see [`Step::collect`]), never inside the drain.
#[derive(Debug, Clone)]
pub struct Completion {
    pub action_id: uuid::Uuid,
    /// How it ended, as `monitor` saw it ("the container exited with code 0"): the summary of
    /// the collection while it runs.
    pub seen: String,
    /// The step's record of that end, handed to [`Step::collect`]; also the `collect` span's
    /// meta from its start.
    pub meta: Meta,
}

impl Completion {
    pub fn new(action_id: uuid::Uuid, seen: impl Into<String>) -> Completion {
        Completion {
            action_id,
            seen: seen.into(),
            meta: Meta::new(),
        }
    }

    /// The step's typed record of the end, serialized.
    #[must_use]
    pub fn with_meta_record<T: serde::Serialize>(mut self, record: &T) -> Completion {
        self.meta.extend(crate::store::to_meta(record));
        self
    }
}

/// What collecting a detached run gave: how the collection itself went (its own span) and how
/// the run ends (its span and next actions, handed over as any run's).
#[derive(Debug, Clone)]
pub struct Collected {
    /// The `collect` span's end: `completed` when the run's result was read (whatever the run's
    /// own outcome), `failed` when a check inside the collection failed (a required gate),
    /// `error` when the result could not be read (the container gone, its logs unreadable).
    /// Its actions are ignored: the run's end carries them.
    pub collection: Finished,
    /// The detached run's end.
    pub run: Finished,
}

impl Collected {
    /// A collection that read the run's end without trouble.
    pub fn of(run: Finished) -> Collected {
        Collected {
            collection: Finished::completed(format!("collected: {}", run.summary)),
            run,
        }
    }
}

/// Why a step could not finish its job: the message, whether trying again may help, and the
/// details a person or the resolver needs (for commands: `command`, `exitCode`, `stdout`,
/// `stderr`), recorded in the span's `meta.error`.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{message}")]
pub struct StepError {
    pub message: String,
    pub retryable: bool,
    pub details: Meta,
    /// For a retryable error: not to be retried before this (a rate limit's reset), even when
    /// the orchestrator's backoff would come sooner.
    pub retry_not_before: Option<chrono::DateTime<chrono::Utc>>,
    /// A sandbox changed the worktree's git metadata: nothing of the worktree is trusted, and
    /// the resolver ends the trace (recorded as `meta.error.tampered`).
    pub tampered: bool,
}

impl StepError {
    pub fn fatal(message: impl Into<String>) -> StepError {
        StepError {
            message: message.into(),
            retryable: false,
            details: Meta::new(),
            retry_not_before: None,
            tampered: false,
        }
    }

    pub fn retryable(message: impl Into<String>) -> StepError {
        StepError {
            message: message.into(),
            retryable: true,
            details: Meta::new(),
            retry_not_before: None,
            tampered: false,
        }
    }

    /// From any error, keeping its whole chain of causes in the message.
    pub fn from_error(e: &(dyn std::error::Error + 'static), retryable: bool) -> StepError {
        StepError {
            message: crate::error::error_chain(e),
            retryable,
            details: Meta::new(),
            retry_not_before: None,
            tampered: false,
        }
    }

    #[must_use]
    pub fn detail(mut self, key: &str, value: impl serde::Serialize) -> StepError {
        self.details.insert(
            key.to_owned(),
            serde_json::to_value(value).unwrap_or(Value::Null),
        );
        self
    }

    /// Not to be retried before `at` (GitHub said when a rate limit resets).
    #[must_use]
    pub fn not_before(mut self, at: Option<chrono::DateTime<chrono::Utc>>) -> StepError {
        self.retry_not_before = at;
        self
    }

    /// The record stored as `meta.error` (a detail named like one of its fields gives way).
    pub fn to_meta(&self) -> ErrorMeta {
        let mut details = self.details.clone();
        details.remove("message");
        details.remove("retryable");
        details.remove("tampered");
        ErrorMeta {
            message: self.message.clone(),
            retryable: self.retryable,
            tampered: self.tampered,
            details,
        }
    }
}

/// One of the ten steps (or a test step).
#[async_trait]
pub trait Step: Send + Sync + 'static {
    /// The action type this step consumes (and the `step` of its spans).
    fn kind(&self) -> StepKind;

    /// Whether every run keeps a replay record, even one that read nothing (a deciding step,
    /// which `rover autopilot replay` runs again).
    fn always_recorded(&self) -> bool {
        false
    }

    /// How many of its runs may be in progress at once.
    fn max_parallel(&self) -> usize;

    /// At most one run per trace at a time (resolve, push).
    fn exclusive_per_trace(&self) -> bool {
        false
    }

    /// Whether its detached runs (`Outcome::Detached`, still running outside the process, also
    /// across a restart) count against `max_parallel` until `monitor` collects them. Then the
    /// orchestrator starts a run only while in-process plus detached runs stay below
    /// `max_parallel`, and says why the others wait. Off by default.
    fn detached_holds_slot(&self) -> bool {
        false
    }

    /// Whether a run takes one of the daemon's agent slots (`autopilot.daemon.maxRuns`,
    /// shared by every repository it serves; see `slots`). A detached run keeps it until
    /// collected when [`Step::detached_holds_slot`] says so. Host-side steps take none.
    fn takes_agent_slot(&self) -> bool {
        false
    }

    /// What the scheduler scores `pending` by (asked only of steps that take a slot, for a
    /// ready action).
    async fn slot_facts(&self, _ctx: &StepContext, _pending: &PendingAction) -> SlotFacts {
        SlotFacts::default()
    }

    /// Whether `action`, queued for this step and scheduled for later (`notBefore`), waits on
    /// `signal` (a CI outcome intake took in): then it is made due now. Nothing waits on
    /// signals by default.
    fn woken_by(&self, _action: &Action, _signal: &Signal) -> bool {
        false
    }

    /// A cheap check before a run; `Wait` keeps the action queued without a span.
    async fn ready(
        &self,
        _ctx: &StepContext,
        _pending: &PendingAction,
    ) -> Result<Readiness, StepError> {
        Ok(Readiness::Ready)
    }

    /// Do the work for one action.
    async fn process(&self, ctx: &StepContext, run: &StepRun) -> Result<Outcome, StepError>;

    /// Look at detached work (run before every drain); return the runs that ended. Kept
    /// quick: the orchestrator collects each in a run of its own ([`Step::collect`]). A run in
    /// progress here (see [`StepContext::in_process`]), a collection included, is left alone.
    async fn monitor(&self, _ctx: &StepContext) -> Result<Vec<Completion>, StepError> {
        Ok(Vec::new())
    }

    /// Collect a detached run `monitor` found ended: read its result (logs, checks) into the
    /// run's end. Runs as its own task under a `collect` span; an error or a panic here fails
    /// that span and the run (fail forward), a retryable error is tried again by a later
    /// `monitor` within the attempts.
    async fn collect(
        &self,
        _ctx: &StepContext,
        _run: &StepRun,
        _ended: &Completion,
    ) -> Result<Collected, StepError> {
        Err(StepError::fatal(format!(
            "the {} step detached a run but cannot collect it",
            self.kind()
        )))
    }

    /// A budget stopped `trace_id`: stop its detached work (kill its containers); `monitor`
    /// then finds it ended and it is collected as usual. Returns how many runs were stopped.
    async fn stop_detached(&self, _ctx: &StepContext, _trace_id: uuid::Uuid) -> usize {
        0
    }

    /// After a restart: does this `running` span's work still go on outside the process?
    async fn still_running(
        &self,
        _ctx: &StepContext,
        _pending: &PendingAction,
        _span: &Span,
    ) -> bool {
        false
    }
}
