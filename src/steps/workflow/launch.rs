//! Launching a run: dependencies, the task's branch and worktree (see [`super::fork`]), the
//! mapping, the agent's request and container, handed to the agent run service (started once,
//! adopted after a crash), then detach.

use std::path::Path;

use super::fork::{Deps, ForkedTask};
use super::{WorkflowSpanMeta, WorkflowStep, AGENT_LOG};
use crate::agent_run::RunPlan;
use crate::agents::{self, AgentStep, WorkflowResult};
use crate::environment::EnvironmentMeta;
use crate::git;
use crate::orchestrator::{Finished, Outcome, StepContext, StepError};
use crate::sandbox::{SandboxLabels, SandboxSpec};
use crate::steps::meta::{self, TaskStatus, WorkflowMeta};
use crate::steps::meta::{LaunchedMeta, MergedInMeta, PullUnderReviewMeta, StartedMeta};
use crate::steps::tasks::{self, git_error, store_error, Task};
use crate::steps::Services;
use crate::store::StepRun;

impl WorkflowStep {
    /// The spec of the agent container (also the base of the gate containers).
    pub(super) fn base_spec(
        &self,
        cmd: Vec<String>,
        worktree: &Path,
        labels: SandboxLabels,
    ) -> SandboxSpec {
        let mut spec = SandboxSpec::from_settings(
            &self.services.config.autopilot.sandbox,
            cmd,
            worktree,
            labels,
        );
        spec.env = self.sandbox_env();
        if let Some(store) = &self.services.store_root {
            spec.owned_by(store);
        }
        spec
    }

    pub(super) async fn launch(
        &self,
        ctx: &StepContext,
        run: &StepRun,
    ) -> Result<Outcome, StepError> {
        let meta: WorkflowMeta = meta::read(&run.action)
            .map_err(|e| StepError::fatal(format!("the workflow action's meta is invalid: {e}")))?;
        // Dependencies: a failed one fails this task (and still hands over to commit).
        let deps = match self.dependencies(ctx, run, &meta).await? {
            Ok(deps) => deps,
            Err(failed) => return Ok(failed),
        };
        let sandbox = self.sandbox()?;
        let ws = tasks::workspace(&self.services)
            .await
            .map_err(|e| git_error("cannot open the repository", &e))?;
        // A revert needs no agent, no image and no container: git takes the commit back.
        if let Some(sha) = &meta.revert {
            return self.revert(ctx, run, &meta, &deps, &ws, sha).await;
        }
        // The image comes first: a definition that does not build ends the task before any
        // worktree or agent.
        let environment = match self
            .environment(ctx, run.span.id, run.action.id, &ws, sandbox.as_ref())
            .await?
        {
            Ok(environment) => environment,
            Err(failed) => return Ok(failed),
        };
        let mut forked = self.fork(ctx, run, &meta, &deps, &ws).await?;
        let merged_in = match self.merge_in(&meta, &deps, &forked, &ws).await {
            Ok(merged_in) => merged_in,
            Err(error) => {
                return Self::not_started(ctx, &forked.task, &forked.prepared.path, error).await
            }
        };
        let (request, lessons) = self.workflow_request(ctx, &meta, &deps, &forked).await?;
        let spec = self
            .agent_spec(ctx, run, &ws, &forked, &environment.image)
            .await?;
        let launched = self
            .start_run(ctx, sandbox, &mut forked.task, request, spec)
            .await?;
        Ok(Outcome::Detached {
            meta: detached_meta(&forked, merged_in, launched, environment, lessons),
        })
    }

    /// The agent container's spec: the environment's image, and a scratch git of its own; the
    /// worktree's `.git` must still be rover's (an iteration reuses the worktree of an
    /// earlier run).
    async fn agent_spec(
        &self,
        ctx: &StepContext,
        run: &StepRun,
        ws: &git::Workspace,
        forked: &ForkedTask,
        image: &str,
    ) -> Result<SandboxSpec, StepError> {
        let path = &forked.prepared.path;
        let labels = self.labels(run.pending.trace_id, run.action.id);
        let mut spec = self.base_spec(Vec::new(), path, labels);
        image.clone_into(&mut spec.image);
        let scratch = ctx.store.artifacts_dir(run.span.id).join("git");
        let sandbox_git = async {
            ws.verify_worktree(path).await?;
            ws.sandbox_git(path, &scratch, &Services::sandbox_objects_dir(&ctx.store))
                .await
        }
        .await
        .map_err(|e| {
            if crate::steps::sandboxed::is_tampered(&e) {
                crate::steps::sandboxed::tampered("the task's worktree was tampered with", &e)
            } else {
                git_error("cannot prepare the sandbox's git", &e)
            }
        })?;
        spec.mount_git(&sandbox_git);
        Ok(spec)
    }

    /// The run through the agent run service: its argv and, unless the egress is `none`, its
    /// grant and its own network with rover's proxy as the only way out (a container that runs
    /// already, a restart, keeps its grant); the mapping recorded before the container starts
    /// (a crash after that finds the container by it); its log followed from the start (a
    /// container that floods it is stopped at once).
    async fn start_run(
        &self,
        ctx: &StepContext,
        sandbox: std::sync::Arc<dyn crate::sandbox::Sandbox>,
        task: &mut Task,
        request: agents::AgentRequest,
        spec: SandboxSpec,
    ) -> Result<Launched, StepError> {
        let trace_id = task.mapping.trace_id;
        let container = spec.container_name();
        let image = spec.image.clone();
        let runs = self.agent_runs(&ctx.store, sandbox.clone());
        let agent_run = runs
            .prepare(RunPlan {
                kind: self.services.agent_settings().agent,
                request,
                spec,
                trace_id,
                budget: crate::steps::run_authority::wire_budget(&self.services, ctx, trace_id)
                    .await,
            })
            .await
            .map_err(|e| crate::steps::run_authority::run_error(e, &image))?;
        task.mapping.container_id = Some(container.clone());
        tasks::save_task(&ctx.store, task)
            .await
            .map_err(|e| store_error("cannot record the task mapping", &e))?;
        let log = ctx
            .store
            .artifacts_dir(task.mapping.workflow_span_id)
            .join(AGENT_LOG);
        let started = runs
            .start_detached(
                &self.watch,
                &agent_run,
                (task.action_id, &log, self.log_limit()),
                Some(ctx.waker()),
            )
            .await
            .map_err(|e| crate::steps::run_authority::run_error(e, &image))?;
        Ok(Launched {
            container,
            image,
            started: StartedMeta {
                container_id: started.container_id,
                adopted: started.adopted,
                replaced_unstarted: started.replaced_unstarted,
            },
            env: agent_run.env_names,
            egress: agent_run.egress,
            network: agent_run.spec.network,
        })
    }

    /// The workflow agent's request: its prompt from the task, its dependencies' reports and
    /// the pull request under review; custom instructions come from the default branch, never
    /// from the worktree (an earlier run could have planted some there).
    /// The lessons of rover's memory relevant to the task go last, in an untrusted block
    /// (their ids are returned for the span).
    async fn workflow_request(
        &self,
        ctx: &StepContext,
        meta: &WorkflowMeta,
        deps: &Deps,
        forked: &ForkedTask,
    ) -> Result<(agents::AgentRequest, Vec<String>), StepError> {
        let mut vars = Self::prompt_vars(meta, &deps.done);
        let query = format!(
            "{}\n{}\n{}\n{}",
            meta.title,
            meta.description,
            meta.acceptance_criteria.join("\n"),
            meta.instructions.as_deref().unwrap_or_default()
        );
        let lessons = crate::steps::recall::lessons_for(&self.services, &ctx.store, query).await;
        if let Some(review) = forked.fresh.as_ref().and_then(|f| f.review.as_ref()) {
            let text = vars.entry("instructions".to_owned()).or_default();
            if text == "(none)" {
                text.clear();
            }
            text.push_str(&review.prompt());
        }
        if let Some(section) = crate::memory::render(&lessons) {
            let text = vars.entry("instructions".to_owned()).or_default();
            if text == "(none)" {
                text.clear();
            } else {
                text.push_str("\n\n");
            }
            text.push_str(&section);
        }
        let custom = crate::steps::agent_call::custom_instructions(&self.services).await;
        let mut request = agents::step_request(
            self.services.agent_settings(),
            AgentStep::Workflow,
            &forked.prepared.path,
            &vars,
            self.services.config.attribution,
            &custom,
        )
        .map_err(|e| StepError::from_error(&e, false))?;
        crate::steps::agent_call::hide_held_secrets(&self.services.redactor, &mut request);
        request.schema = Some(agents::schema_for::<WorkflowResult>());
        Ok((request, lessons.ids()))
    }

    /// A task whose worktree is ready but whose branches could not be merged: its mapping is
    /// kept (cleanup finds the worktree), the span fails and the commit step records the task
    /// as failed.
    pub(super) async fn not_started(
        ctx: &StepContext,
        task: &Task,
        worktree: &Path,
        error: StepError,
    ) -> Result<Outcome, StepError> {
        tasks::save_task(&ctx.store, task)
            .await
            .map_err(|e| store_error("cannot record the task mapping", &e))?;
        let summary = format!("not started: {}", error.message);
        Ok(Outcome::Finished(
            Finished::failed(summary.clone())
                .with_meta_record(&WorkflowSpanMeta {
                    branch_name: Some(task.mapping.branch_name.clone()),
                    worktree_path: Some(worktree.to_path_buf()),
                    error: Some(error.to_meta()),
                    ..WorkflowSpanMeta::default()
                })
                .then(Self::commit_action(
                    task.action_id,
                    TaskStatus::Failed,
                    &summary,
                )),
        ))
    }
}

/// What starting the run gave.
struct Launched {
    container: String,
    image: String,
    started: StartedMeta,
    env: Vec<String>,
    egress: String,
    network: String,
}

/// The workflow span's meta of a run that started and detached.
fn detached_meta(
    forked: &ForkedTask,
    merged_in: Option<(String, Vec<String>)>,
    launched: Launched,
    environment: EnvironmentMeta,
    lessons: Vec<String>,
) -> crate::store::Meta {
    let fresh = forked.fresh.as_ref();
    let mut meta = WorkflowSpanMeta {
        task_id: Some(forked.task.mapping.task_id.clone()),
        branch_name: Some(forked.task.mapping.branch_name.clone()),
        worktree_path: Some(forked.prepared.path.clone()),
        container_id: Some(launched.container),
        launched: Some(LaunchedMeta {
            fork_point: forked.prepared.fork_point.clone(),
            base_sha: forked.prepared.fork_point.clone(),
            fetch: fresh.map(|f| f.fetch.clone()),
            pull_request: fresh
                .and_then(|f| f.review.as_ref())
                .map(|r| PullUnderReviewMeta {
                    number: r.number,
                    head: r.head.clone(),
                    base: r.base.clone(),
                }),
            merged_in: merged_in.map(|(branch, conflicts)| MergedInMeta { branch, conflicts }),
            image: launched.image,
            started: launched.started,
            env: launched.env,
            egress: Some(launched.egress),
            network: Some(launched.network),
        }),
        environment: Some(environment),
        ..WorkflowSpanMeta::default()
    }
    .to_meta();
    meta.extend(crate::store::to_meta(
        &crate::steps::meta::LessonsSpanMeta { lessons },
    ));
    meta
}
