//! Integration tests for the swarm backend (`sandbox::swarm`): a real two-node Docker Swarm on
//! this machine (`tests/setup-swarm.sh`), the worker in a network namespace of its own.

use std::time::{Duration, Instant};

use rover::sandbox::{ContainerStatus, Sandbox, SandboxError, WorkspaceMode};

use crate::support::docker::{test_image, TestContainers};
use crate::support::gitrepo::TestRepo;
use crate::support::swarm::{
    ensure_swarm, running_on, stop_worker_engine, swarm, Services, MANAGER_NODE, ON_WORKER,
    WORKER_NODE,
};

/// Far above what these containers print.
const LOG_LIMIT: u64 = 64 << 20;

#[tokio::test]
async fn a_run_placed_on_the_worker_runs_there_and_its_output_comes_back() {
    let local = crate::support::docker::sandbox().await;
    let image = test_image(&local).await;
    let (_guard, swarm, worker) = swarm(&[ON_WORKER], &[&image]).await;
    let tc = TestContainers::new();
    let _services = Services(&tc);
    let repo = TestRepo::new();
    let dir = repo.data.join("work");
    std::fs::create_dir_all(&dir).expect("mkdir");
    let mut spec = tc.spec(
        &image,
        &dir,
        "on-worker",
        "echo out-line; echo err-line >&2; hostname; exit 3",
    );
    spec.workspace = WorkspaceMode::Mounted;

    let id = swarm.run(&spec).await.expect("a service is made");
    let log = repo.data.join("run.log");
    let (logs, status) = tokio::join!(swarm.logs_to_file(&id, &log, LOG_LIMIT), swarm.wait(&id));
    assert_eq!(
        status.expect("wait"),
        ContainerStatus::Exited {
            code: 3,
            oom_killed: false
        }
    );
    let stats = logs.expect("logs");
    let stdout = std::fs::read_to_string(&log).expect("stdout log");
    let mut lines = stdout.lines();
    assert_eq!(lines.next(), Some("out-line"), "{stdout}");
    let container_host = lines.next().expect("the container's hostname");
    assert_eq!(
        std::fs::read_to_string(rover::sandbox::stderr_path(&log)).expect("stderr log"),
        "err-line\n"
    );
    assert_eq!(stats.stderr_bytes, 9);

    // It ran on the worker: the manager places it there, and the worker's engine ran the
    // container (its id starts with the hostname the task printed).
    let placed = swarm.placements("rover-tests").await.expect("placements");
    let ours = placed
        .iter()
        .find(|p| p.service == spec.container_name())
        .expect("the run's service is listed");
    assert_eq!(ours.node.as_deref(), Some(WORKER_NODE), "{placed:?}");
    assert_eq!(ours.task_state, "failed", "{ours:?}");
    let on_worker = worker
        .client()
        .list_containers(Some(
            bollard::query_parameters::ListContainersOptionsBuilder::default()
                .all(true)
                .build(),
        ))
        .await
        .expect("list the worker's containers");
    assert!(
        on_worker.iter().any(|c| c
            .id
            .as_deref()
            .is_some_and(|i| i.starts_with(container_host))),
        "the worker's engine ran {container_host}: {on_worker:?}"
    );
    assert_ne!(ours.node.as_deref(), Some(MANAGER_NODE));

    // Listed by its labels as the workflow's sweep lists containers, then removed.
    let found = swarm
        .list_by_labels(&[tc.label()])
        .await
        .expect("list by labels");
    assert_eq!(found.len(), 1, "{found:?}");
    assert_eq!(found[0].state, "exited");
    assert!(swarm.remove(&id).await.expect("remove"));
    assert_eq!(
        swarm.status(&id).await.expect("status"),
        ContainerStatus::Gone
    );
    assert!(!swarm.remove(&id).await.expect("remove again"));
}

/// A task of `echo started; sleep 600` in `image` over a mounted `dir`, started and running.
async fn start_sleeping(
    swarm: &rover::sandbox::SwarmSandbox,
    tc: &TestContainers,
    (image, dir): (&str, &std::path::Path),
    action: &str,
) -> (rover::sandbox::SandboxSpec, String) {
    let mut spec = tc.spec(image, dir, action, "echo started; sleep 600");
    spec.workspace = WorkspaceMode::Mounted;
    let id = swarm.run(&spec).await.expect("a service is made");
    until_running(swarm, &id, &spec.container_name()).await;
    (spec, id)
}

/// Waits until the service's task runs.
async fn until_running(swarm: &rover::sandbox::SwarmSandbox, id: &str, service: &str) {
    for _ in 0..600 {
        let placed = swarm.placements("rover-tests").await.expect("placements");
        if placed
            .iter()
            .any(|p| p.service == service && p.task_state == "running")
        {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("{id} did not start within 60 s");
}

#[tokio::test]
async fn a_run_whose_node_goes_down_ends_as_lost_with_its_node() {
    let local = crate::support::docker::sandbox().await;
    let image = test_image(&local).await;
    let (_guard, swarm, _worker) =
        crate::support::swarm::swarm_alone(&[ON_WORKER], &[&image]).await;
    let tc = TestContainers::new();
    let _services = Services(&tc);
    let repo = TestRepo::new();
    let dir = repo.data.join("work");
    std::fs::create_dir_all(&dir).expect("mkdir");
    let (_, id) = start_sleeping(&swarm, &tc, (&image, &dir), "node-loss").await;

    let stopped = Instant::now();
    stop_worker_engine().await;
    let status = tokio::time::timeout(Duration::from_secs(90), swarm.wait(&id))
        .await
        .expect("the run ends once its node is down")
        .expect("wait");
    println!(
        "a run on the worker ended as lost {:.1} s after the worker's engine was sent SIGTERM",
        stopped.elapsed().as_secs_f64()
    );
    let placed = swarm.placements("rover-tests").await.expect("placements");
    ensure_swarm().await;
    assert_eq!(status, ContainerStatus::NodeLost, "{placed:?}");
    // Once the worker is back, the task is still the lost one (the engine: "No such container").
    assert_eq!(
        swarm.status(&id).await.expect("status"),
        ContainerStatus::NodeLost
    );
    assert!(swarm.remove(&id).await.expect("remove"));
}

#[tokio::test]
async fn a_kill_stops_a_task_on_the_worker_at_once() {
    let local = crate::support::docker::sandbox().await;
    let image = test_image(&local).await;
    let (_guard, swarm, worker) = swarm(&[ON_WORKER], &[&image]).await;
    let tc = TestContainers::new();
    let _services = Services(&tc);
    let repo = TestRepo::new();
    let dir = repo.data.join("work");
    std::fs::create_dir_all(&dir).expect("mkdir");
    let (spec, id) = start_sleeping(&swarm, &tc, (&image, &dir), "kill").await;
    let service_name = spec.container_name();
    let on_worker = || running_on(&worker, &service_name);
    assert_eq!(on_worker().await, 1, "the task runs on the worker");

    let t = Instant::now();
    swarm.kill(&service_name).await.expect("kill");
    assert_eq!(
        swarm.wait(&id).await.expect("wait"),
        ContainerStatus::Exited {
            code: 137,
            oom_killed: false
        }
    );
    let mut gone = false;
    for _ in 0..100 {
        if on_worker().await == 0 {
            gone = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    println!(
        "a task on the worker was gone from its engine {:.1} s after the kill",
        t.elapsed().as_secs_f64()
    );
    assert!(
        gone,
        "the worker's container is gone within 10 s of the kill"
    );
}

/// The (service, node) pairs seen running.
type Seen = std::sync::Arc<std::sync::Mutex<Vec<(String, String)>>>;

/// Where each of rover's services ran, watched while a scenario runs (a service is removed
/// once its run is collected).
fn watch_nodes(
    swarm: rover::sandbox::SwarmSandbox,
    project: String,
) -> (tokio::task::JoinHandle<()>, Seen) {
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::<(String, String)>::new()));
    let out = seen.clone();
    let handle = tokio::spawn(async move {
        loop {
            if let Ok(placed) = swarm.placements(&project).await {
                let mut seen = seen.lock().unwrap();
                for p in placed {
                    if let Some(node) = p.node {
                        if p.task_state == "running"
                            && !seen.contains(&(p.service.clone(), node.clone()))
                        {
                            seen.push((p.service, node));
                        }
                    }
                }
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    });
    (handle, out)
}

#[tokio::test]
async fn a_real_claude_run_on_the_worker_with_its_workspace_shipped_reaches_the_model_only_through_rovers_proxy_and_opens_a_pr(
) {
    use serde_json::json;

    use crate::real_cli::{cli_env, json_flag_answers, real_sandbox_image};
    use crate::support::fake_anthropic::{FakeAnthropic, Reply};
    use crate::support::scenario::{chain, merge, Scenario};
    use crate::support::swarm::MANAGER;

    let image = real_sandbox_image();
    let (_guard, swarm, _worker) = swarm(&[ON_WORKER], &[&image]).await;
    let mut s = Scenario::new().await;
    // The agent's tool writes a file from the worker; its answer names it.
    let command = "echo written-on-a-swarm-worker > worker.txt && cat /etc/hostname >> worker.txt";
    let tools = [
        json!({"name": "Bash", "input": {"command": command, "description": "write it", "timeout": 120_000}}),
    ];
    let answer = json!({"status": "completed", "summary": "Wrote worker.txt.", "files_changed": ["worker.txt"]});
    let workflow = json!({"__input_tokens": 12, "__tools": tools, "answer": answer});
    let api =
        FakeAnthropic::scripted(vec![Reply::BySystem(json_flag_answers(Some(workflow)))]).await;
    let home = s.env.path().join("home");
    std::fs::create_dir_all(&home).unwrap();
    s.env_vars.extend(cli_env(&api, &home));
    s.env_vars.push((
        "ROVER_CLAUDE_BIN".into(),
        crate::proof::escape::real_claude().display().to_string(),
    ));
    s.env_vars.push(("ROVER_SWARM_HOST".into(), MANAGER.into()));
    merge(
        &mut s.extra_config,
        &json!({"autopilot": {
            "agent": {"extraEnv": ["CLAUDE_CODE_MAX_RETRIES"]},
            "sandbox": {"image": image, "memoryMb": 1024, "cpus": 1.0, "timeoutSecs": 300,
                "envAllow": ["CLAUDE_CODE_MAX_RETRIES", "IS_SANDBOX"],
                "backend": "swarm",
                "swarm": {"constraints": [ON_WORKER]}}}}),
    );
    s.github
        .add_issue(81, "Add a --json flag", "Please add --json.", "alice", &[]);
    s.github.seed_event("IssuesEvent", "alice", json!({"action": "opened", "issue": {"number": 81, "title": "Add a --json flag", "body": "Please add --json.", "user": {"login": "alice"}}}));
    let project = s.env.project_id.clone();
    let (watcher, seen) = watch_nodes(swarm.clone(), project.clone());
    // The mounts of every service of the project while it runs.
    let mounts = {
        let swarm = swarm.clone();
        let project = project.clone();
        tokio::spawn(async move {
            let mut kinds = std::collections::BTreeSet::new();
            loop {
                for c in swarm
                    .list_by_labels(&[("rover.project".to_owned(), project.clone())])
                    .await
                    .unwrap_or_default()
                {
                    if let Ok(service) = swarm.manager().client().inspect_service(&c.id, None).await
                    {
                        let mounts = service
                            .spec
                            .and_then(|s| s.task_template)
                            .and_then(|t| t.container_spec)
                            .and_then(|c| c.mounts)
                            .unwrap_or_default();
                        kinds.extend(mounts.iter().map(|m| {
                            format!("{:?} at {}", m.typ, m.target.as_deref().unwrap_or_default())
                        }));
                        if !mounts.is_empty() {
                            return kinds;
                        }
                    }
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        })
    };

    s.run_until_settled(40).await;
    watcher.abort();
    let kinds = tokio::time::timeout(Duration::from_secs(1), mounts)
        .await
        .expect("the run's service was seen")
        .expect("the mounts watcher");
    // The workspace was shipped (a volume of the task's own at /workspace, and at the git
    // dirs), nothing of the host mounted (no bind mount).
    assert!(
        kinds.contains("Some(VOLUME) at /workspace")
            && kinds.iter().all(|k| !k.starts_with("Some(BIND)")),
        "{kinds:?}"
    );
    let trace = s.the_trace();
    let workflow = trace
        .spans
        .iter()
        .find(|sp| sp.step.as_str() == "workflow")
        .unwrap();
    assert_eq!(
        workflow.status.to_string(),
        "completed",
        "{:?}",
        workflow.meta
    );
    assert_eq!(
        chain(&trace).last().map(String::as_str),
        Some("notify:completed"),
        "{:?}",
        chain(&trace)
    );
    // The workflow's container ran on the worker, as a service of the swarm.
    let seen = seen.lock().unwrap().clone();
    assert!(
        seen.iter().any(|(_, node)| node == WORKER_NODE),
        "the run was seen on the worker: {seen:?}"
    );
    assert!(
        seen.iter().all(|(_, node)| node == WORKER_NODE),
        "nothing ran elsewhere: {seen:?}"
    );
    // What it wrote is on the pushed branch.
    let push = trace
        .spans
        .iter()
        .find(|sp| sp.step.as_str() == "push")
        .unwrap();
    let branch = push.meta["branch"].as_str().unwrap();
    let file = crate::support::gitrepo::show(&s.origin, branch, "worker.txt");
    assert!(file.starts_with("written-on-a-swarm-worker"), "{file}");
    // It asked the model through rover's proxy (the relay on the manager, the server beside
    // rover): the proxy recorded its requests, and the API saw the real key on each, never
    // the run's token.
    let wire = &workflow.meta["network"];
    assert!(wire["requests"].as_u64().unwrap() >= 2, "{wire}");
    let requests: Vec<_> = api
        .requests()
        .into_iter()
        .filter(|r| r.path == "/v1/messages")
        .collect();
    assert!(
        requests.iter().any(|r| r.body["system"]
            .to_string()
            .contains("Role: rover workflow agent")),
        "the workflow agent asked the model"
    );
    assert!(
        requests
            .iter()
            .all(|r| r.key.as_deref() == Some("sk-ant-api03-fake-key-for-tests")),
        "every model request carried rover's key, added by the proxy"
    );
    // `status` asks the swarm (the project's backend is `swarm`): nothing runs there now.
    let out = s
        .env
        .command(&["autopilot", "status", "--json"])
        .current_dir(&s.checkout)
        .env("ROVER_SWARM_HOST", MANAGER)
        .output()
        .expect("status");
    let status: serde_json::Value = serde_json::from_slice(&out.stdout).expect("status json");
    assert_eq!(status["placements"], json!([]), "{status}");
    let out = s
        .env
        .command(&["autopilot", "status"])
        .current_dir(&s.checkout)
        .env("ROVER_SWARM_HOST", MANAGER)
        .output()
        .expect("status");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("nodes    no sandbox on the swarm"), "{text}");
    // The run's service, overlay and relay are gone.
    let left = swarm
        .list_by_labels(&[("rover.project".to_owned(), project.clone())])
        .await
        .expect("list");
    assert!(left.is_empty(), "{left:?}");
    let runs = swarm.run_networks(&project).await.expect("networks");
    assert!(runs.is_empty(), "{runs:?}");
}

/// A run's network through rover's proxy on the swarm, with its grant, as the workflow makes
/// it: the proxy server beside rover, the run's relay on the manager, on an internal overlay.
async fn run_network(
    swarm: &rover::sandbox::SwarmSandbox,
    proxy_dir: &std::path::Path,
    run: &str,
) -> String {
    use rover::proxy::{token_sha256, Grant};
    Grant {
        run: run.to_owned(),
        trace_id: uuid::Uuid::new_v4(),
        token_sha256: token_sha256("unused"),
        providers: Vec::new(),
        egress: rover::proxy::Egress::default(),
        budget: None,
        max_requests: None,
        codex_prices: None,
        ended: false,
        created_at: chrono::Utc::now(),
    }
    .save(proxy_dir)
    .expect("the run's grant");
    swarm.use_proxy_binary(std::path::Path::new(crate::support::env::rover_bin()));
    swarm
        .connect_run(&rover::sandbox::RunConnect {
            run: run.to_owned(),
            project: "rover-tests".to_owned(),
            internal: true,
            proxy_dir: proxy_dir.to_owned(),
            shared_server: None,
            server_env: rover::proxy::env::server_env(|_| None, &serde_json::json!({})),
        })
        .await
        .expect("the run's network")
}

/// The mounts the service of `id` gives its task.
async fn service_mounts(
    swarm: &rover::sandbox::SwarmSandbox,
    id: &str,
) -> Vec<bollard::models::Mount> {
    swarm
        .manager()
        .client()
        .inspect_service(id, None)
        .await
        .expect("inspect the service")
        .spec
        .and_then(|s| s.task_template)
        .and_then(|t| t.container_spec)
        .and_then(|c| c.mounts)
        .unwrap_or_default()
}

/// A shipped run of `script` in `image` over `dir` on the swarm, through the run's network:
/// its spec, its id, how it ended, its stdout and its stderr.
struct ShippedRun {
    spec: rover::sandbox::SandboxSpec,
    id: String,
    status: ContainerStatus,
    stdout: String,
    stderr: String,
}

impl ShippedRun {
    async fn start(
        swarm: &rover::sandbox::SwarmSandbox,
        tc: &TestContainers,
        (image, dir, proxy_dir): (&str, &std::path::Path, &std::path::Path),
        action: &str,
        script: &str,
        limit: Option<u64>,
    ) -> (rover::sandbox::SandboxSpec, String) {
        let mut spec = tc.spec(image, dir, action, script);
        spec.workspace = WorkspaceMode::Shipped;
        if let Some(limit) = limit {
            spec.workspace_limit = limit;
        }
        spec.network = run_network(swarm, proxy_dir, &spec.container_name()).await;
        spec.proxy_dir = Some(proxy_dir.to_owned());
        let id = swarm.run(&spec).await.expect("a service is made");
        (spec, id)
    }

    async fn finish(
        swarm: &rover::sandbox::SwarmSandbox,
        (spec, id): (rover::sandbox::SandboxSpec, String),
        log: &std::path::Path,
    ) -> ShippedRun {
        let (logs, status) = tokio::join!(swarm.logs_to_file(&id, log, LOG_LIMIT), swarm.wait(&id));
        logs.expect("logs");
        ShippedRun {
            spec,
            id,
            status: status.expect("wait"),
            stdout: std::fs::read_to_string(log).unwrap_or_default(),
            stderr: std::fs::read_to_string(rover::sandbox::stderr_path(log)).unwrap_or_default(),
        }
    }

    fn exited(&self, code: i64) {
        assert_eq!(
            self.status,
            ContainerStatus::Exited {
                code,
                oom_killed: false
            },
            "{}",
            self.stderr
        );
    }

    async fn remove(&self, swarm: &rover::sandbox::SwarmSandbox) {
        assert!(swarm.remove(&self.id).await.expect("remove"));
        swarm
            .disconnect_run(&self.spec.container_name())
            .await
            .expect("disconnect");
    }
}

#[tokio::test]
async fn a_shipped_workspace_travels_to_the_worker_and_back_through_rovers_proxy() {
    use rover::sandbox::returned::take_back;

    let local = crate::support::docker::sandbox().await;
    let real = crate::real_cli::real_sandbox_image();
    let bare = test_image(&local).await;
    let (_guard, swarm, _worker) = swarm(&[ON_WORKER], &[&real, &bare]).await;
    let tc = TestContainers::new();
    let _services = Services(&tc);
    let repo = TestRepo::new();
    let dir = repo.data.join("work");
    std::fs::create_dir_all(dir.join("sub")).expect("mkdir");
    std::fs::write(dir.join("a.txt"), "from the host\n").expect("write");
    std::fs::write(dir.join("sub/b.txt"), "to be removed\n").expect("write");
    std::os::unix::fs::symlink("a.txt", dir.join("link")).expect("link");
    let proxy_dir = repo.data.join("proxy");
    // The proxy server this test starts beside rover (no daemon's stop removes it).
    let _server = crate::support::docker::ProxyServerGuard(proxy_dir.clone());
    let script = format!(
        "set -e; cat a.txt > seen.txt; readlink link >> seen.txt; pwd >> seen.txt; \
         if test -e {host}; then echo host-visible >> seen.txt; else echo host-hidden >> seen.txt; fi; \
         rm sub/b.txt; echo made on the worker > new.txt; hostname > node.txt",
        host = dir.display()
    );

    // An agent's run: what it changed comes back to the host's worktree, checked.
    let started = ShippedRun::start(
        &swarm,
        &tc,
        (&real, &dir, &proxy_dir),
        "shipped",
        &script,
        None,
    )
    .await;
    let mounts = service_mounts(&swarm, &started.1).await;
    assert!(
        mounts
            .iter()
            .all(|m| m.typ != Some(bollard::models::MountType::BIND) && m.source.is_none()),
        "nothing of the host is mounted: {mounts:?}"
    );
    assert!(
        mounts
            .iter()
            .any(|m| m.target.as_deref() == Some("/workspace")
                && m.typ == Some(bollard::models::MountType::VOLUME)),
        "{mounts:?}"
    );
    let run = ShippedRun::finish(&swarm, started, &repo.data.join("run.log")).await;
    run.exited(0);
    assert_eq!(run.stdout, "", "the wrapper prints nothing to stdout");
    let name = run.spec.container_name();
    let placed = swarm.placements("rover-tests").await.expect("placements");
    let ours = placed.iter().find(|p| p.service == name).expect("listed");
    assert_eq!(ours.node.as_deref(), Some(WORKER_NODE), "{placed:?}");
    let applied = take_back(&swarm, &run.id, &run.spec)
        .await
        .expect("taken back")
        .expect("shipped");
    assert!(applied.archive_bytes > 0);
    assert_eq!(
        std::fs::read_to_string(dir.join("seen.txt")).expect("seen"),
        "from the host\na.txt\n/workspace\nhost-hidden\n"
    );
    assert_eq!(
        std::fs::read_to_string(dir.join("new.txt")).expect("new"),
        "made on the worker\n"
    );
    assert!(!dir.join("sub/b.txt").exists(), "the removal came back too");
    assert_eq!(
        std::fs::read_link(dir.join("link")).expect("link"),
        std::path::Path::new("a.txt")
    );
    let run_dir = rover::proxy::Grant::run_dir(&proxy_dir, &name);
    assert!(run_dir.join(rover::proxy::WORKSPACE_OUT).exists());
    run.remove(&swarm).await;
    assert!(
        !run_dir.join(rover::proxy::WORKSPACE_IN).exists()
            && !run_dir.join(rover::proxy::WORKSPACE_OUT).exists(),
        "removing the service forgets its shipped files"
    );

    // One that sends back more than the limit (3000 empty files: no room taken in its
    // directory, whose size is the limit too, but a tar of 1.5 MB): the proxy keeps nothing,
    // the worktree is left as it was, and the task's stderr says why.
    let started = ShippedRun::start(
        &swarm,
        &tc,
        (&real, &dir, &proxy_dir),
        "too-big",
        "touch $(seq -f many-%g 3000)",
        Some(1 << 20),
    )
    .await;
    let run = ShippedRun::finish(&swarm, started, &repo.data.join("big.log")).await;
    run.exited(0);
    assert!(
        run.stderr
            .contains("rover: could not send the workspace back"),
        "{}",
        run.stderr
    );
    let err = take_back(&swarm, &run.id, &run.spec)
        .await
        .expect_err("nothing came back");
    assert!(matches!(err, SandboxError::Returned { .. }), "{err:?}");
    assert!(
        err.to_string()
            .contains("never came back: rover's proxy refused it (the workspace sent back holds more than 1048576 bytes"),
        "{err}"
    );
    assert!(!dir.join("many-1").exists());
    assert!(dir.join("new.txt").exists(), "the worktree is as it was");
    run.remove(&swarm).await;

    // An image without bash: the command never runs, and the task says what is missing.
    let started = ShippedRun::start(
        &swarm,
        &tc,
        (&bare, &dir, &proxy_dir),
        "no-bash",
        "touch ran.txt",
        None,
    )
    .await;
    let run = ShippedRun::finish(&swarm, started, &repo.data.join("bare.log")).await;
    run.exited(125);
    assert!(
        run.stderr.contains("rover: this image has no bash"),
        "{}",
        run.stderr
    );
    run.remove(&swarm).await;

    // Without the run's own network there is no way to ship: refused before anything starts.
    let mut spec = tc.spec(&bare, &dir, "offline", "true");
    spec.workspace = WorkspaceMode::Shipped;
    let err = swarm.run(&spec).await.expect_err("no network to ship over");
    assert!(
        matches!(
            err,
            SandboxError::Unsupported {
                backend: "swarm",
                ..
            }
        ),
        "{err:?}"
    );
    assert!(err.to_string().contains("\"mounted\""), "{err}");
    let left = swarm.list_by_labels(&[tc.label()]).await.expect("list");
    assert!(left.is_empty(), "nothing was started: {left:?}");
}

#[tokio::test]
async fn a_run_lost_with_its_worker_fails_and_the_resolvers_retry_runs_on_the_other_node() {
    use serde_json::json;

    use crate::support::scenario::{
        chain, merge, one_task_issue, resolve, scenario_image, Scenario, NOTIFY,
    };
    use crate::support::swarm::MANAGER;

    let image = scenario_image().await;
    let (_guard, swarm, _worker) = crate::support::swarm::swarm_alone(&[], &[&image]).await;
    // Its `--once` runs leave the run to the next one: no real `gc` of another test judges its
    // store in between (see `engine_sweep_across_processes`).
    let _across = crate::support::docker::engine_sweep_across_processes(false).await;
    // Sandboxes go where `rover.sandbox=yes`: the worker only, until it is lost.
    let label = |node: &str, add: bool| {
        let mut cmd = std::process::Command::new("docker");
        cmd.args(["-H", MANAGER, "node", "update"]);
        if add {
            cmd.args(["--label-add", "rover.sandbox=yes"]);
        } else {
            cmd.args(["--label-rm", "rover.sandbox"]);
        }
        let out = cmd.arg(node).output().expect("docker node update");
        assert!(
            out.status.success() || !add,
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    label(WORKER_NODE, true);
    label(MANAGER_NODE, false);

    let mut s = Scenario::new().await;
    s.with_sandbox().await;
    s.env_vars.push(("ROVER_SWARM_HOST".into(), MANAGER.into()));
    merge(
        &mut s.extra_config,
        &json!({"autopilot": {"sandbox": {"backend": "swarm", "egress": "model-only", "timeoutSecs": 120,
            "swarm": {"constraints": ["node.labels.rover.sandbox==yes"]}}}}),
    );
    one_task_issue(
        &mut s,
        7,
        "Add a flag",
        "Please add it.",
        "Add the flag",
        "flag.txt",
    );
    // The resolver retries a run lost with its node (after the rule that pushes a commit).
    s.rules.push(json!({"prompt_contains": "node lost", "structured": resolve("retry", json!({"retry_step": "workflow"}))}));
    // Every run of the agent takes 20 s: long enough to lose the first one with its node.
    for rule in &mut s.rules {
        if rule["prompt_contains"] == "## Task: Add the flag" {
            rule["delay_ms"] = json!(20_000);
        }
    }
    s.answer(NOTIFY, json!({"message": "Done."}));

    // Once the run is on the worker, the worker's engine stops, and the manager becomes
    // the node sandboxes may go to.
    let project = s.env.project_id.clone();
    let watcher = {
        let swarm = swarm.clone();
        tokio::spawn(async move {
            for _ in 0..1200 {
                let placed = swarm.placements(&project).await.unwrap_or_default();
                if let Some(p) = placed
                    .iter()
                    .find(|p| p.task_state == "running" && p.node.as_deref() == Some(WORKER_NODE))
                {
                    // The workspace is shipped: the task's mounts are its own volumes.
                    let mounts = service_mounts(&swarm, &p.service).await;
                    tokio::time::sleep(Duration::from_secs(2)).await;
                    stop_worker_engine().await;
                    return Some(mounts);
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            None
        })
    };
    let (nodes, seen) = watch_nodes(swarm.clone(), s.env.project_id.clone());
    let watcher = async move {
        let stopped = watcher.await.expect("the watcher");
        label(MANAGER_NODE, true);
        stopped
    };
    // `--once` as cron runs it, every second, until the trace has ended (at most 4 minutes).
    let settle = async {
        for _ in 0..240 {
            s.run_once().await;
            if s.settled() {
                return true;
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
        false
    };
    let (stopped, settled) = tokio::join!(watcher, settle);
    nodes.abort();
    ensure_swarm().await;
    label(MANAGER_NODE, false);
    // What the last `--once` left for the next one to collect.
    for left in swarm
        .list_by_labels(&[("rover.project".to_owned(), s.env.project_id.clone())])
        .await
        .unwrap_or_default()
    {
        let _ = swarm.remove(&left.id).await;
    }
    let mounts = stopped.expect("the run reached the worker");
    assert!(
        !mounts.is_empty()
            && mounts
                .iter()
                .all(|m| m.typ != Some(bollard::models::MountType::BIND)),
        "nothing of rover's machine is mounted: {mounts:?}"
    );

    let trace = s.the_trace();
    let steps = chain(&trace);
    for sp in &trace.spans {
        eprintln!("{} {}: {:?}", sp.step, sp.status, sp.summary);
    }
    assert!(settled, "{steps:?}");
    let workflows: Vec<_> = trace
        .spans
        .iter()
        .filter(|sp| sp.step.as_str() == "workflow")
        .collect();
    assert_eq!(workflows.len(), 2, "{steps:?}");
    assert_eq!(workflows[0].status.to_string(), "failed", "{steps:?}");
    let summary = workflows[0].summary.clone().unwrap_or_default();
    assert!(summary.starts_with("node lost: "), "{summary}");
    assert_eq!(workflows[1].status.to_string(), "completed", "{steps:?}");
    assert_eq!(
        steps.last().map(String::as_str),
        Some("notify:completed"),
        "{steps:?}"
    );
    let seen = seen.lock().unwrap().clone();
    assert!(
        seen.iter().any(|(_, n)| n == WORKER_NODE) && seen.iter().any(|(_, n)| n == MANAGER_NODE),
        "the first run on the worker, the retry on the manager: {seen:?}"
    );
}

#[tokio::test]
async fn rover_loads_a_tasks_image_onto_the_nodes_it_is_given_without_a_registry() {
    use rover::sandbox::swarm::images::image_id;

    let local = crate::support::docker::sandbox().await;
    let image = test_image(&local).await;
    let (_guard, swarm, worker) = crate::support::swarm::swarm_alone(&[ON_WORKER], &[]).await;
    let id = image_id(&local, &image)
        .await
        .expect("inspect")
        .expect("the test image");
    // The worker lacks it (a node that never ran it).
    crate::support::swarm::remove_from_nodes(&id).await;
    assert!(image_id(&worker, &id).await.expect("inspect").is_none());
    let swarm = swarm
        .load_images_onto(&[crate::support::swarm::WORKER.to_owned()])
        .await
        .expect("the worker's engine");
    let tc = TestContainers::new();
    let _services = Services(&tc);
    let repo = TestRepo::new();
    let dir = repo.data.join("work");
    std::fs::create_dir_all(&dir).expect("mkdir");
    let mut spec = tc.spec(&image, &dir, "loaded", "echo ran-on-the-worker");
    spec.workspace = WorkspaceMode::Mounted;
    let id_run = swarm.run(&spec).await.expect("a service is made");
    assert!(
        image_id(&worker, &id).await.expect("inspect").is_some(),
        "rover loaded the image onto the worker before making the service"
    );
    let log = repo.data.join("run.log");
    let (logs, status) = tokio::join!(
        swarm.logs_to_file(&id_run, &log, LOG_LIMIT),
        swarm.wait(&id_run)
    );
    logs.expect("logs");
    assert_eq!(
        status.expect("wait"),
        ContainerStatus::Exited {
            code: 0,
            oom_killed: false
        }
    );
    assert_eq!(
        std::fs::read_to_string(&log).expect("log"),
        "ran-on-the-worker\n"
    );
    assert!(swarm.remove(&id_run).await.expect("remove"));
}
