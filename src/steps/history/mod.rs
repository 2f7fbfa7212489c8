//! What the steps ask of a trace's past, answered in one place from its typed span metas:
//! where a task's dependencies stand, the image a workflow run used, whether its environment
//! failed. (Steps never ask another step: they ask the trace.)

mod deps;

pub use deps::{dependency_state, Dependency};

use crate::steps::meta::WorkflowSpanMeta;
use crate::store::Span;

/// The image a launched run used (its gates run in the same one); `None` for a span that does
/// not say.
pub fn image_of(span: &Span) -> Option<String> {
    let meta: WorkflowSpanMeta = crate::store::from_meta(&span.meta).ok()?;
    meta.environment
        .map(|e| e.image)
        .or_else(|| meta.launched.map(|l| l.image))
        .filter(|image| !image.is_empty())
}

/// Whether `span` is a workflow span whose environment build failed.
pub fn environment_failed(span: &Span) -> bool {
    span.step == crate::store::StepKind::Workflow
        && crate::store::from_meta::<WorkflowSpanMeta>(&span.meta)
            .ok()
            .and_then(|m| m.environment)
            .is_some_and(|e| e.error.is_some())
}
