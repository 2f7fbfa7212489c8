//! What the scheduler needs to know of the pipeline's shape, supplied by the steps
//! (`steps::pipeline::RoverPipeline`): where a run that could not finish hands over, and the
//! answers a stopped trace gets. The orchestrator builds no step's meta itself.

use uuid::Uuid;

use super::step::{NextAction, StepError};
use crate::store::{Action, AutopilotStore, Meta, StepKind};

/// The pipeline's policy; see the module documentation.
pub trait Pipeline: Send + Sync + 'static {
    /// Where a run of `step` (consuming `action_id`) that ended in `error` hands over, so that no
    /// trace ends silently. Terminal steps return nothing: their error span ends the trace.
    fn fail_forward(&self, step: &StepKind, action_id: Uuid, error: &StepError) -> Vec<NextAction>;

    /// The one answer of a trace a budget stopped, saying why (`reason`).
    fn budget_stopped(&self, reason: &str) -> Option<NextAction>;

    /// Whether `action` is such an answer (a trace answered before a restart is not answered
    /// twice).
    fn is_budget_answer(&self, action: &Action) -> bool;

    /// The announcement that the circuit breaker tripped (`text` says why), made when no
    /// failure answer carried it.
    fn breaker_tripped(&self, text: &str) -> Option<NextAction>;

    /// Whether `action` is a failure answer: the one that may trip the circuit breaker, so it
    /// carries the breaker's note.
    fn is_failure_answer(&self, action: &Action) -> bool;

    /// Put the breaker's note into a failure answer's meta (this run's copy).
    fn add_breaker_note(&self, meta: &mut Meta, note: String);

    /// Whether a failure answer's meta carries the breaker's note (then no second announcement).
    fn has_breaker_note(&self, meta: &Meta) -> bool;

    /// Whether a span of `step` ends its trace: the step hands over to no further step, its
    /// runs go on in a trace a person or a budget closed, and a budget always admits them.
    fn ends_trace(&self, step: &StepKind) -> bool;

    /// Whether a span of `step` that ends its trace is the trace's verdict for the circuit
    /// breaker (an answer or a decision not to act; housekeeping is not).
    fn gives_verdict(&self, step: &StepKind) -> bool;

    /// A span that ends trace `trace_id` was recorded (the trace may still run when other work
    /// of it is queued): the pipeline's chance to learn from it. Blocking; errors are its own.
    fn trace_ended(&self, _store: &AutopilotStore, _trace_id: Uuid) {}
}

/// No pipeline: nothing fails forward, stopped traces get no answer and no step ends a trace
/// (each trace ends when nothing is left to run). For schedulers of test steps; rover's daemon
/// uses the steps' pipeline.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoPipeline;

impl Pipeline for NoPipeline {
    fn fail_forward(&self, _: &StepKind, _: Uuid, _: &StepError) -> Vec<NextAction> {
        Vec::new()
    }
    fn budget_stopped(&self, _: &str) -> Option<NextAction> {
        None
    }
    fn is_budget_answer(&self, _: &Action) -> bool {
        false
    }
    fn breaker_tripped(&self, _: &str) -> Option<NextAction> {
        None
    }
    fn is_failure_answer(&self, _: &Action) -> bool {
        false
    }
    fn add_breaker_note(&self, _: &mut Meta, _: String) {}
    fn has_breaker_note(&self, _: &Meta) -> bool {
        false
    }
    fn ends_trace(&self, _: &StepKind) -> bool {
        false
    }
    fn gives_verdict(&self, _: &StepKind) -> bool {
        false
    }
}
