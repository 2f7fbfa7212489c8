//! Cold commands: a fresh `rover` process per operation (`submit`, `status`, an idle
//! `start --once --local`) against stores of 0 and 1,000 pending actions and 100 and 20,000
//! traces. The bar: a separate process's cost is independent of history and flat in the queue
//! (at most 1.3x from the smallest store to each larger one).
//!
//! The binary is the bench build's own (`CARGO_BIN_EXE_rover`: the `bench` profile, which is the
//! release profile). The stores are written with plain writes for the history (the fixture, not
//! the subject) and through the store API for the queue and the intake log.

use std::fs;
use std::path::Path;
use std::process::Command;
use std::time::Instant;

use chrono::{Duration, Utc};
use rover::store::{
    Action, AutopilotStore, IntakeOutcome, IntakeRecord, Meta, Span, SpanStatus, StepKind,
    TraceEntry, TraceIndex, TracesCache,
};
use serde_json::json;
use uuid::Uuid;

use crate::percentiles;

/// Runs of each command per store.
const RUNS: usize = 21;

pub fn run() {
    let dir = tempfile::tempdir_in(
        std::env::var_os("ROVER_BENCH_DIR")
            .unwrap_or_else(|| std::env::temp_dir().into_os_string()),
    )
    .expect("temp dir");
    // `ROVER_BENCH_KEEP=1` leaves the stores on disk, to profile a command against them by hand.
    let keep = std::env::var_os("ROVER_BENCH_KEEP").is_some();
    println!(
        "\n== cold commands (a fresh `rover` process per operation, {RUNS} runs each, p50; data in {})",
        dir.path().display()
    );
    let repo = dir.path().join("repo");
    fs::create_dir_all(&repo).unwrap();
    let git = |args: &[&str]| {
        let ok = Command::new("git")
            .args(args)
            .current_dir(&repo)
            .env("GIT_CONFIG_GLOBAL", "/dev/null")
            .env("GIT_CONFIG_NOSYSTEM", "1")
            .status()
            .unwrap();
        assert!(ok.success());
    };
    git(&["init", "-q", "-b", "main"]);
    git(&[
        "-c",
        "user.name=t",
        "-c",
        "user.email=t@e",
        "commit",
        "-q",
        "--allow-empty",
        "-m",
        "init",
    ]);
    let bin = dir.path().join("bin");
    fs::create_dir_all(&bin).unwrap();
    std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_rover-fake-agent"), bin.join("claude")).unwrap();
    let env = Env {
        data: dir.path().join("data"),
        repo,
        claude: bin.join("claude"),
    };

    // Four stores, then round-robin runs, so that the machine's drift (other load, the disk's
    // own flushes) falls on every store alike.
    let configs = [
        (100usize, 0usize),
        (100, 1_000),
        (20_000, 0),
        (20_000, 1_000),
    ];
    let mut stores = Vec::new();
    for (traces, pending) in configs {
        let project = format!("cold-{traces}-{pending}");
        let store = AutopilotStore::open(&env.data, &project).unwrap();
        let t = Instant::now();
        let parent = history(&store, traces);
        set_queue(&store, &parent, pending);
        println!(
            "generated {traces} traces ({} files) and {pending} pending in {:.1}s",
            traces * 4,
            t.elapsed().as_secs_f64()
        );
        stores.push((project, store));
    }
    // Per store: samples of submit, status, idle --once (ms).
    let mut samples = vec![[Vec::new(), Vec::new(), Vec::new()]; configs.len()];
    for _ in 0..RUNS {
        for (i, (project, store)) in stores.iter().enumerate() {
            samples[i][1].push(env.time(project, &["autopilot", "status"], None));
            samples[i][2].push(env.time(
                project,
                &["autopilot", "start", "--once", "--local"],
                None,
            ));
            samples[i][0].push(env.time(
                project,
                &["autopilot", "submit", "look at the flaky test"],
                Some(store),
            ));
        }
    }
    let p50: Vec<[f64; 3]> = samples
        .into_iter()
        .map(|s| s.map(|v| percentiles(v).0))
        .collect();
    for ((traces, pending), [submit, status, once]) in configs.iter().zip(&p50) {
        println!(
            "cold at {traces:>6} traces {pending:>5} pending   submit {submit:>6.1} ms   status {status:>6.1} ms   idle --once {once:>6.1} ms"
        );
    }
    for (i, name) in ["submit", "status", "idle --once"].iter().enumerate() {
        println!(
            "cold {name:<12} 1,000 vs 0 pending {:.2}x; 20,000 vs 100 traces {:.2}x; both {:.2}x (bar: at most 1.3x)",
            p50[1][i] / p50[0][i],
            p50[2][i] / p50[0][i],
            p50[3][i] / p50[0][i],
        );
    }
    if keep {
        let kept = dir.keep();
        println!("stores kept in {} (ROVER_BENCH_KEEP)", kept.display());
    }
}

struct Env {
    data: std::path::PathBuf,
    repo: std::path::PathBuf,
    claude: std::path::PathBuf,
}

impl Env {
    /// One run of `rover <args>`, in ms; with `undo`, what it queued is taken off the queue
    /// again (a submit's coordinate), outside the timing, so the queue stays as set.
    fn time(&self, project: &str, args: &[&str], undo: Option<&AutopilotStore>) -> f64 {
        let before = undo.map(|s| s.read_state().unwrap().pending.len());
        let t = Instant::now();
        let out = Command::new(env!("CARGO_BIN_EXE_rover"))
            .args(args)
            .arg("--project-id")
            .arg(project)
            .env("ROVER_DATA_DIR", &self.data)
            .env("ROVER_CLAUDE_BIN", &self.claude)
            .env("NO_COLOR", "1")
            .env("GIT_CONFIG_GLOBAL", "/dev/null")
            .env("GIT_CONFIG_NOSYSTEM", "1")
            // No Docker: the same fast refusal for every store.
            .env("DOCKER_HOST", "unix:///nonexistent/docker.sock")
            .env_remove("GITHUB_TOKEN")
            .env_remove("GH_TOKEN")
            .current_dir(&self.repo)
            .output()
            .unwrap();
        let ms = t.elapsed().as_secs_f64() * 1e3;
        assert!(
            out.status.success(),
            "rover {args:?}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        if let (Some(store), Some(before)) = (undo, before) {
            let state = store.read_state().unwrap();
            let added: Vec<Uuid> = state.pending[before..]
                .iter()
                .map(|p| p.action_id)
                .collect();
            for id in added {
                store.dequeue(id).unwrap();
            }
        }
        ms
    }
}

/// `n` finished traces (a root event span and a `noop` each, as an ignored event leaves), over
/// the last 60 days, with their indexes, the id-prefix index, `traces.json` and a full intake
/// log. Returns a span to hang the queue's actions on.
fn history(store: &AutopilotStore, n: usize) -> Span {
    let t0 = Utc::now() - Duration::days(60);
    let step = Duration::milliseconds(60 * 24 * 3600 * 1000 / n as i64);
    let mut cache = TracesCache::new(Utc::now());
    let mut last = None;
    for i in 0..n {
        let at = t0 + step * i as i32;
        let label = format!("IssuesEvent opened #{i}");
        let mut root = Span::root(
            Uuid::new_v4(),
            at,
            rover_meta(&json!({"type": "IssuesEvent", "action": "opened", "label": label})),
        );
        root.finish(SpanStatus::Completed, &label, Meta::new(), at)
            .unwrap();
        let action = Action::new(StepKind::Noop, &root, "not for rover", Meta::new(), at);
        let mut span = Span::start(StepKind::Noop, &action, root.id, at);
        span.finish(SpanStatus::Completed, "ignored", Meta::new(), at)
            .unwrap();
        let mut index = TraceIndex::new(&root, label.clone());
        index.add(&[span.id], &[action.id], at);
        put(&store.span_path(root.id), &root);
        put(&store.span_path(span.id), &span);
        put(&store.action_path(action.id), &action);
        put(&store.trace_index_path(root.id), &index);
        store.index_id(rover::store::IdKind::Span, root.id);
        store.index_id(rover::store::IdKind::Span, span.id);
        store.index_id(rover::store::IdKind::Action, action.id);
        cache.add(
            TraceEntry {
                trace_id: root.id,
                created_at: at,
                event: label,
            },
            at,
        );
        last = Some(root);
    }
    put(&store.traces_path(), &cache);
    // The intake log as a long-running store has it: both files full (fewer for a young store).
    let records: Vec<IntakeRecord> = (0..n.min(rover::store::intake::FILE_RECORDS * 2 - 1))
        .map(|i| {
            let mut r = IntakeRecord::new("poll", IntakeOutcome::Skipped, Utc::now())
                .reason("action `milestoned` is not one rover reacts to");
            r.event_id = Some(format!("4000000{i:04}"));
            r.kind = Some("IssuesEvent".into());
            r.action = Some("milestoned".into());
            r.number = Some(i as u64);
            r.actor = Some("alice".into());
            r
        })
        .collect();
    for chunk in records.chunks(rover::store::intake::FILE_RECORDS) {
        store.append_intake(chunk).unwrap();
    }
    last.expect("at least one trace")
}

/// Make the queue exactly `n` scheduled actions (not due for a month: an idle `--once` runs
/// none), folded into `state.json`.
fn set_queue(store: &AutopilotStore, parent: &Span, n: usize) {
    let later = Utc::now() + Duration::days(30);
    store
        .transact(|txn| {
            let ids: Vec<Uuid> = txn.state()?.pending.iter().map(|p| p.action_id).collect();
            for id in ids {
                txn.remove_pending(id)?;
            }
            for _ in 0..n {
                let a = Action::new(
                    StepKind::Coordinate,
                    parent,
                    "wait for CI",
                    Meta::new(),
                    Utc::now(),
                );
                let mut p = a.pending(parent.id, Utc::now());
                p.not_before = Some(later);
                txn.push_pending(p)?;
            }
            Ok(())
        })
        .unwrap();
    store.compact_state().unwrap();
}

fn rover_meta(v: &serde_json::Value) -> Meta {
    v.as_object().cloned().unwrap_or_default()
}

fn put<T: serde::Serialize>(path: &Path, value: &T) {
    fs::write(path, serde_json::to_vec_pretty(value).unwrap()).unwrap();
}
