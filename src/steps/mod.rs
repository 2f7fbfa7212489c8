//! The pipeline's steps, one file each, the typed metas of their actions, and the services they
//! share (agent, GitHub, sandbox, the repository). Steps never call each other: each reads its
//! action and writes a span and new actions through the store (see `orchestrator`).

mod agent_call;
pub mod cleanup;
pub mod commit;
pub mod coordinate;
pub mod gc;
pub mod history;
pub mod intervene;
pub mod kinds;
pub mod learn;
pub mod merge;
pub mod meta;
pub mod noop;
pub mod notify;
pub mod pipeline;
pub mod plan;
pub mod push;
pub mod recall;
pub mod release;
pub mod resolve;
pub mod review;
pub mod run_authority;
pub mod sandboxed;
pub mod steering;
pub mod tasks;
mod trust_check;
pub mod workflow;

use std::path::PathBuf;
use std::sync::Arc;

pub use cleanup::CleanupStep;
pub use commit::CommitStep;
pub use coordinate::CoordinateStep;
pub use merge::MergeStep;
pub use noop::{NoopStep, SummarizingNoopStep};
pub use notify::NotifyStep;
pub use plan::PlanStep;
pub use push::PushStep;
pub use release::ReleaseStep;
pub use resolve::ResolveStep;
pub use review::ReviewStep;
pub use workflow::{sweep_orphans, OrphanReport, WorkflowStep};

use crate::agents::{Agent, AgentSettings};
use crate::config::RoverConfig;
use crate::github::{GitHub, GitHubAuth, Redactor};
use crate::host_env::HostEnv;
use crate::orchestrator::Step;
use crate::project::RepoSlug;
use crate::sandbox::Sandbox;
use crate::store::{AutopilotStore, StepKind};

/// Everything a step may use besides the store. Built once by the daemon; test harnesses build
/// it with fakes (the fake agent binary, the fake GitHub server, a real Docker engine).
pub struct Services {
    /// The user's checkout (rover never writes to it; worktrees live under the data dir).
    pub repo_root: PathBuf,
    /// `owner/name` on GitHub, when known.
    pub repo: Option<RepoSlug>,
    pub project_id: String,
    pub config: RoverConfig,
    /// The configured agent (claude or codex) for the AI steps on the host.
    pub agent: Arc<dyn Agent>,
    /// `None` when rover runs on local events only.
    pub github: Option<Arc<dyn GitHub>>,
    /// `None` when no Docker engine is configured (workflows then fail with that reason).
    pub sandbox: Option<Arc<dyn Sandbox>>,
    /// Applied before anything leaves rover (public/private channels).
    pub redactor: Redactor,
    /// For `git push` and `fetch` only; never given to an agent, a sandbox or a prompt. A
    /// GitHub App's renews itself (see `github::app`).
    pub github_token: Option<GitHubAuth>,
    /// Extra environment for the `git` children (tests: hermetic config).
    pub git_env: Vec<(String, String)>,
    /// The store's directory, labelled on every container rover starts for it (see
    /// [`crate::sandbox::leftovers`]); `None` where no store owns them (a replay).
    pub store_root: Option<PathBuf>,
    /// rover's environment as it started: what the proxy, a sandbox and a build may be given
    /// of it (read once by the daemon; tests build one).
    pub host: HostEnv,
}

impl Services {
    /// A token for one `git push` or `fetch`, valid now (`None` without GitHub).
    pub async fn git_token(&self) -> Result<Option<String>, crate::github::GitHubError> {
        match &self.github_token {
            Some(auth) => auth.token().await.map(Some),
            None => Ok(None),
        }
    }

    pub fn agent_settings(&self) -> &AgentSettings {
        &self.config.autopilot.agent
    }

    /// Where task worktrees live: under the project's data dir, outside the checkout.
    pub fn worktrees_dir(store: &AutopilotStore) -> PathBuf {
        store.root().join("worktrees")
    }

    /// Where the packs of the objects each sandbox may read are cached (see
    /// [`crate::git::SandboxGit`]).
    pub fn sandbox_objects_dir(store: &AutopilotStore) -> PathBuf {
        store.root().join("sandbox-objects")
    }
}

/// Every step rover has, wired to `services`.
pub fn build_steps(services: &Arc<Services>) -> Vec<Arc<dyn Step>> {
    vec![
        Arc::new(CoordinateStep::new(services.clone())),
        Arc::new(PlanStep::new(services.clone())),
        Arc::new(WorkflowStep::new(services.clone())),
        Arc::new(CommitStep::new(services.clone())),
        Arc::new(ResolveStep::new(services.clone())),
        Arc::new(ReviewStep::new(services.clone())),
        Arc::new(PushStep::new(services.clone())),
        Arc::new(MergeStep::new(services.clone())),
        Arc::new(ReleaseStep::new(services.clone())),
        Arc::new(NotifyStep::new(services.clone())),
        Arc::new(SummarizingNoopStep::new(services.clone())),
        Arc::new(CleanupStep::new(services.clone())),
    ]
}

/// The step that replays a recorded run of `step` (`rover autopilot replay`): the deciding
/// ones, those that keep a record of every run ([`kinds::always_recorded`]); `None` for any
/// other.
pub fn deciding_step(step: &StepKind, services: Arc<Services>) -> Option<Arc<dyn Step>> {
    if !kinds::always_recorded(step) {
        return None;
    }
    Some(match step {
        StepKind::Coordinate => Arc::new(CoordinateStep::new(services)),
        StepKind::Plan => Arc::new(PlanStep::new(services)),
        StepKind::Resolve => Arc::new(ResolveStep::new(services)),
        StepKind::Merge => Arc::new(MergeStep::new(services)),
        StepKind::Release => Arc::new(ReleaseStep::new(services)),
        _ => return None,
    })
}
