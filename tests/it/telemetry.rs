//! OpenTelemetry export end to end: the real binary (`start --once`, run again and again as
//! cron does) with `OTEL_EXPORTER_OTLP_ENDPOINT` pointed at an OTLP/HTTP receiver in the test
//! that decodes the real protobuf. The span tree, ids, parents and GenAI attributes of a whole
//! issue → PR trace; no secret in anything exported; a dead collector changes nothing but the
//! drop counter.

use std::collections::{BTreeMap, BTreeSet};

use rover::store::otel::{span_id_hex, trace_id_hex};
use rover::store::{AgentMeta, TraceView};
use serde_json::{json, Value};

use crate::support::env::stdout;
use crate::support::fake_github::{REPO, TOKEN};
use crate::support::otlp::{dead_port, OtlpReceiver, Received};
use crate::support::pipeline::first_span;
use crate::support::scenario::{chain, coordinate, Scenario, COORDINATE};
use crate::support::script::{assert_answered, ISSUE_5_COMMENT};

/// Secrets planted in rover's environment: none may reach the collector.
const MODEL_KEY: &str = "sk-ant-api03-PLANTEDmodelkey0123456789abcdefghijklmnopqrstuv";
const HEADER_KEY: &str = "otelhdr-PLANTED-5c0ffee5c0ffee5c0ffee";
const DEPLOY_TOKEN: &str = "deploytoken-PLANTED-9a8b7c6d5e4f3a2b1c0d";

fn status_json(s: &Scenario) -> Value {
    let out = s
        .env
        .command(&["autopilot", "status", "--json", "--repo", REPO])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    serde_json::from_str(&stdout(&out)).unwrap()
}

fn by_span_id(received: &[Received]) -> BTreeMap<String, Received> {
    let mut map = BTreeMap::new();
    for r in received {
        assert!(
            map.insert(r.span_id.clone(), r.clone()).is_none(),
            "span {} exported twice",
            r.span_id
        );
    }
    map
}

/// The `telemetry` part of `status --json`.
fn telemetry(s: &Scenario) -> Value {
    status_json(s)["telemetry"].clone()
}

/// Asserts that the spans `got` are the trace's, one for one, each in the trace's OpenTelemetry
/// trace and under its parent as the store has it.
#[track_caller]
fn assert_exported_tree(trace: &TraceView, got: &BTreeMap<String, Received>) {
    let want: BTreeSet<String> = trace.spans.iter().map(|sp| span_id_hex(sp.id)).collect();
    assert_eq!(got.keys().cloned().collect::<BTreeSet<_>>(), want);
    for sp in &trace.spans {
        let r = &got[&span_id_hex(sp.id)];
        assert_eq!(r.trace_id, trace_id_hex(trace.trace_id()), "{}", sp.step);
        assert_eq!(
            r.parent_span_id,
            sp.parent_id.map(span_id_hex).unwrap_or_default(),
            "parent of {}",
            sp.step
        );
    }
}

/// Exports to the collector at `url` (`OTEL_EXPORTER_OTLP_ENDPOINT`).
fn export_to(s: &mut Scenario, url: &str) {
    s.env_vars
        .push(("OTEL_EXPORTER_OTLP_ENDPOINT".into(), url.to_owned()));
}

#[tokio::test]
async fn an_issue_to_pr_trace_is_exported_span_for_span_with_genai_attributes_and_no_secret() {
    let receiver = OtlpReceiver::start().await;
    let mut s = Scenario::new().await;
    s.with_sandbox().await;
    // The issue quotes secrets rover holds; they reach the agents' prompts, never the collector.
    let title = format!("Add a --json flag (my key is {MODEL_KEY})");
    let body = format!("Please add --json. Token: {DEPLOY_TOKEN}");
    s.open_issue(12, &title, &body);
    s.plan_one_task("Add a --json flag", ("t1", "Implement the json flag"));
    s.task_does(
        "Implement the json flag",
        json!({"export.txt": "json\n"}),
        "completed",
    );
    s.commit_then_push("Add a --json flag");
    s.answer_notify("I opened a pull request.");
    merge_telemetry(&mut s, json!({"content": true}));
    s.env_vars.extend([
        ("OTEL_EXPORTER_OTLP_ENDPOINT".into(), receiver.url.clone()),
        (
            "OTEL_EXPORTER_OTLP_HEADERS".into(),
            format!("x-api-key={HEADER_KEY}"),
        ),
        ("ANTHROPIC_API_KEY".into(), MODEL_KEY.into()),
        ("DEPLOY_TOKEN".into(), DEPLOY_TOKEN.into()),
    ]);
    s.run_until_settled(12).await;

    let trace = s.the_trace();
    assert_answered(&trace);
    let tid = trace_id_hex(trace.trace_id());
    let received = receiver.spans();
    let got = by_span_id(&received);

    // One OpenTelemetry span per rover span, all in the trace of the rover trace's id, each
    // under its parent as the store has it, the event at the root.
    assert_exported_tree(&trace, &got);
    for sp in &trace.spans {
        let r = &got[&span_id_hex(sp.id)];
        assert_eq!(r.attr("rover.span_id"), Some(sp.id.to_string().as_str()));
        assert_eq!(
            r.attr("rover.trace_id"),
            Some(trace.trace_id().to_string().as_str())
        );
        assert_eq!(r.attr("rover.status"), Some(sp.status.as_str()));
        let start = u64::try_from(sp.timestamp.timestamp_nanos_opt().unwrap()).unwrap();
        assert_eq!(r.start_ns, start, "{} start", sp.step);
        assert!(r.end_ns >= r.start_ns);
        assert_eq!(r.status.0, 1, "{} completed is OK", sp.step);
        assert_eq!(r.scope, "rover");
        assert_eq!(
            r.resource.get("service.name").map(String::as_str),
            Some("rover")
        );
        assert_eq!(r.resource.get("rover.project_id"), Some(&s.env.project_id));
        assert_eq!(
            r.attr("rover.project_id"),
            Some(s.env.project_id.as_str()),
            "{} names its project",
            sp.step
        );
        // The repository on every span too, as the resource names it.
        assert!(r.attr("rover.repo").is_some(), "{} has rover.repo", sp.step);
        assert_eq!(
            r.attr("rover.repo"),
            r.resource.get("rover.repo").map(String::as_str)
        );
    }
    let root = &got[&span_id_hex(trace.trace_id())];
    assert_eq!(root.parent_span_id, "");
    assert_eq!(root.name, "invoke_workflow IssuesEvent opened");
    assert_eq!(root.kind, 5, "the event is consumed: SPAN_KIND_CONSUMER");
    assert_eq!(root.attr("gen_ai.operation.name"), Some("invoke_workflow"));
    assert_eq!(root.attr("rover.event.type"), Some("IssuesEvent"));

    // GenAI conventions on the agent calls, figures as the store recorded them.
    let coord_span = first_span(&trace, "coordinate");
    let coord = &got[&span_id_hex(coord_span.id)];
    assert_eq!(coord.name, "invoke_agent coordinator");
    assert_eq!(coord.attr("gen_ai.operation.name"), Some("invoke_agent"));
    assert_eq!(coord.attr("gen_ai.provider.name"), Some("anthropic"));
    assert_eq!(coord.attr("gen_ai.system"), Some("anthropic"));
    assert_eq!(coord.attr("gen_ai.request.model"), Some("sonnet"));
    assert_eq!(coord.attr("rover.decision"), Some("plan"));
    assert_eq!(
        coord.attr("rover.action_id"),
        Some(coord_span.action_id.unwrap().to_string().as_str())
    );
    let Some(AgentMeta::Used(usage)) = AgentMeta::of(coord_span) else {
        panic!("the coordinator's usage is recorded")
    };
    assert_eq!(
        coord.attr("gen_ai.usage.input_tokens"),
        Some(usage.input_tokens.to_string().as_str())
    );
    assert_eq!(
        coord.attr("gen_ai.usage.output_tokens"),
        Some(usage.output_tokens.to_string().as_str())
    );
    assert_eq!(
        coord.attr("rover.cost_usd"),
        Some(usage.cost_usd.unwrap().to_string().as_str())
    );
    // Content is on: the coordinator's reasoning is there.
    assert_eq!(coord.attr("rover.reason"), Some("decided plan"));
    let plan = &got[&span_id_hex(first_span(&trace, "plan").id)];
    assert_eq!(plan.name, "plan planner");
    assert_eq!(plan.attr("gen_ai.operation.name"), Some("plan"));
    assert_eq!(plan.attr("gen_ai.request.model"), Some("opus"));
    let wf_span = first_span(&trace, "workflow");
    let wf = &got[&span_id_hex(wf_span.id)];
    assert_eq!(wf.attr("rover.branch"), wf_span.meta["branchName"].as_str());
    let push = &got[&span_id_hex(first_span(&trace, "push").id)];
    let pulls = s.github.pulls();
    assert_eq!(pulls.len(), 1);
    assert_eq!(
        push.attr("rover.pr.number"),
        Some(pulls[0].0.to_string().as_str())
    );
    assert!(push
        .attr("rover.pr.url")
        .is_some_and(|u| u.ends_with(&format!("/pull/{}", pulls[0].0))));

    // Nothing secret anywhere: names, attributes, resource, status messages.
    for r in &received {
        let all = format!("{} {:?} {:?} {}", r.name, r.attrs, r.resource, r.status.1);
        for secret in [MODEL_KEY, HEADER_KEY, DEPLOY_TOKEN, TOKEN] {
            assert!(
                !all.contains(secret),
                "{secret} exported in {}: {all}",
                r.name
            );
        }
    }
    // The standard headers variable reached the collector.
    assert!(receiver
        .headers()
        .iter()
        .all(|h| h.get("x-api-key").is_some_and(|v| v == HEADER_KEY)));

    // The log lines of a step carry the same ids.
    let log = std::fs::read_to_string(s.store().log_path()).unwrap();
    let joined = log
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .any(|e| {
            e["fields"]["trace_id"] == tid.as_str()
                && e["fields"]["span_id"] == span_id_hex(coord_span.id).as_str()
        });
    assert!(
        joined,
        "a log line of the coordinate run carries its OpenTelemetry ids"
    );

    // Every span exported exactly once over all the runs, nothing dropped, nothing waiting.
    let t = &telemetry(&s);
    assert_eq!(t["enabled"], true, "{t}");
    assert_eq!(t["exported"], trace.spans.len(), "{t}");
    assert_eq!(t["dropped"], 0, "{t}");
    assert_eq!(t["waiting"], 0, "{t}");
}

fn merge_telemetry(s: &mut Scenario, telemetry: Value) {
    crate::support::scenario::merge(
        &mut s.extra_config,
        &json!({"autopilot": {"telemetry": telemetry}}),
    );
}

/// A question answered on its issue, with export to `endpoint`: the chain and what was posted.
async fn answered_question(endpoint: &str) -> (Scenario, Vec<String>, Vec<String>) {
    answered_question_with(endpoint, "Fixed in v2.1.", |_| {}).await
}

async fn answered_question_with(
    endpoint: &str,
    reasoning: &str,
    setup: impl FnOnce(&mut Scenario),
) -> (Scenario, Vec<String>, Vec<String>) {
    let mut s = Scenario::new().await;
    setup(&mut s);
    s.export_question();
    let answer = json!({"message": "Fixed in v2.1.", "reasoning": reasoning});
    s.answer(COORDINATE, coordinate("notify", answer));
    s.answer_notify("This was resolved in v2.1; please upgrade.");
    export_to(&mut s, endpoint);
    s.run_once().await;
    let trace = s.the_trace();
    let posted: Vec<String> = s
        .rover_comments(5)
        .into_iter()
        // Ids differ from world to world: the marker naming them is left out.
        .map(|b| {
            b.replace(&trace.trace_id().to_string(), "<trace>")
                .split("<!-- rover:")
                .next()
                .unwrap_or_default()
                .to_owned()
        })
        .collect();
    (s, chain(&trace), posted)
}

#[tokio::test]
async fn a_dead_collector_changes_nothing_but_the_drop_counter() {
    let receiver = OtlpReceiver::start().await;
    let (live, live_chain, live_posted) = answered_question(&receiver.url).await;
    let dead_url = format!("http://127.0.0.1:{}", dead_port());
    let (mut dead, dead_chain, dead_posted) = answered_question(&dead_url).await;

    assert_eq!(
        live_chain,
        [
            "event:completed",
            "coordinate:completed",
            "notify:completed"
        ]
    );
    assert_eq!(
        dead_chain, live_chain,
        "the same trace with the collector down"
    );
    assert_eq!(dead_posted, live_posted, "the same answer posted");
    assert_eq!(live_posted.len(), 1);

    let spans = live_chain.len();
    let received = receiver.spans();
    assert_eq!(received.len(), spans);
    // Content is off by default: no text of the trace leaves, only ids, names and figures.
    for r in &received {
        for key in ["rover.summary", "rover.reason", "rover.event.label"] {
            assert!(
                r.attr(key).is_none(),
                "{key} exported without content: {r:?}"
            );
        }
        assert!(!format!("{:?}", r.attrs).contains("Fixed in v2.1"), "{r:?}");
    }
    let l = telemetry(&live);
    assert_eq!(
        (l["exported"].as_u64(), l["dropped"].as_u64()),
        (Some(spans as u64), Some(0)),
        "{l}"
    );
    let d = telemetry(&dead);
    assert_eq!(d["exported"], 0, "{d}");
    assert_eq!(d["dropped"], spans, "{d}");
    assert_eq!(d["droppedBy"]["failed"], spans, "{d}");
    assert!(d["lastError"].is_string(), "{d}");
    let text = stdout(
        &dead
            .env
            .command(&["autopilot", "status", "--repo", REPO])
            .output()
            .unwrap(),
    );
    assert!(
        text.contains(&format!(
            "0 span(s) exported, {spans} dropped ({spans} failed"
        )),
        "{text}"
    );

    // Turned off again: the next start disarms the store and drops the outbox; counts stay.
    dead.env_vars.clear();
    dead.run_once().await;
    let off = telemetry(&dead);
    assert_eq!(off["enabled"], false, "{off}");
    assert_eq!(off["dropped"], spans, "{off}");
    assert!(!rover::store::outbox::is_armed(&dead.store()));
    assert!(!rover::store::outbox::path(&dead.store()).exists());
}

#[tokio::test]
async fn export_is_off_by_default_and_nothing_is_recorded_for_it() {
    let receiver = OtlpReceiver::start().await;
    let (s, chain, _) = answered_question("").await;
    assert_eq!(chain.len(), 3);
    assert_eq!(receiver.requests(), 0);
    let t = telemetry(&s);
    assert_eq!(t["enabled"], false, "{t}");
    assert!(
        !rover::store::outbox::path(&s.store()).exists(),
        "no outbox when off"
    );
}

#[tokio::test]
async fn with_content_on_text_is_exported_redacted_as_public_comments_are() {
    let receiver = OtlpReceiver::start().await;
    // The coordinator (on the host) quotes a secret rover holds and a path of this machine.
    let reasoning = format!("The reporter pasted {DEPLOY_TOKEN} from /root/.config/app.env.");
    let (s, chain, _) = answered_question_with(&receiver.url, &reasoning, |s| {
        merge_telemetry(s, json!({"content": true}));
        s.env_vars
            .push(("DEPLOY_TOKEN".into(), DEPLOY_TOKEN.into()));
    })
    .await;
    assert_eq!(chain.len(), 3);
    let trace = s.the_trace();
    let received = by_span_id(&receiver.spans());
    let coord = &received[&span_id_hex(first_span(&trace, "coordinate").id)];
    let reason = coord
        .attr("rover.reason")
        .expect("the reason, with content on");
    assert_eq!(
        reason, "The reporter pasted [redacted secret] from [path]",
        "redacted as a public comment is"
    );
    let summary = coord.attr("rover.summary").expect("the summary");
    assert!(
        summary.contains("[redacted secret]") && !summary.contains(DEPLOY_TOKEN),
        "{summary}"
    );
    for r in received.values() {
        assert!(
            !format!("{:?} {}", r.attrs, r.status.1).contains(DEPLOY_TOKEN),
            "{r:?}"
        );
    }
}

#[tokio::test]
async fn a_span_open_when_rover_is_killed_is_exported_once_when_the_next_run_closes_it() {
    let receiver = OtlpReceiver::start().await;
    let mut s = Scenario::new().await;
    s.export_bug_issue();
    s.seed_comment(5, 77, "Still broken?", ISSUE_5_COMMENT);
    // The coordinator takes its time: rover is killed while its span is open.
    s.rules.push(
        json!({"prompt_contains": COORDINATE, "mode": "slow", "lines": 1, "delay_ms": 20_000,
        "structured": coordinate("notify", json!({"message": "Fixed."}))}),
    );
    export_to(&mut s, &receiver.url);
    let mut daemon = s
        .start_command(&[])
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let store = s.store();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let open = loop {
        let running = store.read_state().ok().and_then(|st| {
            st.pending
                .iter()
                .find_map(|p| p.running_span_id)
                .and_then(|id| store.read_span(id).ok())
        });
        if let Some(span) = running.filter(|sp| sp.step.as_str() == "coordinate") {
            break span;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the coordinator never started"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    };
    // The spans closed so far (the root) exported and recorded first: a kill between sending a
    // batch and recording it sends that batch again (docs/observability.md), which is not what
    // this test is about.
    loop {
        let t = telemetry(&s);
        if t["waiting"] == 0 && t["exported"].as_u64().unwrap_or(0) >= 1 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the closed spans were not exported: {t}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    daemon.kill().unwrap(); // SIGKILL: the span stays open on disk
    daemon.wait().unwrap();
    assert!(
        !receiver
            .spans()
            .iter()
            .any(|r| r.span_id == span_id_hex(open.id)),
        "an open span is not exported"
    );

    s.rules.clear();
    s.answer(
        COORDINATE,
        coordinate("notify", json!({"message": "Fixed."})),
    );
    s.answer_notify("This was fixed in v2.1.");
    let trace = s.once_as("event coordinate:error coordinate notify").await;
    let got = by_span_id(&receiver.spans());
    assert_exported_tree(&trace, &got);
    let closed = &got[&span_id_hex(open.id)];
    assert_eq!(closed.status.0, 2, "closed as an error: STATUS_CODE_ERROR");
    assert_eq!(closed.attr("rover.interrupted"), Some("true"));
    assert_eq!(closed.attr("rover.status"), Some("error"));
    let t = telemetry(&s);
    assert_eq!(t["exported"], trace.spans.len(), "{t}");
}

#[tokio::test]
async fn over_grpc_the_collector_gets_the_same_spans() {
    let receiver = OtlpReceiver::start_grpc().await;
    let (s, chain, _) = answered_question_with(&receiver.url, "Fixed in v2.1.", |s| {
        s.env_vars
            .push(("OTEL_EXPORTER_OTLP_PROTOCOL".into(), "grpc".into()));
    })
    .await;
    assert_eq!(chain.len(), 3);
    let trace = s.the_trace();
    let got = by_span_id(&receiver.spans());
    assert_eq!(got.len(), trace.spans.len());
    assert_exported_tree(&trace, &got);
    let coord = &got[&span_id_hex(first_span(&trace, "coordinate").id)];
    assert_eq!(coord.name, "invoke_agent coordinator");
    let t = telemetry(&s);
    assert_eq!(t["protocol"], "grpc", "{t}");
    assert_eq!(t["exported"], trace.spans.len(), "{t}");
}
