//! The start sweep: containers and worktrees no task mapping names, and containers whose
//! result is already recorded, are removed.

use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::sandbox::{ContainerStatus, LABEL_ACTION, LABEL_PROJECT};
use crate::steps::tasks::{self, Task};
use crate::steps::Services;
use crate::store::blocking;
use crate::store::AutopilotStore;

/// What `sweep_orphans` found and did.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct OrphanReport {
    /// Containers of this project that no task mapping names (removed).
    pub containers: Vec<String>,
    /// Containers whose run's result is already recorded (a finished span) but that were left
    /// behind (by a crash after recording, or by an older version): removed.
    pub collected: Vec<String>,
    /// Worktrees under the worktrees dir that no task mapping names (removed).
    pub worktrees: Vec<PathBuf>,
    /// Networks and relays of agent runs whose container is gone (removed).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub networks: Vec<String>,
    /// Proxy grants and ledgers of runs no task names (removed).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub grants: Vec<String>,
    /// What could not be removed, and why.
    pub errors: Vec<String>,
}

/// At daemon start: containers labelled with the project and worktrees under the worktrees dir
/// that no task mapping names are reported (logged) and removed; so are mapped containers whose
/// run already ended with a recorded span (their logs are in its artifacts).
pub async fn sweep_orphans(services: &Services, store: &AutopilotStore) -> OrphanReport {
    let mut report = OrphanReport::default();
    let state = match blocking(store.clone(), AutopilotStore::read_state).await {
        Ok(s) => s,
        Err(e) => {
            report
                .errors
                .push(format!("cannot read the task mappings, nothing swept: {e}"));
            return report;
        }
    };
    let known = tasks::all_tasks(&state);
    if let Some(sandbox) = &services.sandbox {
        let labels = [(LABEL_PROJECT.to_owned(), services.project_id.clone())];
        match sandbox.list_by_labels(&labels).await {
            Ok(found) => {
                for c in found {
                    let action = c.labels.get(LABEL_ACTION).cloned().unwrap_or_default();
                    if let Some(task) = known.iter().find(|t| t.action_id.to_string() == action) {
                        if collected_already(store, &state, task).await {
                            let name = c.name.clone().unwrap_or_else(|| c.id.clone());
                            tracing::info!(container = %name, action = %action, "removing a workflow container whose result is recorded");
                            match sandbox.remove(&c.id).await {
                                Ok(_) => {
                                    super::monitor::remove_scratch(
                                        store,
                                        task.mapping.workflow_span_id,
                                    )
                                    .await;
                                    report.collected.push(name);
                                }
                                Err(e) => report.errors.push(format!("container {name}: {e}")),
                            }
                        }
                        continue;
                    }
                    let name = c.name.clone().unwrap_or_else(|| c.id.clone());
                    tracing::warn!(container = %name, action = %action, "removing an orphan sandbox container");
                    match sandbox.remove(&c.id).await {
                        Ok(_) => report.containers.push(name),
                        Err(e) => report.errors.push(format!("container {name}: {e}")),
                    }
                }
            }
            Err(e) => report.errors.push(format!("cannot list containers: {e}")),
        }
        match sandbox.run_networks(&services.project_id).await {
            Ok(runs) => {
                for run in runs {
                    if !matches!(sandbox.status(&run).await, Ok(ContainerStatus::Gone)) {
                        continue;
                    }
                    tracing::info!(run = %run, "removing the network of a run whose container is gone");
                    match sandbox.disconnect_run(&run).await {
                        Ok(()) => report.networks.push(run),
                        Err(e) => report.errors.push(format!("network of {run}: {e}")),
                    }
                }
            }
            Err(e) => report.errors.push(format!("cannot list run networks: {e}")),
        }
    }
    // Grants and ledgers of runs no task names any more (a crash between collecting a run and
    // forgetting it): their spans hold what they said. Swept at start, before any launch.
    let named: Vec<&str> = known
        .iter()
        .filter_map(|t| t.mapping.container_id.as_deref())
        .collect();
    let (grants, errors) = crate::agent_run::forget_files_except(&store.proxy_dir(), &named);
    report.grants.extend(grants);
    report.errors.extend(errors);
    let dir = Services::worktrees_dir(store);
    let named: Vec<PathBuf> = known
        .iter()
        .filter_map(|t| t.mapping.worktree_path.clone())
        .collect();
    let is_named = |p: &Path| named.iter().any(|n| n == p);
    let mut candidates: Vec<PathBuf> = Vec::new();
    if let Ok(entries) = std::fs::read_dir(&dir) {
        candidates.extend(entries.flatten().map(|e| e.path()));
    }
    let ws = match tasks::workspace(services).await {
        Ok(ws) => ws,
        Err(e) => {
            report
                .errors
                .push(format!("cannot open the repository: {e}"));
            return report;
        }
    };
    if let Ok(listed) = ws.list_worktrees().await {
        candidates.extend(
            listed
                .into_iter()
                .map(|w| w.path)
                .filter(|p| p.starts_with(&dir)),
        );
    }
    candidates.sort();
    candidates.dedup();
    for path in candidates.into_iter().filter(|p| !is_named(p)) {
        // A file, not a worktree: what a kill left beside one (a shipped workspace's archive
        // half fetched back, `.<worktree>.rover-returned.tar`). Nothing runs yet: removed.
        if std::fs::symlink_metadata(&path).is_ok_and(|m| !m.is_dir()) {
            tracing::warn!(path = %path.display(), "removing a file left in the worktrees dir");
            match tokio::fs::remove_file(&path).await {
                Ok(()) => report.worktrees.push(path),
                Err(e) => report.errors.push(format!("{}: {e}", path.display())),
            }
            continue;
        }
        tracing::warn!(path = %path.display(), "removing an orphan worktree");
        match ws.remove_worktree(&path).await {
            Ok(_) => report.worktrees.push(path),
            Err(e) => report
                .errors
                .push(format!("worktree {}: {e}", path.display())),
        }
    }
    report
}

/// Whether the workflow run of `task` has a recorded end (its span is final and it is not
/// running detached), so its container holds nothing rover still needs. Gate containers carry
/// the same action label and are covered too.
async fn collected_already(
    store: &AutopilotStore,
    state: &crate::store::State,
    task: &Task,
) -> bool {
    let running = state
        .pending_for(task.action_id)
        .is_some_and(|p| p.running_span_id.is_some());
    if running {
        return false;
    }
    let span_id = task.mapping.workflow_span_id;
    blocking(store.clone(), move |s| s.read_span(span_id))
        .await
        .is_ok_and(|span| span.status.is_final())
}
