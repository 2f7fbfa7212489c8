//! Runs a step starts and leaves (the workflow's coding agent), then comes back to: each look
//! follows the run's log into its file, stops a run past its wall-clock limit or stuck (no
//! output, no changed file), and says whether it still runs or how it ended. Once the step has
//! read an ended run, its log is taken (the follower's copy, or the engine's read now) and, when
//! the step's record of it is final, the run is released: its container removed, its network
//! and files forgotten. What is watched between looks is kept in a [`RunWatch`] the step holds.

use std::path::Path;
use std::time::Duration;

use uuid::Uuid;

use super::watch::{newest_change, OnEnd, RunWatch};
use super::{AgentRunError, AgentRuns, PreparedRun, RecordedSpend, Started};
use crate::sandbox::{self, ContainerStatus, LogStats, SandboxError};

/// How long taking an ended run's log waits for its follower to read what is left and put its
/// files together.
const FOLLOWER_GRACE: Duration = Duration::from_secs(30);

/// The most entries of a worktree walked to find its newest change.
const WORKTREE_WALK: usize = 50_000;

/// A detached run as a look sees it.
#[derive(Clone, Copy)]
pub struct DetachedRun<'a> {
    /// The key of its watch (the action it runs for).
    pub id: Uuid,
    pub container: &'a str,
    /// The file its stdout is followed into (stderr beside it, see [`sandbox::stderr_path`]).
    pub log: &'a Path,
    /// The most bytes kept of each output stream; a run whose output passes it is stopped.
    pub log_bytes: u64,
    /// How long it has run.
    pub elapsed: Duration,
    /// Its wall-clock limit: past it, the run is stopped.
    pub limit: Duration,
    /// Stopped as stuck after this long with no output and no changed file (`None`: never).
    pub stuck_after: Option<Duration>,
    /// The worktree whose changes count as the run's activity.
    pub worktree: Option<&'a Path>,
    /// Called when the run's container ends (its log follower sees it end).
    pub on_end: Option<&'a OnEnd>,
}

/// What a look found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Look {
    /// It runs within its limits, or could not be stopped yet: look again later.
    Running,
    /// The engine did not answer, and the run is past its limit: it is given up as unreachable.
    Unreachable { error: String },
    /// It ended (or was stopped now): how.
    Ended {
        status: ContainerStatus,
        /// Stopped at its wall-clock limit.
        timed_out: bool,
        /// Stopped as stuck.
        stuck: bool,
    },
}

/// A run's log that could not be kept.
#[derive(Debug, thiserror::Error)]
pub enum LogNotKept {
    #[error("cannot read the container's logs: {0}")]
    Unread(#[source] SandboxError),
    /// Read whole, but not made durable on disk.
    #[error("cannot make the container's logs durable: {error}")]
    NotDurable {
        stats: LogStats,
        #[source]
        error: std::io::Error,
    },
}

impl AgentRuns {
    /// Looks at detached `run`: follows its log, stops it when it is stuck or past its limit,
    /// and says whether it still runs.
    pub async fn look(&self, watch: &RunWatch, run: &DetachedRun<'_>) -> Look {
        let container = run.container;
        let mut status = match self.sandbox.status(container).await {
            Ok(status) => status,
            Err(e) => {
                tracing::warn!(container, error = %e, "cannot check a detached run's container");
                // Past its limit and still no engine: given up rather than waited for forever.
                return if run.elapsed < run.limit {
                    Look::Running
                } else {
                    Look::Unreachable {
                        error: e.to_string(),
                    }
                };
            }
        };
        let mut stuck = false;
        if matches!(status, ContainerStatus::Running | ContainerStatus::Created) {
            self.follow(
                watch,
                run.id,
                container,
                (run.log, run.log_bytes),
                run.on_end.cloned(),
            );
            if let Some(idle) = self.idle_past(watch, run).await {
                tracing::warn!(
                    container,
                    idle_secs = idle.as_secs(),
                    "the agent is stuck; stopping it"
                );
                let Some(stopped) = self.kill_and_wait(container).await else {
                    return Look::Running;
                };
                status = stopped;
                stuck = true;
            }
        }
        if matches!(status, ContainerStatus::Exited { .. }) {
            // `wait` on an exited container answers at once and looks again for a late OOM flag.
            status = self.sandbox.wait(container).await.unwrap_or(status);
        }
        let mut timed_out = false;
        if matches!(status, ContainerStatus::Running | ContainerStatus::Created) {
            if run.elapsed < run.limit {
                return Look::Running;
            }
            tracing::warn!(container, limit = ?run.limit, "a detached run exceeded its limit; killing it");
            let Some(stopped) = self.kill_and_wait(container).await else {
                return Look::Running;
            };
            status = stopped;
            timed_out = true;
        }
        Look::Ended {
            status,
            timed_out,
            stuck,
        }
    }

    /// Kills `container` and waits for it; `None` when the kill failed (tried again at the
    /// next look).
    async fn kill_and_wait(&self, container: &str) -> Option<ContainerStatus> {
        if let Err(e) = self.sandbox.kill(container).await {
            tracing::warn!(container, error = %e, "cannot kill a detached run's container");
            return None;
        }
        Some(
            self.sandbox
                .wait(container)
                .await
                .unwrap_or(ContainerStatus::Gone),
        )
    }

    /// Starts `prepared` (or takes over its container, see [`AgentRuns::start`]) and leaves
    /// it running as detached run `id`, its log followed into `log` from the start (a run that
    /// floods it is stopped at once); `on_end` is called when its container ends.
    pub async fn start_detached(
        &self,
        watch: &RunWatch,
        prepared: &PreparedRun,
        (id, log, log_bytes): (Uuid, &Path, u64),
        on_end: Option<OnEnd>,
    ) -> Result<Started, AgentRunError> {
        let started = self.start(prepared).await?;
        let container = prepared.spec.container_name();
        self.follow(watch, id, &container, (log, log_bytes), on_end);
        Ok(started)
    }

    /// Starts the follower of run `id`'s log unless one runs (or saw the log whole). It writes
    /// the log into its file as it comes, capped, and the capture stops a container whose
    /// output passes the limit at once; [`AgentRuns::take_log`] takes its file when it saw the
    /// container to its end.
    fn follow(
        &self,
        watch: &RunWatch,
        id: Uuid,
        container: &str,
        (log, log_bytes): (&Path, u64),
        on_end: Option<OnEnd>,
    ) {
        let sandbox = self.sandbox.clone();
        let container = container.to_owned();
        let path = log.to_path_buf();
        let limit = log_bytes;
        watch.follow(
            id,
            async move {
                if let Some(dir) = path.parent() {
                    tokio::fs::create_dir_all(dir).await.ok()?;
                }
                let stats = sandbox.logs_to_file(&container, &path, limit).await.ok()?;
                // A stream that broke off while the container still runs is not its whole log.
                let ended = tokio::time::timeout(Duration::from_secs(10), sandbox.wait(&container));
                matches!(
                    ended.await,
                    Ok(Ok(ContainerStatus::Exited { .. } | ContainerStatus::Gone))
                )
                .then_some(stats)
            },
            on_end,
        );
    }

    /// How long `run` has shown no activity (log output, a changed file in its worktree), when
    /// that is past its `stuck_after`.
    async fn idle_past(&self, watch: &RunWatch, run: &DetachedRun<'_>) -> Option<Duration> {
        let after = run.stuck_after?;
        // Its size on disk is the output seen so far (the tail files change past the head).
        let log_bytes = sandbox::logcap::bytes_on_disk(run.log).await
            + sandbox::logcap::bytes_on_disk(&sandbox::stderr_path(run.log)).await;
        let newest = match run.worktree.map(Path::to_path_buf) {
            Some(dir) => tokio::task::spawn_blocking(move || newest_change(&dir, WORKTREE_WALK))
                .await
                .ok()
                .flatten(),
            None => None,
        };
        let idle = watch.observe(run.id, log_bytes, newest);
        (idle >= after).then_some(idle)
    }

    /// The log of run `id` (container `container`) kept in `log`, made durable: its follower's
    /// copy when it saw the container to its end, else the engine's, read now (at most
    /// `log_bytes` of each stream).
    pub async fn take_log(
        &self,
        watch: &RunWatch,
        id: Uuid,
        container: &str,
        log: &Path,
        log_bytes: u64,
    ) -> Result<LogStats, LogNotKept> {
        if let Some(dir) = log.parent() {
            tokio::fs::create_dir_all(dir).await.map_err(|source| {
                LogNotKept::Unread(SandboxError::File {
                    path: dir.to_path_buf(),
                    source,
                })
            })?;
        }
        let stats = match watch.finish_following(id, FOLLOWER_GRACE).await {
            Some(stats) => stats,
            None => self
                .sandbox
                .logs_to_file(container, log, log_bytes)
                .await
                .map_err(LogNotKept::Unread)?,
        };
        sync_files(&[log.to_path_buf(), sandbox::stderr_path(log)])
            .await
            .map_err(|error| LogNotKept::NotDurable { stats, error })?;
        Ok(stats)
    }

    /// Stops a detached run's container (its trace was stopped); its log is still to take.
    pub async fn stop(&self, container: &str) -> Result<(), AgentRunError> {
        self.sandbox
            .kill(container)
            .await
            .map_err(|source| AgentRunError::Sandbox {
                container: container.to_owned(),
                source,
            })
    }

    /// Whether `container` still holds a run's work: it runs, it exited (its result is still to
    /// read, never a second run), or it was lost with its swarm node (read as lost). One created
    /// but never started holds nothing.
    pub async fn holds_work(&self, container: &str) -> bool {
        matches!(
            self.sandbox.status(container).await,
            Ok(ContainerStatus::Running
                | ContainerStatus::Exited { .. }
                | ContainerStatus::NodeLost)
        )
    }

    /// Releases a run whose record is final: its container removed, then its network and files
    /// forgotten. `recorded` gives the budget's recorded spend of a trace, as for
    /// [`AgentRuns::forget`].
    pub async fn release(
        &self,
        container: &str,
        recorded: impl FnOnce(Uuid) -> Option<RecordedSpend> + Send + 'static,
    ) -> Result<(), AgentRunError> {
        self.sandbox
            .remove(container)
            .await
            .map_err(|source| AgentRunError::Sandbox {
                container: container.to_owned(),
                source,
            })?;
        self.forget(container, recorded).await;
        Ok(())
    }
}

/// Makes `paths` and their directories durable on disk.
async fn sync_files(paths: &[std::path::PathBuf]) -> std::io::Result<()> {
    let paths = paths.to_vec();
    tokio::task::spawn_blocking(move || {
        for path in &paths {
            std::fs::File::open(path)?.sync_all()?;
        }
        let mut dirs: Vec<&Path> = paths.iter().filter_map(|p| p.parent()).collect();
        dirs.dedup();
        for dir in dirs {
            std::fs::File::open(dir)?.sync_all()?;
        }
        Ok(())
    })
    .await
    .map_err(std::io::Error::other)?
}
