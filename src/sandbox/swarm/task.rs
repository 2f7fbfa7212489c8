//! A service's task as the workflow step sees a container: running, exited with a code, or
//! lost with its node. Pure: the engine's records in, a status out.

use bollard::models::{NodeState, Task, TaskState};
use serde::Serialize;

use crate::sandbox::ContainerStatus;

/// Where one of rover's services runs, for `status`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Placement {
    /// The service's name (`rover-<action>`).
    pub service: String,
    /// The node's hostname, or its id when the manager does not know it; `None` while pending.
    pub node: Option<String>,
    /// The node's state as the manager sees it (`ready`, `down`, ...).
    pub node_state: Option<String>,
    /// The task's state (`pending`, `running`, `complete`, `failed`, ...).
    pub task_state: String,
    /// Why the task is where it is, in the engine's words (`no suitable node (…)`).
    pub message: Option<String>,
}

/// The latest task of a service (a job has one; a second only if the first was replaced).
pub fn latest(tasks: &[Task]) -> Option<&Task> {
    tasks.iter().max_by_key(|t| {
        (
            t.version.as_ref().and_then(|v| v.index).unwrap_or(0),
            t.created_at.clone(),
        )
    })
}

/// The state of a task whose node is in `node` (`None`: not placed yet, or unknown); `stopped`:
/// rover stopped it (see [`super::LABEL_STOPPED`]).
pub fn task_status(task: Option<&Task>, node: Option<NodeState>, stopped: bool) -> ContainerStatus {
    let Some(task) = task else {
        // Created, no task yet: the manager is about to make one (none ever, once stopped).
        return if stopped {
            ContainerStatus::Exited {
                code: 137,
                oom_killed: false,
            }
        } else {
            ContainerStatus::Running
        };
    };
    let status = task.status.clone().unwrap_or_default();
    let node_gone = matches!(
        node,
        Some(NodeState::DOWN | NodeState::DISCONNECTED | NodeState::UNKNOWN)
    );
    let code = status.container_status.as_ref().and_then(|c| c.exit_code);
    match status.state {
        Some(TaskState::COMPLETE) => ContainerStatus::Exited {
            code: code.unwrap_or(0),
            oom_killed: false,
        },
        // Stopped by rover (scaled to 0): a kill, whatever the code says.
        Some(TaskState::SHUTDOWN | TaskState::REMOVE) if stopped => ContainerStatus::Exited {
            code: 137,
            oom_killed: false,
        },
        // Shut down by the manager, not by rover: its node went down (the manager stops the
        // task of a down node and, the restart condition being `none`, starts no other). A
        // node that came back may instead report its task failed with only "No such
        // container" (its record of the task is older than its restart; the engine gives an
        // exit code of 0 then). Either way the run is lost with the node, not the agent's doing.
        Some(TaskState::SHUTDOWN | TaskState::REMOVE | TaskState::ORPHANED) => {
            ContainerStatus::NodeLost
        }
        Some(TaskState::FAILED | TaskState::REJECTED) if lost_container(status.err.as_deref()) => {
            ContainerStatus::NodeLost
        }
        Some(TaskState::FAILED | TaskState::REJECTED) => ContainerStatus::Exited {
            code: code.unwrap_or(-1),
            oom_killed: false,
        },
        // Assigned to a node or running on it: lost with it when the node is gone. Swarm itself
        // leaves such a task `running` until the node comes back.
        _ if node_gone => ContainerStatus::NodeLost,
        _ => ContainerStatus::Running,
    }
}

fn lost_container(err: Option<&str>) -> bool {
    err.is_some_and(|e| e.contains("No such container"))
}

/// The task's state word (`running`, `complete`, ...).
pub fn state_word(task: Option<&Task>) -> String {
    task.and_then(|t| t.status.as_ref())
        .and_then(|s| s.state)
        .map_or_else(|| "new".to_owned(), |s| s.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use bollard::models::{ContainerStatus as TaskContainer, TaskStatus};

    fn task(state: TaskState, code: Option<i64>, err: Option<&str>) -> Task {
        Task {
            status: Some(TaskStatus {
                state: Some(state),
                err: err.map(str::to_owned),
                container_status: code.map(|c| TaskContainer {
                    exit_code: Some(c),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn a_running_task_is_lost_with_its_node() {
        let t = task(TaskState::RUNNING, None, None);
        assert_eq!(
            task_status(Some(&t), Some(NodeState::READY), false),
            ContainerStatus::Running
        );
        for gone in [NodeState::DOWN, NodeState::DISCONNECTED, NodeState::UNKNOWN] {
            assert_eq!(
                task_status(Some(&t), Some(gone), false),
                ContainerStatus::NodeLost
            );
        }
        let pending = task(TaskState::PENDING, None, None);
        assert_eq!(
            task_status(Some(&pending), None, false),
            ContainerStatus::Running
        );
        assert_eq!(task_status(None, None, false), ContainerStatus::Running);
    }

    #[test]
    fn ends_map_to_exit_codes() {
        let done = task(TaskState::COMPLETE, Some(0), None);
        assert_eq!(
            task_status(Some(&done), Some(NodeState::DOWN), false),
            ContainerStatus::Exited {
                code: 0,
                oom_killed: false
            },
            "a finished task stays finished when its node goes later"
        );
        let failed = task(TaskState::FAILED, Some(3), Some("task: non-zero exit (3)"));
        assert_eq!(
            task_status(Some(&failed), Some(NodeState::READY), false),
            ContainerStatus::Exited {
                code: 3,
                oom_killed: false
            }
        );
        let back = task(
            TaskState::FAILED,
            Some(0),
            Some("No such container: rover-a.1.x"),
        );
        assert_eq!(
            task_status(Some(&back), Some(NodeState::READY), false),
            ContainerStatus::NodeLost
        );
        let shut = task(TaskState::SHUTDOWN, Some(0), None);
        assert_eq!(
            task_status(Some(&shut), Some(NodeState::READY), false),
            ContainerStatus::NodeLost,
            "shut down by the manager: its node went away"
        );
        let killed = ContainerStatus::Exited {
            code: 137,
            oom_killed: false,
        };
        assert_eq!(
            task_status(Some(&shut), Some(NodeState::READY), true),
            killed
        );
        assert_eq!(task_status(None, None, true), killed);
        let image = task(TaskState::REJECTED, None, Some("No such image: sha256:abc"));
        assert_eq!(
            task_status(Some(&image), Some(NodeState::READY), false),
            ContainerStatus::Exited {
                code: -1,
                oom_killed: false
            }
        );
    }
}
