//! One daemon serving many repositories (`ROVER_BENCH_FLEET`, default 100) of a fake GitHub,
//! each with its own fake, checkout, `rover.json` and store: the start time (until every
//! repository is `serving`), the resident memory and CPU of the idle daemon over 60 s, and the
//! GitHub requests of that minute (an unchanged feed, asked with its ETag, is a 304).

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::orchestrator::{cpu_ticks, rss_kib};
use crate::support::env::{rover_bin, TestEnv};
use crate::support::fake_github::{FakeGitHub, BOT, TOKEN};

/// The feed's `X-Poll-Interval` the fakes answer: every repository polls about this often.
const POLL_SECS: u64 = 10;
/// How long the idle daemon is watched.
const IDLE: Duration = Duration::from_secs(60);

pub fn run() {
    let n: usize = std::env::var("ROVER_BENCH_FLEET")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100);
    println!("\n== one daemon, {n} repositories (a fake GitHub each, polled every {POLL_SECS} s)");
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let env = TestEnv::new();
    env.repo(); // the fake agent as `claude`
    let root = env.path().join("fleet");
    let template = template(&root);
    let mut fakes = Vec::with_capacity(n);
    let mut entries = Vec::with_capacity(n);
    for i in 0..n {
        let name = format!("bench-org/r{i:03}");
        let checkout = root.join(format!("r{i:03}"));
        copy(&template, &checkout);
        let github = rt.block_on(FakeGitHub::start_for(&name));
        github.set_poll_interval(POLL_SECS);
        entries.push(json!({"repo": name, "checkout": checkout, "apiUrl": github.url}));
        fakes.push(github);
    }
    let home = env.path().join("home");
    let file = home.join(".config/rover/daemon.json");
    std::fs::create_dir_all(file.parent().unwrap()).unwrap();
    std::fs::write(&file, json!({"repositories": entries}).to_string()).unwrap();

    let started = Instant::now();
    let mut daemon = start(&env, &home);
    let status = env.path().join("data/daemon/repositories.json");
    let deadline = Instant::now() + Duration::from_secs(600);
    let mut all_serving = None;
    // Started: every repository set up (`serving`), then checked (GitHub, the agent CLI,
    // Docker) and polling: its feed asked once.
    loop {
        if all_serving.is_none() && serving(&status) == n {
            all_serving = Some(started.elapsed().as_secs_f64());
        }
        let polled = fakes
            .iter()
            .filter(|f| f.count(&axum::http::Method::GET, "/events") > 0)
            .count();
        if all_serving.is_some() && polled == n {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "after 10 minutes: {} of {n} repositories serving, {polled} polled",
            serving(&status)
        );
        assert!(daemon.try_wait().unwrap().is_none(), "the daemon exited");
        std::thread::sleep(Duration::from_millis(50));
    }
    println!(
        "start: all {n} set up (their checkout, rover.json, store) in {:.1} s; all checked and polling (each feed asked once) in {:.1} s",
        all_serving.unwrap_or_default(),
        started.elapsed().as_secs_f64()
    );
    // Settled: the first polls (each repository's backlog) are behind it.
    std::thread::sleep(Duration::from_secs(POLL_SECS + 5));
    let cpu0 = cpu_ticks(daemon.id());
    let t0 = Instant::now();
    std::thread::sleep(IDLE);
    let t1 = Instant::now();
    // USER_HZ on Linux: 100 ticks a second.
    let cpu = (cpu_ticks(daemon.id()) - cpu0) as f64 / 100.0;
    let wall = (t1 - t0).as_secs_f64();
    let rss = rss_kib(daemon.id());
    let minute: Vec<u16> = fakes
        .iter()
        .flat_map(FakeGitHub::requests)
        .filter(|r| r.at >= t0 && r.at < t1)
        .map(|r| r.status)
        .collect();
    let not_modified = minute.iter().filter(|s| **s == 304).count();
    println!(
        "idle: {:.1} MiB resident, {cpu:.2} s of CPU in {wall:.0} s ({:.1} % of a core) (bar: one repository's daemon, `orchestrator`)",
        rss as f64 / 1024.0,
        100.0 * cpu / wall
    );
    let polls = wall / POLL_SECS as f64;
    println!(
        "GitHub requests in that minute: {} ({:.2} per repository per poll interval of {POLL_SECS} s), {not_modified} of them 304 (an unchanged feed, free against the rate limit)",
        minute.len(),
        minute.len() as f64 / n as f64 / polls
    );
    let _ = daemon.kill();
    let _ = daemon.wait();
}

/// A checkout with its bare origin and a `rover.json`, copied for each repository.
fn template(root: &Path) -> std::path::PathBuf {
    let template = root.join("template");
    std::fs::create_dir_all(&template).unwrap();
    let origin = root.join("origin.git");
    git(
        root,
        &[
            "init",
            "-q",
            "--bare",
            "-b",
            "main",
            origin.to_str().unwrap(),
        ],
    );
    git(&template, &["init", "-q", "-b", "main"]);
    std::fs::write(
        template.join("rover.json"),
        json!({"autopilot": {
            "github": {"botLogin": BOT, "poll": {"minIntervalSecs": 0, "skipBacklog": false, "reconcileIntervalSecs": 0}},
            "pipeline": {"fallbackIntervalSecs": 30, "followCi": false, "selfReview": false}
        }})
        .to_string(),
    )
    .unwrap();
    git(&template, &["add", "-A"]);
    git(
        &template,
        &[
            "-c",
            "user.name=t",
            "-c",
            "user.email=t@e",
            "commit",
            "-q",
            "-m",
            "init",
        ],
    );
    git(
        &template,
        &["remote", "add", "origin", origin.to_str().unwrap()],
    );
    git(&template, &["push", "-q", "origin", "main"]);
    template
}

fn copy(from: &Path, to: &Path) {
    let ok = Command::new("cp")
        .arg("-a")
        .arg(from)
        .arg(to)
        .status()
        .unwrap();
    assert!(ok.success());
}

fn git(dir: &Path, args: &[&str]) {
    let ok = Command::new("git")
        .args(args)
        .current_dir(dir)
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .stdout(Stdio::null())
        .status()
        .unwrap();
    assert!(ok.success(), "git {args:?}");
}

fn start(env: &TestEnv, home: &Path) -> Child {
    Command::new(rover_bin())
        .args(["autopilot", "start"])
        .current_dir(home)
        .env("HOME", home)
        .env_remove("XDG_CONFIG_HOME")
        .env("ROVER_DATA_DIR", env.path().join("data"))
        .env("NO_COLOR", "1")
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("ROVER_CLAUDE_BIN", env.path().join("bin").join("claude"))
        .env("GITHUB_TOKEN", TOKEN)
        .env_remove("GH_TOKEN")
        .env_remove("ROVER_GITHUB_API_URL")
        .env_remove("OTEL_EXPORTER_OTLP_ENDPOINT")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start the daemon")
}

/// How many repositories the daemon's standing says are serving.
fn serving(status: &Path) -> usize {
    std::fs::read_to_string(status)
        .ok()
        .and_then(|t| serde_json::from_str::<Value>(&t).ok())
        .and_then(|v| v["repositories"].as_array().cloned())
        .map_or(0, |repos| {
            repos.iter().filter(|r| r["state"] == "serving").count()
        })
}
