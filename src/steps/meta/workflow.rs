//! `workflow`: its action (one task for a coding agent) and how a task ended. The span's
//! record is `steps::workflow::WorkflowSpanMeta`.

use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::agents::{self, TaskSpec};

/// The kinds of workflow agent.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum WorkflowType {
    #[default]
    Swe,
    CodeReview,
    BugFinder,
    SecurityAnalyst,
}

/// `workflow`: one task for a coding agent in a sandbox.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WorkflowMeta {
    pub title: String,
    pub description: String,
    #[serde(default)]
    pub acceptance_criteria: Vec<String>,
    #[serde(default)]
    pub workflow_type: WorkflowType,
    /// Workflow action ids of the same plan this task builds on.
    #[serde(default)]
    pub depends_on: Vec<Uuid>,
    /// Iterate on an earlier workflow's task and branch (resolver `iterate`, PR feedback).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub iterate_on: Option<Uuid>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub branch: Option<String>,
    /// New instructions for an iteration.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instructions: Option<String>,
    /// A branch to merge into the task's worktree before the agent runs, conflicts left in the
    /// files for the agent to resolve (the resolver's answer to a consolidation conflict).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub merge_from: Option<String>,
    /// The commit this task reverts (rover's merge that left the base branch red): git reverts
    /// it in the task's worktree and no agent runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revert: Option<String>,
}

/// How a workflow ended, as the committer is told.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TaskStatus {
    Completed,
    Failed,
    Error,
}

/// The workflow meta of a planned (or coordinated) task.
pub fn workflow_meta(task: &TaskSpec, depends_on: Vec<Uuid>) -> WorkflowMeta {
    WorkflowMeta {
        title: task.title.trim().to_owned(),
        description: task.description.trim().to_owned(),
        acceptance_criteria: task.acceptance_criteria.clone(),
        workflow_type: match task.workflow_type {
            agents::WorkflowType::Swe => WorkflowType::Swe,
            agents::WorkflowType::CodeReview => WorkflowType::CodeReview,
            agents::WorkflowType::BugFinder => WorkflowType::BugFinder,
            agents::WorkflowType::SecurityAnalyst => WorkflowType::SecurityAnalyst,
        },
        depends_on,
        iterate_on: None,
        branch: None,
        instructions: None,
        merge_from: None,
        revert: None,
    }
}
