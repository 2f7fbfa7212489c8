//! The `workflow` step (no AI of its own): resolves `dependsOn`, makes the task's branch and
//! worktree, records the task mapping, starts the coding agent in a Docker sandbox and detaches;
//! `monitor` finds the exited container and `collect` (run by the orchestrator under a `collect`
//! span of its own) reads it (logs, parsed result, gates, diff) and always hands over to
//! `commit` (fail forward). One container per action, re-attached after a restart.

mod collect;
mod environment;
mod fork;
mod judge;
mod launch;
mod monitor;
mod orphans;
mod revert;
mod slot_facts;
mod take_back;
mod verdict;

pub use crate::steps::meta::{
    CollectedMeta, FetchMeta, FetchResult, GatesMeta, LaunchedMeta, MergedInMeta,
    PullUnderReviewMeta, StartedMeta, WorkflowSpanMeta,
};
pub use orphans::{sweep_orphans, OrphanReport};
pub use verdict::{verdict, RunEnd};

use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use uuid::Uuid;

use super::history::{dependency_state, Dependency};
use super::meta::{self, CommitMeta, TaskStatus, WorkflowMeta};
use super::tasks::{short, store_error};
use super::Services;

use crate::orchestrator::{
    self, Completion, NextAction, Outcome, Readiness, SlotFacts, Step, StepContext, StepError,
};
use crate::sandbox::{Sandbox, SandboxLabels};
use crate::store::blocking;
use crate::store::{PendingAction, Span, StepKind, StepRun};

pub use crate::store::AGENT_LOG;

/// How long an agent may run in its container: the shorter of the sandbox and agent limits.
fn run_limit(services: &Services) -> Duration {
    let sandbox = services.config.autopilot.sandbox.timeout();
    let agent = Duration::from_secs(services.agent_settings().workflow_timeout_secs);
    sandbox.min(agent)
}

pub struct WorkflowStep {
    services: Arc<Services>,
    /// Fixed env pairs for every sandbox (names must be in `envAllow`; tests: the fake agent's script).
    fixed_env: Vec<(String, String)>,
    /// What the agent run service watches of the detached runs between looks (log followers,
    /// last activity).
    watch: crate::agent_run::RunWatch,
    /// Containers collected into a span (logs durable in its artifacts) whose finish was not
    /// yet seen recorded: removed by a later `monitor` once their span is final, never before
    /// (a crash in between leaves the container for the restarted daemon to collect again).
    collected: Mutex<Vec<CollectedContainer>>,
}

/// A collected container waiting for its span's finish to be recorded.
#[derive(Debug, Clone, PartialEq, Eq)]
struct CollectedContainer {
    span_id: Uuid,
    container: String,
}

impl WorkflowStep {
    pub fn new(services: Arc<Services>) -> WorkflowStep {
        WorkflowStep {
            services,
            fixed_env: Vec::new(),
            watch: crate::agent_run::RunWatch::default(),
            collected: Mutex::new(Vec::new()),
        }
    }

    /// Passes `name=value` into every sandbox (the name must be in `envAllow`; GitHub and git
    /// credentials are dropped whatever the name).
    #[must_use]
    pub fn with_sandbox_env(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.fixed_env.push((name.into(), value.into()));
        self
    }

    /// The env of a sandbox (see [`crate::steps::run_authority::sandbox_env`]) with this
    /// step's fixed pairs.
    pub fn sandbox_env(&self) -> Vec<(String, String)> {
        crate::steps::run_authority::sandbox_env(&self.services, &self.fixed_env)
    }

    /// The agent run service for this store's runs in `sandbox`.
    fn agent_runs(
        &self,
        store: &crate::store::AutopilotStore,
        sandbox: Arc<dyn Sandbox>,
    ) -> crate::agent_run::AgentRuns {
        crate::steps::run_authority::agent_runs(&self.services, store, sandbox)
    }

    fn labels(&self, trace_id: Uuid, action_id: Uuid) -> SandboxLabels {
        SandboxLabels {
            project: self.services.project_id.clone(),
            trace: trace_id.to_string(),
            action: action_id.to_string(),
        }
    }

    fn sandbox(&self) -> Result<Arc<dyn Sandbox>, StepError> {
        self.services.sandbox.clone().ok_or_else(|| {
            StepError::fatal(
                "no Docker sandbox is configured, so the workflow cannot run; start a Docker engine (or set DOCKER_HOST) and restart the daemon",
            )
        })
    }

    fn commit_action(action_id: Uuid, status: TaskStatus, summary: &str) -> NextAction {
        NextAction::new(
            StepKind::Commit,
            match status {
                TaskStatus::Completed => "the workflow completed; commit its changes",
                TaskStatus::Failed => "the workflow failed; the committer records that",
                TaskStatus::Error => "the workflow could not finish; the committer records that",
            },
        )
        .with_meta(&CommitMeta {
            workflow_action_id: Some(action_id),
            task_status: status,
            summary: Some(summary.to_owned()),
        })
    }
}

/// At most this many workflow sandboxes run at once (detached ones included): the step's
/// `maxParallel`, which the orchestrator counts detached runs against.
pub const MAX_SANDBOXES: usize = 3;

#[async_trait]
impl Step for WorkflowStep {
    fn kind(&self) -> StepKind {
        StepKind::Workflow
    }

    /// At most this many workflow sandboxes run at once, detached ones included.
    fn max_parallel(&self) -> usize {
        MAX_SANDBOXES
    }

    /// A detached run's container holds its sandbox slot until `monitor` collects it.
    fn detached_holds_slot(&self) -> bool {
        true
    }

    /// The coding agent runs in a sandbox: one of the daemon's agent slots.
    fn takes_agent_slot(&self) -> bool {
        true
    }

    async fn slot_facts(&self, ctx: &StepContext, pending: &PendingAction) -> SlotFacts {
        let p = pending.clone();
        blocking(ctx.store.clone(), move |s| slot_facts::slot_facts(s, &p))
            .await
            .unwrap_or_else(|e| {
                // Scored as a plain task: a store it cannot read now fails the run itself.
                tracing::warn!(action = %pending.action_id, error = &e as &dyn std::error::Error, "cannot read what the scheduler scores a task by");
                SlotFacts::default()
            })
    }

    async fn ready(
        &self,
        ctx: &StepContext,
        pending: &PendingAction,
    ) -> Result<Readiness, StepError> {
        let action_id = pending.action_id;
        let trace_id = pending.trace_id;
        let deps = blocking(ctx.store.clone(), move |s| {
            let action = s.read_action(action_id)?;
            let meta: Option<WorkflowMeta> = meta::read(&action).ok();
            match meta {
                Some(m) if !m.depends_on.is_empty() => {
                    Ok(Some((m, s.read_state()?, s.load_trace(trace_id)?)))
                }
                _ => Ok(None),
            }
        })
        .await
        .map_err(|e| store_error("cannot read the workflow action", &e))?;
        if let Some((meta, state, view)) = deps {
            for dep in &meta.depends_on {
                if let Dependency::Waiting(reason) | Dependency::Blocked(reason) =
                    dependency_state(&view, &state, *dep)
                {
                    return Ok(Readiness::Wait(reason));
                }
            }
        }
        Ok(Readiness::Ready)
    }

    async fn process(&self, ctx: &StepContext, run: &StepRun) -> Result<Outcome, StepError> {
        self.launch(ctx, run).await
    }

    async fn monitor(&self, ctx: &StepContext) -> Result<Vec<Completion>, StepError> {
        self.monitor_runs(ctx).await
    }

    async fn collect(
        &self,
        ctx: &StepContext,
        run: &StepRun,
        ended: &Completion,
    ) -> Result<orchestrator::Collected, StepError> {
        self.collect_run(ctx, run, ended).await
    }

    async fn stop_detached(&self, ctx: &StepContext, trace_id: Uuid) -> usize {
        self.stop_runs(ctx, trace_id).await
    }

    async fn still_running(&self, ctx: &StepContext, pending: &PendingAction, span: &Span) -> bool {
        self.run_alive(ctx, pending, span).await
    }
}

impl std::fmt::Debug for WorkflowStep {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WorkflowStep")
            .field(
                "fixed_env",
                &self.fixed_env.iter().map(|(k, _)| k).collect::<Vec<_>>(),
            )
            .finish_non_exhaustive()
    }
}

/// For summaries: `workflow 1a2b3c4d`.
pub fn label(action_id: Uuid) -> String {
    format!("workflow {}", short(action_id))
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::*;
    use crate::agents;
    use crate::agents::{AgentKind, AgentRequest, AgentSettings, ClaudeAgent};
    use crate::config::RoverConfig;

    fn services(allow: &[&str], token: Option<&str>) -> Arc<Services> {
        services_for(AgentKind::Claude, allow, token)
    }

    fn services_for(kind: AgentKind, allow: &[&str], token: Option<&str>) -> Arc<Services> {
        let mut config = RoverConfig::default();
        config.autopilot.agent.agent = kind;
        config.autopilot.sandbox.env_allow = allow.iter().map(|s| (*s).to_owned()).collect();
        Arc::new(Services {
            repo_root: PathBuf::from("/nonexistent"),
            repo: None,
            project_id: "p".into(),
            agent: Arc::new(ClaudeAgent::new(None, &AgentSettings::default())),
            config,
            github: None,
            sandbox: None,
            redactor: crate::github::Redactor::new(Vec::<String>::new()),
            github_token: token.map(Into::into),
            git_env: Vec::new(),
            store_root: None,
            host: crate::host_env::HostEnv::default(),
        })
    }

    #[test]
    fn sandbox_env_never_carries_a_github_token_and_keeps_to_the_allow_list() {
        let token = "ghp_0123456789abcdefTOKEN";
        let step = WorkflowStep::new(services(
            &["GITHUB_TOKEN", "GH_TOKEN", "IS_SANDBOX", "SCRIPT", "LEAKY"],
            Some(token),
        ))
        .with_sandbox_env("GITHUB_TOKEN", "x")
        .with_sandbox_env("gh_token", "x")
        .with_sandbox_env("LEAKY", format!("prefix-{token}"))
        .with_sandbox_env("SCRIPT", "[]")
        .with_sandbox_env("NOT_ALLOWED", "1");
        let env = step.sandbox_env();
        let names: Vec<&str> = env.iter().map(|(k, _)| k.as_str()).collect();
        assert!(names.contains(&"SCRIPT"), "{names:?}");
        assert!(names.contains(&"IS_SANDBOX"), "{names:?}");
        for refused in ["GITHUB_TOKEN", "gh_token", "LEAKY", "NOT_ALLOWED"] {
            assert!(!names.contains(&refused), "{refused} in {names:?}");
        }
        assert!(!env.iter().any(|(_, v)| v.contains(token)));
    }

    #[test]
    fn without_is_sandbox_allowed_it_is_not_set() {
        let step = WorkflowStep::new(services(&[], None)).with_sandbox_env("SCRIPT", "[]");
        assert!(step.sandbox_env().is_empty());
    }

    #[test]
    fn no_model_credential_or_endpoint_enters_a_sandbox_by_name_or_by_value() {
        let allow = [
            "OPENAI_API_KEY",
            "CODEX_API_KEY",
            "ANTHROPIC_API_KEY",
            "ANTHROPIC_BASE_URL",
            "MY_VAR",
        ];
        let step = WorkflowStep::new(services_for(AgentKind::Codex, &allow, None))
            .with_sandbox_env("OPENAI_API_KEY", "sk-o")
            .with_sandbox_env("anthropic_api_key", "sk-a")
            .with_sandbox_env("ANTHROPIC_BASE_URL", "http://elsewhere")
            .with_sandbox_env("MY_VAR", "fine");
        let names: Vec<String> = step.sandbox_env().into_iter().map(|(n, _)| n).collect();
        assert_eq!(names, ["MY_VAR"]);
    }

    #[test]
    fn a_codex_sandbox_gets_the_base_url_as_a_config_override() {
        let mut request = AgentRequest::new("/workspace", "do it");
        request.tools = agents::ToolPolicy::FullEdit;
        let url = Some("http://models.internal:8080/v1");
        let argv = agents::sandbox_argv(AgentKind::Codex, &request, url);
        assert_eq!(
            argv[..4],
            [
                "codex",
                "exec",
                "-c",
                "openai_base_url=\"http://models.internal:8080/v1\""
            ]
        );
        assert!(!agents::sandbox_argv(AgentKind::Codex, &request, None)
            .iter()
            .any(|a| a.contains("openai_base_url")));
        assert!(!agents::sandbox_argv(AgentKind::Claude, &request, url)
            .iter()
            .any(|a| a.contains("openai_base_url")));
    }
}
