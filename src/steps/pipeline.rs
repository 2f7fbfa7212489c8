//! rover's pipeline as the scheduler sees it ([`crate::orchestrator::Pipeline`]): where a step
//! that could not finish hands over, and the notifies that answer a stopped trace. The shape of
//! the pipeline lives here, with the steps and their metas, not in the orchestrator.

use uuid::Uuid;

use super::meta::{self, CommitMeta, NotifyMeta, NotifyPurpose};
use crate::orchestrator::{NextAction, Pipeline, StepError};
use crate::store::{Action, Meta, StepKind};

/// See the module documentation.
#[derive(Debug, Clone, Default)]
pub struct RoverPipeline {
    /// `autopilot.memory`: whether an ended trace is learned from, and the book's bounds.
    pub memory: crate::memory::MemorySettings,
}

impl Pipeline for RoverPipeline {
    /// A workflow still goes to commit → resolve, a commit to resolve, a deciding step to a
    /// notify that says why. Terminal steps end the trace with their error span.
    fn fail_forward(&self, step: &StepKind, action_id: Uuid, error: &StepError) -> Vec<NextAction> {
        match step {
            StepKind::Workflow => vec![NextAction::new(
                StepKind::Commit,
                "the workflow could not finish; the committer records that and hands over to the resolver",
            )
            .with_meta(&CommitMeta::after_error(action_id))],
            StepKind::Commit => vec![NextAction::new(
                StepKind::Resolve,
                "the commit step could not finish; the resolver decides what to do",
            )],
            // The resolver sees the review that gave no verdict; a push it decides then goes
            // without another review (`history::review_failed_since_last_commit`).
            StepKind::Review => vec![NextAction::new(
                StepKind::Resolve,
                "the self-review could not finish; the resolver decides what to do",
            )],
            StepKind::Coordinate
            | StepKind::Plan
            | StepKind::Resolve
            | StepKind::Push
            | StepKind::Merge
            | StepKind::Release
            | StepKind::Event => vec![NextAction::new(
                StepKind::Notify,
                format!("the {step} step failed: {}", error.message),
            )
            .with_meta(&NotifyMeta::failure(step, &error.message))],
            StepKind::Notify | StepKind::Noop | StepKind::Cleanup | StepKind::Other(_) => {
                Vec::new()
            }
        }
    }

    fn budget_stopped(&self, reason: &str) -> Option<NextAction> {
        let meta = NotifyMeta {
            purpose: NotifyPurpose::Budget,
            message: Some(format!(
                "rover stopped this work because a budget limit was reached: {reason}"
            )),
            error: Some(reason.to_owned()),
            ..NotifyMeta::default()
        };
        Some(
            NextAction::new(
                StepKind::Notify,
                format!("a budget stopped the trace: {reason}"),
            )
            .with_meta(&meta),
        )
    }

    fn is_budget_answer(&self, action: &Action) -> bool {
        action.action == StepKind::Notify
            && NotifyMeta::purpose_of(&action.meta) == Some(NotifyPurpose::Budget)
    }

    fn breaker_tripped(&self, text: &str) -> Option<NextAction> {
        let meta = NotifyMeta {
            purpose: NotifyPurpose::Flag,
            message: Some(format!("rover paused itself: {text}.")),
            circuit_breaker: true,
            ..NotifyMeta::default()
        };
        Some(NextAction::new(StepKind::Notify, text).with_meta(&meta))
    }

    fn is_failure_answer(&self, action: &Action) -> bool {
        action.action == StepKind::Notify
            && NotifyMeta::purpose_of(&action.meta) == Some(NotifyPurpose::Failure)
    }

    /// Written through [`NotifyMeta`]; keys it does not know stay as they were. A meta that
    /// does not read as a notify's gets no note (its notify cannot post one either).
    fn add_breaker_note(&self, meta: &mut Meta, note: String) {
        if let Some(mut notify) = notify_meta(meta) {
            notify.breaker_note = Some(note);
            meta.extend(meta::to_meta(&notify));
        }
    }

    fn has_breaker_note(&self, meta: &Meta) -> bool {
        notify_meta(meta).is_some_and(|n| n.breaker_note.is_some())
    }

    fn ends_trace(&self, step: &StepKind) -> bool {
        super::kinds::ends_trace(step)
    }

    fn gives_verdict(&self, step: &StepKind) -> bool {
        super::kinds::gives_verdict(step)
    }

    /// Learn from the trace (`steps::learn`); a failure is logged, the trace is not touched.
    fn trace_ended(&self, store: &crate::store::AutopilotStore, trace_id: Uuid) {
        match super::learn::learn_from_trace(store, &self.memory, trace_id) {
            Ok(done) if !done.learned.is_empty() || !done.contradicted.is_empty() => {
                tracing::info!(trace = %trace_id, learned = ?done.learned, contradicted = ?done.contradicted, "memory: learned from an ended trace");
            }
            Ok(_) => {}
            Err(e) => tracing::warn!(
                trace = %trace_id,
                error = %crate::error::error_chain(&e),
                "memory: cannot learn from an ended trace"
            ),
        }
    }
}

/// A notify action's meta, typed (none when it does not read as one).
fn notify_meta(meta: &Meta) -> Option<NotifyMeta> {
    crate::store::from_meta(meta).ok()
}

/// The policy as the orchestrator takes it (learning nothing: a replay's).
pub fn pipeline() -> std::sync::Arc<dyn Pipeline> {
    std::sync::Arc::new(RoverPipeline {
        memory: crate::memory::MemorySettings {
            enabled: false,
            ..crate::memory::MemorySettings::default()
        },
    })
}

/// The daemon's policy: an ended trace is learned from as `memory` says.
pub fn pipeline_with(memory: crate::memory::MemorySettings) -> std::sync::Arc<dyn Pipeline> {
    std::sync::Arc::new(RoverPipeline { memory })
}
