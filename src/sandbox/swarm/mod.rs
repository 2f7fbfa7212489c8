//! `SwarmSandbox`: agent runs as Docker Swarm `replicated-job` services, placed by the swarm on
//! any node; everything else (gates, hooks, corrective commands, the proxy server) on the local
//! engine.
//!
//! Two engines: the local one (`DOCKER_HOST`), where rover builds images and its proxy server
//! holds the model keys, and a manager of the swarm (`ROVER_SWARM_HOST`, default the local one),
//! on rover's own machine: a run's relay is a container there, attached to the run's internal
//! overlay network (which reaches every node) and handing connections to the proxy's unix
//! socket on this machine's file system. A task on another node reaches the model only through
//! that relay; the key never leaves rover's machine.
//!
//! A task's image is named by the digest rover pushed it under when a registry is configured
//! (`autopilot.sandbox.registry`: the nodes pull it), else by its id (`sha256:…`), which no node
//! ever tries to pull: images are then loaded onto the nodes beforehand (see docs/scale.md).

pub mod images;
pub mod registry;
mod service;
mod settings;
pub mod ship;
mod task;

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::time::Duration;

use async_trait::async_trait;
use bollard::models::{NodeState, Service, ServiceSpecMode, ServiceSpecModeReplicated, Task};
use bollard::query_parameters::{
    ListServicesOptionsBuilder, ListTasksOptionsBuilder, LogsOptionsBuilder,
    UpdateServiceOptionsBuilder,
};
use futures_util::StreamExt;

pub use registry::Registry;
pub use service::{service_spec, ServicePlan, LABEL_STOPPED, LABEL_SWARM};
pub use settings::SwarmSettings;
pub use task::{task_status, Placement};

use super::docker::{bind_mounts, container_env};
use super::error::{status_of, SandboxError};
use super::logcap::CappedLogs;
use super::runnet::{ProxyServer, RunNetwork};
use super::{
    check_env, ContainerInfo, ContainerStatus, DockerSandbox, LogStats, RunConnect, Sandbox,
    SandboxSpec,
};

/// The variable naming the swarm manager's engine (`unix://`, `tcp://`); default `DOCKER_HOST`.
pub const SWARM_HOST_ENV: &str = "ROVER_SWARM_HOST";
/// The variable naming the engines of the nodes rover loads sandbox images onto, separated by
/// commas (`tcp://node2:2376,tcp://node3:2376`); unset: the images must be on the nodes.
pub const NODES_ENV: &str = "ROVER_SWARM_NODES";

/// How often a task's state is looked at while waiting for it.
const POLL: Duration = Duration::from_millis(500);
/// How long a finished task's log stream may still bring lines.
const LOG_GRACE: Duration = Duration::from_secs(2);

/// The local engine for what runs beside rover, a swarm manager for agent runs.
#[derive(Debug, Clone)]
pub struct SwarmSandbox {
    local: DockerSandbox,
    manager: DockerSandbox,
    constraints: Vec<String>,
    /// The nodes' engines rover loads a task's image onto (without a registry), from
    /// [`NODES_ENV`]; none: the images are on the nodes already.
    nodes: Vec<DockerSandbox>,
    /// One load onto the nodes at a time (two runs of one new image load it once).
    loading: std::sync::Arc<tokio::sync::Mutex<()>>,
    /// The registry images are pushed to and the nodes pull from; when set, nothing is loaded
    /// onto the nodes.
    registry: Option<std::sync::Arc<Registry>>,
}

impl SwarmSandbox {
    /// Agent runs go to the swarm whose manager answers at `manager_host`, placed by
    /// `constraints`; the rest runs on `local`. Refuses an engine that is not a swarm manager.
    pub async fn connect(
        local: DockerSandbox,
        manager_host: &str,
        constraints: Vec<String>,
    ) -> Result<Self, SandboxError> {
        let manager = if manager_host == local.host() {
            local.clone()
        } else {
            DockerSandbox::connect_to(manager_host, local.env_allow().to_vec()).await?
        };
        if let Err(e) = manager.client().inspect_swarm().await {
            return Err(SandboxError::Swarm {
                reason: format!(
                    "the engine at {manager_host} is not a swarm manager ({e}); run `docker swarm init` there or point {SWARM_HOST_ENV} at a manager"
                ),
            });
        }
        Ok(Self {
            local,
            manager,
            constraints,
            nodes: Vec::new(),
            loading: std::sync::Arc::default(),
            registry: None,
        })
    }

    /// Pushes each task's image to `registry` before its service is made (a push of an image
    /// the registry holds only checks its layers) and names it in the service by the digest
    /// pushed, which the node that runs the task pulls with the registry's login.
    #[must_use]
    pub fn with_registry(mut self, registry: Registry) -> Self {
        self.registry = Some(std::sync::Arc::new(registry));
        self
    }

    /// Loads each task's image onto the engines at `hosts` (the swarm's nodes, as rover
    /// reaches them) before its service is made, unless a node has it already.
    pub async fn load_images_onto(mut self, hosts: &[String]) -> Result<Self, SandboxError> {
        for host in hosts.iter().map(|h| h.trim()).filter(|h| !h.is_empty()) {
            let node = if host == self.manager.host() {
                self.manager.clone()
            } else {
                DockerSandbox::connect_to(host, self.local.env_allow().to_vec()).await?
            };
            self.nodes.push(node);
        }
        Ok(self)
    }

    /// Puts `image` (its id `id`) on every configured node that lacks it. A node that cannot be
    /// reached is skipped with a warning: the swarm places nothing on a node that is down, and a
    /// task placed on a node without the image fails with the engine's "No such image".
    async fn load_onto_nodes(&self, image: &str, id: &str) -> Result<(), SandboxError> {
        if self.nodes.is_empty() {
            return Ok(());
        }
        let _one = self.loading.lock().await;
        for node in &self.nodes {
            match images::image_id(node, id).await {
                Ok(Some(_)) => continue,
                Ok(None) => {}
                Err(e) => {
                    tracing::warn!(node = node.host(), error = %e, "cannot ask a swarm node for the sandbox image; not loading it there");
                    continue;
                }
            }
            let started = std::time::Instant::now();
            match images::load_image(&self.local, node, image).await {
                Ok(_) => {
                    tracing::info!(node = node.host(), %image, secs = started.elapsed().as_secs_f64(), "loaded the sandbox image onto a swarm node");
                }
                Err(e @ SandboxError::ImageMissing { .. }) => return Err(e),
                Err(e) => {
                    tracing::warn!(node = node.host(), %image, error = %e, "cannot load the sandbox image onto a swarm node");
                }
            }
        }
        Ok(())
    }

    /// Runs rover's proxy server and the runs' relays from the rover binary at `exe` (see
    /// [`DockerSandbox::use_proxy_binary`]).
    pub fn use_proxy_binary(&self, exe: &Path) {
        self.local.use_proxy_binary(exe);
        self.manager.use_proxy_binary(exe);
    }

    /// The local engine.
    pub fn local(&self) -> &DockerSandbox {
        &self.local
    }

    /// The manager's engine.
    pub fn manager(&self) -> &DockerSandbox {
        &self.manager
    }

    /// Agent runs go to the swarm: the spec of one has no name of its own (gates, hooks and
    /// corrective commands are named after their run, and run beside rover).
    fn for_swarm(spec: &SandboxSpec) -> bool {
        spec.name.is_none()
    }

    /// The service named or numbered `id`, if the swarm has one.
    async fn service(&self, id: &str) -> Result<Option<Service>, SandboxError> {
        match self.manager.client().inspect_service(id, None).await {
            Ok(s) => Ok(Some(s)),
            Err(e) if status_of(&e) == Some(404) => Ok(None),
            Err(e) => Err(self.manager.err("inspect service", id, e)),
        }
    }

    async fn tasks(&self, service_id: &str) -> Result<Vec<Task>, SandboxError> {
        let filters = HashMap::from([("service".to_owned(), vec![service_id.to_owned()])]);
        self.manager
            .client()
            .list_tasks(Some(
                ListTasksOptionsBuilder::default().filters(&filters).build(),
            ))
            .await
            .map_err(|e| self.manager.err("list tasks", service_id, e))
    }

    /// The node's state and hostname as the manager sees them.
    async fn node(&self, node_id: &str) -> Option<(NodeState, String)> {
        let node = self.manager.client().inspect_node(node_id).await.ok()?;
        let state = node.status.as_ref().and_then(|s| s.state)?;
        let name = node
            .description
            .and_then(|d| d.hostname)
            .unwrap_or_else(|| node_id.to_owned());
        Some((state, name))
    }

    /// The service's task's state, and the node it is on.
    async fn service_state(
        &self,
        service: &Service,
    ) -> Result<(ContainerStatus, Option<Task>, Option<(NodeState, String)>), SandboxError> {
        let id = service.id.clone().unwrap_or_default();
        let tasks = self.tasks(&id).await?;
        let latest = task::latest(&tasks).cloned();
        let node = match latest.as_ref().and_then(|t| t.node_id.as_deref()) {
            Some(node) => self.node(node).await,
            None => None,
        };
        let stopped = service
            .spec
            .as_ref()
            .and_then(|s| s.labels.as_ref())
            .is_some_and(|l| l.contains_key(LABEL_STOPPED));
        let status = task_status(latest.as_ref(), node.as_ref().map(|(s, _)| *s), stopped);
        Ok((status, latest, node))
    }

    /// Where each of `project`'s services runs (for `status`).
    pub async fn placements(&self, project: &str) -> Result<Vec<Placement>, SandboxError> {
        let mut out = Vec::new();
        for service in self
            .services(&[(super::LABEL_PROJECT.to_owned(), project.to_owned())])
            .await?
        {
            let (_, latest, node) = self.service_state(&service).await?;
            out.push(Placement {
                service: service
                    .spec
                    .as_ref()
                    .and_then(|s| s.name.clone())
                    .unwrap_or_default(),
                node: node.as_ref().map(|(_, name)| name.clone()),
                node_state: node.as_ref().map(|(state, _)| state.to_string()),
                task_state: task::state_word(latest.as_ref()),
                message: latest
                    .as_ref()
                    .and_then(|t| t.status.as_ref())
                    .and_then(|s| s.err.clone().or_else(|| s.message.clone())),
            });
        }
        out.sort_by(|a, b| a.service.cmp(&b.service));
        Ok(out)
    }

    async fn services(&self, labels: &[(String, String)]) -> Result<Vec<Service>, SandboxError> {
        let mut filter: Vec<String> = labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
        filter.push(format!("{LABEL_SWARM}=1"));
        let filters = HashMap::from([("label".to_owned(), filter)]);
        self.manager
            .client()
            .list_services(Some(
                ListServicesOptionsBuilder::default()
                    .filters(&filters)
                    .build(),
            ))
            .await
            .map_err(|e| self.manager.err("list services", "by labels", e))
    }

    async fn start_service(&self, spec: &SandboxSpec) -> Result<String, SandboxError> {
        check_env(&spec.env, self.local.env_allow())?;
        let name = spec.container_name();
        let id = match self.local.client().inspect_image(&spec.image).await {
            Ok(info) => info.id.unwrap_or_else(|| spec.image.clone()),
            Err(e) if status_of(&e) == Some(404) => {
                return Err(SandboxError::ImageMissing {
                    image: spec.image.clone(),
                })
            }
            Err(e) => return Err(self.local.err("inspect image", &spec.image, e)),
        };
        // The image as every node knows it: the digest pushed to the registry, which the node
        // pulls, or its id, which no node tries to pull (loaded onto the nodes, or put there).
        let image = if let Some(registry) = &self.registry {
            registry.publish(&self.local, &spec.image, &id).await?
        } else {
            self.load_onto_nodes(&spec.image, &id).await?;
            id
        };
        let user = DockerSandbox::user(spec).await?;
        let mut plan = ServicePlan {
            image,
            user,
            env: container_env(spec),
            mounts: Vec::new(),
            constraints: self.constraints.clone(),
            command: spec.cmd.clone(),
            labels: Vec::new(),
        };
        if spec.shipped() {
            // Nothing of this machine reaches the node: the workspace goes over the run's
            // network, through rover's proxy (see [`ship`]).
            let Some(proxy_dir) = spec
                .proxy_dir
                .as_deref()
                .filter(|_| service::joins_network(&spec.network))
            else {
                return Err(SandboxError::Unsupported {
                    backend: "swarm",
                    what: "ship a workspace to a task without the run's own network (autopilot.sandbox.egress \"none\" gives it none); use an egress with rover's proxy, or autopilot.sandbox.workspace \"mounted\" on a swarm whose nodes see rover's data dir at the same path",
                });
            };
            let run_as = DockerSandbox::shipped_owner(spec)?;
            let owner = super::ship::Owner {
                uid: run_as.uid,
                gid: run_as.gid,
            };
            let run_dir = ship::run_dir(proxy_dir, &name);
            let shipped = ship::prepare(spec, owner, &run_dir).await?;
            tracing::debug!(service = %name, entries = shipped.entries, bytes = shipped.bytes, "workspace ready for the swarm task");
            plan.mounts = ship::mounts(spec, owner);
            plan.command = ship::wrap(&spec.cmd);
            plan.env.extend(ship::env());
            plan.labels
                .push((ship::LABEL_SHIP.to_owned(), run_dir.display().to_string()));
        } else {
            plan.mounts = bind_mounts(spec)?;
        }
        match self
            .manager
            .client()
            .create_service(
                service_spec(spec, plan),
                self.registry.as_ref().and_then(|r| r.credentials()),
            )
            .await
        {
            Ok(created) => Ok(created.id.unwrap_or(name)),
            Err(e) if status_of(&e) == Some(409) => Err(SandboxError::Conflict { name, source: e }),
            Err(e) => Err(self.manager.err("create service", &name, e)),
        }
    }

    async fn service_logs(
        &self,
        service: &Service,
        path: &Path,
        limit: u64,
    ) -> Result<LogStats, SandboxError> {
        let id = service.id.clone().unwrap_or_default();
        let mut logs = CappedLogs::create(path, limit).await?;
        let options = LogsOptionsBuilder::default()
            .follow(true)
            .stdout(true)
            .stderr(true)
            .build();
        let mut stream = self.manager.client().service_logs(&id, Some(options));
        let mut failed = None;
        let mut killed = false;
        // A service's log stream does not end with its task: it is read until the task has
        // ended and nothing more came for LOG_GRACE.
        let mut ended = false;
        loop {
            let next = tokio::time::timeout(if ended { LOG_GRACE } else { POLL }, stream.next());
            let chunk = match next.await {
                Ok(Some(Ok(chunk))) => chunk,
                Ok(Some(Err(e))) if status_of(&e) == Some(404) => break,
                Ok(Some(Err(e))) => {
                    failed = Some(self.manager.err("follow logs", &id, e));
                    break;
                }
                Ok(None) => break,
                Err(_) if ended => break,
                Err(_) => {
                    ended = !matches!(self.status(&id).await, Ok(ContainerStatus::Running));
                    continue;
                }
            };
            if let Err(e) = logs.write(chunk).await {
                failed = Some(e);
                break;
            }
            if !killed && logs.over_limit() {
                killed = true;
                tracing::warn!(service = %id, limit, "sandbox output passed autopilot.sandbox.logLimitMb; stopping it");
                if let Err(e) = self.kill(&id).await {
                    tracing::warn!(service = %id, error = %e, "cannot stop a sandbox over its log limit");
                }
            }
        }
        logs.finish(failed).await
    }

    /// Removes a run's overlay and relay; the network may keep the endpoint of a task just
    /// removed for a moment, so its removal is tried for up to 10 s.
    async fn close_overlay(&self, run: &str) -> Result<(), SandboxError> {
        let mut last = Ok(());
        for _ in 0..20 {
            last = self.manager.close_run_network(run).await;
            if last.is_ok() {
                return Ok(());
            }
            tokio::time::sleep(POLL).await;
        }
        last
    }
}

#[async_trait]
impl Sandbox for SwarmSandbox {
    fn backend(&self) -> &'static str {
        "swarm"
    }

    async fn ensure_image(&self, image: &str) -> Result<(), SandboxError> {
        self.local.ensure_image(image).await
    }

    async fn run(&self, spec: &SandboxSpec) -> Result<String, SandboxError> {
        if Self::for_swarm(spec) {
            self.start_service(spec).await
        } else {
            self.local.run(spec).await
        }
    }

    async fn status(&self, id: &str) -> Result<ContainerStatus, SandboxError> {
        match self.service(id).await? {
            Some(service) => Ok(self.service_state(&service).await?.0),
            None => self.local.status(id).await,
        }
    }

    async fn wait(&self, id: &str) -> Result<ContainerStatus, SandboxError> {
        if self.service(id).await?.is_none() {
            return self.local.wait(id).await;
        }
        loop {
            let status = self.status(id).await?;
            if !matches!(status, ContainerStatus::Running | ContainerStatus::Created) {
                return Ok(status);
            }
            tokio::time::sleep(POLL).await;
        }
    }

    async fn logs_to_file(
        &self,
        id: &str,
        path: &Path,
        limit: u64,
    ) -> Result<LogStats, SandboxError> {
        match self.service(id).await? {
            Some(service) => self.service_logs(&service, path, limit).await,
            None => self.local.logs_to_file(id, path, limit).await,
        }
    }

    async fn fetch_workspace(
        &self,
        id: &str,
        into: &Path,
        limit: u64,
    ) -> Result<u64, SandboxError> {
        let Some(service) = self.service(id).await? else {
            return self.local.fetch_workspace(id, into, limit).await;
        };
        match ship_dir(&service) {
            Some(run_dir) => ship::fetch(&run_dir, into, limit).await,
            None => Err(SandboxError::Unsupported {
                backend: "swarm",
                what: "take back a workspace that was mounted, not shipped",
            }),
        }
    }

    async fn kill(&self, id: &str) -> Result<(), SandboxError> {
        let Some(service) = self.service(id).await? else {
            return self.local.kill(id).await;
        };
        // Swarm has no kill: the service is scaled to 0 (its stop signal is SIGKILL, with no
        // grace) and labelled as stopped by rover, in one update; it stays, with its task's
        // logs, until it is removed.
        let sid = service.id.clone().unwrap_or_default();
        let mut spec = service.spec.clone().unwrap_or_default();
        if spec
            .labels
            .as_ref()
            .is_some_and(|l| l.contains_key(LABEL_STOPPED))
        {
            return Ok(());
        }
        spec.labels
            .get_or_insert_with(HashMap::new)
            .insert(LABEL_STOPPED.to_owned(), "1".to_owned());
        spec.mode = Some(ServiceSpecMode {
            replicated: Some(ServiceSpecModeReplicated { replicas: Some(0) }),
            ..Default::default()
        });
        let version = service
            .version
            .as_ref()
            .and_then(|v| v.index)
            .and_then(|i| i32::try_from(i).ok())
            .unwrap_or_default();
        match self
            .manager
            .client()
            .update_service(
                &sid,
                spec,
                UpdateServiceOptionsBuilder::default()
                    .version(version)
                    .build(),
                None,
            )
            .await
        {
            Ok(_) => Ok(()),
            Err(e) if status_of(&e) == Some(404) => Ok(()),
            Err(e) => Err(self.manager.err("stop service", &sid, e)),
        }
    }

    async fn remove(&self, id: &str) -> Result<bool, SandboxError> {
        if let Some(run_dir) = self.service(id).await?.as_ref().and_then(ship_dir) {
            ship::forget(&run_dir).await;
        }
        match self.manager.client().delete_service(id).await {
            Ok(()) => Ok(true),
            Err(e) if status_of(&e) == Some(404) => self.local.remove(id).await,
            Err(e) => Err(self.manager.err("remove service", id, e)),
        }
    }

    async fn connect_run(&self, run: &RunConnect) -> Result<String, SandboxError> {
        // The proxy server beside rover, with the keys; the run's relay on the manager, on
        // the run's overlay (the manager's engine shares this machine's file system).
        // A repository of a daemon file: the one server its repositories share.
        let server_image = self.local.own_proxy_image().await?;
        let (server_dir, key) = run.server();
        self.local
            .ensure_proxy(&ProxyServer {
                project: run.server_project(),
                dir: server_dir.clone(),
                image: server_image,
                env: run.server_env.clone(),
            })
            .await?;
        let relay_image = self.manager.own_proxy_image().await?;
        self.manager
            .open_run_network(&RunNetwork {
                run: run.run.clone(),
                project: run.project.clone(),
                internal: run.internal,
                proxy_dir: server_dir,
                key,
                image: relay_image,
                overlay: true,
            })
            .await
    }

    async fn disconnect_run(&self, run: &str) -> Result<(), SandboxError> {
        self.close_overlay(run).await?;
        if self.manager.host() != self.local.host() {
            self.local.close_run_network(run).await?;
        }
        Ok(())
    }

    async fn run_networks(&self, project: &str) -> Result<Vec<String>, SandboxError> {
        let mut runs = self.manager.run_networks(project).await?;
        if self.manager.host() != self.local.host() {
            runs.extend(self.local.run_networks(project).await?);
        }
        runs.sort();
        runs.dedup();
        Ok(runs)
    }

    async fn stop_proxy(&self, dir: &Path) -> Result<(), SandboxError> {
        self.local.stop_proxy(dir).await
    }

    async fn list_by_labels(
        &self,
        labels: &[(String, String)],
    ) -> Result<Vec<ContainerInfo>, SandboxError> {
        let mut found = self.local.list_by_labels(labels).await?;
        for service in self.services(labels).await? {
            let (status, ..) = self.service_state(&service).await?;
            let spec = service.spec.clone().unwrap_or_default();
            found.push(ContainerInfo {
                id: service.id.clone().unwrap_or_default(),
                name: spec.name,
                labels: spec
                    .labels
                    .unwrap_or_default()
                    .into_iter()
                    .collect::<BTreeMap<_, _>>(),
                state: match status {
                    ContainerStatus::Running => "running",
                    ContainerStatus::Created => "created",
                    ContainerStatus::Exited { .. } | ContainerStatus::NodeLost => "exited",
                    ContainerStatus::Gone => "removed",
                }
                .to_owned(),
            });
        }
        Ok(found)
    }
}

/// The run's dir a shipped service's workspace goes through (its [`ship::LABEL_SHIP`]).
fn ship_dir(service: &Service) -> Option<std::path::PathBuf> {
    service
        .spec
        .as_ref()
        .and_then(|s| s.labels.as_ref())
        .and_then(|l| l.get(ship::LABEL_SHIP))
        .map(std::path::PathBuf::from)
}
