//! A task that reverts a commit (rover's revert of its own merge that left the base branch
//! red): its branch and worktree as any fresh task's, the commit taken back by git in the
//! worktree, no agent and no container; the commit step commits it.

use super::fork::Deps;
use super::{WorkflowSpanMeta, WorkflowStep};
use crate::git::{self, short_sha};
use crate::orchestrator::{Finished, Outcome, StepContext, StepError};
use crate::steps::meta::{TaskStatus, WorkflowMeta};
use crate::steps::tasks::{self, git_error, store_error};
use crate::store::StepRun;

impl WorkflowStep {
    /// Reverts `sha` on the task's new branch: completed with the files it takes back, or
    /// failed (the task's mapping kept) when it conflicts with what the base branch holds now.
    pub(super) async fn revert(
        &self,
        ctx: &StepContext,
        run: &StepRun,
        meta: &WorkflowMeta,
        deps: &Deps,
        ws: &git::Workspace,
        sha: &str,
    ) -> Result<Outcome, StepError> {
        let forked = self.fork(ctx, run, meta, deps, ws).await?;
        let path = &forked.prepared.path;
        let files = match ws.revert_into(path, sha).await {
            Ok(files) => files,
            Err(e) => {
                let error = git_error("cannot revert the commit", &e).detail("sha", sha);
                return Self::not_started(ctx, &forked.task, path, error).await;
            }
        };
        tasks::save_task(&ctx.store, &forked.task)
            .await
            .map_err(|e| store_error("cannot record the task mapping", &e))?;
        let summary = format!(
            "reverted {} ({} file(s): {}); no agent ran",
            short_sha(sha),
            files.len(),
            files.join(", ")
        );
        Ok(Outcome::Finished(
            Finished::completed(summary.clone())
                .with_meta_record(&WorkflowSpanMeta {
                    task_id: Some(forked.task.mapping.task_id.clone()),
                    branch_name: Some(forked.task.mapping.branch_name.clone()),
                    worktree_path: Some(path.clone()),
                    reason: Some(format!("revert of {sha}")),
                    ..WorkflowSpanMeta::default()
                })
                .then(Self::commit_action(
                    forked.task.action_id,
                    TaskStatus::Completed,
                    &summary,
                )),
        ))
    }
}
