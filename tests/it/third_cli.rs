//! A third agent CLI, written here and nowhere else: an `AgentCli` is all rover needs to run
//! one on the host (its process, its stream, its answer) and in a sandbox through the agent
//! run service (its argv, the variables pointing it at the model API, its container and log).
//! No file of `src/` knows this CLI.

use std::sync::Arc;

use rover::agent_run::{AgentRuns, RunPlan};
use rover::agents::{
    Agent, AgentCli, AgentKind, AgentRequest, AgentResponse, AgentSettings, AgentStream, CliAgent,
    HostCall, ParseError, Provider,
};
use rover::sandbox::{ContainerStatus, Sandbox, SandboxSettings};
use serde_json::Value;

use crate::support::docker::{self, TestContainers};

/// "Echo": a CLI that answers one JSON line `{"answer": ..., "tokens": n}`. Its executable is
/// `sh`, so the test needs no binary of its own: the script is its argument.
struct Echo;

/// The script `sh -c` runs: prints the prompt back as the answer, and the model API it was
/// pointed at (from its variables) as the session.
const SCRIPT: &str =
    r#"printf '{"answer":"%s","tokens":7,"session":"%s"}\n' "$1" "$ECHO_BASE_URL""#;

impl AgentCli for Echo {
    fn name(&self) -> &'static str {
        "sh"
    }
    fn bin_env_var(&self) -> &'static str {
        "ROVER_ECHO_BIN"
    }
    fn install_hint(&self) -> &'static str {
        "it is the shell"
    }
    fn credentials_hint(&self) -> &'static str {
        "set ECHO_KEY"
    }
    fn provider(&self) -> Provider {
        Provider::Anthropic
    }
    fn model_env(&self, base_url: &str, key: &str) -> Vec<(String, String)> {
        vec![
            ("ECHO_BASE_URL".into(), base_url.into()),
            ("ECHO_KEY".into(), key.into()),
        ]
    }
    fn sandbox_args(&self, request: &AgentRequest, _: Option<&str>) -> Vec<String> {
        vec![
            "-c".into(),
            SCRIPT.into(),
            "echo".into(),
            request.prompt.clone(),
        ]
    }
    fn host_args(&self, request: &AgentRequest, _: &HostCall<'_>) -> Vec<String> {
        self.sandbox_args(request, None)
    }
    fn stream(&self, _expect_json: bool) -> Box<dyn AgentStream> {
        Box::new(EchoStream(None))
    }
}

/// Keeps the last line that parses as the answer.
struct EchoStream(Option<Value>);

impl AgentStream for EchoStream {
    fn push_line(&mut self, line: &str) -> bool {
        self.0 = serde_json::from_str(line).ok();
        self.0.is_some()
    }
    fn finish(self: Box<Self>) -> Result<AgentResponse, ParseError> {
        let value = self.0.ok_or(ParseError::NoResult { lines: 0 })?;
        let mut response = AgentResponse {
            text: value["answer"].as_str().unwrap_or_default().to_owned(),
            session_id: value["session"].as_str().map(str::to_owned),
            ..AgentResponse::default()
        };
        response.usage.output = value["tokens"].as_u64().unwrap_or_default();
        Ok(response)
    }
}

static ECHO: Echo = Echo;

#[tokio::test]
async fn a_third_cli_runs_on_the_host_through_the_one_adapter() {
    let dir = tempfile::tempdir().expect("tempdir");
    let kind = AgentKind::of(&ECHO);
    let agent = CliAgent::new(kind, None, &AgentSettings::default())
        .with_host(rover::host_env::HostEnv::from_process());
    assert_eq!(agent.kind(), kind);
    let response = agent
        .run(AgentRequest::new(dir.path(), "hello there"))
        .await
        .expect("the shell answers");
    assert_eq!(response.text, "hello there");
    assert_eq!(response.usage.output, 7);
    // On the host nothing points it at rover's proxy.
    assert_eq!(response.session_id.as_deref(), Some(""));
    assert!(
        agent.check().await.is_err(),
        "`sh --version` prints no version"
    );
}

#[tokio::test]
async fn a_third_cli_runs_in_a_sandbox_through_the_agent_run_service() {
    let sandbox = docker::sandbox().await;
    let image = docker::test_image(&sandbox).await;
    let tests = TestContainers::new();
    let worktree = tempfile::tempdir().expect("worktree");
    let proxy_dir = tempfile::tempdir().expect("proxy dir");
    let spec = tests.spec(&image, worktree.path(), "third-cli", "unused");
    let sandbox: Arc<dyn Sandbox> = Arc::new(sandbox);
    // Egress `none` (the spec's settings): no proxy, no grant, no network.
    let settings = SandboxSettings {
        egress: rover::sandbox::Egress::Mode(rover::sandbox::EgressMode::None),
        ..SandboxSettings::default()
    };
    let runs = AgentRuns::new(
        sandbox.clone(),
        &settings,
        proxy_dir.path().to_path_buf(),
        "rover-tests",
        Vec::new(),
    );
    let kind = AgentKind::of(&ECHO);
    let prepared = runs
        .prepare(RunPlan {
            kind,
            request: AgentRequest::new("/workspace", "from the sandbox"),
            spec,
            trace_id: uuid::Uuid::new_v4(),
            budget: None,
        })
        .await
        .expect("prepared");
    assert_eq!(prepared.spec.cmd[..3], ["sh", "-c", SCRIPT]);
    assert_eq!(prepared.spec.network, "none");
    assert_eq!(prepared.egress, "none");
    assert!(prepared.spec.rover_env.is_empty(), "no proxy, no token");
    let started = runs.start(&prepared).await.expect("started");
    assert!(!started.adopted);
    let container = prepared.spec.container_name();
    let log = worktree.path().join("agent.log");
    sandbox
        .logs_to_file(&container, &log, 1 << 20)
        .await
        .expect("logs");
    assert!(matches!(
        sandbox.wait(&container).await.expect("waits"),
        ContainerStatus::Exited { code: 0, .. }
    ));
    let stdout = std::fs::read(&log).expect("read the log");
    let response =
        rover::agents::parse_output(kind, &stdout, false).expect("the log parses as its answer");
    assert_eq!(response.text, "from the sandbox");
    // A second start of the same run takes the container over, never runs a second one.
    assert!(runs.start(&prepared).await.expect("adopted").adopted);
    assert!(runs.end(&container).await.is_none(), "no proxy saw it");

    // With the proxy, the service points the CLI at it with the run's own token.
    let env = rover::agent_run::agent_env(kind, "the-token");
    let value = |name: &str| env.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_str());
    assert_eq!(
        value("ECHO_BASE_URL"),
        Some("http://rover-proxy:8080/anthropic")
    );
    assert_eq!(value("ECHO_KEY"), Some("the-token"));
    assert!(value("HTTPS_PROXY").is_some_and(|p| p.contains("the-token")));
}
