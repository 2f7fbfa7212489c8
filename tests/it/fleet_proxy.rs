//! One model proxy for every repository of a daemon file: the real `rover` binary serving two
//! repositories of the fake GitHub, the real claude as each one's workflow agent in the real
//! sandbox image, against the fake model API. While both agents work, one proxy server runs
//! for the daemon (none of a repository's own), each run's relay on its own network; each run's
//! wire ledger is recorded in its own repository's span, and the repositories' different
//! `rover.json` (their codex prices) never restart the server. Stopped with no run in flight,
//! the daemon leaves no server, relay or run network behind.

use std::path::{Path, PathBuf};

use serde_json::{json, Value};

use crate::fleet::{alpha_beta_broken, good_config, open_issue, standing, Daemon, Repo};
use crate::fleet_budget::{configure, store_of, traces, wait_long, Proxies};
use crate::real_cli::{json_flag_answers, real_sandbox_image};
use crate::support::env::TestEnv;
use crate::support::fake_anthropic::{FakeAnthropic, Reply};
use crate::support::scenario::merge;
use rover::agent_run::RunNetworkMeta;
use rover::sandbox::leftovers::LABEL_STORE;
use rover::sandbox::runnet::{LABEL_PROXY_PROJECT, LABEL_PROXY_ROLE};
use rover::sandbox::LABEL_PROJECT;

/// The file each workflow agent waits for in its workspace before it ends: both run at once.
const GATE: &str = ".rover-go";

/// rover's containers carrying all of `labels`, as the engine lists them: each one's id, name
/// and store label.
fn containers(labels: &[(&str, &str)]) -> Vec<(String, String, String)> {
    listed(
        &["ps", "-a"],
        labels,
        "{{.ID}} {{.Names}} {{.Label \"rover.store\"}}",
    )
}

/// The run networks carrying all of `labels`: each one's id, name and store label.
fn networks(labels: &[(&str, &str)]) -> Vec<(String, String, String)> {
    listed(
        &["network", "ls"],
        labels,
        "{{.ID}} {{.Name}} {{.Label \"rover.store\"}}",
    )
}

fn listed(list: &[&str], labels: &[(&str, &str)], format: &str) -> Vec<(String, String, String)> {
    let mut cmd = std::process::Command::new("docker");
    cmd.args(list);
    for (k, v) in labels {
        cmd.args(["--filter", &format!("label={k}={v}")]);
    }
    let out = cmd.args(["--format", format]).output().expect("docker");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            let mut parts = l.splitn(3, ' ');
            Some((
                parts.next()?.to_owned(),
                parts.next()?.to_owned(),
                parts.next().unwrap_or_default().to_owned(),
            ))
        })
        .collect()
}

/// When the engine made the container `id`.
fn created(id: &str) -> chrono::DateTime<chrono::FixedOffset> {
    let out = std::process::Command::new("docker")
        .args(["inspect", "-f", "{{.Created}}", id])
        .output()
        .expect("docker inspect");
    chrono::DateTime::parse_from_rfc3339(String::from_utf8_lossy(&out.stdout).trim())
        .expect("a creation time")
}

/// Whether the container `name` runs.
fn running(name: &str) -> bool {
    let out = std::process::Command::new("docker")
        .args(["inspect", "-f", "{{.State.Running}}", name])
        .output()
        .expect("docker inspect");
    String::from_utf8_lossy(&out.stdout).trim() == "true"
}

/// Removes the repositories' agent containers when dropped (the test's daemon may be killed
/// while they wait).
struct Agents<'a> {
    env: &'a TestEnv,
    home: &'a Path,
}

impl Drop for Agents<'_> {
    fn drop(&mut self) {
        let now = standing(self.env, self.home);
        for repo in now.as_object().into_iter().flat_map(|m| m.values()) {
            if let Some(project) = repo["projectId"].as_str() {
                crate::support::docker::remove_containers(&format!("{LABEL_PROJECT}={project}"));
            }
        }
    }
}

/// The worktrees (dirs with a `.git`) under `dir`, two levels down at most.
fn worktrees(dir: &Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let mut look = vec![(dir.to_path_buf(), 0)];
    while let Some((dir, depth)) = look.pop() {
        if dir.join(".git").exists() {
            found.push(dir);
            continue;
        }
        if depth < 2 {
            for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
                if entry.file_type().is_ok_and(|t| t.is_dir()) {
                    look.push((entry.path(), depth + 1));
                }
            }
        }
    }
    found
}

/// The wire ledger of the workflow span of `name`'s first trace, once completed.
fn workflow_network(env: &TestEnv, home: &Path, name: &str) -> Option<RunNetworkMeta> {
    let store = store_of(env, home, name)?;
    traces(&store).into_iter().find_map(|t| {
        let span = t
            .spans
            .iter()
            .find(|s| s.step.as_str() == "workflow" && s.completed.is_some())?;
        Some(RunNetworkMeta::of(&span.meta))
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_proxy_server_serves_every_repositorys_runs_and_each_ledger_stays_in_its_repository() {
    // A real `gc` elsewhere in the suite sweeps the whole engine: held shared, so none judges
    // this daemon's shared server, relays and networks while they come and go.
    let _sweeps = crate::support::docker::engine_sweep_across_processes(false).await;
    let env = TestEnv::new();
    let (home, alpha, beta, _broken) = alpha_beta_broken(&env).await;
    let wait = format!("until [ -e /workspace/{GATE} ]; do sleep 1; done");
    let answer =
        json!({"status": "completed", "summary": "Ran the command.", "files_changed": [GATE]});
    let tools = vec![
        json!({"name": "Bash", "input": {"command": wait, "description": "wait", "timeout": 600_000}}),
    ];
    let workflow = json!({"__input_tokens": 1_000, "__tools": tools, "answer": answer});
    let api =
        FakeAnthropic::scripted(vec![Reply::BySystem(json_flag_answers(Some(workflow)))]).await;
    let mut config = good_config();
    merge(
        &mut config,
        &json!({"autopilot": {
            "agent": {"extraEnv": ["CLAUDE_CODE_MAX_RETRIES"]},
            "sandbox": {"image": real_sandbox_image(), "memoryMb": 2048, "cpus": 1.0, "timeoutSecs": 600,
                "workspace": "mounted",
                "envAllow": ["CLAUDE_CODE_MAX_RETRIES", "IS_SANDBOX"]}}}),
    );
    configure(&alpha, &config);
    // Beta prices codex its own way: the shared server's settings must not change for it.
    merge(
        &mut config,
        &json!({"autopilot": {"agent": {"codexPrices": {"gpt-5": {"inputPerMTok": 9.0, "outputPerMTok": 90.0}}}}}),
    );
    configure(&beta, &config);
    let list: Vec<Value> = [&alpha, &beta]
        .iter()
        .map(|r: &&Repo| json!({"repo": r.name, "checkout": r.checkout, "apiUrl": r.github.url}))
        .collect();
    std::fs::write(
        home.join(".config/rover/daemon.json"),
        serde_json::to_string_pretty(&json!({"repositories": list})).unwrap(),
    )
    .unwrap();
    open_issue(&alpha, 81, "Add a --json flag");
    open_issue(&beta, 82, "Add a --json flag");

    let mut cmd = crate::fleet_budget::real_claude_daemon(&env, &home, &api);
    // Dropped in reverse: the daemon killed, its agents removed, then its proxy.
    let _proxies = Proxies {
        env: &env,
        home: &home,
    };
    let _agents = Agents {
        env: &env,
        home: &home,
    };
    let mut daemon = Daemon(cmd.spawn().expect("start the daemon"));
    let said = || crate::fleet_budget::daemon_said(&env);
    let data = env.path().join("data");
    let daemon_dir = data.join("daemon");
    let owner = daemon_dir.display().to_string();
    let project = |name: &str| -> String {
        standing(&env, &home)[name]["projectId"]
            .as_str()
            .unwrap_or_default()
            .to_owned()
    };

    // Both agents at work (each waits for its gate in its mounted worktree): one relay each,
    // one server for the daemon.
    let relays = |p: &str| containers(&[(LABEL_PROXY_ROLE, "relay"), (LABEL_PROXY_PROJECT, p)]);
    let working = |p: &str| {
        relays(p).iter().any(|r| {
            let agent = r.1.trim_end_matches("-relay");
            containers(&[(LABEL_PROJECT, p)])
                .iter()
                .any(|c| c.1 == agent && running(agent))
        })
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(420);
    loop {
        let (a, b) = (project("octo-org/alpha"), project("octo-org/beta"));
        if !a.is_empty() && !b.is_empty() && working(&a) && working(&b) {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "both repositories' agents not at work (alpha {a:?}, beta {b:?}); containers {:?}\nthe daemon said:\n{}",
            containers(&[(LABEL_STORE, &owner)]),
            said()
        );
        std::thread::sleep(std::time::Duration::from_millis(500));
    }
    let (a, b) = (project("octo-org/alpha"), project("octo-org/beta"));
    let servers = containers(&[(LABEL_PROXY_ROLE, "server"), (LABEL_STORE, &owner)]);
    assert_eq!(servers.len(), 1, "{servers:?}\n{}", said());
    assert!(servers[0].1.starts_with("rover-proxy-"), "{servers:?}");
    let all_servers = containers(&[(LABEL_PROXY_ROLE, "server")]);
    let server_created = created(&servers[0].0);
    let mut runs = Vec::new();
    for p in [&a, &b] {
        assert!(
            !all_servers.iter().any(|s| s
                .2
                .starts_with(&data.join("projects").display().to_string())),
            "a server of a repository alone: {all_servers:?}"
        );
        let relays = relays(p);
        assert_eq!(relays.len(), 1, "{relays:?}");
        assert_eq!(relays[0].2, owner, "{relays:?}");
        // Made before either run's relay: the second repository's run did not restart it with
        // its own settings (its `codexPrices` differ).
        assert!(server_created < created(&relays[0].0), "{relays:?}");
        runs.push(relays[0].1.trim_end_matches("-relay").to_owned());
        // The store's proxy dir leads to its dir under the daemon's server.
        let link = data.join("projects").join(p).join("proxy");
        assert_eq!(
            std::fs::read_link(&link).expect("a link"),
            daemon_dir.join("proxy").join(p)
        );
    }

    // Let both agents end.
    for p in [&a, &b] {
        for worktree in worktrees(&data.join("projects").join(p).join("worktrees")) {
            std::fs::write(worktree.join(GATE), "go\n").unwrap();
        }
    }
    for (name, run) in ["octo-org/alpha", "octo-org/beta"].iter().zip(&runs) {
        let mut found = None;
        wait_long(&format!("{name}'s workflow recorded"), 300, || {
            found = workflow_network(&env, &home, name);
            found.is_some()
        });
        let meta = found.unwrap();
        let wire = meta
            .network
            .as_ref()
            .unwrap_or_else(|| panic!("{name}'s span has no wire ledger: {meta:?}\n{}", said()));
        // Its own run's ledger, the one its own relay carried.
        assert_eq!(&wire.run, run, "{wire:?}");
        assert!(wire.requests >= 1, "{wire:?}");
        assert!(wire.usage.input >= 1_000, "{wire:?}");
    }
    // Neither repository's settings restarted the one server.
    let now = containers(&[(LABEL_PROXY_ROLE, "server"), (LABEL_STORE, &owner)]);
    assert_eq!(now, servers);
    let log = std::fs::read_to_string(daemon_dir.join("log.jsonl")).unwrap_or_default();
    assert!(
        !log.contains("restarting rover's sandbox proxy"),
        "the server was restarted"
    );

    // Every run collected: stopped, the daemon takes its proxy with it.
    wait_long("every run's relay removed", 120, || {
        containers(&[(LABEL_PROXY_ROLE, "relay"), (LABEL_STORE, &owner)]).is_empty()
    });
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(i32::try_from(daemon.0.id()).unwrap()),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    wait_long("the daemon stopped", 120, || {
        daemon.0.try_wait().ok().flatten().is_some()
    });
    assert!(
        containers(&[(LABEL_STORE, &owner)]).is_empty(),
        "{}",
        said()
    );
    assert!(networks(&[(LABEL_STORE, &owner)]).is_empty());
    for p in [&a, &b] {
        assert!(containers(&[(LABEL_PROXY_PROJECT, p)]).is_empty());
        assert!(networks(&[(LABEL_PROXY_PROJECT, p)]).is_empty());
    }
}
