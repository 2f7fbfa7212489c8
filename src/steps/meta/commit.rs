//! `commit`: its action (the workflow whose work to record) and its span.

use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::store::records::present;
use crate::store::Meta;

use super::{MessageSource, OutcomeSpanMeta, TaskStatus};

/// `commit`: record the work of a workflow.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CommitMeta {
    /// The workflow action whose task mapping names the worktree and branch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workflow_action_id: Option<Uuid>,
    pub task_status: TaskStatus,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub summary: Option<String>,
}

impl CommitMeta {
    /// After the workflow step of `workflow_action_id` could not finish (its error is in its
    /// span).
    pub fn after_error(workflow_action_id: Uuid) -> CommitMeta {
        CommitMeta {
            workflow_action_id: Some(workflow_action_id),
            task_status: TaskStatus::Error,
            summary: None,
        }
    }
}

/// The `commit` span's meta, written once per outcome (its error, if any, is under `error`:
/// `ErrorMeta`; a tampered worktree also sets `tampered`: `OutcomeSpanMeta`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CommitSpanMeta {
    /// Whether the step made a commit (every finished commit span says).
    #[serde(default)]
    pub committed: bool,
    /// How a task that did not complete ended (nothing is committed then).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub task_status: Option<TaskStatus>,
    /// The workflow action committed for (`null` for a task that did not complete and whose
    /// commit names none).
    #[serde(
        default,
        deserialize_with = "present",
        skip_serializing_if = "Option::is_none"
    )]
    pub workflow_action_id: Option<Option<Uuid>>,
    /// The workflow agent's summary of a task that did not complete (`null`: it gave none).
    #[serde(
        default,
        deserialize_with = "present",
        skip_serializing_if = "Option::is_none"
    )]
    pub task_summary: Option<Option<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub branch_name: Option<String>,
    /// The worktree, as displayed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub worktree_path: Option<String>,
    /// What the task changed, staged.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub diff: Option<crate::git::DiffSummary>,
    /// Nested repositories left out of the commit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub skipped_nested_repositories: Option<Vec<String>>,
    /// The task changed nothing (`committed` is false).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub no_changes: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message_source: Option<MessageSource>,
    /// The commit message agent's call (or why the message fell back).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent: Option<crate::store::AgentMeta>,
    /// Where the commit hooks run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hooks: Option<crate::git::HookPlan>,
    /// The commit message (as the hooks left it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// The commit made.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sha: Option<String>,
    #[serde(flatten)]
    pub outcome: OutcomeSpanMeta,
}

impl CommitSpanMeta {
    /// The typed keys of a commit span's meta (other keys are ignored).
    pub fn read(meta: &Meta) -> Result<CommitSpanMeta, serde_json::Error> {
        crate::store::from_meta(meta)
    }
}
