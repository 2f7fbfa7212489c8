//! The real `claude` CLI (pinned, installed from npm by `tests/setup-clis.sh`) against a fake
//! Anthropic Messages API: rover's host-side call gets its structured answer end to end, and
//! what it sends is measured against the same call with the CLI's defaults.

use rover::agents::{
    placeholders, run_structured, step_request, AgentSettings, AgentStep, ClaudeAgent,
    CustomInstructions, PromptVars, SummarizeResult,
};
use serde_json::json;

use crate::proof::escape::real_claude;
use crate::support::fake_anthropic::FakeAnthropic;

/// The environment the real CLI gets in these tests: the fake API, no retries, no updater.
fn cli_env(api: &FakeAnthropic, home: &std::path::Path) -> Vec<(String, String)> {
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
    let root = tempfile::tempdir().unwrap();
    let (dir, home) = (root.path().join("cwd"), root.path().join("home"));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::create_dir_all(&home).unwrap();
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
    let mut agent = ClaudeAgent::new(Some(claude.clone()), &settings);
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
    #[allow(
        clippy::cast_precision_loss,
        reason = "request sizes are far below 2^52"
    )]
    let ratio = heavy.bytes as f64 / first.bytes as f64;
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
