//! The test swarm of `tests/setup-swarm.sh`: two extra engines in network namespaces of their
//! own, a manager and a worker, each labelled `rover.node=mgr|wkr`.

use std::process::Command;

use rover::sandbox::swarm::images::load_image;
use rover::sandbox::{DockerSandbox, SwarmSandbox};

use super::docker::{env_allow, remove_listed, LABEL_TEST};

/// The manager's engine.
pub const MANAGER: &str = "unix:///run/rover-swarm/mgr/docker.sock";
/// The worker's engine.
pub const WORKER: &str = "unix:///run/rover-swarm/wkr/docker.sock";
/// The worker's hostname (its node's name in `docker node ls`).
pub const WORKER_NODE: &str = "rover-swarm-wkr";
/// The manager's hostname.
pub const MANAGER_NODE: &str = "rover-swarm-mgr";
/// Places a task on the worker.
pub const ON_WORKER: &str = "node.labels.rover.node==wkr";

/// Makes sure the swarm is up (idempotent; a worker whose engine a test stopped is started
/// again). Never skips: CI runs as root with Docker installed. One setup at a time: two tests
/// finding the worker stopped would both start its engine.
pub async fn ensure_swarm() {
    static SETUP: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
    let _one = SETUP.lock().await;
    setup("setup-swarm.sh").await;
}

/// Runs `tests/<script>`, which must succeed.
async fn setup(script: &str) {
    let out = tokio::process::Command::new("bash")
        .arg(format!("{}/tests/{script}", env!("CARGO_MANIFEST_DIR")))
        .output()
        .await
        .unwrap_or_else(|e| panic!("run tests/{script}: {e}"));
    assert!(
        out.status.success(),
        "tests/{script} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// One swarm test at a time: run beside each other on this 2-core machine, their services
/// missed their placement windows (a cancel test found no task on the worker in 220 s).
/// `tests/run.sh` runs this chain (`cluster::`) in a process of its own beside the rest.
static SWARM: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// A test's hold on the swarm (see [`swarm`] and [`swarm_alone`]).
pub type SwarmGuard = tokio::sync::MutexGuard<'static, ()>;

/// The swarm backend with the given placement constraints, and the worker's engine, with
/// `images` loaded onto both nodes from the main engine; no other swarm test runs until the
/// guard drops.
pub async fn swarm(
    constraints: &[&str],
    images: &[&str],
) -> (SwarmGuard, SwarmSandbox, DockerSandbox) {
    swarm_alone(constraints, images).await
}

/// [`swarm`], said where a test stops the worker's engine, relabels the nodes or removes images
/// from them. The empty volumes shipped runs of earlier tests left on the nodes' engines are
/// pruned first (no other test is between making a volume and using it).
pub async fn swarm_alone(
    constraints: &[&str],
    images: &[&str],
) -> (SwarmGuard, SwarmSandbox, DockerSandbox) {
    let guard = SWARM.lock().await;
    ensure_swarm().await;
    for engine in [MANAGER, WORKER] {
        let _ = Command::new("docker")
            .args([
                "-H",
                engine,
                "volume",
                "prune",
                "-f",
                "--filter",
                "label=rover.swarm=1",
            ])
            .output();
    }
    let (swarm, worker) = connect(constraints, images).await;
    (guard, swarm, worker)
}

async fn connect(constraints: &[&str], images: &[&str]) -> (SwarmSandbox, DockerSandbox) {
    ensure_swarm().await;
    let local = DockerSandbox::connect(env_allow(), &rover::host_env::HostEnv::from_process())
        .await
        .expect("the main engine answers");
    let swarm = SwarmSandbox::connect(
        local.clone(),
        MANAGER,
        constraints.iter().map(ToString::to_string).collect(),
    )
    .await
    .expect("the test swarm's manager answers");
    let worker = DockerSandbox::connect_to(WORKER, env_allow())
        .await
        .expect("the worker's engine answers");
    for image in images {
        load_image(&local, swarm.manager(), image)
            .await
            .expect("load the image onto the manager");
        load_image(&local, &worker, image)
            .await
            .expect("load the image onto the worker");
    }
    (swarm, worker)
}

/// Stops the worker's engine as a crash of its node would (SIGTERM to its dockerd, which stops
/// its containers), and waits until it has exited; `ensure_swarm` brings it back.
pub async fn stop_worker_engine() {
    let pid: i32 = std::fs::read_to_string("/run/rover-swarm/wkr/dockerd.pid")
        .expect("the worker's pid file")
        .trim()
        .parse()
        .expect("a pid");
    let pid = nix::unistd::Pid::from_raw(pid);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).expect("signal the worker");
    for _ in 0..600 {
        if nix::sys::signal::kill(pid, None).is_err() {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    panic!("the worker's engine did not stop within 60 s");
}

/// How many containers of swarm service `service` run on `node`'s engine.
pub async fn running_on(node: &DockerSandbox, service: &str) -> usize {
    let filters = std::collections::HashMap::from([(
        "label".to_owned(),
        vec![format!("com.docker.swarm.service.name={service}")],
    )]);
    node.client()
        .list_containers(Some(
            bollard::query_parameters::ListContainersOptionsBuilder::default()
                .filters(&filters)
                .build(),
        ))
        .await
        .expect("list a node's containers")
        .len()
}

/// Removes the services of a test (its `TestContainers`) from the test swarm when it drops.
pub struct Services<'a>(pub &'a super::docker::TestContainers);

impl Drop for Services<'_> {
    fn drop(&mut self) {
        remove_services(&self.0.id);
    }
}

/// Removes the services a test made (labelled `rover.test=<id>`) from the test swarm.
pub fn remove_services(test_id: &str) {
    remove_listed(
        &[
            "-H",
            MANAGER,
            "service",
            "ls",
            "-q",
            "--filter",
            &format!("label={LABEL_TEST}={test_id}"),
        ],
        &["-H", MANAGER, "service", "rm"],
    );
}

/// The test registry of `tests/setup-registry.sh`, at the same name in the host's namespace and
/// in each node's.
pub const REGISTRY: &str = "127.0.0.1:5415";
/// Its login.
pub const REGISTRY_LOGIN: (&str, &str) = ("rover", "rover-test-registry");

/// Makes sure the test registry answers in every namespace (idempotent); the swarm first.
pub async fn ensure_registry() {
    setup("setup-registry.sh").await;
}

/// Removes the image `id` from both nodes' engines, so that a run must get it from elsewhere.
pub async fn remove_from_nodes(id: &str) {
    for host in [MANAGER, WORKER] {
        let engine = DockerSandbox::connect_to(host, env_allow())
            .await
            .expect("a node's engine answers");
        let removed = engine
            .client()
            .remove_image(
                id,
                Some(bollard::query_parameters::RemoveImageOptions {
                    force: true,
                    ..Default::default()
                }),
                None,
            )
            .await;
        if let Err(e) = removed {
            let absent = matches!(
                e,
                bollard::errors::Error::DockerResponseServerError {
                    status_code: 404,
                    ..
                }
            );
            assert!(absent, "remove image {id} from {host}: {e}");
        }
    }
}
