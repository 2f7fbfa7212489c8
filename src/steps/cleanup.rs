//! The `cleanup` step (deterministic, best effort, terminal): for each task of the action (by
//! workflow action id, or found by branch) remove the container, the worktree, the local branch
//! and the task mapping; record what was removed, what was already gone and what could not be
//! removed. It never fails the trace: the span is `completed`, with notes.

use std::sync::Arc;

use async_trait::async_trait;
use uuid::Uuid;

use super::meta::{self, CleanupMeta, CleanupSpanMeta, Piece, TaskCleanup};
use super::tasks::{self, Task};
use super::Services;
use crate::git::Workspace;
use crate::orchestrator::{Finished, Outcome, Step, StepContext, StepError};
use crate::sandbox::LABEL_ACTION;
use crate::store::blocking;
use crate::store::{AutopilotStore, StepKind, StepRun, TaskMapping};

pub struct CleanupStep {
    services: Arc<Services>,
}

impl CleanupStep {
    pub fn new(services: Arc<Services>) -> CleanupStep {
        CleanupStep { services }
    }

    async fn containers(&self, task: &Task) -> Piece {
        let Some(sandbox) = &self.services.sandbox else {
            return if task.mapping.container_id.is_some() {
                Piece::Failed(
                    "no Docker sandbox is configured; remove the container by hand".into(),
                )
            } else {
                Piece::NotApplicable
            };
        };
        let mut ids: Vec<String> = task.mapping.container_id.iter().cloned().collect();
        // Gate containers of the action (and the agent's, if named differently).
        match sandbox
            .list_by_labels(&[(LABEL_ACTION.to_owned(), task.action_id.to_string())])
            .await
        {
            Ok(found) => ids.extend(found.into_iter().map(|c| c.id)),
            Err(e) => return Piece::Failed(format!("cannot list containers: {e}")),
        }
        if ids.is_empty() {
            return Piece::NotApplicable;
        }
        let mut removed = false;
        for id in ids {
            match sandbox.remove(&id).await {
                Ok(true) => removed = true,
                Ok(false) => {}
                Err(e) => return Piece::Failed(format!("cannot remove container {id}: {e}")),
            }
        }
        if removed {
            Piece::Removed
        } else {
            Piece::AlreadyGone
        }
    }

    async fn one(
        &self,
        store: &AutopilotStore,
        ws: Option<&Workspace>,
        task: Option<Task>,
        workflow: Option<Uuid>,
        branch: Option<String>,
    ) -> TaskCleanup {
        let containers = match &task {
            Some(t) => self.containers(t).await,
            None => Piece::AlreadyGone,
        };
        let worktree = match (
            task.as_ref().and_then(|t| t.mapping.worktree_path.clone()),
            ws,
        ) {
            (Some(path), Some(ws)) => match ws.remove_worktree(&path).await {
                Ok(r) => r.into(),
                Err(e) => Piece::Failed(e.to_string()),
            },
            (Some(_), None) => Piece::Failed("the repository cannot be opened".into()),
            (None, _) => Piece::AlreadyGone,
        };
        let branch = task
            .as_ref()
            .map(|t| t.mapping.branch_name.clone())
            .or(branch);
        let branch_removal = match (&branch, ws) {
            (Some(name), Some(ws)) => match ws.delete_branch(name).await {
                Ok(r) => r.into(),
                Err(e) => Piece::Failed(e.to_string()),
            },
            (Some(_), None) => Piece::Failed("the repository cannot be opened".into()),
            (None, _) => Piece::NotApplicable,
        };
        let mapping = match workflow {
            Some(id) => match tasks::remove_task(store, id).await {
                Ok(true) => Piece::Removed,
                Ok(false) => Piece::AlreadyGone,
                Err(e) => Piece::Failed(e.to_string()),
            },
            None => Piece::NotApplicable,
        };
        TaskCleanup {
            workflow_action_id: workflow,
            branch,
            containers,
            worktree,
            branch_removal,
            mapping,
        }
    }
}

#[async_trait]
impl Step for CleanupStep {
    fn kind(&self) -> StepKind {
        StepKind::Cleanup
    }

    fn max_parallel(&self) -> usize {
        3
    }

    async fn process(&self, ctx: &StepContext, run: &StepRun) -> Result<Outcome, StepError> {
        let mut notes: Vec<String> = Vec::new();
        let meta: CleanupMeta = meta::read(&run.action).unwrap_or_else(|e| {
            notes.push(format!(
                "the cleanup meta is invalid ({e}); nothing named to clean"
            ));
            CleanupMeta::default()
        });
        let state = match blocking(ctx.store.clone(), AutopilotStore::read_state).await {
            Ok(s) => Some(s),
            Err(e) => {
                notes.push(format!("cannot read the task mappings: {e}"));
                None
            }
        };
        let mut targets: Vec<(Uuid, Option<Task>, bool)> = Vec::new();
        for id in &meta.tasks {
            match state.as_ref().and_then(|s| tasks::task_of(s, *id)) {
                Some(t) => targets.push((*id, Some(t), true)),
                None => targets.push((*id, from_spans(&ctx.store, *id).await, false)),
            }
        }
        if let (Some(branch), Some(state)) = (&meta.branch, &state) {
            for t in tasks::all_tasks(state) {
                if &t.mapping.branch_name == branch
                    && !targets.iter().any(|(id, _, _)| *id == t.action_id)
                {
                    targets.push((t.action_id, Some(t), true));
                }
            }
        }
        let ws = match tasks::workspace(&self.services).await {
            Ok(ws) => Some(ws),
            Err(e) => {
                notes.push(format!("cannot open the repository: {e}"));
                None
            }
        };
        let mut report = Vec::new();
        for (id, task, mapped) in targets {
            let branch = task.is_none().then(|| meta.branch.clone()).flatten();
            if task.is_some() && !mapped {
                notes.push(format!(
                    "workflow {id} has no task mapping any more; its resources were found through its span"
                ));
            }
            report.push(
                self.one(&ctx.store, ws.as_ref(), task, Some(id), branch)
                    .await,
            );
        }
        if report.is_empty() {
            if let Some(branch) = &meta.branch {
                report.push(
                    self.one(&ctx.store, ws.as_ref(), None, None, Some(branch.clone()))
                        .await,
                );
            }
        }
        if report.is_empty() {
            notes.push("no task and no branch named: nothing to clean up".into());
        }
        let failed = report
            .iter()
            .flat_map(|r| [&r.containers, &r.worktree, &r.branch_removal, &r.mapping])
            .filter(|p| matches!(p, Piece::Failed(_)))
            .count();
        let removed = report
            .iter()
            .flat_map(|r| [&r.containers, &r.worktree, &r.branch_removal, &r.mapping])
            .filter(|p| matches!(p, Piece::Removed))
            .count();
        let summary = if failed == 0 {
            format!(
                "cleaned up {} task(s): {removed} resource(s) removed, the rest already gone",
                report.len()
            )
        } else {
            format!(
                "cleaned up {} task(s) partly: {removed} resource(s) removed, {failed} could not be removed (see meta)",
                report.len()
            )
        };
        Ok(Outcome::Finished(
            Finished::completed(summary).with_meta_record(&CleanupSpanMeta {
                tasks: report,
                notes,
            }),
        ))
    }
}

/// What the last finished span of workflow `action_id` recorded (branch, worktree, container),
/// for a task whose mapping is already gone.
async fn from_spans(store: &AutopilotStore, action_id: Uuid) -> Option<Task> {
    blocking(store.clone(), move |s| {
        let action = s.read_action(action_id)?;
        let Some(trace_id) = action.trace_id else {
            return Ok(None);
        };
        let view = s.load_trace(trace_id)?;
        Ok(
            super::history::recorded_task(&view, action_id).and_then(|(sp, meta)| {
                let branch = meta.branch_name.clone()?;
                let task_id = meta
                    .task_id
                    .clone()
                    .unwrap_or_else(|| action_id.to_string());
                Some(Task {
                    action_id,
                    mapping: TaskMapping {
                        container_id: meta.container_name().map(str::to_owned),
                        worktree_path: meta.worktree_path,
                        ..TaskMapping::new(&task_id, &branch, trace_id, sp.id)
                    },
                })
            }),
        )
    })
    .await
    .ok()
    .flatten()
}
