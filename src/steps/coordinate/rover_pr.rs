//! A pull request rover opened, found by its head branch among the task mappings.

use uuid::Uuid;

use crate::steps::agent_call::MappedTask;
use crate::steps::meta::{CleanupMeta, RoverPrMeta};

/// The task mappings of a pull request rover opened (its head branch is a task's branch).
#[derive(Debug, Clone)]
pub(super) struct RoverPr {
    pub(super) branch: String,
    /// Workflow action ids (the mapping keys) with their task ids.
    pub(super) tasks: Vec<(String, String)>,
    /// The same keys read as workflow action ids.
    pub(super) workflow_action_ids: Vec<Uuid>,
}

impl RoverPr {
    pub(super) fn find(branch: Option<&str>, mappings: &[MappedTask]) -> Option<RoverPr> {
        let branch = branch.filter(|b| !b.is_empty())?;
        let mut of_branch: Vec<&MappedTask> = mappings
            .iter()
            .filter(|t| t.mapping.branch_name == branch)
            .collect();
        // A consolidated pull request carries every task of the trace that opened it, each on
        // its own branch: the head's tasks first (an iteration reuses the first), then the rest.
        let traces: std::collections::BTreeSet<Uuid> =
            of_branch.iter().map(|t| t.mapping.trace_id).collect();
        of_branch.extend(
            mappings.iter().filter(|t| {
                t.mapping.branch_name != branch && traces.contains(&t.mapping.trace_id)
            }),
        );
        (!of_branch.is_empty()).then(|| RoverPr {
            branch: branch.to_owned(),
            tasks: of_branch
                .iter()
                .map(|t| (t.key.clone(), t.mapping.task_id.clone()))
                .collect(),
            workflow_action_ids: of_branch
                .iter()
                .filter_map(|t| t.workflow_action_id)
                .collect(),
        })
    }

    /// The workflow action whose task an iteration reuses: the first mapping.
    pub(super) fn existing_task(&self) -> Option<Uuid> {
        self.workflow_action_ids.first().copied()
    }

    /// As the coordinate span records it.
    pub(super) fn record(&self) -> RoverPrMeta {
        RoverPrMeta {
            branch: self.branch.clone(),
            tasks: self.tasks.clone(),
        }
    }

    pub(super) fn cleanup(&self) -> CleanupMeta {
        CleanupMeta {
            tasks: self.workflow_action_ids.clone(),
            branch: Some(self.branch.clone()),
        }
    }
}
