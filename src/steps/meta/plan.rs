//! `plan`: its action (a directive) and its span (the tasks, or a question).

use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::store::Span;

use super::DecisionSpanMeta;

/// `plan`: decompose a directive into workflow tasks.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PlanMeta {
    pub directive: String,
    /// When iterating on a rover PR: the workflow action whose task and branch to reuse.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub existing_task: Option<Uuid>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub branch: Option<String>,
}

/// The `plan` span's meta: the agent's analysis and what it led to (`decision`: `clarify`,
/// `empty` or `tasks`), with the question or the planned tasks.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PlanSpanMeta {
    #[serde(flatten)]
    pub decided: DecisionSpanMeta,
    #[serde(default)]
    pub analysis: String,
    /// The question asked instead of planning (`decision: clarify`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub clarification: Option<String>,
    /// The tasks planned, each with its workflow action (`decision: tasks`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tasks: Option<Vec<PlannedTask>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent: Option<crate::store::AgentMeta>,
    /// The lessons of rover's memory the prompt was given.
    #[serde(flatten)]
    pub lessons: super::LessonsSpanMeta,
}

impl PlanSpanMeta {
    /// What a plan span recorded (nothing, for a span whose meta has other shapes).
    pub fn of(span: &Span) -> PlanSpanMeta {
        crate::store::from_meta(&span.meta).unwrap_or_default()
    }
}

/// One task of a plan as its span lists it: the planner's task id and the workflow action it
/// became.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PlannedTask {
    pub task_id: String,
    /// The preset id of the task's workflow action.
    pub action_id: Option<Uuid>,
    /// As the planner wrote it.
    pub title: String,
    pub workflow_type: crate::agents::WorkflowType,
    /// The planner's task ids this one depends on.
    #[serde(default)]
    pub depends_on: Vec<String>,
}
