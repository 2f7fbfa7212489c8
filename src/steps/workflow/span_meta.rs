//! The typed part of the workflow span's meta that others read back: the task, its branch and
//! worktree, the container's name and, once collected, how it ended. Older versions wrote the
//! name under `container` while the run was detached and then the status under the same key;
//! reading accepts both.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::sandbox::ContainerStatus;
use crate::store::Meta;

/// The workflow span's task and container keys (camelCase on disk).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WorkflowSpanMeta {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub task_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub branch_name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub worktree_path: Option<PathBuf>,
    /// The container's name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub container_id: Option<String>,
    /// How the container ended, once collected.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub container_status: Option<ContainerStatus>,
    /// What older versions wrote under `container`: the name (detached), then the status.
    #[serde(default, rename = "container", skip_serializing)]
    pub legacy_container: Option<Value>,
}

impl WorkflowSpanMeta {
    /// The typed keys of a span's meta (other keys are ignored).
    pub fn read(meta: &Meta) -> Result<WorkflowSpanMeta, serde_json::Error> {
        serde_json::from_value(Value::Object(meta.clone()))
    }

    /// The container's name, wherever this or an older version wrote it.
    pub fn container_name(&self) -> Option<&str> {
        self.container_id
            .as_deref()
            .or_else(|| self.legacy_container.as_ref().and_then(Value::as_str))
    }

    /// Its keys as meta entries, to merge into a span's meta.
    pub fn to_meta(&self) -> Meta {
        match serde_json::to_value(self) {
            Ok(Value::Object(map)) => map,
            _ => Meta::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn meta(value: Value) -> Meta {
        let Value::Object(map) = value else {
            panic!("an object")
        };
        map
    }

    #[test]
    fn the_name_and_the_status_have_keys_of_their_own() {
        let written = WorkflowSpanMeta {
            task_id: Some("t".into()),
            container_id: Some("rover-a".into()),
            container_status: Some(ContainerStatus::Exited {
                code: 0,
                oom_killed: false,
            }),
            ..WorkflowSpanMeta::default()
        };
        let map = written.to_meta();
        assert_eq!(map["containerId"], json!("rover-a"));
        assert_eq!(map["containerStatus"]["state"], json!("exited"));
        assert!(!map.contains_key("container"));
        let read = WorkflowSpanMeta::read(&map).expect("reads back");
        assert_eq!(read, written);
        assert_eq!(read.container_name(), Some("rover-a"));
    }

    #[test]
    fn what_older_versions_wrote_still_reads() {
        // Detached: the name under `container`.
        let detached = WorkflowSpanMeta::read(&meta(json!({
            "branchName": "rover/x", "container": "rover-old", "image": "i"
        })))
        .expect("reads");
        assert_eq!(detached.container_name(), Some("rover-old"));
        // Collected: the name under `containerId`, the status under `container`.
        let collected = WorkflowSpanMeta::read(&meta(json!({
            "containerId": "rover-old", "container": {"state": "exited", "code": 1, "oomKilled": false}
        })))
        .expect("reads");
        assert_eq!(collected.container_name(), Some("rover-old"));
    }
}
