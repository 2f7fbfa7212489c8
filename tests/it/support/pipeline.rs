//! A pipeline in a test: a real repository with a bare `origin`, a real store, the fake agent
//! (scripted per test) as the configured agent, optional fake GitHub and real Docker, and an
//! in-process orchestrator with fast timers. Scenario tests of the binary use `TestEnv` instead.

// Used by the step tests; not every test binary build uses every helper.
#![allow(dead_code)]

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use rover::agents::{Agent, AgentKind, ClaudeAgent, CodexAgent};
use rover::config::RoverConfig;
use rover::github::{GitHub, Redactor};
use rover::orchestrator::{OrchestratorSettings, Step, StepOrchestrator};
use rover::sandbox::Sandbox;
use rover::steps::Services;
use rover::store::{AutopilotStore, Span, SpanStatus, TraceView};
use serde_json::Value;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use super::fake_agent::FakeAgentEnv;
use super::gitrepo::{TestRepo, HERMETIC_ENV};

pub struct Pipeline {
    pub repo: TestRepo,
    pub store: AutopilotStore,
    pub agents: FakeAgentEnv,
    pub project_id: String,
}

impl Pipeline {
    pub fn new() -> Pipeline {
        let repo = TestRepo::new();
        let project_id = "pipeline-test".to_owned();
        let store = AutopilotStore::open(&repo.data, &project_id).expect("open store");
        Pipeline {
            repo,
            store,
            agents: FakeAgentEnv::new(),
            project_id,
        }
    }

    /// The fake agent as `claude`, answering by `script` (see `src/bin/rover-fake-agent`).
    pub fn agent(&self, script: &Value, config: &RoverConfig) -> Arc<dyn Agent> {
        Arc::new(
            ClaudeAgent::new(
                Some(self.agents.binary(AgentKind::Claude)),
                &config.autopilot.agent,
            )
            .with_env("ROVER_FAKE_AGENT_SCRIPT", script.to_string())
            .with_env(
                "ROVER_FAKE_AGENT_LOG",
                self.agents.log.display().to_string(),
            ),
        )
    }

    /// The fake agent as `codex`, answering by `script`, given only `OPENAI_API_KEY`.
    pub fn codex_agent(&self, script: &Value, config: &RoverConfig) -> Arc<dyn Agent> {
        Arc::new(
            self.agents.codex_keyed(
                CodexAgent::new(
                    Some(self.agents.binary(AgentKind::Codex)),
                    &config.autopilot.agent,
                )
                .with_env("ROVER_FAKE_AGENT_SCRIPT", script.to_string())
                .with_env(
                    "ROVER_FAKE_AGENT_LOG",
                    self.agents.log.display().to_string(),
                ),
            ),
        )
    }

    /// Services over this repository; GitHub and Docker only when given.
    pub fn services(
        &self,
        script: &Value,
        config: RoverConfig,
        github: Option<Arc<dyn GitHub>>,
        sandbox: Option<Arc<dyn Sandbox>>,
    ) -> Arc<Services> {
        let agent = self.agent(script, &config);
        self.services_with(agent, config, github, sandbox)
    }

    /// Services over this repository with the given agent.
    pub fn services_with(
        &self,
        agent: Arc<dyn Agent>,
        config: RoverConfig,
        github: Option<Arc<dyn GitHub>>,
        sandbox: Option<Arc<dyn Sandbox>>,
    ) -> Arc<Services> {
        Arc::new(Services {
            repo_root: self.repo.checkout.clone(),
            repo: Some(rover::project::RepoSlug::parse("octo-org/widgets").expect("slug")),
            project_id: self.project_id.clone(),
            agent,
            config,
            github,
            sandbox,
            redactor: Redactor::new(Vec::<String>::new()),
            github_token: None,
            git_env: HERMETIC_ENV
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
        })
    }

    /// An orchestrator with fast timers.
    pub fn orchestrator(&self, steps: Vec<Arc<dyn Step>>) -> StepOrchestrator {
        StepOrchestrator::new(
            self.store.clone(),
            steps,
            OrchestratorSettings {
                fallback_interval: Duration::from_millis(200),
                retry_backoff: Duration::from_millis(50),
                shutdown_grace: Duration::from_secs(5),
                ..OrchestratorSettings::default()
            },
        )
        .with_pipeline(rover::steps::pipeline::pipeline())
    }

    /// Start a trace from a local request; returns the trace id.
    pub fn submit(&self, request: &str) -> Uuid {
        let (root, first) = rover::steps::event::local_trace(request, "tester");
        self.store
            .create_trace(&root, Some(&first), &[])
            .expect("create trace");
        root.id
    }

    /// Drain until nothing is runnable (bounded, so a bug cannot hang the suite).
    pub async fn run(&self, orchestrator: &StepOrchestrator) {
        tokio::time::timeout(
            Duration::from_secs(120),
            orchestrator.run_until_idle(CancellationToken::new()),
        )
        .await
        .expect("the pipeline settles within two minutes")
        .expect("drain");
    }

    /// Run until no action is pending, retries (after their backoff) included (bounded).
    pub async fn run_with_retries(&self, orchestrator: &StepOrchestrator) {
        let token = CancellationToken::new();
        let runner = orchestrator.clone();
        let stop = token.clone();
        let task = tokio::spawn(async move { runner.run(stop).await });
        tokio::time::timeout(Duration::from_secs(120), async {
            loop {
                tokio::time::sleep(Duration::from_millis(50)).await;
                let state = self.store.read_state().expect("read state");
                if state.pending.is_empty() && orchestrator.in_flight() == 0 {
                    break;
                }
            }
        })
        .await
        .expect("the pipeline settles within two minutes");
        token.cancel();
        task.await.expect("join").expect("run");
    }

    pub fn trace(&self, trace_id: Uuid) -> TraceView {
        self.store.load_trace(trace_id).expect("load trace")
    }

    /// The trace's spans as `step:status`, in creation order.
    pub fn chain(&self, trace_id: Uuid) -> Vec<String> {
        self.trace(trace_id)
            .spans
            .iter()
            .map(|s: &Span| format!("{}:{}", s.step, s.status))
            .collect()
    }

    pub fn worktrees(&self) -> PathBuf {
        Services::worktrees_dir(&self.store)
    }
}

/// A span of a step, the last one, for assertions on its meta.
pub fn last_span(view: &TraceView, step: &str) -> Span {
    view.spans
        .iter()
        .rev()
        .find(|s| s.step.as_str() == step)
        .cloned()
        .unwrap_or_else(|| panic!("no {step} span"))
}

pub fn completed(view: &TraceView, step: &str) -> bool {
    view.spans
        .iter()
        .any(|s| s.step.as_str() == step && s.status == SpanStatus::Completed)
}
