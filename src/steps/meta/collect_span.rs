//! The meta of a workflow run's `collect` span (the collection of a detached run, see
//! `orchestrator::collect`): how the monitor found the run ended, written as the collection
//! starts, and what the collection checked, written as it ends. The run's own outcome (logs,
//! result, diff, usage) stays in the workflow span's `WorkflowSpanMeta`; the collection's error,
//! if any, is the span's `meta.error` (`ErrorMeta`).

use serde::{Deserialize, Serialize};

use super::{GatesMeta, TaskStatus};
use crate::sandbox::ContainerStatus;

/// See the module documentation.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CollectSpanMeta {
    /// The run's container.
    pub container_id: String,
    /// Its state as the monitor found it (after stopping it, when it did); absent when the
    /// engine could not be asked.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub container_status: Option<ContainerStatus>,
    /// Killed past its time limit.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub timed_out: bool,
    /// Stopped for showing no activity.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub stuck: bool,
    /// A person closed the trace (who and why), which stopped the run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub closed_by_hand: Option<String>,
    /// The engine could not be asked about the container past the run's time limit: why.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unreachable: Option<String>,
    /// The task's outcome the collection found (written as it ends).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub task_status: Option<TaskStatus>,
    /// The verification gates run inside the collection (written as it ends).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gates: Option<GatesMeta>,
}

impl CollectSpanMeta {
    /// How the monitor saw the run end, in words (the span's summary while it runs).
    pub fn seen(&self) -> String {
        if let Some(why) = &self.unreachable {
            return format!(
                "the engine cannot be asked about container {} and its time is up: {why}",
                self.container_id
            );
        }
        let how = match self.container_status {
            Some(ContainerStatus::Exited { code, .. }) if self.timed_out => {
                format!("was killed past its time limit (exit code {code})")
            }
            Some(ContainerStatus::Exited { code, .. }) if self.stuck => {
                format!("was stopped as stuck (exit code {code})")
            }
            Some(ContainerStatus::Exited {
                oom_killed: true, ..
            }) => "was killed out of memory".to_owned(),
            Some(ContainerStatus::Exited { code, .. }) => format!("exited with code {code}"),
            Some(ContainerStatus::Gone) | None => "is gone".to_owned(),
            Some(ContainerStatus::NodeLost) => "was lost with its swarm node".to_owned(),
            Some(ContainerStatus::Running | ContainerStatus::Created) => {
                "did not finish".to_owned()
            }
        };
        format!("collecting: container {} {how}", self.container_id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_record_reads_back_as_written_and_says_how_the_run_ended() {
        let record = CollectSpanMeta {
            container_id: "rover-c".into(),
            container_status: Some(ContainerStatus::Exited {
                code: 0,
                oom_killed: false,
            }),
            ..CollectSpanMeta::default()
        };
        let json = serde_json::to_value(&record).unwrap();
        assert_eq!(
            json,
            serde_json::json!({
                "containerId": "rover-c",
                "containerStatus": {"state": "exited", "code": 0, "oom_killed": false}
            })
        );
        assert_eq!(
            serde_json::from_value::<CollectSpanMeta>(json).unwrap(),
            record
        );
        assert_eq!(
            record.seen(),
            "collecting: container rover-c exited with code 0"
        );
        let gone = CollectSpanMeta {
            container_id: "rover-c".into(),
            container_status: Some(ContainerStatus::Gone),
            ..CollectSpanMeta::default()
        };
        assert_eq!(gone.seen(), "collecting: container rover-c is gone");
    }
}
