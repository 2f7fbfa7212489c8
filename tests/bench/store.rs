//! Store figures: the atomic-write floor, durable queue operations against it, and `trace <id>`
//! on a store of 100,000 spans in 20,000 traces.

use std::fmt::Write as _;
use std::fs;
use std::path::Path;
use std::process::Command;
use std::time::Instant;

use chrono::{Duration, Utc};
use rover::store::fsio::write_json_atomic;
use rover::store::{Action, AutopilotStore, Meta, Span, SpanStatus, StepKind, TraceIndex};
use serde_json::json;
use uuid::Uuid;

use crate::percentiles;

const WRITES: usize = 300;

/// The atomic-write floor alone (for sections run without the store section).
pub fn floor_only() -> f64 {
    let dir = tempfile::tempdir().expect("temp dir");
    atomic_write_floor(dir.path())
}

pub fn run() -> f64 {
    let dir = tempfile::tempdir_in(
        std::env::var_os("ROVER_BENCH_DIR")
            .unwrap_or_else(|| std::env::temp_dir().into_os_string()),
    )
    .expect("temp dir");
    println!("\n== store (data in {})", dir.path().display());
    let floor = atomic_write_floor(dir.path());
    queue_ops(dir.path(), floor);
    queue_depth(dir.path());
    trace_lookup(dir.path());
    floor
}

/// One atomic write (temp file, fsync, rename, fsync dir) of a state-sized document.
fn atomic_write_floor(dir: &Path) -> f64 {
    let path = dir.join("floor.json");
    let doc = json!({"version": "1.0", "pending": (0..8).map(|i| json!({"actionId": Uuid::new_v4(), "n": i})).collect::<Vec<_>>()});
    let mut samples = Vec::with_capacity(WRITES);
    for _ in 0..WRITES {
        let t = Instant::now();
        write_json_atomic(&path, &doc).unwrap();
        samples.push(t.elapsed().as_secs_f64() * 1e6);
    }
    let (p50, p99) = percentiles(samples);
    println!(
        "atomic write (the floor)         p50 {p50:>8.0} us   p99 {p99:>8.0} us   {:>7.0} writes/s",
        1e6 / p50
    );
    p50
}

/// Durable enqueue and dequeue: each a locked read-modify-write of `state.json`.
fn queue_ops(dir: &Path, floor: f64) {
    let store = AutopilotStore::open(dir, "bench-queue").unwrap();
    let root = Span::root(Uuid::new_v4(), Utc::now(), Meta::new());
    // A queue with some depth, as a busy daemon has.
    store
        .transact(|txn| {
            for _ in 0..8 {
                let a = Action::new(
                    StepKind::Notify,
                    &root,
                    "background",
                    Meta::new(),
                    Utc::now(),
                );
                txn.push_pending(a.pending(root.id, Utc::now()))?;
            }
            Ok(())
        })
        .unwrap();
    let actions: Vec<Action> = (0..WRITES / 2)
        .map(|_| {
            Action::new(
                StepKind::Coordinate,
                &root,
                "bench",
                Meta::new(),
                Utc::now(),
            )
        })
        .collect();
    let mut samples = Vec::with_capacity(WRITES);
    let start = Instant::now();
    for a in &actions {
        let t = Instant::now();
        store
            .transact(|txn| txn.push_pending(a.pending(root.id, Utc::now())))
            .unwrap();
        samples.push(t.elapsed().as_secs_f64() * 1e6);
        let t = Instant::now();
        store.dequeue(a.id).unwrap().expect("was queued");
        samples.push(t.elapsed().as_secs_f64() * 1e6);
    }
    let per_sec = (actions.len() * 2) as f64 / start.elapsed().as_secs_f64();
    let (p50, p99) = percentiles(samples);
    println!("queue op (enqueue or dequeue)    p50 {p50:>8.0} us   p99 {p99:>8.0} us   {per_sec:>7.0} ops/s   = {:.2}x the floor (bar: within 2x)", p50 / floor);

    // With its action file and trace index, as `AutopilotStore::enqueue` does.
    let mut samples = Vec::with_capacity(WRITES / 2);
    for _ in 0..WRITES / 2 {
        let a = Action::new(
            StepKind::Coordinate,
            &root,
            "bench",
            Meta::new(),
            Utc::now(),
        );
        let t = Instant::now();
        store.enqueue(&a, root.id).unwrap();
        samples.push(t.elapsed().as_secs_f64() * 1e6);
    }
    let (p50, _) = percentiles(samples);
    println!(
        "enqueue with its action file     p50 {p50:>8.0} us   (2 durable writes: action + state)"
    );
}

/// One queue operation (a locked enqueue, then a locked dequeue, each timed) on queues of 0,
/// 100, 1,000 and 10,000 pending actions: the bar is that its cost does not grow with the queue.
/// "warm" reuses one store handle (the daemon); "cold" opens a fresh handle per operation, as a
/// separate `rover autopilot submit` process does.
fn queue_depth(dir: &Path) {
    const OPS: usize = 60;
    let mut warm_at = Vec::new();
    for depth in [0usize, 100, 1_000, 10_000] {
        let project = format!("bench-depth-{depth}");
        let store = AutopilotStore::open(dir, &project).unwrap();
        let root = Span::root(Uuid::new_v4(), Utc::now(), Meta::new());
        store
            .transact(|txn| {
                for _ in 0..depth {
                    let a = Action::new(StepKind::Notify, &root, "depth", Meta::new(), Utc::now());
                    txn.push_pending(a.pending(root.id, Utc::now()))?;
                }
                Ok(())
            })
            .unwrap();
        let mut line = format!("queue op at {depth:>6} pending     ");
        for cold in [false, true] {
            let mut samples = Vec::with_capacity(OPS * 2);
            for _ in 0..OPS {
                let a = Action::new(
                    StepKind::Coordinate,
                    &root,
                    "bench",
                    Meta::new(),
                    Utc::now(),
                );
                let handle = |s: &AutopilotStore| {
                    if cold {
                        AutopilotStore::open(dir, &project).unwrap()
                    } else {
                        s.clone()
                    }
                };
                let s = handle(&store);
                let t = Instant::now();
                s.transact(|txn| txn.push_pending(a.pending(root.id, Utc::now())))
                    .unwrap();
                samples.push(t.elapsed().as_secs_f64() * 1e6);
                let s = handle(&store);
                let t = Instant::now();
                s.dequeue(a.id).unwrap().expect("was queued");
                samples.push(t.elapsed().as_secs_f64() * 1e6);
            }
            let (p50, p99) = percentiles(samples);
            if !cold {
                warm_at.push(p50);
            }
            let label = if cold { "cold" } else { "warm" };
            let _ = write!(line, "{label} p50 {p50:>7.0} us p99 {p99:>7.0} us   ");
        }
        println!("{}", line.trim_end());
    }
    println!(
        "queue op at 1,000 vs 0 pending   {:.2}x (bar: at most 1.3x); at 10,000: {:.2}x",
        warm_at[2] / warm_at[0],
        warm_at[3] / warm_at[0]
    );
}

/// The project id of the big store.
pub const BIG_STORE: &str = "bench-traces";
const TRACES: usize = 20_000;

/// A store of 100,000 spans across 20,000 traces (5 spans and 4 actions each), written with
/// plain writes (the fixture, not the subject); each trace's root and last span ids.
pub fn big_store(dir: &Path) -> (AutopilotStore, Vec<(Uuid, Uuid)>) {
    let store = AutopilotStore::open(dir, BIG_STORE).unwrap();
    let t0 = Utc::now() - Duration::days(30);
    let start = Instant::now();
    let mut ids = Vec::new();
    let mut cache = rover::store::TracesCache::new(Utc::now());
    for n in 0..TRACES {
        let at = t0 + Duration::seconds(n as i64 * 60);
        let mut meta = Meta::new();
        meta.insert("label".into(), json!(format!("IssuesEvent opened #{n}")));
        let mut root = Span::root(Uuid::new_v4(), at, meta);
        root.finish(SpanStatus::Completed, "event", Meta::new(), at)
            .unwrap();
        let mut index = TraceIndex::new(&root, format!("IssuesEvent opened #{n}"));
        let mut parent = root.clone();
        write(&store.span_path(root.id), &root);
        for step in [
            StepKind::Coordinate,
            StepKind::Plan,
            StepKind::Workflow,
            StepKind::Noop,
        ] {
            let action = Action::new(step.clone(), &parent, "next", Meta::new(), at);
            let mut span = Span::start(step, &action, root.id, at);
            span.finish(SpanStatus::Completed, "done", Meta::new(), at)
                .unwrap();
            write(&store.action_path(action.id), &action);
            write(&store.span_path(span.id), &span);
            index.add(&[span.id], &[action.id], at);
            parent = span;
        }
        write(&store.trace_index_path(root.id), &index);
        cache.add(
            rover::store::TraceEntry {
                trace_id: root.id,
                created_at: at,
                event: index.event.clone(),
            },
            at,
        );
        ids.push((root.id, parent.id));
    }
    write(&store.traces_path(), &cache);
    println!(
        "generated {TRACES} traces, {} spans, {} actions in {:.1}s",
        TRACES * 5,
        TRACES * 4,
        start.elapsed().as_secs_f64()
    );
    (store, ids)
}

/// `trace <id>` by full id and by prefix on the big store.
fn trace_lookup(dir: &Path) {
    let (store, ids) = big_store(dir);

    // The library call, warm.
    let mut samples = Vec::new();
    for (i, (_, span)) in ids.iter().step_by(TRACES / 50).enumerate() {
        let t = Instant::now();
        let trace = store.resolve_trace_id(&span.to_string()).unwrap();
        let view = store.load_trace(trace).unwrap();
        let _ = rover::trace::render_tree(
            &view,
            rover::trace::Style::default(),
            Utc::now(),
            rover::steps::kinds::ends_trace,
        );
        samples.push(t.elapsed().as_secs_f64() * 1e6);
        assert_eq!(view.spans.len(), 5, "trace {i}");
    }
    let (p50, p99) = percentiles(samples);
    println!(
        "trace <span id>, in-process      p50 {:>8.2} ms  p99 {:>8.2} ms",
        p50 / 1000.0,
        p99 / 1000.0
    );

    // The binary, as a user runs it (process start included).
    let bin = env!("CARGO_BIN_EXE_rover");
    for (label, arg) in [
        ("full span id", ids[TRACES / 2].1.to_string()),
        (
            "8-char prefix",
            ids[TRACES / 3].1.to_string()[..8].to_owned(),
        ),
    ] {
        let mut samples = Vec::new();
        for _ in 0..15 {
            let t = Instant::now();
            let out = Command::new(bin)
                .args(["autopilot", "trace", &arg, "--project-id", BIG_STORE])
                .env("ROVER_DATA_DIR", dir)
                .output()
                .unwrap();
            samples.push(t.elapsed().as_secs_f64() * 1e6);
            assert!(
                out.status.success(),
                "{}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        let (p50, p99) = percentiles(samples);
        println!(
            "`rover autopilot trace` {label:<14} p50 {:>6.1} ms  p99 {:>6.1} ms (bar: under 50 ms)",
            p50 / 1000.0,
            p99 / 1000.0
        );
    }
}

pub fn write<T: serde::Serialize>(path: &Path, value: &T) {
    if let Some(id) = path
        .file_stem()
        .and_then(|s| s.to_str())
        .and_then(|s| Uuid::parse_str(s).ok())
    {
        let dir = path.parent().unwrap();
        let store_root = dir.parent().unwrap();
        let ids = store_root.join("autopilot").join("ids");
        match dir.file_name().and_then(|n| n.to_str()) {
            Some("spans") => rover_index(&ids, rover::store::IdKind::Span, id),
            Some("actions") => rover_index(&ids, rover::store::IdKind::Action, id),
            _ => {}
        }
    }
    fs::write(path, serde_json::to_vec_pretty(value).unwrap()).unwrap();
}

/// The fixture goes through the store's own id index, as records written by rover do.
fn rover_index(ids: &Path, kind: rover::store::IdKind, id: Uuid) {
    let store_root = ids.parent().unwrap().parent().unwrap();
    let data = store_root.parent().unwrap().parent().unwrap();
    let project = store_root.file_name().unwrap().to_str().unwrap();
    AutopilotStore::open(data, project)
        .unwrap()
        .index_id(kind, id);
}
