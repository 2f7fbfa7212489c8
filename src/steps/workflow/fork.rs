//! Where a task forks from and what it starts with: its dependencies (a failed one fails it),
//! its branch and worktree (fetched first when new: the default branch, a pushed commit, or
//! the head of the pull request under review), the branches merged in, the prompt's values.

use std::fmt::Write as _;
use std::path::PathBuf;

use uuid::Uuid;

use super::{WorkflowSpanMeta, WorkflowStep};
use crate::agents::{self, PromptVars};
use crate::git::{self, BranchBase};
use crate::orchestrator::{Finished, Outcome, StepContext, StepError};
use crate::steps::history::{dependency_state, Dependency};
use crate::steps::meta::{FetchMeta, FetchResult, OutcomeSpanMeta, TaskStatus, WorkflowMeta};
use crate::steps::tasks::{self, git_error, store_error, Task};
use crate::steps::Services;
use crate::store::blocking;
use crate::store::{StepRun, TaskMapping, TraceView};

/// Longest pull request diff handed to the workflow agent.
pub(super) const MAX_REVIEW_DIFF: usize = 48 * 1024;

/// Where a new task forks from, and what was fetched for it.
pub(super) struct FreshBase {
    pub base: BranchBase,
    pub fetch: FetchMeta,
    pub review: Option<PullUnderReview>,
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
    pub number: u64,
    pub head: String,
    pub base: String,
    diff: Option<String>,
}

impl PullUnderReview {
    /// What the workflow agent is told about the pull request: its branch names and its change
    /// come from whoever opened it, in untrusted blocks.
    pub(super) fn prompt(&self) -> String {
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

/// The task's dependencies, all done: the first one's branch (the task forks from it), and
/// each one's title, branch and report; the trace as it stood.
pub(super) struct Deps {
    pub view: TraceView,
    pub first_branch: Option<String>,
    pub done: Vec<(String, String, String)>,
}

/// A task forked: its mapping (not yet recorded), its worktree, and what was fetched for it.
pub(super) struct ForkedTask {
    pub task: Task,
    pub prepared: git::PreparedWorktree,
    pub fresh: Option<FreshBase>,
}

impl WorkflowStep {
    /// Where the task's dependencies stand: all done (`Ok(Ok)`), one failed (`Ok(Err)`: the
    /// task fails without starting and hands over to commit), or one not done yet (a
    /// retryable error: the run waits).
    pub(super) async fn dependencies(
        &self,
        ctx: &StepContext,
        run: &StepRun,
        meta: &WorkflowMeta,
    ) -> Result<Result<Deps, Outcome>, StepError> {
        let trace_id = run.pending.trace_id;
        let (view, state) = blocking(ctx.store.clone(), move |s| {
            Ok((s.load_trace(trace_id)?, s.read_state()?))
        })
        .await
        .map_err(|e| store_error("cannot read the trace", &e))?;
        let mut first_branch = None;
        let mut done = Vec::new();
        for dep in &meta.depends_on {
            match dependency_state(&view, &state, *dep) {
                Dependency::Waiting(reason) | Dependency::Blocked(reason) => {
                    return Err(StepError::retryable(format!(
                        "a dependency is not done yet: {reason}"
                    )))
                }
                Dependency::Failed(reason) => {
                    let summary = format!("not started: {reason}");
                    return Ok(Err(Outcome::Finished(
                        Finished::failed(summary.clone())
                            .with_meta_record(&WorkflowSpanMeta {
                                outcome: OutcomeSpanMeta {
                                    dependency_failed: Some(*dep),
                                    ..OutcomeSpanMeta::default()
                                },
                                reason: Some(reason),
                                ..WorkflowSpanMeta::default()
                            })
                            .then(Self::commit_action(
                                run.action.id,
                                TaskStatus::Failed,
                                &summary,
                            )),
                    )));
                }
                Dependency::Done {
                    branch,
                    title,
                    summary,
                } => {
                    first_branch.get_or_insert_with(|| branch.clone());
                    done.push((title, branch, summary));
                }
            }
        }
        Ok(Ok(Deps {
            view,
            first_branch,
            done,
        }))
    }

    /// The task's branch and worktree. New work forks from current code: fetched first, from
    /// the pushed commit of a push event or the head of the pull request the event is about.
    pub(super) async fn fork(
        &self,
        ctx: &StepContext,
        run: &StepRun,
        meta: &WorkflowMeta,
        deps: &Deps,
        ws: &git::Workspace,
    ) -> Result<ForkedTask, StepError> {
        let action_id = run.action.id;
        let (branch, base, path) = self
            .placement(ctx, action_id, meta, deps.first_branch.clone(), ws)
            .await?;
        let fresh = if base == BranchBase::DefaultBranch
            && !ws
                .branch_exists(&branch)
                .await
                .map_err(|e| git_error("cannot look up the branch", &e))?
        {
            Some(self.fresh_base(ws, &deps.view).await)
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
        let task = Task {
            action_id,
            mapping: TaskMapping {
                worktree_path: Some(prepared.path.clone()),
                fork_point: Some(prepared.fork_point.clone()),
                title: Some(meta.title.clone()),
                ..TaskMapping::new(
                    &action_id.to_string(),
                    &prepared.branch,
                    run.pending.trace_id,
                    run.span.id,
                )
            },
        };
        Ok(ForkedTask {
            task,
            prepared,
            fresh,
        })
    }

    /// The other dependencies' branches merged in (the branch forked from the first; a no-op
    /// when already merged, e.g. on a rerun), and the resolver's answer to a consolidation
    /// conflict: the other side merged in, the conflicts left in the files for the agent (the
    /// commit step then records the merge). `Err`: the task cannot start.
    pub(super) async fn merge_in(
        &self,
        meta: &WorkflowMeta,
        deps: &Deps,
        forked: &ForkedTask,
        ws: &git::Workspace,
    ) -> Result<Option<(String, Vec<String>)>, StepError> {
        let path = &forked.prepared.path;
        let others: Vec<String> = deps.done.iter().skip(1).map(|d| d.1.clone()).collect();
        if !others.is_empty() && meta.iterate_on.is_none() {
            ws.merge_branches(path, &others)
                .await
                .map_err(|e| git_error("cannot combine the dependencies' branches", &e))?;
        }
        let Some(from) = &meta.merge_from else {
            return Ok(None);
        };
        match ws.merge_leaving_conflicts(path, from).await {
            Ok(conflicts) => Ok(Some((from.clone(), conflicts))),
            Err(e) => Err(git_error(
                &format!("cannot merge `{from}` into the task"),
                &e,
            )),
        }
    }
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
}
