//! Taking a shipped agent run's workspace back through the agent run service
//! ([`crate::agent_run::take_back`]): the run as the step defined it, and the git file it was
//! shipped with; a refused archive fails the run with the entry named.

use super::WorkflowStep;
use crate::agent_run::{AgentRunError, Applied};
use crate::orchestrator::{StepContext, StepError};
use crate::sandbox::{ContainerStatus, Sandbox};
use crate::steps::tasks::Task;

impl WorkflowStep {
    /// Takes back the workspace of the run's exited container when it was shipped: what was
    /// applied, or the error of a refused (or unreadable) one.
    pub(super) async fn take_back(
        &self,
        ctx: &StepContext,
        sandbox: &dyn Sandbox,
        task: &Task,
        status: ContainerStatus,
    ) -> (Option<Applied>, Option<StepError>) {
        let (Some(worktree), Some(container)) =
            (&task.mapping.worktree_path, &task.mapping.container_id)
        else {
            return (None, None);
        };
        let spec = self.base_spec(
            Vec::new(),
            worktree,
            self.labels(task.mapping.trace_id, task.action_id),
        );
        // The git file the run was shipped with (see `launch`).
        let gitfile = ctx
            .store
            .artifacts_dir(task.mapping.workflow_span_id)
            .join("git")
            .join("gitfile");
        match crate::agent_run::take_back(sandbox, container, spec, gitfile, status).await {
            Ok(applied) => (applied, None),
            Err(e) => {
                tracing::warn!(container = %container, error = %e, "the workspace the sandbox returned was refused");
                let retryable = e.is_retryable();
                // The sandbox's own words name the refused entry.
                let source: &dyn std::error::Error = match &e {
                    AgentRunError::Returned { source, .. } => source,
                    other => other,
                };
                let error = StepError::from_error(source, retryable)
                    .detail("container", container)
                    .detail("worktree", worktree.display().to_string());
                (None, Some(error))
            }
        }
    }
}
