//! The daemon's long-lived tasks are supervised (`docs/cli.md#supervision`): a panic in one is
//! said, and the task restarted or the daemon stopped with it, never silently gone. Panics are
//! injected with `ROVER_TEST_PANIC` (debug builds only) into the real binary.

use std::io::{BufRead, BufReader};
use std::process::{Child, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use serde_json::json;

use crate::support::env::stdout;
use crate::support::scenario::Scenario;

/// A daemon's stdout, collected line by line as it comes.
fn collect(child: &mut Child) -> Arc<Mutex<String>> {
    let out = Arc::new(Mutex::new(String::new()));
    let sink = out.clone();
    let reader = BufReader::new(child.stdout.take().unwrap());
    std::thread::spawn(move || {
        for line in reader.lines() {
            let Ok(line) = line else { return };
            let mut all = sink.lock().unwrap();
            all.push_str(&line);
            all.push('\n');
        }
    });
    out
}

/// Waits (async: the fake GitHub serves on this runtime) until `done`, at most `limit`.
async fn until(what: &str, limit: Duration, out: &Mutex<String>, done: impl Fn() -> bool) {
    let start = Instant::now();
    while !done() {
        assert!(
            start.elapsed() < limit,
            "timed out waiting for {what}; output:\n{}",
            out.lock().unwrap()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// An untrusted author's issue: a trace that ends in a `noop` without any agent.
fn seed_untrusted_issue(s: &Scenario, number: u64) {
    s.github
        .add_issue(number, "Do it", "Please.", "mallory", &[]);
    s.github.seed_event("IssuesEvent", "mallory", json!({"action": "opened", "issue": {"number": number, "title": "Do it", "body": "Please.", "user": {"login": "mallory"}}}));
}

#[tokio::test]
async fn a_panicking_poller_is_restarted_and_the_daemon_keeps_working() {
    let s = Scenario::new().await;
    seed_untrusted_issue(&s, 61);
    let mut child = s
        .start_command(&[])
        .env("ROVER_TEST_PANIC", "poller:2")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("start rover");
    let out = collect(&mut child);
    let store = s.store();
    until(
        "the event's trace to end",
        Duration::from_secs(60),
        &out,
        || {
            store.recent_traces(10).unwrap_or_default().iter().any(|t| {
                store.load_trace(t.trace_id).is_ok_and(|v| {
                    v.spans
                        .iter()
                        .any(|sp| sp.step.as_str() == "noop" && sp.completed.is_some())
                })
            })
        },
    )
    .await;
    kill(Pid::from_raw(child.id().cast_signed()), Signal::SIGTERM).unwrap();
    let status = tokio::task::spawn_blocking(move || child.wait().unwrap())
        .await
        .unwrap();
    let out = out.lock().unwrap().clone();
    assert_eq!(status.code(), Some(0), "{out}");
    for (run, delay) in [(1, 1), (2, 2)] {
        let said = format!("warning: the poller panicked: injected panic in the poller (ROVER_TEST_PANIC, run {run}); restarting it in {delay} s ({run} of at most 5 in 10 minutes)");
        assert!(out.contains(&said), "{said}\n{out}");
    }
    assert!(!out.contains("run 3"), "{out}");
    assert!(out.contains("rover autopilot stopped"), "{out}");
}

#[tokio::test]
async fn a_panicking_drain_or_webhook_server_stops_the_daemon_with_the_error() {
    let s = Scenario::new().await;
    for component in ["drain", "webhook server"] {
        let mut child = s
            .start_command(&["--webhook", "127.0.0.1:0"])
            .env("ROVER_WEBHOOK_SECRET", "a-webhook-secret-for-tests")
            .env("ROVER_TEST_PANIC", component)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start rover");
        let out = collect(&mut child);
        // It stops by itself, without a signal.
        let waited = tokio::task::spawn_blocking(move || {
            let start = Instant::now();
            loop {
                if let Some(status) = child.try_wait().unwrap() {
                    let mut err = String::new();
                    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut err)
                        .unwrap();
                    return Some((status, err));
                }
                if start.elapsed() > Duration::from_secs(60) {
                    let _ = child.kill();
                    return None;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        })
        .await
        .unwrap();
        let out = out.lock().unwrap().clone();
        let (status, err) = waited.unwrap_or_else(|| panic!("{component}: still running\n{out}"));
        assert_eq!(status.code(), Some(70), "{component}: {out}\n{err}");
        let said = format!(
            "error: the {component} panicked: injected panic in the {component} (ROVER_TEST_PANIC, run 1); rover is stopping"
        );
        assert!(out.contains(&said), "{said}\n{out}");
        assert!(
            err.contains(&format!("rover stopped: the {component} panicked"))
                && err.contains("recovered at the next start"),
            "{component}: {err}"
        );
    }
    // Nothing is left held: the next run starts and ends normally.
    let next = s.run_once().await;
    assert!(next.status.success(), "{}", stdout(&next));
}

/// The console (the lines on stdout) is a view: a panic in it is said and it starts again, and
/// what happens after the restart is printed again; the daemon's work never stops.
#[tokio::test]
async fn a_panicking_console_is_restarted_and_prints_again() {
    let s = Scenario::new().await;
    let mut child = s
        .start_command(&[])
        .env("ROVER_TEST_PANIC", "console:1")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("start rover");
    let out = collect(&mut child);
    let said = "warning: the console panicked: injected panic in the console (ROVER_TEST_PANIC, run 1); restarting it in 1s";
    until("the console's panic", Duration::from_secs(60), &out, || {
        out.lock().unwrap().contains(said)
    })
    .await;
    // Work that comes after the restart (1 s later) is printed by the restarted console; what
    // happened in between is not (the traces have it).
    tokio::time::sleep(Duration::from_secs(3)).await;
    seed_untrusted_issue(&s, 62);
    until(
        "the restarted console to print the new trace",
        Duration::from_secs(60),
        &out,
        || {
            let all = out.lock().unwrap();
            all.split_once(said)
                .is_some_and(|(_, after)| after.contains(" noop started"))
        },
    )
    .await;
    kill(Pid::from_raw(child.id().cast_signed()), Signal::SIGTERM).unwrap();
    let status = tokio::task::spawn_blocking(move || child.wait().unwrap())
        .await
        .unwrap();
    let out = out.lock().unwrap().clone();
    assert_eq!(status.code(), Some(0), "{out}");
    assert_eq!(out.matches("the console panicked").count(), 1, "{out}");
    assert!(out.contains("rover autopilot stopped"), "{out}");
}

/// Without its signal handler a daemon could no longer be stopped gracefully: a panic in it
/// stops the daemon, exit 70 (internal), saying why.
#[tokio::test]
async fn a_panicking_signal_handler_stops_the_daemon_with_the_error() {
    let s = Scenario::new().await;
    let mut cmd = s.start_command(&[]);
    cmd.env("ROVER_TEST_PANIC", "signals");
    let out = tokio::time::timeout(
        Duration::from_secs(60),
        tokio::task::spawn_blocking(move || cmd.output().unwrap()),
    )
    .await
    .expect("it stops by itself")
    .unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert_eq!(out.status.code(), Some(70), "{stdout}\n{stderr}");
    assert!(
        stdout.contains("error: the signal handler panicked: injected panic in the signals (ROVER_TEST_PANIC, run 1); rover is stopping"),
        "{stdout}"
    );
    assert!(
        stderr.contains("rover stopped: the signal handler panicked"),
        "{stderr}"
    );
    // Nothing is left held: the next run starts and ends normally.
    let next = s.run_once().await;
    assert!(
        next.status.success(),
        "{}",
        crate::support::env::stdout(&next)
    );
}
