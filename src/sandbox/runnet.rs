//! A run's own network, made of Docker's parts: an `internal` bridge with no route out and no
//! address of the host on it, whose only other member is rover's relay; the relay hands every
//! connection, over a unix socket, to rover's proxy server, a long-lived container in the
//! host's network namespace that holds the model keys (so it reaches the real APIs, and a
//! model API on the host's loopback in tests). Neither the relay nor the server is reachable
//! from anywhere else. Both run rover's own binary from an image imported from it.
//!
//! The server outlives the rover process (a cron `--once` run exits while agents still
//! work): its restart policy keeps it up, and everything it needs is in files under the proxy
//! dir (see [`crate::proxy`]).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use bollard::models::{
    ContainerCreateBody, EndpointSettings, HostConfig, Ipam, IpamConfig, Mount, MountType,
    NetworkCreateRequest, NetworkingConfig, RestartPolicy, RestartPolicyNameEnum,
};
use bollard::query_parameters::{
    CreateContainerOptionsBuilder, InspectContainerOptions, ListContainersOptionsBuilder,
    ListNetworksOptionsBuilder, RemoveContainerOptionsBuilder, StartContainerOptions,
};
use sha2::{Digest, Sha256};

use super::docker::DockerSandbox;
use super::error::{status_of, SandboxError};
use super::image::RootfsImage;
use crate::proxy::env as proxy_env;

/// The name agent containers reach the relay by, on their run's network.
pub const PROXY_ALIAS: &str = "rover-proxy";
/// The port the relay listens on.
pub const PROXY_PORT: u16 = 8080;
/// Where the proxy dir is mounted in the server, and the socket dir in a relay.
pub const PROXY_MOUNT: &str = "/rover-proxy";
/// The socket's file name, in the proxy dir's `sock/` (the only part a relay sees).
pub use crate::proxy::SOCKET_FILE as SOCKET_NAME;
/// Labels of the proxy's containers and networks. Not `rover.project`: the workflow's orphan
/// sweep removes any container of the project that no task names.
pub const LABEL_PROXY_PROJECT: &str = "rover.proxy.project";
/// `server` or `relay` (a network carries `network`).
pub const LABEL_PROXY_ROLE: &str = "rover.proxy.role";
/// The agent container a relay or network serves.
pub const LABEL_PROXY_RUN: &str = "rover.proxy.run";
/// A hash of everything the server was started with: another one means restart it.
pub const LABEL_PROXY_CONFIG: &str = "rover.proxy.config";
/// The image repository rover's own binary is imported into.
pub const PROXY_IMAGE_REPO: &str = "rover-proxy";

const BINARY_IN_IMAGE: &str = "/usr/local/bin/rover";

/// The project label of the proxy server the repositories of a daemon file share.
pub const SHARED_SERVER_PROJECT: &str = "rover-daemon";

/// The proxy server the repositories of a daemon file share: its dir (`<data dir>/daemon/proxy`,
/// its socket in `sock/`) and the key of one repository's store in it (its project id: that
/// store's runs are in `<dir>/<key>/runs/`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SharedServer {
    pub dir: PathBuf,
    pub key: String,
}

impl SharedServer {
    /// The shared server a store's proxy dir leads to: a daemon file's repository has its
    /// `<store>/proxy` a symbolic link to `<shared dir>/<key>` (made by the daemon at the
    /// repository's start, so every reader of the store finds the run's files where they were);
    /// none for a real dir (a store's own server).
    pub fn of_link(proxy_dir: &Path) -> Option<SharedServer> {
        let target = std::fs::read_link(proxy_dir).ok()?;
        let key = target.file_name()?.to_str()?;
        if !target.is_absolute() || !crate::proxy::is_valid_key(key) {
            return None;
        }
        Some(SharedServer {
            dir: target.parent()?.to_owned(),
            key: key.to_owned(),
        })
    }

    /// Where the store `key`'s files are under the shared dir.
    pub fn store_dir(&self) -> PathBuf {
        self.dir.join(&self.key)
    }
}

/// What the proxy server container is started with.
#[derive(Debug, Clone)]
pub struct ProxyServer {
    /// The project the store belongs to (a label; [`SHARED_SERVER_PROJECT`] for a server
    /// shared by the repositories of a daemon file).
    pub project: String,
    /// `<store>/proxy`: grants, ledgers and `sock/`; for a shared server,
    /// `<data dir>/daemon/proxy`, each store's grants and ledgers under `<key>/`.
    pub dir: PathBuf,
    /// The image with rover's binary ([`DockerSandbox::proxy_image`]).
    pub image: String,
    /// The upstreams and the model keys (never shown: only a hash is a label).
    pub env: Vec<(String, String)>,
}

impl ProxyServer {
    /// The server's container name: one per store.
    pub fn container_name(&self) -> String {
        server_name(&self.dir)
    }

    /// The unix socket the server listens on.
    pub fn socket(&self) -> PathBuf {
        socket_dir(&self.dir).join(SOCKET_NAME)
    }

    fn config_hash(&self) -> String {
        let mut h = Sha256::new();
        h.update(self.image.as_bytes());
        h.update(b"\0");
        h.update(self.dir.to_string_lossy().as_bytes());
        for (k, v) in &self.env {
            h.update(b"\0");
            h.update(k.as_bytes());
            h.update(b"=");
            h.update(v.as_bytes());
        }
        hex(&h.finalize()[..8])
    }
}

/// The proxy server's container name for the proxy dir `dir`: one per store.
pub fn server_name(dir: &Path) -> String {
    format!(
        "rover-proxy-{}",
        short_hash(dir.to_string_lossy().as_bytes())
    )
}

/// The lock of the server named `name` in this process: one [`DockerSandbox::ensure_proxy`] at
/// a time for it, whichever engine client asks. The repositories of a daemon file, each with a
/// client of its own, share one server; two of them making it at once would each see it missing
/// and take the other's name, container or socket (seen as a start answered 404 for the
/// container the other's create had reserved).
fn server_lock(name: &str) -> std::sync::Arc<tokio::sync::Mutex<()>> {
    static LOCKS: std::sync::OnceLock<
        std::sync::Mutex<HashMap<String, std::sync::Arc<tokio::sync::Mutex<()>>>>,
    > = std::sync::OnceLock::new();
    let mut locks = LOCKS
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    locks.entry(name.to_owned()).or_default().clone()
}

/// The directory holding the server's socket (all a relay mounts).
pub fn socket_dir(proxy_dir: &Path) -> PathBuf {
    proxy_dir.join("sock")
}

/// One run's network and relay.
#[derive(Debug, Clone)]
pub struct RunNetwork {
    /// The agent container's name: the network is `<run>-net`, the relay `<run>-relay`.
    pub run: String,
    pub project: String,
    /// `false` for egress `open`: a plain bridge with a route out (and to the host).
    pub internal: bool,
    /// The proxy server's dir (its `sock/` is mounted into the relay): the store's proxy dir,
    /// or a shared server's.
    pub proxy_dir: PathBuf,
    /// The run's store key under a shared server (the relay writes it in every preamble).
    pub key: Option<String>,
    /// The image with rover's binary.
    pub image: String,
    /// A swarm-scoped `overlay` network (attachable, so the relay, a plain container, joins
    /// it) instead of a local bridge: the agent may run on another node (see
    /// [`crate::sandbox::swarm`]). Its subnet comes from the swarm's address pool.
    pub overlay: bool,
}

impl RunNetwork {
    pub fn network_name(&self) -> String {
        network_name(&self.run)
    }
}

/// The network of run `run`.
pub fn network_name(run: &str) -> String {
    format!("{run}-net")
}

/// The relay container of run `run`.
pub fn relay_name(run: &str) -> String {
    format!("{run}-relay")
}

fn short_hash(bytes: &[u8]) -> String {
    hex(&Sha256::digest(bytes)[..6])
}

/// The name of the proxy image of the rover binary at `exe` (`rover-proxy:<hash of it>`),
/// without asking the engine.
pub async fn proxy_image_reference(exe: &Path) -> Result<String, SandboxError> {
    let hashed = exe.to_path_buf();
    let digest = tokio::task::spawn_blocking(move || -> std::io::Result<String> {
        let mut file = std::fs::File::open(&hashed)?;
        let mut h = Sha256::new();
        std::io::copy(&mut file, &mut h)?;
        Ok(hex(&h.finalize()[..8]))
    })
    .await
    .map_err(|e| SandboxError::Proxy {
        reason: format!("hashing rover's binary did not finish: {e}"),
    })?
    .map_err(|source| SandboxError::File {
        path: exe.to_path_buf(),
        source,
    })?;
    Ok(format!("{PROXY_IMAGE_REPO}:{digest}"))
}

pub(crate) fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write as _;
    bytes.iter().fold(String::new(), |mut s, b| {
        let _ = write!(s, "{b:02x}");
        s
    })
}

/// `labels` and the owner labels of the store whose proxy dir is `proxy_dir` (its parent), so
/// `gc` can tell a store's proxy once its daemon is gone (see [`super::leftovers`]).
fn with_owner<const N: usize>(
    proxy_dir: &Path,
    labels: [(String, String); N],
) -> HashMap<String, String> {
    let store = proxy_dir.parent().unwrap_or(proxy_dir);
    labels
        .into_iter()
        .chain(super::leftovers::owner_labels(store))
        .collect()
}

/// `uid:gid` of this process: the proxy writes into the store as its owner.
fn own_user() -> String {
    format!(
        "{}:{}",
        nix::unistd::geteuid().as_raw(),
        nix::unistd::getegid().as_raw()
    )
}

fn bind(host: &Path, target: &str, read_only: bool) -> Mount {
    Mount {
        source: Some(host.to_string_lossy().into_owned()),
        target: Some(target.to_owned()),
        typ: Some(MountType::BIND),
        read_only: Some(read_only),
        ..Default::default()
    }
}

/// The parts every proxy container shares: no capability, no new privilege, a read-only root,
/// a bounded log, a small memory and process budget, restarted by the engine.
fn locked_down(network_mode: String, mounts: Vec<Mount>) -> HostConfig {
    HostConfig {
        network_mode: Some(network_mode),
        mounts: Some(mounts),
        cap_drop: Some(vec!["ALL".to_owned()]),
        security_opt: Some(vec!["no-new-privileges".to_owned()]),
        readonly_rootfs: Some(true),
        memory: Some(512 * 1024 * 1024),
        pids_limit: Some(256),
        init: Some(true),
        restart_policy: Some(RestartPolicy {
            name: Some(RestartPolicyNameEnum::UNLESS_STOPPED),
            maximum_retry_count: None,
        }),
        log_config: Some(bollard::models::HostConfigLogConfig {
            typ: Some("json-file".to_owned()),
            config: Some(HashMap::from([
                ("max-size".to_owned(), "4m".to_owned()),
                ("max-file".to_owned(), "2".to_owned()),
            ])),
        }),
        ..Default::default()
    }
}

impl DockerSandbox {
    /// The image holding this rover binary (and the shared libraries it needs), imported once
    /// per binary: its tag is a hash of the binary.
    pub async fn proxy_image(&self) -> Result<String, SandboxError> {
        let exe = match self.proxy_exe() {
            Some(exe) => exe.to_owned(),
            None => std::env::current_exe().map_err(|source| SandboxError::File {
                path: PathBuf::from("/proc/self/exe"),
                source,
            })?,
        };
        self.proxy_image_of(&exe).await
    }

    /// The image holding the rover binary at `exe` (see [`DockerSandbox::proxy_image`]).
    pub async fn proxy_image_of(&self, exe: &Path) -> Result<String, SandboxError> {
        let reference = proxy_image_reference(exe).await?;
        let digest = reference[PROXY_IMAGE_REPO.len() + 1..].to_owned();
        if self.image_exists(&reference).await? {
            return Ok(reference);
        }
        RootfsImage::new(PROXY_IMAGE_REPO)
            .busybox(None)
            .binary(exe, BINARY_IN_IMAGE)
            .ensure_tagged(self, &digest)
            .await
    }

    /// Starts the proxy server unless one started with the same image and settings runs
    /// (another one is replaced), and waits until its socket answers.
    pub async fn ensure_proxy(&self, server: &ProxyServer) -> Result<(), SandboxError> {
        let name = server.container_name();
        let lock = server_lock(&name);
        let _one_at_a_time = lock.lock().await;
        let config = server.config_hash();
        match self
            .client()
            .inspect_container(&name, None::<InspectContainerOptions>)
            .await
        {
            Ok(info) => {
                let same = info
                    .config
                    .as_ref()
                    .and_then(|c| c.labels.as_ref())
                    .and_then(|l| l.get(LABEL_PROXY_CONFIG))
                    .is_some_and(|c| *c == config);
                let running = info.state.as_ref().and_then(|s| s.running).unwrap_or(false);
                if same && running && socket_answers(&server.socket()) {
                    return Ok(());
                }
                if same && !running {
                    self.client()
                        .start_container(&name, None::<StartContainerOptions>)
                        .await
                        .map_err(|e| self.err("start container", &name, e))?;
                } else if !same {
                    tracing::info!(container = %name, "restarting rover's sandbox proxy with new settings");
                    self.remove_named(&name).await?;
                    self.create_server(server, &name, &config).await?;
                    self.prune_proxy_images(&server.image).await;
                }
            }
            Err(e) if status_of(&e) == Some(404) => {
                self.create_server(server, &name, &config).await?;
            }
            Err(e) => return Err(self.err("inspect container", &name, e)),
        }
        self.wait_for_socket(&server.socket(), &name).await
    }

    async fn create_server(
        &self,
        server: &ProxyServer,
        name: &str,
        config: &str,
    ) -> Result<(), SandboxError> {
        let sock = socket_dir(&server.dir);
        std::fs::create_dir_all(&sock).map_err(|source| SandboxError::File {
            path: sock.clone(),
            source,
        })?;
        // A socket left by an earlier server would look like an answer.
        let _ = std::fs::remove_file(server.socket());
        let mut mounts = vec![bind(&server.dir, PROXY_MOUNT, false)];
        // The proxy speaks TLS to the real APIs with the host's trust roots.
        if Path::new("/etc/ssl/certs").is_dir() {
            mounts.push(bind(Path::new("/etc/ssl/certs"), "/etc/ssl/certs", true));
        }
        // A daemon serving many repositories: its wire dir, shared by the proxies of all of them
        // (the daemon's budget), at a path of the container's own.
        let mut env = server.env.clone();
        if let Some((_, dir)) = env.iter_mut().find(|(k, _)| k == proxy_env::DAEMON_DIR) {
            let host_dir = PathBuf::from(std::mem::replace(
                dir,
                proxy_env::DAEMON_DIR_MOUNT.to_owned(),
            ));
            std::fs::create_dir_all(&host_dir).map_err(|source| SandboxError::File {
                path: host_dir.clone(),
                source,
            })?;
            mounts.push(bind(&host_dir, proxy_env::DAEMON_DIR_MOUNT, false));
        }
        let body = ContainerCreateBody {
            image: Some(server.image.clone()),
            cmd: Some(
                [
                    BINARY_IN_IMAGE,
                    "autopilot",
                    "proxy",
                    "serve",
                    "--dir",
                    PROXY_MOUNT,
                ]
                .map(String::from)
                .to_vec(),
            ),
            env: Some(env.iter().map(|(k, v)| format!("{k}={v}")).collect()),
            user: Some(own_user()),
            labels: Some(with_owner(
                &server.dir,
                [
                    (LABEL_PROXY_PROJECT.to_owned(), server.project.clone()),
                    (LABEL_PROXY_ROLE.to_owned(), "server".to_owned()),
                    (LABEL_PROXY_CONFIG.to_owned(), config.to_owned()),
                ],
            )),
            host_config: Some(locked_down("host".to_owned(), mounts)),
            ..Default::default()
        };
        self.create_and_start(name, body).await
    }

    async fn create_and_start(
        &self,
        name: &str,
        body: ContainerCreateBody,
    ) -> Result<(), SandboxError> {
        let options = CreateContainerOptionsBuilder::default().name(name).build();
        match self.client().create_container(Some(options), body).await {
            Ok(_) => {}
            // Made at the same moment by another step: that one is used.
            Err(e) if status_of(&e) == Some(409) => {}
            Err(e) if status_of(&e) == Some(404) => {
                return Err(SandboxError::ImageMissing {
                    image: PROXY_IMAGE_REPO.to_owned(),
                })
            }
            Err(e) => return Err(self.err("create container", name, e)),
        }
        match self
            .client()
            .start_container(name, None::<StartContainerOptions>)
            .await
        {
            Ok(()) => Ok(()),
            // 304: already running.
            Err(e) if status_of(&e) == Some(304) => Ok(()),
            Err(e) => Err(self.err("start container", name, e)),
        }
    }

    async fn wait_for_socket(&self, socket: &Path, name: &str) -> Result<(), SandboxError> {
        for _ in 0..200 {
            if socket_answers(socket) {
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Err(SandboxError::Proxy {
            reason: format!(
                "the container `{name}` did not open {} within 10 s; see `docker logs {name}`",
                socket.display()
            ),
        })
    }

    async fn remove_named(&self, name: &str) -> Result<(), SandboxError> {
        let options = RemoveContainerOptionsBuilder::default().force(true).build();
        match self.client().remove_container(name, Some(options)).await {
            Ok(()) => Ok(()),
            Err(e) if status_of(&e) == Some(404) => Ok(()),
            Err(e) => Err(self.err("remove container", name, e)),
        }
    }

    /// Makes the run's network and starts its relay on it (both kept when they exist: a run
    /// taken over after a restart). Returns the network's name, for the agent container.
    pub async fn open_run_network(&self, net: &RunNetwork) -> Result<String, SandboxError> {
        let name = net.network_name();
        let mut options = HashMap::new();
        if net.internal && !net.overlay {
            // No address of the host on the bridge: nothing on the host is reachable from it.
            options.insert(
                "com.docker.network.bridge.inhibit_ipv4".to_owned(),
                "true".to_owned(),
            );
        }
        let request = |subnet: Option<String>| NetworkCreateRequest {
            name: name.clone(),
            driver: Some(if net.overlay { "overlay" } else { "bridge" }.to_owned()),
            attachable: net.overlay.then_some(true),
            internal: Some(net.internal),
            options: Some(options.clone()),
            labels: Some(with_owner(
                &net.proxy_dir,
                [
                    (LABEL_PROXY_PROJECT.to_owned(), net.project.clone()),
                    (LABEL_PROXY_ROLE.to_owned(), "network".to_owned()),
                    (LABEL_PROXY_RUN.to_owned(), net.run.clone()),
                ],
            )),
            ipam: subnet.map(|subnet| Ipam {
                config: Some(vec![IpamConfig {
                    subnet: Some(subnet),
                    ..Default::default()
                }]),
                ..Default::default()
            }),
            ..Default::default()
        };
        // An internal network takes a /28 of its own from RUN_SUBNETS (the engine's default
        // pools hold about 30 networks; the host has no address on these, so no route of the
        // host's can clash); a slice in use is skipped. An `open` one takes the engine's.
        let mut tries: Vec<Option<String>> = if net.internal && !net.overlay {
            run_subnets(&net.run).take(SUBNET_TRIES).map(Some).collect()
        } else {
            vec![None]
        };
        tries.reverse();
        while let Some(subnet) = tries.pop() {
            match self.client().create_network(request(subnet.clone())).await {
                Ok(_) => break,
                Err(e) if status_of(&e) == Some(409) => break,
                Err(e) if subnet.is_some() && !tries.is_empty() && overlaps(&e) => {}
                Err(e) => return Err(self.err("create network", &name, e)),
            }
        }
        let relay = relay_name(&net.run);
        let mut cmd: Vec<String> = [BINARY_IN_IMAGE, "autopilot", "proxy", "relay"]
            .map(String::from)
            .to_vec();
        if let Some(key) = &net.key {
            cmd.extend(["--key".to_owned(), key.clone()]);
        }
        cmd.extend([
            "--run".to_owned(),
            net.run.clone(),
            "--socket".to_owned(),
            format!("{PROXY_MOUNT}/{SOCKET_NAME}"),
            "--listen".to_owned(),
            format!("0.0.0.0:{PROXY_PORT}"),
        ]);
        let body = ContainerCreateBody {
            image: Some(net.image.clone()),
            cmd: Some(cmd),
            user: Some(own_user()),
            labels: Some(with_owner(
                &net.proxy_dir,
                [
                    (LABEL_PROXY_PROJECT.to_owned(), net.project.clone()),
                    (LABEL_PROXY_ROLE.to_owned(), "relay".to_owned()),
                    (LABEL_PROXY_RUN.to_owned(), net.run.clone()),
                ],
            )),
            networking_config: Some(NetworkingConfig {
                endpoints_config: Some(HashMap::from([(
                    name.clone(),
                    EndpointSettings {
                        aliases: Some(vec![PROXY_ALIAS.to_owned()]),
                        ..Default::default()
                    },
                )])),
            }),
            host_config: Some(locked_down(
                name.clone(),
                vec![bind(&socket_dir(&net.proxy_dir), PROXY_MOUNT, false)],
            )),
            ..Default::default()
        };
        self.create_and_start(&relay, body).await?;
        Ok(name)
    }

    /// Removes the run's relay and network (nothing when they are gone already). The agent
    /// container must be gone first: a network with a member is not removed (an error).
    pub async fn close_run_network(&self, run: &str) -> Result<(), SandboxError> {
        self.remove_named(&relay_name(run)).await?;
        let name = network_name(run);
        match self.client().remove_network(&name).await {
            Ok(()) => Ok(()),
            Err(e) if status_of(&e) == Some(404) => Ok(()),
            Err(e) => Err(self.err("remove network", &name, e)),
        }
    }

    /// The runs of `project` with a relay or a network, for sweeping those whose agent is gone.
    pub async fn run_networks(&self, project: &str) -> Result<Vec<String>, SandboxError> {
        let filter = HashMap::from([(
            "label".to_owned(),
            vec![format!("{LABEL_PROXY_PROJECT}={project}")],
        )]);
        let mut runs = Vec::new();
        let containers = self
            .client()
            .list_containers(Some(
                ListContainersOptionsBuilder::default()
                    .all(true)
                    .filters(&filter)
                    .build(),
            ))
            .await
            .map_err(|e| self.err("list containers", "rover's relays", e))?;
        runs.extend(
            containers
                .into_iter()
                .filter_map(|c| c.labels?.get(LABEL_PROXY_RUN).cloned()),
        );
        let networks = self
            .client()
            .list_networks(Some(
                ListNetworksOptionsBuilder::default()
                    .filters(&filter)
                    .build(),
            ))
            .await
            .map_err(|e| self.err("list networks", "rover's run networks", e))?;
        runs.extend(
            networks
                .into_iter()
                .filter_map(|n| n.labels?.get(LABEL_PROXY_RUN).cloned()),
        );
        runs.sort();
        runs.dedup();
        Ok(runs)
    }

    /// Removes the images of earlier rover binaries that no container uses any more (an image
    /// in use is refused by the engine and stays).
    async fn prune_proxy_images(&self, current: &str) {
        let filters = HashMap::from([(
            "reference".to_owned(),
            vec![format!("{PROXY_IMAGE_REPO}:*")],
        )]);
        let Ok(images) = self
            .client()
            .list_images(Some(
                bollard::query_parameters::ListImagesOptionsBuilder::default()
                    .filters(&filters)
                    .build(),
            ))
            .await
        else {
            return;
        };
        for tag in images.into_iter().flat_map(|i| i.repo_tags) {
            if tag != current && tag.starts_with(&format!("{PROXY_IMAGE_REPO}:")) {
                match self
                    .client()
                    .remove_image(
                        &tag,
                        None::<bollard::query_parameters::RemoveImageOptions>,
                        None,
                    )
                    .await
                {
                    Ok(_) => {
                        tracing::info!(image = %tag, "removed the proxy image of an earlier rover binary");
                    }
                    Err(e) => {
                        tracing::debug!(image = %tag, error = %e, "an earlier proxy image stays");
                    }
                }
            }
        }
    }

    /// Stops and removes the proxy server of `dir` (when no run needs it any more).
    pub async fn stop_proxy(&self, dir: &Path) -> Result<(), SandboxError> {
        self.remove_named(&server_name(dir)).await
    }
}

/// The range internal run networks are cut from: `10.213.0.0/16`, in 4,096 slices of /28.
const RUN_SUBNET_BASE: [u8; 2] = [10, 213];
/// Slices tried before giving up (each one in use is skipped).
const SUBNET_TRIES: usize = 64;

/// The /28 slices run `run` tries, in order: from one its name picks, onwards.
fn run_subnets(run: &str) -> impl Iterator<Item = String> {
    let digest = Sha256::digest(run.as_bytes());
    let start = (usize::from(digest[0]) << 8 | usize::from(digest[1])) % 4096;
    (0..4096).map(move |i| {
        let slice = (start + i) % 4096;
        format!(
            "{}.{}.{}.{}/28",
            RUN_SUBNET_BASE[0],
            RUN_SUBNET_BASE[1],
            slice / 16,
            (slice % 16) * 16
        )
    })
}

/// The engine refused a subnet because another network has it.
fn overlaps(e: &bollard::errors::Error) -> bool {
    let text = e.to_string();
    text.contains("overlap") || text.contains("in use")
}

/// Whether something accepts connections on `socket`.
fn socket_answers(socket: &Path) -> bool {
    std::os::unix::net::UnixStream::connect(socket).is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn run_subnets_are_slices_of_a_16_that_wrap_around() {
        let all: Vec<String> = run_subnets("rover-a").take(4096).collect();
        assert!(all
            .iter()
            .all(|s| s.starts_with("10.213.") && s.ends_with("/28")));
        let mut unique = all.clone();
        unique.sort();
        unique.dedup();
        assert_eq!(unique.len(), 4096, "every slice once");
        assert!(unique.contains(&"10.213.0.0/28".to_owned()));
        assert!(unique.contains(&"10.213.255.240/28".to_owned()));
        assert_ne!(
            run_subnets("rover-a").next(),
            run_subnets("rover-b").next(),
            "runs start apart"
        );
    }

    #[test]
    fn names_follow_the_run_and_the_store() {
        assert_eq!(network_name("rover-abc"), "rover-abc-net");
        assert_eq!(relay_name("rover-abc"), "rover-abc-relay");
        let server = ProxyServer {
            project: "p".into(),
            dir: PathBuf::from("/s/proxy"),
            image: "rover-proxy:1".into(),
            env: vec![("K".into(), "v".into())],
        };
        let other = ProxyServer {
            env: vec![("K".into(), "w".into())],
            ..server.clone()
        };
        assert!(server.container_name().starts_with("rover-proxy-"));
        assert_eq!(server.container_name(), other.container_name());
        assert_ne!(server.config_hash(), other.config_hash());
        assert_eq!(server.socket(), PathBuf::from("/s/proxy/sock/proxy.sock"));
    }
}
