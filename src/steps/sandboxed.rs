//! What the steps share to run work in a sandbox container over a task's worktree: the spec,
//! its scratch git, the hooks a commit or push must run there, the resolver's corrective
//! commands, and the check that a container left the worktree's git metadata alone.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;
use uuid::Uuid;

use super::tasks::git_error;
use super::Services;
use crate::git::{GitError, HookLocation, Workspace};
use crate::github::Visibility;
use crate::orchestrator::{StepContext, StepError};
use crate::sandbox::gates::run_to_end;
use crate::sandbox::hooks::HookContainer;
use crate::sandbox::{ContainerStatus, Sandbox, SandboxLabels, SandboxSpec};

/// Label on the resolver's corrective-command containers.
pub const LABEL_CORRECTIVE: &str = "rover.corrective";
/// Longest one corrective command may run.
pub const CORRECTIVE_TIMEOUT: Duration = Duration::from_secs(600);
/// Most corrective commands run for one decision.
pub const MAX_CORRECTIVE: usize = 5;

/// The engine, or the step error that says none is configured.
pub fn sandbox(services: &Services) -> Result<Arc<dyn Sandbox>, StepError> {
    services.sandbox.clone().ok_or_else(|| {
        StepError::fatal(
            "no Docker sandbox is configured, so this cannot run; start a Docker engine (or set DOCKER_HOST) and restart the daemon",
        )
    })
}

/// Labels of a container working for `action` of `trace`.
pub fn labels(services: &Services, trace: Uuid, action: Uuid) -> SandboxLabels {
    SandboxLabels {
        project: services.project_id.clone(),
        trace: trace.to_string(),
        action: action.to_string(),
    }
}

/// A spec in the configured image over `worktree`, no environment at all.
pub fn bare_spec(
    services: &Services,
    cmd: Vec<String>,
    worktree: &Path,
    labels: SandboxLabels,
) -> SandboxSpec {
    let mut spec =
        SandboxSpec::from_settings(&services.config.autopilot.sandbox, cmd, worktree, labels);
    if let Some(store) = &services.store_root {
        spec.owned_by(store);
    }
    spec
}

/// The image the trace's work ran in: its latest workflow run's environment (the repository's
/// own image when it declares one), else `autopilot.sandbox.image`. Hooks and corrective
/// commands run in it, so they find the tools the agent and the gates had.
pub async fn trace_image(ctx: &StepContext, services: &Services, trace: Uuid) -> String {
    let configured = services.config.autopilot.sandbox.image.clone();
    let Ok(view) = crate::store::blocking(ctx.store.clone(), move |s| s.load_trace(trace)).await
    else {
        return configured;
    };
    super::history::latest_image(&view).unwrap_or(configured)
}

/// A step error for a worktree whose git metadata a container changed: never retried.
pub fn tampered(context: &str, e: &GitError) -> StepError {
    StepError {
        tampered: true,
        ..git_error(context, e)
    }
}

/// Whether a git error says the worktree was tampered with.
pub fn is_tampered(e: &GitError) -> bool {
    matches!(e, GitError::Tampered { .. })
}

/// The hook container of a task's worktree: the spec with a fresh scratch git under
/// `work_dir/git` (objects from `objects_cache`), the hooks' location, and `work_dir` for the
/// phase's files and logs.
pub async fn hook_container<'a>(
    ws: &Workspace,
    sandbox: &'a dyn Sandbox,
    base: SandboxSpec,
    location: HookLocation,
    work_dir: &Path,
    objects_cache: &Path,
) -> Result<HookContainer<'a>, GitError> {
    let mut base = base;
    let git = ws
        .sandbox_git(&base.worktree, &work_dir.join("git"), objects_cache)
        .await?;
    base.mount_git(&git);
    Ok(HookContainer {
        sandbox,
        base,
        location,
        work_dir: work_dir.to_path_buf(),
    })
}

/// One corrective command the resolver asked for, as it ran in the sandbox.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CorrectiveRun {
    pub command: String,
    /// `None` when the container did not finish (timed out, vanished).
    pub exit_code: Option<i64>,
    pub timed_out: bool,
    /// stdout then stderr, bounded.
    pub output: String,
    /// It printed more than `autopilot.sandbox.logLimitMb` and was stopped: failed, whatever
    /// its exit code.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub output_over_limit: bool,
}

impl CorrectiveRun {
    pub fn succeeded(&self) -> bool {
        self.exit_code == Some(0) && !self.output_over_limit
    }
}

/// Runs each command with `/bin/sh -c` in its own container over `worktree` (scratch git, no
/// environment, the sandbox's limits and network), in order, stopping at the first failure.
/// The worktree's git metadata is checked after each.
pub async fn run_corrective(
    services: &Services,
    ws: &Workspace,
    sandbox: &dyn Sandbox,
    base: SandboxSpec,
    commands: &[String],
    work_dir: &Path,
    objects_cache: &Path,
) -> Result<Vec<CorrectiveRun>, StepError> {
    let mut runs = Vec::new();
    for (index, command) in commands.iter().take(MAX_CORRECTIVE).enumerate() {
        let mut spec = base.clone();
        spec.cmd = vec!["/bin/sh".into(), "-c".into(), command.clone()];
        spec.env.clear();
        // What the command changes is the point: a shipped workspace comes back (checked).
        spec.take_back = true;
        spec.name = Some(format!("{}-fix-{index}", base.container_name()));
        spec.extra_labels
            .insert(LABEL_CORRECTIVE.to_owned(), index.to_string());
        let git = ws
            .sandbox_git(
                &spec.worktree,
                &work_dir.join(format!("git-{index}")),
                objects_cache,
            )
            .await
            .map_err(|e| git_error("cannot prepare the sandbox's git", &e))?;
        spec.mount_git(&git);
        let name = spec.container_name();
        let _ = sandbox.remove(&name).await;
        let log = work_dir.join(format!("fix-{index}.log"));
        let ran = run_to_end(sandbox, &spec, &log, CORRECTIVE_TIMEOUT).await;
        git.discard();
        let ran = ran
            .map_err(|e| StepError::from_error(&e, e.is_retryable()).detail("command", command))?;
        let finished = ran.finished;
        ws.verify_worktree(&spec.worktree).await.map_err(|e| {
            tampered(
                "a corrective command changed the worktree's git metadata",
                &e,
            )
        })?;
        let exit_code = match finished.status {
            ContainerStatus::Exited { code, .. } if !finished.timed_out => Some(code),
            _ => None,
        };
        let run = CorrectiveRun {
            command: command.clone(),
            exit_code,
            timed_out: finished.timed_out,
            output: services.redactor.redact(&ran.output, Visibility::Private),
            output_over_limit: ran.logs.over_limit(),
        };
        let ok = run.succeeded();
        runs.push(run);
        if !ok {
            break;
        }
    }
    Ok(runs)
}
