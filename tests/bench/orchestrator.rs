//! Orchestrator figures: dispatch latency (enqueue → step start) under load, step transitions per
//! second with instant steps next to the durable-write floor, and the idle daemon's CPU and memory.

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use rover::orchestrator::{
    Finished, NextAction, OrchestratorSettings, Outcome, Step, StepContext, StepError,
    StepOrchestrator,
};
use rover::store::{AutopilotStore, StepKind, StepRun};
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use crate::percentiles;

/// Durable writes per transition (begin: queue entry, running span; finish: produced action,
/// finished span, trace index, queue): the floor for transitions/s is the write rate / 6.
const WRITES_PER_TRANSITION: f64 = 6.0;

/// Traces pushed through the loop for the latency and throughput figures.
const TRACES: usize = 200;

struct Instant0 {
    kind: StepKind,
    next: Option<StepKind>,
    started: Arc<Mutex<HashMap<Uuid, Instant>>>,
}

#[async_trait]
impl Step for Instant0 {
    fn kind(&self) -> StepKind {
        self.kind.clone()
    }
    fn max_parallel(&self) -> usize {
        5
    }
    async fn process(&self, _ctx: &StepContext, run: &StepRun) -> Result<Outcome, StepError> {
        self.started
            .lock()
            .unwrap()
            .entry(run.pending.trace_id)
            .or_insert_with(Instant::now);
        let mut f = Finished::completed("instant");
        if let Some(k) = &self.next {
            f = f.then(NextAction::new(k.clone(), "next"));
        }
        Ok(Outcome::Finished(f))
    }
}

pub fn run(floor_us: f64) {
    println!("\n== orchestrator");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    // A sustainable load: a trace every 25 ms (80 transitions/s, below the write-bound capacity),
    // so the latency is the dispatch itself, not queueing.
    let (samples, _) = rt.block_on(drive(Duration::from_millis(25), TRACES / 4));
    let (p50, p99) = percentiles(samples);
    println!("dispatch latency, a trace every 25 ms  p50 {:>6.2} ms  p99 {:>6.2} ms  (the claim itself is 2 durable writes ≈ {:.1} ms; bar: 2 ms plus those)", p50 / 1e3, p99 / 1e3, 2.0 * floor_us / 1e3);
    // Saturated: a trace every 2 ms, far above capacity; the latency is queueing.
    let (samples, elapsed) = rt.block_on(drive(Duration::from_millis(2), TRACES));
    let (p50, p99) = percentiles(samples);
    println!("dispatch latency, saturated (every 2 ms) p50 {:>6.2} ms  p99 {:>6.2} ms  (queueing behind the disk)", p50 / 1e3, p99 / 1e3);
    let transitions = (TRACES * 2) as f64;
    let bound = 1e6 / floor_us / WRITES_PER_TRANSITION;
    println!(
        "transitions/s with instant steps  {:>7.0}   (durable-write floor allows {:.0}/s at {} writes each; ratio {:.2}, bar: within 2x)",
        transitions / elapsed,
        bound,
        WRITES_PER_TRANSITION,
        bound / (transitions / elapsed)
    );
    idle_daemon();
}

/// Submit `traces` traces one every `every` through a running orchestrator with instant steps;
/// returns each trace's enqueue → first step start, in microseconds, and the seconds it all took.
async fn drive(every: Duration, traces: usize) -> (Vec<f64>, f64) {
    let dir = tempfile::tempdir().unwrap();
    let store = AutopilotStore::open(dir.path(), "bench-orch").unwrap();
    let started = Arc::new(Mutex::new(HashMap::new()));
    let steps: Vec<Arc<dyn Step>> = vec![
        Arc::new(Instant0 {
            kind: StepKind::Coordinate,
            next: Some(StepKind::Noop),
            started: started.clone(),
        }),
        Arc::new(Instant0 {
            kind: StepKind::Noop,
            next: None,
            started: Arc::new(Mutex::new(HashMap::new())),
        }),
    ];
    let orch = StepOrchestrator::new(store.clone(), steps, OrchestratorSettings::default());
    let token = CancellationToken::new();
    let runner = orch.clone();
    let t = token.clone();
    let task = tokio::spawn(async move { runner.run(t).await });

    let mut enqueued = HashMap::new();
    let begin = Instant::now();
    for i in 0..traces {
        let (root, first) = rover::steps::event::local_trace(&format!("bench {i}"), "bench");
        let s = store.clone();
        let trace_id = root.id;
        tokio::task::spawn_blocking(move || s.create_trace(&root, Some(&first), &[]))
            .await
            .unwrap()
            .unwrap();
        enqueued.insert(trace_id, Instant::now());
        orch.wake();
        tokio::time::sleep(every).await;
    }
    loop {
        let s = store.clone();
        let pending = tokio::task::spawn_blocking(move || s.read_state().unwrap().pending.len())
            .await
            .unwrap();
        if pending == 0 && orch.in_flight() == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let elapsed = begin.elapsed().as_secs_f64();
    token.cancel();
    task.await.unwrap().unwrap();
    let started = started.lock().unwrap();
    let samples: Vec<f64> = enqueued
        .iter()
        .filter_map(|(t, at)| {
            started
                .get(t)
                .map(|s| s.duration_since(*at).as_secs_f64() * 1e6)
        })
        .collect();
    (samples, elapsed)
}

/// The real binary, idle: CPU time used over a window and resident memory.
fn idle_daemon() {
    let secs: u64 = std::env::var("ROVER_BENCH_IDLE_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(60);
    let dir = tempfile::tempdir().unwrap();
    let repo = dir.path().join("repo");
    std::fs::create_dir_all(&repo).unwrap();
    let git = |args: &[&str]| {
        assert!(std::process::Command::new("git")
            .args(args)
            .current_dir(&repo)
            .env("GIT_CONFIG_GLOBAL", "/dev/null")
            .status()
            .unwrap()
            .success());
    };
    git(&["init", "-q"]);
    git(&[
        "-c",
        "user.name=b",
        "-c",
        "user.email=b@b",
        "commit",
        "-q",
        "--allow-empty",
        "-m",
        "init",
    ]);
    let bin = dir.path().join("claude");
    std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_rover-fake-agent"), &bin).unwrap();
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_rover"))
        .args(["autopilot", "start", "--local"])
        .current_dir(&repo)
        .env("ROVER_DATA_DIR", dir.path().join("data"))
        .env("ROVER_CLAUDE_BIN", &bin)
        .env("DOCKER_HOST", "unix:///nonexistent.sock")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_secs(3));
    let pid = child.id();
    let before = cpu_ticks(pid);
    std::thread::sleep(Duration::from_secs(secs));
    let after = cpu_ticks(pid);
    let rss = rss_kib(pid);
    let _ = child.kill();
    let _ = child.wait();
    let ticks_per_sec = 100.0; // USER_HZ on Linux
    let cpu = (after - before) as f64 / ticks_per_sec;
    println!("idle daemon over {secs}s: cpu {:.3}s ({:.3}% of one core), resident memory {:.1} MiB (bar: near 0 CPU, under 20 MB)", cpu, cpu / secs as f64 * 100.0, rss as f64 / 1024.0);
}

fn cpu_ticks(pid: u32) -> u64 {
    let stat =
        std::fs::read_to_string(Path::new("/proc").join(pid.to_string()).join("stat")).unwrap();
    let after_comm = &stat[stat.rfind(')').unwrap() + 2..];
    let fields: Vec<&str> = after_comm.split_whitespace().collect();
    fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap()
}

fn rss_kib(pid: u32) -> u64 {
    let status =
        std::fs::read_to_string(Path::new("/proc").join(pid.to_string()).join("status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}
