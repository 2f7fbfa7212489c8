//! What a run gives back: the workspace of a shipped run (one whose `/workspace` was copied
//! into the container instead of mounted), as a tar of its `/workspace` checked entry by entry
//! and applied to the task's worktree without following links (see [`crate::sandbox::returned`]).
//! A refused archive fails the run with the entry named, and nothing of it reaches the worktree.

use std::path::PathBuf;

use super::AgentRunError;
use crate::sandbox::returned::Applied;
use crate::sandbox::{BindMount, ContainerStatus, Sandbox, SandboxSpec, WORKSPACE_MOUNT};

/// Takes back the workspace of `container`, a run made with `spec`, once it exited: `None`
/// when it was not shipped (its worktree was mounted) or has not exited. `gitfile`: the git
/// file the run was shipped with, the one `.git` that may come back.
pub async fn take_back(
    sandbox: &dyn Sandbox,
    container: &str,
    mut spec: SandboxSpec,
    gitfile: PathBuf,
    status: ContainerStatus,
) -> Result<Option<Applied>, AgentRunError> {
    if !spec.shipped() || !matches!(status, ContainerStatus::Exited { .. }) {
        return Ok(None);
    }
    spec.extra_mounts.push(BindMount {
        host: gitfile,
        target: format!("{WORKSPACE_MOUNT}/.git"),
        read_only: true,
    });
    let applied = crate::sandbox::returned::take_back(sandbox, container, &spec)
        .await
        .map_err(|source| AgentRunError::Returned {
            container: container.to_owned(),
            source,
        })?;
    if let Some(a) = &applied {
        tracing::info!(container = %container, entries = a.entries, bytes = a.bytes, archive_bytes = a.archive_bytes, "took the shipped workspace back");
    }
    Ok(applied)
}
