//! A pipeline in a test: a real repository with a bare `origin`, a real store, the fake agent
//! (scripted per test) as the configured agent, optional fake GitHub and real Docker, and an
//! in-process orchestrator with fast timers. Three layers, each built on the one before:
//! `Pipeline` (store, checkout, fake agent, services, orchestrator), `Sandboxed` (a pipeline whose
//! containers carry a project label of their own and are removed on drop) and `StepsWorld` (every
//! real step plus the `rover` CLI). End-to-end tests of the binary use `super::scenario` instead.

// Used by the step tests; not every test binary build uses every helper.
#![allow(dead_code)]

use std::path::PathBuf;
use std::process::Output;
use std::sync::Arc;
use std::time::Duration;

use rover::agents::{Agent, AgentKind, ClaudeAgent, CodexAgent};
use rover::budget::Budget;
use rover::config::RoverConfig;
use rover::github::{GitHub, Redactor};
use rover::orchestrator::{Step, StepOrchestrator};
use rover::sandbox::{
    ContainerInfo, DockerSandbox, GateSettings, Sandbox, SandboxSettings, LABEL_ACTION,
    LABEL_PROJECT,
};
use rover::steps::{build_steps, Services};
use rover::store::{Action, AutopilotStore, Span, SpanStatus, StepKind, TraceView};
use serde_json::{json, Value};
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use super::docker::remove_containers;
use super::env::{rover_bin, stderr, stdout};
use super::fake_agent::FakeAgentEnv;
use super::fake_github::FakeGitHub;
use super::gitrepo::{TestRepo, HERMETIC_ENV};
use super::scenario::{COORDINATE, NOTIFY};

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
            .with_host(rover::host_env::HostEnv::from_process())
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
                .with_host(rover::host_env::HostEnv::from_process())
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
        Arc::new(self.services_owned(agent, config, github, sandbox))
    }

    /// `services_with`, not yet shared: for a test that changes a field before the steps get it.
    pub fn services_owned(
        &self,
        agent: Arc<dyn Agent>,
        config: RoverConfig,
        github: Option<Arc<dyn GitHub>>,
        sandbox: Option<Arc<dyn Sandbox>>,
    ) -> Services {
        Services {
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
            store_root: Some(self.store.root().to_owned()),
            host: rover::host_env::HostEnv::from_process(),
        }
    }

    /// An orchestrator with fast timers.
    pub fn orchestrator(&self, steps: Vec<Arc<dyn Step>>) -> StepOrchestrator {
        super::orch::orchestrator(
            &self.store,
            steps,
            (
                Duration::from_millis(200),
                Duration::from_millis(50),
                Duration::from_secs(5),
            ),
        )
    }

    /// Start a trace from a local request; returns the trace id.
    pub fn submit(&self, request: &str) -> Uuid {
        super::orch::submit_local(&self.store, request)
    }

    /// Start a trace from the local request `request` whose first action is a `kind` action
    /// with `meta` (an object); returns the trace id and the action.
    pub fn trace_with(&self, request: &str, kind: StepKind, meta: &Value) -> (Uuid, Action) {
        let (root, _) =
            rover::intake::local_trace(&rover::steps::kinds::FIRST_STEP, request, "tester");
        let action = action_on(&root, kind, meta);
        self.store
            .create_trace(&root, Some(&action), &[])
            .expect("create trace");
        (root.id, action)
    }

    /// Queue one more `kind` action with `meta` on `trace`.
    pub fn enqueue(&self, trace: Uuid, kind: StepKind, meta: &Value) -> Action {
        let root = self.store.read_span(trace).expect("root span");
        let action = action_on(&root, kind, meta);
        self.store.enqueue(&action, trace).expect("enqueue");
        action
    }

    /// Drain until nothing is runnable (bounded, so a bug cannot hang the suite).
    pub async fn run(&self, orchestrator: &StepOrchestrator) {
        super::orch::run_until_idle(orchestrator, 120, "the pipeline settles within two minutes")
            .await;
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

    /// `step:status`, in creation order, of the trace's spans but its collections (`collect` spans, checked where
    /// collection is tested: `collections`).
    pub fn chain(&self, trace_id: Uuid) -> Vec<String> {
        super::chain::chain(&self.trace(trace_id))
    }

    /// Drains the pipeline and checks the trace's chain of steps (`short`: see
    /// `chain::steps`); returns the trace.
    pub async fn run_as(
        &self,
        orchestrator: &StepOrchestrator,
        trace_id: Uuid,
        short: &str,
    ) -> TraceView {
        self.run(orchestrator).await;
        let view = self.trace(trace_id);
        super::chain::assert_chain(&view, short);
        view
    }

    /// The trace's `collect` spans, in creation order.
    pub fn collections(&self, trace_id: Uuid) -> Vec<Span> {
        self.trace(trace_id)
            .spans
            .into_iter()
            .filter(rover::orchestrator::is_collection)
            .collect()
    }

    pub fn worktrees(&self) -> PathBuf {
        Services::worktrees_dir(&self.store)
    }
}

/// A change to a case's services before the steps get them.
type Adjust = Box<dyn FnOnce(&mut Services, &Pipeline)>;

/// A step test's case: a `Pipeline`, the fake agent's script, a config, the GitHub client the
/// steps see and any change to the services; `build` gives the pipeline and an orchestrator over
/// the steps the test picks.
pub struct Case {
    p: Pipeline,
    script: Value,
    config: RoverConfig,
    github: Option<Arc<dyn GitHub>>,
    adjust: Option<Adjust>,
}

/// The config the in-process cases start from: rover's defaults without the self-review
/// before a push (the tests of the self-review turn it on).
pub fn test_config() -> RoverConfig {
    let mut config = RoverConfig::default();
    config.autopilot.pipeline.self_review = false;
    config
}

impl Case {
    /// A case on a new pipeline, the fake agent answering by `script`, the default config.
    pub fn new(script: &Value) -> Case {
        Case::on(Pipeline::new(), script)
    }

    /// A case on a pipeline the test prepared first (e.g. a task mapping in its store).
    pub fn on(p: Pipeline, script: &Value) -> Case {
        Case {
            p,
            script: script.clone(),
            config: test_config(),
            github: None,
            adjust: None,
        }
    }

    pub fn config(mut self, config: RoverConfig) -> Case {
        self.config = config;
        self
    }

    /// The real client against `fake`, as rover's bot.
    pub fn github(self, fake: &FakeGitHub) -> Case {
        self.github_client(Some(Arc::new(fake.client())))
    }

    pub fn github_client(mut self, github: Option<Arc<dyn GitHub>>) -> Case {
        self.github = github;
        self
    }

    /// Changes the services before the steps get them.
    pub fn adjust(mut self, adjust: impl FnOnce(&mut Services, &Pipeline) + 'static) -> Case {
        self.adjust = Some(Box::new(adjust));
        self
    }

    /// The pipeline and the services the steps get.
    pub fn services(self) -> (Pipeline, Arc<Services>) {
        let agent = self.p.agent(&self.script, &self.config);
        let mut services = self.p.services_owned(agent, self.config, self.github, None);
        if let Some(adjust) = self.adjust {
            adjust(&mut services, &self.p);
        }
        (self.p, Arc::new(services))
    }

    /// The pipeline and an orchestrator over `steps(services)`.
    pub fn build(
        self,
        steps: impl FnOnce(&Arc<Services>) -> Vec<Arc<dyn Step>>,
    ) -> (Pipeline, StepOrchestrator) {
        let (p, services) = self.services();
        let orch = p.orchestrator(steps(&services));
        (p, orch)
    }
}

/// An action of `kind` on `root`'s trace with `meta` (an object).
pub fn action_on(root: &Span, kind: StepKind, meta: &Value) -> Action {
    let Value::Object(map) = meta.clone() else {
        panic!("meta must be an object")
    };
    Action::new(kind, root, "test", map, chrono::Utc::now())
}

/// The env var that carries the fake agent's script into a sandbox.
pub const SCRIPT_ENV: &str = "ROVER_FAKE_AGENT_SCRIPT";

/// A config whose sandbox runs `image` offline with small limits, letting `env_allow` in.
pub fn sandbox_config(
    image: &str,
    timeout_secs: u64,
    env_allow: Vec<String>,
    gates: Vec<GateSettings>,
) -> RoverConfig {
    let mut config = test_config();
    config.autopilot.sandbox = SandboxSettings {
        image: image.to_owned(),
        memory_mb: 256,
        cpus: 1.0,
        pids_limit: 128,
        timeout_secs,
        egress: rover::sandbox::Egress::Mode(rover::sandbox::EgressMode::None),
        env_allow,
        gates,
        ..SandboxSettings::default()
    };
    config
}

/// A `Pipeline` whose steps run containers on a real engine under a project id of their own
/// (the `rover.project` label), every one of them removed on drop. Use it for step tests with a
/// sandbox; the end-to-end scenarios (`super::scenario::Scenario`) clean up their own.
pub struct Sandboxed {
    pub p: Pipeline,
    pub project: String,
    /// The token the services hold (for tests that check a sandbox never sees it).
    pub github_token: Option<String>,
}

impl Sandboxed {
    pub fn new(prefix: &str) -> Sandboxed {
        Sandboxed {
            p: Pipeline::new(),
            project: format!("{prefix}-{}", &Uuid::new_v4().simple().to_string()[..12]),
            github_token: None,
        }
    }

    pub fn with_github_token(mut self, token: &str) -> Sandboxed {
        self.github_token = Some(token.to_owned());
        self
    }

    /// Services over the pipeline's repository (no GitHub slug, no GitHub client) under this
    /// project, the fake agent answering `host_script` on the host.
    pub fn services(
        &self,
        host_script: &Value,
        config: RoverConfig,
        sandbox: Option<Arc<dyn Sandbox>>,
    ) -> Arc<Services> {
        let agent = self.p.agent(host_script, &config);
        Arc::new(Services {
            repo: None,
            project_id: self.project.clone(),
            github_token: self.github_token.clone().map(Into::into),
            ..self.p.services_owned(agent, config, None, sandbox)
        })
    }

    /// This project's containers of `action`.
    pub async fn containers(&self, docker: &DockerSandbox, action: Uuid) -> Vec<ContainerInfo> {
        docker
            .list_by_labels(&[
                (LABEL_PROJECT.to_owned(), self.project.clone()),
                (LABEL_ACTION.to_owned(), action.to_string()),
            ])
            .await
            .expect("list containers")
    }
}

impl Drop for Sandboxed {
    fn drop(&mut self) {
        remove_containers(&format!("{LABEL_PROJECT}={}", self.project));
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

/// The fake agent: notifies answer, `FAILME` requests fail (a fatal API error), `SLOWME`
/// requests hang in the coordinator, everything else is answered with a notify.
fn steps_rules() -> Value {
    json!({"rules": [
        {"prompt_contains": NOTIFY, "structured": {"message": "done"}},
        {"prompt_contains": "FAILME", "mode": "api_error", "status": 401},
        {"prompt_contains": "SLOWME", "mode": "hang"},
        {"prompt_contains": COORDINATE, "structured": {"decision": "notify", "confidence": 0.9,
            "reasoning": "answer it", "directive": null, "task": null, "message": "Here it is.",
            "condition": null, "task_id": null}},
    ]})
}

/// Every real step (`build_steps`) on one in-process orchestrator with a budget, over a
/// `Pipeline`, plus the real `rover` CLI on the same store and checkout. Use it to steer a
/// running pipeline (budgets, `cancel`/`fail`/`retry`); use `Pipeline` and its `Case` builder to
/// test a step or a few steps with a hand-picked step list.
pub struct StepsWorld {
    pub p: Pipeline,
    pub orch: StepOrchestrator,
}

impl StepsWorld {
    /// A pipeline whose `rover.json` has `budget` as `autopilot.budget`.
    pub fn new(budget: &Value) -> StepsWorld {
        StepsWorld::with(&json!({"autopilot": {"budget": budget}}))
    }

    /// A pipeline with this `rover.json`; codex (the fake, given only `OPENAI_API_KEY`) when
    /// `autopilot.agent.agent` says so.
    pub fn with(rover_json: &Value) -> StepsWorld {
        StepsWorld::on(Pipeline::new(), rover_json)
    }

    /// A new orchestrator on the same store and checkout: rover restarted.
    pub fn restart(self, rover_json: &Value) -> StepsWorld {
        StepsWorld::on(self.p, rover_json)
    }

    pub fn on(p: Pipeline, rover_json: &Value) -> StepsWorld {
        let text = rover_json.to_string();
        std::fs::write(p.repo.checkout.join("rover.json"), &text).expect("write rover.json");
        let config = RoverConfig::parse(&text).expect("valid config");
        let agent = if config.autopilot.agent.agent == AgentKind::Claude {
            p.agent(&steps_rules(), &config)
        } else {
            p.codex_agent(&steps_rules(), &config)
        };
        let services = p.services_with(agent, config.clone(), None, None);
        let orch = p
            .orchestrator(build_steps(&services))
            .with_budget(Budget::new(config.autopilot.budget));
        StepsWorld { p, orch }
    }

    /// Drain until nothing runs and nothing more can start (queued work may wait).
    pub async fn settle(&self) {
        tokio::time::timeout(Duration::from_secs(120), async {
            loop {
                // Busy before the drain: a run finishing during it queues work the drain missed.
                let busy = self.orch.in_flight();
                let report = self.orch.drain().await.expect("drain");
                if busy == 0
                    && report.started == 0
                    && self.orch.in_flight() == 0
                    && report.completed_detached == 0
                {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        })
        .await
        .expect("the pipeline settles within two minutes");
    }

    pub fn chain(&self, trace: Uuid) -> Vec<String> {
        self.p.chain(trace)
    }

    /// `rover autopilot <args>` on this pipeline's store and checkout.
    pub fn rover(&self, args: &[&str]) -> Output {
        std::process::Command::new(rover_bin())
            .arg("autopilot")
            .args(args)
            .args(["--project-id", &self.p.project_id])
            .env("ROVER_DATA_DIR", &self.p.repo.data)
            .env("NO_COLOR", "1")
            .current_dir(&self.p.repo.checkout)
            .output()
            .expect("run rover")
    }

    pub fn rover_ok(&self, args: &[&str]) -> String {
        let out = self.rover(args);
        assert!(
            out.status.success(),
            "{args:?}: {}{}",
            stdout(&out),
            stderr(&out)
        );
        stdout(&out)
    }

    pub fn waiting_reasons(&self) -> Vec<String> {
        self.orch.waiting().into_values().collect()
    }
}

pub fn notify_action(view: &TraceView) -> Option<&Action> {
    view.actions.iter().find(|a| a.action == StepKind::Notify)
}

/// The first span of `step` (a pipeline step or a person's command, e.g. `cancel`).
pub fn first_span<'v>(view: &'v TraceView, step: &str) -> &'v Span {
    view.spans
        .iter()
        .find(|s| s.step.as_str() == step)
        .unwrap_or_else(|| panic!("a {step} span"))
}
