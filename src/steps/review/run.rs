//! One task read by the reviewer: its prompt (the task, its criteria, the diff), its container
//! over the task's worktree (read-only, the trace's image, the agent run service's grant and
//! network), the run waited for, its answer parsed.

use std::time::Duration;

use super::{ReviewStep, ReviewTask};
use crate::agent_run::RunPlan;
use crate::agents::{self, AgentStep, PromptVars, ReviewResult};
use crate::orchestrator::{StepContext, StepError};
use crate::sandbox::ContainerStatus;
use crate::steps::meta::TaskReview;
use crate::steps::{agent_call, run_authority, sandboxed, tasks};
use crate::store::{AgentMeta, StepRun};

/// Longest diff the reviewer's prompt quotes (the rest it may read in the worktree).
pub const MAX_DIFF_BYTES: usize = 48 * 1024;

/// The reviewer's stdout inside the span's artifacts dir (stderr next to it, `.stderr`).
const REVIEW_LOG: &str = "review";

/// How much of the end of the reviewer's stderr an error quotes.
const STDERR_TAIL: u64 = 4 * 1024;

/// What reading one task gave: the review, or why there is none; and the call's figures.
pub(super) struct Read {
    pub result: Result<TaskReview, StepError>,
    pub agent: Option<AgentMeta>,
}

impl ReviewStep {
    /// Reads `task` (the `index`th of the span) in a container of its own.
    pub(super) async fn read(
        &self,
        ctx: &StepContext,
        run: &StepRun,
        task: &ReviewTask,
        index: usize,
    ) -> Read {
        let mut agent = None;
        let result = self.read_inner(ctx, run, task, index, &mut agent).await;
        Read { result, agent }
    }

    async fn read_inner(
        &self,
        ctx: &StepContext,
        run: &StepRun,
        task: &ReviewTask,
        index: usize,
        agent: &mut Option<AgentMeta>,
    ) -> Result<TaskReview, StepError> {
        let services = &self.services;
        let sandbox = sandboxed::sandbox(services)?;
        let request = self.request(task).await?;
        let trace_id = run.pending.trace_id;
        let mut spec = sandboxed::bare_spec(
            services,
            Vec::new(),
            &task.worktree,
            sandboxed::labels(services, trace_id, run.action.id),
        );
        spec.image = sandboxed::trace_image(ctx, services, trace_id).await;
        spec.env = run_authority::sandbox_env(services, &[]);
        spec.workspace_read_only = true;
        spec.take_back = false;
        spec.name = Some(format!("rover-{}-review-{index}", run.action.id));
        let image = spec.image.clone();
        sandbox
            .ensure_image(&image)
            .await
            .map_err(|e| StepError::from_error(&e, e.is_retryable()).detail("image", &image))?;
        let kind = services.agent_settings().agent;
        let runs = run_authority::agent_runs(services, &ctx.store, sandbox);
        let prepared = runs
            .prepare(RunPlan {
                kind,
                request,
                spec,
                trace_id,
                budget: run_authority::wire_budget(services, ctx, trace_id).await,
            })
            .await
            .map_err(|e| run_authority::run_error(e, &image))?;
        let container = prepared.spec.container_name();
        let log = ctx
            .store
            .artifacts_dir(run.span.id)
            .join(format!("{REVIEW_LOG}-{index}.log"));
        let store = ctx.store.clone();
        let ran = runs
            .run_to_end(&prepared, &log, self.limit(), move |trace| {
                run_authority::recorded_spend(&store, trace)
            })
            .await
            .map_err(|e| run_authority::run_error(e, &image))?;
        let parsed = run_authority::parse_log(kind, &log).await;
        *agent = run_authority::wire_usage(
            parsed.as_ref().ok().map(agent_call::response_usage),
            ran.wire.as_ref(),
        );
        let stderr =
            crate::sandbox::logcap::read_tail(&crate::sandbox::stderr_path(&log), STDERR_TAIL)
                .await;
        let failed = |message: String| {
            StepError::fatal(message)
                .detail("container", &container)
                .detail("image", &image)
                .detail("log", log.display().to_string())
                .detail("stderrTail", String::from_utf8_lossy(&stderr).into_owned())
        };
        if let Some(stop) = ran.wire.as_ref().and_then(|w| w.stopped.as_ref()) {
            return Err(failed(format!(
                "rover's proxy stopped the reviewer at a budget limit: {stop:?}"
            )));
        }
        if ran.finished.timed_out {
            return Err(failed(format!(
                "the reviewer ran past its limit of {}s and was stopped",
                self.limit().as_secs()
            )));
        }
        if let Some(summary) = ran.logs.over_limit_summary("the reviewer", &log) {
            return Err(failed(format!("{summary}; it was stopped")));
        }
        let response = parsed.map_err(|e| {
            failed(match ran.finished.status {
                ContainerStatus::Exited { code, .. } if code != 0 => {
                    format!("the reviewer's container exited with code {code}: {e}")
                }
                _ => format!("the reviewer's output cannot be read: {e}"),
            })
        })?;
        let answer = agents::extract::<ReviewResult>(&response)
            .map_err(|e| failed(format!("the reviewer's answer is not a verdict: {e}")))?;
        Ok(TaskReview {
            workflow_action_id: task.workflow_action_id,
            title: task.meta.title.clone(),
            branch: task.branch.clone(),
            head: task.head.clone(),
            criteria: task.meta.acceptance_criteria.clone(),
            verdict: answer.verdict,
            summary: answer.summary,
            findings: answer.findings,
            container: Some(container),
            agent: agent.clone(),
            carried: false,
        })
    }

    /// The reviewer's request: the task, its criteria and its diff against the fork point;
    /// the repository's custom instructions from the default branch, as every step's.
    async fn request(&self, task: &ReviewTask) -> Result<agents::AgentRequest, StepError> {
        let services = &self.services;
        let ws = tasks::workspace(services)
            .await
            .map_err(|e| tasks::git_error("cannot open the repository", &e))?;
        let diff = ws
            .diff_patch(&task.worktree, &task.fork_point, MAX_DIFF_BYTES)
            .await
            .map_err(|e| tasks::git_error("cannot read the task's change", &e))?;
        let mut vars = PromptVars::new();
        vars.insert("title".into(), task.meta.title.clone());
        vars.insert("description".into(), task.meta.description.clone());
        vars.insert(
            "acceptance_criteria".into(),
            if task.meta.acceptance_criteria.is_empty() {
                "(none given: judge the change against its title and description)".to_owned()
            } else {
                task.meta
                    .acceptance_criteria
                    .iter()
                    .map(|c| format!("- {c}"))
                    .collect::<Vec<_>>()
                    .join("\n")
            },
        );
        vars.insert(
            "diff".into(),
            agents::untrusted_block("the task's change", &diff),
        );
        let custom = agent_call::custom_instructions(services).await;
        let mut request = agents::step_request(
            services.agent_settings(),
            AgentStep::Review,
            &task.worktree,
            &vars,
            services.config.attribution,
            &custom,
        )
        .map_err(|e| StepError::from_error(&e, false))?;
        agent_call::hide_held_secrets(&services.redactor, &mut request);
        request.schema = Some(agents::schema_for::<ReviewResult>());
        Ok(request)
    }

    /// How long the reviewer may run: the host-side steps' limit, within the sandbox's.
    fn limit(&self) -> Duration {
        let agent = Duration::from_secs(self.services.agent_settings().timeout_secs);
        self.services.config.autopilot.sandbox.timeout().min(agent)
    }
}
