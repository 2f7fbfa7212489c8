//! Docker sandboxes in which workflow agents run, behind a narrow trait.
//!
//! The steps talk to [`Sandbox`], the backend seam made by [`connect`] from
//! `autopilot.sandbox.backend`; [`DockerSandbox`] implements it with bollard for the local
//! engine. Images are built locally without a registry ([`image`]); the worktree is shipped into
//! containers ([`ship`]) and what comes back is checked before it is applied ([`returned`]), or
//! mounted; verification gates run in the same image over it ([`gates`]), so project code never
//! runs on the host.

mod docker;
mod docker_ship;
pub mod egress;
mod env;
mod environment_settings;
mod error;
pub mod gates;
pub mod hooks;
pub mod image;
pub mod leftovers;
pub mod logcap;
pub mod own_image;
pub mod returned;
pub mod runnet;
mod settings;
pub mod ship;
mod spec;
pub mod swarm;

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

use crate::host_env::HostEnv;

pub use docker::{docker_host, DockerSandbox, DOCKER_HOST_ENV};
pub use egress::{Egress, EgressMode};
pub use env::{build_env, check_env, ALWAYS_REFUSED_ENV, BUILD_ENV};
pub use environment_settings::EnvironmentSettings;
pub use error::SandboxError;
pub use own_image::{ImageBuildSettings, OwnImage};
pub use settings::{
    GateSettings, SandboxBackend, SandboxSettings, WorkspaceMode, MODEL_ENV_REFUSED,
};
pub use spec::{
    BindMount, ResourceLimits, SandboxLabels, SandboxSpec, DNS_SINK, INPUT_MOUNT, LABEL_ACTION,
    LABEL_ENV_BUILD, LABEL_PROJECT, LABEL_TRACE, WORKSPACE_MOUNT,
};
pub use swarm::{SwarmSandbox, SWARM_HOST_ENV};

/// Where a container is in its life, as far as the workflow step cares.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase", tag = "state")]
pub enum ContainerStatus {
    /// Created but never started (a crash between create and start).
    Created,
    /// Running (also paused or restarting).
    Running,
    /// Finished; `137` after a kill (timeout or OOM).
    Exited { code: i64, oom_killed: bool },
    /// No such container any more.
    Gone,
    /// The node that ran it (a swarm backend) went away mid-run: its engine stopped answering
    /// the swarm's manager, so the run's outcome is lost (see [`swarm`]).
    NodeLost,
}

/// A container found by its labels.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ContainerInfo {
    pub id: String,
    pub name: Option<String>,
    pub labels: BTreeMap<String, String>,
    /// The engine's state word: `created`, `running`, `exited`, ...
    pub state: String,
}

/// How much each output stream of a container carried, and how much of it rover cut.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LogStats {
    pub stdout_bytes: u64,
    pub stderr_bytes: u64,
    /// Bytes cut from the middle of stdout (it passed the limit); 0 when its file holds it all.
    #[serde(default)]
    pub stdout_cut: u64,
    #[serde(default)]
    pub stderr_cut: u64,
    /// The most bytes of one stream kept (`autopilot.sandbox.logLimitMb`).
    #[serde(default)]
    pub limit_bytes: u64,
}

impl LogStats {
    /// A stream passed the limit: the container was stopped and its output cut.
    pub fn over_limit(&self) -> bool {
        self.stdout_cut > 0 || self.stderr_cut > 0
    }

    /// For people, when a stream passed the limit: what `who` printed, the limit, and what of
    /// it rover kept in which file (`log` for stdout, its `.stderr` file for stderr); e.g. "the
    /// sandbox printed more than 8 MiB to stdout (limit autopilot.sandbox.logLimitMb = 8); rover
    /// kept the first 4 MiB and the last 2.5 MiB of it in agent.log".
    pub fn over_limit_summary(&self, who: &str, log: &Path) -> Option<String> {
        let err_log = stderr_path(log);
        let file = |p: &Path| {
            p.file_name()
                .map_or_else(String::new, |n| n.to_string_lossy().into_owned())
        };
        let head = self.limit_bytes / 2;
        let over: Vec<(&str, u64, u64, String)> = [
            ("stdout", self.stdout_bytes, self.stdout_cut, file(log)),
            ("stderr", self.stderr_bytes, self.stderr_cut, file(&err_log)),
        ]
        .into_iter()
        .filter(|(_, _, cut, _)| *cut > 0)
        .collect();
        if over.is_empty() {
            return None;
        }
        let streams: Vec<&str> = over.iter().map(|(name, ..)| *name).collect();
        let kept: Vec<String> = over
            .iter()
            .map(|(name, seen, cut, file)| {
                let tail = seen.saturating_sub(*cut).saturating_sub(head);
                let of = if over.len() == 1 { "it" } else { name };
                format!(
                    "the first {} and the last {} of {of} in {file}",
                    mib(head),
                    mib(tail)
                )
            })
            .collect();
        Some(format!(
            "{who} printed more than {} to {} (limit autopilot.sandbox.logLimitMb = {}); rover kept {}",
            mib(self.limit_bytes),
            streams.join(" and "),
            self.limit_bytes / (1024 * 1024),
            kept.join(", ")
        ))
    }
}

/// `bytes` in MiB for people: `8 MiB`, `2.5 MiB`.
fn mib(bytes: u64) -> String {
    const MIB: u64 = 1024 * 1024;
    if bytes.is_multiple_of(MIB) {
        format!("{} MiB", bytes / MIB)
    } else {
        #[allow(
            clippy::cast_precision_loss,
            reason = "a figure for people, one decimal"
        )]
        let value = bytes as f64 / MIB as f64;
        format!("{value:.1} MiB")
    }
}

/// What an agent run's network needs.
#[derive(Debug, Clone)]
pub struct RunConnect {
    /// The agent container's name.
    pub run: String,
    pub project: String,
    /// No route out (every egress but `open`).
    pub internal: bool,
    /// `<store>/proxy`.
    pub proxy_dir: std::path::PathBuf,
    /// The proxy server the repositories of a daemon file share, and this store's key in it;
    /// none: the store's own server, at `proxy_dir`.
    pub shared_server: Option<runnet::SharedServer>,
    /// The proxy server's environment: upstreams and model keys.
    pub server_env: Vec<(String, String)>,
}

impl RunConnect {
    /// The proxy server the run goes through (its dir) and the key its relay names.
    pub fn server(&self) -> (std::path::PathBuf, Option<String>) {
        match &self.shared_server {
            Some(shared) => (shared.dir.clone(), Some(shared.key.clone())),
            None => (self.proxy_dir.clone(), None),
        }
    }

    /// The project label of the run's proxy server: the store's, or
    /// [`runnet::SHARED_SERVER_PROJECT`] for a server the repositories of a daemon file share.
    pub fn server_project(&self) -> String {
        match &self.shared_server {
            Some(_) => runnet::SHARED_SERVER_PROJECT.to_owned(),
            None => self.project.clone(),
        }
    }
}

/// How a bounded wait ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Finished {
    pub status: ContainerStatus,
    /// The wall-clock limit was hit and the container was killed.
    pub timed_out: bool,
}

/// The sandbox backend seam: what the steps need from a container engine to run one task's
/// container and get its result. One container per workflow action (gates, hooks and
/// corrective commands get their own). The steps hold a `dyn Sandbox` made by [`connect`]
/// from `autopilot.sandbox.backend` and never know which backend runs them.
///
/// A backend implements the required methods: [`Sandbox::ensure_image`], [`Sandbox::run`] (it
/// must honour [`SandboxSpec::workspace`]: with [`WorkspaceMode::Shipped`] no host path is
/// mounted; the worktree and the spec's other host paths are copied in before the command
/// starts, see [`SandboxSpec::workspace`]), [`Sandbox::status`], [`Sandbox::wait`],
/// [`Sandbox::logs_to_file`], [`Sandbox::kill`], [`Sandbox::remove`],
/// [`Sandbox::list_by_labels`]; and, to take a shipped workspace back,
/// [`Sandbox::fetch_workspace`] (the tar of `/workspace`; rover checks it and applies it to the
/// worktree). The network methods ([`Sandbox::connect_run`] and the three after it) have
/// defaults for a backend without rover's proxy. Ids are whatever the backend names a
/// container by (a name given in the spec must find it too).
#[async_trait]
pub trait Sandbox: Send + Sync {
    /// The backend's name as `autopilot.sandbox.backend` spells it (`local`, `swarm`).
    fn backend(&self) -> &'static str {
        "local"
    }

    /// Checks that `image` is present locally (it is never pulled); [`SandboxError::ImageMissing`] if not.
    async fn ensure_image(&self, image: &str) -> Result<(), SandboxError>;

    /// Creates and starts a container for `spec`; returns its id. A container with the same
    /// name (derived from the action label) is a [`SandboxError::Conflict`]: never two per action.
    async fn run(&self, spec: &SandboxSpec) -> Result<String, SandboxError>;

    /// The container's state now.
    async fn status(&self, id: &str) -> Result<ContainerStatus, SandboxError>;

    /// Waits until the container exits (or is gone) and returns its final state.
    async fn wait(&self, id: &str) -> Result<ContainerStatus, SandboxError>;

    /// Follows the container's output until it exits: stdout to `path`, stderr to `path` with
    /// `.stderr` appended to its file name. Files are created or truncated. Each stream keeps
    /// at most `limit` bytes on disk (its head and its tail, a line saying what was cut between:
    /// see [`logcap`]); a container whose output passes `limit` is killed as soon as that is
    /// seen, since the rest would only be cut.
    async fn logs_to_file(
        &self,
        id: &str,
        path: &Path,
        limit: u64,
    ) -> Result<LogStats, SandboxError>;

    /// Writes the tar of the exited container's `/workspace` to `into` (created or truncated),
    /// as the engine sends it: entries named `workspace/...`. Stops with
    /// [`SandboxError::Returned`] as soon as more than `limit` bytes came; returns the bytes
    /// written. Only for a spec with [`WorkspaceMode::Shipped`]; the container must not be
    /// removed before. The archive is untrusted: rover checks every entry.
    async fn fetch_workspace(
        &self,
        id: &str,
        _into: &Path,
        _limit: u64,
    ) -> Result<u64, SandboxError> {
        let _ = id;
        Err(SandboxError::Unsupported {
            backend: self.backend(),
            what: "take a workspace back from a container",
        })
    }

    /// Kills the container (SIGKILL); fine when it is not running or already gone.
    async fn kill(&self, id: &str) -> Result<(), SandboxError>;

    /// Removes the container (forced); `true` if it existed, `false` if it was already gone.
    async fn remove(&self, id: &str) -> Result<bool, SandboxError>;

    /// Makes an agent run's network (see [`runnet`]): rover's proxy server up, the run's
    /// network and relay made. Returns the network the agent container joins.
    async fn connect_run(&self, run: &RunConnect) -> Result<String, SandboxError> {
        Err(SandboxError::Proxy {
            reason: format!(
                "this sandbox cannot make a network for {}; use the Docker engine",
                run.run
            ),
        })
    }

    /// Removes a run's relay and network, once its agent container is gone; fine when they
    /// are gone already.
    async fn disconnect_run(&self, _run: &str) -> Result<(), SandboxError> {
        Ok(())
    }

    /// The agent runs of `project` that have a relay or a network.
    async fn run_networks(&self, _project: &str) -> Result<Vec<String>, SandboxError> {
        Ok(Vec::new())
    }

    /// Stops rover's proxy server of the proxy dir `dir` (when no run needs it).
    async fn stop_proxy(&self, _dir: &Path) -> Result<(), SandboxError> {
        Ok(())
    }

    /// Every container (running or not) carrying all of `labels`.
    async fn list_by_labels(
        &self,
        labels: &[(String, String)],
    ) -> Result<Vec<ContainerInfo>, SandboxError>;
}

/// The backend `settings.backend` names, connected: the local Docker engine (at `DOCKER_HOST`,
/// or the local socket), or a swarm whose manager answers at `ROVER_SWARM_HOST` (default
/// `DOCKER_HOST`); [`SandboxError::Swarm`] when that engine is no swarm manager. `own`: rover's
/// own image, which the local engine builds on first use. The variables are `host`'s.
pub async fn connect(
    settings: &SandboxSettings,
    own: Option<Arc<OwnImage>>,
    host: &HostEnv,
) -> Result<Arc<dyn Sandbox>, SandboxError> {
    let local = DockerSandbox::connect(settings.env_allow.clone(), host).await?;
    if let Some(own) = own {
        local.use_own_image(own);
    }
    match settings.backend {
        SandboxBackend::Local => {
            if let Some(registry) = &settings.registry {
                tracing::warn!(%registry, "autopilot.sandbox.registry is set, but the local backend runs images where they are built and does not use it");
            }
            Ok(Arc::new(local))
        }
        SandboxBackend::Swarm => {
            let manager = docker_host(
                host.non_empty(SWARM_HOST_ENV)
                    .or_else(|| host.var(DOCKER_HOST_ENV)),
            );
            let nodes: Vec<String> = host
                .var(swarm::NODES_ENV)
                .unwrap_or_default()
                .split(',')
                .map(str::to_owned)
                .collect();
            let swarm =
                SwarmSandbox::connect(local, &manager, settings.swarm.constraints.clone()).await?;
            let swarm = match &settings.registry {
                Some(prefix) => {
                    if nodes.iter().any(|n| !n.trim().is_empty()) {
                        tracing::warn!(registry = %prefix, "{} is set but so is autopilot.sandbox.registry: the nodes pull from the registry and nothing is loaded onto them", swarm::NODES_ENV);
                    }
                    swarm.with_registry(swarm::Registry::from_env(prefix, host)?)
                }
                None => swarm.load_images_onto(&nodes).await?,
            };
            Ok(Arc::new(swarm))
        }
    }
}

/// Waits for a container at most `limit`; past it, kills the container and waits for the kill.
pub async fn wait_or_kill(
    sandbox: &dyn Sandbox,
    id: &str,
    limit: Duration,
) -> Result<Finished, SandboxError> {
    if let Ok(status) = tokio::time::timeout(limit, sandbox.wait(id)).await {
        return Ok(Finished {
            status: status?,
            timed_out: false,
        });
    }
    tracing::warn!(
        container = id,
        ?limit,
        "sandbox exceeded its wall-clock limit; killing it"
    );
    sandbox.kill(id).await?;
    Ok(Finished {
        status: sandbox.wait(id).await?,
        timed_out: true,
    })
}

/// The stderr log path that goes with a stdout log path.
pub fn stderr_path(stdout_path: &Path) -> std::path::PathBuf {
    let mut name = stdout_path
        .file_name()
        .map(std::ffi::OsStr::to_os_string)
        .unwrap_or_default();
    name.push(".stderr");
    stdout_path.with_file_name(name)
}
