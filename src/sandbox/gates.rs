//! Verification gates: commands from settings run in the sandbox image over the worktree (shipped
//! or mounted, as `autopilot.sandbox.workspace` says; a shipped gate's changes are not taken
//! back), after the agent and before the commit. Project code never runs on the host.

use std::fmt::Write as _;
use std::path::Path;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::error::SandboxError;
use super::settings::GateSettings;
use super::spec::SandboxSpec;
use super::{logcap, stderr_path, wait_or_kill, ContainerStatus, Finished, LogStats, Sandbox};
use crate::git::OUTPUT_LIMIT_BYTES;

/// Label carrying a gate's index on its container.
pub const LABEL_GATE: &str = "rover.gate";

/// How one gate ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", tag = "outcome")]
pub enum GateOutcome {
    Passed,
    Failed { exit_code: i64 },
    TimedOut,
}

/// One gate's result, with its output (stdout then stderr, bounded, truncation marked).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GateResult {
    pub command: Vec<String>,
    pub required: bool,
    #[serde(flatten)]
    pub outcome: GateOutcome,
    pub output: String,
    /// The gate printed more than `autopilot.sandbox.logLimitMb` and was stopped: failed,
    /// whatever its exit code.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub output_over_limit: bool,
}

impl GateResult {
    pub fn passed(&self) -> bool {
        self.outcome == GateOutcome::Passed
    }
}

/// All gates of one workflow run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", tag = "gates")]
pub enum GatesReport {
    /// No gates are configured (recorded as such in the span).
    NoneConfigured,
    /// Every configured gate ran, in order.
    Ran { results: Vec<GateResult> },
}

impl GatesReport {
    /// A required gate failed or timed out: the workflow is `failed`.
    pub fn failed_required(&self) -> bool {
        self.results().iter().any(|r| r.required && !r.passed())
    }

    /// Optional gates that failed: warnings for the span.
    pub fn warnings(&self) -> Vec<&GateResult> {
        self.results()
            .iter()
            .filter(|r| !r.required && !r.passed())
            .collect()
    }

    pub fn results(&self) -> &[GateResult] {
        match self {
            Self::NoneConfigured => &[],
            Self::Ran { results } => results,
        }
    }
}

/// Runs each gate in its own container made from `base` (image, worktree, labels, limits, user)
/// with the gate's argv as command, one after the other; logs go to `log_dir/gate-<i>.log`.
/// Gate containers are removed afterwards.
pub async fn run_gates(
    sandbox: &dyn Sandbox,
    base: &SandboxSpec,
    gates: &[GateSettings],
    log_dir: &Path,
) -> Result<GatesReport, SandboxError> {
    if gates.is_empty() {
        return Ok(GatesReport::NoneConfigured);
    }
    tokio::fs::create_dir_all(log_dir)
        .await
        .map_err(|source| SandboxError::File {
            path: log_dir.to_path_buf(),
            source,
        })?;
    let mut results = Vec::with_capacity(gates.len());
    for (index, gate) in gates.iter().enumerate() {
        let mut spec = base.clone();
        spec.cmd.clone_from(&gate.command);
        spec.env.clear();
        spec.name = Some(format!("{}-gate-{index}", base.container_name()));
        spec.extra_labels
            .insert(LABEL_GATE.to_string(), index.to_string());
        // A gate container left by an interrupted earlier run would block the name; gates are rerun whole.
        let name = spec.container_name();
        if sandbox.remove(&name).await? {
            tracing::info!(container = %name, "removed a gate container left by an earlier run");
        }
        let log_path = log_dir.join(format!("gate-{index}.log"));
        let ran = run_to_end(
            sandbox,
            &spec,
            &log_path,
            Duration::from_secs(gate.timeout_secs),
        )
        .await?;
        let finished = ran.finished;
        let over = ran.logs.over_limit();
        let outcome = match finished.status {
            _ if finished.timed_out => GateOutcome::TimedOut,
            ContainerStatus::Exited { code: 0, .. } if !over => GateOutcome::Passed,
            ContainerStatus::Exited { code, .. } => GateOutcome::Failed { exit_code: code },
            ContainerStatus::Gone
            | ContainerStatus::Created
            | ContainerStatus::Running
            | ContainerStatus::NodeLost => GateOutcome::Failed { exit_code: -1 },
        };
        if !matches!(outcome, GateOutcome::Passed) {
            tracing::warn!(gate = ?gate.command, required = gate.required, ?outcome, "verification gate did not pass");
        }
        results.push(GateResult {
            command: gate.command.clone(),
            required: gate.required,
            outcome,
            output: ran.output,
            output_over_limit: over,
        });
    }
    Ok(GatesReport::Ran { results })
}

/// How a container run to its end went.
#[derive(Debug, Clone)]
pub struct ContainerRun {
    pub finished: Finished,
    /// stdout then stderr, bounded; when the output passed the log limit, a last line says so.
    pub output: String,
    pub logs: LogStats,
}

/// Runs one container for `spec` to its end (killed past `limit`, or as soon as its output
/// passes `spec.limits.log_bytes`), its output (stdout then stderr, bounded) from `log_path`,
/// and removes it.
pub async fn run_to_end(
    sandbox: &dyn Sandbox,
    spec: &SandboxSpec,
    log_path: &Path,
    limit: Duration,
) -> Result<ContainerRun, SandboxError> {
    if let Some(dir) = log_path.parent() {
        tokio::fs::create_dir_all(dir)
            .await
            .map_err(|source| SandboxError::File {
                path: dir.to_path_buf(),
                source,
            })?;
    }
    let id = sandbox.run(spec).await?;
    let result = async {
        let (logs, finished) = tokio::join!(
            sandbox.logs_to_file(&id, log_path, spec.limits.log_bytes),
            wait_or_kill(sandbox, &id, limit),
        );
        let (logs, finished) = (logs?, finished?);
        // A shipped workspace asked back (corrective commands) comes back before the
        // container goes; a gate's changes are not kept.
        if spec.take_back && !spec.workspace_read_only {
            super::returned::take_back(sandbox, &id, spec).await?;
        }
        Ok::<_, SandboxError>((logs, finished))
    }
    .await;
    let removed = sandbox.remove(&id).await;
    let (logs, finished) = result?;
    removed?;
    let (mut output, _) = logcap::read_bounded(
        &[log_path.to_path_buf(), stderr_path(log_path)],
        OUTPUT_LIMIT_BYTES,
    )
    .await;
    if let Some(summary) = logs.over_limit_summary("the container", log_path) {
        let _ = write!(output, "\nrover: {summary}; it was stopped");
    }
    Ok(ContainerRun {
        finished,
        output,
        logs,
    })
}
