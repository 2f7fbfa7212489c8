//! Taking a shipped agent run's workspace back: the tar of its `/workspace`, checked entry by
//! entry and applied to the task's worktree (see [`crate::sandbox::returned`]); a refused one
//! fails the run with the entry named, and nothing of it reaches the worktree.

use super::WorkflowStep;
use crate::orchestrator::{StepContext, StepError};
use crate::sandbox::returned::{take_back, Applied};
use crate::sandbox::{BindMount, ContainerStatus, Sandbox, WORKSPACE_MOUNT};
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
        let mut spec = self.base_spec(
            Vec::new(),
            worktree,
            self.labels(task.mapping.trace_id, task.action_id),
        );
        if !spec.shipped() || !matches!(status, ContainerStatus::Exited { .. }) {
            return (None, None);
        }
        // The git file the run was shipped with (see `launch`) is the one `.git` that may come
        // back.
        spec.extra_mounts.push(BindMount {
            host: ctx
                .store
                .artifacts_dir(task.mapping.workflow_span_id)
                .join("git")
                .join("gitfile"),
            target: format!("{WORKSPACE_MOUNT}/.git"),
            read_only: true,
        });
        match take_back(sandbox, container, &spec).await {
            Ok(applied) => {
                if let Some(a) = &applied {
                    tracing::info!(container = %container, entries = a.entries, bytes = a.bytes, archive_bytes = a.archive_bytes, "took the shipped workspace back");
                }
                (applied, None)
            }
            Err(e) => {
                tracing::warn!(container = %container, error = %e, "the workspace the sandbox returned was refused");
                let error = StepError::from_error(&e, e.is_retryable())
                    .detail("container", container)
                    .detail("worktree", worktree.display().to_string());
                (None, Some(error))
            }
        }
    }
}
