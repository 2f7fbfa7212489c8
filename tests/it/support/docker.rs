//! A real Docker engine for tests: connection, the locally built test image, labels and cleanup.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;

use rover::sandbox::image::RootfsImage;
use rover::sandbox::{DockerSandbox, SandboxLabels, SandboxSettings, SandboxSpec};

/// Label put on every container a test creates, with a per-test id.
pub const LABEL_TEST: &str = "rover.test";

/// Names tests may pass into a sandbox.
pub fn env_allow() -> Vec<String> {
    ["ANTHROPIC_API_KEY", "IS_SANDBOX", "GITHUB_TOKEN"]
        .map(String::from)
        .to_vec()
}

/// Connects to the engine; never skips: CI runs `tests/setup-docker.sh` first.
pub async fn sandbox() -> DockerSandbox {
    connect(env_allow()).await
}

/// Connects to the engine with this env allow-list; never skips.
pub async fn connect(env_allow: Vec<String>) -> DockerSandbox {
    DockerSandbox::connect(env_allow, &rover::host_env::HostEnv::from_process())
        .await
        .expect("a Docker engine must answer for these tests: run `bash tests/setup-docker.sh` as root first")
}

/// busybox plus the fake agent as `claude` and as `codex`: the image every test that runs an
/// agent in a container uses (built once, one build at a time; content-addressed).
pub async fn fake_agent_image(sandbox: &DockerSandbox) -> String {
    static BUILD: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
    let _guard = BUILD.lock().await;
    RootfsImage::new("rover-scenario")
        .binary(
            env!("CARGO_BIN_EXE_rover-fake-agent"),
            "/usr/local/bin/claude",
        )
        .binary(
            env!("CARGO_BIN_EXE_rover-fake-agent"),
            "/usr/local/bin/codex",
        )
        // What a workspace shipped to a swarm node needs besides busybox (docs/scale.md).
        .binary("/bin/bash", "/bin/bash")
        .binary("/bin/tar", "/bin/tar")
        .ensure(sandbox)
        .await
        .expect("build the fake-agent image")
}

/// Removes every container carrying `label` (`name=value`; best effort), with its anonymous
/// volumes (a shipped run's copies of the workspace).
pub fn remove_containers(label: &str) {
    remove_listed(
        &["ps", "-aq", "--filter", &format!("label={label}")],
        &["rm", "-f", "-v"],
    );
}

/// Lists ids with `docker <list>`, then runs `docker <remove> <ids>` when there are any; best
/// effort (a failing `docker` is ignored).
pub fn remove_listed(list: &[&str], remove: &[&str]) {
    let Ok(out) = Command::new("docker").args(list).output() else {
        return;
    };
    let ids: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .map(ToString::to_string)
        .collect();
    if !ids.is_empty() {
        let _ = Command::new("docker").args(remove).args(&ids).output();
    }
}

/// Removes the proxy server of the proxy dir it holds when dropped: a test that starts rover's
/// proxy without a daemon stops it itself (no daemon's stop does it).
pub struct ProxyServerGuard(pub std::path::PathBuf);

impl Drop for ProxyServerGuard {
    fn drop(&mut self) {
        let _ = Command::new("docker")
            .args(["rm", "-f", &rover::sandbox::runnet::server_name(&self.0)])
            .output();
    }
}

/// Removes what rover's sandbox proxy left for `project`: its server, its relays and the runs'
/// networks (a test's daemon may stop before its runs are collected).
pub fn remove_proxy(project: &str) {
    let label = format!("rover.proxy.project={project}");
    remove_containers(&label);
    remove_listed(
        &["network", "ls", "-q", "--filter", &format!("label={label}")],
        &["network", "rm"],
    );
}

/// Removes the proxy server the repositories of a daemon file share, of the data dir `data`
/// (its relays and networks carry their repository's project: [`remove_proxy`] removes those).
pub fn remove_shared_proxy(data: &Path) {
    let dir = data.join("daemon").join("proxy");
    let _ = Command::new("docker")
        .args(["rm", "-f", &rover::sandbox::runnet::server_name(&dir)])
        .output();
}

/// The test image: busybox plus `git` (a dynamically linked binary with its libraries).
pub async fn test_image(sandbox: &DockerSandbox) -> String {
    // Tests run in parallel; one import at a time leaves no dangling duplicate image behind.
    static BUILD: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
    let _guard = BUILD.lock().await;
    RootfsImage::new("rover-sandbox-test")
        .binary("/usr/bin/git", "/usr/bin/git")
        .ensure(sandbox)
        .await
        .expect("build the test image from a rootfs tar")
}

/// One test's labels and cleanup: every container carrying `rover.test=<id>` is removed on drop.
pub struct TestContainers {
    pub id: String,
}

impl TestContainers {
    pub fn new() -> Self {
        Self {
            id: uuid::Uuid::new_v4().simple().to_string()[..12].to_string(),
        }
    }

    /// A spec for `script` run by `/bin/sh -c` in `image` over `worktree`, offline, small limits.
    pub fn spec(&self, image: &str, worktree: &Path, action: &str, script: &str) -> SandboxSpec {
        let settings = SandboxSettings {
            image: image.to_string(),
            memory_mb: 256,
            cpus: 1.0,
            pids_limit: 128,
            egress: rover::sandbox::Egress::Mode(rover::sandbox::EgressMode::None),
            ..SandboxSettings::default()
        };
        let mut spec = SandboxSpec::from_settings(
            &settings,
            vec!["/bin/sh".into(), "-c".into(), script.into()],
            worktree,
            SandboxLabels {
                project: "rover-tests".into(),
                trace: format!("trace-{}", self.id),
                action: format!("{action}-{}", self.id),
            },
        );
        spec.extra_labels = BTreeMap::from([(LABEL_TEST.to_string(), self.id.clone())]);
        spec
    }

    pub fn label(&self) -> (String, String) {
        (LABEL_TEST.to_string(), self.id.clone())
    }
}

impl Drop for TestContainers {
    fn drop(&mut self) {
        remove_containers(&format!("{LABEL_TEST}={}", self.id));
    }
}

/// Held by a test that runs `rover autopilot gc` for real: the sweep of rover's leftovers looks
/// at the whole engine, so two at once take each other's expected removals (one test's dead
/// store's proxy gone before its own `gc` ran).
pub static ENGINE_SWEEP: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// The same across the suite's processes (`tests/run.sh` runs the swarm tests in one of their
/// own): a swarm test whose `--once` runs leave a run to the next one holds it shared, a real
/// `gc` exclusive, so a sweep never judges that store between two of its runs.
pub async fn engine_sweep_across_processes(exclusive: bool) -> std::fs::File {
    tokio::task::spawn_blocking(move || {
        let path = std::env::temp_dir().join("rover-tests-engine-sweep.lock");
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .expect("open the suite's engine-sweep lock");
        if exclusive {
            fs2::FileExt::lock_exclusive(&file).expect("lock");
        } else {
            fs2::FileExt::lock_shared(&file).expect("lock");
        }
        file
    })
    .await
    .expect("the lock's thread")
}

/// What a test adds to the real engine's calls through [`Wrapped`]: a check before each one (an
/// engine that does not answer, or stops answering), and a look at each container once it has
/// started.
#[async_trait::async_trait]
pub trait Around: Send + Sync {
    /// Before every call; an error is the call's answer.
    fn before(&self) -> Result<(), rover::sandbox::SandboxError> {
        Ok(())
    }
    /// After `run` started container `id` on `engine`.
    async fn started(&self, _engine: &DockerSandbox, _id: &str) {}
}

/// The real engine with `around` at each call: the one delegating `Sandbox` of the tests.
pub struct Wrapped<A> {
    pub inner: std::sync::Arc<DockerSandbox>,
    pub around: A,
}

#[async_trait::async_trait]
impl<A: Around> rover::sandbox::Sandbox for Wrapped<A> {
    async fn ensure_image(&self, image: &str) -> Result<(), rover::sandbox::SandboxError> {
        self.around.before()?;
        self.inner.ensure_image(image).await
    }
    async fn run(&self, spec: &SandboxSpec) -> Result<String, rover::sandbox::SandboxError> {
        self.around.before()?;
        let id = self.inner.run(spec).await?;
        self.around.started(&self.inner, &id).await;
        Ok(id)
    }
    async fn status(
        &self,
        id: &str,
    ) -> Result<rover::sandbox::ContainerStatus, rover::sandbox::SandboxError> {
        self.around.before()?;
        self.inner.status(id).await
    }
    async fn wait(
        &self,
        id: &str,
    ) -> Result<rover::sandbox::ContainerStatus, rover::sandbox::SandboxError> {
        self.around.before()?;
        self.inner.wait(id).await
    }
    async fn logs_to_file(
        &self,
        id: &str,
        path: &Path,
        limit: u64,
    ) -> Result<rover::sandbox::LogStats, rover::sandbox::SandboxError> {
        self.around.before()?;
        self.inner.logs_to_file(id, path, limit).await
    }
    async fn fetch_workspace(
        &self,
        id: &str,
        into: &Path,
        limit: u64,
    ) -> Result<u64, rover::sandbox::SandboxError> {
        self.around.before()?;
        self.inner.fetch_workspace(id, into, limit).await
    }
    async fn kill(&self, id: &str) -> Result<(), rover::sandbox::SandboxError> {
        self.around.before()?;
        self.inner.kill(id).await
    }
    async fn remove(&self, id: &str) -> Result<bool, rover::sandbox::SandboxError> {
        self.around.before()?;
        self.inner.remove(id).await
    }
    async fn list_by_labels(
        &self,
        labels: &[(String, String)],
    ) -> Result<Vec<rover::sandbox::ContainerInfo>, rover::sandbox::SandboxError> {
        self.around.before()?;
        self.inner.list_by_labels(labels).await
    }
}
