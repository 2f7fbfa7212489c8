//! The dashboard on a big store: the real `rover autopilot dashboard` serving the store of
//! 20,000 traces and 100,000 spans (`store::big_store`) plus one trace of 1,000 spans, asked
//! over HTTP on loopback: the trace list's first page and that trace's page, p50 and p95 of
//! 40 requests each (the server's render and the loopback round trip); then the CPU the idle
//! dashboard uses over 5 s with nothing changing in the store. Bar (issue 39): under 100 ms p95.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use chrono::Utc;
use rover::store::{Action, Meta, Span, SpanStatus, StepKind, TraceIndex};
use serde_json::json;
use uuid::Uuid;

use crate::store::{big_store, write, BIG_STORE};

const SPANS: usize = 1_000;
const SAMPLES: usize = 40;

pub fn run() {
    let dir = tempfile::tempdir_in(
        std::env::var_os("ROVER_BENCH_DIR")
            .unwrap_or_else(|| std::env::temp_dir().into_os_string()),
    )
    .expect("temp dir");
    println!("\n== dashboard (data in {})", dir.path().display());
    let (store, _) = big_store(dir.path());
    let big = thousand_spans(&store);
    let mut child = Command::new(env!("CARGO_BIN_EXE_rover"))
        .args([
            "autopilot",
            "dashboard",
            "--addr",
            "127.0.0.1:0",
            "--project-id",
            BIG_STORE,
        ])
        .env("ROVER_DATA_DIR", dir.path())
        .env_remove("ROVER_DASHBOARD_TOKEN")
        .stdout(Stdio::piped())
        .spawn()
        .expect("rover autopilot dashboard");
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let addr: SocketAddr = line
        .split("http://")
        .nth(1)
        .and_then(|r| r.split('/').next())
        .and_then(|a| a.parse().ok())
        .expect("the dashboard's address");
    for (label, path, needle) in [
        (
            "trace list, first page",
            "/traces".to_owned(),
            "<tr class=\"trace\"",
        ),
        (
            "a trace of 1,000 spans",
            format!("/trace/{big}"),
            "<tr class=\"span\"",
        ),
    ] {
        let mut samples = Vec::new();
        for _ in 0..SAMPLES {
            let t = Instant::now();
            let body = get(addr, &path);
            samples.push(t.elapsed().as_secs_f64() * 1e3);
            assert!(
                body.contains(needle),
                "{path}: {}",
                &body[..body.len().min(400)]
            );
        }
        samples.sort_by(f64::total_cmp);
        let at = |q: f64| samples[((samples.len() - 1) as f64 * q).round() as usize];
        println!(
            "{label:<24} p50 {:>6.1} ms  p95 {:>6.1} ms (bar: under 100 ms p95)",
            at(0.5),
            at(0.95)
        );
    }
    let before = cpu_ticks(child.id());
    std::thread::sleep(Duration::from_secs(5));
    let after = cpu_ticks(child.id());
    println!(
        "idle dashboard, 5 s with the store unchanged: {} CPU ticks (1 tick = 10 ms)",
        after - before
    );
    let _ = child.kill();
    let _ = child.wait();
}

/// One trace of 1,000 spans: the event, then a plan whose 999 workflow runs follow each other.
fn thousand_spans(store: &rover::store::AutopilotStore) -> Uuid {
    let t0 = Utc::now() - chrono::Duration::hours(2);
    let mut meta = Meta::new();
    meta.insert(
        "label".into(),
        json!("IssuesEvent opened #1000 by alice: a big one"),
    );
    let mut root = Span::root(Uuid::new_v4(), t0, meta);
    root.finish(SpanStatus::Completed, "event", Meta::new(), t0)
        .unwrap();
    let mut index = TraceIndex::new(&root, "IssuesEvent opened #1000 by alice: a big one".into());
    write(&store.span_path(root.id), &root);
    let mut parent = root.clone();
    for n in 1..SPANS {
        let at = t0 + chrono::Duration::seconds(n as i64 * 5);
        let step = if n == 1 {
            StepKind::Plan
        } else {
            StepKind::Workflow
        };
        let action = Action::new(step.clone(), &parent, format!("task {n}"), Meta::new(), at);
        let mut span = Span::start(step, &action, root.id, at);
        let mut m = Meta::new();
        m.insert(
            "agent".into(),
            json!({"costUsd": 0.01, "inputTokens": 900, "outputTokens": 80}),
        );
        span.finish(
            SpanStatus::Completed,
            format!("task {n} done"),
            m,
            at + chrono::Duration::seconds(4),
        )
        .unwrap();
        write(&store.action_path(action.id), &action);
        write(&store.span_path(span.id), &span);
        index.add(&[span.id], &[action.id], at);
        if n == 1 {
            parent = span;
        }
    }
    write(&store.trace_index_path(root.id), &index);
    root.id
}

fn get(addr: SocketAddr, path: &str) -> String {
    let mut conn = TcpStream::connect(addr).unwrap();
    write!(
        conn,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut raw = Vec::new();
    conn.read_to_end(&mut raw).unwrap();
    String::from_utf8_lossy(&raw).into_owned()
}

/// utime + stime of a process, in clock ticks.
fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let after = stat.rsplit(')').next().unwrap_or_default();
    let fields: Vec<&str> = after.split_whitespace().collect();
    fields
        .get(11)
        .and_then(|u| u.parse::<u64>().ok())
        .unwrap_or(0)
        + fields
            .get(12)
            .and_then(|s| s.parse::<u64>().ok())
            .unwrap_or(0)
}
