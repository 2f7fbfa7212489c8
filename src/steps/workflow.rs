//! The `workflow` step (no AI of its own): resolves `dependsOn`, makes the task's branch and
//! worktree, records the task mapping, starts the coding agent in a Docker sandbox and detaches;
//! `monitor` collects the exited container (logs, parsed result, gates, diff) and always hands
//! over to `commit` (fail forward). One container per action, re-attached after a restart.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use chrono::Utc;
use serde::Serialize;
use serde_json::{json, Value};
use uuid::Uuid;

use super::meta::{self, CommitMeta, TaskStatus, WorkflowMeta};
use super::tasks::{self, git_error, short, store_error, TaskRecord};
use super::Services;
use crate::agents::{self, AgentStep, PromptVars, WorkflowResult, WorkflowStatus};
use crate::git::{self, BranchBase};
use crate::orchestrator::{
    blocking, Completion, Finished, NextAction, Outcome, Readiness, Step, StepContext, StepError,
};
use crate::sandbox::gates::{run_gates, GatesReport};
use crate::sandbox::{
    self, ContainerStatus, Sandbox, SandboxError, SandboxLabels, SandboxSpec, ALWAYS_REFUSED_ENV,
    LABEL_ACTION, LABEL_PROJECT,
};
use crate::store::{AutopilotStore, PendingAction, Span, SpanStatus, StepKind, StepRun, TraceView};

/// The agent's stdout inside the span's artifacts dir (stderr next to it, `.stderr`).
pub const AGENT_LOG: &str = "agent.log";

/// Env names of the model credentials and endpoints a sandboxed agent may get (when set in
/// rover's environment and allowed by `autopilot.sandbox.envAllow`).
pub const MODEL_ENV: &[&str] = &[
    "ANTHROPIC_API_KEY",
    "ANTHROPIC_BASE_URL",
    "CLAUDE_CODE_OAUTH_TOKEN",
    "OPENAI_API_KEY",
    "OPENAI_BASE_URL",
    "CODEX_API_KEY",
];

/// The agent's argv in the container. Codex ignores `OPENAI_BASE_URL` as a variable, so a base
/// URL in the sandbox env also goes in as codex's `openai_base_url` config value for this run:
/// nothing is written into a `CODEX_HOME` (in the container codex keeps its sessions under the
/// tmpfs `HOME`).
fn agent_argv(
    kind: agents::AgentKind,
    request: &agents::AgentRequest,
    env: &[(String, String)],
) -> Vec<String> {
    let mut argv = agents::sandbox_argv(kind, request);
    if kind == agents::AgentKind::Codex {
        if let Some(url) = agents::env_value(env, agents::OPENAI_BASE_URL) {
            agents::codex::insert_base_url(&mut argv, url);
        }
    }
    argv
}

/// How long an agent may run in its container: the shorter of the sandbox and agent limits.
fn run_limit(services: &Services) -> Duration {
    let sandbox = services.config.autopilot.sandbox.timeout();
    let agent = Duration::from_secs(services.agent_settings().workflow_timeout_secs);
    sandbox.min(agent)
}

/// Longest pull request diff handed to the workflow agent.
const MAX_REVIEW_DIFF: usize = 48 * 1024;

/// Where a new task forks from, and what was fetched for it.
struct FreshBase {
    base: BranchBase,
    fetch: Value,
    review: Option<PullUnderReview>,
}

impl FreshBase {
    fn unfetched(why: &str) -> FreshBase {
        FreshBase {
            base: BranchBase::DefaultBranch,
            fetch: json!({"fetched": false, "error": why}),
            review: None,
        }
    }
}

/// The pull request a task works on: its head (checked out in the worktree) and its change.
struct PullUnderReview {
    number: u64,
    head: String,
    base: String,
    diff: Option<String>,
}

impl PullUnderReview {
    /// What the workflow agent is told about the pull request.
    fn prompt(&self) -> String {
        let mut text = format!(
            "\n\n## The pull request under review: #{}\nThe worktree has its head checked out ({}). Its change against `{}`:\n",
            self.number, self.head, self.base
        );
        match &self.diff {
            Some(diff) if !diff.trim().is_empty() => {
                text.push_str(&agents::untrusted_block(
                    &format!("pull request #{}", self.number),
                    diff,
                ));
            }
            _ => {
                let _ = write!(
                    text,
                    "(not available here; run `git diff {}...HEAD`)",
                    self.base
                );
            }
        }
        text
    }
}

pub struct WorkflowStep {
    services: Arc<Services>,
    /// Fixed env pairs for every sandbox (names must be in `envAllow`; tests: the fake agent's script).
    fixed_env: Vec<(String, String)>,
    /// Actions given a sandbox slot by `ready` whose `process` has not returned yet (so
    /// `monitor` leaves them alone and the slot count sees them), with when they got it.
    launching: Mutex<HashMap<Uuid, Instant>>,
    /// Last activity (log output, file change) of each running container, for stuck detection.
    stuck: crate::budget::StuckWatch,
    /// Containers collected into a span (logs durable in its artifacts) whose finish was not
    /// yet seen recorded: removed by a later `monitor` once their span is final, never before
    /// (a crash in between leaves the container for the restarted daemon to collect again).
    collected: Mutex<Vec<Collected>>,
}

/// A collected container waiting for its span's finish to be recorded.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Collected {
    span_id: Uuid,
    container: String,
}

/// At most this many workflow sandboxes run at once (detached ones included).
pub const MAX_SANDBOXES: usize = 3;

/// A slot reserved by `ready` whose run never started (another process took the action) is
/// given back after this long.
const RESERVATION_TTL: Duration = Duration::from_secs(120);

/// Removes an action from `launching` when `process` ends, however it ends.
struct LaunchGuard<'a> {
    set: &'a Mutex<HashMap<Uuid, Instant>>,
    id: Uuid,
}

impl Drop for LaunchGuard<'_> {
    fn drop(&mut self) {
        self.set
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .remove(&self.id);
    }
}

/// Where a dependency stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Dependency {
    /// Still queued, running, or its commit is not done yet.
    Waiting(String),
    /// Done and committed: fork from its branch.
    Done {
        branch: String,
        title: String,
        summary: String,
    },
    /// It failed, and the resolver may still iterate on it (its commit or a resolve is queued
    /// or running): this task waits, and the resolver does not wait for it.
    Blocked(String),
    /// It failed for good (or is unknown): this task cannot run.
    Failed(String),
}

/// The latest iteration of workflow action `dep` (the resolver's `iterate`/`retry` make a new
/// workflow action with `iterateOn` naming the one before): what a dependent builds on.
fn latest_iteration(view: &TraceView, dep: Uuid) -> Uuid {
    let mut latest = dep;
    // Bounded by the number of actions, so a cycle in foreign data cannot loop.
    for _ in 0..view.actions.len() {
        let next = view.actions.iter().find(|a| {
            a.action == StepKind::Workflow
                && meta::read::<WorkflowMeta>(a).is_ok_and(|m| m.iterate_on == Some(latest))
        });
        match next {
            Some(a) => latest = a.id,
            None => break,
        }
    }
    latest
}

/// Where dependency `dep` of a task in trace `view` stands: its latest iteration's state, and a
/// failure is only final once no commit or resolve of the trace that could iterate it is left.
pub fn dependency_state(view: &TraceView, state: &crate::store::State, dep: Uuid) -> Dependency {
    match iteration_state(view, state, latest_iteration(view, dep)) {
        Dependency::Failed(reason) if resolver_pending(view) => {
            Dependency::Blocked(format!("{reason}; waiting for the resolver"))
        }
        other => other,
    }
}

/// Whether a commit or resolve of the trace is queued or running (the resolver may still
/// iterate on a failed task).
fn resolver_pending(view: &TraceView) -> bool {
    view.pending
        .iter()
        .any(|p| matches!(p.action, StepKind::Commit | StepKind::Resolve))
}

fn iteration_state(view: &TraceView, state: &crate::store::State, dep: Uuid) -> Dependency {
    let title = view
        .actions
        .iter()
        .find(|a| a.id == dep)
        .and_then(|a| meta::read::<WorkflowMeta>(a).ok())
        .map(|m| m.title);
    let Some(title) = title else {
        return Dependency::Failed(format!(
            "it depends on workflow action {dep}, which is not a workflow of this trace"
        ));
    };
    if view.pending.iter().any(|p| p.action_id == dep) {
        return Dependency::Waiting(format!("dependency `{title}` has not finished"));
    }
    let Some(span) = view
        .spans
        .iter()
        .rev()
        .find(|s| s.action_id == Some(dep) && s.status.is_final())
    else {
        return Dependency::Waiting(format!("dependency `{title}` has not run yet"));
    };
    let summary = span.summary.clone().unwrap_or_default();
    if span.status != SpanStatus::Completed {
        return Dependency::Failed(format!(
            "dependency `{title}` ended {}: {summary}",
            span.status
        ));
    }
    let commits: Vec<Uuid> = view
        .actions
        .iter()
        .filter(|a| {
            a.action == StepKind::Commit
                && (a.span_id == span.id
                    || meta::read::<CommitMeta>(a).is_ok_and(|m| m.workflow_action_id == Some(dep)))
        })
        .map(|a| a.id)
        .collect();
    if view.pending.iter().any(|p| commits.contains(&p.action_id)) {
        return Dependency::Waiting(format!("dependency `{title}` is not committed yet"));
    }
    if let Some(commit) = view
        .spans
        .iter()
        .rev()
        .find(|s| s.action_id.is_some_and(|a| commits.contains(&a)) && s.status.is_final())
    {
        if commit.status != SpanStatus::Completed {
            return Dependency::Failed(format!(
                "the commit of dependency `{title}` ended {}: {}",
                commit.status,
                commit.summary.clone().unwrap_or_default()
            ));
        }
    }
    match tasks::task_of(state, dep) {
        Some(task) => Dependency::Done {
            branch: task.branch,
            title,
            summary,
        },
        None => Dependency::Failed(format!(
            "dependency `{title}` has no task mapping any more (cleaned up?)"
        )),
    }
}

impl WorkflowStep {
    pub fn new(services: Arc<Services>) -> WorkflowStep {
        WorkflowStep {
            services,
            fixed_env: Vec::new(),
            launching: Mutex::new(HashMap::new()),
            stuck: crate::budget::StuckWatch::default(),
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

    /// The env of a sandbox: allowed model credentials from rover's environment, the agent's
    /// extra names, `IS_SANDBOX=1`, the fixed pairs; never a GitHub token (by name or value).
    /// For codex, `OPENAI_API_KEY` alone is also passed as `CODEX_API_KEY` (when that is allowed).
    pub fn sandbox_env(&self) -> Vec<(String, String)> {
        let allow = &self.services.config.autopilot.sandbox.env_allow;
        let token = self.services.github_token.clone().filter(|t| t.len() >= 8);
        let refused = |name: &str, value: &str| {
            ALWAYS_REFUSED_ENV
                .iter()
                .any(|r| r.eq_ignore_ascii_case(name))
                || agents::ALWAYS_DENIED_ENV.contains(&name)
                || token.as_deref().is_some_and(|t| value.contains(t))
                || !allow.iter().any(|a| a == name)
        };
        let mut env: Vec<(String, String)> = Vec::new();
        let names = MODEL_ENV
            .iter()
            .map(|s| (*s).to_owned())
            .chain(self.services.agent_settings().extra_env.iter().cloned());
        for name in names {
            if let Ok(value) = std::env::var(&name) {
                if !refused(&name, &value) && !env.iter().any(|(n, _)| *n == name) {
                    env.push((name, value));
                }
            }
        }
        if !refused("IS_SANDBOX", "1") {
            env.push(("IS_SANDBOX".into(), "1".into()));
        }
        for (name, value) in &self.fixed_env {
            if !refused(name, value) {
                env.retain(|(n, _)| n != name);
                env.push((name.clone(), value.clone()));
            }
        }
        if self.services.agent_settings().agent == agents::AgentKind::Codex {
            let mut mapped = env.clone();
            if agents::map_codex_key(&mut mapped) && !refused(agents::CODEX_API_KEY, "") {
                env = mapped;
            }
        }
        env
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

    /// What a new task forks from, after fetching what it needs: the default branch, the
    /// pushed commit of a push to it, or the head of the pull request the event is about (the
    /// task then reviews or builds on that pull request; rover pushes only its own branch). A
    /// failed fetch is recorded and the checkout's copy used.
    async fn fresh_base(&self, ws: &git::Workspace, view: &TraceView) -> FreshBase {
        let event = super::agent_call::event_meta(view)
            .ok()
            .and_then(|e| e.event);
        let remote = ws.remote().to_owned();
        let Ok(default) = ws.default_branch().await else {
            return FreshBase::unfetched("the default branch is unknown");
        };
        let mut refspecs = vec![format!(
            "+refs/heads/{default}:refs/remotes/{remote}/{default}"
        )];
        let pull = event
            .as_ref()
            .filter(|e| e.is_pull_request)
            .and_then(|e| e.number.map(|n| (n, e.base_branch.clone())));
        if let Some((number, base_branch)) = &pull {
            refspecs.push(format!(
                "+refs/pull/{number}/head:refs/remotes/{remote}/pr/{number}"
            ));
            if let Some(b) = base_branch.as_ref().filter(|b| **b != default) {
                refspecs.push(format!("+refs/heads/{b}:refs/remotes/{remote}/{b}"));
            }
        }
        // One fetch per refspec: a missing pull request ref must not keep the default branch
        // stale.
        let token = self.services.github_token.as_deref();
        let mut fetched = Vec::new();
        for refspec in &refspecs {
            let result = ws.fetch(std::slice::from_ref(refspec), token).await;
            if let Err(e) = &result {
                tracing::warn!(refspec, error = %e, "cannot fetch before forking; using the checkout's copy");
            }
            fetched.push(match result {
                Ok(()) => json!({"refspec": refspec, "fetched": true}),
                Err(e) => json!({"refspec": refspec, "fetched": false, "error": e.to_string()}),
            });
        }
        let fetch = Value::Array(fetched);
        if let Some((number, base_branch)) = pull {
            let head_ref = format!("refs/remotes/{remote}/pr/{number}");
            if let Some(head) = ws.commit_id(&head_ref).await {
                let base = base_branch.unwrap_or_else(|| default.clone());
                let diff = ws
                    .diff_commits(
                        &format!("refs/remotes/{remote}/{base}"),
                        &head,
                        MAX_REVIEW_DIFF,
                    )
                    .await
                    .ok()
                    .flatten();
                return FreshBase {
                    base: BranchBase::Commit(head.clone()),
                    fetch,
                    review: Some(PullUnderReview {
                        number,
                        head,
                        base,
                        diff,
                    }),
                };
            }
        }
        let pushed = event
            .as_ref()
            .filter(|e| e.git_ref.as_deref() == Some(&format!("refs/heads/{default}")));
        if let Some(sha) = pushed.and_then(|e| e.commit_sha.clone()) {
            if let Some(id) = ws.commit_id(&sha).await {
                return FreshBase {
                    base: BranchBase::Commit(id),
                    fetch,
                    review: None,
                };
            }
        }
        FreshBase {
            base: BranchBase::DefaultBranch,
            fetch,
            review: None,
        }
    }

    /// Branch, base and worktree path of a new run.
    async fn placement(
        &self,
        ctx: &StepContext,
        action_id: Uuid,
        meta: &WorkflowMeta,
        dependency_branch: Option<String>,
        ws: &git::Workspace,
    ) -> Result<(String, BranchBase, PathBuf), StepError> {
        let fresh_path = Services::worktrees_dir(&ctx.store).join(action_id.to_string());
        if let Some(previous) = meta.iterate_on {
            let earlier = tasks::load_task(&ctx.store, previous)
                .await
                .map_err(|e| store_error("cannot read the task mappings", &e))?;
            return match (earlier, &meta.branch) {
                (Some(task), _) => Ok((
                    task.branch,
                    BranchBase::Existing,
                    task.worktree.unwrap_or(fresh_path),
                )),
                (None, Some(branch)) => Ok((branch.clone(), BranchBase::Existing, fresh_path)),
                (None, None) => Err(StepError::fatal(format!(
                    "cannot iterate on workflow {previous}: its task mapping is gone and no branch was given"
                ))),
            };
        }
        if let Some(branch) = &meta.branch {
            let exists = ws
                .branch_exists(branch)
                .await
                .map_err(|e| git_error("cannot look up the branch", &e))?;
            let base = if exists {
                BranchBase::Existing
            } else {
                BranchBase::DefaultBranch
            };
            return Ok((branch.clone(), base, fresh_path));
        }
        let branch = git::branch_name(&action_id.to_string(), &meta.title);
        let base = dependency_branch.map_or(BranchBase::DefaultBranch, BranchBase::Branch);
        Ok((branch, base, fresh_path))
    }

    fn prompt_vars(meta: &WorkflowMeta, dependencies: &[(String, String, String)]) -> PromptVars {
        let workflow_type = serde_json::to_value(meta.workflow_type)
            .ok()
            .and_then(|v| v.as_str().map(str::to_owned))
            .unwrap_or_else(|| "swe".into());
        let criteria = if meta.acceptance_criteria.is_empty() {
            "(none given)".to_owned()
        } else {
            meta.acceptance_criteria
                .iter()
                .map(|c| format!("- {c}"))
                .collect::<Vec<_>>()
                .join("\n")
        };
        let mut instructions = meta.instructions.clone().unwrap_or_default();
        if !dependencies.is_empty() {
            if !instructions.is_empty() {
                instructions.push_str("\n\n");
            }
            instructions.push_str(
                "This task builds on the work of the tasks below, already committed on this branch:\n",
            );
            for (title, branch, summary) in dependencies {
                let _ = writeln!(instructions, "- {title} (branch {branch}): {summary}");
            }
        }
        if instructions.trim().is_empty() {
            instructions = "(none)".into();
        }
        PromptVars::from([
            ("workflow_type".to_owned(), workflow_type),
            ("title".to_owned(), meta.title.clone()),
            ("description".to_owned(), meta.description.clone()),
            ("acceptance_criteria".to_owned(), criteria),
            ("instructions".to_owned(), instructions),
        ])
    }

    /// The spec of the agent container (also the base of the gate containers).
    fn base_spec(&self, cmd: Vec<String>, worktree: &Path, labels: SandboxLabels) -> SandboxSpec {
        let mut spec = SandboxSpec::from_settings(
            &self.services.config.autopilot.sandbox,
            cmd,
            worktree,
            labels,
        );
        spec.env = self.sandbox_env();
        spec
    }

    async fn launch(&self, ctx: &StepContext, run: &StepRun) -> Result<Outcome, StepError> {
        let action_id = run.action.id;
        let trace_id = run.pending.trace_id;
        let meta: WorkflowMeta = meta::read(&run.action)
            .map_err(|e| StepError::fatal(format!("the workflow action's meta is invalid: {e}")))?;

        // Dependencies: a failed one fails this task (and still hands over to commit).
        let store = ctx.store.clone();
        let (view, state) = blocking(store, move |s| {
            Ok((s.load_trace(trace_id)?, s.read_state()?))
        })
        .await
        .map_err(|e| store_error("cannot read the trace", &e))?;
        let mut dependency_branch = None;
        let mut dependencies = Vec::new();
        for dep in &meta.depends_on {
            match dependency_state(&view, &state, *dep) {
                Dependency::Waiting(reason) | Dependency::Blocked(reason) => {
                    return Err(StepError::retryable(format!(
                        "a dependency is not done yet: {reason}"
                    )))
                }
                Dependency::Failed(reason) => {
                    let summary = format!("not started: {reason}");
                    return Ok(Outcome::Finished(
                        Finished::failed(summary.clone())
                            .meta("dependencyFailed", dep)
                            .meta("reason", &reason)
                            .then(Self::commit_action(action_id, TaskStatus::Failed, &summary)),
                    ));
                }
                Dependency::Done {
                    branch,
                    title,
                    summary,
                } => {
                    dependency_branch.get_or_insert_with(|| branch.clone());
                    dependencies.push((title, branch, summary));
                }
            }
        }

        let sandbox = self.sandbox()?;
        let settings = &self.services.config.autopilot.sandbox;
        sandbox.ensure_image(&settings.image).await.map_err(|e| {
            StepError::from_error(&e, e.is_retryable()).detail("image", &settings.image)
        })?;

        let ws = tasks::workspace(&self.services)
            .await
            .map_err(|e| git_error("cannot open the repository", &e))?;
        let (branch, base, path) = self
            .placement(ctx, action_id, &meta, dependency_branch, &ws)
            .await?;
        // New work forks from current code: fetched first, from the pushed commit of a push
        // event or the head of the pull request the event is about.
        let fresh = if base == BranchBase::DefaultBranch
            && !ws
                .branch_exists(&branch)
                .await
                .map_err(|e| git_error("cannot look up the branch", &e))?
        {
            Some(self.fresh_base(&ws, &view).await)
        } else {
            None
        };
        let base = fresh.as_ref().map_or(base, |f| f.base.clone());
        let prepared = ws
            .prepare_worktree(&branch, base.clone(), &path)
            .await
            .map_err(|e| {
                git_error("cannot prepare the task worktree", &e)
                    .detail("branch", &branch)
                    .detail("base", format!("{base:?}"))
            })?;
        let mut task = TaskRecord {
            action_id,
            task_id: action_id.to_string(),
            branch: prepared.branch.clone(),
            trace_id,
            workflow_span_id: run.span.id,
            container: None,
            worktree: Some(prepared.path.clone()),
            fork_point: Some(prepared.fork_point.clone()),
            title: Some(meta.title.clone()),
        };

        // More than one dependency: the branch forked from the first; merge the others in
        // (a no-op when already merged, e.g. on a rerun).
        let others: Vec<String> = dependencies.iter().skip(1).map(|d| d.1.clone()).collect();
        if !others.is_empty() && meta.iterate_on.is_none() {
            if let Err(e) = ws.merge_branches(&prepared.path, &others).await {
                tasks::save_task(&ctx.store, &task)
                    .await
                    .map_err(|e| store_error("cannot record the task mapping", &e))?;
                let error = git_error("cannot combine the dependencies' branches", &e);
                let summary = format!("not started: {}", error.message);
                return Ok(Outcome::Finished(
                    Finished::failed(summary.clone())
                        .meta("branchName", &task.branch)
                        .meta("worktreePath", prepared.path.display().to_string())
                        .meta("error", error.to_meta())
                        .then(Self::commit_action(action_id, TaskStatus::Failed, &summary)),
                ));
            }
        }

        // The resolver's answer to a consolidation conflict: the other side merged in, the
        // conflicts left in the files for the agent (the commit step then records the merge).
        let mut merged_in: Option<(String, Vec<String>)> = None;
        if let Some(from) = &meta.merge_from {
            match ws.merge_leaving_conflicts(&prepared.path, from).await {
                Ok(conflicts) => merged_in = Some((from.clone(), conflicts)),
                Err(e) => {
                    tasks::save_task(&ctx.store, &task)
                        .await
                        .map_err(|e| store_error("cannot record the task mapping", &e))?;
                    let error = git_error(&format!("cannot merge `{from}` into the task"), &e);
                    let summary = format!("not started: {}", error.message);
                    return Ok(Outcome::Finished(
                        Finished::failed(summary.clone())
                            .meta("branchName", &task.branch)
                            .meta("worktreePath", prepared.path.display().to_string())
                            .meta("error", error.to_meta())
                            .then(Self::commit_action(action_id, TaskStatus::Failed, &summary)),
                    ));
                }
            }
        }

        // The agent's command; custom instructions come from the default branch, never from
        // the worktree (an earlier run could have planted some there).
        let agent_settings = self.services.agent_settings().clone();
        let kind = agent_settings.agent;
        let mut vars = Self::prompt_vars(&meta, &dependencies);
        if let Some(review) = fresh.as_ref().and_then(|f| f.review.as_ref()) {
            let text = vars.entry("instructions".to_owned()).or_default();
            if text == "(none)" {
                text.clear();
            }
            text.push_str(&review.prompt());
        }
        let workdir = prepared.path.clone();
        let attribution = self.services.config.attribution;
        let custom = super::agent_call::custom_instructions(&self.services).await;
        let mut request = agents::step_request(
            &agent_settings,
            AgentStep::Workflow,
            &workdir,
            &vars,
            attribution,
            &custom,
        )
        .map_err(|e| StepError::from_error(&e, false))?;
        request.schema = Some(agents::schema_for::<WorkflowResult>());
        let argv = agent_argv(kind, &request, &self.sandbox_env());

        // The container gets a scratch git of its own; the worktree's `.git` must still be
        // rover's (an iteration reuses the worktree of an earlier run).
        let mut spec = self.base_spec(argv, &prepared.path, self.labels(trace_id, action_id));
        let scratch = ctx.store.artifacts_dir(run.span.id).join("git");
        let sandbox_git = async {
            ws.verify_worktree(&prepared.path).await?;
            ws.sandbox_git(&prepared.path, &scratch).await
        }
        .await
        .map_err(|e| {
            if super::sandboxed::is_tampered(&e) {
                super::sandboxed::tampered("the task's worktree was tampered with", &e)
            } else {
                git_error("cannot prepare the sandbox's git", &e)
            }
        })?;
        spec.mount_git(&sandbox_git);
        let container = spec.container_name();

        // The mapping first: a crash after this point finds the container by it.
        task.container = Some(container.clone());
        tasks::save_task(&ctx.store, &task)
            .await
            .map_err(|e| store_error("cannot record the task mapping", &e))?;

        let started = self.start(sandbox.as_ref(), &spec).await?;
        let mut detached = crate::store::Meta::new();
        for (k, v) in [
            ("taskId", json!(task.task_id)),
            ("branchName", json!(task.branch)),
            ("worktreePath", json!(prepared.path.display().to_string())),
            ("forkPoint", json!(prepared.fork_point)),
            ("baseSha", json!(prepared.fork_point)),
            (
                "fetch",
                fresh.as_ref().map_or(Value::Null, |f| f.fetch.clone()),
            ),
            (
                "pullRequest",
                fresh.as_ref().and_then(|f| f.review.as_ref()).map_or(
                    Value::Null,
                    |r| json!({"number": r.number, "head": r.head, "base": r.base}),
                ),
            ),
            (
                "mergedIn",
                merged_in.as_ref().map_or(
                    Value::Null,
                    |(from, conflicts)| json!({"branch": from, "conflicts": conflicts}),
                ),
            ),
            ("container", json!(container)),
            ("image", json!(spec.image)),
            ("started", started),
            (
                "env",
                json!(spec.env.iter().map(|(k, _)| k).collect::<Vec<_>>()),
            ),
        ] {
            detached.insert(k.into(), v);
        }
        Ok(Outcome::Detached { meta: detached })
    }

    /// Starts the container; never a second one for the action: one that runs or exited is
    /// taken over, one left created-but-never-started (a crash in between) is replaced.
    async fn start(&self, sandbox: &dyn Sandbox, spec: &SandboxSpec) -> Result<Value, StepError> {
        let container = spec.container_name();
        let failed = |e: &SandboxError| {
            StepError::from_error(e, e.is_retryable())
                .detail("container", &container)
                .detail("image", &spec.image)
        };
        match sandbox.run(spec).await {
            Ok(id) => return Ok(json!({"containerId": id, "adopted": false})),
            Err(SandboxError::Conflict { .. }) => {}
            Err(e) => return Err(failed(&e)),
        }
        match sandbox.status(&container).await.map_err(|e| failed(&e))? {
            ContainerStatus::Running | ContainerStatus::Exited { .. } => {
                Ok(json!({"containerId": container, "adopted": true}))
            }
            ContainerStatus::Created | ContainerStatus::Gone => {
                sandbox.remove(&container).await.map_err(|e| failed(&e))?;
                let id = sandbox.run(spec).await.map_err(|e| failed(&e))?;
                Ok(json!({"containerId": id, "adopted": false, "replacedUnstarted": true}))
            }
        }
    }

    /// Collects one exited (or vanished, or overdue) container into a finished span; also says
    /// whether its logs are durably in the artifacts (so the container may go once the span is
    /// recorded).
    async fn collect(
        &self,
        ctx: &StepContext,
        sandbox: &dyn Sandbox,
        task: &TaskRecord,
        span: &Span,
        status: ContainerStatus,
        timed_out: bool,
        stuck: bool,
    ) -> (Finished, bool) {
        let container = task.container.clone().unwrap_or_default();
        let artifacts = ctx.store.artifacts_dir(span.id);
        let log = artifacts.join(AGENT_LOG);
        let err_log = sandbox::stderr_path(&log);
        let mut notes: Vec<String> = Vec::new();
        if let Err(e) = tokio::fs::create_dir_all(&artifacts).await {
            notes.push(format!("cannot create {}: {e}", artifacts.display()));
        }
        // The container may go once its logs are durably in the artifacts (and its span is
        // recorded final, see `remove_collected`).
        let mut logs_saved = false;
        if status != ContainerStatus::Gone {
            match sandbox.logs_to_file(&container, &log).await {
                Ok(_) => match sync_files(&[log.clone(), sandbox::stderr_path(&log)]).await {
                    Ok(()) => logs_saved = true,
                    Err(e) => notes.push(format!("cannot make the container's logs durable: {e}")),
                },
                Err(e) => notes.push(format!("cannot read the container's logs: {e}")),
            }
        }
        let stdout = tokio::fs::read(&log).await.unwrap_or_default();
        let stderr = tokio::fs::read(&err_log).await.unwrap_or_default();
        let stderr_tail = tail(&String::from_utf8_lossy(&stderr), 2000);
        let agent_settings = self.services.agent_settings();
        let kind = agent_settings.agent;
        let mut parsed = agents::parse_output(kind, &stdout, true);
        if let (Ok(response), agents::AgentKind::Codex) = (&mut parsed, kind) {
            // codex reports tokens only: priced here so the budgets see USD.
            let model = agent_settings.model_for(AgentStep::Workflow);
            agent_settings
                .codex_prices
                .fill_cost(model.as_deref(), response);
        }
        let result = parsed
            .as_ref()
            .map_err(ToString::to_string)
            .and_then(agents::extract::<WorkflowResult>);

        let limit = run_limit(&self.services);
        let (mut task_status, mut summary) = match (status, &result) {
            (ContainerStatus::Gone, _) => (
                TaskStatus::Error,
                format!("the sandbox container {container} disappeared before rover read its result (removed by hand?)"),
            ),
            (_, _) if stuck => (
                TaskStatus::Failed,
                format!(
                    "stuck: the agent wrote no output and changed no file for {}s (autopilot.budget.stuckAfterSecs); it was stopped",
                    self.services.config.autopilot.budget.stuck_after_secs
                ),
            ),
            (_, _) if timed_out => (
                TaskStatus::Failed,
                format!("the agent ran past its {}s limit and was killed", limit.as_secs()),
            ),
            (ContainerStatus::Exited { oom_killed: true, .. }, _) => (
                TaskStatus::Failed,
                format!(
                    "the agent was killed: out of memory (limit {} MiB)",
                    self.services.config.autopilot.sandbox.memory_mb
                ),
            ),
            (ContainerStatus::Exited { code, .. }, _) if code != 0 => (
                TaskStatus::Failed,
                format!(
                    "the agent exited with code {code}: {}",
                    last_line(&stderr_tail).unwrap_or("no error output")
                ),
            ),
            (ContainerStatus::Exited { .. }, Err(reason)) => (
                TaskStatus::Failed,
                format!("the agent gave no valid result: {reason}"),
            ),
            (ContainerStatus::Exited { .. }, Ok(r)) if r.status == WorkflowStatus::Failed => {
                (TaskStatus::Failed, format!("the agent could not do the task: {}", r.summary))
            }
            (ContainerStatus::Exited { .. }, Ok(r)) => (TaskStatus::Completed, r.summary.clone()),
            (ContainerStatus::Created | ContainerStatus::Running, _) => (
                TaskStatus::Error,
                format!("the sandbox container {container} did not finish"),
            ),
        };

        let mut finished = Finished::failed(String::new());
        // Gates, only for work the agent calls done.
        if task_status == TaskStatus::Completed {
            if let Some(worktree) = &task.worktree {
                let gates = &self.services.config.autopilot.sandbox.gates;
                let base = self.base_spec(
                    vec!["true".into()],
                    worktree,
                    self.labels(task.trace_id, task.action_id),
                );
                match run_gates(sandbox, &base, gates, &artifacts.join("gates")).await {
                    Ok(report) => {
                        if report.failed_required() {
                            task_status = TaskStatus::Failed;
                            let failed: Vec<String> = report
                                .results()
                                .iter()
                                .filter(|r| r.required && !r.passed())
                                .map(|r| r.command.join(" "))
                                .collect();
                            summary = format!(
                                "a required gate did not pass ({}); the agent said: {summary}",
                                failed.join("; ")
                            );
                        }
                        let warnings: Vec<String> = report
                            .warnings()
                            .iter()
                            .map(|r| {
                                format!("optional gate `{}` did not pass", r.command.join(" "))
                            })
                            .collect();
                        finished = finished.meta("gateWarnings", warnings);
                        finished = finished.meta("gates", gates_meta(&report));
                    }
                    Err(e) => {
                        task_status = TaskStatus::Error;
                        summary = format!("the verification gates could not run: {e}");
                    }
                }
            }
        }

        // Every container over the worktree has exited: its git metadata must still be rover's,
        // or nothing of this task is trusted (and nothing of it is committed).
        let mut tampered = None;
        if let Some(worktree) = &task.worktree {
            if let Ok(ws) = tasks::workspace(&self.services).await {
                if let Err(e) = ws.verify_worktree(worktree).await {
                    if super::sandboxed::is_tampered(&e) {
                        tracing::warn!(worktree = %worktree.display(), error = %e, "a sandbox tampered with the worktree's git metadata");
                        task_status = TaskStatus::Failed;
                        summary = e.to_string();
                        tampered = Some(super::sandboxed::tampered(
                            "the sandbox tampered with the worktree",
                            &e,
                        ));
                    }
                }
            }
        }
        let scratch = ctx.store.artifacts_dir(task.workflow_span_id).join("git");
        let _ = tokio::fs::remove_dir_all(&scratch).await;

        let diff = match (&task.worktree, &task.fork_point) {
            _ if tampered.is_some() => None,
            (Some(worktree), Some(fork)) => match tasks::workspace(&self.services).await {
                Ok(ws) => ws
                    .diff_summary(worktree, fork)
                    .await
                    .map_err(|e| notes.push(format!("no diff summary: {e}")))
                    .ok(),
                Err(e) => {
                    notes.push(format!("no diff summary: {e}"));
                    None
                }
            },
            _ => None,
        };

        finished.status = match task_status {
            TaskStatus::Completed => SpanStatus::Completed,
            TaskStatus::Failed => SpanStatus::Failed,
            TaskStatus::Error => SpanStatus::Error,
        };
        finished.summary.clone_from(&summary);
        let (exit_code, oom) = match status {
            ContainerStatus::Exited { code, oom_killed } => (Some(code), oom_killed),
            _ => (None, false),
        };
        finished = finished
            .meta("taskId", &task.task_id)
            .meta("branchName", &task.branch)
            .meta("worktreePath", &task.worktree)
            .meta("containerId", &container)
            .meta("container", status)
            .meta("exitCode", exit_code)
            .meta("oomKilled", oom)
            .meta("timedOut", timed_out)
            .meta("stuck", stuck)
            .meta("logPath", log.display().to_string())
            .meta("stderrPath", err_log.display().to_string())
            .meta("stderrTail", &stderr_tail)
            .meta("diff", &diff)
            .meta("taskStatus", task_status);
        if let Ok(r) = &result {
            finished = finished.meta("result", r);
        }
        if let Ok(response) = &parsed {
            finished = finished.meta("agent", super::agent_call::response_usage(response));
        }
        if let Some(error) = &tampered {
            finished = finished
                .meta("tampered", true)
                .meta("error", error.to_meta());
        } else if task_status == TaskStatus::Error {
            finished = finished.meta(
                "error",
                json!({"message": summary, "retryable": false, "container": container}),
            );
        }
        if !notes.is_empty() {
            finished = finished.meta("notes", &notes);
        }
        let finished = finished.then(Self::commit_action(task.action_id, task_status, &summary));
        (finished, logs_saved)
    }
}

impl WorkflowStep {
    /// Removes the containers collected earlier whose span is now recorded final (their logs
    /// are in the artifacts). One whose span still runs (its finish was not recorded) stays:
    /// `monitor` collects it again.
    async fn remove_collected(&self, ctx: &StepContext, sandbox: &dyn Sandbox) {
        let entries = self
            .collected
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone();
        for entry in entries {
            let span_id = entry.span_id;
            let recorded = blocking(ctx.store.clone(), move |s| s.read_span(span_id))
                .await
                .map(|span| span.status.is_final());
            match recorded {
                Ok(true) => {}
                Ok(false) => continue,
                Err(e) => {
                    tracing::warn!(span = %span_id, error = %e, "cannot read a collected workflow span; its container stays for now");
                    continue;
                }
            }
            match sandbox.remove(&entry.container).await {
                Ok(_) => self
                    .collected
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .retain(|c| *c != entry),
                Err(e) => {
                    tracing::warn!(container = %entry.container, error = %e, "cannot remove a collected workflow container; trying again later");
                }
            }
        }
    }

    /// How long a running container has shown no activity (log output, a changed file in its
    /// worktree), when that is past `autopilot.budget.stuckAfterSecs`.
    async fn stuck_for(
        &self,
        ctx: &StepContext,
        sandbox: &Arc<dyn Sandbox>,
        task: &TaskRecord,
        container: &str,
    ) -> Option<Duration> {
        let after = self.services.config.autopilot.budget.stuck_after_secs;
        if after == 0 {
            return None;
        }
        let probe = ctx
            .store
            .artifacts_dir(task.workflow_span_id)
            .join("activity.log");
        if let Some(dir) = probe.parent() {
            let _ = tokio::fs::create_dir_all(dir).await;
        }
        // A follower copies the log as it grows; its size is the output seen so far.
        {
            let sandbox = sandbox.clone();
            let container = container.to_owned();
            let probe = probe.clone();
            self.stuck.follow(task.action_id, async move {
                let _ = sandbox.logs_to_file(&container, &probe).await;
            });
        }
        let mut log_bytes = 0;
        for path in [probe.clone(), crate::sandbox::stderr_path(&probe)] {
            log_bytes += tokio::fs::metadata(&path).await.map_or(0, |m| m.len());
        }
        let newest = match task.worktree.clone() {
            Some(dir) => {
                tokio::task::spawn_blocking(move || crate::budget::newest_change(&dir, 50_000))
                    .await
                    .ok()
                    .flatten()
            }
            None => None,
        };
        let idle = self.stuck.observe(task.action_id, log_bytes, newest);
        (idle >= Duration::from_secs(after)).then_some(idle)
    }
}

/// Makes written files durable (data and their directory entries).
async fn sync_files(paths: &[PathBuf]) -> std::io::Result<()> {
    let paths = paths.to_vec();
    tokio::task::spawn_blocking(move || {
        for path in &paths {
            std::fs::File::open(path)?.sync_all()?;
        }
        let mut dirs: Vec<&Path> = paths.iter().filter_map(|p| p.parent()).collect();
        dirs.dedup();
        for dir in dirs {
            std::fs::File::open(dir)?.sync_all()?;
        }
        Ok(())
    })
    .await
    .map_err(std::io::Error::other)?
}

fn gates_meta(report: &GatesReport) -> Value {
    match report {
        GatesReport::NoneConfigured => json!("none configured"),
        GatesReport::Ran { .. } => serde_json::to_value(report).unwrap_or(Value::Null),
    }
}

fn tail(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_owned();
    }
    let mut start = text.len() - max;
    while !text.is_char_boundary(start) {
        start += 1;
    }
    format!("[... cut by rover ...]{}", &text[start..])
}

fn last_line(text: &str) -> Option<&str> {
    text.lines().rev().find(|l| !l.trim().is_empty())
}

#[async_trait]
impl Step for WorkflowStep {
    fn kind(&self) -> StepKind {
        StepKind::Workflow
    }

    fn max_parallel(&self) -> usize {
        3
    }

    async fn ready(
        &self,
        ctx: &StepContext,
        pending: &PendingAction,
    ) -> Result<Readiness, StepError> {
        let action_id = pending.action_id;
        let trace_id = pending.trace_id;
        let (state, deps) = blocking(ctx.store.clone(), move |s| {
            let action = s.read_action(action_id)?;
            let state = s.read_state()?;
            let meta: Option<WorkflowMeta> = meta::read(&action).ok();
            match meta {
                Some(m) if !m.depends_on.is_empty() => {
                    Ok((state, Some((m, s.load_trace(trace_id)?))))
                }
                _ => Ok((state, None)),
            }
        })
        .await
        .map_err(|e| store_error("cannot read the workflow action", &e))?;
        if let Some((meta, view)) = deps {
            for dep in &meta.depends_on {
                if let Dependency::Waiting(reason) | Dependency::Blocked(reason) =
                    dependency_state(&view, &state, *dep)
                {
                    return Ok(Readiness::Wait(reason));
                }
            }
        }
        // A sandbox slot: detached runs hold theirs until `monitor` collects them.
        let mut slots = self
            .launching
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        slots.retain(|_, since| since.elapsed() < RESERVATION_TTL);
        if slots.contains_key(&action_id) {
            return Ok(Readiness::Ready);
        }
        let detached = state
            .pending
            .iter()
            .filter(|p| {
                p.action == StepKind::Workflow
                    && p.running_span_id.is_some()
                    && p.action_id != action_id
                    && !slots.contains_key(&p.action_id)
            })
            .count();
        if detached + slots.len() >= MAX_SANDBOXES {
            return Ok(Readiness::Wait(format!(
                "{MAX_SANDBOXES} workflow sandboxes are running; waiting for one to finish"
            )));
        }
        slots.insert(action_id, Instant::now());
        Ok(Readiness::Ready)
    }

    async fn process(&self, ctx: &StepContext, run: &StepRun) -> Result<Outcome, StepError> {
        self.launching
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .insert(run.action.id, Instant::now());
        let _guard = LaunchGuard {
            set: &self.launching,
            id: run.action.id,
        };
        self.launch(ctx, run).await
    }

    async fn monitor(&self, ctx: &StepContext) -> Result<Vec<Completion>, StepError> {
        let Some(sandbox) = self.services.sandbox.clone() else {
            return Ok(Vec::new());
        };
        self.remove_collected(ctx, sandbox.as_ref()).await;
        let state = blocking(ctx.store.clone(), AutopilotStore::read_state)
            .await
            .map_err(|e| store_error("cannot read the state", &e))?;
        let launching = self
            .launching
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone();
        let mut done = Vec::new();
        for task in tasks::all_tasks(&state) {
            let Some(pending) = state.pending_for(task.action_id) else {
                continue;
            };
            if pending.action != StepKind::Workflow
                || pending.running_span_id != Some(task.workflow_span_id)
                || launching.contains_key(&task.action_id)
            {
                continue;
            }
            let Some(container) = task.container.clone() else {
                continue;
            };
            let span_id = task.workflow_span_id;
            let Ok(span) = blocking(ctx.store.clone(), move |s| s.read_span(span_id)).await else {
                continue;
            };
            if span.status != SpanStatus::Running {
                continue;
            }
            let mut status = match sandbox.status(&container).await {
                Ok(s) => s,
                Err(e) => {
                    tracing::warn!(container = %container, error = %e, "cannot check a workflow container");
                    let elapsed = (Utc::now() - span.timestamp).to_std().unwrap_or_default();
                    if elapsed < run_limit(&self.services) {
                        continue;
                    }
                    // Past the run limit and still no engine: end the run rather than wait forever.
                    let summary = format!(
                        "cannot check the sandbox container {container} and its time is up: {e}"
                    );
                    let finished = Finished {
                        status: SpanStatus::Error,
                        summary: summary.clone(),
                        meta: crate::store::Meta::new(),
                        actions: Vec::new(),
                    }
                    .meta("taskId", &task.task_id)
                    .meta("branchName", &task.branch)
                    .meta("worktreePath", &task.worktree)
                    .meta("containerId", &container)
                    .meta(
                        "error",
                        json!({"message": summary, "retryable": e.is_retryable(), "container": container}),
                    )
                    .then(Self::commit_action(task.action_id, TaskStatus::Error, &summary));
                    done.push(Completion {
                        action_id: task.action_id,
                        finished,
                    });
                    continue;
                }
            };
            let mut timed_out = false;
            let mut stuck = false;
            if matches!(status, ContainerStatus::Running | ContainerStatus::Created) {
                if let Some(idle) = self.stuck_for(ctx, &sandbox, &task, &container).await {
                    tracing::warn!(container = %container, idle_secs = idle.as_secs(), "workflow agent is stuck; stopping it");
                    if let Err(e) = sandbox.kill(&container).await {
                        tracing::warn!(container = %container, error = %e, "cannot kill a stuck container");
                        continue;
                    }
                    status = sandbox
                        .wait(&container)
                        .await
                        .unwrap_or(ContainerStatus::Gone);
                    stuck = true;
                }
            }
            if matches!(status, ContainerStatus::Exited { .. }) {
                // `wait` on an exited container answers at once and looks again for a late OOM flag.
                status = sandbox.wait(&container).await.unwrap_or(status);
            }
            if matches!(status, ContainerStatus::Running | ContainerStatus::Created) {
                let limit = run_limit(&self.services);
                let elapsed = (Utc::now() - span.timestamp).to_std().unwrap_or_default();
                if elapsed < limit {
                    continue;
                }
                tracing::warn!(container = %container, ?limit, "workflow sandbox exceeded its limit; killing it");
                if let Err(e) = sandbox.kill(&container).await {
                    tracing::warn!(container = %container, error = %e, "cannot kill an overdue container");
                    continue;
                }
                status = sandbox
                    .wait(&container)
                    .await
                    .unwrap_or(ContainerStatus::Gone);
                timed_out = true;
            }
            self.stuck.forget(task.action_id);
            let (finished, logs_saved) = self
                .collect(
                    ctx,
                    sandbox.as_ref(),
                    &task,
                    &span,
                    status,
                    timed_out,
                    stuck,
                )
                .await;
            if logs_saved {
                let collected = Collected {
                    span_id: span.id,
                    container: container.clone(),
                };
                let mut list = self
                    .collected
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
                if !list.contains(&collected) {
                    list.push(collected);
                }
            }
            done.push(Completion {
                action_id: task.action_id,
                finished,
            });
        }
        Ok(done)
    }

    async fn stop_detached(&self, ctx: &StepContext, trace_id: Uuid) -> usize {
        let Some(sandbox) = self.services.sandbox.clone() else {
            return 0;
        };
        let Ok(state) = blocking(ctx.store.clone(), AutopilotStore::read_state).await else {
            return 0;
        };
        let mut stopped = 0;
        for task in tasks::all_tasks(&state) {
            let running = state
                .pending_for(task.action_id)
                .is_some_and(|p| p.running_span_id == Some(task.workflow_span_id));
            if task.trace_id != trace_id || !running {
                continue;
            }
            if let Some(container) = &task.container {
                match sandbox.kill(container).await {
                    Ok(()) => stopped += 1,
                    Err(e) => {
                        tracing::warn!(container = %container, error = %e, "cannot stop a workflow container for a budget");
                    }
                }
            }
        }
        stopped
    }

    async fn still_running(&self, ctx: &StepContext, pending: &PendingAction, span: &Span) -> bool {
        let Some(sandbox) = self.services.sandbox.clone() else {
            return false;
        };
        let Ok(Some(task)) = tasks::load_task(&ctx.store, pending.action_id).await else {
            return false;
        };
        let Some(container) = task.container else {
            return false;
        };
        if task.workflow_span_id != span.id {
            return false;
        }
        // An exited container still holds the work: `monitor` collects it, never a second run.
        // A container created but never started (a kill between create and start) holds
        // nothing: the run starts over, and `start` replaces it.
        matches!(
            sandbox.status(&container).await,
            Ok(ContainerStatus::Running | ContainerStatus::Exited { .. })
        )
    }
}

/// What `sweep_orphans` found and did.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct OrphanReport {
    /// Containers of this project that no task mapping names (removed).
    pub containers: Vec<String>,
    /// Containers whose run's result is already recorded (a finished span) but that were left
    /// behind (by a crash after recording, or by an older version): removed.
    pub collected: Vec<String>,
    /// Worktrees under the worktrees dir that no task mapping names (removed).
    pub worktrees: Vec<PathBuf>,
    /// What could not be removed, and why.
    pub errors: Vec<String>,
}

/// At daemon start: containers labelled with the project and worktrees under the worktrees dir
/// that no task mapping names are reported (logged) and removed; so are mapped containers whose
/// run already ended with a recorded span (their logs are in its artifacts).
pub async fn sweep_orphans(services: &Services, store: &AutopilotStore) -> OrphanReport {
    let mut report = OrphanReport::default();
    let state = match blocking(store.clone(), AutopilotStore::read_state).await {
        Ok(s) => s,
        Err(e) => {
            report
                .errors
                .push(format!("cannot read the task mappings, nothing swept: {e}"));
            return report;
        }
    };
    let known = tasks::all_tasks(&state);
    if let Some(sandbox) = &services.sandbox {
        let labels = [(LABEL_PROJECT.to_owned(), services.project_id.clone())];
        match sandbox.list_by_labels(&labels).await {
            Ok(found) => {
                for c in found {
                    let action = c.labels.get(LABEL_ACTION).cloned().unwrap_or_default();
                    if let Some(task) = known.iter().find(|t| t.action_id.to_string() == action) {
                        if collected_already(store, &state, task).await {
                            let name = c.name.clone().unwrap_or_else(|| c.id.clone());
                            tracing::info!(container = %name, action = %action, "removing a workflow container whose result is recorded");
                            match sandbox.remove(&c.id).await {
                                Ok(_) => report.collected.push(name),
                                Err(e) => report.errors.push(format!("container {name}: {e}")),
                            }
                        }
                        continue;
                    }
                    let name = c.name.clone().unwrap_or_else(|| c.id.clone());
                    tracing::warn!(container = %name, action = %action, "removing an orphan sandbox container");
                    match sandbox.remove(&c.id).await {
                        Ok(_) => report.containers.push(name),
                        Err(e) => report.errors.push(format!("container {name}: {e}")),
                    }
                }
            }
            Err(e) => report.errors.push(format!("cannot list containers: {e}")),
        }
    }
    let dir = Services::worktrees_dir(store);
    let named: Vec<PathBuf> = known.iter().filter_map(|t| t.worktree.clone()).collect();
    let is_named = |p: &Path| named.iter().any(|n| n == p);
    let mut candidates: Vec<PathBuf> = Vec::new();
    if let Ok(entries) = std::fs::read_dir(&dir) {
        candidates.extend(entries.flatten().map(|e| e.path()));
    }
    let ws = match tasks::workspace(services).await {
        Ok(ws) => ws,
        Err(e) => {
            report
                .errors
                .push(format!("cannot open the repository: {e}"));
            return report;
        }
    };
    if let Ok(listed) = ws.list_worktrees().await {
        candidates.extend(
            listed
                .into_iter()
                .map(|w| w.path)
                .filter(|p| p.starts_with(&dir)),
        );
    }
    candidates.sort();
    candidates.dedup();
    for path in candidates.into_iter().filter(|p| !is_named(p)) {
        tracing::warn!(path = %path.display(), "removing an orphan worktree");
        match ws.remove_worktree(&path).await {
            Ok(_) => report.worktrees.push(path),
            Err(e) => report
                .errors
                .push(format!("worktree {}: {e}", path.display())),
        }
    }
    report
}

/// Whether the workflow run of `task` has a recorded end (its span is final and it is not
/// running detached), so its container holds nothing rover still needs. Gate containers carry
/// the same action label and are covered too.
async fn collected_already(
    store: &AutopilotStore,
    state: &crate::store::State,
    task: &TaskRecord,
) -> bool {
    let running = state
        .pending_for(task.action_id)
        .is_some_and(|p| p.running_span_id.is_some());
    if running {
        return false;
    }
    let span_id = task.workflow_span_id;
    blocking(store.clone(), move |s| s.read_span(span_id))
        .await
        .is_ok_and(|span| span.status.is_final())
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
    use super::*;
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
            github_token: token.map(str::to_owned),
            git_env: Vec::new(),
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

    fn pairs(list: &[(&str, &str)]) -> Vec<(String, String)> {
        list.iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn a_codex_sandbox_gets_openai_api_key_as_codex_api_key_when_allowed() {
        let allow = ["OPENAI_API_KEY", "CODEX_API_KEY"];
        let codex = WorkflowStep::new(services_for(AgentKind::Codex, &allow, None))
            .with_sandbox_env("OPENAI_API_KEY", "sk-o")
            .with_sandbox_env("CODEX_API_KEY", "");
        let env = codex.sandbox_env();
        assert_eq!(
            agents::env_value(&env, "CODEX_API_KEY"),
            Some("sk-o"),
            "{env:?}"
        );
        assert_eq!(env.iter().filter(|(n, _)| n == "CODEX_API_KEY").count(), 1);
        // Not for claude, and not past the allow-list.
        let claude = WorkflowStep::new(services_for(AgentKind::Claude, &allow, None))
            .with_sandbox_env("OPENAI_API_KEY", "sk-o")
            .with_sandbox_env("CODEX_API_KEY", "");
        assert_eq!(
            agents::env_value(&claude.sandbox_env(), "CODEX_API_KEY"),
            None
        );
        let narrow = WorkflowStep::new(services_for(AgentKind::Codex, &["OPENAI_API_KEY"], None))
            .with_sandbox_env("OPENAI_API_KEY", "sk-o");
        let names: Vec<String> = narrow.sandbox_env().into_iter().map(|(n, _)| n).collect();
        assert_eq!(names, ["OPENAI_API_KEY"]);
    }

    #[test]
    fn a_codex_sandbox_gets_the_base_url_as_a_config_override() {
        let mut request = AgentRequest::new("/workspace", "do it");
        request.tools = agents::ToolPolicy::FullEdit;
        let env = pairs(&[("OPENAI_BASE_URL", "http://models.internal:8080/v1")]);
        let argv = agent_argv(AgentKind::Codex, &request, &env);
        assert_eq!(
            argv[..4],
            [
                "codex",
                "exec",
                "-c",
                "openai_base_url=\"http://models.internal:8080/v1\""
            ]
        );
        assert_eq!(
            agent_argv(AgentKind::Codex, &request, &[]),
            agents::sandbox_argv(AgentKind::Codex, &request)
        );
        assert!(!agent_argv(AgentKind::Claude, &request, &env)
            .iter()
            .any(|a| a.contains("openai_base_url")));
    }
}
