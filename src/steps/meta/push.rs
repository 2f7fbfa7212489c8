//! `push`: its action (the branches) and its span (the pull request, or a conflict).

use serde::{Deserialize, Serialize};

use crate::store::Span;

/// `push`: push the trace's branches and open or update the PR.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PushMeta {
    #[serde(default)]
    pub branches: Vec<String>,
}

/// How a push ended (`meta.status` of its span).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PushStatus {
    Pushed,
    /// The task branches could not be consolidated: the resolver decides.
    Conflict,
}

/// A consolidation conflict as the push span records it and the resolver reads it back.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PushConflict {
    pub source_branch: String,
    pub target: String,
    #[serde(default)]
    pub files: Vec<String>,
}

/// The `push` span's meta (its error, if any, is under `error`: `ErrorMeta`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PushSpanMeta {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<PushStatus>,
    /// The branch pushed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub branch: Option<String>,
    /// The task branches of the trace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub branches: Option<Vec<String>>,
    /// The task branches merged into the pushed one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub merged: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rebased: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub worktree: Option<std::path::PathBuf>,
    /// Where the `pre-push` hook ran (the same record as the commit span's `hooks`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hooks: Option<crate::git::HookPlan>,
    #[serde(flatten)]
    pub pull_request: crate::store::PushPullRequest,
    /// Why no pull request was opened (`none: local event`, ...).
    #[serde(
        default,
        rename = "pullRequest",
        skip_serializing_if = "Option::is_none"
    )]
    pub pull_request_note: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub conflict: Option<PushConflict>,
}

/// The part of a span's meta the resolver reads to find a consolidation conflict.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
pub struct ConflictSpanMeta {
    #[serde(default)]
    pub conflict: Option<PushConflict>,
}

impl ConflictSpanMeta {
    /// The conflict a span recorded (none, for a span whose meta has another shape there).
    pub fn of(span: &Span) -> Option<PushConflict> {
        crate::store::from_meta::<ConflictSpanMeta>(&span.meta)
            .ok()
            .and_then(|m| m.conflict)
    }
}
