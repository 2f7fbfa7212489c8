//! `DockerSandbox`: the [`Sandbox`] trait over a Docker engine through bollard.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use async_trait::async_trait;
use bollard::models::{
    ContainerCreateBody, ContainerStateStatusEnum, HostConfig, HostConfigLogConfig, Mount,
    MountType, ResourcesUlimits,
};
use bollard::query_parameters::{
    CreateContainerOptionsBuilder, InspectContainerOptions, KillContainerOptionsBuilder,
    ListContainersOptionsBuilder, LogsOptionsBuilder, RemoveContainerOptionsBuilder,
    StartContainerOptions, WaitContainerOptions,
};
use bollard::Docker;
use futures_util::StreamExt;

use super::env::check_env;
use super::error::{status_of, SandboxError};
use super::logcap::CappedLogs;
use super::runnet::{ProxyServer, RunNetwork};
use super::spec::{SandboxSpec, INPUT_MOUNT, WORKSPACE_MOUNT};
use super::{ContainerInfo, ContainerStatus, LogStats, RunConnect, Sandbox};
use crate::git::owner;
use crate::host_env::HostEnv;

/// The variable naming the engine to use (`unix://`, `tcp://`, `http://`); default the local socket.
pub const DOCKER_HOST_ENV: &str = "DOCKER_HOST";

const DEFAULT_HOST: &str = "unix:///var/run/docker.sock";

/// The engine address: the value of `DOCKER_HOST` when set and not empty, else the local socket.
pub fn docker_host(from_env: Option<String>) -> String {
    from_env
        .filter(|h| !h.trim().is_empty())
        .unwrap_or_else(|| DEFAULT_HOST.to_string())
}

/// A Docker engine, with the env allow-list that guards what enters its containers.
#[derive(Debug, Clone)]
pub struct DockerSandbox {
    docker: Docker,
    host: String,
    env_allow: Vec<String>,
    /// The engine refused `--storage-opt size` once: not asked again.
    no_storage_opt: Arc<AtomicBool>,
    /// The image of this process's binary, once known (hashing it costs a read of the binary).
    proxy_image: Arc<tokio::sync::OnceCell<String>>,
    /// The rover binary the proxy and relay containers run, when not this process's own.
    proxy_exe: Arc<std::sync::OnceLock<std::path::PathBuf>>,
    /// rover's own sandbox image, built on first use (see [`DockerSandbox::use_own_image`]).
    own_image: Arc<std::sync::OnceLock<Arc<super::OwnImage>>>,
}

impl DockerSandbox {
    /// Connects to the engine named by `DOCKER_HOST` in rover's environment (`env`; else the
    /// local socket) and negotiates the API version; [`SandboxError::DaemonUnreachable`] when
    /// it does not answer.
    pub async fn connect(env_allow: Vec<String>, env: &HostEnv) -> Result<Self, SandboxError> {
        let host = docker_host(env.var(DOCKER_HOST_ENV));
        Self::connect_to(&host, env_allow).await
    }

    /// Connects to the engine at `host` (`unix:///path`, `tcp://host:port`, `http://...`).
    pub async fn connect_to(host: &str, env_allow: Vec<String>) -> Result<Self, SandboxError> {
        let unreachable = |source| SandboxError::DaemonUnreachable {
            host: host.to_string(),
            source,
        };
        let docker = Docker::connect_with_host(host).map_err(unreachable)?;
        let docker = docker.negotiate_version().await.map_err(unreachable)?;
        docker.ping().await.map_err(unreachable)?;
        Ok(Self {
            docker,
            host: host.to_string(),
            env_allow,
            no_storage_opt: Arc::new(AtomicBool::new(false)),
            proxy_image: Arc::new(tokio::sync::OnceCell::new()),
            proxy_exe: Arc::new(std::sync::OnceLock::new()),
            own_image: Arc::new(std::sync::OnceLock::new()),
        })
    }

    /// The bollard client, for image building and tests.
    pub fn client(&self) -> &Docker {
        &self.docker
    }

    /// The names that may be passed into a sandbox.
    pub fn env_allow(&self) -> &[String] {
        &self.env_allow
    }

    /// The image of this process's binary on this engine, imported once (see
    /// [`DockerSandbox::proxy_image`]); again when it was removed since.
    pub(crate) async fn own_proxy_image(&self) -> Result<String, SandboxError> {
        let image = self
            .proxy_image
            .get_or_try_init(|| self.proxy_image())
            .await?
            .clone();
        if self.image_exists(&image).await? {
            Ok(image)
        } else {
            self.proxy_image().await
        }
    }

    /// Runs rover's proxy server and relays from the rover binary at `exe` instead of this
    /// process's own (for a program that embeds rover's library, such as its tests); set before
    /// the first run's network, once.
    pub fn use_proxy_binary(&self, exe: &Path) {
        let _ = self.proxy_exe.set(exe.to_owned());
    }

    /// Builds `own` (rover's own sandbox image) when [`Sandbox::ensure_image`] asks for it and
    /// it is not there; set once, before the first run.
    pub fn use_own_image(&self, own: Arc<super::OwnImage>) {
        let _ = self.own_image.set(own);
    }

    /// The binary set by [`DockerSandbox::use_proxy_binary`].
    pub(crate) fn proxy_exe(&self) -> Option<&Path> {
        self.proxy_exe.get().map(std::path::PathBuf::as_path)
    }

    /// The engine address in use.
    pub fn host(&self) -> &str {
        &self.host
    }

    pub(crate) fn err(
        &self,
        operation: &'static str,
        target: &str,
        source: bollard::errors::Error,
    ) -> SandboxError {
        SandboxError::from_bollard(operation, target, &self.host, source)
    }

    /// Whether an image (`name:tag` or id) is present locally.
    pub async fn image_exists(&self, image: &str) -> Result<bool, SandboxError> {
        match self.docker.inspect_image(image).await {
            Ok(_) => Ok(true),
            Err(e) if status_of(&e) == Some(404) => Ok(false),
            Err(e) => Err(self.err("inspect image", image, e)),
        }
    }

    /// The user a container runs as: the spec's, else never root (see [`crate::git::owner`]):
    /// a root-owned worktree, and the read-write mounts with it, are handed to the sandbox user.
    pub(crate) async fn user(spec: &SandboxSpec) -> Result<String, SandboxError> {
        if let Some(user) = &spec.user {
            return Ok(user.clone());
        }
        if spec.shipped() {
            // Nothing of the host is mounted: the shipped copy is the user's, the worktree stays
            // as it is.
            return Ok(Self::shipped_owner(spec)?.user());
        }
        let worktree = spec.worktree.clone();
        let writable: Vec<std::path::PathBuf> = spec
            .extra_mounts
            .iter()
            .filter(|m| !m.read_only)
            .map(|m| m.host.clone())
            .collect();
        let handed = tokio::task::spawn_blocking(move || {
            let mount_err = |path: &Path| {
                let path = path.to_path_buf();
                move |source| SandboxError::Mount { path, source }
            };
            let run_as = owner::run_as(&worktree).map_err(mount_err(&worktree))?;
            owner::hand_over(&worktree, run_as).map_err(mount_err(&worktree))?;
            if run_as.hand_over {
                for dir in &writable {
                    owner::chown_tree(dir, run_as.uid, run_as.gid, &[]).map_err(mount_err(dir))?;
                }
            }
            Ok::<_, SandboxError>(run_as.user())
        })
        .await;
        handed.map_err(|e| SandboxError::Mount {
            path: spec.worktree.clone(),
            source: std::io::Error::other(e),
        })?
    }

    fn create_body(
        &self,
        spec: &SandboxSpec,
        user: String,
    ) -> Result<ContainerCreateBody, SandboxError> {
        check_env(&spec.env, &self.env_allow)?;
        std::fs::metadata(&spec.worktree).map_err(|source| SandboxError::Mount {
            path: spec.worktree.clone(),
            source,
        })?;
        let mounts = if spec.shipped() {
            Self::shipped_mounts(spec)
        } else {
            Self::bind_mounts(spec)?
        };
        Ok(Self::body_with(
            spec,
            user,
            mounts,
            self.no_storage_opt.load(Ordering::Relaxed),
        ))
    }

    /// The bind mounts of a mounted spec (see [`bind_mounts`]).
    fn bind_mounts(spec: &SandboxSpec) -> Result<Vec<Mount>, SandboxError> {
        bind_mounts(spec)
    }

    fn body_with(
        spec: &SandboxSpec,
        user: String,
        mounts: Vec<Mount>,
        no_storage_opt: bool,
    ) -> ContainerCreateBody {
        let env = container_env(spec);
        #[allow(
            clippy::cast_possible_truncation,
            reason = "cpus is small and positive"
        )]
        let nano_cpus = (spec.limits.cpus * 1e9) as i64;
        let host_config = HostConfig {
            mounts: Some(mounts),
            network_mode: Some(spec.network.clone()),
            dns: (!spec.dns.is_empty()).then(|| spec.dns.clone()),
            memory: Some(spec.limits.memory_bytes),
            memory_swap: Some(spec.limits.memory_bytes),
            nano_cpus: Some(nano_cpus),
            pids_limit: Some(spec.limits.pids),
            ulimits: Some(vec![ResourcesUlimits {
                name: Some("fsize".to_owned()),
                soft: Some(spec.limits.file_bytes),
                hard: Some(spec.limits.file_bytes),
            }]),
            cap_drop: Some(vec!["ALL".to_string()]),
            security_opt: Some(vec!["no-new-privileges".to_string()]),
            readonly_rootfs: Some(spec.readonly_rootfs),
            // The writable layer is bounded where the engine can (a read-only root writes none).
            storage_opt: (!spec.readonly_rootfs && spec.limits.writable_mb > 0 && !no_storage_opt)
                .then(|| {
                    HashMap::from([("size".to_owned(), format!("{}m", spec.limits.writable_mb))])
                }),
            tmpfs: spec
                .readonly_rootfs
                .then(|| HashMap::from([("/tmp".to_string(), "rw,exec,size=512m".to_string())])),
            // Pitfall: with auto_remove the exit code and logs vanish before we read them.
            auto_remove: Some(false),
            // A tiny init as pid 1 reaps the zombies agent CLIs leave and forwards signals.
            init: Some(true),
            log_config: Some(engine_log_config(spec.limits.log_bytes)),
            ..Default::default()
        };
        ContainerCreateBody {
            image: Some(spec.image.clone()),
            cmd: Some(spec.cmd.clone()),
            env: Some(env),
            user: Some(user),
            working_dir: Some(WORKSPACE_MOUNT.to_string()),
            labels: Some(spec.all_labels().into_iter().collect()),
            tty: Some(false),
            attach_stdin: Some(false),
            open_stdin: Some(false),
            host_config: Some(host_config),
            ..Default::default()
        }
    }

    async fn inspect_status(&self, id: &str) -> Result<ContainerStatus, SandboxError> {
        let info = match self
            .docker
            .inspect_container(id, None::<InspectContainerOptions>)
            .await
        {
            Ok(info) => info,
            Err(e) if status_of(&e) == Some(404) => return Ok(ContainerStatus::Gone),
            Err(e) => return Err(self.err("inspect container", id, e)),
        };
        let state = info.state.unwrap_or_default();
        Ok(match state.status {
            Some(ContainerStateStatusEnum::CREATED) => ContainerStatus::Created,
            Some(ContainerStateStatusEnum::EXITED | ContainerStateStatusEnum::DEAD) => {
                ContainerStatus::Exited {
                    code: state.exit_code.unwrap_or(-1),
                    oom_killed: state.oom_killed.unwrap_or(false),
                }
            }
            _ => ContainerStatus::Running,
        })
    }
}

/// The bind mounts of `spec`: the worktree at `/workspace`, its `.git` file read-only over
/// itself (unless the spec mounts one), the input dir, the extra mounts; each source must exist.
pub(crate) fn bind_mounts(spec: &SandboxSpec) -> Result<Vec<Mount>, SandboxError> {
    std::fs::metadata(&spec.worktree).map_err(|source| SandboxError::Mount {
        path: spec.worktree.clone(),
        source,
    })?;
    // Structured mounts, not `host:target:mode` strings: paths may contain `:`.
    let bind = |host: &Path, target: &str, read_only: bool| Mount {
        source: Some(host.to_string_lossy().into_owned()),
        target: Some(target.to_string()),
        typ: Some(MountType::BIND),
        read_only: Some(read_only),
        ..Default::default()
    };
    let mut mounts = vec![bind(
        &spec.worktree,
        WORKSPACE_MOUNT,
        spec.workspace_read_only,
    )];
    // The worktree's `.git` names rover's git dir: no container may edit, remove or replace
    // it. Unless the spec mounts a git file of its own there, the file itself is bound
    // read-only over itself. It must be a plain file: Docker would follow a link on the host.
    let gitfile_target = format!("{WORKSPACE_MOUNT}/.git");
    if !spec.extra_mounts.iter().any(|m| m.target == gitfile_target) {
        let gitfile = spec.worktree.join(".git");
        match std::fs::symlink_metadata(&gitfile) {
            Ok(meta) if meta.is_file() => mounts.push(bind(&gitfile, &gitfile_target, true)),
            Ok(_) => {
                return Err(SandboxError::Tampered {
                    path: gitfile,
                    what: "it is no longer a plain file".to_owned(),
                })
            }
            // Not a git worktree (a scratch dir in tests): nothing to protect.
            Err(_) => {}
        }
    }
    if let Some(input) = &spec.input_dir {
        std::fs::metadata(input).map_err(|source| SandboxError::Mount {
            path: input.clone(),
            source,
        })?;
        mounts.push(bind(input, INPUT_MOUNT, true));
    }
    for mount in &spec.extra_mounts {
        std::fs::metadata(&mount.host).map_err(|source| SandboxError::Mount {
            path: mount.host.clone(),
            source,
        })?;
        mounts.push(bind(&mount.host, &mount.target, mount.read_only));
    }
    Ok(mounts)
}

/// The environment of a sandbox container: `HOME=/tmp`, git's `safe.directory`, the spec's
/// allow-listed pairs, then rover's own.
pub(crate) fn container_env(spec: &SandboxSpec) -> Vec<String> {
    let mut env: Vec<String> = Vec::new();
    if !spec.env.iter().any(|(k, _)| k == "HOME") {
        env.push("HOME=/tmp".to_string());
    }
    // The sandbox user owns the worktree and the scratch git, not the read-only `.git` file
    // rover mounts over the worktree's: git inside must not refuse the repository for that
    // ("dubious ownership"). Config from the environment counts as the command line's.
    if !spec.env.iter().any(|(k, _)| k == "GIT_CONFIG_COUNT") {
        env.extend(
            [
                "GIT_CONFIG_COUNT=1",
                "GIT_CONFIG_KEY_0=safe.directory",
                "GIT_CONFIG_VALUE_0=*",
            ]
            .map(String::from),
        );
    }
    env.extend(spec.env.iter().map(|(k, v)| format!("{k}={v}")));
    env.extend(spec.rover_env.iter().map(|(k, v)| format!("{k}={v}")));
    env
}

/// The engine's own log of a container: `json-file` (which `logs` reads back), at most two
/// files of `limit` bytes, so a container that floods its output cannot fill the engine's disk.
pub(crate) fn engine_log_config(limit: u64) -> HostConfigLogConfig {
    HostConfigLogConfig {
        typ: Some("json-file".to_owned()),
        config: Some(HashMap::from([
            ("max-size".to_owned(), limit.to_string()),
            ("max-file".to_owned(), "2".to_owned()),
        ])),
    }
}

#[async_trait]
impl Sandbox for DockerSandbox {
    async fn ensure_image(&self, image: &str) -> Result<(), SandboxError> {
        if let Some(own) = self.own_image.get().filter(|own| own.reference() == image) {
            return own.ensure(|| self.image_exists(image)).await;
        }
        if self.image_exists(image).await? {
            Ok(())
        } else {
            Err(SandboxError::ImageMissing {
                image: image.to_string(),
            })
        }
    }

    async fn run(&self, spec: &SandboxSpec) -> Result<String, SandboxError> {
        check_env(&spec.env, &self.env_allow)?;
        let user = Self::user(spec).await?;
        let mut body = self.create_body(spec, user)?;
        let name = spec.container_name();
        let options = CreateContainerOptionsBuilder::default().name(&name).build();
        let mut created = self
            .docker
            .create_container(Some(options.clone()), body.clone())
            .await;
        // An engine that cannot size a writable layer (overlay2 on ext4, the common case) says so
        // once; rover then runs without it (the file size limit still holds).
        if let Err(e) = &created {
            if e.to_string().contains("--storage-opt") {
                if !self.no_storage_opt.swap(true, Ordering::Relaxed) {
                    tracing::warn!(engine = %self.host, error = %e, "this Docker engine cannot limit a container's writable layer (autopilot.sandbox.writableLayerMb); containers run without that limit");
                }
                if let Some(host) = body.host_config.as_mut() {
                    host.storage_opt = None;
                }
                created = self.docker.create_container(Some(options), body).await;
            }
        }
        let created = match created {
            Ok(created) if spec.shipped() => {
                // The workspace goes in before the command starts.
                if let Err(e) = self.ship(&created.id, spec).await {
                    let _ = self.remove(&created.id).await;
                    return Err(e);
                }
                created
            }
            Ok(created) => created,
            Err(e) if status_of(&e) == Some(404) => {
                return Err(SandboxError::ImageMissing {
                    image: spec.image.clone(),
                })
            }
            Err(e) if status_of(&e) == Some(409) => {
                return Err(SandboxError::Conflict { name, source: e })
            }
            Err(e) => return Err(self.err("create container", &name, e)),
        };
        for warning in &created.warnings {
            tracing::warn!(container = %name, %warning, "docker warned while creating the sandbox");
        }
        if let Err(e) = self
            .docker
            .start_container(&created.id, None::<StartContainerOptions>)
            .await
        {
            // Leave nothing half-made behind: a created-but-unstarted container would block the name.
            let _ = self.remove(&created.id).await;
            return Err(self.err("start container", &name, e));
        }
        Ok(created.id)
    }

    async fn status(&self, id: &str) -> Result<ContainerStatus, SandboxError> {
        self.inspect_status(id).await
    }

    async fn wait(&self, id: &str) -> Result<ContainerStatus, SandboxError> {
        let mut stream = self.docker.wait_container(id, None::<WaitContainerOptions>);
        // The stream yields one item when the container stops.
        if let Some(item) = stream.next().await {
            match item {
                // Pitfall: a non-zero exit arrives as an error; it is a normal end here.
                Ok(_) | Err(bollard::errors::Error::DockerContainerWaitError { .. }) => {}
                Err(e) if status_of(&e) == Some(404) => return Ok(ContainerStatus::Gone),
                Err(e) => return Err(self.err("wait for container", id, e)),
            }
        }
        // Inspect gives the OOM flag as well as the code. The engine may record the OOM event a
        // moment after the exit (seen on cgroup v1, later on a loaded machine): a SIGKILL exit is
        // looked at again for up to 2 s.
        let mut status = self.inspect_status(id).await?;
        for _ in 0..20 {
            if !matches!(
                status,
                ContainerStatus::Exited {
                    code: 137,
                    oom_killed: false
                }
            ) {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            status = self.inspect_status(id).await?;
        }
        Ok(status)
    }

    async fn logs_to_file(
        &self,
        id: &str,
        path: &Path,
        limit: u64,
    ) -> Result<LogStats, SandboxError> {
        let mut logs = CappedLogs::create(path, limit).await?;
        let options = LogsOptionsBuilder::default()
            .follow(true)
            .stdout(true)
            .stderr(true)
            .build();
        let mut stream = self.docker.logs(id, Some(options));
        let mut failed = None;
        let mut killed = false;
        while let Some(chunk) = stream.next().await {
            let chunk = match chunk {
                Ok(chunk) => chunk,
                Err(e) if status_of(&e) == Some(404) => break,
                Err(e) => {
                    failed = Some(self.err("follow logs", id, e));
                    break;
                }
            };
            if let Err(e) = logs.write(chunk).await {
                failed = Some(e);
                break;
            }
            if !killed && logs.over_limit() {
                // What it prints from now on would only be cut: stop it (the stream then ends).
                killed = true;
                tracing::warn!(
                    container = id,
                    limit,
                    "sandbox output passed autopilot.sandbox.logLimitMb; stopping it"
                );
                if let Err(e) = self.kill(id).await {
                    tracing::warn!(container = id, error = %e, "cannot stop a sandbox over its log limit");
                }
            }
        }
        // The files are put together (and their tail files removed) even when the stream broke.
        logs.finish(failed).await
    }

    async fn fetch_workspace(
        &self,
        id: &str,
        into: &Path,
        limit: u64,
    ) -> Result<u64, SandboxError> {
        self.fetch(id, into, limit).await
    }

    async fn kill(&self, id: &str) -> Result<(), SandboxError> {
        let options = KillContainerOptionsBuilder::default()
            .signal("SIGKILL")
            .build();
        match self.docker.kill_container(id, Some(options)).await {
            // 404: gone; 409: not running. Both mean there is nothing left to kill.
            Ok(()) => Ok(()),
            Err(e) if matches!(status_of(&e), Some(404 | 409)) => Ok(()),
            Err(e) => Err(self.err("kill container", id, e)),
        }
    }

    async fn remove(&self, id: &str) -> Result<bool, SandboxError> {
        let options = RemoveContainerOptionsBuilder::default()
            .force(true)
            .v(true)
            .build();
        match self.docker.remove_container(id, Some(options)).await {
            Ok(()) => Ok(true),
            Err(e) if status_of(&e) == Some(404) => Ok(false),
            Err(e) => Err(self.err("remove container", id, e)),
        }
    }

    async fn connect_run(&self, run: &RunConnect) -> Result<String, SandboxError> {
        let image = self.own_proxy_image().await?;
        let (server_dir, key) = run.server();
        self.ensure_proxy(&ProxyServer {
            project: run.server_project(),
            dir: server_dir.clone(),
            image: image.clone(),
            env: run.server_env.clone(),
        })
        .await?;
        self.open_run_network(&RunNetwork {
            run: run.run.clone(),
            project: run.project.clone(),
            internal: run.internal,
            proxy_dir: server_dir,
            key,
            image,
            overlay: false,
        })
        .await
    }

    async fn disconnect_run(&self, run: &str) -> Result<(), SandboxError> {
        self.close_run_network(run).await
    }

    async fn run_networks(&self, project: &str) -> Result<Vec<String>, SandboxError> {
        DockerSandbox::run_networks(self, project).await
    }

    async fn stop_proxy(&self, dir: &Path) -> Result<(), SandboxError> {
        DockerSandbox::stop_proxy(self, dir).await
    }

    async fn list_by_labels(
        &self,
        labels: &[(String, String)],
    ) -> Result<Vec<ContainerInfo>, SandboxError> {
        let filter: Vec<String> = labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
        let filters = HashMap::from([("label".to_string(), filter)]);
        let options = ListContainersOptionsBuilder::default()
            .all(true)
            .filters(&filters)
            .build();
        let found = self
            .docker
            .list_containers(Some(options))
            .await
            .map_err(|e| self.err("list containers", "by labels", e))?;
        Ok(found
            .into_iter()
            .map(|c| ContainerInfo {
                id: c.id.unwrap_or_default(),
                name: c
                    .names
                    .and_then(|n| n.into_iter().next())
                    .map(|n| n.trim_start_matches('/').to_string()),
                labels: c
                    .labels
                    .unwrap_or_default()
                    .into_iter()
                    .collect::<BTreeMap<_, _>>(),
                state: c.state.map(|s| s.to_string()).unwrap_or_default(),
            })
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn docker_host_honours_the_env_value() {
        assert_eq!(docker_host(None), "unix:///var/run/docker.sock");
        assert_eq!(
            docker_host(Some(String::new())),
            "unix:///var/run/docker.sock"
        );
        assert_eq!(
            docker_host(Some("tcp://127.0.0.1:2375".into())),
            "tcp://127.0.0.1:2375"
        );
    }

    #[test]
    fn a_container_on_a_closed_run_network_asks_its_names_of_the_sink_only() {
        let settings = crate::sandbox::SandboxSettings::default();
        let mut spec = SandboxSpec::from_settings(
            &settings,
            vec!["true".into()],
            "/w",
            crate::sandbox::SandboxLabels {
                project: "p".into(),
                trace: "t".into(),
                action: "a".into(),
            },
        );
        let body = DockerSandbox::body_with(&spec, "1:1".into(), Vec::new(), false);
        assert_eq!(body.host_config.expect("host config").dns, None);
        spec.dns = vec![crate::sandbox::DNS_SINK.to_owned()];
        let body = DockerSandbox::body_with(&spec, "1:1".into(), Vec::new(), false);
        assert_eq!(
            body.host_config.expect("host config").dns,
            Some(vec!["192.0.2.1".to_owned()])
        );
    }

    #[tokio::test]
    async fn unsupported_scheme_is_unreachable_with_advice() {
        let err = DockerSandbox::connect_to("ftp://nowhere", Vec::new())
            .await
            .expect_err("no such transport");
        assert!(
            matches!(err, SandboxError::DaemonUnreachable { .. }),
            "{err:?}"
        );
        assert!(err.to_string().contains("setup-docker.sh"));
    }
}
