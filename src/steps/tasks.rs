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

/// One task mapping, typed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaskRecord {
    /// The workflow action id (the mapping's key).
    pub action_id: Uuid,
    pub task_id: String,
    pub branch: String,
    pub trace_id: Uuid,
    pub workflow_span_id: Uuid,
    /// The container name (names work wherever the engine takes an id).
    pub container: Option<String>,
    pub worktree: Option<PathBuf>,
    /// The commit the branch forked from (diff summaries are taken against it).
    pub fork_point: Option<String>,
    pub title: Option<String>,
}

impl TaskRecord {
    pub fn from_mapping(action_id: Uuid, mapping: &TaskMapping) -> TaskRecord {
        TaskRecord {
            action_id,
            task_id: mapping.task_id.clone(),
            branch: mapping.branch_name.clone(),
            trace_id: mapping.trace_id,
            workflow_span_id: mapping.workflow_span_id,
            container: mapping.container_id.clone(),
            worktree: mapping.worktree_path.clone(),
            fork_point: mapping.fork_point.clone(),
            title: mapping.title.clone(),
        }
    }

    pub fn to_mapping(&self) -> TaskMapping {
        TaskMapping {
            container_id: self.container.clone(),
            worktree_path: self.worktree.clone(),
            fork_point: self.fork_point.clone(),
            title: self.title.clone(),
            ..TaskMapping::new(
                &self.task_id,
                &self.branch,
                self.trace_id,
                self.workflow_span_id,
            )
        }
    }
}

/// The mapping of one workflow action, if any.
pub fn task_of(state: &State, action_id: Uuid) -> Option<TaskRecord> {
    state
        .task_mappings
        .get(&action_id.to_string())
        .map(|m| TaskRecord::from_mapping(action_id, m))
}

/// Every mapping whose key is a workflow action id.
pub fn all_tasks(state: &State) -> Vec<TaskRecord> {
    state
        .task_mappings
        .iter()
        .filter_map(|(key, m)| {
            key.parse::<Uuid>()
                .ok()
                .map(|id| TaskRecord::from_mapping(id, m))
        })
        .collect()
}

/// Reads the mapping of one workflow action.
pub async fn load_task(
    store: &AutopilotStore,
    action_id: Uuid,
) -> Result<Option<TaskRecord>, StoreError> {
    blocking(store.clone(), move |s| {
        Ok(task_of(&s.read_state()?, action_id))
    })
    .await
}

/// Writes (or replaces) a mapping in `state.json`.
pub async fn save_task(store: &AutopilotStore, task: &TaskRecord) -> Result<(), StoreError> {
    let task = task.clone();
    blocking(store.clone(), move |s| {
        s.transact(|txn| {
            txn.state_mut()?
                .task_mappings
                .insert(task.action_id.to_string(), task.to_mapping());
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
        .with_hook_mode(services.config.autopilot.sandbox.hooks);
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_task_round_trips_through_the_mapping_with_the_documented_keys() {
        let task = TaskRecord {
            action_id: Uuid::new_v4(),
            task_id: "t1".into(),
            branch: "rover/abc-x".into(),
            trace_id: Uuid::new_v4(),
            workflow_span_id: Uuid::new_v4(),
            container: Some("rover-abc".into()),
            worktree: Some(PathBuf::from("/data/worktrees/abc")),
            fork_point: Some("0123".into()),
            title: Some("X".into()),
        };
        let mapping = task.to_mapping();
        let json = serde_json::to_value(&mapping).expect("json");
        for key in [
            "taskId",
            "branchName",
            "traceId",
            "workflowSpanId",
            "containerId",
            "worktreePath",
        ] {
            assert!(json.get(key).is_some(), "{key} missing in {json}");
        }
        assert_eq!(TaskRecord::from_mapping(task.action_id, &mapping), task);
        let mut state = State::new(chrono::Utc::now());
        state
            .task_mappings
            .insert(task.action_id.to_string(), mapping);
        state
            .task_mappings
            .insert("not-a-uuid".into(), task.to_mapping());
        assert_eq!(task_of(&state, task.action_id), Some(task.clone()));
        assert_eq!(all_tasks(&state), vec![task]);
    }
}
