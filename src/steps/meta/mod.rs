//! Typed meta of every action type and every step's span, shared by the step that writes it
//! and the steps (and tools) that read it back, so they can never disagree on key names.
//! Serialized camelCase; unknown keys are ignored on read so older records still load. One file
//! per step (its action's meta and its span's), plus the parts several steps share; the
//! workflow span's record is `steps::workflow::WorkflowSpanMeta`.

mod cleanup;
mod collect_span;
mod commit;
mod coordinate;
mod decision;
mod intervention;
mod lessons;
mod merge;
mod noop;
mod notify;
mod plan;
mod push;
mod release;
mod resolve;
mod review;
mod shared;
mod workflow;
mod workflow_span;

#[cfg(test)]
mod tests;

/// The root `event` span's meta is the intake's (it writes the root span).
pub use crate::intake::{EventMeta, EventSource};
pub use cleanup::*;
pub use collect_span::*;
pub use commit::*;
pub use coordinate::*;
pub use decision::Decision;
pub use intervention::{Intervention, InterventionSpanMeta};
pub use lessons::{GatesSpanMeta, LessonsSpanMeta};
pub use merge::*;
pub use noop::*;
pub use notify::*;
pub use plan::*;
pub use push::*;
pub use release::*;
pub use resolve::*;
pub use review::*;
pub use shared::*;
pub use workflow::*;
pub use workflow_span::*;

use serde::Deserialize;

use crate::store::Action;

pub use crate::store::to_meta;

/// Read an action's meta as the typed record of its type.
pub fn read<T: for<'de> Deserialize<'de>>(action: &Action) -> Result<T, serde_json::Error> {
    crate::store::from_meta(&action.meta)
}
