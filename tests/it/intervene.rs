//! A person steering rover with the real binary while the orchestrator runs (or is stopped):
//! `cancel`, `fail`, `retry` and the dead letters, each leaving a span that says who did what.

use rover::store::{Action, Meta, SpanStatus, StepKind};
use serde_json::{json, Value};

use crate::support::chain::assert_chain;
use crate::support::env::stderr;
use crate::support::pipeline::{first_span, notify_action, StepsWorld};

#[tokio::test]
async fn cancel_stops_the_running_agent_and_the_trace_ends_with_an_answer_saying_who() {
    let w = StepsWorld::with(&json!({}));
    let trace = w.p.submit("SLOWME please");
    // The coordinator's agent hangs.
    w.orch.drain().await.unwrap();
    assert_eq!(w.orch.in_flight(), 1);
    while !w
        .p
        .store
        .read_state()
        .unwrap()
        .pending
        .iter()
        .any(|p| p.running_span_id.is_some())
    {
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let out = w.rover_ok(&[
        "cancel",
        &trace.to_string()[..8],
        "--reason",
        "not needed any more",
        "--by",
        "alice",
    ]);
    assert!(
        out.contains("cancelled by alice: not needed any more"),
        "{out}"
    );
    assert!(out.contains("stopping coordinate"), "{out}");
    w.settle().await;
    let view = w.p.trace(trace);
    let coordinate = first_span(&view, "coordinate");
    assert_eq!(coordinate.status, SpanStatus::Error);
    assert_eq!(coordinate.meta["closedByHand"], json!(true));
    let cancel = first_span(&view, "cancel");
    assert_eq!(cancel.meta["by"], json!("alice"));
    assert_eq!(cancel.meta["reason"], json!("not needed any more"));
    let notify = notify_action(&view).expect("an answer");
    assert_eq!(notify.meta["purpose"], json!("flag"));
    assert!(notify.meta["message"]
        .as_str()
        .unwrap()
        .contains("cancelled by alice: not needed any more"));
    assert_eq!(w.chain(trace).last().unwrap(), "notify:completed");
    assert!(view.pending.is_empty(), "{:?}", view.pending);
    assert_eq!(w.orch.in_flight(), 0);
    // `trace` shows who did what; a second cancel and a retry are refused with the reason.
    let shown = w.rover_ok(&["trace", &trace.to_string()]);
    assert!(shown.contains("cancelled by alice"), "{shown}");
    for args in [
        vec!["cancel", &trace.to_string()[..]],
        vec!["retry", &trace.to_string()[..]],
    ] {
        let out = w.rover(&args);
        assert_eq!(out.status.code(), Some(77), "{args:?}");
        assert!(
            stderr(&out).contains("cancelled by alice"),
            "{}",
            stderr(&out)
        );
    }
}

#[tokio::test]
async fn fail_with_no_daemon_takes_the_queued_work_and_answers_with_the_reason() {
    // A breaker that trips on one failure: a person's `fail` must not count as rover failing.
    let w =
        StepsWorld::new(&json!({"circuitBreaker": {"maxConsecutiveFailures": 1, "notify": true}}));
    let trace = w.p.submit("a question");
    let out = w.rover_ok(&["fail", &trace.to_string(), "--reason", "wrong repository"]);
    assert!(out.contains("took coordinate"), "{out}");
    assert!(out.contains("no daemon is running"), "{out}");
    w.settle().await;
    let view = w.p.trace(trace);
    assert!(
        !view.spans.iter().any(|s| s.step == StepKind::Coordinate),
        "the coordinator never ran: {:?}",
        w.chain(trace)
    );
    let fail = first_span(&view, "fail");
    assert_eq!(fail.meta["reason"], json!("wrong repository"));
    let notify = notify_action(&view).expect("an answer");
    assert_eq!(notify.meta["purpose"], json!("failure"));
    assert_eq!(w.chain(trace).last().unwrap(), "notify:completed");
    // New work still runs: the breaker did not count it.
    let next = w.p.submit("another question");
    w.settle().await;
    assert_chain(&w.p.trace(next), "event coordinate notify");
    // Nothing to close any more.
    let out = w.rover(&["fail", &next.to_string(), "--reason", "x"]);
    assert_eq!(out.status.code(), Some(77));
    assert!(stderr(&out).contains("has ended"), "{}", stderr(&out));
}

#[tokio::test]
async fn retry_runs_a_failed_action_again_with_a_fresh_attempt_budget() {
    let w = StepsWorld::with(&json!({}));
    let trace = w.p.submit("FAILME please");
    w.settle().await;
    let view = w.p.trace(trace);
    assert_eq!(first_span(&view, "coordinate").status, SpanStatus::Error);
    let out = w.rover_ok(&["retry", &trace.to_string(), "--by", "bob"]);
    assert!(out.contains("coordinate"), "{out}");
    assert!(out.contains("retried by bob"), "{out}");
    w.settle().await;
    let view = w.p.trace(trace);
    let coordinates: Vec<_> = view
        .spans
        .iter()
        .filter(|s| s.step == StepKind::Coordinate)
        .collect();
    assert_eq!(coordinates.len(), 2, "{:?}", w.chain(trace));
    let retry = first_span(&view, "retry");
    assert_eq!(retry.meta["by"], json!("bob"));
    let again: Vec<&Action> = view
        .actions
        .iter()
        .filter(|a| a.action == StepKind::Coordinate)
        .collect();
    assert_eq!(again.len(), 2);
    assert!(
        again[1].reason.starts_with("retried by bob"),
        "{}",
        again[1].reason
    );
    assert_eq!(coordinates[1].action_id, Some(again[1].id));
    // A trace with nothing failed has nothing to retry.
    let fine = w.p.submit("a question");
    w.settle().await;
    let out = w.rover(&["retry", &fine.to_string()]);
    assert_eq!(out.status.code(), Some(77));
    assert!(stderr(&out).contains("no failed step"), "{}", stderr(&out));
}

#[tokio::test]
async fn dead_letters_are_listed_and_dropped_or_requeued_by_hand() {
    let w = StepsWorld::with(&json!({}));
    let trace = w.p.submit("a question");
    w.settle().await;
    let root = w.p.store.read_span(trace).unwrap();
    let mut letters = Vec::new();
    for _ in 0..2 {
        let action = Action::new(
            StepKind::Other("deploy".into()),
            &root,
            "deploy the fix",
            Meta::new(),
            chrono::Utc::now(),
        );
        w.p.store.enqueue(&action, trace).unwrap();
        letters.push(action.id);
    }
    w.settle().await;
    let listed: Value = serde_json::from_str(&w.rover_ok(&["dead-letters", "--json"])).unwrap();
    assert_eq!(listed["deadLetters"].as_array().unwrap().len(), 2);
    let text = w.rover_ok(&["dead-letters"]);
    assert!(text.contains("\"deploy\""), "{text}");

    let out = w.rover_ok(&[
        "dead-letters",
        "drop",
        &letters[0].to_string()[..8],
        "--by",
        "carol",
    ]);
    assert!(out.contains("dropped by carol"), "{out}");
    let out = w.rover_ok(&["dead-letters", "requeue", &letters[1].to_string()]);
    assert!(out.contains("requeued"), "{out}");
    let listed: Value = serde_json::from_str(&w.rover_ok(&["dead-letters", "--json"])).unwrap();
    let left = listed["deadLetters"].as_array().unwrap();
    assert_eq!(
        left.len(),
        1,
        "the requeued one waits again, under a new id"
    );
    assert_ne!(left[0]["actionId"], json!(letters[1].to_string()));
    let view = w.p.trace(trace);
    assert_eq!(first_span(&view, "drop").meta["by"], json!("carol"));
    first_span(&view, "requeue");
    let out = w.rover(&["dead-letters", "drop", "ffffffff"]);
    assert_eq!(out.status.code(), Some(66));
}

/// `cancel` while a workflow agent runs in its container: the daemon stops the container, the
/// run is closed as `error` with `closedByHand` and a summary saying who stopped it (not as the
/// agent's failure with exit 137), its logs are kept in the artifacts, and the container goes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_workflow_run_is_closed_by_hand_and_its_container_removed() {
    use crate::support::scenario::{slow_task_issue, Scenario};
    let mut s = Scenario::new().await;
    s.with_sandbox().await;
    slow_task_issue(&mut s, 80, 120);
    let mut daemon = s.spawn_quiet();
    let wait_for = |what: &str, done: &dyn Fn() -> bool| {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        while !done() {
            assert!(std::time::Instant::now() < deadline, "waited for {what}");
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
    };
    wait_for("the workflow container", &|| !s.containers().is_empty());
    let trace = s.the_trace().index.trace_id;
    let out = s.env.rover(&[
        "autopilot",
        "cancel",
        &trace.to_string(),
        "--reason",
        "not needed",
        "--by",
        "alice",
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    wait_for("the trace to end", &|| {
        crate::support::scenario::chain(&s.the_trace())
            .last()
            .is_some_and(|c| c == "notify:completed")
    });
    wait_for("the container to go", &|| s.containers().is_empty());
    let _ = daemon.kill();
    let _ = daemon.wait();

    let view = s.the_trace();
    // Nothing but the answer follows the cancelled run: no commit, resolve or push span.
    assert_eq!(
        crate::support::scenario::after_the_workflow(&view),
        ["notify:completed"],
        "{:?}",
        crate::support::scenario::chain(&view)
    );
    let workflow =
        crate::support::scenario::closed_by_hand(&view, "cancelled by alice: not needed");
    let summary = workflow.summary.clone().unwrap_or_default();
    assert!(!summary.contains("137"), "{summary}");
    // Its logs were kept before the container went.
    let log = s.store().artifacts_dir(workflow.id).join("agent.log");
    assert!(log.is_file(), "{}", log.display());
}
