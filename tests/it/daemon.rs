//! `rover autopilot start` as a user runs it: in the background until SIGTERM, `--once` for cron,
//! one daemon per project, and SIGKILL at random moments with every trace still finishing once.

use std::io::Read;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use chrono::Utc;
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use rover::store::{Action, AutopilotStore, Meta, Span, SpanStatus, StepKind, TraceOutcome};
use uuid::Uuid;

use crate::support::child::Rng;
use crate::support::env::{stderr, stdout, TestEnv};

/// A trace whose first action is `noop` (the step every build has), as if coordinated.
fn noop_trace(store: &AutopilotStore, n: usize) -> Uuid {
    let now = Utc::now();
    let mut meta = Meta::new();
    meta.insert("label".into(), format!("test event {n}").into());
    let mut root = Span::root(Uuid::new_v4(), now, meta);
    root.finish(SpanStatus::Completed, "test event", Meta::new(), now)
        .unwrap();
    let first = Action::new(
        StepKind::Noop,
        &root,
        format!("nothing to do for event {n}"),
        Meta::new(),
        now,
    );
    store.create_trace(&root, Some(&first), &[]).unwrap();
    root.id
}

fn spawn_start(env: &TestEnv, args: &[&str]) -> Child {
    let mut all = vec!["autopilot", "start", "--local"];
    all.extend_from_slice(args);
    env.command(&all)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start rover")
}

fn pid(child: &Child) -> Pid {
    Pid::from_raw(i32::try_from(child.id()).expect("pids fit in i32"))
}

fn wait_for(what: &str, limit: Duration, mut done: impl FnMut() -> bool) {
    let start = Instant::now();
    while !done() {
        assert!(start.elapsed() < limit, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn running_spans(store: &AutopilotStore, traces: &[Uuid]) -> usize {
    traces
        .iter()
        .map(|t| {
            store
                .load_trace(*t)
                .unwrap()
                .spans
                .iter()
                .filter(|s| s.status == SpanStatus::Running)
                .count()
        })
        .sum()
}

#[test]
fn start_runs_until_sigterm_and_stops_cleanly() {
    let env = TestEnv::new();
    env.repo();
    let store = env.store();
    let traces: Vec<Uuid> = (0..5).map(|n| noop_trace(&store, n)).collect();
    let mut daemon = spawn_start(&env, &[]);
    wait_for("the traces to finish", Duration::from_secs(30), || {
        traces.iter().all(|t| {
            matches!(
                rover::steps::kinds::trace_outcome(&store.load_trace(*t).unwrap()),
                TraceOutcome::Finished { .. }
            )
        })
    });
    assert!(
        store.daemon_pid().is_some(),
        "the daemon lock names the running daemon"
    );
    kill(pid(&daemon), Signal::SIGTERM).unwrap();
    let out = wait_output(&mut daemon);
    assert_eq!(out.0, Some(0), "graceful stop exits 0: {}", out.2);
    assert!(out.1.contains("rover autopilot stopped"), "{}", out.1);
    assert_eq!(running_spans(&store, &traces), 0, "no span left running");
    assert!(store.daemon_pid().is_none(), "the lock is released");
    let log = std::fs::read_to_string(store.log_path()).unwrap();
    assert!(
        log.lines()
            .all(|l| serde_json::from_str::<rover::store::LogEntry>(l).is_ok()),
        "log.jsonl is JSON lines"
    );
    assert!(log.contains("agent ready"), "{log}");
    // Each step run's lines carry its trace, step, span and action: they join with `trace`.
    let entries: Vec<rover::store::LogEntry> = log
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    for trace in &traces {
        let view = store.load_trace(*trace).unwrap();
        for span in view.spans.iter().filter(|s| s.action_id.is_some()) {
            let lines: Vec<&str> = entries
                .iter()
                .filter(|e| {
                    e.fields.get("span").and_then(|v| v.as_str()) == Some(&span.id.to_string())
                })
                .map(|e| {
                    assert_eq!(e.fields["trace"].as_str(), Some(trace.to_string().as_str()));
                    assert_eq!(e.fields["step"].as_str(), Some(span.step.as_str()));
                    assert_eq!(
                        e.fields["action"].as_str(),
                        Some(span.action_id.unwrap().to_string().as_str())
                    );
                    e.message.as_str()
                })
                .collect();
            assert!(
                lines.contains(&"step started") && lines.contains(&"step finished"),
                "{} {}: {lines:?}",
                span.step,
                span.id
            );
        }
    }
}

fn wait_output(child: &mut Child) -> (Option<i32>, String, String) {
    let start = Instant::now();
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            let mut out = String::new();
            let mut err = String::new();
            child
                .stdout
                .take()
                .unwrap()
                .read_to_string(&mut out)
                .unwrap();
            child
                .stderr
                .take()
                .unwrap()
                .read_to_string(&mut err)
                .unwrap();
            return (status.code(), out, err);
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "the daemon did not exit"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_second_start_is_refused_naming_the_pid() {
    let env = TestEnv::new();
    env.repo();
    let store = env.store();
    let mut first = spawn_start(&env, &[]);
    wait_for("the first daemon", Duration::from_secs(30), || {
        store.daemon_pid().is_some()
    });
    let second = env.rover(&["autopilot", "start", "--local"]);
    assert_eq!(second.status.code(), Some(75));
    let err = stderr(&second);
    assert!(err.contains(&format!("pid {}", first.id())), "{err}");
    let status = env.rover(&["autopilot", "status"]);
    assert!(
        stdout(&status).contains(&format!("daemon   running (pid {})", first.id())),
        "{}",
        stdout(&status)
    );
    kill(pid(&first), Signal::SIGTERM).unwrap();
    assert_eq!(wait_output(&mut first).0, Some(0));
}

#[test]
fn once_drains_and_exits_when_the_queue_is_idle() {
    let env = TestEnv::new();
    env.repo();
    let store = env.store();
    let traces: Vec<Uuid> = (0..3).map(|n| noop_trace(&store, n)).collect();
    let out = env.rover(&["autopilot", "start", "--once", "--local"]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}{}",
        stdout(&out),
        stderr(&out)
    );
    for t in &traces {
        assert_eq!(
            rover::steps::kinds::trace_outcome(&store.load_trace(*t).unwrap()),
            TraceOutcome::Finished {
                step: StepKind::Noop,
                status: SpanStatus::Completed
            }
        );
    }
    // Nothing to do: exits at once as well.
    let out = env.rover(&["autopilot", "start", "--once", "--local"]);
    assert_eq!(out.status.code(), Some(0));
}

#[test]
fn start_refuses_without_a_token_or_an_agent() {
    let env = TestEnv::new();
    env.repo();
    let out = env.rover(&["autopilot", "start", "--once"]);
    assert_eq!(out.status.code(), Some(78));
    assert!(stderr(&out).contains("GITHUB_TOKEN"), "{}", stderr(&out));
    let out = env
        .command(&["autopilot", "start", "--once", "--local"])
        .env("ROVER_CLAUDE_BIN", "/nonexistent/claude")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(78));
    let err = stderr(&out);
    assert!(
        err.contains("/nonexistent/claude") && err.contains("ROVER_CLAUDE_BIN"),
        "{err}"
    );
}

#[test]
fn start_refuses_a_swarm_backend_whose_engine_is_no_swarm_manager() {
    let env = TestEnv::new();
    env.repo();
    // The main engine (DOCKER_HOST, as ROVER_SWARM_HOST is not set) is not in a swarm.
    std::fs::write(
        env.repo().join("rover.json"),
        r#"{"autopilot": {"sandbox": {"backend": "swarm", "workspace": "mounted"}}}"#,
    )
    .unwrap();
    let out = env.rover(&["autopilot", "start", "--once", "--local"]);
    assert_eq!(out.status.code(), Some(78), "{}", stdout(&out));
    let err = stderr(&out);
    assert!(
        err.contains("cannot run sandboxes on the swarm")
            && err.contains("is not a swarm manager")
            && err.contains("ROVER_SWARM_HOST"),
        "{err}"
    );
    // A constraint Swarm would refuse is a configuration error that says so.
    std::fs::write(
        env.repo().join("rover.json"),
        r#"{"autopilot": {"sandbox": {"backend": "swarm", "swarm": {"constraints": ["node.role"]}}}}"#,
    )
    .unwrap();
    let out = env.rover(&["autopilot", "start", "--once", "--local"]);
    assert_eq!(out.status.code(), Some(78), "{}", stdout(&out));
    assert!(
        stderr(&out).contains("autopilot.sandbox.swarm.constraints"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn submit_creates_a_local_trace_and_wakes_the_daemon() {
    let env = TestEnv::new();
    env.repo();
    let out = env.rover(&["autopilot", "submit", "add a --json flag"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    assert!(
        text.contains("submitted trace") && text.contains("no daemon is running"),
        "{text}"
    );
    let id = text.split_whitespace().nth(2).unwrap();
    let view = env.store().load_trace(id.parse().unwrap()).unwrap();
    assert_eq!(view.root().unwrap().meta["visibility"], "private");
    assert_eq!(view.root().unwrap().meta["request"], "add a --json flag");
    assert_eq!(view.pending[0].action, StepKind::Coordinate);
    let empty = env
        .command(&["autopilot", "submit"])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(empty.status.code(), Some(2), "an empty request is refused");
}

#[test]
fn sigkill_at_random_moments_loses_no_trace_and_runs_nothing_twice() {
    let env = TestEnv::new();
    env.repo();
    let store = env.store();
    let traces: Vec<Uuid> = (0..40).map(|n| noop_trace(&store, n)).collect();
    // Interrupted runs count as attempts, bounded by `maxAttempts` (default 3): with a dozen
    // random kills one action can be cut off three times and be given up (an explicit error
    // end, by design). This test is about crash recovery itself, so it lifts the bound.
    std::fs::write(
        env.repo().join("rover.json"),
        r#"{"autopilot": {"pipeline": {"maxAttempts": 100}}}"#,
    )
    .unwrap();
    let mut rng = Rng::new(u64::from(std::process::id()));
    let mut kills = 0;
    for _ in 0..12 {
        let mut daemon = spawn_start(&env, &[]);
        std::thread::sleep(Duration::from_millis(30 + rng.below(300)));
        if daemon.try_wait().unwrap().is_none() {
            kills += 1;
        }
        let _ = daemon.kill(); // SIGKILL
        let _ = daemon.wait();
    }
    // A last run to the end.
    let out = env.rover(&["autopilot", "start", "--once", "--local"]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}{}",
        stdout(&out),
        stderr(&out)
    );
    assert!(kills >= 6, "the daemon was cut off mid-run ({kills} kills)");
    for t in &traces {
        let view = store.load_trace(*t).unwrap();
        assert_eq!(
            rover::steps::kinds::trace_outcome(&view),
            TraceOutcome::Finished {
                step: StepKind::Noop,
                status: SpanStatus::Completed
            },
            "{t}"
        );
        let completed = view
            .spans
            .iter()
            .filter(|s| s.step == StepKind::Noop && s.status == SpanStatus::Completed)
            .count();
        assert_eq!(
            completed, 1,
            "trace {t}: the noop ran to completion exactly once"
        );
        assert!(view.spans.iter().all(|s| s.status != SpanStatus::Running));
    }
    eprintln!(
        "daemon chaos: {kills} kills survived, {} traces, 0 lost",
        traces.len()
    );
}

#[test]
fn once_exits_1_when_a_step_hit_an_internal_error() {
    let env = TestEnv::new();
    env.repo();
    // The coordinator's agent crashes mid-stream: the step errors and the trace fails forward.
    let out = env.rover(&["autopilot", "submit", "do something"]);
    assert!(out.status.success());
    std::fs::write(
        env.repo().join("rover.json"),
        r#"{"autopilot": {"agent": {"extraEnv": ["ROVER_FAKE_AGENT_SCRIPT"]}, "pipeline": {"maxAttempts": 1}}}"#,
    )
    .unwrap();
    let out = env
        .command(&["autopilot", "start", "--once", "--local"])
        .env("ROVER_FAKE_AGENT_SCRIPT", r#"[{"mode": "crash"}]"#)
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(1),
        "{}{}",
        stdout(&out),
        stderr(&out)
    );
    assert!(stderr(&out).contains("internal error"), "{}", stderr(&out));
    let store = env.store();
    let trace = store.recent_traces(1).unwrap()[0].trace_id;
    let view = store.load_trace(trace).unwrap();
    assert!(view
        .spans
        .iter()
        .any(|s| s.step == StepKind::Coordinate && s.status == SpanStatus::Error));
    assert!(
        matches!(
            rover::steps::kinds::trace_outcome(&view),
            TraceOutcome::Finished { .. }
        ),
        "the trace still ends explicitly: {:?}",
        rover::steps::kinds::trace_outcome(&view)
    );
}

#[test]
fn the_shipped_systemd_unit_verifies() {
    let env = TestEnv::new();
    let unit = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/docs/service/rover@.service"
    ))
    .unwrap();
    // The shipped unit with this machine's paths: the built binary, a checkout, an env file.
    let repo = env.repo();
    let env_file = env.path().join("rover.env");
    std::fs::write(&env_file, "GITHUB_TOKEN=x\n").unwrap();
    let unit = unit
        .replace("/usr/local/bin/rover", crate::support::env::rover_bin())
        .replace("/srv/rover/%i", repo.to_str().unwrap())
        .replace("/etc/rover/%i.env", env_file.to_str().unwrap())
        .replace("User=rover\n", "User=root\n")
        .replace("Group=rover\n", "Group=root\n");
    assert!(
        unit.contains("KillSignal=SIGTERM")
            && unit.contains("Restart=on-failure")
            && unit.contains("StandardOutput=journal")
    );
    let path = env.path().join("rover@test.service");
    std::fs::write(&path, unit).unwrap();
    let out = std::process::Command::new("systemd-analyze")
        .arg("verify")
        .arg(&path)
        .output()
        .expect("systemd-analyze (Debian's systemd package) is on this machine");
    let text = format!("{}{}", stdout(&out), stderr(&out));
    assert!(
        out.status.success() && !text.contains("rover@test.service:"),
        "systemd-analyze verify: {text}"
    );
}

#[test]
fn an_overlapping_cron_run_exits_at_once_naming_the_running_one() {
    let env = TestEnv::new();
    env.repo();
    std::fs::write(
        env.repo().join("rover.json"),
        r#"{"autopilot": {"agent": {"extraEnv": ["ROVER_FAKE_AGENT_SCRIPT"]}}}"#,
    )
    .unwrap();
    let out = env.rover(&["autopilot", "submit", "slow request"]);
    assert!(out.status.success());
    let slow = r###"[{"prompt_contains": "## Event", "delay_ms": 3000, "structured": {"decision": "noop", "confidence": 1.0, "reasoning": "nothing to do", "directive": null, "task": null, "message": null, "condition": null, "task_id": null}}]"###;
    let mut first = env
        .command(&["autopilot", "start", "--once", "--local"])
        .env("ROVER_FAKE_AGENT_SCRIPT", slow)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let store = env.store();
    wait_for("the first run", Duration::from_secs(30), || {
        store.daemon_pid().is_some()
    });
    let second = env.rover(&["autopilot", "start", "--once", "--local"]);
    assert_eq!(second.status.code(), Some(75));
    assert!(
        stderr(&second).contains(&format!("pid {}", first.id())),
        "{}",
        stderr(&second)
    );
    let (code, out, err) = wait_output(&mut first);
    assert_eq!(code, Some(0), "{out}{err}");
    let trace = store.recent_traces(1).unwrap()[0].trace_id;
    assert_eq!(
        rover::steps::kinds::trace_outcome(&store.load_trace(trace).unwrap()),
        TraceOutcome::Finished {
            step: StepKind::Noop,
            status: SpanStatus::Completed
        }
    );
}
