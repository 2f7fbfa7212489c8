//! Launching a run: dependencies, the task's branch and worktree, the mapping, the agent's
//! prompt and container (started once, adopted after a crash), then detach.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use uuid::Uuid;

use super::{WorkflowSpanMeta, WorkflowStep};
use crate::agent_run::{AgentRunError, RunPlan};
use crate::agents::{self, AgentStep, PromptVars, WorkflowResult};
use crate::git::{self, BranchBase};
use crate::orchestrator::{Finished, Outcome, StepContext, StepError};
use crate::sandbox::{SandboxLabels, SandboxSpec};
use crate::steps::history::{dependency_state, Dependency};
use crate::steps::meta::{self, OutcomeSpanMeta, TaskStatus, WorkflowMeta};
use crate::steps::meta::{
    FetchMeta, FetchResult, LaunchedMeta, MergedInMeta, PullUnderReviewMeta, StartedMeta,
};
use crate::steps::tasks::{self, git_error, store_error, Task};
use crate::steps::Services;
use crate::store::blocking;
use crate::store::{StepRun, TaskMapping, TraceView};

/// Longest pull request diff handed to the workflow agent.
pub(super) const MAX_REVIEW_DIFF: usize = 48 * 1024;

/// Where a new task forks from, and what was fetched for it.
pub(super) struct FreshBase {
    base: BranchBase,
    fetch: FetchMeta,
    review: Option<PullUnderReview>,
}

impl FreshBase {
    fn unfetched(why: &str) -> FreshBase {
        FreshBase {
            base: BranchBase::DefaultBranch,
            fetch: FetchMeta::Unfetched(FetchResult {
                refspec: None,
                fetched: false,
                error: Some(why.to_owned()),
            }),
            review: None,
        }
    }
}

/// The pull request a task works on: its head (checked out in the worktree) and its change.
pub(super) struct PullUnderReview {
    number: u64,
    head: String,
    base: String,
    diff: Option<String>,
}

impl PullUnderReview {
    /// What the workflow agent is told about the pull request: its branch names and its change
    /// come from whoever opened it, in untrusted blocks.
    fn prompt(&self) -> String {
        let mut text = format!(
            "\n\n## The pull request under review: #{}\nThe worktree has its head checked out. Its branches:\n{}\nIts change against the base branch:\n",
            self.number,
            agents::untrusted_block(
                &format!("pull request #{}", self.number),
                &format!("head: {}\nbase: {}", self.head, self.base)
            )
        );
        match &self.diff {
            Some(diff) if !diff.trim().is_empty() => {
                text.push_str(&agents::untrusted_block(
                    &format!("pull request #{}", self.number),
                    diff,
                ));
            }
            _ => text.push_str(
                "(not available here; diff the head against the base branch named above with `git diff`)",
            ),
        }
        text
    }
}

impl WorkflowStep {
    /// What a new task forks from, after fetching what it needs: the default branch, the
    /// pushed commit of a push to it, or the head of the pull request the event is about (the
    /// task then reviews or builds on that pull request; rover pushes only its own branch). A
    /// failed fetch is recorded and the checkout's copy used.
    pub(super) async fn fresh_base(&self, ws: &git::Workspace, view: &TraceView) -> FreshBase {
        let event = crate::steps::agent_call::event_meta(view)
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
        let token = self.services.git_token().await.unwrap_or_else(|e| {
            tracing::warn!(error = %e, "no GitHub token for the fetch; fetching without one");
            None
        });
        let mut fetched = Vec::new();
        for refspec in &refspecs {
            let result = ws
                .fetch(std::slice::from_ref(refspec), token.as_deref())
                .await;
            if let Err(e) = &result {
                tracing::warn!(refspec, error = %e, "cannot fetch before forking; using the checkout's copy");
            }
            fetched.push(FetchResult {
                refspec: Some(refspec.clone()),
                fetched: result.is_ok(),
                error: result.err().map(|e| e.to_string()),
            });
        }
        let fetch = FetchMeta::Refspecs(fetched);
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
    pub(super) async fn placement(
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
                    task.mapping.branch_name,
                    BranchBase::Existing,
                    task.mapping.worktree_path.unwrap_or(fresh_path),
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

    pub(super) fn prompt_vars(
        meta: &WorkflowMeta,
        dependencies: &[(String, String, String)],
    ) -> PromptVars {
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
                "This task builds on the work of the tasks below, already committed on this branch (as their agents reported it):\n",
            );
            let mut reports = String::new();
            for (title, branch, summary) in dependencies {
                let _ = writeln!(reports, "- {title} (branch {branch}): {summary}");
            }
            instructions.push_str(&agents::untrusted_block(
                "the earlier tasks' reports",
                &reports,
            ));
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
                            .with_meta_record(&WorkflowSpanMeta {
                                outcome: OutcomeSpanMeta {
                                    dependency_failed: Some(*dep),
                                    ..OutcomeSpanMeta::default()
                                },
                                reason: Some(reason),
                                ..WorkflowSpanMeta::default()
                            })
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
        let ws = tasks::workspace(&self.services)
            .await
            .map_err(|e| git_error("cannot open the repository", &e))?;
        // The image comes first: a definition that does not build ends the task before any
        // worktree or agent.
        let environment = match self
            .environment(ctx, run.span.id, action_id, &ws, sandbox.as_ref())
            .await?
        {
            Ok(environment) => environment,
            Err(failed) => return Ok(failed),
        };
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
        let mut task = Task {
            action_id,
            mapping: TaskMapping {
                worktree_path: Some(prepared.path.clone()),
                fork_point: Some(prepared.fork_point.clone()),
                title: Some(meta.title.clone()),
                ..TaskMapping::new(
                    &action_id.to_string(),
                    &prepared.branch,
                    trace_id,
                    run.span.id,
                )
            },
        };

        // More than one dependency: the branch forked from the first; merge the others in
        // (a no-op when already merged, e.g. on a rerun).
        let others: Vec<String> = dependencies.iter().skip(1).map(|d| d.1.clone()).collect();
        if !others.is_empty() && meta.iterate_on.is_none() {
            if let Err(e) = ws.merge_branches(&prepared.path, &others).await {
                let error = git_error("cannot combine the dependencies' branches", &e);
                return Self::not_started(ctx, &task, &prepared.path, error).await;
            }
        }

        // The resolver's answer to a consolidation conflict: the other side merged in, the
        // conflicts left in the files for the agent (the commit step then records the merge).
        let mut merged_in: Option<(String, Vec<String>)> = None;
        if let Some(from) = &meta.merge_from {
            match ws.merge_leaving_conflicts(&prepared.path, from).await {
                Ok(conflicts) => merged_in = Some((from.clone(), conflicts)),
                Err(e) => {
                    let error = git_error(&format!("cannot merge `{from}` into the task"), &e);
                    return Self::not_started(ctx, &task, &prepared.path, error).await;
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
        let custom = crate::steps::agent_call::custom_instructions(&self.services).await;
        let mut request = agents::step_request(
            &agent_settings,
            AgentStep::Workflow,
            &workdir,
            &vars,
            attribution,
            &custom,
        )
        .map_err(|e| StepError::from_error(&e, false))?;
        crate::steps::agent_call::hide_held_secrets(&self.services.redactor, &mut request);
        request.schema = Some(agents::schema_for::<WorkflowResult>());

        // The container gets a scratch git of its own; the worktree's `.git` must still be
        // rover's (an iteration reuses the worktree of an earlier run).
        let mut spec = self.base_spec(Vec::new(), &prepared.path, self.labels(trace_id, action_id));
        spec.image.clone_from(&environment.image);
        let scratch = ctx.store.artifacts_dir(run.span.id).join("git");
        let sandbox_git = async {
            ws.verify_worktree(&prepared.path).await?;
            ws.sandbox_git(
                &prepared.path,
                &scratch,
                &Services::sandbox_objects_dir(&ctx.store),
            )
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
        let container = spec.container_name();
        let image = spec.image.clone();

        // The run: the agent's argv and, unless the egress is `none`, its grant and its own
        // network with rover's proxy as the only way out (a container that runs already, a
        // restart, keeps its grant).
        let runs = self.agent_runs(&ctx.store, sandbox.clone());
        let agent_run = runs
            .prepare(RunPlan {
                kind,
                request,
                spec,
                trace_id,
                budget: self.wire_budget(ctx, trace_id).await,
            })
            .await
            .map_err(|e| run_error(e, &image))?;

        // The mapping first: a crash after this point finds the container by it.
        task.mapping.container_id = Some(container.clone());
        tasks::save_task(&ctx.store, &task)
            .await
            .map_err(|e| store_error("cannot record the task mapping", &e))?;

        let started = runs
            .start(&agent_run)
            .await
            .map_err(|e| run_error(e, &image))?;
        let started = StartedMeta {
            container_id: started.container_id,
            adopted: started.adopted,
            replaced_unstarted: started.replaced_unstarted,
        };
        // Its log is followed from the start: a container that floods it is stopped at once.
        self.follow_log(ctx, &sandbox, &task, &container);
        let detached = WorkflowSpanMeta {
            task_id: Some(task.mapping.task_id.clone()),
            branch_name: Some(task.mapping.branch_name.clone()),
            worktree_path: Some(prepared.path.clone()),
            container_id: Some(container.clone()),
            launched: Some(LaunchedMeta {
                fork_point: prepared.fork_point.clone(),
                base_sha: prepared.fork_point.clone(),
                fetch: fresh.as_ref().map(|f| f.fetch.clone()),
                pull_request: fresh.as_ref().and_then(|f| f.review.as_ref()).map(|r| {
                    PullUnderReviewMeta {
                        number: r.number,
                        head: r.head.clone(),
                        base: r.base.clone(),
                    }
                }),
                merged_in: merged_in.map(|(branch, conflicts)| MergedInMeta { branch, conflicts }),
                image,
                started,
                env: agent_run.env_names,
                egress: Some(agent_run.egress),
                network: Some(agent_run.spec.network),
            }),
            environment: Some(environment),
            ..WorkflowSpanMeta::default()
        }
        .to_meta();
        Ok(Outcome::Detached { meta: detached })
    }

    /// A task whose worktree is ready but whose branches could not be merged: its mapping is
    /// kept (cleanup finds the worktree), the span fails and the commit step records the task
    /// as failed.
    async fn not_started(
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

/// A run that could not be prepared or started, as the step's error: the sandbox's own error
/// (its message and retryability as the engine gave them) with the container and image.
fn run_error(e: AgentRunError, image: &str) -> StepError {
    match e {
        AgentRunError::Sandbox { container, source } => {
            StepError::from_error(&source, source.is_retryable())
                .detail("container", container)
                .detail("image", image)
        }
        AgentRunError::Grant { proxy_dir, source } => StepError::from_error(&source, false)
            .detail("proxyDir", proxy_dir.display().to_string()),
        AgentRunError::Stopped(_) => StepError::fatal(e.to_string()),
    }
}
