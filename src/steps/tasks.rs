//! Rover's task mappings (`state.json` `taskMappings`, keyed by the workflow action id) as the
//! workflow, commit and cleanup steps read and write them, plus the small shared helpers those
//! three steps need (the repository workspace, turning git errors into step errors).

use std::path::PathBuf;

use uuid::Uuid;

use super::Services;
use crate::git::{GitError, Workspace};
use crate::orchestrator::StepError;
use crate::store::blocking;
use crate::store::{AutopilotStore, State, StoreError, TaskMapping};

/// One task mapping with its key, the workflow action id. The mapping is kept whole, so keys
/// rover does not know (`TaskMapping::extra`) are written back unchanged.
#[derive(Debug, Clone, PartialEq)]
pub struct Task {
    /// The workflow action id (the mapping's key).
    pub action_id: Uuid,
    pub mapping: TaskMapping,
}

/// The mapping of one workflow action, if any.
pub fn task_of(state: &State, action_id: Uuid) -> Option<Task> {
    state
        .task_mappings
        .get(&action_id.to_string())
        .map(|m| Task {
            action_id,
            mapping: m.clone(),
        })
}

/// Every mapping whose key is a workflow action id.
pub fn all_tasks(state: &State) -> Vec<Task> {
    state
        .task_mappings
        .iter()
        .filter_map(|(key, m)| {
            key.parse::<Uuid>().ok().map(|action_id| Task {
                action_id,
                mapping: m.clone(),
            })
        })
        .collect()
}

/// Reads the mapping of one workflow action.
pub async fn load_task(
    store: &AutopilotStore,
    action_id: Uuid,
) -> Result<Option<Task>, StoreError> {
    blocking(store.clone(), move |s| {
        Ok(task_of(&s.read_state()?, action_id))
    })
    .await
}

/// Writes (or replaces) a mapping in `state.json`.
pub async fn save_task(store: &AutopilotStore, task: &Task) -> Result<(), StoreError> {
    let task = task.clone();
    blocking(store.clone(), move |s| {
        s.transact(|txn| {
            txn.state_mut()?
                .task_mappings
                .insert(task.action_id.to_string(), task.mapping);
            Ok(())
        })
    })
    .await
}

/// Removes a mapping; whether it was there.
pub async fn remove_task(store: &AutopilotStore, action_id: Uuid) -> Result<bool, StoreError> {
    blocking(store.clone(), move |s| {
        s.transact(|txn| {
            let key = action_id.to_string();
            if !txn.state()?.task_mappings.contains_key(&key) {
                return Ok(false);
            }
            Ok(txn.state_mut()?.task_mappings.remove(&key).is_some())
        })
    })
    .await
}

/// The user's repository as a workspace, its git children getting `Services::git_env`.
pub async fn workspace(services: &Services) -> Result<Workspace, GitError> {
    let mut ws = Workspace::open(&services.repo_root)
        .await?
        .with_hook_mode(services.config.autopilot.sandbox.hooks)
        .with_commit_limits(services.config.autopilot.sandbox.commit_limits);
    for (k, v) in &services.git_env {
        ws = ws.with_env(k, v);
    }
    Ok(ws)
}

/// A step error from a git error: the message with its causes, and for a failed command its
/// argv, exit code, stdout and stderr (bounded, truncation marked) as details.
pub fn git_error(context: &str, e: &GitError) -> StepError {
    let mut err = StepError::from_error(e, e.is_retryable());
    err.message = format!("{context}: {}", err.message);
    if let Some(f) = e.command_failure() {
        err = err
            .detail("command", &f.command)
            .detail("exitCode", f.exit_code)
            .detail("stdout", &f.stdout)
            .detail("stderr", &f.stderr)
            .detail("truncated", f.truncated);
    }
    if let GitError::CommitLimit {
        kind,
        path,
        size,
        limit,
    } = e
    {
        err = err
            .detail("commitLimit", kind)
            .detail("path", path)
            .detail("size", size)
            .detail("limit", limit);
    }
    err
}

/// A step error from a store error (reading or writing rover's own files).
pub fn store_error(context: &str, e: &StoreError) -> StepError {
    let mut err = StepError::from_error(e, true);
    err.message = format!("{context}: {}", err.message);
    err
}

/// The first characters of an id, for summaries.
pub fn short(id: Uuid) -> String {
    crate::trace::short(id)
}

/// The worktree directory a task mapping records, when it still exists.
pub fn mapping_worktree(mapping: &TaskMapping) -> Option<PathBuf> {
    mapping.worktree_path.clone().filter(|p| p.is_dir())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    fn task() -> Task {
        Task {
            action_id: Uuid::new_v4(),
            mapping: TaskMapping {
                container_id: Some("rover-abc".into()),
                worktree_path: Some(PathBuf::from("/data/worktrees/abc")),
                fork_point: Some("0123".into()),
                title: Some("X".into()),
                ..TaskMapping::new("t1", "rover/abc-x", Uuid::new_v4(), Uuid::new_v4())
            },
        }
    }

    #[test]
    fn tasks_are_read_by_their_workflow_action_id_and_other_keys_are_skipped() {
        let task = task();
        let mut state = State::new(chrono::Utc::now());
        state
            .task_mappings
            .insert(task.action_id.to_string(), task.mapping.clone());
        state
            .task_mappings
            .insert("not-a-uuid".into(), task.mapping.clone());
        assert_eq!(task_of(&state, task.action_id), Some(task.clone()));
        assert_eq!(task_of(&state, Uuid::new_v4()), None);
        assert_eq!(all_tasks(&state), vec![task]);
    }

    #[tokio::test]
    async fn a_saved_task_keeps_the_keys_rover_does_not_know() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = AutopilotStore::open(dir.path(), "tasks").expect("store");
        let mut task = task();
        task.mapping
            .extra
            .insert("otherTool".into(), serde_json::json!({"lease": 3}));
        save_task(&store, &task).await.expect("saves");
        let json = serde_json::to_value(store.read_state().expect("state")).expect("json");
        let stored = &json["taskMappings"][task.action_id.to_string()];
        for key in [
            "taskId",
            "branchName",
            "traceId",
            "workflowSpanId",
            "containerId",
            "worktreePath",
        ] {
            assert!(stored.get(key).is_some(), "{key} missing in {stored}");
        }
        assert_eq!(stored["otherTool"]["lease"], 3);
        let read = load_task(&store, task.action_id).await.expect("reads");
        assert_eq!(read, Some(task.clone()));
        assert!(remove_task(&store, task.action_id).await.expect("removes"));
        assert_eq!(
            load_task(&store, task.action_id).await.expect("reads"),
            None
        );
    }
}
