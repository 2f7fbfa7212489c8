//! `autopilot/state.json`: the pending queue, the task mappings and the recently closed traces.

use std::collections::BTreeMap;
use std::path::PathBuf;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use uuid::Uuid;

use super::span::StepKind;
use super::{iso, version};

/// An entry of the pending queue: which step should process which action. (Read by
/// `records_de`, which keeps unknown keys in `extra` without `serde(flatten)`'s second pass.)
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PendingAction {
    pub trace_id: Uuid,
    pub action_id: Uuid,
    /// The span that produced the action.
    pub span_id: Uuid,
    pub action: StepKind,
    pub summary: String,
    #[serde(with = "iso")]
    pub created_at: DateTime<Utc>,
    /// How many times a step run started on this action (rover's addition, bounds retries).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub attempts: u32,
    /// The span of the run in progress, if any (rover's addition, for restart recovery).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub running_span_id: Option<Uuid>,
    /// Not to be run before this time (rover's addition: backoff after a retryable error).
    #[serde(default, skip_serializing_if = "Option::is_none", with = "iso::option")]
    pub not_before: Option<DateTime<Utc>>,
    /// A newer trace took over this scheduled re-evaluation (rover's addition): its step ends
    /// it at once, saying which trace decides.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub superseded_by: Option<Uuid>,
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

#[allow(clippy::trivially_copy_pass_by_ref)] // serde's skip_serializing_if passes a reference
pub(super) fn is_zero(n: &u32) -> bool {
    *n == 0
}

/// What rover knows about the workspace of a workflow action (`state.json` `taskMappings`,
/// keyed by the workflow action id): the spec's four fields, what rover's workflow step adds,
/// and any other key (another implementation's) kept as it was.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", from = "TaskMappingWire")]
pub struct TaskMapping {
    pub task_id: String,
    pub branch_name: String,
    pub trace_id: Uuid,
    pub workflow_span_id: Uuid,
    /// The sandbox container's name (names work wherever the engine takes an id).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub container_id: Option<String>,
    /// The task's git worktree (read from the legacy `worktree` key when this one is missing).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub worktree_path: Option<PathBuf>,
    /// The commit the branch forked from (diff summaries are taken against it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fork_point: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub title: Option<String>,
    /// Keys rover does not know, written back unchanged.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

impl TaskMapping {
    /// A mapping with the spec's four fields and nothing else.
    pub fn new(task_id: &str, branch_name: &str, trace_id: Uuid, workflow_span_id: Uuid) -> Self {
        TaskMapping {
            task_id: task_id.to_owned(),
            branch_name: branch_name.to_owned(),
            trace_id,
            workflow_span_id,
            container_id: None,
            worktree_path: None,
            fork_point: None,
            title: None,
            extra: Map::new(),
        }
    }
}

/// [`TaskMapping`] as stored, before the legacy `worktree` key is read as `worktreePath`.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct TaskMappingWire {
    task_id: String,
    branch_name: String,
    trace_id: Uuid,
    workflow_span_id: Uuid,
    #[serde(default)]
    container_id: Option<String>,
    #[serde(default)]
    worktree_path: Option<PathBuf>,
    #[serde(default)]
    fork_point: Option<String>,
    #[serde(default)]
    title: Option<String>,
    #[serde(flatten)]
    extra: Map<String, Value>,
}

/// The key older stores wrote the worktree under (kept in `extra`, read as `worktreePath`).
pub(super) const LEGACY_WORKTREE_KEY: &str = "worktree";

impl From<TaskMappingWire> for TaskMapping {
    fn from(w: TaskMappingWire) -> Self {
        let legacy = || {
            w.extra
                .get(LEGACY_WORKTREE_KEY)
                .and_then(Value::as_str)
                .map(PathBuf::from)
        };
        TaskMapping {
            worktree_path: w.worktree_path.clone().or_else(legacy),
            task_id: w.task_id,
            branch_name: w.branch_name,
            trace_id: w.trace_id,
            workflow_span_id: w.workflow_span_id,
            container_id: w.container_id,
            fork_point: w.fork_point,
            title: w.title,
            extra: w.extra,
        }
    }
}

/// `autopilot/state.json`: the pending queue and the task mappings. (Read by `records_de`, as
/// [`PendingAction`] is.)
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct State {
    pub version: String,
    #[serde(with = "iso")]
    pub updated_at: DateTime<Utc>,
    pub pending: Vec<PendingAction>,
    /// Keyed by the workflow action id.
    pub task_mappings: BTreeMap<String, TaskMapping>,
    /// Traces a person closed (`rover autopilot cancel` / `fail`): nothing more of them runs
    /// but their answer (rover's addition).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub closed: BTreeMap<Uuid, ClosedTrace>,
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

/// How many closed traces `state.json` remembers (the oldest are forgotten: their work ended).
pub const CLOSED_CAPACITY: usize = 200;

/// How a person closed a trace: the command's name in `state.json`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CloseCommand {
    /// `rover autopilot cancel`, `/rover stop`, a stop reaction: the work is not wanted.
    Cancel,
    /// `rover autopilot fail`: the work failed, in a person's judgement.
    Fail,
}

impl CloseCommand {
    /// The command's name (`cancel`, `fail`), as `state.json` and the intervention span say it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Cancel => "cancel",
            Self::Fail => "fail",
        }
    }

    /// The past tense a trace's answer and its spans use (`cancelled`, `failed`).
    pub fn done(self) -> &'static str {
        match self {
            Self::Cancel => "cancelled",
            Self::Fail => "failed",
        }
    }
}

impl std::fmt::Display for CloseCommand {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A trace a person closed, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ClosedTrace {
    pub command: CloseCommand,
    pub by: String,
    pub reason: String,
    #[serde(with = "iso")]
    pub at: DateTime<Utc>,
}

impl ClosedTrace {
    /// One line for spans and logs: `cancelled by alice: no longer needed`.
    pub fn describe(&self) -> String {
        let verb = self.command.done();
        if self.reason.is_empty() {
            format!("{verb} by {}", self.by)
        } else {
            format!("{verb} by {}: {}", self.by, self.reason)
        }
    }
}

impl State {
    pub fn new(now: DateTime<Utc>) -> State {
        State {
            version: version(),
            updated_at: now,
            pending: Vec::new(),
            task_mappings: BTreeMap::new(),
            closed: BTreeMap::new(),
            extra: Map::new(),
        }
    }

    pub fn pending_for(&self, action_id: Uuid) -> Option<&PendingAction> {
        self.pending.iter().find(|p| p.action_id == action_id)
    }

    pub fn pending_for_mut(&mut self, action_id: Uuid) -> Option<&mut PendingAction> {
        self.pending.iter_mut().find(|p| p.action_id == action_id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_closed_trace_reads_and_writes_its_command_as_a_word() {
        let json = r#"{"command":"fail","by":"alice","reason":"wrong repository","at":"2026-11-26T05:00:00Z"}"#;
        let closed: ClosedTrace = serde_json::from_str(json).expect("a closed trace");
        assert_eq!(closed.command, CloseCommand::Fail);
        assert_eq!(closed.describe(), "failed by alice: wrong repository");
        let written = serde_json::to_value(&closed).expect("json");
        assert_eq!(written["command"], "fail");
        let cancel = ClosedTrace {
            command: CloseCommand::Cancel,
            reason: String::new(),
            ..closed
        };
        assert_eq!(cancel.describe(), "cancelled by alice");
        // A word rover never writes is an error (`state.json` names itself), not a guess.
        let other = json.replace("\"fail\"", "\"stop\"");
        assert!(serde_json::from_str::<ClosedTrace>(&other).is_err());
    }
}
