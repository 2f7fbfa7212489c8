//! Integration tests for `agents`: the real adapters and runner driving the fake agent binary.
//!
//! Every contract test is one generic function run against both adapters (`both!`).

use std::time::{Duration, Instant};

use rover::agents::{
    parse_output, run_structured, sandbox_argv, Agent, AgentError, AgentKind, AgentRequest,
    AgentSettings, ClaudeAgent, SummarizeResult, ToolPolicy,
};
use serde_json::{json, Value};

use rover::config::RoverConfig;
use rover::steps::build_steps;

use crate::support::fake_agent::{
    process_state, read, wait_dead, wait_gone, FakeAgentEnv, FAKE_OPENAI_KEY,
};
use crate::support::pipeline::Pipeline;

/// Generates `<name>_claude` and `<name>_codex` tests from one `async fn name(kind)`.
macro_rules! both {
    ($name:ident) => {
        mod $name {
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn claude() {
                super::$name(rover::agents::AgentKind::Claude).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn codex() {
                super::$name(rover::agents::AgentKind::Codex).await;
            }
        }
    };
}

fn settings() -> AgentSettings {
    AgentSettings {
        kill_grace_secs: 1,
        ..AgentSettings::default()
    }
}

fn request(env: &FakeAgentEnv, prompt: &str) -> AgentRequest {
    let mut req = AgentRequest::new(&env.workdir, prompt);
    req.system_prompt = "You are a test agent.".into();
    req.timeout = Duration::from_secs(60);
    req.inactivity_timeout = Duration::from_secs(30);
    req
}

/// The direct child was reaped by the runner: its pid is gone.
/// The grandchild the fake agent started is dead (or a zombie of its group).
fn assert_grandchild_gone(env: &FakeAgentEnv) {
    let grandchild = env.grandchild(1).expect("grandchild recorded");
    assert!(matches!(
        wait_dead(grandchild, Duration::from_secs(10)),
        None | Some('Z')
    ));
}

/// The whole group is gone: the grandchild dead and every agent process reaped.
fn assert_group_gone(env: &FakeAgentEnv) {
    assert_grandchild_gone(env);
    assert_reaped(env);
}

fn assert_reaped(env: &FakeAgentEnv) {
    for call in env.calls() {
        let pid = i32::try_from(call["pid"].as_i64().expect("pid recorded")).expect("pid");
        assert_eq!(process_state(pid), None, "agent pid {pid} left behind");
    }
}

async fn plain_answer(kind: AgentKind) {
    let env = FakeAgentEnv::new();
    let agent = env.agent(kind, &json!([{"text": "the answer"}]), &settings());
    let mut req = request(&env, "what is it?");
    let transcript = env.root.path().join("transcript.jsonl");
    req.transcript = Some(transcript.clone());
    let response = agent.run(req).await.expect("plain run succeeds");
    assert_eq!(response.text, "the answer");
    assert!(!response.is_error);
    assert!(response.session_id.is_some());
    assert!(response.usage.input > 0 && response.usage.output > 0);
    assert!(response.duration_ms.is_some());
    assert_eq!(response.transcript.as_deref(), Some(transcript.as_path()));
    let stdout = read(&transcript);
    assert!(stdout.lines().count() >= 3, "{stdout}");
    assert!(stdout.contains("the answer"));
    let stderr = read(&transcript.with_extension("jsonl.stderr"));
    // The fake prints a JSON error result on stderr: it is kept, never parsed.
    assert!(stderr.contains("stderr must not be parsed"), "{stderr}");
    if kind == AgentKind::Claude {
        assert_eq!(response.cost_usd, Some(0.000_235));
        assert_eq!(response.usage.cached, 3, "modelUsage cache reads");
    } else {
        // Tokens only from codex; USD from the default price entry (1.25 / 0.125 / 10 per
        // million): 60 input, 40 cached, 20 output.
        let cost = response.cost_usd.expect("priced from the table");
        assert!((cost - 0.000_28).abs() < 1e-12, "{cost}");
        assert!(
            !response.warnings.is_empty(),
            "reconnect notice kept as warning"
        );
    }
    let calls = env.calls();
    assert_eq!(calls.len(), 1);
    let call = &calls[0];
    assert_eq!(call["personality"], kind.default_binary());
    let argv: Vec<&str> = call["argv"]
        .as_array()
        .expect("argv")
        .iter()
        .filter_map(Value::as_str)
        .collect();
    if kind == AgentKind::Claude {
        // The prompt arrived on stdin, not in argv.
        assert_eq!(call["prompt"], "what is it?");
        assert!(!argv.contains(&"what is it?"));
        assert!(argv.contains(&"--verbose"));
        assert!(argv.iter().any(|a| a.starts_with("--allowedTools=")));
        assert_eq!(call["systemPrompt"], "You are a test agent.");
    } else {
        // stdin was closed: no `<stdin>` block appended, prompt is the argument.
        let prompt = call["prompt"].as_str().expect("prompt");
        assert!(prompt.ends_with("what is it?"), "{prompt}");
        assert!(prompt.starts_with("You are a test agent."), "{prompt}");
        assert!(!prompt.contains("<stdin>"));
        assert!(
            argv.contains(&"--skip-git-repo-check"),
            "workdir is not a repo"
        );
        assert_eq!(call["sandbox"], "read-only");
    }
    assert_reaped(&env);
}
both!(plain_answer);

async fn structured_answer(kind: AgentKind) {
    let env = FakeAgentEnv::new();
    let script = json!([{"structured": {"summary": "CI passed; nothing to do."}}]);
    let agent = env.agent(kind, &script, &settings());
    let result = run_structured::<SummarizeResult>(agent.as_ref(), request(&env, "summarize"))
        .await
        .expect("structured run succeeds");
    assert_eq!(result.value.summary, "CI passed; nothing to do.");
    assert_eq!(result.attempts, 1);
    let calls = env.calls();
    // The schema the CLI received (inline for claude, a file for codex) is the type's schema.
    assert_eq!(
        calls[0]["schema"],
        rover::agents::schema_for::<SummarizeResult>()
    );
}
both!(structured_answer);

async fn invalid_answer_is_retried_once_in_the_same_session(kind: AgentKind) {
    let env = FakeAgentEnv::new();
    let script = json!({"strict": true, "rules": [
        {"invocation": 1, "mode": "invalid_structured"},
        {"invocation": 2, "prompt_contains": "rejected", "structured": {"summary": "fixed"}}
    ]});
    let agent = env.agent(kind, &script, &settings());
    let result = run_structured::<SummarizeResult>(agent.as_ref(), request(&env, "summarize"))
        .await
        .expect("the retry fixes it");
    assert_eq!(result.value.summary, "fixed");
    assert_eq!(result.attempts, 2);
    assert!(result.first_error.is_some());
    let calls = env.calls();
    assert_eq!(calls.len(), 2);
    let first_session = calls[0]["resume"].clone();
    assert!(first_session.is_null());
    assert_eq!(
        calls[1]["resume"].as_str(),
        result.response.session_id.as_deref(),
        "the retry resumes the first session"
    );
}
both!(invalid_answer_is_retried_once_in_the_same_session);

async fn invalid_twice_fails_with_the_raw_answer(kind: AgentKind) {
    let env = FakeAgentEnv::new();
    let script = json!([{"mode": "invalid_structured", "text": "not json at all", "structured": {"nope": 1}}]);
    let agent = env.agent(kind, &script, &settings());
    let err = run_structured::<SummarizeResult>(agent.as_ref(), request(&env, "summarize"))
        .await
        .expect_err("invalid twice");
    let AgentError::InvalidAnswer { raw, reason } = &err else {
        panic!("expected InvalidAnswer, got {err:?}");
    };
    assert!(raw.contains("nope") || raw.contains("not json"), "{raw}");
    assert!(!reason.is_empty());
    assert!(!err.is_retryable());
    assert_eq!(env.calls().len(), 2, "exactly one retry");
}
both!(invalid_twice_fails_with_the_raw_answer);

async fn api_errors_are_classified(kind: AgentKind) {
    for (status, class, retryable) in [
        (401, "auth", false),
        (529, "overloaded", true),
        (429, "rateLimited", true),
        (400, "badRequest", false),
    ] {
        let env = FakeAgentEnv::new();
        let agent = env.agent(
            kind,
            &json!([{"mode": "api_error", "status": status}]),
            &settings(),
        );
        let err = agent.run(request(&env, "hi")).await.expect_err("api error");
        assert_eq!(err.class(), class, "{status}: {err}");
        assert_eq!(err.is_retryable(), retryable, "{status}");
        if let AgentError::RateLimited { reset, .. } = &err {
            // Only claude reports when the limit resets (2100-01-01 in the fake).
            assert_eq!(
                reset.map(|t| t.timestamp()),
                (kind == AgentKind::Claude).then_some(4_102_444_800)
            );
        }
        assert_reaped(&env);
    }
}
both!(api_errors_are_classified);

async fn truncated_stream_is_a_failure(kind: AgentKind) {
    let env = FakeAgentEnv::new();
    let agent = env.agent(
        kind,
        &json!([{"mode": "truncated", "exit": 1}]),
        &settings(),
    );
    let err = agent.run(request(&env, "hi")).await.expect_err("truncated");
    assert!(
        matches!(err, AgentError::Failed { exit: Some(1), .. }),
        "{err:?}"
    );
    assert_reaped(&env);
}
both!(truncated_stream_is_a_failure);

async fn success_then_nonzero_exit_is_success(kind: AgentKind) {
    let env = FakeAgentEnv::new();
    let agent = env.agent(
        kind,
        &json!([{"mode": "exit_after_success", "exit": 3, "text": "done"}]),
        &settings(),
    );
    let response = agent.run(request(&env, "hi")).await.expect("still success");
    assert_eq!(response.text, "done");
}
both!(success_then_nonzero_exit_is_success);

async fn result_then_hang_stops_waiting(kind: AgentKind) {
    let env = FakeAgentEnv::new();
    let agent = env.agent(
        kind,
        &json!([{"mode": "hang_after_result", "text": "done"}]),
        &settings(),
    );
    let mut req = request(&env, "hi");
    req.timeout = Duration::from_secs(120);
    req.inactivity_timeout = Duration::from_secs(120);
    let response = tokio::time::timeout(Duration::from_secs(60), agent.run(req))
        .await
        .expect("does not wait for the hung process")
        .expect("the result counts");
    assert_eq!(response.text, "done");
    assert_group_gone(&env);
}
both!(result_then_hang_stops_waiting);

async fn huge_line_is_read(kind: AgentKind) {
    let env = FakeAgentEnv::new();
    let agent = env.agent(
        kind,
        &json!([{"mode": "huge_line", "bytes": 6_000_000, "text": "after the big one"}]),
        &settings(),
    );
    let mut req = request(&env, "hi");
    req.transcript = Some(env.root.path().join("t.jsonl"));
    let response = agent.run(req).await.expect("huge line is fine");
    assert_eq!(response.text, "after the big one");
    let size = std::fs::metadata(env.root.path().join("t.jsonl"))
        .expect("transcript")
        .len();
    assert!(size > 6_000_000, "transcript keeps the line: {size}");
}
both!(huge_line_is_read);

async fn hang_hits_the_inactivity_timeout_and_kills_the_group(kind: AgentKind) {
    let env = FakeAgentEnv::new();
    let agent = env.agent(kind, &json!([{"mode": "hang_ignore_term"}]), &settings());
    let mut req = request(&env, "hi");
    req.inactivity_timeout = Duration::from_secs(1);
    let started = Instant::now();
    let err = tokio::time::timeout(Duration::from_secs(60), agent.run(req))
        .await
        .expect("the runner does not hang")
        .expect_err("inactive");
    assert!(matches!(err, AgentError::Inactive { .. }), "{err:?}");
    assert!(err.is_retryable());
    assert!(started.elapsed() >= Duration::from_secs(1));
    // SIGTERM was blocked: only the SIGKILL after the grace ended it, grandchild included.
    assert_group_gone(&env);
}
both!(hang_hits_the_inactivity_timeout_and_kills_the_group);

async fn slow_output_hits_the_absolute_timeout(kind: AgentKind) {
    let env = FakeAgentEnv::new();
    let agent = env.agent(
        kind,
        &json!([{"mode": "slow", "delay_ms": 200, "lines": 100}]),
        &settings(),
    );
    let mut req = request(&env, "hi");
    req.timeout = Duration::from_secs(2);
    req.inactivity_timeout = Duration::from_secs(30);
    let err = tokio::time::timeout(Duration::from_secs(60), agent.run(req))
        .await
        .expect("the runner does not hang")
        .expect_err("timeout");
    assert!(
        matches!(err, AgentError::Timeout { after } if after == Duration::from_secs(2)),
        "{err:?}"
    );
    assert_reaped(&env);
}
both!(slow_output_hits_the_absolute_timeout);

async fn killed_is_reported(kind: AgentKind) {
    for mode in ["killed", "exit_137"] {
        let env = FakeAgentEnv::new();
        let agent = env.agent(kind, &json!([{"mode": mode}]), &settings());
        let err = agent.run(request(&env, "hi")).await.expect_err(mode);
        let AgentError::Killed { how } = &err else {
            panic!("{mode}: expected Killed, got {err:?}");
        };
        assert!(how == "signal 9" || how == "exit 137", "{how}");
        assert!(err.to_string().contains("out of memory"));
        assert_reaped(&env);
    }
}
both!(killed_is_reported);

async fn refusal_without_output(kind: AgentKind) {
    let env = FakeAgentEnv::new();
    let agent = env.agent(
        kind,
        &json!([{"mode": "crash", "text": "cannot start here", "exit": 1}]),
        &settings(),
    );
    let err = agent.run(request(&env, "hi")).await.expect_err("refused");
    let AgentError::Refused { exit, stderr } = &err else {
        panic!("expected Refused, got {err:?}");
    };
    assert_eq!(*exit, Some(1));
    assert!(stderr.contains("cannot start here"), "{stderr}");
    assert!(!err.is_retryable());
}
both!(refusal_without_output);

async fn scripted_file_edits_land_in_the_workdir(kind: AgentKind) {
    let env = FakeAgentEnv::new();
    std::fs::write(env.workdir.join("old.txt"), "bye").expect("seed");
    let script =
        json!([{"write": {"src/new.txt": "hello\n"}, "delete": ["old.txt"], "text": "edited"}]);
    let agent = env.agent(kind, &script, &settings());
    let mut req = request(&env, "edit");
    req.tools = ToolPolicy::FullEdit;
    let response = agent.run(req).await.expect("edit run");
    assert_eq!(
        std::fs::read_to_string(env.workdir.join("src/new.txt")).expect("written"),
        "hello\n"
    );
    assert!(!env.workdir.join("old.txt").exists());
    assert!(response.tool_calls >= 1);
}
both!(scripted_file_edits_land_in_the_workdir);

async fn missing_binary_names_it_and_how_to_install(kind: AgentKind) {
    let env = FakeAgentEnv::new();
    let missing = env.root.path().join("no-such-agent");
    let agent: Box<dyn Agent> = if kind == AgentKind::Claude {
        Box::new(
            ClaudeAgent::new(Some(missing.clone()), &settings())
                .with_host(rover::host_env::HostEnv::from_process()),
        )
    } else {
        Box::new(
            rover::agents::CodexAgent::new(Some(missing.clone()), &settings())
                .with_host(rover::host_env::HostEnv::from_process()),
        )
    };
    for err in [
        agent.check().await.expect_err("missing"),
        agent.run(request(&env, "hi")).await.expect_err("missing"),
    ] {
        let message = err.to_string();
        assert!(matches!(err, AgentError::NotFound { .. }), "{err:?}");
        assert!(message.contains("no-such-agent"), "{message}");
        assert!(message.contains(kind.bin_env_var()), "{message}");
        assert!(message.contains("npm install"), "{message}");
        assert!(!err.is_retryable());
    }
    let present = env.agent(kind, &json!([]), &settings());
    let version = present.check().await.expect("fake answers --version");
    assert!(version.contains(if kind == AgentKind::Claude {
        "Claude Code"
    } else {
        "codex-cli"
    }));
}
both!(missing_binary_names_it_and_how_to_install);

async fn cancellation_stops_the_group(kind: AgentKind) {
    let env = FakeAgentEnv::new();
    let agent = env.agent(kind, &json!([{"mode": "hang"}]), &settings());
    let run = agent.run(request(&env, "hi"));
    // Dropping the future is cancellation.
    assert!(tokio::time::timeout(Duration::from_millis(1500), run)
        .await
        .is_err());
    let call = env.calls().pop().expect("the fake started");
    let pid = i32::try_from(call["pid"].as_i64().expect("pid")).expect("pid");
    let state = wait_gone(pid, Duration::from_secs(10));
    assert_eq!(
        state,
        None,
        "pid {pid} not reaped after cancel: {:?}, test pid {}",
        std::fs::read_to_string(format!("/proc/{pid}/stat")),
        std::process::id()
    );
    assert_grandchild_gone(&env);
}
both!(cancellation_stops_the_group);

async fn token_check(kind: AgentKind) {
    // Set by `no_github_token_reaches_the_agent` on the child test process only.
    assert_eq!(std::env::var("GITHUB_TOKEN").as_deref(), Ok(TOKEN));
    assert_eq!(std::env::var("GH_TOKEN").as_deref(), Ok(TOKEN));
    let env = FakeAgentEnv::new();
    let settings = AgentSettings {
        extra_env: vec!["GITHUB_TOKEN".into(), "GH_TOKEN".into(), "PATH".into()],
        ..settings()
    };
    let binary = Some(env.binary(kind));
    let script = json!([{"text": "ok"}]).to_string();
    let log = env.log.display().to_string();
    let agent: Box<dyn Agent> = if kind == AgentKind::Claude {
        Box::new(
            ClaudeAgent::new(binary, &settings)
                .with_host(rover::host_env::HostEnv::from_process())
                .with_env("ROVER_FAKE_AGENT_SCRIPT", script)
                .with_env("ROVER_FAKE_AGENT_LOG", log)
                .with_env("GITHUB_TOKEN", TOKEN),
        )
    } else {
        Box::new(
            env.codex_keyed(
                rover::agents::CodexAgent::new(binary, &settings)
                    .with_host(rover::host_env::HostEnv::from_process()),
            )
            .with_env("ROVER_FAKE_AGENT_SCRIPT", script)
            .with_env("ROVER_FAKE_AGENT_LOG", log)
            .with_env("GH_TOKEN", TOKEN),
        )
    };
    let mut req = request(
        &env,
        &format!("the issue body pasted a token: {TOKEN} please"),
    );
    req.system_prompt = format!("system with {TOKEN}");
    agent.run(req).await.expect("run");
    let calls = env.calls();
    let record = calls[0].to_string();
    assert!(!record.contains(TOKEN), "token leaked: {record}");
    let names: Vec<&str> = calls[0]["envNames"]
        .as_array()
        .expect("names")
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert!(
        !names.contains(&"GITHUB_TOKEN") && !names.contains(&"GH_TOKEN"),
        "{names:?}"
    );
    assert!(names.contains(&"PATH"));
    assert!(calls[0]["prompt"]
        .as_str()
        .expect("prompt")
        .contains("[redacted by rover]"));
}

const TOKEN: &str = "ghp_rovertesttoken0123456789";

/// Runs one ignored probe test of this binary in a child process with extra env, so no test
/// changes the environment of the shared test process.
fn run_probe(name: &str, envs: &[(&str, std::ffi::OsString)]) {
    let output = std::process::Command::new(std::env::current_exe().expect("test binary"))
        .args(["--exact", name, "--ignored", "--test-threads", "1"])
        .env("ROVER_TEST_PROBE", "1")
        .envs(envs.iter().map(|(k, v)| (*k, v)))
        .output()
        .expect("probe runs");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success() && stdout.contains("1 passed"),
        "probe {name} failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
}

fn in_probe() -> bool {
    std::env::var_os("ROVER_TEST_PROBE").is_some()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "probe: run by no_github_token_reaches_the_agent with the token in its env"]
async fn token_probe() {
    if !in_probe() {
        return;
    }
    token_check(AgentKind::Claude).await;
    token_check(AgentKind::Codex).await;
}

#[test]
fn no_github_token_reaches_the_agent() {
    run_probe(
        "agents::token_probe",
        &[("GITHUB_TOKEN", TOKEN.into()), ("GH_TOKEN", TOKEN.into())],
    );
}

async fn sandbox_argv_runs_without_stdin(kind: AgentKind) {
    // What the workflow step does in a container: run the argv as is, no stdin, parse stdout.
    let env = FakeAgentEnv::new();
    let mut req = request(&env, "--looks-like-a-flag but is the prompt");
    req.tools = ToolPolicy::FullEdit;
    req.schema = Some(rover::agents::schema_for::<SummarizeResult>());
    let argv = sandbox_argv(kind, &req, None);
    let output = std::process::Command::new(env.binary(kind))
        .args(&argv[1..])
        .current_dir(&env.workdir)
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("CODEX_API_KEY", "sk-in-the-box")
        .env("ROVER_FAKE_AGENT_LOG", &env.log)
        .env(
            "ROVER_FAKE_AGENT_SCRIPT",
            json!([{"structured": {"summary": "in the box"}}]).to_string(),
        )
        .stdin(std::process::Stdio::null())
        .output()
        .expect("runs");
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let response = parse_output(kind, &output.stdout, true).expect("parses");
    assert_eq!(response.structured, Some(json!({"summary": "in the box"})));
    let prompt = env.calls()[0]["prompt"]
        .as_str()
        .expect("prompt")
        .to_owned();
    assert!(
        prompt.contains("--looks-like-a-flag but is the prompt"),
        "{prompt}"
    );
}
both!(sandbox_argv_runs_without_stdin);

async fn unknown_resume_session_is_refused(kind: AgentKind) {
    let env = FakeAgentEnv::new();
    let agent = env.agent(kind, &json!([]), &settings());
    let mut req = request(&env, "continue");
    req.resume_session = Some("0000-no-such-session".into());
    let err = agent.run(req).await.expect_err("unknown session");
    let AgentError::Refused { stderr, .. } = &err else {
        panic!("expected Refused, got {err:?}");
    };
    assert!(stderr.contains("0000-no-such-session"), "{stderr}");
}
both!(unknown_resume_session_is_refused);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claude_max_turns_is_its_own_class() {
    let env = FakeAgentEnv::new();
    let agent = env.agent(
        AgentKind::Claude,
        &json!([{"mode": "max_turns"}]),
        &settings(),
    );
    let mut req = request(&env, "hi");
    req.max_turns = Some(2);
    let err = agent.run(req).await.expect_err("max turns");
    assert!(matches!(err, AgentError::MaxTurns { .. }), "{err:?}");
    assert!(err
        .to_string()
        .contains("Reached maximum number of turns (2)"));
    assert_eq!(env.calls()[0]["maxTurns"], 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claude_permission_denials_are_recorded() {
    let env = FakeAgentEnv::new();
    let agent = env.agent(AgentKind::Claude, &json!([{"mode": "denied"}]), &settings());
    let response = agent
        .run(request(&env, "hi"))
        .await
        .expect("denial is no failure");
    assert_eq!(response.permission_denials.len(), 1);
    assert_eq!(response.permission_denials[0].tool_name, "Bash");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn codex_in_a_git_repo_needs_no_skip_flag() {
    let env = FakeAgentEnv::new();
    let status = std::process::Command::new("git")
        .args(["init", "-q"])
        .current_dir(&env.workdir)
        .status()
        .expect("git init");
    assert!(status.success());
    let agent = env.agent(AgentKind::Codex, &json!([]), &settings());
    agent
        .run(request(&env, "hi"))
        .await
        .expect("runs in a repo");
    let argv = env.calls()[0]["argv"].to_string();
    assert!(!argv.contains("--skip-git-repo-check"), "{argv}");
}

#[test]
fn fake_rejects_unknown_flags_like_the_real_clis() {
    let env = FakeAgentEnv::new();
    let claude = std::process::Command::new(env.binary(AgentKind::Claude))
        .args(["-p", "--no-such-flag"])
        .stdin(std::process::Stdio::null())
        .output()
        .expect("runs");
    assert_eq!(claude.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&claude.stderr).contains("error: unknown option '--no-such-flag'")
    );
    assert!(claude.stdout.is_empty());
    let codex = std::process::Command::new(env.binary(AgentKind::Codex))
        .args(["exec", "--json", "--full-auto", "hi"])
        .stdin(std::process::Stdio::null())
        .output()
        .expect("runs");
    assert_eq!(codex.status.code(), Some(2));
    let expected = read(
        &std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/codex/tool.err"),
    );
    assert_eq!(
        String::from_utf8_lossy(&codex.stderr).trim(),
        expected.trim()
    );
    let no_verbose = std::process::Command::new(env.binary(AgentKind::Claude))
        .args(["-p", "--output-format", "stream-json", "hi"])
        .output()
        .expect("runs");
    assert_eq!(no_verbose.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&no_verbose.stderr).contains("requires --verbose"));
}

/// The overhead of one agent call beyond the agent process: spawn, pipes, parse.
/// Run: `cargo test --test it agents::overhead -- --ignored --nocapture`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "measurement, prints figures"]
async fn overhead_of_one_call() {
    const N: u32 = 50;
    let env = FakeAgentEnv::new();
    for kind in [AgentKind::Claude, AgentKind::Codex] {
        let agent = env.agent(kind, &json!([{"text": "ok"}]), &settings());
        let mut through_adapter = Duration::ZERO;
        for _ in 0..N {
            let started = Instant::now();
            agent.run(request(&env, "hi")).await.expect("run");
            through_adapter += started.elapsed();
        }
        // The same process run bare: spawn, feed stdin, collect output, no parsing.
        let req = request(&env, "hi");
        let args: Vec<String> = if kind == AgentKind::Claude {
            rover::agents::claude::host_args(&req)
        } else {
            rover::agents::codex::host_args(&req, None, false)
        };
        let mut bare = Duration::ZERO;
        for _ in 0..N {
            let started = Instant::now();
            let mut child = std::process::Command::new(env.binary(kind))
                .args(&args)
                .current_dir(&env.workdir)
                .env_clear()
                .env("CODEX_API_KEY", "sk-bare")
                .env(
                    "ROVER_FAKE_AGENT_SCRIPT",
                    json!([{"text": "ok"}]).to_string(),
                )
                .stdin(std::process::Stdio::piped())
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .expect("spawn");
            {
                use std::io::Write;
                let mut stdin = child.stdin.take().expect("stdin");
                if kind == AgentKind::Claude {
                    stdin.write_all(b"hi").expect("write");
                }
            }
            let output = child.wait_with_output().expect("wait");
            assert!(output.status.success());
            bare += started.elapsed();
        }
        let adapter_ms = through_adapter.as_secs_f64() * 1000.0 / f64::from(N);
        let bare_ms = bare.as_secs_f64() * 1000.0 / f64::from(N);
        println!(
            "{kind}: mean per call through the adapter {adapter_ms:.2} ms, bare process {bare_ms:.2} ms, overhead {:.2} ms (N={N})",
            adapter_ms - bare_ms
        );
    }
    assert_reaped(&env);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "probe: run by configured_agent_is_found_through_its_env_var"]
async fn bin_env_probe() {
    if !in_probe() {
        return;
    }
    let settings = AgentSettings {
        agent: AgentKind::Codex,
        ..settings()
    };
    let agent =
        rover::agents::agent_from_settings(&settings, &rover::host_env::HostEnv::from_process());
    assert_eq!(agent.kind(), AgentKind::Codex);
    assert_eq!(agent.check().await.expect("found"), "codex-cli 0.169.0");
}

#[test]
fn configured_agent_is_found_through_its_env_var() {
    let env = FakeAgentEnv::new();
    run_probe(
        "agents::bin_env_probe",
        &[
            (
                rover::agents::ROVER_CODEX_BIN,
                env.binary(AgentKind::Codex).into(),
            ),
            // `check` also wants codex credentials.
            ("OPENAI_API_KEY", "sk-probe".into()),
        ],
    );
}

#[test]
fn fake_claude_json_formats_parse_like_the_captures() {
    let env = FakeAgentEnv::new();
    for extra in [
        &["--output-format", "json"][..],
        &["--output-format", "json", "--verbose"],
    ] {
        let output = std::process::Command::new(env.binary(AgentKind::Claude))
            .arg("-p")
            .args(extra)
            .arg("hello")
            .env(
                "ROVER_FAKE_AGENT_SCRIPT",
                json!([{"text": "hi there"}]).to_string(),
            )
            .output()
            .expect("runs");
        assert!(output.status.success());
        let stdout = String::from_utf8_lossy(&output.stdout);
        assert_eq!(
            stdout.trim_start().starts_with('['),
            extra.len() == 3,
            "{stdout}"
        );
        let response = rover::agents::claude::parse_output(&output.stdout).expect("parses");
        assert_eq!(response.text, "hi there");
    }
}

#[test]
fn fake_takes_its_personality_from_the_env_when_its_name_says_nothing() {
    for (kind, version) in [
        ("claude", "2.1.197 (Claude Code)"),
        ("codex", "codex-cli 0.169.0"),
    ] {
        let output = std::process::Command::new(env!("CARGO_BIN_EXE_rover-fake-agent"))
            .arg("--version")
            .env("ROVER_FAKE_AGENT_AS", kind)
            .output()
            .expect("runs");
        assert!(output.status.success());
        assert_eq!(String::from_utf8_lossy(&output.stdout).trim(), version);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn codex_with_only_openai_api_key_authenticates_through_codex_api_key() {
    // The fake, like codex 0.169, fails a turn without CODEX_API_KEY; the helper sets only
    // OPENAI_API_KEY (and an empty CODEX_HOME).
    let env = FakeAgentEnv::new();
    let agent = env.agent(AgentKind::Codex, &json!([{"text": "keyed"}]), &settings());
    assert_eq!(
        agent.check().await.expect("credentials"),
        "codex-cli 0.169.0"
    );
    let response = agent
        .run(request(&env, "hi"))
        .await
        .expect("the mapped key is accepted");
    assert_eq!(response.text, "keyed");
    let call = &env.calls()[0];
    assert_eq!(call["env"]["CODEX_API_KEY"], FAKE_OPENAI_KEY);
    assert_eq!(call["env"]["OPENAI_API_KEY"], FAKE_OPENAI_KEY);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn codex_without_credentials_fails_the_check_and_the_call_naming_what_to_set() {
    let env = FakeAgentEnv::new();
    let agent = rover::agents::CodexAgent::new(Some(env.binary(AgentKind::Codex)), &settings())
        .with_host(rover::host_env::HostEnv::from_process())
        .with_env("CODEX_API_KEY", "")
        .with_env("OPENAI_API_KEY", "")
        .with_env("CODEX_HOME", env.codex_home().display().to_string())
        .with_env("ROVER_FAKE_AGENT_LOG", env.log.display().to_string());
    let err = agent.check().await.expect_err("no credentials");
    assert!(matches!(err, AgentError::Auth { .. }), "{err:?}");
    let message = err.to_string();
    for needle in [
        "auth.json does not exist",
        "set CODEX_API_KEY",
        "OPENAI_API_KEY",
        "codex login",
    ] {
        assert!(message.contains(needle), "{needle}: {message}");
    }
    // The call fails like the real CLI's: a 401 without a bearer token, not retryable.
    let err = agent.run(request(&env, "hi")).await.expect_err("401");
    assert!(matches!(err, AgentError::Auth { .. }), "{err:?}");
    assert!(!err.is_retryable());
    let message = err.to_string();
    assert!(message.contains("Missing bearer"), "{message}");
    assert!(message.contains("CODEX_API_KEY"), "{message}");
    assert!(!message.contains("ANTHROPIC"), "{message}");
    // A `codex login` is enough.
    std::fs::write(env.codex_home().join("auth.json"), "{}").expect("write auth.json");
    agent.check().await.expect("the login is found");
    agent
        .run(request(&env, "hi"))
        .await
        .expect("the login is accepted");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn codex_base_url_reaches_codex_as_its_config_value() {
    let env = FakeAgentEnv::new();
    let agent = env
        .codex_keyed(
            rover::agents::CodexAgent::new(Some(env.binary(AgentKind::Codex)), &settings())
                .with_host(rover::host_env::HostEnv::from_process()),
        )
        .with_env("OPENAI_BASE_URL", "http://127.0.0.1:9/v1")
        .with_env("ROVER_FAKE_AGENT_LOG", env.log.display().to_string());
    agent.run(request(&env, "hi")).await.expect("runs");
    let argv: Vec<String> = serde_json::from_value(env.calls()[0]["argv"].clone()).expect("argv");
    assert_eq!(
        argv[..3],
        ["exec", "-c", "openai_base_url=\"http://127.0.0.1:9/v1\""],
        "{argv:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn codex_api_errors_are_classified_from_the_real_cli_shapes() {
    for (status, class, retryable) in [
        (400, "badRequest", false),
        (404, "badRequest", false),
        (422, "badRequest", false),
        (401, "auth", false),
        (403, "auth", false),
        (429, "rateLimited", true),
        (500, "overloaded", true),
        (503, "overloaded", true),
    ] {
        let env = FakeAgentEnv::new();
        let agent = env.agent(
            AgentKind::Codex,
            &json!([{"mode": "api_error", "status": status}]),
            &settings(),
        );
        let err = agent.run(request(&env, "hi")).await.expect_err("api error");
        assert_eq!(err.class(), class, "{status}: {err}");
        assert_eq!(err.is_retryable(), retryable, "{status}");
    }
}

/// A coordinator call through the real orchestrator against codex failing with `status`;
/// returns how many times the coordinator called codex.
async fn coordinator_calls_on(status: u16) -> usize {
    let p = Pipeline::new();
    let config =
        RoverConfig::parse(r#"{"autopilot": {"agent": {"agent": "codex"}}}"#).expect("config");
    let script = json!([
        {"prompt_contains": "## What to communicate", "structured": {"message": "it failed"}},
        {"prompt_contains": "## Event", "mode": "api_error", "status": status},
    ]);
    let services = p.services_with(p.codex_agent(&script, &config), config, None, None);
    let orchestrator = p.orchestrator(build_steps(&services));
    let trace = p.submit("what is the export format?");
    p.run_with_retries(&orchestrator).await;
    let chain = p.chain(trace);
    assert!(
        chain
            .iter()
            .any(|s| s.starts_with("coordinate:") && s != "coordinate:completed"),
        "{chain:?}"
    );
    p.agents
        .calls()
        .iter()
        .filter(|c| {
            let prompt = c["prompt"].as_str().unwrap_or_default();
            prompt.contains("## Event") && !prompt.contains("## What to communicate")
        })
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_codex_bad_request_is_not_retried_but_an_outage_is() {
    assert_eq!(coordinator_calls_on(400).await, 1, "a 400 is permanent");
    assert_eq!(
        coordinator_calls_on(503).await,
        3,
        "a 503 is retried up to max_attempts"
    );
}
