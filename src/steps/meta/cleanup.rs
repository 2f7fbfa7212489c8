//! `cleanup`: its action (the tasks to tear down) and its span.

use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::git::Removal;
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
    pub tasks: Vec<TaskCleanup>,
    #[serde(default)]
    pub notes: Vec<String>,
}

impl CleanupSpanMeta {
    /// What a cleanup span recorded (none, for a span whose meta has other shapes).
    pub fn of(span: &Span) -> Option<CleanupSpanMeta> {
        crate::store::from_meta(&span.meta).ok()
    }
}

/// What happened to one resource.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", tag = "result", content = "detail")]
pub enum Piece {
    Removed,
    AlreadyGone,
    /// Nothing to do (e.g. no container was ever recorded).
    NotApplicable,
    /// Could not be removed: why.
    Failed(String),
}

impl From<Removal> for Piece {
    fn from(r: Removal) -> Piece {
        match r {
            Removal::Removed => Piece::Removed,
            Removal::Absent => Piece::AlreadyGone,
        }
    }
}

/// The cleanup of one task (`meta.tasks` of the span: [`CleanupSpanMeta`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TaskCleanup {
    pub workflow_action_id: Option<Uuid>,
    pub branch: Option<String>,
    pub containers: Piece,
    pub worktree: Piece,
    pub branch_removal: Piece,
    pub mapping: Piece,
}
