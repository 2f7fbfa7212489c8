//! Live progress of the orchestrator, for the console (`rover autopilot start`) and tests.

use uuid::Uuid;

use crate::store::{SpanStatus, StepKind};

#[derive(Debug, Clone)]
pub enum Progress {
    Started {
        trace_id: Uuid,
        step: StepKind,
        span_id: Uuid,
    },
    Finished {
        trace_id: Uuid,
        step: StepKind,
        span_id: Uuid,
        status: SpanStatus,
        summary: String,
    },
    /// Something a person watching should know (recovery, dead letters, failures).
    Notice(String),
}
