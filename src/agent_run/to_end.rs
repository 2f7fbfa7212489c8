//! A run a step waits for (the self-review): started (or taken over after a restart), its
//! output followed into the span's artifacts until it ends, killed past its limit or as soon as
//! its output passes the log limit; then its grant revoked (what the proxy saw comes back),
//! its container removed and its network and files forgotten. Nothing of its workspace comes
//! back: a run that only reads has nothing to give back.

use std::path::Path;
use std::time::Duration;

use uuid::Uuid;

use super::{AgentRunError, AgentRuns, PreparedRun, RecordedSpend, Started, WireLedger};
use crate::sandbox::{self, LogStats, SandboxError};

/// How a run waited for ended.
#[derive(Debug)]
pub struct RanToEnd {
    pub started: Started,
    pub finished: sandbox::Finished,
    pub logs: LogStats,
    /// What rover's proxy saw of it (`None`: no network, or nothing seen).
    pub wire: Option<WireLedger>,
}

impl AgentRuns {
    /// Runs `prepared` to its end, its stdout into `log` (stderr beside it), at most `limit`.
    /// `recorded` gives the budget's recorded spend of a trace, for the live runs' baselines
    /// once this one is forgotten.
    pub async fn run_to_end(
        &self,
        prepared: &PreparedRun,
        log: &Path,
        limit: Duration,
        recorded: impl FnOnce(Uuid) -> Option<RecordedSpend> + Send + 'static,
    ) -> Result<RanToEnd, AgentRunError> {
        let container = prepared.spec.container_name();
        let failed = |source: SandboxError| AgentRunError::Sandbox {
            container: container.clone(),
            source,
        };
        if let Some(dir) = log.parent() {
            tokio::fs::create_dir_all(dir).await.map_err(|source| {
                failed(SandboxError::File {
                    path: dir.to_path_buf(),
                    source,
                })
            })?;
        }
        let started = self.start(prepared).await?;
        // A step cut off while it waits (a cancel, a budget stop, shutdown) leaves no container
        // running and no token working.
        let mut guard = Leftover {
            runs: self.clone(),
            container: Some(container.clone()),
        };
        let sandbox = self.sandbox.as_ref();
        let (logs, finished) = tokio::join!(
            sandbox.logs_to_file(&container, log, prepared.spec.limits.log_bytes),
            sandbox::wait_or_kill(sandbox, &container, limit),
        );
        // The token stops working now, whatever happened.
        let wire = self.end(&container).await;
        let removed = sandbox.remove(&container).await;
        self.forget(&container, recorded).await;
        guard.container = None;
        let (logs, finished) = (logs.map_err(failed)?, finished.map_err(failed)?);
        removed.map_err(failed)?;
        Ok(RanToEnd {
            started,
            finished,
            logs,
            wire,
        })
    }
}

/// A run whose wait was cut off: its grant revoked, its container removed and its network and
/// files forgotten, in a task of their own (the waiting future is gone).
struct Leftover {
    runs: AgentRuns,
    container: Option<String>,
}

impl Drop for Leftover {
    fn drop(&mut self) {
        let Some(container) = self.container.take() else {
            return;
        };
        let runs = self.runs.clone();
        let Ok(handle) = tokio::runtime::Handle::try_current() else {
            tracing::warn!(run = %container, "a cut-off run cannot be removed here; the next start's sweep removes it");
            return;
        };
        handle.spawn(async move {
            let _ = runs.end(&container).await;
            if let Err(e) = runs.sandbox.remove(&container).await {
                tracing::warn!(run = %container, error = %e, "cannot remove a cut-off run's container; the next start's sweep removes it");
            }
            runs.forget(&container, |_| None).await;
        });
    }
}
