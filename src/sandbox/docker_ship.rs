//! The local Docker engine's shipped workspace: each host path of a spec becomes an anonymous
//! volume of the container, filled through the engine's archive API before the container starts
//! (`PUT /containers/{id}/archive`), and `/workspace` is taken back the same way after it exits
//! (`GET /containers/{id}/archive`). Nothing of the host is bind-mounted.

use std::path::Path;

use bollard::models::{Mount, MountType, MountVolumeOptions};
use bollard::query_parameters::{DownloadFromContainerOptions, UploadToContainerOptions};
use futures_util::StreamExt;
use tokio::io::AsyncWriteExt;

use super::docker::DockerSandbox;
use super::error::SandboxError;
use super::ship::{self, Owner};
use super::spec::{SandboxSpec, WORKSPACE_MOUNT};
use crate::git::owner;

impl DockerSandbox {
    /// Who a shipped container runs as: the worktree's owner, never root (see
    /// [`crate::git::owner`]); nothing is handed over, the copy is made theirs.
    pub(crate) fn shipped_owner(spec: &SandboxSpec) -> Result<owner::RunAs, SandboxError> {
        owner::run_as(&spec.worktree).map_err(|source| SandboxError::Mount {
            path: spec.worktree.clone(),
            source,
        })
    }

    /// An anonymous volume (removed with the container) at each shipped target, left empty by
    /// the engine (no copy of the image's content). It carries the container's labels: one a
    /// removal without its volumes left is still rover's to sweep (`gc`).
    pub(crate) fn shipped_mounts(spec: &SandboxSpec) -> Vec<Mount> {
        let labels: std::collections::HashMap<String, String> =
            spec.all_labels().into_iter().collect();
        ship::shipments(spec)
            .into_iter()
            .map(|s| Mount {
                target: Some(s.target),
                typ: Some(MountType::VOLUME),
                read_only: Some(false),
                volume_options: Some(MountVolumeOptions {
                    no_copy: Some(true),
                    labels: Some(labels.clone()),
                    ..Default::default()
                }),
                ..Default::default()
            })
            .collect()
    }

    /// Fills the volumes of the created container `id` with the spec's host paths.
    pub(crate) async fn ship(&self, id: &str, spec: &SandboxSpec) -> Result<(), SandboxError> {
        let run_as = Self::shipped_owner(spec)?;
        let owner = Owner {
            uid: run_as.uid,
            gid: run_as.gid,
        };
        for shipment in ship::shipments(spec) {
            let source = shipment.source.clone();
            std::fs::symlink_metadata(&source).map_err(|e| SandboxError::Mount {
                path: source.clone(),
                source: e,
            })?;
            let options = UploadToContainerOptions {
                path: shipment.target.clone(),
                ..Default::default()
            };
            let target = shipment.target.clone();
            let (chunks, made) = ship::stream(shipment, owner);
            let sent = self
                .client()
                .upload_to_container(id, Some(options), bollard::body_stream(chunks))
                .await;
            let made = made.await.map_err(|e| SandboxError::File {
                path: source.clone(),
                source: std::io::Error::other(e),
            })?;
            // A failure to read the host side explains a broken upload best.
            made.map_err(|e| SandboxError::Mount {
                path: source.clone(),
                source: e,
            })?;
            sent.map_err(|e| self.err("ship the workspace into", &format!("{id}:{target}"), e))?;
        }
        Ok(())
    }

    /// Writes the tar of `/workspace` of container `id` to `into`, at most `limit` bytes.
    pub(crate) async fn fetch(
        &self,
        id: &str,
        into: &Path,
        limit: u64,
    ) -> Result<u64, SandboxError> {
        let file_err = |source| SandboxError::File {
            path: into.to_path_buf(),
            source,
        };
        let mut file = tokio::fs::File::create(into).await.map_err(file_err)?;
        let options = DownloadFromContainerOptions {
            path: WORKSPACE_MOUNT.to_owned(),
        };
        let mut stream = self.client().download_from_container(id, Some(options));
        let mut written: u64 = 0;
        while let Some(chunk) = stream.next().await {
            let chunk = chunk.map_err(|e| self.err("take the workspace back from", id, e))?;
            written += chunk.len() as u64;
            if written > limit {
                // What came is kept for the caller to name the entry that passed the limit.
                let _ = file.write_all(&chunk).await;
                let _ = file.flush().await;
                return Err(SandboxError::Returned {
                    entry: "workspace/".to_owned(),
                    reason: format!(
                        "holds more than {} MiB (autopilot.sandbox.workspaceLimitMb), which looks like a tar bomb or a huge or sparse file",
                        limit / (1024 * 1024)
                    ),
                });
            }
            file.write_all(&chunk).await.map_err(file_err)?;
        }
        file.flush().await.map_err(file_err)?;
        file.sync_all().await.map_err(file_err)?;
        Ok(written)
    }
}
