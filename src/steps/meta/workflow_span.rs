//! The workflow span's meta, typed: the task, its branch and worktree, the container's name
//! and, once collected, how it ended (the writers in `launch` and `collect` and the readers
//! share it). Older versions wrote the name under `container` while the run was detached and
//! then the status under the same key; reading accepts both.

use std::path::PathBuf;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Deserializer, Serialize};
use serde_json::Value;

use super::{OutcomeSpanMeta, TaskStatus};
use crate::agents::WorkflowResult;
use crate::git::DiffSummary;
use crate::sandbox::gates::GatesReport;
use crate::sandbox::{ContainerStatus, LogStats};
use crate::store::{AgentMeta, ErrorMeta, Meta};

/// The workflow span's keys (camelCase on disk). Which ones a run writes depends on how far
/// it got: a task that never started (`reason`, or its branch, worktree and `error`), a
/// launched one (the task keys and [`LaunchedMeta`]), a collected one (the task keys with the
/// container's status and [`CollectedMeta`]).
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
    /// A dependency failed (the task never started) or the sandbox tampered with the worktree.
    #[serde(flatten)]
    pub outcome: OutcomeSpanMeta,
    /// Why the task never started: the failed dependency, in words.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// What the launch prepared and started (written when the run detaches).
    #[serde(flatten)]
    pub launched: Option<LaunchedMeta>,
    /// How the container's run ended (written when it is collected).
    #[serde(flatten)]
    pub collected: Option<CollectedMeta>,
    /// The image the run used and how it came about: built from the repository's definition
    /// (its log and duration), found cached, the configured image, or the build's failure (its
    /// error and the command that reproduces it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub environment: Option<crate::environment::EnvironmentMeta>,
    /// Why the task could not start or finish (the orchestrator writes a step error here too).
    #[serde(
        default,
        deserialize_with = "lenient",
        skip_serializing_if = "Option::is_none"
    )]
    pub error: Option<ErrorMeta>,
}

/// The keys of a launched run: where its branch forked, what was fetched for it, the pull
/// request it works on, the branch merged in for it, and its container.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LaunchedMeta {
    pub fork_point: String,
    /// The same commit as `forkPoint` (for readers that know it by this name).
    pub base_sha: String,
    /// `null` when the task reused an existing branch (nothing was fetched).
    pub fetch: Option<FetchMeta>,
    /// `null` unless the task checked out a pull request's head.
    pub pull_request: Option<PullUnderReviewMeta>,
    /// `null` unless a branch was merged into the task before the agent ran.
    pub merged_in: Option<MergedInMeta>,
    pub image: String,
    pub started: StartedMeta,
    /// The names of the env variables the container got (never their values).
    pub env: Vec<String>,
    /// `autopilot.sandbox.egress` as it was (absent in runs of older versions).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub egress: Option<String>,
    /// The Docker network the container joined: its run's own, or `none`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<String>,
}

/// What was fetched before a new task forked: one entry per refspec, or one without a
/// refspec when nothing could be fetched.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum FetchMeta {
    Refspecs(Vec<FetchResult>),
    Unfetched(FetchResult),
}

/// One fetch (or why there was none).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct FetchResult {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refspec: Option<String>,
    pub fetched: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// The pull request whose head a task checked out.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PullUnderReviewMeta {
    pub number: u64,
    /// The head commit.
    pub head: String,
    /// The branch it goes into.
    pub base: String,
}

/// A branch merged into the task before the agent ran, with the files left in conflict.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MergedInMeta {
    pub branch: String,
    #[serde(default)]
    pub conflicts: Vec<String>,
}

/// How the container was started: a new one, or one already there taken over.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StartedMeta {
    pub container_id: String,
    pub adopted: bool,
    /// A container created but never started was removed and replaced.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub replaced_unstarted: bool,
}

/// The keys of a collected run: how the container ended, where its logs are, what changed,
/// the task's status, the agent's report and figures, the gates.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CollectedMeta {
    /// `null` when the container did not exit (it is gone).
    pub exit_code: Option<i64>,
    pub oom_killed: bool,
    pub timed_out: bool,
    pub stuck: bool,
    pub log_path: PathBuf,
    pub stderr_path: PathBuf,
    pub stderr_tail: String,
    /// `null` when there is no diff summary (no worktree, or the sandbox tampered with it).
    pub diff: Option<DiffSummary>,
    pub task_status: TaskStatus,
    /// The agent's report, when its output had one.
    #[serde(
        default,
        deserialize_with = "lenient",
        skip_serializing_if = "Option::is_none"
    )]
    pub result: Option<WorkflowResult>,
    /// The agent's figures, when its output could be parsed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent: Option<AgentMeta>,
    /// Optional gates that did not pass (when the gates ran).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gate_warnings: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gates: Option<GatesMeta>,
    /// How much each output stream carried and how much of it was cut (past
    /// `autopilot.sandbox.logLimitMb`), when the logs were read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub logs: Option<LogStats>,
    /// What went wrong on the way that did not decide the outcome (logs, diff).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub notes: Option<Vec<String>>,
    /// What rover's proxy saw of the run: model requests, bytes and spend, every connection
    /// allowed or denied, and a stop at the budget (absent with egress `none`).
    #[serde(
        default,
        deserialize_with = "lenient",
        skip_serializing_if = "Option::is_none"
    )]
    pub network: Option<crate::agent_run::WireLedger>,
    /// The shipped workspace taken back from the container and applied to the worktree
    /// (absent when the worktree was mounted, or nothing came back).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workspace: Option<crate::sandbox::returned::Applied>,
}

/// The gates of a run: `"none configured"`, or the report of every gate.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum GatesMeta {
    Report(GatesReport),
    /// `none configured`.
    Note(String),
}

impl GatesMeta {
    /// As the span records `report`.
    pub fn of(report: &GatesReport) -> GatesMeta {
        match report {
            GatesReport::NoneConfigured => GatesMeta::Note("none configured".into()),
            GatesReport::Ran { .. } => GatesMeta::Report(report.clone()),
        }
    }
}

/// A value of another shape reads as none (rather than failing the whole meta).
fn lenient<'de, D: Deserializer<'de>, T: DeserializeOwned>(d: D) -> Result<Option<T>, D::Error> {
    let value = Option::<Value>::deserialize(d)?;
    Ok(value.and_then(|v| serde_json::from_value(v).ok()))
}

impl WorkflowSpanMeta {
    /// The typed keys of a span's meta (other keys are ignored).
    pub fn read(meta: &Meta) -> Result<WorkflowSpanMeta, serde_json::Error> {
        crate::store::from_meta(meta)
    }

    /// The container's name, wherever this or an older version wrote it.
    pub fn container_name(&self) -> Option<&str> {
        self.container_id
            .as_deref()
            .or_else(|| self.legacy_container.as_ref().and_then(Value::as_str))
    }

    /// Its keys as meta entries, to merge into a span's meta.
    pub fn to_meta(&self) -> Meta {
        crate::store::to_meta(self)
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

    /// Reads `written` as the span meta and checks it serializes back to the same JSON.
    fn round_trip(written: &Value) -> WorkflowSpanMeta {
        let read = WorkflowSpanMeta::read(&meta(written.clone()))
            .unwrap_or_else(|e| panic!("{written} does not read: {e}"));
        assert_eq!(&Value::Object(read.to_meta()), written);
        read
    }

    #[test]
    fn a_detached_run_keeps_its_launch_keys_and_their_nulls() {
        let fresh = round_trip(&json!({
            "taskId": "a1", "branchName": "rover/a1-x", "worktreePath": "/data/worktrees/a1",
            "containerId": "rover-a1", "forkPoint": "abc", "baseSha": "abc",
            "fetch": [
                {"refspec": "+refs/heads/main:refs/remotes/origin/main", "fetched": true},
                {"refspec": "+refs/pull/3/head:refs/remotes/origin/pr/3", "fetched": false, "error": "no such ref"}
            ],
            "pullRequest": {"number": 3, "head": "def", "base": "main"},
            "mergedIn": {"branch": "rover/b", "conflicts": ["x.rs"]},
            "image": "rover-sandbox:1",
            "started": {"containerId": "rover-a1", "adopted": false, "replacedUnstarted": true},
            "env": ["ANTHROPIC_API_KEY"]
        }));
        let launched = fresh.launched.expect("launched");
        assert_eq!(launched.pull_request.map(|p| p.number), Some(3));
        assert!(launched.started.replaced_unstarted);
        let reused = round_trip(&json!({
            "taskId": "a1", "branchName": "rover/a1-x", "worktreePath": "/w", "containerId": "c",
            "forkPoint": "abc", "baseSha": "abc", "fetch": null, "pullRequest": null,
            "mergedIn": null, "image": "i", "started": {"containerId": "c", "adopted": true},
            "env": []
        }));
        assert_eq!(reused.launched.expect("launched").fetch, None);
        let unfetched = round_trip(&json!({
            "forkPoint": "abc", "baseSha": "abc",
            "fetch": {"fetched": false, "error": "the default branch is unknown"},
            "pullRequest": null, "mergedIn": null, "image": "i",
            "started": {"containerId": "c", "adopted": false}, "env": []
        }));
        assert_eq!(
            unfetched.launched.expect("launched").fetch,
            Some(FetchMeta::Unfetched(FetchResult {
                refspec: None,
                fetched: false,
                error: Some("the default branch is unknown".into()),
            }))
        );
    }

    #[test]
    fn a_collected_run_keeps_its_keys_and_its_nulls() {
        let done = round_trip(&json!({
            "taskId": "a1", "branchName": "rover/a1-x", "worktreePath": "/w", "containerId": "c",
            "containerStatus": {"state": "exited", "code": 0, "oom_killed": false},
            "exitCode": 0, "oomKilled": false, "timedOut": false, "stuck": false,
            "logPath": "/s/agent.log", "stderrPath": "/s/agent.log.stderr", "stderrTail": "",
            "diff": {"filesChanged": 1, "insertions": 2, "deletions": 0, "files": ["a.txt"]},
            "taskStatus": "completed",
            "result": {"status": "completed", "summary": "did it", "files_changed": ["a.txt"]},
            "agent": {"turns": 3, "costUsd": 0.5, "inputTokens": 10, "outputTokens": 20, "cachedTokens": 0},
            "gateWarnings": ["optional gate `lint` did not pass"],
            "gates": {"gates": "ran", "results": [
                {"command": ["make", "test"], "required": true, "outcome": "passed", "output": "ok"},
                {"command": ["lint"], "required": false, "outcome": "failed", "exit_code": 1, "output": "bad"}
            ]}
        }));
        let collected = done.collected.expect("collected");
        assert_eq!(collected.task_status, TaskStatus::Completed);
        assert_eq!(collected.diff.expect("a diff").files, vec!["a.txt"]);
        assert!(matches!(collected.gates, Some(GatesMeta::Report(_))));
        // A vanished container: no exit code and no diff, written as null; an error.
        let gone = round_trip(&json!({
            "taskId": "a1", "branchName": "b", "containerId": "c",
            "containerStatus": {"state": "gone"},
            "exitCode": null, "oomKilled": false, "timedOut": true, "stuck": false,
            "logPath": "/s/agent.log", "stderrPath": "/s/agent.log.stderr", "stderrTail": "",
            "diff": null, "taskStatus": "error", "gates": "none configured",
            "notes": ["cannot read the container's logs: gone"],
            "error": {"message": "the container is gone", "retryable": false, "container": "c"}
        }));
        let error = gone.error.expect("an error");
        assert_eq!(error.detail("container"), Some(&json!("c")));
        let collected = gone.collected.expect("collected");
        assert_eq!(collected.exit_code, None);
        assert_eq!(
            collected.gates,
            Some(GatesMeta::Note("none configured".into()))
        );
        // A flood: the figures of the logs, what was cut.
        let flood = round_trip(&json!({
            "taskId": "a1", "branchName": "b", "containerId": "c",
            "containerStatus": {"state": "exited", "code": 137, "oom_killed": false},
            "exitCode": 137, "oomKilled": false, "timedOut": false, "stuck": false,
            "logPath": "/s/agent.log", "stderrPath": "/s/agent.log.stderr", "stderrTail": "",
            "diff": null, "taskStatus": "failed",
            "logs": {"stdoutBytes": 9_437_184, "stderrBytes": 10, "stdoutCut": 1_048_576, "stderrCut": 0, "limitBytes": 8_388_608}
        }));
        assert!(flood
            .collected
            .expect("collected")
            .logs
            .expect("logs")
            .over_limit());
        // Tampered: the flag and the error's.
        round_trip(&json!({
            "taskId": "a1", "branchName": "b", "containerId": "c",
            "containerStatus": {"state": "exited", "code": 0, "oom_killed": false},
            "exitCode": 0, "oomKilled": false, "timedOut": false, "stuck": false,
            "logPath": "/l", "stderrPath": "/e", "stderrTail": "", "diff": null,
            "taskStatus": "failed", "tampered": true,
            "error": {"message": "the sandbox tampered with the worktree", "retryable": false, "tampered": true}
        }));
    }

    #[test]
    fn a_task_that_never_started_keeps_its_keys() {
        let dependency = round_trip(&json!({
            "dependencyFailed": "00000000-0000-0000-0000-000000000001",
            "reason": "workflow 1 failed"
        }));
        assert!(dependency.outcome.dependency_failed.is_some());
        assert_eq!(dependency.launched, None);
        assert_eq!(dependency.collected, None);
        let merge = round_trip(&json!({
            "branchName": "rover/a", "worktreePath": "/w",
            "error": {"message": "cannot combine the dependencies' branches", "retryable": false, "command": ["git", "merge"]}
        }));
        assert_eq!(merge.branch_name.as_deref(), Some("rover/a"));
    }

    #[test]
    fn a_written_record_reads_back_equal() {
        let written = WorkflowSpanMeta {
            task_id: Some("a1".into()),
            branch_name: Some("rover/a1".into()),
            worktree_path: Some("/w".into()),
            container_id: Some("c".into()),
            container_status: Some(ContainerStatus::Gone),
            outcome: OutcomeSpanMeta {
                tampered: true,
                ..OutcomeSpanMeta::default()
            },
            launched: Some(LaunchedMeta {
                fork_point: "abc".into(),
                base_sha: "abc".into(),
                fetch: Some(FetchMeta::Refspecs(vec![FetchResult {
                    refspec: Some("r".into()),
                    fetched: true,
                    error: None,
                }])),
                merged_in: Some(MergedInMeta {
                    branch: "rover/b".into(),
                    conflicts: vec!["x".into()],
                }),
                image: "i".into(),
                started: StartedMeta {
                    container_id: "c".into(),
                    adopted: true,
                    replaced_unstarted: false,
                },
                ..LaunchedMeta::default()
            }),
            collected: Some(CollectedMeta {
                exit_code: Some(137),
                oom_killed: true,
                timed_out: false,
                stuck: true,
                log_path: "/l".into(),
                stderr_path: "/e".into(),
                stderr_tail: "killed".into(),
                diff: None,
                task_status: TaskStatus::Failed,
                result: Some(WorkflowResult {
                    status: crate::agents::WorkflowStatus::Failed,
                    summary: "no".into(),
                    files_changed: Vec::new(),
                }),
                agent: Some(AgentMeta::Failed(crate::store::AgentFailure {
                    error: "x".into(),
                    error_class: "auth".into(),
                })),
                gate_warnings: Some(vec!["w".into()]),
                gates: Some(GatesMeta::Note("none configured".into())),
                logs: Some(LogStats::default()),
                notes: Some(vec!["n".into()]),
                network: None,
                workspace: None,
            }),
            error: Some(ErrorMeta {
                message: "m".into(),
                retryable: true,
                tampered: false,
                details: Meta::new(),
            }),
            ..WorkflowSpanMeta::default()
        };
        let map = written.to_meta();
        assert_eq!(map["exitCode"], json!(137));
        assert_eq!(map["fetch"][0]["refspec"], json!("r"));
        assert_eq!(WorkflowSpanMeta::read(&map).expect("reads back"), written);
    }

    #[test]
    fn a_value_of_another_shape_does_not_hide_the_task_keys() {
        let read = WorkflowSpanMeta::read(&meta(json!({
            "branchName": "rover/a", "containerId": "c",
            "error": "a plain string", "gates": 7
        })))
        .expect("reads");
        assert_eq!(read.branch_name.as_deref(), Some("rover/a"));
        assert_eq!(read.container_name(), Some("c"));
        assert_eq!(read.error, None);
    }
}
