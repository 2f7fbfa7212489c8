//! The verdict of a collected run: from the container's end and the agent's parsed result to
//! the task's status and summary. Pure (no Docker, no store): gates and tamper checks come
//! after it, in `collect`.

use std::time::Duration;

use crate::agents::{WorkflowResult, WorkflowStatus};
use crate::sandbox::ContainerStatus;
use crate::steps::meta::TaskStatus;

/// How a run's container ended, and what its agent said.
#[derive(Debug, Clone)]
pub struct RunEnd<'a> {
    pub container: &'a str,
    pub status: ContainerStatus,
    /// The agent's structured result, or why there is none.
    pub result: &'a Result<WorkflowResult, String>,
    /// Stopped for showing no activity.
    pub stuck: bool,
    /// Killed past its time limit.
    pub timed_out: bool,
    pub stuck_after_secs: u64,
    pub limit: Duration,
    pub memory_mb: u64,
    /// The end of the agent's stderr.
    pub stderr_tail: &'a str,
    /// Its output passed `autopilot.sandbox.logLimitMb` (it was stopped, the middle cut): what
    /// it printed and what rover kept, in words.
    pub over_log_limit: Option<&'a str>,
    /// A person closed the trace (`cancel`, `fail`), which stopped the run: who and why.
    pub closed_by_hand: Option<&'a str>,
}

/// The task's status and summary for a run that ended as `end` says.
pub fn verdict(end: &RunEnd<'_>) -> (TaskStatus, String) {
    let container = end.container;
    match (end.status, end.result) {
        // Not the agent's doing: the run was stopped because a person closed the trace.
        (_, _) if end.closed_by_hand.is_some() => (
            TaskStatus::Error,
            format!(
                "stopped by hand: the trace was {}",
                end.closed_by_hand.unwrap_or_default()
            ),
        ),
        // Not the agent's doing either: a failure the resolver may retry (on another node).
        (ContainerStatus::NodeLost, _) => (
            TaskStatus::Failed,
            format!("node lost: the swarm node running the sandbox {container} went down mid-run (its engine stopped answering the swarm's manager); the run's work is lost, a retry runs it again on a node that is up"),
        ),
        (ContainerStatus::Gone, _) => (
            TaskStatus::Error,
            format!("the sandbox container {container} disappeared before rover read its result (removed by hand?)"),
        ),
        // Like a memory or time limit: the run's own doing, stopped by rover; its cut output
        // cannot be trusted to hold the agent's answer.
        (_, _) if end.over_log_limit.is_some() => (
            TaskStatus::Failed,
            end.over_log_limit.unwrap_or_default().to_owned(),
        ),
        (_, _) if end.stuck => (
            TaskStatus::Failed,
            format!(
                "stuck: the agent wrote no output and changed no file for {}s (autopilot.budget.stuckAfterSecs); it was stopped",
                end.stuck_after_secs
            ),
        ),
        (_, _) if end.timed_out => (
            TaskStatus::Failed,
            format!(
                "the agent ran past its {}s limit and was killed",
                end.limit.as_secs()
            ),
        ),
        (ContainerStatus::Exited { oom_killed: true, .. }, _) => (
            TaskStatus::Failed,
            format!(
                "the agent was killed: out of memory (limit {} MiB)",
                end.memory_mb
            ),
        ),
        (ContainerStatus::Exited { code, .. }, _) if code != 0 => (
            TaskStatus::Failed,
            format!(
                "the agent exited with code {code}: {}",
                last_line(end.stderr_tail).unwrap_or("no error output")
            ),
        ),
        (ContainerStatus::Exited { .. }, Err(reason)) => (
            TaskStatus::Failed,
            format!("the agent gave no valid result: {reason}"),
        ),
        (ContainerStatus::Exited { .. }, Ok(r)) if r.status == WorkflowStatus::Failed => (
            TaskStatus::Failed,
            format!("the agent could not do the task: {}", r.summary),
        ),
        (ContainerStatus::Exited { .. }, Ok(r)) => (TaskStatus::Completed, r.summary.clone()),
        (ContainerStatus::Created | ContainerStatus::Running, _) => (
            TaskStatus::Error,
            format!("the sandbox container {container} did not finish"),
        ),
    }
}

fn last_line(text: &str) -> Option<&str> {
    text.lines().rev().find(|l| !l.trim().is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn result(status: WorkflowStatus, summary: &str) -> Result<WorkflowResult, String> {
        serde_json::from_value(serde_json::json!({
            "status": status, "summary": summary, "files_changed": []
        }))
        .map_err(|e| e.to_string())
    }

    fn end<'a>(
        status: ContainerStatus,
        result: &'a Result<WorkflowResult, String>,
        stderr_tail: &'a str,
    ) -> RunEnd<'a> {
        RunEnd {
            container: "rover-c",
            status,
            result,
            stuck: false,
            timed_out: false,
            stuck_after_secs: 600,
            limit: Duration::from_secs(1800),
            memory_mb: 256,
            stderr_tail,
            over_log_limit: None,
            closed_by_hand: None,
        }
    }

    #[test]
    fn a_run_a_person_stopped_is_an_error_that_says_so_not_the_agents_failure() {
        let done = result(WorkflowStatus::Completed, "done");
        let killed = ContainerStatus::Exited {
            code: 137,
            oom_killed: false,
        };
        let mut stopped = end(killed, &done, "");
        stopped.closed_by_hand = Some("cancelled by alice: not needed");
        assert_eq!(
            verdict(&stopped),
            (
                TaskStatus::Error,
                "stopped by hand: the trace was cancelled by alice: not needed".to_owned()
            )
        );
    }

    const EXITED_OK: ContainerStatus = ContainerStatus::Exited {
        code: 0,
        oom_killed: false,
    };

    #[test]
    fn the_agents_own_word_decides_a_clean_exit() {
        let done = result(WorkflowStatus::Completed, "added the flag");
        assert_eq!(
            verdict(&end(EXITED_OK, &done, "")),
            (TaskStatus::Completed, "added the flag".to_owned())
        );
        let failed = result(WorkflowStatus::Failed, "no such file");
        let (status, summary) = verdict(&end(EXITED_OK, &failed, ""));
        assert_eq!(status, TaskStatus::Failed);
        assert_eq!(summary, "the agent could not do the task: no such file");
        let invalid: Result<WorkflowResult, String> = Err("not json".into());
        let (status, summary) = verdict(&end(EXITED_OK, &invalid, ""));
        assert_eq!(status, TaskStatus::Failed);
        assert!(summary.contains("no valid result: not json"), "{summary}");
    }

    #[test]
    fn a_bad_exit_a_kill_or_a_lost_container_overrides_what_the_agent_said() {
        let done = result(WorkflowStatus::Completed, "done");
        let crashed = ContainerStatus::Exited {
            code: 3,
            oom_killed: false,
        };
        let (status, summary) = verdict(&end(crashed, &done, "warn\npanic: boom\n\n"));
        assert_eq!(status, TaskStatus::Failed);
        assert_eq!(summary, "the agent exited with code 3: panic: boom");
        let oom = ContainerStatus::Exited {
            code: 137,
            oom_killed: true,
        };
        let (status, summary) = verdict(&end(oom, &done, ""));
        assert_eq!(status, TaskStatus::Failed);
        assert!(
            summary.contains("out of memory (limit 256 MiB)"),
            "{summary}"
        );
        let mut overdue = end(crashed, &done, "");
        overdue.timed_out = true;
        assert!(verdict(&overdue).1.contains("past its 1800s limit"));
        let mut stuck = end(EXITED_OK, &done, "");
        stuck.stuck = true;
        stuck.timed_out = true;
        let (status, summary) = verdict(&stuck);
        assert_eq!(status, TaskStatus::Failed);
        assert!(
            summary.starts_with("stuck: ") && summary.contains("600s"),
            "{summary}"
        );
        let mut flood = end(
            ContainerStatus::Exited {
                code: 137,
                oom_killed: false,
            },
            &done,
            "",
        );
        let words = "the sandbox printed more than 8 MiB to stdout (limit autopilot.sandbox.logLimitMb = 8); rover kept the first 4 MiB and the last 2 MiB of it in agent.log";
        flood.over_log_limit = Some(words);
        flood.timed_out = true;
        assert_eq!(verdict(&flood), (TaskStatus::Failed, words.to_owned()));
        let (status, summary) = verdict(&end(ContainerStatus::Gone, &done, ""));
        assert_eq!(status, TaskStatus::Error);
        assert!(summary.contains("rover-c disappeared"), "{summary}");
        let (status, summary) = verdict(&end(ContainerStatus::Running, &done, ""));
        assert_eq!(status, TaskStatus::Error);
        assert!(summary.contains("did not finish"), "{summary}"); // Lost with its swarm node: a failure for the resolver, whatever the log held.
        let (status, summary) = verdict(&end(ContainerStatus::NodeLost, &done, ""));
        assert_eq!(status, TaskStatus::Failed);
        assert!(summary.starts_with("node lost: "), "{summary}");
        assert!(summary.contains("rover-c"), "{summary}");
    }
}
