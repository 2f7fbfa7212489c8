//! Concurrency: readers (`trace`, `traces --json`, `status --json` through the binary, and
//! direct reads of every store file) hammer the store while a daemon writes and never see a torn
//! file or a failing command; daemons started together never run at once.

use std::io::Read;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use serde_json::Value;
use uuid::Uuid;

use crate::support::env::{stderr, stdout};
use crate::support::local::{Kind, LocalWorld};

/// One reader's tally.
#[derive(Default)]
struct Tally {
    calls: AtomicUsize,
    failures: Mutex<Vec<String>>,
}

impl Tally {
    fn fail(&self, what: String) {
        self.failures.lock().unwrap().push(what);
    }
}

/// Runs `cmd`; a non-zero exit or (with `json`) unparsable stdout is a failure.
fn check_command(tally: &Tally, mut cmd: Command, json: bool) {
    let out = cmd.stdin(Stdio::null()).output().unwrap();
    tally.calls.fetch_add(1, Ordering::Relaxed);
    if out.status.code() != Some(0) {
        tally.fail(format!(
            "{cmd:?} exited {:?}: {}",
            out.status.code(),
            stderr(&out)
        ));
    } else if json {
        if let Err(e) = serde_json::from_str::<Value>(&stdout(&out)) {
            tally.fail(format!("{cmd:?} printed unparsable JSON: {e}"));
        }
    }
}

/// Reads every store file once: `.json` whole, `.jsonl` line by line (complete lines only: an
/// append may be in progress). A file renamed away between listing and reading is skipped.
fn read_every_file(tally: &Tally, root: &std::path::Path) {
    let mut stack = vec![root.to_owned()];
    while let Some(dir) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            if entry.file_type().is_ok_and(|t| t.is_dir()) {
                stack.push(path);
                continue;
            }
            let ext = path
                .extension()
                .map(|e| e.to_string_lossy().to_ascii_lowercase());
            let Ok(bytes) = std::fs::read(&path) else {
                continue;
            };
            tally.calls.fetch_add(1, Ordering::Relaxed);
            match ext.as_deref() {
                Some("json") => {
                    if let Err(e) = serde_json::from_slice::<Value>(&bytes) {
                        tally.fail(format!("torn {}: {e}", path.display()));
                    }
                }
                Some("jsonl") => {
                    let text = String::from_utf8_lossy(&bytes);
                    let complete = text.rsplit_once('\n').map_or("", |(head, _)| head);
                    for line in complete.lines() {
                        if let Err(e) = serde_json::from_str::<Value>(line) {
                            tally.fail(format!("torn line in {}: {e}: {line}", path.display()));
                        }
                    }
                }
                _ => {}
            }
        }
    }
}

#[test]
fn readers_hammering_the_store_while_the_daemon_writes_never_see_a_torn_file() {
    let world = tokio::runtime::Runtime::new()
        .unwrap()
        .block_on(LocalWorld::new(false));
    let world = Arc::new(world);
    let ids: Vec<Uuid> = (0..40)
        .map(|n| {
            let kind = if n % 2 == 0 { Kind::Noop } else { Kind::Ask };
            world.submit(kind, n)
        })
        .collect();
    let mut daemon = world.spawn_daemon();
    let stop = Arc::new(AtomicBool::new(false));
    let readers: Vec<(&str, Arc<Tally>)> = ["trace", "traces", "status", "files"]
        .into_iter()
        .map(|name| (name, Arc::new(Tally::default())))
        .collect();
    let mut handles = Vec::new();
    for (name, tally) in &readers {
        let (name, tally, stop, world, ids) = (
            *name,
            tally.clone(),
            stop.clone(),
            world.clone(),
            ids.clone(),
        );
        handles.push(std::thread::spawn(move || {
            let root = world.store().root().to_owned();
            let mut n = 0;
            while !stop.load(Ordering::Relaxed) {
                n += 1;
                match name {
                    "trace" => {
                        let id = ids[n % ids.len()].to_string();
                        check_command(&tally, world.command(&["autopilot", "trace", &id]), false);
                        check_command(
                            &tally,
                            world.command(&["autopilot", "trace", &id, "--json"]),
                            true,
                        );
                    }
                    "traces" => check_command(
                        &tally,
                        world.command(&["autopilot", "traces", "--json"]),
                        true,
                    ),
                    "status" => check_command(
                        &tally,
                        world.command(&["autopilot", "status", "--json"]),
                        true,
                    ),
                    _ => read_every_file(&tally, &root),
                }
            }
        }));
    }
    world.wait_settled(&ids, Duration::from_secs(120));
    stop.store(true, Ordering::Relaxed);
    for h in handles {
        h.join().unwrap();
    }
    kill(
        Pid::from_raw(i32::try_from(daemon.id()).unwrap()),
        Signal::SIGTERM,
    )
    .unwrap();
    assert_eq!(daemon.wait().unwrap().code(), Some(0));
    let mut figures = Vec::new();
    for (name, tally) in &readers {
        let failures = tally.failures.lock().unwrap();
        assert!(failures.is_empty(), "{name}: {failures:#?}");
        let calls = tally.calls.load(Ordering::Relaxed);
        assert!(calls > 0, "{name} read at least once");
        figures.push(format!("{name} {calls}"));
    }
    eprintln!(
        "proof concurrency: {} traces written while readers ran ({}), 0 torn, 0 failed",
        ids.len(),
        figures.join(", ")
    );
}

#[test]
fn daemons_started_together_never_run_at_once() {
    let world = tokio::runtime::Runtime::new()
        .unwrap()
        .block_on(LocalWorld::new(false));
    let store = world.store();
    let mut refused = 0;
    for round in 0..3 {
        world.submit(Kind::Noop, round);
        let mut daemons: Vec<_> = (0..4).map(|_| world.spawn_daemon_piped()).collect();
        // The losers exit at once; the winner keeps running until stopped.
        let start = Instant::now();
        let mut exited = Vec::new();
        while exited.len() < 3 {
            assert!(start.elapsed() < Duration::from_secs(60), "the losers exit");
            for (i, d) in daemons.iter_mut().enumerate() {
                if !exited.contains(&i) && d.try_wait().unwrap().is_some() {
                    exited.push(i);
                }
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        // Give a fourth exit the chance to show (it must not happen).
        std::thread::sleep(Duration::from_millis(500));
        let running: Vec<usize> = (0..4)
            .filter(|i| daemons[*i].try_wait().unwrap().is_none())
            .collect();
        assert_eq!(running.len(), 1, "round {round}: exactly one daemon runs");
        let winner = running[0];
        let winner_pid = daemons[winner].id().to_string();
        assert_eq!(store.daemon_pid().as_deref(), Some(winner_pid.as_str()));
        for i in exited {
            let code = daemons[i].wait().unwrap().code();
            let mut err = String::new();
            daemons[i]
                .stderr
                .take()
                .unwrap()
                .read_to_string(&mut err)
                .unwrap();
            let out = (code, err);
            assert_eq!(
                out.0,
                Some(75),
                "round {round}: a loser exits 75 (try again later): {}",
                out.1
            );
            assert!(
                out.1.contains(&format!("pid {winner_pid}")),
                "round {round}: the refusal names the running daemon's pid {winner_pid}: {}",
                out.1
            );
            refused += 1;
        }
        kill(
            Pid::from_raw(i32::try_from(daemons[winner].id()).unwrap()),
            Signal::SIGTERM,
        )
        .unwrap();
        assert_eq!(daemons[winner].wait().unwrap().code(), Some(0));
    }
    eprintln!("proof concurrency: 3 rounds of 4 daemons started together, 1 ran each time, {refused} refused naming its pid");
}
