//! Orchestrator figures: dispatch latency (enqueue → step start) under load, step transitions per
//! second with instant steps next to the durable-write floor (with the store's durable writes,
//! fsyncs and lock wait per transition, from `rover::store::stats`), and the idle daemon's CPU and
//! memory. Each figure is taken `ROVER_BENCH_ROUNDS` times (default 5): median and min–max.

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use rover::orchestrator::{
    Finished, NextAction, OrchestratorSettings, Outcome, Step, StepContext, StepError,
    StepOrchestrator,
};
use rover::store::stats::{io_stats, IoStats};
use rover::store::{AutopilotStore, StepKind, StepRun};
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use crate::percentiles;

/// Traces pushed through the loop for the latency and throughput figures.
const TRACES: usize = 200;

/// How many times each figure is taken; the median and the spread (min–max) are printed.
fn rounds() -> usize {
    std::env::var("ROVER_BENCH_ROUNDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(5)
        .max(1)
}

struct Instant0 {
    kind: StepKind,
    next: Option<StepKind>,
    started: Arc<Mutex<HashMap<Uuid, Instant>>>,
    /// Whether its runs take one of the daemon's agent slots (bid on the shared board).
    slot: bool,
}

#[async_trait]
impl Step for Instant0 {
    fn kind(&self) -> StepKind {
        self.kind.clone()
    }
    fn max_parallel(&self) -> usize {
        5
    }
    fn takes_agent_slot(&self) -> bool {
        self.slot
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

/// Median and min–max of a few rounds' figures.
fn spread(mut xs: Vec<f64>) -> (f64, f64, f64) {
    xs.sort_by(f64::total_cmp);
    (xs[xs.len() / 2], xs[0], xs[xs.len() - 1])
}

/// The store's durable I/O per transition over a window.
fn per_transition(io: IoStats, transitions: usize) -> String {
    let n = transitions as f64;
    format!(
        "{:.2} durable writes ({:.2} journal appends), {:.2} fsyncs, {:.2} store locks: waited {:.3} ms, held {:.3} ms",
        io.durable_writes as f64 / n,
        io.journal_appends as f64 / n,
        io.fsyncs as f64 / n,
        io.locks as f64 / n,
        io.lock_wait.as_secs_f64() * 1e3 / n,
        io.lock_hold.as_secs_f64() * 1e3 / n,
    )
}

pub fn run(floor_us: f64) {
    println!("\n== orchestrator ({} rounds; median [min–max])", rounds());
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let claim = rt.block_on(claim_cost());
    let claim_ms = claim.0 / 1e3;
    println!(
        "the claim alone (begin_step)      p50 {claim_ms:>6.2} ms: {} durable writes, {} fsyncs",
        claim.1.durable_writes, claim.1.fsyncs
    );

    // A sustainable load: a trace every 25 ms (80 transitions/s, below the write-bound capacity),
    // so the latency is the dispatch itself, not queueing.
    let mut p50s = Vec::new();
    let mut p99s = Vec::new();
    let mut io = IoStats::default();
    let mut transitions = 0;
    for _ in 0..rounds() {
        let r = rt.block_on(drive(Duration::from_millis(25), TRACES / 4));
        let (p50, p99) = percentiles(r.samples);
        p50s.push(p50 / 1e3);
        p99s.push(p99 / 1e3);
        io = r.io;
        transitions = r.transitions;
    }
    let (p50, lo, hi) = spread(p50s);
    let (p99, _, _) = spread(p99s);
    println!("dispatch latency, a trace every 25 ms  p50 {p50:>6.2} ms [{lo:.2}–{hi:.2}]  p99 {p99:>6.2} ms  (bar: 2 ms plus the claim's {claim_ms:.2} ms = {:.2} ms)", 2.0 + claim_ms);
    println!(
        "  per transition, trace creation included: {}",
        per_transition(io, transitions)
    );
    fleet_dispatch(&rt);

    // Saturated: a trace every 2 ms, far above capacity; the latency is queueing.
    let mut p50s = Vec::new();
    let mut rates = Vec::new();
    for _ in 0..rounds() {
        let r = rt.block_on(drive(Duration::from_millis(2), TRACES));
        let (p50, _) = percentiles(r.samples);
        p50s.push(p50 / 1e3);
        rates.push(r.transitions as f64 / r.elapsed);
    }
    let (p50, lo, hi) = spread(p50s);
    let (rate, rlo, rhi) = spread(rates);
    println!("dispatch latency, saturated (every 2 ms) p50 {p50:>6.2} ms [{lo:.2}–{hi:.2}]  (queueing behind the disk); {rate:.0}/s [{rlo:.0}–{rhi:.0}] transitions while the traces are submitted");

    // Throughput: a queue of traces, then the loop runs until it is empty.
    let mut rates = Vec::new();
    let mut bounds = Vec::new();
    let mut ratios = Vec::new();
    let mut io = IoStats::default();
    let mut transitions = 0;
    for _ in 0..rounds() {
        let r = rt.block_on(throughput(TRACES));
        let rate = r.transitions as f64 / r.elapsed;
        let writes = r.io.durable_writes as f64 / r.transitions as f64;
        let bound = 1e6 / floor_us / writes;
        rates.push(rate);
        bounds.push(bound);
        ratios.push(bound / rate);
        io = r.io;
        transitions = r.transitions;
    }
    let (rate, rlo, rhi) = spread(rates);
    let (bound, _, _) = spread(bounds);
    let (ratio, qlo, qhi) = spread(ratios);
    println!(
        "transitions/s with instant steps  {rate:>7.0} [{rlo:.0}–{rhi:.0}]   (the durable-write floor allows {bound:.0}/s; ratio {ratio:.2} [{qlo:.2}–{qhi:.2}], bar: within 2x)"
    );
    println!("  per transition: {}", per_transition(io, transitions));
    idle_daemon();
}

/// What one run of the loop measured.
struct Drive {
    /// Each trace's enqueue → first step start, in microseconds.
    samples: Vec<f64>,
    elapsed: f64,
    transitions: usize,
    /// The store's I/O while the loop ran.
    io: IoStats,
}

fn instant_steps(started: &Arc<Mutex<HashMap<Uuid, Instant>>>) -> Vec<Arc<dyn Step>> {
    slotted_steps(started, false)
}

/// The two instant steps; with `slot`, the first one's runs take an agent slot.
fn slotted_steps(started: &Arc<Mutex<HashMap<Uuid, Instant>>>, slot: bool) -> Vec<Arc<dyn Step>> {
    vec![
        Arc::new(Instant0 {
            kind: StepKind::Coordinate,
            next: Some(StepKind::Noop),
            started: started.clone(),
            slot,
        }),
        Arc::new(Instant0 {
            kind: StepKind::Noop,
            next: None,
            started: Arc::new(Mutex::new(HashMap::new())),
            slot: false,
        }),
    ]
}

async fn create_trace(store: &AutopilotStore, i: usize) -> Uuid {
    let (root, first) = rover::intake::local_trace(
        &rover::steps::kinds::FIRST_STEP,
        &format!("bench {i}"),
        "bench",
    );
    let s = store.clone();
    let trace_id = root.id;
    tokio::task::spawn_blocking(move || s.create_trace(&root, Some(&first), &[]))
        .await
        .unwrap()
        .unwrap();
    trace_id
}

async fn until_empty(store: &AutopilotStore, orch: &StepOrchestrator) {
    loop {
        let s = store.clone();
        let pending = tokio::task::spawn_blocking(move || s.read_state().unwrap().pending.len())
            .await
            .unwrap();
        if pending == 0 && orch.in_flight() == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

/// Submit `traces` traces one every `every` through a running orchestrator with instant steps.
/// The I/O window holds the traces' creation too (one per two transitions).
async fn drive(every: Duration, traces: usize) -> Drive {
    let dir = tempfile::tempdir().unwrap();
    let store = AutopilotStore::open(dir.path(), "bench-orch").unwrap();
    let started = Arc::new(Mutex::new(HashMap::new()));
    let orch = StepOrchestrator::new(
        store.clone(),
        instant_steps(&started),
        OrchestratorSettings::default(),
    );
    let token = CancellationToken::new();
    let runner = orch.clone();
    let t = token.clone();
    let task = tokio::spawn(async move { runner.run(t).await });

    let mut enqueued = HashMap::new();
    let begin = Instant::now();
    let before = io_stats();
    for i in 0..traces {
        let trace_id = create_trace(&store, i).await;
        enqueued.insert(trace_id, Instant::now());
        orch.wake();
        tokio::time::sleep(every).await;
    }
    until_empty(&store, &orch).await;
    let elapsed = begin.elapsed().as_secs_f64();
    let io = io_stats() - before;
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
    Drive {
        samples,
        elapsed,
        transitions: traces * 2,
        io,
    }
}

/// `traces` traces queued first, then the loop started and run until the queue is empty.
async fn throughput(traces: usize) -> Drive {
    let dir = tempfile::tempdir().unwrap();
    let store = AutopilotStore::open(dir.path(), "bench-orch").unwrap();
    for i in 0..traces {
        create_trace(&store, i).await;
    }
    let started = Arc::new(Mutex::new(HashMap::new()));
    let orch = StepOrchestrator::new(
        store.clone(),
        instant_steps(&started),
        OrchestratorSettings::default(),
    );
    let token = CancellationToken::new();
    let runner = orch.clone();
    let t = token.clone();
    let before = io_stats();
    let begin = Instant::now();
    let task = tokio::spawn(async move { runner.run(t).await });
    until_empty(&store, &orch).await;
    let elapsed = begin.elapsed().as_secs_f64();
    let io = io_stats() - before;
    token.cancel();
    task.await.unwrap().unwrap();
    Drive {
        samples: Vec::new(),
        elapsed,
        transitions: traces * 2,
        io,
    }
}

/// The claim alone: `begin_step` on queued actions, one at a time.
async fn claim_cost() -> (f64, IoStats) {
    let dir = tempfile::tempdir().unwrap();
    let store = AutopilotStore::open(dir.path(), "bench-claim").unwrap();
    let mut samples = Vec::new();
    let mut io = IoStats::default();
    for i in 0..50 {
        let (root, first) = rover::intake::local_trace(
            &rover::steps::kinds::FIRST_STEP,
            &format!("claim {i}"),
            "bench",
        );
        let s = store.clone();
        let (t, delta) = tokio::task::spawn_blocking(move || {
            s.create_trace(&root, Some(&first), &[]).unwrap();
            let before = io_stats();
            let t = Instant::now();
            s.begin_step(first.id, &StepKind::Coordinate).unwrap();
            (t.elapsed().as_secs_f64() * 1e6, io_stats() - before)
        })
        .await
        .unwrap();
        samples.push(t);
        io = delta;
    }
    (percentiles(samples).0, io)
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

pub fn cpu_ticks(pid: u32) -> u64 {
    let stat =
        std::fs::read_to_string(Path::new("/proc").join(pid.to_string()).join("stat")).unwrap();
    let after_comm = &stat[stat.rfind(')').unwrap() + 2..];
    let fields: Vec<&str> = after_comm.split_whitespace().collect();
    fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap()
}

pub fn rss_kib(pid: u32) -> u64 {
    let status =
        std::fs::read_to_string(Path::new("/proc").join(pid.to_string()).join("status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// Repositories of the many-repository dispatch figure.
const FLEET_REPOS: usize = 100;

/// Dispatch latency with one daemon serving [`FLEET_REPOS`] repositories, beside the
/// one-repository figure: an orchestrator and a store per repository on one runtime, all
/// bidding on one slot board as the daemon's do; a trace every 25 ms to the next repository in
/// turn. Taken with host-side first steps, then with first steps that take an agent slot.
fn fleet_dispatch(rt: &tokio::runtime::Runtime) {
    for slot in [false, true] {
        let mut p50s = Vec::new();
        let mut p99s = Vec::new();
        for _ in 0..rounds() {
            let samples = rt.block_on(drive_fleet(Duration::from_millis(25), TRACES / 4, slot));
            let (p50, p99) = percentiles(samples);
            p50s.push(p50 / 1e3);
            p99s.push(p99 / 1e3);
        }
        let (p50, lo, hi) = spread(p50s);
        let (p99, _, _) = spread(p99s);
        let what = if slot {
            "first step takes an agent slot"
        } else {
            "host-side first step"
        };
        println!("dispatch latency, {FLEET_REPOS} repositories, {what}  p50 {p50:>6.2} ms [{lo:.2}–{hi:.2}]  p99 {p99:>6.2} ms");
    }
}

/// `traces` traces, one every `every`, each to the next of [`FLEET_REPOS`] repositories;
/// returns each trace's enqueue → first step start, in microseconds.
async fn drive_fleet(every: Duration, traces: usize, slot: bool) -> Vec<f64> {
    let dir = tempfile::tempdir().unwrap();
    let board = rover::orchestrator::SlotBoard::new(rover::orchestrator::SlotSettings {
        max_runs: 4,
        max_runs_per_repository: 2,
        weights: rover::orchestrator::ScoreWeights::default(),
    });
    let started = Arc::new(Mutex::new(HashMap::new()));
    let token = CancellationToken::new();
    let mut repos = Vec::with_capacity(FLEET_REPOS);
    let mut tasks = Vec::with_capacity(FLEET_REPOS);
    for r in 0..FLEET_REPOS {
        let name = format!("bench-org/r{r:03}");
        let id = format!("r{r:03}");
        let store = AutopilotStore::open(&dir.path().join(&id), &id).unwrap();
        let orch = StepOrchestrator::new(
            store.clone(),
            slotted_steps(&started, slot),
            OrchestratorSettings::default(),
        )
        .with_slots(board.clone(), &name);
        let runner = orch.clone();
        let t = token.clone();
        tasks.push(tokio::spawn(async move { runner.run(t).await }));
        repos.push((store, orch));
    }
    let mut enqueued = HashMap::new();
    for i in 0..traces {
        let (store, orch) = &repos[i % FLEET_REPOS];
        let trace_id = create_trace(store, i).await;
        enqueued.insert(trace_id, Instant::now());
        orch.wake();
        tokio::time::sleep(every).await;
    }
    for (store, orch) in &repos {
        until_empty(store, orch).await;
    }
    token.cancel();
    for task in tasks {
        task.await.unwrap().unwrap();
    }
    let started = started.lock().unwrap();
    enqueued
        .iter()
        .filter_map(|(t, at)| {
            started
                .get(t)
                .map(|s| s.duration_since(*at).as_secs_f64() * 1e6)
        })
        .collect()
}
