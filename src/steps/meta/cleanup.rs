//! `cleanup`: its action (the tasks to tear down) and its span.

use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::store::Span;

/// `cleanup`: tear down the workspace of a rover task.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CleanupMeta {
    /// Workflow action ids whose task mappings to tear down.
    #[serde(default)]
    pub tasks: Vec<Uuid>,
    /// A branch to remove when no mapping names it any more.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub branch: Option<String>,
}

/// The `cleanup` span's meta: what happened to each task's resources, and what got in the way.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CleanupSpanMeta {
    #[serde(default)]
    pub tasks: Vec<crate::steps::cleanup::TaskCleanup>,
    #[serde(default)]
    pub notes: Vec<String>,
}

impl CleanupSpanMeta {
    /// What a cleanup span recorded (none, for a span whose meta has other shapes).
    pub fn of(span: &Span) -> Option<CleanupSpanMeta> {
        crate::store::from_meta(&span.meta).ok()
    }
}
