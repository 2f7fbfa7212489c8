//! The real `claude` and `codex` CLIs (pinned, installed from npm by `tests/setup-clis.sh`)
//! against fake model APIs (Anthropic Messages and OpenAI Responses, both streamed as SSE):
//! structured answers, API errors classified, a rejected answer repaired, the whole pipeline
//! through the daemon (a clarification and an iterate included), and each CLI inside the real
//! sandbox image as the workflow agent; what claude sends is measured against the same call
//! with the CLI's defaults.

use rover::agents::{
    placeholders, run_structured, step_request, AgentSettings, AgentStep, ClaudeAgent,
    CustomInstructions, PromptVars, SummarizeResult,
};
use serde_json::json;

use crate::proof::escape::real_claude;
use crate::support::chain::assert_chain;
use crate::support::common::issue_opened;
use crate::support::fake_anthropic::{FakeAnthropic, Reply};
use crate::support::fake_openai::{FakeOpenAi, Reply as FakeReply};
use crate::support::pipeline::first_span;

/// The environment the real CLI gets in these tests: the fake API, no retries, no updater.
pub(crate) fn cli_env(api: &FakeAnthropic, home: &std::path::Path) -> Vec<(String, String)> {
    [
        ("ANTHROPIC_API_KEY", "sk-ant-api03-fake-key-for-tests"),
        ("ANTHROPIC_BASE_URL", api.url.as_str()),
        ("CLAUDE_CODE_MAX_RETRIES", "0"),
        ("DISABLE_AUTOUPDATER", "1"),
        ("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "1"),
        ("HOME", &home.display().to_string()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v.to_owned()))
    .collect()
}

#[tokio::test]
async fn the_real_claude_answers_a_host_step_in_structured_form_with_a_lean_request() {
    let claude = real_claude();
    let api = FakeAnthropic::start(json!({"summary": "Nothing to do: CI is green."})).await;
    let (_root, dir, home) = cwd_and("home");
    let env = cli_env(&api, &home);

    // rover's summarize step, as the daemon sends it.
    let step = AgentStep::Summarize;
    let vars: PromptVars = placeholders(step)
        .into_iter()
        .map(|name| (name.clone(), format!("the {name} of a green push")))
        .collect();
    let settings = AgentSettings::default();
    let request = step_request(
        &settings,
        step,
        &dir,
        &vars,
        false,
        &CustomInstructions::default(),
    )
    .expect("renders");
    let user_prompt = request.prompt.clone();
    let mut agent = ClaudeAgent::new(Some(claude.clone()), &settings)
        .with_host(rover::host_env::HostEnv::from_process());
    for (k, v) in &env {
        agent = agent.with_env(k, v);
    }
    let answer = run_structured::<SummarizeResult>(&agent, request)
        .await
        .expect("the real CLI's structured answer parses");
    assert_eq!(answer.value.summary, "Nothing to do: CI is green.");
    assert_eq!(answer.attempts, 1);
    // The CLI may probe the base URL first: the model requests are the `/v1/messages` ones.
    let lean = api.requests();
    let first = lean
        .iter()
        .find(|r| r.path == "/v1/messages")
        .expect("a model request");
    let offered: Vec<String> = first.body["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap_or_default().to_owned())
        .collect();
    assert_eq!(
        offered,
        ["StructuredOutput"],
        "only the structured answer is offered"
    );

    // The same question with the CLI's defaults: all its tools and its coding prompt.
    let schema = rover::agents::schema_for::<SummarizeResult>().to_string();
    let mut plain = std::process::Command::new(&claude);
    plain
        .args([
            "-p",
            "--output-format",
            "stream-json",
            "--verbose",
            "--model",
            "haiku",
        ])
        .args(["--json-schema", &schema])
        .current_dir(&dir)
        .envs(env.iter().map(|(k, v)| (k, v)))
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null());
    let before = lean.len();
    let out = tokio::task::spawn_blocking(move || {
        let mut child = plain.spawn().unwrap();
        {
            use std::io::Write as _;
            let mut stdin = child.stdin.take().unwrap();
            stdin.write_all(user_prompt.as_bytes()).unwrap();
        }
        child.wait().unwrap()
    })
    .await
    .unwrap();
    assert!(out.success(), "the plain CLI answered too");
    let all = api.requests();
    let heavy = all[before..]
        .iter()
        .find(|r| r.path == "/v1/messages")
        .expect("a model request of the plain CLI");
    let ratio = f64::from(u32::try_from(heavy.bytes).unwrap())
        / f64::from(u32::try_from(first.bytes).unwrap());
    eprintln!(
        "real claude, first request of one summarize call: rover's host call {} bytes (tools: {}), CLI defaults {} bytes (tools: {}): {ratio:.1}x less",
        first.bytes,
        offered.len(),
        heavy.bytes,
        heavy.body["tools"].as_array().map_or(0, Vec::len)
    );
    assert!(
        ratio >= 10.0,
        "the lean call must weigh at least 10x less ({ratio:.1}x)"
    );
}

/// A tempdir with a working dir `cwd` and a dir `other` (the CLI's home) in it: the tempdir
/// (keep it), and the two paths.
fn cwd_and(other: &str) -> (tempfile::TempDir, std::path::PathBuf, std::path::PathBuf) {
    let root = tempfile::tempdir().unwrap();
    let (dir, home) = (root.path().join("cwd"), root.path().join(other));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::create_dir_all(&home).unwrap();
    (root, dir, home)
}

/// The daemon of scenario `s` with the real claude against `api` (`cli_env`, a home of its own).
fn real_claude_env(api: &FakeAnthropic, s: &mut crate::support::scenario::Scenario) {
    let home = s.env.path().join("home");
    std::fs::create_dir_all(&home).unwrap();
    s.env_vars.extend(cli_env(api, &home));
    s.env_vars.push((
        "ROVER_CLAUDE_BIN".into(),
        real_claude().display().to_string(),
    ));
}

/// The daemon of scenario `s` with `agent: codex`, the real codex against `api` on the host
/// (`real_codex_env`), its workflow containers let through to the model only.
fn codex_in_the_sandbox(api: &FakeOpenAi, s: &mut crate::support::scenario::Scenario) {
    crate::support::scenario::merge(
        &mut s.extra_config,
        &json!({"autopilot": {"agent": {"agent": "codex"},
            "sandbox": {"envAllow": ["ROVER_FAKE_AGENT_SCRIPT"], "egress": "model-only"}}}),
    );
    real_codex_env(api, s);
}

/// Checks that the branch rover pushed has `json.txt` saying `--json prints JSON`.
fn assert_json_shipped(s: &crate::support::scenario::Scenario, trace: &rover::store::TraceView) {
    let push = first_span(trace, "push");
    let branch = push.meta["branch"].as_str().unwrap();
    let shipped = crate::support::gitrepo::show(&s.origin, branch, "json.txt");
    assert_eq!(shipped, "--json prints JSON");
}

/// Runs `--once` until settled (`max` runs at most) and checks that the workflow completed
/// and the trace shipped (plan, workflow, commit, push, answer): the trace and its workflow span.
async fn shipped(
    s: &crate::support::scenario::Scenario,
    max: usize,
) -> (rover::store::TraceView, rover::store::Span) {
    s.run_until_settled(max).await;
    let trace = s.the_trace();
    let workflow = first_span(&trace, "workflow").clone();
    assert_eq!(
        workflow.status.to_string(),
        "completed",
        "{:?}",
        workflow.meta
    );
    assert_chain(
        &trace,
        "event coordinate plan workflow commit resolve push notify",
    );
    (trace, workflow)
}

/// What the model answers for a vague issue: the coordinator plans, the planner asks which
/// format the export should use, the notifier asks it.
fn export_clarification_answers() -> Vec<(&'static str, serde_json::Value)> {
    vec![
        (
            "Role: rover coordinator",
            json!({"decision": "plan", "confidence": 0.8, "reasoning": "A feature request.", "directive": "Add an export", "task": null, "message": null, "condition": null, "task_id": null}),
        ),
        (
            "Role: rover planner",
            json!({"analysis": "The format is unclear.", "clarification": "Which format should the export use: CSV or JSON?", "tasks": []}),
        ),
        (
            "Role: rover notifier",
            json!({"message": "Which format should the export use: CSV or JSON?"}),
        ),
    ]
}

/// Issue `number`, "Add an export", opened by alice: runs until settled and checks that rover
/// asked on it which format (the model answering `export_clarification_answers`).
async fn asks_which_format(s: &crate::support::scenario::Scenario, number: u64) {
    issue_opened(s, number, "Add an export", "We need an export.", "alice");
    s.settle_as(8, "event coordinate plan notify").await;
    assert!(s
        .github
        .comment_bodies(number)
        .iter()
        .any(|c| c.contains("CSV or JSON")));
}

/// The daemon with a real CLI deciding on the host: `api` starts a fake model API answering by
/// role and `hook` points a scenario's rover at it. A vague issue (`numbers.0`, not sandboxed)
/// is answered with a question (`asks_which_format`); then, in a sandboxed scenario, a failed
/// task is iterated by the resolver (`iterates_json_flag` on issue `numbers.1`). Returns the
/// second API.
async fn clarifies_then_iterates<A, F>(
    api: impl Fn(Vec<(&'static str, serde_json::Value)>) -> F,
    hook: fn(&A, &mut crate::support::scenario::Scenario),
    numbers: (u64, u64),
) -> A
where
    F: std::future::Future<Output = A>,
{
    use crate::support::scenario::Scenario;
    // A vague issue: the planner asks which format.
    let first = api(export_clarification_answers()).await;
    let mut s = Scenario::new().await;
    hook(&first, &mut s);
    asks_which_format(&s, numbers.0).await;

    // A task that fails, then succeeds once the resolver iterates with new instructions.
    let second = api(iterated_json_flag_answers()).await;
    let mut s = Scenario::new().await;
    s.with_sandbox().await;
    hook(&second, &mut s);
    iterates_json_flag(&mut s, numbers.1).await;
    second
}

/// `json_flag_answers(None)` with a resolver that iterates once (with new instructions), then
/// pushes.
fn iterated_json_flag_answers() -> Vec<(&'static str, serde_json::Value)> {
    let mut answers = json_flag_answers(None);
    for (role, answer) in &mut answers {
        if *role == "Role: rover resolver" {
            *answer = json!({"__sequence": [
                {"decision": "iterate", "reasoning": "The approach was wrong.", "instructions": "write json.txt with the flag's help text", "retry_step": null, "message": null, "corrective_commands": []},
                {"decision": "push", "reasoning": "The task is committed.", "instructions": null, "retry_step": null, "message": null, "corrective_commands": []}
            ]});
        }
    }
    answers
}

/// Issue `number`, "Add a --json flag", opened by alice: its task fails, then succeeds once the
/// resolver iterates with new instructions (`iterated_json_flag_answers`); runs until settled
/// and checks the chain and that the first resolve iterated.
async fn iterates_json_flag(s: &mut crate::support::scenario::Scenario, number: u64) {
    use crate::support::scenario::workflow_rule;
    issue_opened(
        s,
        number,
        "Add a --json flag",
        "Please add --json.",
        "alice",
    );
    s.rules.push(json!({"prompt_contains": "write json.txt with the flag's help text", "write": {"json.txt": "--json\n"},
        "structured": {"status": "completed", "summary": "Added json.txt.", "files_changed": ["json.txt"]}}));
    s.rules
        .push(workflow_rule("Add the json flag", json!({}), "failed"));
    let trace = s.settle_as(14, "event coordinate plan workflow:failed commit resolve workflow commit resolve push notify").await;
    let resolve = first_span(&trace, "resolve");
    assert_eq!(resolve.meta["decision"], json!("iterate"));
}

/// Runs rover's summarize step on `agent` in `dir` and checks that its answer, rejected once
/// (an empty summary), was repaired by the one retry.
async fn assert_repaired(agent: &rover::agents::CliAgent, dir: &std::path::Path) {
    let answer = run_structured::<SummarizeResult>(agent, summarize_request(dir))
        .await
        .expect("repaired");
    assert_eq!(answer.value.summary, "CI is green; nothing to do.");
    assert_eq!(answer.attempts, 2);
    assert!(answer.first_error.is_some());
}

/// A host-side request of rover's summarize step, for `dir`.
fn summarize_request(dir: &std::path::Path) -> rover::agents::AgentRequest {
    let step = AgentStep::Summarize;
    let vars: PromptVars = placeholders(step)
        .into_iter()
        .map(|name| (name.clone(), format!("the {name} of a green push")))
        .collect();
    step_request(
        &AgentSettings::default(),
        step,
        dir,
        &vars,
        false,
        &CustomInstructions::default(),
    )
    .expect("renders")
}

fn real_agent(env: &[(String, String)]) -> rover::agents::CliAgent {
    let mut agent = ClaudeAgent::new(Some(real_claude()), &AgentSettings::default())
        .with_host(rover::host_env::HostEnv::from_process());
    for (k, v) in env {
        agent = agent.with_env(k, v);
    }
    agent
}

#[tokio::test]
async fn model_api_errors_through_the_real_claude_are_classified_and_only_transient_ones_retried() {
    let (_root, dir, home) = cwd_and("home");
    let cases = [
        (
            401,
            "authentication_error",
            "invalid x-api-key",
            "auth",
            false,
        ),
        (
            400,
            "invalid_request_error",
            "tools.0: bad schema",
            "badRequest",
            false,
        ),
        (429, "rate_limit_error", "rate limited", "rateLimited", true),
        (529, "overloaded_error", "Overloaded", "overloaded", true),
    ];
    let mut seen = Vec::new();
    for (status, kind, message, class, retryable) in cases {
        let api = FakeAnthropic::scripted(vec![Reply::Error(status, kind, message)]).await;
        let agent = real_agent(&cli_env(&api, &home));
        let err = run_structured::<SummarizeResult>(&agent, summarize_request(&dir))
            .await
            .expect_err("the API refused");
        assert_eq!(err.class(), class, "HTTP {status}: {err}");
        assert_eq!(err.is_retryable(), retryable, "HTTP {status}: {err}");
        seen.push(format!("{status}→{class}"));
    }
    eprintln!("real claude, model API errors: {}", seen.join(", "));
}

#[tokio::test]
async fn a_rejected_answer_from_the_real_claude_is_repaired_by_the_one_retry() {
    // An empty summary breaks the step's rule: rover asks once more, showing why.
    let api = FakeAnthropic::scripted(vec![
        Reply::Answer(json!({"summary": ""})),
        Reply::Answer(json!({"summary": "CI is green; nothing to do."})),
    ])
    .await;
    let (_root, dir, home) = cwd_and("home");
    let agent = real_agent(&cli_env(&api, &home));
    assert_repaired(&agent, &dir).await;
}

/// The whole pipeline through the real daemon with the real claude for every host-side step
/// (coordinator, planner, commit message, resolver, notifier) against the fake model API; the
/// workflow agent is the fake agent in a real container.
#[tokio::test]
async fn the_daemon_with_the_real_claude_plans_ships_a_pr_and_answers() {
    use crate::support::scenario::{workflow_rule, Scenario};
    let api = FakeAnthropic::scripted(vec![Reply::BySystem(json_flag_answers(None))]).await;
    let mut s = Scenario::new().await;
    s.with_sandbox().await;
    issue_opened(&s, 70, "Add a --json flag", "Please add --json.", "alice");
    // Only the workflow agent (in its container) is the fake agent.
    s.rules.push(workflow_rule(
        "Add the json flag",
        json!({"json.txt": "--json\n"}),
        "completed",
    ));
    real_claude_env(&api, &mut s);
    let trace = s
        .settle_as(
            12,
            "event coordinate plan workflow commit resolve push notify",
        )
        .await;
    let commit = first_span(&trace, "commit");
    assert_eq!(
        commit.meta["messageSource"],
        json!("agent"),
        "{:?}",
        commit.meta
    );
    assert_eq!(s.github.pulls().len(), 1, "one PR");
    let comments = s.github.comment_bodies(70);
    assert!(
        comments.iter().any(|c| c.contains("adds --json")),
        "{comments:?}"
    );
    let model_calls: Vec<_> = api
        .requests()
        .into_iter()
        .filter(|r| r.path == "/v1/messages")
        .collect();
    let biggest = model_calls.iter().map(|r| r.bytes).max().unwrap_or(0);
    for call in &model_calls {
        let tools: Vec<&str> = call.body["tools"]
            .as_array()
            .map(|t| t.iter().filter_map(|t| t["name"].as_str()).collect())
            .unwrap_or_default();
        assert!(tools.iter().all(|t| *t == "StructuredOutput"), "{tools:?}");
    }
    eprintln!(
        "real claude through the daemon: {} model requests for 5 host steps, the largest {biggest} bytes",
        model_calls.len()
    );
}

/// The real sandbox image (`docs/sandbox/Dockerfile` on a debootstrapped Debian base with the
/// pinned claude), built by `tests/setup-sandbox-image.sh`; `tests/run.sh` exports its name.
pub(crate) fn real_sandbox_image() -> String {
    std::env::var("ROVER_TEST_SANDBOX_IMAGE")
        .ok()
        .filter(|i| !i.is_empty())
        .expect("the real sandbox image is missing: run `bash tests/setup-sandbox-image.sh` and export ROVER_TEST_SANDBOX_IMAGE (tests/run.sh does both)")
}

/// The full path with the real claude everywhere: on the host for the deciding steps, and
/// inside the real sandbox image as the workflow agent, whose Write tool makes the change that
/// is committed, pushed and answered.
/// Issue #71, "Add a --json flag", for the daemon with the real claude everywhere: on the host
/// for the deciding steps, and in a sandbox (`sandbox`: the `autopilot.sandbox` settings that
/// name its image) behind rover's proxy as the workflow agent, whose Write tool makes the
/// change; the fake model API answers every step.
pub(crate) async fn json_flag_in_a_real_sandbox(
    sandbox: serde_json::Value,
) -> (crate::support::scenario::Scenario, FakeAnthropic) {
    use crate::support::scenario::{merge, Scenario};
    let workflow = json!({
        "__tools": [{"name": "Write", "input": {"file_path": "/workspace/json.txt", "content": "--json prints JSON\n"}}],
        "answer": {"status": "completed", "summary": "Added json.txt describing --json.", "files_changed": ["json.txt"]}});
    let api =
        FakeAnthropic::scripted(vec![Reply::BySystem(json_flag_answers(Some(workflow)))]).await;
    let mut s = Scenario::new().await;
    let cli_names = [
        "CLAUDE_CODE_MAX_RETRIES",
        "DISABLE_AUTOUPDATER",
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC",
    ];
    // The default egress: the container reaches the fake model API on the host's loopback only
    // through rover's proxy, which holds the key.
    merge(
        &mut s.extra_config,
        &json!({"autopilot": {
            "agent": {"extraEnv": ["ROVER_FAKE_AGENT_SCRIPT", "ROVER_FAKE_AGENT_LOG", "CLAUDE_CODE_MAX_RETRIES", "DISABLE_AUTOUPDATER", "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC"]},
            "sandbox": {"egress": "model-only", "memoryMb": 2048, "cpus": 1.0, "timeoutSecs": 300,
                "envAllow": cli_names.iter().chain(&["IS_SANDBOX"]).collect::<Vec<_>>()}}}),
    );
    merge(
        &mut s.extra_config,
        &json!({"autopilot": {"sandbox": sandbox}}),
    );
    issue_opened(&s, 71, "Add a --json flag", "Please add --json.", "alice");
    real_claude_env(&api, &mut s);
    (s, api)
}

#[tokio::test]
async fn the_real_claude_in_the_real_sandbox_image_makes_the_change_that_ships() {
    let image = real_sandbox_image();
    let (s, api) = json_flag_in_a_real_sandbox(json!({"image": image})).await;
    let trace = s
        .settle_as(
            20,
            "event coordinate plan workflow commit resolve push notify",
        )
        .await;
    assert_json_shipped(&s, &trace);
    let workflow_requests = api
        .requests()
        .into_iter()
        .filter(|r| {
            r.path == "/v1/messages"
                && r.body["system"]
                    .to_string()
                    .contains("Role: rover workflow agent")
        })
        .count();
    assert!(
        workflow_requests >= 2,
        "the agent in the container asked the model ({workflow_requests} requests)"
    );
    // Every request reached the API with the real key, added by rover's proxy for the
    // container's: the container held only its run's token.
    let keys: Vec<(String, Option<String>)> = api
        .requests()
        .into_iter()
        .map(|r| (r.path, r.key))
        .collect();
    assert!(
        keys.iter()
            .filter(|(path, _)| path == "/v1/messages")
            .all(|(_, k)| k.as_deref() == Some("sk-ant-api03-fake-key-for-tests")),
        "{keys:?}"
    );
    let workflow = first_span(&trace, "workflow");
    assert_eq!(workflow.meta["egress"], "model-only", "{:?}", workflow.meta);
    let wire = &workflow.meta["network"];
    assert_eq!(
        wire["requests"].as_u64(),
        Some(workflow_requests as u64),
        "the proxy saw every model request of the container: {wire}"
    );
    assert!(wire["bytesDown"].as_u64().unwrap() > 0, "{wire}");
    assert!(wire["usd"].as_f64().unwrap() > 0.0, "{wire}");
    let env_names = workflow.meta["env"].to_string();
    assert!(env_names.contains("ANTHROPIC_API_KEY"), "{env_names}");
    assert_eq!(s.github.pulls().len(), 1);
    eprintln!(
        "real claude in the real sandbox image {image}: {workflow_requests} model requests from the container; the change was committed, pushed and answered"
    );
}

#[tokio::test]
async fn the_real_claude_reviews_in_the_sandbox_with_read_only_tools_and_its_edit_is_refused() {
    let image = real_sandbox_image();
    let (mut s, api) = json_flag_in_a_real_sandbox(json!({"image": image})).await;
    crate::support::scenario::merge(
        &mut s.extra_config,
        &json!({"autopilot": {"pipeline": {"selfReview": true}}}),
    );
    let trace = s
        .settle_as(
            20,
            "event coordinate plan workflow commit resolve review push notify",
        )
        .await;
    let review = first_span(&trace, "review");
    assert_eq!(
        review.meta["reviews"][0]["verdict"], "approve",
        "{:?}",
        review.meta
    );
    assert!(
        review.meta["agent"]["costUsd"].as_f64().unwrap() > 0.0,
        "{:?}",
        review.meta
    );
    let reviewer: Vec<_> = api
        .requests()
        .into_iter()
        .filter(|r| {
            r.path == "/v1/messages"
                && r.body["system"]
                    .to_string()
                    .contains("Role: rover reviewer")
        })
        .collect();
    assert!(reviewer.len() >= 2, "{} reviewer requests", reviewer.len());
    // The model is offered reading tools only: editing is not in the list at all.
    for request in &reviewer {
        let tools: Vec<&str> = request.body["tools"]
            .as_array()
            .map(|t| t.iter().filter_map(|t| t["name"].as_str()).collect())
            .unwrap_or_default();
        assert!(tools.contains(&"Read"), "{tools:?}");
        for edit in ["Write", "Edit", "Bash", "NotebookEdit"] {
            assert!(
                !tools.contains(&edit),
                "{edit} offered to the reviewer: {tools:?}"
            );
        }
    }
    // Its Write came back to the model as an error from the CLI, not from the prompt.
    let results: Vec<String> = reviewer
        .iter()
        .flat_map(|r| r.body["messages"].as_array().cloned().unwrap_or_default())
        .flat_map(|m| m["content"].as_array().cloned().unwrap_or_default())
        .filter(|b| b["type"] == "tool_result")
        .map(|b| format!("{} {}", b["is_error"], b["content"]))
        .collect();
    eprintln!("the reviewer's tool results: {results:?}");
    assert!(
        results
            .iter()
            .any(|r| r.starts_with("true") && r.contains("No such tool available: Write")),
        "the Write was not refused as an unavailable tool: {results:?}"
    );
    assert_json_shipped(&s, &trace);
    eprintln!(
        "real claude as the reviewer in {image}: {} model requests, tools offered: read-only; the Write was refused",
        reviewer.len()
    );
}

/// What the model answers each step of "add a --json flag", by the step's role line; the
/// workflow agent's answer (tool calls included) when the real CLI runs it too.
pub(crate) fn json_flag_answers(
    workflow: Option<serde_json::Value>,
) -> Vec<(&'static str, serde_json::Value)> {
    use crate::support::scenario::task;
    let mut answers = vec![
        (
            "Role: rover coordinator",
            json!({"decision": "plan", "confidence": 0.9, "reasoning": "A clear feature request.", "directive": "Add a --json flag", "task": null, "message": null, "condition": null, "task_id": null}),
        ),
        (
            "Role: rover planner",
            json!({"analysis": "One task.", "clarification": null, "tasks": [task("json", "Add the json flag", &[], "swe")]}),
        ),
        (
            "Role: rover commit message writer",
            json!({"subject": "Add a --json flag", "body": null}),
        ),
        (
            "Role: rover resolver",
            json!({"decision": "push", "reasoning": "The task is committed.", "instructions": null, "retry_step": null, "message": null, "corrective_commands": []}),
        ),
        (
            "Role: rover notifier",
            json!({"message": "I opened a pull request that adds --json."}),
        ),
    ];
    if let Some(answer) = workflow {
        answers.push(("Role: rover workflow agent", answer));
        // The self-review, when on: it tries to overwrite the change first (the tool list
        // refuses), then approves.
        answers.push((
            "Role: rover reviewer",
            json!({"__tools": [{"name": "Write", "input": {"file_path": "/workspace/json.txt", "content": "rewritten by the reviewer\n"}}],
                   "answer": {"verdict": "approve", "summary": "json.txt describes --json.", "findings": []}}),
        ));
    }
    answers
}

/// The real codex CLI (pinned), installed by `tests/setup-clis.sh codex`.
pub(crate) fn real_codex() -> std::path::PathBuf {
    if let Some(path) = std::env::var_os("ROVER_TEST_CODEX_BIN").filter(|p| !p.is_empty()) {
        return path.into();
    }
    let home = std::env::var_os("HOME").map_or_else(|| "/root".into(), std::path::PathBuf::from);
    let cached = home.join(".cache/rover-test-clis/codex-0.169.0/node_modules/.bin/codex");
    assert!(
        cached.exists(),
        "the real codex CLI is missing: run `bash tests/setup-clis.sh codex` (tests/run.sh does it)"
    );
    cached
}

/// The daemon of scenario `s` with the real codex against `api`: `OPENAI_API_KEY` alone (rover
/// maps it to `CODEX_API_KEY`), the base URL through `OPENAI_BASE_URL`, a `CODEX_HOME` of its own.
pub(crate) fn real_codex_env(api: &FakeOpenAi, s: &mut crate::support::scenario::Scenario) {
    let codex_home = s.env.path().join("codex-home");
    std::fs::create_dir_all(&codex_home).unwrap();
    for (k, v) in [
        (
            "OPENAI_API_KEY",
            "sk-proj-fake-key-for-tests-0123456789".to_owned(),
        ),
        ("OPENAI_BASE_URL", api.url.clone()),
        ("CODEX_HOME", codex_home.display().to_string()),
        ("ROVER_CODEX_BIN", real_codex().display().to_string()),
    ] {
        s.env_vars.push((k.to_owned(), v));
    }
}

/// rover's codex adapter with the real CLI against `api`: only `OPENAI_API_KEY` is set (rover
/// maps it to `CODEX_API_KEY`), the base URL through `OPENAI_BASE_URL`, a `CODEX_HOME` of its own.
fn real_codex_agent(api: &FakeOpenAi, codex_home: &std::path::Path) -> rover::agents::CliAgent {
    rover::agents::CodexAgent::new(Some(real_codex()), &AgentSettings::default())
        .with_host(rover::host_env::HostEnv::from_process())
        .with_env("OPENAI_API_KEY", "sk-proj-fake-key-for-tests-0123456789")
        .with_env("OPENAI_BASE_URL", api.url.clone())
        .with_env("CODEX_HOME", codex_home.display().to_string())
}

#[tokio::test]
async fn the_real_codex_answers_a_host_step_in_structured_form_without_shell_tools() {
    let api = FakeOpenAi::start(vec![FakeReply::Answer(
        json!({"summary": "Nothing to do: CI is green."}),
    )])
    .await;
    let (_root, dir, codex_home) = cwd_and("codex-home");
    let agent = real_codex_agent(&api, &codex_home);
    let answer = run_structured::<SummarizeResult>(&agent, summarize_request(&dir))
        .await
        .expect("the real codex's structured answer parses");
    assert_eq!(answer.value.summary, "Nothing to do: CI is green.");
    let requests = api.responses_requests();
    assert_eq!(requests.len(), 1, "one model request");
    let request = &requests[0];
    assert!(
        request.authorized,
        "OPENAI_API_KEY reached codex as its bearer"
    );
    assert_eq!(request.body["text"]["format"]["type"], json!("json_schema"));
    let tools: Vec<String> = request.body["tools"]
        .as_array()
        .map(|t| {
            t.iter()
                .map(|t| {
                    t["name"]
                        .as_str()
                        .or_else(|| t["type"].as_str())
                        .unwrap_or_default()
                        .to_owned()
                })
                .collect()
        })
        .unwrap_or_default();
    for shell in [
        "exec_command",
        "shell",
        "local_shell",
        "write_stdin",
        "view_image",
        "web_search",
    ] {
        assert!(
            !tools.iter().any(|t| t == shell),
            "{shell} offered: {tools:?}"
        );
    }
    eprintln!(
        "real codex, one summarize call: {} bytes, tools offered: {tools:?}",
        request.bytes
    );
}

#[tokio::test]
async fn model_api_errors_through_the_real_codex_are_classified() {
    let (_root, dir, codex_home) = cwd_and("codex-home");
    let mut seen = Vec::new();
    for (status, message, class) in [
        (
            400,
            "Invalid schema for response_format 'codex_output_schema'",
            "badRequest",
        ),
        (401, "Incorrect API key provided", "auth"),
        (429, "Rate limit reached for gpt-5 in organization org-fake on tokens per min (TPM): Limit 30000, Used 30000, Requested 120. Please try again in 20s. Visit https://platform.openai.com/account/rate-limits to learn more.", "rateLimited"),
        (503, "The server is overloaded", "overloaded"),
    ] {
        let api = FakeOpenAi::start(vec![FakeReply::Error(status, message)]).await;
        let agent = real_codex_agent(&api, &codex_home);
        let err = run_structured::<SummarizeResult>(&agent, summarize_request(&dir))
            .await
            .expect_err("the API refused");
        assert_eq!(err.class(), class, "HTTP {status}: {err}");
        assert_eq!(
            err.is_retryable(),
            status >= 429,
            "HTTP {status}: only rate limits and overload are worth another try: {err}"
        );
        // What the CLI itself retried before giving up (rover does not retry on top).
        seen.push(format!(
            "{status}→{class} ({} requests by the CLI): {err}",
            api.responses_requests().len()
        ));
    }
    eprintln!("real codex, model API errors: {}", seen.join(", "));
}

#[tokio::test]
async fn a_rejected_answer_from_the_real_codex_is_repaired_by_the_one_retry() {
    // codex does not enforce the schema; an empty summary breaks the step's rule, and rover
    // asks once more, showing why.
    let api = FakeOpenAi::start(vec![
        FakeReply::Answer(json!({"summary": ""})),
        FakeReply::Answer(json!({"summary": "CI is green; nothing to do."})),
    ])
    .await;
    let (_root, dir, codex_home) = cwd_and("codex-home");
    let agent = real_codex_agent(&api, &codex_home);
    assert_repaired(&agent, &dir).await;
    let requests = api.responses_requests();
    assert_eq!(requests.len(), 2, "one call, then the one retry");
    let retry = requests[1].body.to_string();
    assert!(
        retry.contains("Your previous answer was rejected"),
        "the retry shows what was wrong with the first answer"
    );
    assert!(!requests[0]
        .body
        .to_string()
        .contains("Your previous answer was rejected"));
}

/// A plan that needs a clarification, and a failed task iterated by the resolver, with the real
/// claude deciding on the host (the workflow agent is the fake agent in a container).
#[tokio::test]
async fn the_daemon_with_the_real_claude_asks_for_clarification_and_iterates_a_failed_task() {
    clarifies_then_iterates(
        |answers| FakeAnthropic::scripted(vec![Reply::BySystem(answers)]),
        real_claude_env,
        (72, 73),
    )
    .await;
}

/// The whole pipeline through the real daemon with `agent: codex`: the real codex CLI answers
/// every host-side step against the fake Responses API, authenticating with `OPENAI_API_KEY`
/// alone; the workflow agent is the fake codex in a container.
#[tokio::test]
async fn the_daemon_with_the_real_codex_plans_ships_a_pr_and_answers() {
    use crate::support::scenario::{workflow_rule, Scenario};
    let api = FakeOpenAi::start(vec![FakeReply::ByPrompt(json_flag_answers(None))]).await;
    let mut s = Scenario::new().await;
    s.with_sandbox().await;
    codex_in_the_sandbox(&api, &mut s);
    issue_opened(&s, 74, "Add a --json flag", "Please add --json.", "alice");
    s.rules.push(workflow_rule(
        "Add the json flag",
        json!({"json.txt": "--json\n"}),
        "completed",
    ));
    let (trace, _) = shipped(&s, 12).await;
    let commit = first_span(&trace, "commit");
    assert_eq!(
        commit.meta["messageSource"],
        json!("agent"),
        "{:?}",
        commit.meta
    );
    assert_eq!(s.github.pulls().len(), 1);
    let calls = api.responses_requests();
    assert!(calls.iter().all(|r| r.authorized));
    eprintln!(
        "real codex through the daemon: {} model requests for 5 host steps",
        calls.len()
    );
}

/// The full path with the real codex everywhere: on the host for the deciding steps, and inside
/// the real sandbox image as the workflow agent, whose shell command makes the change that is
/// committed, pushed and answered.
#[tokio::test]
async fn the_real_codex_in_the_real_sandbox_image_makes_the_change_that_ships() {
    use crate::support::scenario::{merge, Scenario};
    let image = real_sandbox_image();
    let workflow = json!({
        "__tools": [{"name": "exec_command", "arguments": {"cmd": "printf -- '--json prints JSON\\n' > json.txt"}}],
        "answer": {"status": "completed", "summary": "Added json.txt describing --json.", "files_changed": ["json.txt"]}});
    let api = FakeOpenAi::start(vec![FakeReply::ByPrompt(json_flag_answers(Some(workflow)))]).await;
    let mut s = Scenario::new().await;
    // The default egress: the container reaches the fake model API on the host's loopback only
    // through rover's proxy, which holds the key.
    merge(
        &mut s.extra_config,
        &json!({"autopilot": {
            "agent": {"agent": "codex"},
            "sandbox": {"image": image, "memoryMb": 2048, "cpus": 1.0, "timeoutSecs": 300,
                "envAllow": ["IS_SANDBOX"]}}}),
    );
    issue_opened(&s, 75, "Add a --json flag", "Please add --json.", "alice");
    real_codex_env(&api, &mut s);
    let (trace, workflow) = shipped(&s, 20).await;
    assert_json_shipped(&s, &trace);
    let from_container = api
        .responses_requests()
        .iter()
        .filter(|r| r.body.to_string().contains("Role: rover workflow agent"))
        .count();
    assert!(
        from_container >= 2,
        "{from_container} requests from the container"
    );
    // The real key reached the API for every request; the container held its run's token.
    let keys: Vec<Option<String>> = api
        .responses_requests()
        .into_iter()
        .map(|r| r.key)
        .collect();
    assert!(
        keys.iter()
            .all(|k| k.as_deref() == Some("sk-proj-fake-key-for-tests-0123456789")),
        "{keys:?}"
    );
    assert_eq!(workflow.meta["egress"], "model-only");
    let wire = &workflow.meta["network"];
    assert!(
        wire["requests"].as_u64().unwrap() >= from_container as u64,
        "{wire}"
    );
    assert!(wire["usd"].as_f64().unwrap() > 0.0, "{wire}");
    // codex's own calls home (its update check, telemetry) were refused, and recorded.
    let denied: Vec<&serde_json::Value> = wire["connections"].as_array().unwrap().iter().collect();
    assert!(denied.iter().all(|c| c["allowed"] == false), "{wire}");
    eprintln!(
        "real codex in the real sandbox image {image}: {from_container} model requests from the container; the change was committed, pushed and answered"
    );
}

/// A plan that needs a clarification, and a failed task iterated by the resolver, with the real
/// codex deciding on the host (the workflow agent is the fake codex in a container).
#[tokio::test]
async fn the_daemon_with_the_real_codex_asks_for_clarification_and_iterates_a_failed_task() {
    let api = clarifies_then_iterates(
        |answers| FakeOpenAi::start(vec![FakeReply::ByPrompt(answers)]),
        codex_in_the_sandbox,
        (76, 77),
    )
    .await;
    assert!(api.responses_requests().iter().all(|r| r.authorized));
}
