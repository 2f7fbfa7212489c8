//! Swarm figures, on the two-node swarm of `tests/setup-swarm.sh`: an image loaded onto a node
//! without a registry; a sandbox started on the local backend against one started on the swarm's
//! worker (to running, and a trivial command to its end, with and without the run's overlay
//! network and relay); a workspace shipped and taken back, small and of 100 MB, on the local
//! backend against the swarm's worker; and how many runs of one CPU each Swarm places on one
//! node against two. (The image through a registry: `registry.rs`, section `swarm-registry`.)
//!
//! What it makes carries a project label of its own and is removed at the end.

use std::collections::HashMap;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use rover::sandbox::image::RootfsImage;
use rover::sandbox::runnet::RunNetwork;
use rover::sandbox::swarm::images::load_image;
use rover::sandbox::{
    ContainerStatus, DockerSandbox, Egress, EgressMode, Sandbox, SandboxLabels, SandboxSettings,
    SandboxSpec, SwarmSandbox,
};

use crate::percentiles;

const MANAGER: &str = "unix:///run/rover-swarm/mgr/docker.sock";
const WORKER: &str = "unix:///run/rover-swarm/wkr/docker.sock";
/// Starts per figure (a swarm start takes about a second).
const STARTS: usize = 10;

pub fn run() {
    println!("\n== swarm (the two-node swarm of tests/setup-swarm.sh)");
    if !setup("setup-swarm.sh") {
        return;
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime");
    runtime.block_on(async {
        let bench = Bench::new().await;
        bench.ship().await;
        bench.start_latency().await;
        bench.placement().await;
    });
}

/// Runs `tests/<script>`; false, having said why nothing is measured, when it fails.
pub fn setup(script: &str) -> bool {
    let out = Command::new("bash")
        .arg(format!("{}/tests/{script}", env!("CARGO_MANIFEST_DIR")))
        .output();
    match out {
        Ok(out) if out.status.success() => true,
        Ok(out) => {
            println!(
                "not measured: tests/{script} failed: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            );
            false
        }
        Err(e) => {
            println!("not measured: cannot run tests/{script}: {e}");
            false
        }
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

struct Bench {
    local: DockerSandbox,
    project: String,
    image: String,
    dir: tempfile::TempDir,
    proxy_image: String,
}

impl Drop for Bench {
    fn drop(&mut self) {
        let label = format!("label=rover.project={}", self.project);
        for host in [MANAGER, "unix:///var/run/docker.sock"] {
            let ids = |args: &[&str]| -> Vec<String> {
                Command::new("docker")
                    .args(["-H", host])
                    .args(args)
                    .output()
                    .map(|o| {
                        String::from_utf8_lossy(&o.stdout)
                            .split_whitespace()
                            .map(str::to_owned)
                            .collect()
                    })
                    .unwrap_or_default()
            };
            let services = if host == MANAGER {
                ids(&["service", "ls", "-q", "--filter", &label])
            } else {
                Vec::new()
            };
            if !services.is_empty() {
                let _ = Command::new("docker")
                    .args(["-H", host, "service", "rm"])
                    .args(&services)
                    .output();
            }
            let containers = ids(&["ps", "-aq", "--filter", &label]);
            if !containers.is_empty() {
                let _ = Command::new("docker")
                    .args(["-H", host, "rm", "-f"])
                    .args(&containers)
                    .output();
            }
        }
    }
}

impl Bench {
    async fn new() -> Bench {
        let local = DockerSandbox::connect(Vec::new(), &rover::host_env::HostEnv::from_process())
            .await
            .expect("the main engine answers");
        let image = match std::env::var("ROVER_TEST_SANDBOX_IMAGE") {
            Ok(image) if !image.is_empty() => image,
            _ => RootfsImage::new("rover-sandbox-test")
                .binary("/usr/bin/git", "/usr/bin/git")
                .ensure(&local)
                .await
                .expect("build the busybox test image"),
        };
        let worker = DockerSandbox::connect_to(WORKER, Vec::new())
            .await
            .expect("the worker answers");
        let manager = DockerSandbox::connect_to(MANAGER, Vec::new())
            .await
            .expect("the manager answers");
        let id = local
            .client()
            .inspect_image(&image)
            .await
            .expect("inspect")
            .id
            .unwrap_or_default();
        let size = local
            .client()
            .inspect_image(&image)
            .await
            .ok()
            .and_then(|i| i.size)
            .unwrap_or_default();
        for (name, node) in [("worker", &worker), ("manager", &manager)] {
            let had = node.client().inspect_image(&id).await.is_ok();
            let t = Instant::now();
            load_image(&local, node, &image)
                .await
                .expect("load the image");
            if had {
                println!(
                    "sandbox image {image} ({:.0} MB) already on the {name}",
                    size as f64 / 1e6
                );
            } else {
                println!(
                    "sandbox image {image} ({:.0} MB) loaded onto the {name} (save | load through the engine APIs, no registry): {:.1} s",
                    size as f64 / 1e6,
                    t.elapsed().as_secs_f64()
                );
            }
        }
        let proxy_image = manager
            .proxy_image_of(Path::new(env!("CARGO_BIN_EXE_rover")))
            .await
            .expect("rover's binary as an image on the manager");
        let project = format!(
            "rover-bench-swarm-{}",
            &uuid::Uuid::new_v4().simple().to_string()[..8]
        );
        let dir = tempfile::tempdir().expect("a temp dir");
        std::fs::create_dir_all(dir.path().join("worktree")).expect("a worktree");
        // The relays mount the proxy's socket dir (no proxy answers there: only starts count).
        std::fs::create_dir_all(dir.path().join("proxy").join("sock")).expect("a socket dir");
        Bench {
            local,
            project,
            image,
            dir,
            proxy_image,
        }
    }

    async fn swarm(&self, constraints: &[&str]) -> SwarmSandbox {
        SwarmSandbox::connect(
            self.local.clone(),
            MANAGER,
            constraints.iter().map(ToString::to_string).collect(),
        )
        .await
        .expect("the manager answers")
    }

    fn spec(&self, action: &str, cmd: &[&str], cpus: f64) -> SandboxSpec {
        let settings = SandboxSettings {
            image: self.image.clone(),
            memory_mb: 256,
            cpus,
            egress: Egress::Mode(EgressMode::None),
            // Start figures without a workspace to ship (these nodes share the disk); the ship
            // figures set it.
            workspace: Some(rover::sandbox::WorkspaceMode::Mounted),
            ..SandboxSettings::default()
        };
        SandboxSpec::from_settings(
            &settings,
            cmd.iter().map(ToString::to_string).collect(),
            self.dir.path().join("worktree"),
            SandboxLabels {
                project: self.project.clone(),
                trace: "bench".into(),
                action: action.into(),
            },
        )
    }

    /// Time to a running task and to the end of `true`, on `sandbox`, `STARTS` times each.
    async fn starts(
        &self,
        sandbox: &dyn Sandbox,
        tag: &str,
        swarm: Option<&SwarmSandbox>,
        overlay: bool,
    ) -> (Vec<f64>, Vec<f64>) {
        let overlay = swarm.filter(|_| overlay);
        let (mut running, mut done) = (Vec::new(), Vec::new());
        for i in 0..STARTS {
            let action = format!("{tag}-{i}");
            let mut spec = self.spec(&action, &["sleep", "3600"], 0.5);
            let t = Instant::now();
            if let Some(swarm) = overlay {
                let run = spec.container_name();
                let network = swarm
                    .manager()
                    .open_run_network(&RunNetwork {
                        run: run.clone(),
                        project: self.project.clone(),
                        internal: true,
                        proxy_dir: self.dir.path().join("proxy"),
                        key: None,
                        image: self.proxy_image.clone(),
                        overlay: true,
                    })
                    .await
                    .expect("the run's overlay and relay");
                spec.network = network;
            }
            let id = sandbox.run(&spec).await.expect("a sandbox starts");
            // The local engine has started the container when `run` returns; a swarm has made
            // the service, and its task runs once the worker has started its container.
            let mut refused = None;
            if let Some(swarm) = swarm {
                let name = spec.container_name();
                loop {
                    let placed = swarm.placements(&self.project).await.expect("placements");
                    let ours = placed.iter().find(|p| p.service == name);
                    match ours.map(|p| p.task_state.as_str()) {
                        Some("running") => break,
                        Some("rejected" | "failed" | "shutdown") => {
                            refused = ours.and_then(|p| p.message.clone());
                            break;
                        }
                        _ => tokio::time::sleep(Duration::from_millis(20)).await,
                    }
                }
            }
            match refused {
                None => running.push(ms(t.elapsed())),
                Some(why) => println!("  ({tag} start {i} did not run: the swarm said \"{why}\")"),
            }
            sandbox.kill(&id).await.expect("kill");
            let _ = sandbox.wait(&id).await;
            sandbox.remove(&id).await.expect("remove");
            if let Some(swarm) = overlay {
                swarm
                    .disconnect_run(&spec.container_name())
                    .await
                    .expect("remove the overlay");
            }
            let spec = self.spec(&format!("{tag}-t{i}"), &["true"], 0.5);
            let t = Instant::now();
            let id = sandbox.run(&spec).await.expect("a sandbox starts");
            let end = sandbox.wait(&id).await.expect("wait");
            assert!(
                matches!(end, ContainerStatus::Exited { code: 0, .. }),
                "{end:?}"
            );
            done.push(ms(t.elapsed()));
            sandbox.remove(&id).await.expect("remove");
        }
        (running, done)
    }

    async fn start_latency(&self) {
        let show = |what: &str, samples: Vec<f64>| {
            let samples_len = samples.len();
            if samples.is_empty() {
                println!("{what:<72} none of {STARTS} starts ran");
                return;
            }
            let (p50, p99) = percentiles(samples);
            let n = samples_len;
            println!("{what:<72} p50 {p50:>6.0} ms   p99 {p99:>6.0} ms   ({n} of {STARTS} starts)");
        };
        let (run_l, done_l) = self.starts(&self.local, "local", None, false).await;
        show("local backend: `run()` to a running container", run_l);
        show("local backend: `true` from `run()` to its exit", done_l);
        let swarm = self.swarm(&["node.labels.rover.node==wkr"]).await;
        let (run_s, done_s) = self.starts(&swarm, "wkr", Some(&swarm), false).await;
        show("swarm worker: service created to its task running", run_s);
        show(
            "swarm worker: `true` from service created to its exit",
            done_s,
        );
        let (run_o, _) = self.starts(&swarm, "wkr-net", Some(&swarm), true).await;
        show(
            "swarm worker, closed network: overlay + relay + service to running",
            run_o,
        );
    }

    /// How many runs reserving one CPU each Swarm starts on the worker alone, and on both
    /// nodes (each node's engine reports this machine's CPUs); the rest wait as pending.
    async fn placement(&self) {
        let cpus = std::thread::available_parallelism().map_or(1, std::num::NonZero::get);
        let wanted = cpus * 2 + 2;
        for (what, constraints) in [
            ("the worker alone", vec!["node.labels.rover.node==wkr"]),
            ("both nodes", Vec::new()),
        ] {
            let swarm = self.swarm(&constraints).await;
            let mut ids = Vec::new();
            for i in 0..wanted {
                let spec = self.spec(
                    &format!("place-{}-{i}", constraints.len()),
                    &["sleep", "3600"],
                    1.0,
                );
                ids.push(swarm.run(&spec).await.expect("a service"));
            }
            // Placement settles within seconds; give it 20.
            let mut per_node: HashMap<String, usize> = HashMap::new();
            let mut pending = 0;
            for _ in 0..40 {
                tokio::time::sleep(Duration::from_millis(500)).await;
                let placed = swarm.placements(&self.project).await.expect("placements");
                per_node.clear();
                pending = 0;
                for p in placed.iter().filter(|p| p.task_state == "running") {
                    *per_node
                        .entry(p.node.clone().unwrap_or_default())
                        .or_default() += 1;
                }
                pending += placed.iter().filter(|p| p.task_state == "pending").count();
                if per_node.values().sum::<usize>() + pending == wanted {
                    break;
                }
            }
            let mut nodes: Vec<_> = per_node.into_iter().collect();
            nodes.sort();
            println!(
                "runs of 1 CPU placed on {what}: {} running ({}), {pending} pending of {wanted} asked",
                nodes.iter().map(|(_, n)| n).sum::<usize>(),
                nodes
                    .iter()
                    .map(|(node, n)| format!("{node} {n}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            );
            for id in &ids {
                let _ = swarm.remove(id).await;
            }
            // The next round starts once the swarm has let go of these tasks (and so of their
            // reservations): none of them is listed any more.
            for _ in 0..120 {
                let tasks = swarm
                    .manager()
                    .client()
                    .list_tasks(None::<bollard::query_parameters::ListTasksOptions>)
                    .await
                    .unwrap_or_default();
                if !tasks
                    .iter()
                    .any(|t| t.service_id.as_ref().is_some_and(|s| ids.contains(s)))
                {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        }
    }

    /// A workspace shipped into a task that runs `true` and taken back: the time from `run()`
    /// to the task's end (the ship is in it: through the archive API before the start on the
    /// local backend, fetched by the task over the run's network on the swarm, and sent back
    /// before its end there), then the time to take it back (`fetch_workspace`); `MOUNTED` the
    /// same task with the worktree bind-mounted, for what shipping adds.
    async fn ship(&self) {
        const RUNS: usize = 3;
        if std::env::var("ROVER_TEST_SANDBOX_IMAGE").map_or(true, |i| i.is_empty()) {
            println!("shipped workspace: not measured (it needs bash in the image: set ROVER_TEST_SANDBOX_IMAGE=$(bash tests/setup-sandbox-image.sh))");
            return;
        }
        let swarm = self.swarm(&["node.labels.rover.node==wkr"]).await;
        swarm.use_proxy_binary(Path::new(env!("CARGO_BIN_EXE_rover")));
        let proxy_dir = self.dir.path().join("proxy");
        for (what, files, bytes) in [
            ("small (20 files of 2 KB)", 20, 2048),
            ("100 MB (100 files of 1 MiB)", 100, 1 << 20),
        ] {
            let worktree = self.dir.path().join(format!("ship-{files}"));
            write_files(&worktree, files, bytes);
            for (backend, sandbox, on_swarm) in [
                ("local", &self.local as &dyn Sandbox, false),
                ("swarm worker", &swarm as &dyn Sandbox, true),
            ] {
                for mode in [
                    rover::sandbox::WorkspaceMode::Mounted,
                    rover::sandbox::WorkspaceMode::Shipped,
                ] {
                    let shipped = mode == rover::sandbox::WorkspaceMode::Shipped;
                    let (mut ran, mut back) = (Vec::new(), Vec::new());
                    for i in 0..RUNS {
                        let action = format!(
                            "ship-{files}-{}-{}-{i}",
                            u8::from(on_swarm),
                            u8::from(shipped)
                        );
                        let mut spec = self.spec(&action, &["true"], 1.0);
                        spec.worktree.clone_from(&worktree);
                        spec.workspace = mode;
                        spec.limits.memory_bytes = 1 << 30;
                        if on_swarm && shipped {
                            let run = spec.container_name();
                            rover::proxy::Grant {
                                run: run.clone(),
                                trace_id: uuid::Uuid::new_v4(),
                                token_sha256: rover::proxy::token_sha256("bench"),
                                providers: Vec::new(),
                                egress: rover::proxy::Egress::default(),
                                budget: None,
                                max_requests: None,
                                codex_prices: None,
                                ended: false,
                                created_at: chrono::Utc::now(),
                            }
                            .save(&proxy_dir)
                            .expect("a grant");
                            spec.network = swarm
                                .connect_run(&rover::sandbox::RunConnect {
                                    run: run.clone(),
                                    project: self.project.clone(),
                                    internal: true,
                                    proxy_dir: proxy_dir.clone(),
                                    shared_server: None,
                                    server_env: rover::proxy::env::server_env(
                                        |_| None,
                                        &serde_json::json!({}),
                                    ),
                                })
                                .await
                                .expect("the run's network");
                            spec.proxy_dir = Some(proxy_dir.clone());
                        }
                        let t = Instant::now();
                        let id = sandbox.run(&spec).await.expect("a sandbox starts");
                        let end = sandbox.wait(&id).await.expect("wait");
                        assert!(
                            matches!(end, ContainerStatus::Exited { code: 0, .. }),
                            "{backend} {end:?}"
                        );
                        ran.push(ms(t.elapsed()));
                        if shipped {
                            let into = self.dir.path().join("returned.tar");
                            let t = Instant::now();
                            sandbox
                                .fetch_workspace(&id, &into, 1 << 30)
                                .await
                                .expect("the workspace back");
                            back.push(ms(t.elapsed()));
                        }
                        sandbox.remove(&id).await.expect("remove");
                        if on_swarm && shipped {
                            let _ = swarm.disconnect_run(&spec.container_name()).await;
                        }
                    }
                    let (p50, _) = percentiles(ran);
                    let how = if shipped { "shipped" } else { "mounted" };
                    let back = if back.is_empty() {
                        String::new()
                    } else {
                        format!(", taken back in p50 {:.0} ms", percentiles(back).0)
                    };
                    println!("workspace {what:<28} {backend:<13} {how}: `true` from run() to its end p50 {p50:>6.0} ms{back}   ({RUNS} runs)");
                }
            }
        }
    }
}

/// `files` files of `bytes` bytes each under `dir`, of bytes that do not compress.
fn write_files(dir: &Path, files: usize, bytes: usize) {
    std::fs::create_dir_all(dir).expect("a worktree");
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    for i in 0..files {
        let data: Vec<u8> = (0..bytes)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x.to_le_bytes()[0]
            })
            .collect();
        std::fs::write(dir.join(format!("f{i}.bin")), data).expect("a file");
    }
}
