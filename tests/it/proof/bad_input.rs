//! Bad input: malformed agent outputs, GitHub error responses and broken `rover.json` files each
//! give a clear error (a span error naming the class, or exit 78 naming the file and key) and lose
//! nothing (the trace still ends explicitly, or the queue keeps the work).

use std::process::Output;

use rover::store::{SpanStatus, StepKind, TraceOutcome};
use serde_json::{json, Value};

use axum::http::Method;

use crate::support::chain::assert_chain;
use crate::support::env::{stderr, stdout};
use crate::support::fake_github::{Fault, FaultKind};
use crate::support::local::{script_rules, Kind, LocalWorld, LOCAL_REQUEST};
use crate::support::scenario::{coordinate, Scenario, COORDINATE};

/// `start --once --local`, whatever its exit code.
fn once(world: &LocalWorld) -> Output {
    world
        .command(&["autopilot", "start", "--once", "--local"])
        .output()
        .unwrap()
}

#[tokio::test]
async fn malformed_agent_outputs_give_a_span_error_and_the_trace_still_ends() {
    // (case, the coordinator's misbehaviour (its answer to the correction too), the error class
    // of its span ("" = survived), a phrase the error message carries)
    let cases: Vec<(&str, Value, &str, &str)> = vec![
        (
            "not json",
            json!({"text": "I think we should do nothing, really."}),
            "invalidAnswer",
            "not a JSON object",
        ),
        (
            "wrong enum",
            json!({"structured": {"decision": "explode", "confidence": 0.9, "reasoning": "x", "directive": null, "task": null, "message": null, "condition": null, "task_id": null}}),
            "invalidAnswer",
            "explode",
        ),
        (
            "missing field",
            json!({"structured": {"confidence": 0.9, "reasoning": "x"}}),
            "invalidAnswer",
            "decision",
        ),
        (
            "schema-invalid structured output",
            json!({"mode": "invalid_structured"}),
            "invalidAnswer",
            "does not match",
        ),
        (
            "truncated stream",
            json!({"mode": "truncated"}),
            "failed",
            "without a final result line",
        ),
        (
            "non-zero exit",
            json!({"mode": "crash", "exit": 2, "text": "fatal: something broke"}),
            "refused",
            "fatal: something broke",
        ),
        ("killed", json!({"mode": "killed"}), "killed", "killed"),
        (
            "huge line",
            json!({"mode": "huge_line", "bytes": 3_000_000, "structured": coordinate("noop", json!({}))}),
            "",
            "",
        ),
    ];
    let mut tried = 0;
    for (case, misbehaviour, class, phrase) in &cases {
        let mut world = LocalWorld::new(false).await;
        world.configure(&json!({"autopilot": {"pipeline": {"maxAttempts": 1}}}));
        let mut bad = misbehaviour.clone();
        bad["prompt_contains"] = json!(format!("{LOCAL_REQUEST}chaos noop"));
        let mut again = misbehaviour.clone();
        again["prompt_contains"] = json!("Your previous answer was rejected");
        let mut rules = vec![bad, again];
        rules.extend(script_rules());
        world.script = json!({"rules": rules});
        let id = world.submit(Kind::Noop, 0);
        let out = once(&world);
        let view = world.store().load_trace(id).unwrap();
        let chain = crate::support::scenario::chain(&view);
        let coordinate = view
            .spans
            .iter()
            .find(|s| s.step == StepKind::Coordinate)
            .unwrap_or_else(|| panic!("{case}: a coordinate span: {chain:?}"));
        assert!(
            matches!(
                rover::steps::kinds::trace_outcome(&view),
                TraceOutcome::Finished { .. }
            ),
            "{case}: the trace still ends explicitly: {chain:?}"
        );
        assert!(view.pending.is_empty(), "{case}: nothing left behind");
        if class.is_empty() {
            // Survived: the answer after the huge line is used.
            assert_eq!(
                chain,
                ["event:completed", "coordinate:completed", "noop:completed"],
                "{case}"
            );
            assert_eq!(out.status.code(), Some(0), "{case}: {}", stderr(&out));
        } else {
            assert_eq!(coordinate.status, SpanStatus::Error, "{case}: {chain:?}");
            let error = &coordinate.meta["error"];
            assert_eq!(error["errorClass"], *class, "{case}: {error}");
            assert!(
                error["message"]
                    .as_str()
                    .is_some_and(|m| m.starts_with("the agent") && m.contains(phrase)),
                "{case}: a clear message naming `{phrase}`: {error}"
            );
            // Fail forward: the requester is told.
            assert_eq!(
                chain.last().unwrap(),
                "notify:completed",
                "{case}: {chain:?}"
            );
            assert_eq!(
                out.status.code(),
                Some(1),
                "{case}: --once reports the error"
            );
            assert!(
                stderr(&out).contains("rover autopilot traces"),
                "{case}: {}",
                stderr(&out)
            );
        }
        tried += 1;
    }
    eprintln!("proof bad input: {tried} malformed agent outputs, each a classified span error or survived, 0 traces lost");
}

/// The question scenario (coordinate → notify posts a comment on issue 5), with GitHub
/// answering `times` requests `method` on a path holding `path` with `kind`.
async fn question(method: Method, path: &str, times: usize, kind: FaultKind) -> Scenario {
    let mut s = Scenario::new().await;
    s.usage_question();
    s.answer(
        COORDINATE,
        coordinate("notify", json!({"message": "Use export."})),
    );
    s.answer_notify("Use `widgets export --json`.");
    s.github.fault(Fault {
        method: Some(method),
        path_contains: path.into(),
        times,
        kind,
    });
    s
}

/// How many answers rover posted on issue 5.
fn posted(s: &Scenario) -> usize {
    s.rover_comments(5).len()
}

#[tokio::test]
async fn github_error_responses_give_a_clear_span_error_and_lose_nothing() {
    // Final answers: the notify span errors with a message naming the class; the trace ends.
    let cases = vec![
        (
            "malformed json",
            FaultKind::Malformed,
            "something unexpected",
        ),
        ("401", FaultKind::Unauthorized, "401"),
        ("404", FaultKind::NotFound, "404"),
        (
            "422",
            FaultKind::Validation(vec!["body is too long".into()]),
            "body is too long",
        ),
    ];
    let mut tried = 0;
    for (case, kind, phrase) in cases {
        let s = question(Method::POST, "/issues/5/comments", 3, kind).await;
        let out = s.run_once_raw().await;
        let view = s.the_trace();
        let chain = crate::support::scenario::chain(&view);
        assert_eq!(
            chain,
            ["event:completed", "coordinate:completed", "notify:error"],
            "{case}"
        );
        assert_eq!(
            rover::steps::kinds::trace_outcome(&view),
            TraceOutcome::Finished {
                step: StepKind::Notify,
                status: SpanStatus::Error
            },
            "{case}: the trace ends explicitly"
        );
        let error = &view.spans[2].meta["error"];
        let message = error["message"].as_str().unwrap_or_default();
        assert!(
            message.starts_with("github") && message.contains(phrase),
            "{case}: {error}"
        );
        assert_eq!(error["retryable"], false, "{case}");
        assert_eq!(out.status.code(), Some(1), "{case}: --once reports it");
        assert_eq!(posted(&s), 0);
        tried += 1;
    }

    // A 500 on the comment: retryable, the queue keeps the notify until GitHub recovers.
    let s = question(
        Method::POST,
        "/issues/5/comments",
        1,
        FaultKind::Server(500),
    )
    .await;
    let out = s.run_once().await;
    let view = s.the_trace();
    assert_eq!(
        view.pending.len(),
        1,
        "the queue keeps the work: {:?}",
        crate::support::scenario::chain(&view)
    );
    let error = &view.spans[2].meta["error"];
    assert!(
        error["message"].as_str().unwrap().contains("500"),
        "{error}"
    );
    assert_eq!(error["retryable"], true);
    let retry_at: chrono::DateTime<chrono::Utc> = view.spans[2].meta["retryAt"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    let wait = (retry_at - chrono::Utc::now()).to_std().unwrap_or_default();
    assert!(
        wait < std::time::Duration::from_secs(60),
        "a bounded backoff: {wait:?}"
    );
    tokio::time::sleep(wait + std::time::Duration::from_millis(200)).await;
    s.run_until_settled(6).await;
    let view = s.the_trace();
    assert_chain(&view, "event coordinate notify:error notify");
    assert_eq!(
        posted(&s),
        1,
        "answered once after the retry: {}",
        stdout(&out)
    );
    tried += 1;

    // A 502 on the event poll: retried within the run, which takes the event; nothing lost.
    let s = question(Method::GET, "/events", 1, FaultKind::Server(502)).await;
    let out = s.run_once_raw().await;
    assert_eq!(out.status.code(), Some(0), "{}", stdout(&out));
    assert!(
        stdout(&out).contains("polling GitHub failed"),
        "the blip is said: {}",
        stdout(&out)
    );
    s.run_until_settled(4).await;
    assert_eq!(
        crate::support::scenario::chain(&s.the_trace())
            .last()
            .unwrap(),
        "notify:completed"
    );
    assert_eq!(posted(&s), 1);
    tried += 1;
    eprintln!("proof bad input: {tried} GitHub error responses, each a clear span error, retried or ended; 0 traces lost");
}

#[test]
fn broken_rover_json_exits_1_naming_the_file_and_key_and_the_queue_keeps_the_work() {
    let world = tokio::runtime::Runtime::new()
        .unwrap()
        .block_on(LocalWorld::new(false));
    let good = std::fs::read_to_string(world.env.repo().join("rover.json")).unwrap();
    let id = world.submit(Kind::Noop, 0);
    // (case, file content, what stderr must name besides the file)
    let cases = [
        (
            "unknown key",
            r#"{"autopilot": {"pipeline": {"maxRetriez": 3}}}"#,
            "maxRetriez",
        ),
        (
            "wrong type",
            r#"{"autopilot": {"pipeline": {"maxRetries": "three"}}}"#,
            "autopilot.pipeline.maxRetries",
        ),
        ("not json", "{\"autopilot\": {", "rover.json"),
        (
            "unknown section",
            r#"{"autopilot": {"pipline": {}}}"#,
            "pipline",
        ),
    ];
    let mut tried = 0;
    for (case, content, key) in cases {
        std::fs::write(world.env.repo().join("rover.json"), content).unwrap();
        let out = once(&world);
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(78), "{case}: a config error: {err}");
        assert!(
            err.contains("rover.json") && err.contains(key),
            "{case}: names the file and key: {err}"
        );
        let state = world.store().read_state().unwrap();
        assert!(
            state.pending.iter().any(|p| p.trace_id == id),
            "{case}: the queue keeps the work"
        );
        tried += 1;
    }
    std::fs::write(world.env.repo().join("rover.json"), good).unwrap();
    let out = once(&world);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(
        rover::steps::kinds::trace_outcome(&world.store().load_trace(id).unwrap()),
        TraceOutcome::Finished {
            step: StepKind::Noop,
            status: SpanStatus::Completed
        }
    );
    eprintln!("proof bad input: {tried} broken rover.json files, each exit 78 naming file and key; the queued trace ran once fixed");
}

#[tokio::test]
async fn a_sandboxed_agent_that_misbehaves_fails_its_workflow_and_the_trace_ends() {
    // (case, the workflow agent's misbehaviour, what the failed span's summary says)
    let cases: Vec<(&str, Value, &str)> = vec![
        (
            "non-zero exit in the container",
            json!({"mode": "crash", "exit": 3, "text": "fatal: out of ideas"}),
            "exited with code 3: fatal: out of ideas",
        ),
        (
            "not json in the container",
            json!({"text": "I changed some things, trust me."}),
            "no valid result: the answer is not a JSON object",
        ),
        (
            "truncated stream in the container",
            json!({"mode": "truncated"}),
            "exited with code 1",
        ),
    ];
    let mut tried = 0;
    for (case, misbehaviour, says) in cases {
        let mut world = LocalWorld::new(true).await;
        world.configure(&json!({"autopilot": {"pipeline": {"maxRetries": 0}}}));
        let mut bad = misbehaviour.clone();
        bad["prompt_contains"] = json!("## Task: Make the chaos change");
        let give_up = json!({"prompt_contains": "## Error output of failed steps",
            "structured": crate::support::scenario::resolve("fail", json!({"message": "The agent failed."}))});
        let mut rules = vec![bad, give_up];
        rules.extend(script_rules());
        world.script = json!({"rules": rules});
        let id = world.submit(Kind::Change, 0);
        let mut settled = false;
        for _ in 0..10 {
            let _ = once(&world);
            let view = world.store().load_trace(id).unwrap();
            if matches!(
                rover::steps::kinds::trace_outcome(&view),
                TraceOutcome::Finished { .. }
            ) && view.pending.is_empty()
            {
                settled = true;
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(300)).await;
        }
        let view = world.store().load_trace(id).unwrap();
        let chain = crate::support::scenario::chain(&view);
        assert!(settled, "{case}: the trace ends: {chain:?}");
        let workflow = view
            .spans
            .iter()
            .find(|sp| sp.step == StepKind::Workflow && sp.status.is_final())
            .unwrap_or_else(|| panic!("{case}: {chain:?}"));
        assert!(
            workflow
                .summary
                .as_deref()
                .is_some_and(|x| x.contains(says)),
            "{case}: {:?}",
            workflow.summary
        );
        assert_eq!(workflow.status, SpanStatus::Failed, "{case}: {chain:?}");
        assert_eq!(
            chain.last().unwrap(),
            "notify:completed",
            "{case}: {chain:?}"
        );
        tried += 1;
    }
    eprintln!("proof bad input: {tried} sandboxed agent failures, each a failed workflow and an explicit end");
}
