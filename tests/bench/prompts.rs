//! Prompt weight: the bytes of the first model request of each host-side step's call, sent by
//! the real `claude` CLI (pinned, installed by `tests/setup-clis.sh`) to a fake Anthropic API:
//! as rover calls it now (no tools, `--setting-sources=user`, rover's own system prompt) and as
//! it did before (every built-in tool offered, Claude Code's coding prompt with rover's appended).

use std::io::Write as _;
use std::path::PathBuf;
use std::process::{Command, Stdio};

use rover::agents::{
    placeholders, step_request, Agent, AgentSettings, AgentStep, ClaudeAgent, CustomInstructions,
    PromptVars,
};
use serde_json::json;

use crate::support::fake_anthropic::FakeAnthropic;

fn real_claude() -> Option<PathBuf> {
    std::env::var_os("ROVER_TEST_CLAUDE_BIN")
        .map(PathBuf::from)
        .or_else(|| {
            let home = std::env::var_os("HOME").map(PathBuf::from)?;
            Some(home.join(".cache/rover-test-clis/claude-2.1.197/node_modules/.bin/claude"))
        })
        .filter(|p| p.exists())
}

pub fn run() {
    println!("\n== prompt weight (the real claude CLI against a fake model API)");
    let Some(claude) = real_claude() else {
        println!("  skipped: no real claude CLI; run `bash tests/setup-clis.sh` first");
        return;
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (cwd, home) = (dir.path().join("cwd"), dir.path().join("home"));
    std::fs::create_dir_all(&cwd).unwrap();
    std::fs::create_dir_all(&home).unwrap();
    let api = rt.block_on(FakeAnthropic::start(json!({"answer": "for the bench"})));
    let env: Vec<(&str, String)> = vec![
        ("ANTHROPIC_API_KEY", "sk-ant-api03-bench".into()),
        ("ANTHROPIC_BASE_URL", api.url.clone()),
        ("CLAUDE_CODE_MAX_RETRIES", "0".into()),
        ("DISABLE_AUTOUPDATER", "1".into()),
        ("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "1".into()),
        ("HOME", home.display().to_string()),
    ];
    let first_model_request = |from: usize| {
        api.requests()[from..]
            .iter()
            .find(|r| r.path == "/v1/messages")
            .map_or(0, |r| r.bytes)
    };
    let settings = AgentSettings::default();
    let mut agent = ClaudeAgent::new(Some(claude.clone()), &settings)
        .with_host(rover::host_env::HostEnv::from_process());
    for (k, v) in &env {
        agent = agent.with_env(*k, v.clone());
    }
    let (mut now_total, mut before_total) = (0usize, 0usize);
    for step in [
        AgentStep::Coordinate,
        AgentStep::Plan,
        AgentStep::Commit,
        AgentStep::Resolve,
        AgentStep::Notify,
        AgentStep::Summarize,
    ] {
        let req = typical_request(&settings, step, &cwd, "event");
        let mark = api.requests().len();
        let _ = rt.block_on(agent.run(req.clone()));
        let now = first_model_request(mark);

        // The same call as rover made it before: every tool offered, the coding prompt kept.
        let mark = api.requests().len();
        let mut before = Command::new(&claude);
        before
            .args(["-p", "--output-format", "stream-json", "--verbose"])
            .args(["--model", req.model.as_deref().unwrap_or("sonnet")])
            .arg("--allowedTools=Read,Glob,Grep")
            .arg(format!("--append-system-prompt={}", req.system_prompt))
            .args(["--json-schema", &req.schema.as_ref().unwrap().to_string()])
            .current_dir(&cwd)
            .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        let mut child = before.spawn().unwrap();
        child
            .stdin
            .take()
            .unwrap()
            .write_all(req.prompt.as_bytes())
            .unwrap();
        let _ = child.wait();
        let old = first_model_request(mark);
        now_total += now;
        before_total += old;
        println!(
            "  {:<10} first request {:>7} bytes now, {:>7} bytes before: {:>5.1}x less",
            step.name(),
            now,
            old,
            old as f64 / now.max(1) as f64
        );
    }
    println!(
        "  all six host steps: {now_total} bytes now, {before_total} before: {:.1}x less (bar: 10x)",
        before_total as f64 / now_total.max(1) as f64
    );
    // The sandboxed steps as their container runs the CLI (`sandbox_argv`): the workflow agent
    // (every editing tool, Claude Code's coding prompt with rover's appended) and the
    // self-review beside it (read-only tools, only them).
    for step in [AgentStep::Workflow, AgentStep::Review] {
        let req = typical_request(&settings, step, &cwd, "task");
        let argv = rover::agents::sandbox_argv(rover::agents::AgentKind::Claude, &req, None);
        let mark = api.requests().len();
        let _ = Command::new(&claude)
            .args(&argv[1..])
            .current_dir(&cwd)
            .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
        println!(
            "  {:<10} first request {:>7} bytes (in its sandbox: {} tools)",
            step.name(),
            first_model_request(mark),
            match step {
                AgentStep::Review => "read-only",
                _ => "editing",
            }
        );
    }
}

/// `step`'s request as rover makes it, every placeholder filled with a stand-in (`the <name>
/// of a typical <of>`), and its answer's schema.
fn typical_request(
    settings: &AgentSettings,
    step: AgentStep,
    cwd: &std::path::Path,
    of: &str,
) -> rover::agents::AgentRequest {
    let vars: PromptVars = placeholders(step)
        .into_iter()
        .map(|name| (name.clone(), format!("(the {name} of a typical {of})")))
        .collect();
    let mut req = step_request(
        settings,
        step,
        cwd,
        &vars,
        false,
        &CustomInstructions::default(),
    )
    .unwrap();
    req.schema = Some(rover::agents::step_schema(step));
    req
}
