//! A person steering a trace, the same whoever asks: `rover autopilot cancel|fail|retry` on the
//! host and `/rover stop|retry` on the thread. Each writes a span in the trace saying who did
//! what, through the store lock; a running daemon, woken, stops the closed trace's running
//! agents and containers (the orchestrator's budget gate) or runs the retried action.

use chrono::Utc;
use uuid::Uuid;

use super::meta::{Intervention, InterventionSpanMeta, NotifyMeta, NotifyPurpose};
use crate::store::{
    Action, AutopilotStore, CloseCommand, ClosedTrace, PendingAction, Span, StepKind, StoreError,
    TraceView,
};

/// Why an intervention was not made.
#[derive(Debug, thiserror::Error)]
pub enum InterveneError {
    #[error(transparent)]
    Store(#[from] StoreError),
    /// Nothing to do, with what to look at.
    #[error("{0}")]
    Refused(String),
}

impl crate::error::Kinded for InterveneError {
    fn kind(&self) -> crate::error::ErrorKind {
        match self {
            InterveneError::Store(e) => crate::error::Kinded::kind(e),
            InterveneError::Refused(_) => crate::error::ErrorKind::Refused,
        }
    }
}

/// What closing a trace did.
#[derive(Debug, Clone)]
pub struct Closed {
    /// `cancelled by alice: reason`.
    pub what: String,
    /// Queued actions taken off the queue.
    pub removed: Vec<PendingAction>,
    /// Running actions the daemon stops: `workflow (1a2b3c4d)`.
    pub running: Vec<String>,
}

/// `cancel` and `fail`: close the trace, take its queued work off the queue, stop what runs,
/// and answer on its channel saying who did it (a `notify` the daemon runs).
pub fn close_trace(
    store: &AutopilotStore,
    trace_id: Uuid,
    command: CloseCommand,
    reason: &str,
    by: &str,
) -> Result<Closed, InterveneError> {
    let view = store.load_trace(trace_id)?;
    let short = crate::trace::short(trace_id);
    let state = store.read_state()?;
    if let Some(closed) = state.closed.get(&trace_id) {
        return Err(InterveneError::Refused(format!(
            "trace {short} was already {}",
            closed.describe()
        )));
    }
    if view.pending.is_empty() {
        return Err(InterveneError::Refused(format!(
            "trace {short} has ended (nothing queued or running): nothing to {command}; `rover autopilot trace {short}` shows how"
        )));
    }
    let closed = ClosedTrace {
        command,
        by: by.to_owned(),
        reason: reason.trim().to_owned(),
        at: Utc::now(),
    };
    let what = closed.describe();
    let running: Vec<String> = state
        .pending
        .iter()
        .filter(|p| p.trace_id == trace_id && p.running_span_id.is_some())
        .map(|p| format!("{} ({})", p.action, crate::trace::short(p.action_id)))
        .collect();
    let record = InterventionSpanMeta {
        by: closed.by.clone(),
        reason: Some(closed.reason.clone()),
        stopping: Some(running.clone()),
        ..InterventionSpanMeta::default()
    };
    let span = Span::intervention(trace_id, command.as_str(), what.clone(), &record);
    let fails = command == CloseCommand::Fail;
    let notify = NotifyMeta {
        purpose: if fails {
            NotifyPurpose::Failure
        } else {
            NotifyPurpose::Flag
        },
        message: Some(format!("This work was {what}.")),
        failed_step: None,
        error: fails.then(|| what.clone()),
        pr_url: None,
        breaker_note: None,
        note: None,
        // A person's decision, not a failure of rover's: the circuit breaker does not count it.
        circuit_breaker: true,
        also_on_pull: None,
    };
    let answer = Action::new(
        StepKind::Notify,
        &span,
        what.clone(),
        super::meta::to_meta(&notify),
        Utc::now(),
    );
    let removed = store.intervene(
        &span,
        std::slice::from_ref(&answer),
        |p| p.trace_id == trace_id && !super::kinds::ends_trace(&p.action),
        Some(closed),
    )?;
    Ok(Closed {
        what,
        removed,
        running,
    })
}

/// The action a `retry` means: the one named by `id` (an action id or an 8+ character prefix),
/// else the trace's latest failed action.
fn failed_action(
    store: &AutopilotStore,
    view: &TraceView,
    id: Option<&str>,
) -> Result<Action, InterveneError> {
    let short = crate::trace::short(view.trace_id());
    if let Some(action) = id.and_then(|id| super::history::action_named(view, id)) {
        return Ok(action.clone());
    }
    let failed = super::history::last_errored_run(view).ok_or_else(|| {
        InterveneError::Refused(format!(
            "trace {short} has no failed step to retry; `rover autopilot trace {short}` shows it"
        ))
    })?;
    Ok(store.read_action(failed.action_id.expect("an errored run of an action"))?)
}

/// What a retry queued.
#[derive(Debug, Clone)]
pub struct Retried {
    /// `workflow (1a2b3c4d) retried by alice`.
    pub summary: String,
    /// The new action's id.
    pub action: Uuid,
}

/// `retry`: queue the failed action again (a new action with a fresh attempt budget, from the
/// same producer), recorded by a `retry` span (with `reason`, when given: what asked).
pub fn retry_trace(
    store: &AutopilotStore,
    trace_id: Uuid,
    id: Option<&str>,
    by: &str,
    reason: Option<&str>,
) -> Result<Retried, InterveneError> {
    let view = store.load_trace(trace_id)?;
    let short = crate::trace::short(trace_id);
    if let Some(closed) = store.read_state()?.closed.get(&trace_id) {
        return Err(InterveneError::Refused(format!(
            "trace {short} was {}; it is not retried",
            closed.describe()
        )));
    }
    let original = failed_action(store, &view, id)?;
    if let Some(p) = view.pending.iter().find(|p| p.action_id == original.id) {
        return Err(InterveneError::Refused(format!(
            "action {} ({}) is still queued (attempt {}): nothing to retry yet",
            crate::trace::short(original.id),
            original.action,
            p.attempts
        )));
    }
    // Same producer and meta as the original, so the step sees the same input; a new id, so
    // a fresh attempt budget.
    let mut again = original.clone();
    again.id = Uuid::new_v4();
    again.timestamp = Utc::now();
    again.reason = format!("retried by {by}: {}", original.reason);
    let record = InterventionSpanMeta {
        by: by.to_owned(),
        reason: reason.map(str::to_owned),
        retried: Some(original.id),
        action: Some(again.id),
        ..InterventionSpanMeta::default()
    };
    let summary = format!(
        "{} ({}) retried by {by}",
        original.action,
        crate::trace::short(original.id)
    );
    let span = Span::intervention(
        trace_id,
        Intervention::Retry.as_str(),
        summary.clone(),
        &record,
    );
    store.intervene(&span, std::slice::from_ref(&again), |_| false, None)?;
    Ok(Retried {
        summary,
        action: again.id,
    })
}
