//! `rover autopilot gc` sweeping rover's containers, networks and volumes on the engine, as a
//! user runs it: a killed daemon's proxy server, relay, run network and agent are kept while its
//! run is live, removed once it is over (the agent waiting for the store's next start) or its
//! store is gone; a live daemon's, another store's, are never touched; an older rover's are
//! judged by what the engine mounts, or kept and named.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::support::docker::{fake_agent_image, sandbox, ProxyServerGuard, ENGINE_SWEEP};
use crate::support::env::{rover_bin, stderr, stdout, TestEnv};
use crate::support::local::LocalWorld;
use crate::support::scenario::{merge, slow_task_issue, Scenario};

/// `rover autopilot gc [--dry-run] --json` in `env`'s project: its `leftovers`.
fn gc(env: &TestEnv, dry_run: bool) -> Value {
    let mut args = vec!["autopilot", "gc", "--json"];
    if dry_run {
        args.push("--dry-run");
    }
    let out = env.rover(&args);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let all: Value = serde_json::from_str(&stdout(&out)).expect("gc --json");
    all["leftovers"].clone()
}

/// The `(name, role, reason)` of the containers and networks of `list` (`removed` or `kept`)
/// of store `store`.
fn of_store(leftovers: &Value, list: &str, store: &Path) -> Vec<(String, String, String)> {
    let mut found: Vec<_> = leftovers[list]
        .as_array()
        .expect("a list")
        .iter()
        .filter(|l| l["store"] == json!(store) && l["kind"] != "volume")
        .map(|l| {
            (
                l["name"].as_str().unwrap_or_default().to_owned(),
                l["role"].as_str().unwrap_or_default().to_owned(),
                l["reason"].as_str().unwrap_or_default().to_owned(),
            )
        })
        .collect();
    found.sort();
    found
}

/// `docker <kind> ls` names with label `rover.store=<store>` (`ps -a` for containers), and
/// whether each runs (networks: always).
fn on_engine(kind: &str, store: &Path) -> Vec<String> {
    let filter = format!("label=rover.store={}", store.display());
    let args: Vec<&str> = match kind {
        "container" => vec![
            "ps",
            "-a",
            "--filter",
            &filter,
            "--format",
            "{{.Names}} {{.State}}",
        ],
        _ => vec![kind, "ls", "--filter", &filter, "--format", "{{.Name}}"],
    };
    let out = Command::new("docker").args(&args).output().expect("docker");
    let mut names: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_owned)
        .collect();
    names.sort();
    names
}

/// A killed daemon's proxy server, its run's relay and network and its agent stay while the
/// agent runs (a `--once` run leaves its agents working); once the run is over they go but the
/// agent's container (the store's next start collects it); once the store is gone, all go.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_daemons_proxy_and_relay_stay_while_its_run_is_live_and_gc_removes_them_after_or_once_its_store_is_gone(
) {
    let _sweep = ENGINE_SWEEP.lock().await;
    let _across = crate::support::docker::engine_sweep_across_processes(true).await;
    let mut s = Scenario::new().await;
    // The store is removed on purpose: nothing to replay.
    s.replay_check = false;
    s.with_sandbox().await;
    merge(
        &mut s.extra_config,
        &json!({"autopilot": {"sandbox": {"egress": "model-only", "timeoutSecs": 300}}}),
    );
    s.env_vars.push((
        "ANTHROPIC_API_KEY".into(),
        "sk-ant-api03-unused-0000".into(),
    ));
    slow_task_issue(&mut s, 7, 300);
    let store = s.store().root().to_owned();
    let mut daemon = s
        .start_command(&[])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("start rover");

    // The agent runs through the run's network, relay and the store's proxy server.
    let server = rover::sandbox::runnet::server_name(&store.join("proxy"));
    let deadline = Instant::now() + Duration::from_secs(120);
    let (agent, relay) = loop {
        let running: Vec<String> = on_engine("container", &store)
            .into_iter()
            .filter_map(|l| l.strip_suffix(" running").map(str::to_owned))
            .collect();
        let relay = running.iter().find(|n| n.ends_with("-relay")).cloned();
        let agent = relay
            .as_deref()
            .and_then(|r| r.strip_suffix("-relay"))
            .filter(|a| running.iter().any(|n| n == a))
            .map(str::to_owned);
        if let (Some(agent), Some(relay), true) = (agent, relay, running.contains(&server)) {
            break (agent, relay);
        }
        assert!(Instant::now() < deadline, "no agent ran: {running:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let network = format!("{agent}-net");
    daemon.kill().expect("SIGKILL");
    daemon.wait().expect("reaped");
    assert_eq!(on_engine("network", &store), std::slice::from_ref(&network));

    let other = TestEnv::new();
    other.store();
    // Its daemon is dead, but its run is live: everything stays.
    let live = gc(&other, false);
    let kept = of_store(&live, "kept", &store);
    assert_eq!(
        kept,
        [
            (agent.clone(), "sandbox".into(), "liveRun".into()),
            (network.clone(), "runNetwork".into(), "liveRun".into()),
            (relay.clone(), "relay".into(), "liveRun".into()),
            (server.clone(), "proxyServer".into(), "liveRun".into()),
        ],
        "{live:#}"
    );
    assert!(of_store(&live, "removed", &store).is_empty(), "{live:#}");

    // The run is over (its agent exited): the proxy's part goes, the agent's container waits
    // for the store's next start.
    let stopped = Command::new("docker")
        .args(["kill", &agent])
        .output()
        .unwrap();
    assert!(
        stopped.status.success(),
        "{}",
        String::from_utf8_lossy(&stopped.stderr)
    );
    let over = gc(&other, false);
    assert_eq!(
        of_store(&over, "removed", &store),
        [
            (network.clone(), "runNetwork".into(), "daemonDead".into()),
            (relay.clone(), "relay".into(), "daemonDead".into()),
            (server.clone(), "proxyServer".into(), "daemonDead".into()),
        ],
        "{over:#}"
    );
    assert_eq!(
        of_store(&over, "kept", &store),
        [(agent.clone(), "sandbox".into(), "awaitsNextStart".into())],
        "{over:#}"
    );
    assert_eq!(on_engine("container", &store), [format!("{agent} exited")]);
    assert!(on_engine("network", &store).is_empty());

    // The store is gone: a dry run names what goes, touching nothing; then it goes.
    std::fs::remove_dir_all(&store).expect("remove the store");
    let dry = gc(&other, true);
    let gone = [(agent.clone(), "sandbox".into(), "storeGone".into())];
    assert_eq!(of_store(&dry, "removed", &store), gone, "{dry:#}");
    assert_eq!(on_engine("container", &store).len(), 1);
    assert_eq!(of_store(&gc(&other, false), "removed", &store), gone);
    assert!(on_engine("container", &store).is_empty());
    assert!(on_engine("volume", &store).is_empty());
}

/// A daemon that runs keeps everything of its store, whoever runs `gc` and whatever else it
/// removes: here its proxy server and a run's relay and network, made as its workflow makes
/// them.
#[tokio::test]
async fn gc_never_touches_the_proxy_of_a_live_daemon_of_another_store() {
    let _sweep = ENGINE_SWEEP.lock().await;
    let _across = crate::support::docker::engine_sweep_across_processes(true).await;
    let world = LocalWorld::new(false).await;
    let store = world.store();
    let mut daemon = world.spawn_daemon();
    let deadline = Instant::now() + Duration::from_secs(30);
    while store.daemon_pid().is_none() {
        assert!(Instant::now() < deadline, "the daemon did not start");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let docker = sandbox().await;
    docker.use_proxy_binary(Path::new(rover_bin()));
    let _server = ProxyServerGuard(store.proxy_dir());
    let run = format!(
        "rover-live-{}",
        &uuid::Uuid::new_v4().simple().to_string()[..12]
    );
    let network = rover::sandbox::Sandbox::connect_run(
        &docker,
        &rover::sandbox::RunConnect {
            run: run.clone(),
            project: world.env.project_id.clone(),
            internal: true,
            proxy_dir: store.proxy_dir(),
            shared_server: None,
            server_env: rover::proxy::env::server_env(|_| None, &json!({})),
        },
    )
    .await
    .expect("the run's network");
    let root = store.root().to_owned();
    let before = (on_engine("container", &root), on_engine("network", &root));

    let other = TestEnv::new();
    other.store();
    let swept = gc(&other, false);
    assert!(of_store(&swept, "removed", &root).is_empty(), "{swept:#}");
    let kept = of_store(&swept, "kept", &root);
    assert_eq!(kept.len(), 3, "{swept:#}");
    assert!(
        kept.iter().all(|(_, _, why)| why == "daemonRuns"),
        "{kept:?}"
    );
    assert_eq!(
        (on_engine("container", &root), on_engine("network", &root)),
        before
    );
    assert_eq!(before.1, [network]);

    let _ = daemon.kill();
    let _ = daemon.wait();
    rover::sandbox::Sandbox::disconnect_run(&docker, &run)
        .await
        .expect("closed");
}

/// Resources made by an older rover carry no store label: its proxy server is judged by the
/// proxy dir the engine mounts into it (gone here: removed); a sandbox container of it is kept
/// and named with the command that removes it; a label that names a store the engine's mount
/// contradicts is not believed.
#[tokio::test]
async fn an_older_rovers_proxy_is_judged_by_its_mount_and_its_other_containers_are_kept_and_named()
{
    let _sweep = ENGINE_SWEEP.lock().await;
    let _across = crate::support::docker::engine_sweep_across_processes(true).await;
    let image = fake_agent_image(&sandbox().await).await;
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("store").join("proxy");
    std::fs::create_dir_all(&dir).unwrap();
    let id = &uuid::Uuid::new_v4().simple().to_string()[..12];
    let server = rover::sandbox::runnet::server_name(&dir);
    let sandboxed = format!("rover-older-{id}");
    let forged = format!("rover-forged-{id}");
    let run = |args: &[&str]| {
        let out = Command::new("docker").args(args).output().unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    let mount = format!("{}:/rover-proxy", dir.display());
    let project = format!("older-{id}");
    let project_label = format!("rover.proxy.project={project}");
    run(&[
        "create",
        "--name",
        &server,
        "--label",
        &project_label,
        "--label",
        "rover.proxy.role=server",
        "-v",
        &mount,
        &image,
        "sleep",
        "300",
    ]);
    run(&[
        "create",
        "--name",
        &sandboxed,
        "--label",
        &format!("rover.project={project}"),
        &image,
        "true",
    ]);
    // Claims a gone store while the engine mounts a dir that exists.
    let store_label = format!("rover.store={}", tmp.path().join("gone").display());
    let host_label = format!("rover.host={}", rover::sandbox::leftovers::host_id());
    run(&[
        "create",
        "--name",
        &forged,
        "--label",
        &project_label,
        "--label",
        "rover.proxy.role=server",
        "--label",
        &store_label,
        "--label",
        &host_label,
        "-v",
        &mount,
        &image,
        "sleep",
        "300",
    ]);
    let cleanup = Cleanup(vec![server.clone(), sandboxed.clone(), forged.clone()]);
    std::fs::remove_dir_all(tmp.path().join("store")).unwrap();

    let env = TestEnv::new();
    env.store();
    let swept = gc(&env, false);
    let entry = |list: &str, name: &str| {
        swept[list]
            .as_array()
            .unwrap()
            .iter()
            .find(|l| l["name"] == name)
            .cloned()
            .unwrap_or_else(|| panic!("{name} not {list}: {swept:#}"))
    };
    assert_eq!(entry("removed", &server)["reason"], "storeGone");
    assert_eq!(
        entry("removed", &server)["store"],
        json!(tmp.path().join("store"))
    );
    assert_eq!(entry("kept", &sandboxed)["reason"], "unknownStore");
    let lie = entry("kept", &forged);
    assert_eq!(lie["reason"], "invalidLabel");
    assert!(
        lie["detail"].as_str().unwrap().contains("but it mounts"),
        "{lie}"
    );
    let left = |name: &str| {
        let out = Command::new("docker")
            .args(["ps", "-aq", "--filter", &format!("name=^{name}$")])
            .output()
            .unwrap();
        !out.stdout.is_empty()
    };
    assert!(!left(&server) && left(&sandboxed) && left(&forged));

    // The text says why each is kept, and how to remove the older rover's by hand.
    let out = env.rover(&["autopilot", "gc", "--dry-run"]);
    let text = stdout(&out);
    assert!(
        text.contains(&format!(
            "kept sandbox {sandboxed} of project {project}: made by an older rover: its store cannot be told"
        )) && text.contains(&format!("`docker container rm -f {sandboxed}`")),
        "{text}"
    );
    assert!(
        text.contains(&format!("kept proxy server {forged}")),
        "{text}"
    );
    drop(cleanup);
}

/// Removes the named containers when dropped.
struct Cleanup(Vec<String>);

impl Drop for Cleanup {
    fn drop(&mut self) {
        let _ = Command::new("docker")
            .args(["rm", "-f", "-v"])
            .args(&self.0)
            .output();
    }
}

/// rover's proxy images (one per rover build that ran a proxy) are swept too: one no container
/// uses goes once an hour old (the rule is unit-tested in `sandbox::leftovers`); one imported a
/// moment ago, about to start a proxy server, stays.
#[tokio::test]
async fn gc_keeps_a_proxy_image_imported_a_moment_ago_and_lists_the_proxy_images() {
    let _sweep = ENGINE_SWEEP.lock().await;
    let _across = crate::support::docker::engine_sweep_across_processes(true).await;
    let tag = format!(
        "rover-proxy:{}",
        &uuid::Uuid::new_v4().simple().to_string()[..16]
    );
    let empty = tempfile::tempdir().unwrap();
    let tar = empty.path().join("empty.tar");
    let made = Command::new("tar")
        .args(["-cf", tar.to_str().unwrap(), "-T", "/dev/null"])
        .status()
        .unwrap();
    assert!(made.success());
    let imported = Command::new("docker")
        .args(["import", tar.to_str().unwrap(), &tag])
        .output()
        .unwrap();
    assert!(
        imported.status.success(),
        "{}",
        String::from_utf8_lossy(&imported.stderr)
    );
    let env = TestEnv::new();
    let out = env.rover(&["autopilot", "gc", "--json"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let all: Value = serde_json::from_str(&stdout(&out)).expect("gc --json");
    let images = &all["leftovers"]["proxyImages"];
    let listed = |list: &str| -> Vec<String> {
        images[list]
            .as_array()
            .expect("a list")
            .iter()
            .filter_map(|t| t.as_str().map(str::to_owned))
            .collect()
    };
    assert!(listed("kept").contains(&tag), "{images:#}");
    assert!(!listed("removed").contains(&tag), "{images:#}");
    let _ = Command::new("docker").args(["image", "rm", &tag]).output();
}
