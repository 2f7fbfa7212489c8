//! The `push` step: consolidates the trace's task branches into one, pushes it with the `git`
//! CLI (upstream set, rebase-and-retry on a non-fast-forward rejection, never forced) and, for
//! GitHub events, finds the branch's open pull request or opens one whose body links the issue
//! ("Closes #N") and carries rover's footer. Deterministic: no agent.
//!
//! A merge conflict or a failed push is an error of this step, with the conflicting files or the
//! git command (argv, exit code, stdout, stderr) in `meta.error`; the orchestrator's fail-forward
//! turns it into a `notify` with purpose `failure`.
//!
//! Before anything is sent, what the push would send is scanned for the secrets rover holds and
//! for key-shaped strings (`git::scan`). A hit pushes nothing and opens no pull request: the
//! span fails with `status: secrets` and the findings (`secretsFound`: commit, file, line, kind,
//! never the value), and the resolver ends the trace (a secret in history cannot be fixed by a
//! commit on top).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::PathBuf;
use std::sync::Arc;

use async_trait::async_trait;
use uuid::Uuid;

use super::meta::{
    self, EventMeta, EventSource, PushConflict, PushMeta, PushSpanMeta, PushStatus, SecretsFound,
    WorkflowMeta,
};
use super::tasks::mapping_worktree;
use super::Services;
use crate::git::{BranchBase, GitError, SecretScan, Workspace};
use crate::github::{EventKind, GitHub, GitHubError};
use crate::orchestrator::{Finished, NextAction, Outcome, Step, StepContext, StepError};
use crate::store::blocking;
use crate::store::{StepKind, StepRun, TaskMapping, TraceView};

mod deliver;
mod report;

use deliver::{Delivery, Opening};
use report::{Landing, Pushed};

/// The pusher step.
pub struct PushStep {
    services: Arc<Services>,
}

impl PushStep {
    pub fn new(services: Arc<Services>) -> PushStep {
        PushStep { services }
    }
}

/// A task of the trace: its workflow action, mapping and meta.
struct Task {
    mapping: TaskMapping,
    meta: Option<WorkflowMeta>,
}

/// Why a push sent nothing and the resolver decides what next.
enum NotPushed {
    /// What it would send holds secrets.
    Secrets(Refused),
    /// Parallel tasks that touch the same lines: consolidating their branches conflicts.
    Conflict {
        conflict: PushConflict,
        /// The git failure as the span records it.
        error: StepError,
    },
}

/// A consolidation conflict: the push span fails naming the branches and files, and the
/// resolver gets the decision.
fn conflict_to_resolver(conflict: PushConflict, error: &StepError) -> Finished {
    let summary = format!(
        "merge conflict: `{}` conflicts with `{}` in {}",
        conflict.source_branch,
        conflict.target,
        conflict.files.join(", ")
    );
    Finished::failed(summary.clone())
        .with_meta_record(&PushSpanMeta {
            status: Some(PushStatus::Conflict),
            conflict: Some(conflict),
            ..PushSpanMeta::default()
        })
        .with_error(error)
        .then(
            NextAction::new(StepKind::Resolve, format!("decide about the {summary}"))
                .with_meta(&super::meta::ResolveMeta::default()),
        )
}

/// A git error as a step error (command, exit code, output: `tasks::git_error`), plus the
/// conflicting files of a failed consolidation.
fn git_step_error(context: &str, err: &GitError) -> StepError {
    let mut step_err = super::tasks::git_error(context, err).detail("operation", context);
    if let GitError::MergeConflict {
        source_branch,
        files,
    } = err
    {
        step_err = step_err
            .detail("sourceBranch", source_branch)
            .detail("conflicts", files);
    }
    step_err
}

fn github_step_error(context: &str, err: &GitHubError) -> StepError {
    StepError::from_error(err, err.is_retryable()).detail("operation", context)
}

/// The trace and the task mappings of its workflows.
async fn load(
    ctx: &StepContext,
    trace_id: Uuid,
) -> Result<(TraceView, BTreeMap<String, TaskMapping>), StepError> {
    blocking(ctx.store.clone(), move |s| {
        let view = s.load_trace(trace_id)?;
        let mappings: BTreeMap<String, TaskMapping> = s
            .read_state()?
            .task_mappings
            .into_iter()
            .filter(|(_, m)| m.trace_id == trace_id)
            .collect();
        Ok((view, mappings))
    })
    .await
    .map_err(|e| StepError::from_error(&e, true))
}

/// The tasks of the trace, in plan order.
fn tasks(view: &TraceView, mappings: BTreeMap<String, TaskMapping>) -> Vec<Task> {
    super::history::tasks_in_plan_order(view, mappings)
        .into_iter()
        .map(|(mapping, meta)| Task { mapping, meta })
        .collect()
}

/// The branches to push: the action's, else those of the trace's tasks; each once, in order.
fn branches_to_push(push: &PushMeta, tasks: &[Task]) -> Vec<String> {
    let source: Vec<String> = if push.branches.is_empty() {
        tasks
            .iter()
            .map(|t| t.mapping.branch_name.clone())
            .collect()
    } else {
        push.branches.clone()
    };
    let mut out = Vec::new();
    for branch in source {
        if !out.contains(&branch) {
            out.push(branch);
        }
    }
    out
}

/// The PR title: the first task's title (and how many more), else the event's label.
fn pr_title(tasks: &[&Task], event: &EventMeta) -> String {
    let titles: Vec<&str> = tasks
        .iter()
        .filter_map(|t| t.meta.as_ref().map(|m| m.title.as_str()))
        .filter(|t| !t.trim().is_empty())
        .collect();
    match titles.as_slice() {
        [] => event.label.clone(),
        [one] => (*one).to_owned(),
        [first, rest @ ..] => format!("{first} (+{} more)", rest.len()),
    }
}

/// The issue a PR closes: the number of an issue event (not of a pull request).
fn closes(event: &EventMeta) -> Option<u64> {
    let e = event.event.as_ref()?;
    let issue_kind = matches!(e.kind, EventKind::Issues | EventKind::IssueComment);
    (issue_kind && !e.is_pull_request)
        .then_some(e.number)
        .flatten()
}

/// The PR body (before the footer): a warning naming the files that steer rover (`steering`),
/// what was done, per task, and the issue it closes.
fn pr_body(
    tasks: &[&Task],
    event: &EventMeta,
    steering: &[String],
    self_review: Option<&str>,
) -> String {
    let mut body = crate::steps::steering::warning(steering)
        .map(|w| format!("{w}\n"))
        .unwrap_or_default();
    body.push_str("## Summary\n\n");
    for task in tasks {
        match &task.meta {
            Some(m) => {
                let _ = writeln!(
                    body,
                    "- **{}**: {}",
                    m.title.trim(),
                    first_line(&m.description)
                );
            }
            None => {
                let _ = writeln!(body, "- task `{}`", task.mapping.task_id);
            }
        }
    }
    if tasks.is_empty() {
        let _ = writeln!(body, "- {}", event.label);
    }
    if let Some(section) = self_review {
        let _ = write!(body, "\n{section}");
    }
    if let Some(n) = closes(event) {
        let _ = write!(body, "\nCloses #{n}\n");
    }
    if event.is_red_main_fix() {
        // Why rover opened it of its own accord: the request's first line, rover's words.
        let why = event.request.as_deref().map(first_line).unwrap_or_default();
        let what = if event.reverting().is_some() {
            "revert"
        } else {
            "fix"
        };
        let _ = write!(body, "\nrover's own {what} of a red base branch. {why}\n");
    }
    body
}

fn first_line(text: &str) -> &str {
    text.lines()
        .find(|l| !l.trim().is_empty())
        .unwrap_or("")
        .trim()
}

/// A push refused because what it would send holds secrets: nothing left.
struct Refused {
    target: String,
    merged: Vec<String>,
    worktree: PathBuf,
    /// The error as the span records it (its message names the findings, never a value).
    error: StepError,
    found: SecretsFound,
}

impl Refused {
    /// The push span: failed, the findings recorded, the resolver to end the trace.
    fn finished(self, branches: &[String]) -> Finished {
        let summary = self.error.message.clone();
        Finished::failed(summary)
            .with_meta_record(&PushSpanMeta {
                status: Some(PushStatus::Secrets),
                branch: Some(self.target.clone()),
                branches: Some(branches.to_vec()),
                merged: Some(self.merged),
                worktree: Some(self.worktree),
                secrets_found: Some(self.found),
                ..PushSpanMeta::default()
            })
            .with_error(&self.error)
            .then(
                NextAction::new(
                    StepKind::Resolve,
                    format!(
                        "the push of {} was refused: what it would send holds secrets",
                        self.target
                    ),
                )
                .with_meta(&super::meta::ResolveMeta::default()),
            )
    }
}

impl PushStep {
    async fn workspace(&self) -> Result<Workspace, GitError> {
        super::tasks::workspace(&self.services).await
    }

    /// Runs the `pre-push` hook in a sandbox container (a plan that must not run it on the
    /// host); the push itself then runs no hook.
    async fn sandbox_pre_push(
        &self,
        ctx: &StepContext,
        run: &StepRun,
        ws: &Workspace,
        worktree: &std::path::Path,
        (branch, dest): (&str, &str),
        location: crate::git::HookLocation,
    ) -> Result<(), StepError> {
        let sandbox = super::sandboxed::sandbox(&self.services)?;
        let image = super::sandboxed::trace_image(ctx, &self.services, run.pending.trace_id).await;
        sandbox
            .ensure_image(&image)
            .await
            .map_err(|e| StepError::from_error(&e, e.is_retryable()).detail("image", &image))?;
        let mut base = super::sandboxed::bare_spec(
            &self.services,
            vec!["true".into()],
            worktree,
            super::sandboxed::labels(&self.services, run.pending.trace_id, run.action.id),
        );
        base.image.clone_from(&image);
        let work_dir = ctx.store.artifacts_dir(run.span.id).join("hooks");
        let input = ws
            .pre_push_input(worktree, branch, dest)
            .await
            .map_err(|e| git_step_error("prepare the pre-push hook's input", &e))?;
        let hooks = super::sandboxed::hook_container(
            ws,
            sandbox.as_ref(),
            base,
            location,
            &work_dir,
            &Services::sandbox_objects_dir(&ctx.store),
        )
        .await
        .map_err(|e| git_step_error("prepare the sandbox's git for the hooks", &e))?;
        let verdict = hooks.pre_push(&input).await;
        let _ = tokio::fs::remove_dir_all(work_dir.join("git")).await;
        match verdict.map_err(|e| StepError::from_error(&e, e.is_retryable()))? {
            crate::sandbox::hooks::HookVerdict::Passed { .. } => Ok(()),
            crate::sandbox::hooks::HookVerdict::Failed(failure) => Err(git_step_error(
                "run the pre-push hook",
                &GitError::Command(failure),
            )),
        }
    }

    /// What a push must not send: the secrets rover holds (the redactor's set), key shapes, and
    /// the key-shaped strings the user allowed.
    /// The files of `target`'s change over the default branch that steer rover (see
    /// [`steering`]); none when they cannot be read (logged).
    async fn steering_files(&self, target: &str, default_branch: &str) -> Vec<String> {
        let ws = match self.workspace().await {
            Ok(ws) => ws,
            Err(e) => {
                tracing::warn!(error = %e, "cannot open the repository to list what the push changes");
                return Vec::new();
            }
        };
        let default = if default_branch.is_empty() {
            match ws.default_branch().await {
                Ok(branch) => branch,
                Err(e) => {
                    tracing::warn!(error = %e, "cannot find the default branch to list what the push changes");
                    return Vec::new();
                }
            }
        } else {
            default_branch.to_owned()
        };
        for base in [format!("refs/remotes/{}/{default}", ws.remote()), default] {
            match ws.changed_paths(&base, target).await {
                Ok(Some(paths)) => return crate::steps::steering::steering(&paths),
                Ok(None) => {}
                Err(e) => {
                    tracing::warn!(error = %e, branch = target, "cannot list what the push changes");
                    return Vec::new();
                }
            }
        }
        Vec::new()
    }

    fn secret_scan(&self) -> SecretScan {
        SecretScan::new(self.services.redactor.held()).allowing(
            self.services
                .config
                .autopilot
                .pipeline
                .allowed_key_shapes
                .iter()
                .cloned(),
        )
    }

    /// Where the change goes, and the default branch: what rover's own pull request goes into,
    /// and never pushed onto (none without GitHub).
    async fn delivery(
        &self,
        github: Option<&dyn GitHub>,
        event: &EventMeta,
        target: &str,
        repo: Option<&str>,
    ) -> Result<(Delivery, String), StepError> {
        let Some(gh) = github else {
            return Ok((Delivery::Own, String::new()));
        };
        let default_branch = self
            .workspace()
            .await
            .map_err(|e| git_step_error("open the repository", &e))?
            .default_branch()
            .await
            .map_err(|e| git_step_error("find the default branch", &e))?;
        let here = deliver::Here {
            repo,
            default_branch: &default_branch,
            mode: self.services.config.autopilot.github.contributor_prs,
        };
        let delivery = Delivery::find(gh, event, target, &here)
            .await
            .map_err(|e| github_step_error("read the pull request the work is about", &e))?;
        Ok((delivery, default_branch))
    }

    /// Merge the other branches into the first in its worktree, then push it to the remote's
    /// branch `dest` (unless the branches conflict or what it would send holds secrets:
    /// `Err(NotPushed)` inside).
    async fn consolidate_and_push(
        &self,
        ctx: &StepContext,
        run: &StepRun,
        (branches, dest): (&[String], &str),
        tasks: &[Task],
    ) -> Result<Result<Pushed, NotPushed>, StepError> {
        let ws = self
            .workspace()
            .await
            .map_err(|e| git_step_error("open the repository", &e))?;
        let target = branches[0].clone();
        let existing = tasks
            .iter()
            .filter(|t| t.mapping.branch_name == target)
            .find_map(|t| mapping_worktree(&t.mapping));
        let worktree = if let Some(path) = existing {
            path
        } else {
            let path = Services::worktrees_dir(&ctx.store)
                .join(format!("push-{}", target.replace('/', "-")));
            ws.prepare_worktree(&target, BranchBase::Existing, &path)
                .await
                .map_err(|e| git_step_error("prepare a worktree for the branch", &e))?
                .path
        };
        let rest = &branches[1..];
        let merged = if rest.is_empty() {
            Vec::new()
        } else {
            match ws.merge_branches(&worktree, rest).await {
                Ok(merge) => merge.merged,
                Err(e) => {
                    let error = git_step_error("consolidate the branches", &e)
                        .detail("target", &target)
                        .detail("branches", branches);
                    return match e {
                        GitError::MergeConflict {
                            source_branch,
                            files,
                        } => Ok(Err(NotPushed::Conflict {
                            conflict: PushConflict {
                                source_branch,
                                target,
                                files,
                                base: false,
                            },
                            error,
                        })),
                        _ => Err(error),
                    };
                }
            }
        };
        let hooks = ws
            .hook_plan(&worktree, ws.hook_mode())
            .await
            .map_err(|e| git_step_error("tell where the git hooks run", &e))?;
        if let crate::git::HookPlan::Sandbox { location, .. } = &hooks {
            self.sandbox_pre_push(ctx, run, &ws, &worktree, (&target, dest), location.clone())
                .await?;
        }
        let token = self
            .services
            .git_token()
            .await
            .map_err(|e| github_step_error("get a GitHub token for the push", &e))?;
        let pushed = ws
            .push_branch(
                &worktree,
                &target,
                dest,
                token.as_deref(),
                &hooks,
                &self.secret_scan(),
            )
            .await;
        let report = match pushed {
            Ok(report) => report,
            Err(e) => {
                let error = git_step_error("push the branch", &e)
                    .detail("branch", &target)
                    .detail("dest", dest)
                    .detail("merged", &merged);
                return match e {
                    GitError::SecretsInPush { findings, more, .. } => {
                        Ok(Err(NotPushed::Secrets(Refused {
                            target,
                            merged,
                            worktree,
                            error,
                            found: SecretsFound { findings, more },
                        })))
                    }
                    _ => Err(error),
                };
            }
        };
        let head_sha = match ws.branch_head(&target).await {
            Ok(sha) => Some(sha),
            Err(e) => {
                tracing::warn!(branch = %target, error = %e, "cannot read the pushed head; its CI is not followed");
                None
            }
        };
        Ok(Ok(Pushed {
            target,
            head_sha,
            merged,
            rebased: report.rebased,
            worktree,
            hooks,
        }))
    }
}

#[async_trait]
impl Step for PushStep {
    fn kind(&self) -> StepKind {
        StepKind::Push
    }

    fn max_parallel(&self) -> usize {
        2
    }

    fn exclusive_per_trace(&self) -> bool {
        true
    }

    async fn process(&self, ctx: &StepContext, run: &StepRun) -> Result<Outcome, StepError> {
        let trace_id = run.pending.trace_id;
        let (view, mappings) = load(ctx, trace_id).await?;
        let event = view
            .root()
            .and_then(|root| EventMeta::of(root).ok())
            .ok_or_else(|| StepError::fatal("the trace has no readable root event span"))?;
        let push: PushMeta = meta::read(&run.action).unwrap_or_default();
        let tasks = tasks(&view, mappings);
        let branches = branches_to_push(&push, &tasks);
        if branches.is_empty() {
            return Err(StepError::fatal(
                "nothing to push: the push action names no branch and the trace has no task branches",
            ));
        }
        // A local request's work stays on its branch; rover's own fix of a red base branch
        // opens its pull request, which goes through the lifecycle like any other.
        let github = match (&self.services.github, event.source) {
            (Some(gh), EventSource::Github) => Some(gh.clone()),
            (Some(gh), EventSource::Local) if event.is_red_main_fix() => Some(gh.clone()),
            _ => None,
        };
        let repo = self.services.repo.as_ref().map(ToString::to_string);
        let (delivery, default_branch) = self
            .delivery(github.as_deref(), &event, &branches[0], repo.as_deref())
            .await?;
        let dest = delivery.dest(&branches[0]);
        let pushed = match self
            .consolidate_and_push(ctx, run, (&branches, &dest), &tasks)
            .await?
        {
            Ok(pushed) => pushed,
            // Nothing left; a secret in history is not fixed by a commit on top: the resolver
            // ends the trace.
            Err(NotPushed::Secrets(refused)) => {
                return Ok(Outcome::Finished(refused.finished(&branches)))
            }
            // The resolver decides (it can iterate on the conflicting task with the conflict as
            // input) instead of the trace failing.
            Err(NotPushed::Conflict { conflict, error }) => {
                return Ok(Outcome::Finished(conflict_to_resolver(conflict, &error)));
            }
        };
        let included: Vec<&Task> = tasks
            .iter()
            .filter(|t| branches.contains(&t.mapping.branch_name))
            .collect();
        let steering = self.steering_files(&pushed.target, &default_branch).await;
        let pr = match &github {
            Some(gh) => {
                let (trace, action) = (trace_id.to_string(), run.action.id.to_string());
                let reviewed = crate::steps::history::self_review_section(&view);
                let opening = Opening {
                    branch: &pushed.target,
                    base: &default_branch,
                    tasks: &included,
                    event: &event,
                    steering: &steering,
                    self_review: reviewed.as_deref(),
                    trace_id: &trace,
                    action_id: &action,
                };
                delivery
                    .pull_request(gh.as_ref(), &self.services, &opening, &default_branch)
                    .await?
            }
            None => None,
        };
        let landing = Landing {
            pushed: &pushed,
            dest: &dest,
            branches: &branches,
            steering: &steering,
            delivery: &delivery,
            event: &event,
            repo: repo.as_deref(),
        };
        Ok(Outcome::Finished(landing.finished(&self.services, pr)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::github::{Channel, EventAction, NormalizedEvent, Visibility};

    fn event(kind: EventKind, is_pr: bool) -> EventMeta {
        let mut e = NormalizedEvent::local("1", "alice", "", chrono::Utc::now());
        e.kind = kind;
        e.action = Some(EventAction::Opened);
        e.number = Some(12);
        e.is_pull_request = is_pr;
        e.channel = Channel::IssueComment { number: 12 };
        e.visibility = Visibility::Public;
        EventMeta {
            source: EventSource::Github,
            label: "IssuesEvent opened #12 by alice".into(),
            kind: kind.as_str().into(),
            action: Some("opened".into()),
            channel: e.channel.clone(),
            visibility: e.visibility,
            event: Some(e),
            request: None,
            follows: None,
            reverts: None,
        }
    }

    fn task(title: &str, branch: &str) -> Task {
        Task {
            mapping: TaskMapping::new(branch, branch, uuid::Uuid::new_v4(), uuid::Uuid::new_v4()),
            meta: Some(WorkflowMeta {
                title: title.into(),
                description: format!("\n{title} in detail\nmore"),
                ..WorkflowMeta::default()
            }),
        }
    }

    #[test]
    fn only_issue_events_are_closed_by_the_pr() {
        assert_eq!(closes(&event(EventKind::Issues, false)), Some(12));
        assert_eq!(closes(&event(EventKind::IssueComment, false)), Some(12));
        assert_eq!(closes(&event(EventKind::IssueComment, true)), None);
        assert_eq!(closes(&event(EventKind::PullRequestReview, true)), None);
    }

    #[test]
    fn title_and_body_come_from_the_tasks() {
        let a = task("Fix the parser", "rover/a");
        let b = task("Add tests", "rover/b");
        let ev = event(EventKind::Issues, false);
        assert_eq!(pr_title(&[&a], &ev), "Fix the parser");
        assert_eq!(pr_title(&[&a, &b], &ev), "Fix the parser (+1 more)");
        assert_eq!(pr_title(&[], &ev), ev.label);
        let body = pr_body(&[&a, &b], &ev, &[], None);
        assert!(
            body.contains("- **Fix the parser**: Fix the parser in detail"),
            "{body}"
        );
        assert!(
            body.contains("- **Add tests**: Add tests in detail"),
            "{body}"
        );
        assert!(body.trim_end().ends_with("Closes #12"), "{body}");
    }

    #[test]
    fn branches_of_the_action_win_and_repeat_once() {
        let tasks = vec![
            task("a", "rover/a"),
            task("b", "rover/b"),
            task("a2", "rover/a"),
        ];
        assert_eq!(
            branches_to_push(&PushMeta::default(), &tasks),
            vec!["rover/a", "rover/b"]
        );
        let meta = PushMeta {
            branches: vec!["rover/b".into(), "rover/b".into()],
        };
        assert_eq!(branches_to_push(&meta, &tasks), vec!["rover/b"]);
    }
}
