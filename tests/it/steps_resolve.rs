//! The resolve and push steps on a real orchestrator, real git (a bare `origin`), the fake agent
//! and the fake GitHub. Workflow, commit, coordinate and notify are stand-in steps (`Fake*Step`)
//! that do the git work for real: a worktree per task, a task mapping, `git commit`.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use axum::http::Method;
use rover::config::RoverConfig;
use rover::git::{BranchBase, Workspace};
use rover::github::{EventAction, EventKind, GitHub, GitHubSettings, NormalizedEvent, Visibility};
use rover::orchestrator::{
    Finished, NextAction, Outcome, Readiness, Step, StepContext, StepError, StepOrchestrator,
};
use rover::steps::meta::{
    self, CommitMeta, NotifyMeta, NotifyPurpose, PushMeta, TaskStatus, WorkflowMeta,
};
use rover::steps::workflow::WorkflowSpanMeta;
use rover::steps::{PushStep, ResolveStep, Services};
use rover::store::{
    Action, PendingAction, Span, SpanStatus, StepKind, StepRun, TaskMapping, TraceView,
};
use serde_json::{json, Value};
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use crate::support::chain::assert_chain;
use crate::support::fake_github::{FakeGitHub, BOT, REPO};
use crate::support::gitrepo::{git, HERMETIC_ENV};
use crate::support::pipeline::{first_span, last_span, test_config, Case, Pipeline};
use crate::support::scenario::resolve;

// ---------------------------------------------------------------------------------------------
// Stand-in steps

/// `coordinate` stand-in: plans the given tasks as workflow actions (preset ids, so a task may
/// depend on an earlier one by index).
struct FakeCoordinateStep {
    tasks: Vec<WorkflowMeta>,
}

#[async_trait]
impl Step for FakeCoordinateStep {
    fn kind(&self) -> StepKind {
        StepKind::Coordinate
    }
    fn max_parallel(&self) -> usize {
        1
    }
    async fn process(&self, _ctx: &StepContext, _run: &StepRun) -> Result<Outcome, StepError> {
        let mut finished = Finished::completed(format!("planned {} task(s)", self.tasks.len()));
        for task in &self.tasks {
            finished = finished.then(
                NextAction::new(StepKind::Workflow, format!("task: {}", task.title))
                    .with_meta(task),
            );
        }
        Ok(Outcome::Finished(finished))
    }
}

/// What the workflow stand-in does for a task (by title).
#[derive(Clone, Default)]
struct TaskScript {
    /// Files written in the worktree (path, content); the run number is appended to contents.
    files: Vec<(String, String)>,
    /// How many runs fail (status failed) before one completes.
    fail_runs: usize,
    /// The branch to use (default `rover/<slug>`).
    branch: Option<String>,
}

/// `workflow` stand-in: a real worktree and task mapping, files written instead of an agent.
struct FakeWorkflowStep {
    services: Arc<Services>,
    scripts: HashMap<String, TaskScript>,
    runs: Mutex<HashMap<String, usize>>,
    /// Titles whose workflow waits (stays queued) while set.
    hold: Mutex<HashSet<String>>,
}

impl FakeWorkflowStep {
    fn new(services: Arc<Services>, scripts: &[(&str, TaskScript)]) -> Arc<FakeWorkflowStep> {
        Arc::new(FakeWorkflowStep {
            services,
            scripts: scripts
                .iter()
                .map(|(t, s)| ((*t).to_owned(), s.clone()))
                .collect(),
            runs: Mutex::new(HashMap::new()),
            hold: Mutex::new(HashSet::new()),
        })
    }
}

async fn workspace(services: &Services) -> Workspace {
    let mut ws = Workspace::open(services.repo_root.clone())
        .await
        .expect("open workspace");
    for (k, v) in &services.git_env {
        ws = ws.with_env(k, v);
    }
    ws
}

#[async_trait]
impl Step for FakeWorkflowStep {
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
        let action = ctx.store.read_action(pending.action_id).expect("action");
        let task: WorkflowMeta = meta::read(&action).expect("workflow meta");
        if self.hold.lock().expect("lock").contains(&task.title) {
            return Ok(Readiness::Wait(format!(
                "{} is held by the test",
                task.title
            )));
        }
        Ok(Readiness::Ready)
    }
    async fn process(&self, ctx: &StepContext, run: &StepRun) -> Result<Outcome, StepError> {
        let task: WorkflowMeta = meta::read(&run.action).expect("workflow meta");
        let script = self.scripts.get(&task.title).cloned().unwrap_or_default();
        let n = {
            let mut runs = self.runs.lock().expect("lock");
            let n = runs.entry(task.title.clone()).or_default();
            *n += 1;
            *n
        };
        let state = ctx.store.read_state().expect("state");
        let branch = task
            .branch
            .clone()
            .or(script.branch.clone())
            .unwrap_or_else(|| format!("rover/{}", rover::git::slugify(&task.title)));
        let base = if task.iterate_on.is_some() {
            BranchBase::Existing
        } else if let Some(dep) = task.depends_on.first() {
            BranchBase::Branch(state.task_mappings[&dep.to_string()].branch_name.clone())
        } else {
            BranchBase::DefaultBranch
        };
        let path = Services::worktrees_dir(&ctx.store).join(branch.replace('/', "-"));
        let ws = workspace(&self.services).await;
        let prepared = ws
            .prepare_worktree(&branch, base, &path)
            .await
            .expect("prepare worktree");
        let mapping = TaskMapping {
            worktree_path: Some(prepared.path.clone()),
            ..TaskMapping::new(
                &run.action.id.to_string(),
                &branch,
                run.pending.trace_id,
                run.span.id,
            )
        };
        let key = run.action.id.to_string();
        ctx.store
            .transact(|txn| {
                txn.state_mut()?.task_mappings.insert(key, mapping);
                Ok(())
            })
            .expect("write mapping");
        let commit = |status| CommitMeta {
            workflow_action_id: Some(run.action.id),
            task_status: status,
            summary: Some(task.title.clone()),
        };
        let branch_meta = WorkflowSpanMeta {
            branch_name: Some(branch.clone()),
            ..WorkflowSpanMeta::default()
        };
        if n <= script.fail_runs {
            return Ok(Outcome::Finished(
                Finished::failed(format!("{}: tests still fail (run {n})", task.title))
                    .with_meta_record(&branch_meta)
                    .then(
                        NextAction::new(StepKind::Commit, "record the task")
                            .with_meta(&commit(TaskStatus::Failed)),
                    ),
            ));
        }
        for (file, content) in &script.files {
            std::fs::write(prepared.path.join(file), format!("{content}\nrun {n}\n"))
                .expect("write file");
        }
        Ok(Outcome::Finished(
            Finished::completed(format!("{} done (run {n})", task.title))
                .with_meta_record(&branch_meta)
                .then(
                    NextAction::new(StepKind::Commit, "record the task")
                        .with_meta(&commit(TaskStatus::Completed)),
                ),
        ))
    }
}

/// `commit` stand-in: `git add -A` + `git commit` in the task's worktree; fails the first
/// `fail_times` commits like a pre-commit hook missing a tool.
struct FakeCommitStep {
    fail_times: AtomicUsize,
}

#[async_trait]
impl Step for FakeCommitStep {
    fn kind(&self) -> StepKind {
        StepKind::Commit
    }
    fn max_parallel(&self) -> usize {
        3
    }
    async fn process(&self, ctx: &StepContext, run: &StepRun) -> Result<Outcome, StepError> {
        let commit: CommitMeta = meta::read(&run.action).expect("commit meta");
        let resolve = NextAction::new(StepKind::Resolve, "decide what comes next");
        if commit.task_status != TaskStatus::Completed {
            return Ok(Outcome::Finished(
                Finished::completed("the task failed: nothing to commit").then(resolve),
            ));
        }
        if self
            .fail_times
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok()
        {
            return Err(
                StepError::fatal("`git commit` failed: the pre-commit hook failed")
                    .detail("command", ["git", "commit", "-m", "task"])
                    .detail("exitCode", 1)
                    .detail("stderr", "pre-commit: lint-tool: command not found"),
            );
        }
        let state = ctx.store.read_state().expect("state");
        let id = commit.workflow_action_id.expect("workflow id").to_string();
        let dir = state.task_mappings[&id]
            .worktree_path
            .clone()
            .expect("worktree path");
        let title = commit.summary.unwrap_or_default();
        tokio::task::spawn_blocking(move || {
            git(&dir, &["add", "-A"]);
            git(
                &dir,
                &[
                    "-c",
                    "user.name=Rover Test",
                    "-c",
                    "user.email=rover-test@example.com",
                    "commit",
                    "--quiet",
                    "-m",
                    &title,
                ],
            );
        })
        .await
        .expect("git commit");
        Ok(Outcome::Finished(
            Finished::completed("committed").then(resolve),
        ))
    }
}

/// `notify` stand-in: ends the trace, keeping the notify meta in its span.
struct FakeNotifyStep;

#[async_trait]
impl Step for FakeNotifyStep {
    fn kind(&self) -> StepKind {
        StepKind::Notify
    }
    fn max_parallel(&self) -> usize {
        5
    }
    async fn process(&self, _ctx: &StepContext, run: &StepRun) -> Result<Outcome, StepError> {
        let mut finished = Finished::completed(run.action.reason.clone());
        finished.meta.clone_from(&run.action.meta);
        Ok(Outcome::Finished(finished))
    }
}

// ---------------------------------------------------------------------------------------------
// Helpers

fn task(title: &str) -> WorkflowMeta {
    WorkflowMeta {
        title: title.to_owned(),
        description: format!("Do {title}.\nIn detail."),
        ..WorkflowMeta::default()
    }
}

/// The trace's actions of `kind`, in order.
fn actions_of(view: &TraceView, kind: StepKind) -> Vec<&Action> {
    view.actions.iter().filter(|a| a.action == kind).collect()
}

/// The trace's spans of `kind`, in order.
fn spans_of(view: &TraceView, kind: StepKind) -> Vec<&Span> {
    view.spans.iter().filter(|s| s.step == kind).collect()
}

/// A task whose first `runs` runs fail, writing nothing.
fn failing(runs: usize) -> TaskScript {
    TaskScript {
        fail_runs: runs,
        ..TaskScript::default()
    }
}

/// The first agent call's prompt.
fn prompt_of(calls: &[Value]) -> &str {
    calls[0]["prompt"].as_str().expect("prompt")
}

/// Writes `content` to `path` as an executable script.
fn write_executable(path: &Path, content: &str) {
    std::fs::write(path, content).expect("write script");
    let mut perms = std::fs::metadata(path).expect("meta").permissions();
    std::os::unix::fs::PermissionsExt::set_mode(&mut perms, 0o755);
    std::fs::set_permissions(path, perms).expect("chmod");
}

/// The fake GitHub with alice's issue #12, "Parser crashes".
async fn parser_crashes() -> FakeGitHub {
    let fake = FakeGitHub::start().await;
    fake.add_issue(12, "Parser crashes", "It crashes.", "alice", &[]);
    fake
}

fn write(path: &str, content: &str) -> TaskScript {
    TaskScript {
        files: vec![(path.to_owned(), content.to_owned())],
        ..TaskScript::default()
    }
}

/// A script answering each resolve invocation in turn.
fn resolve_script(answers: &[Value]) -> Value {
    let rules: Vec<Value> = answers
        .iter()
        .enumerate()
        .map(|(i, a)| json!({"invocation": i + 1, "structured": a}))
        .collect();
    json!({"strict": true, "rules": rules})
}

struct World {
    p: Pipeline,
    services: Arc<Services>,
    workflow: Arc<FakeWorkflowStep>,
    commit_failures: usize,
    tasks: Vec<WorkflowMeta>,
}

impl World {
    fn new(
        script: &Value,
        config: RoverConfig,
        github: Option<Arc<dyn GitHub>>,
        tasks: Vec<WorkflowMeta>,
        scripts: &[(&str, TaskScript)],
    ) -> World {
        World::new_with(script, config, github, tasks, scripts, |_, _| {})
    }

    /// Like `new`, with the services adjusted before the steps get them.
    fn new_with(
        script: &Value,
        config: RoverConfig,
        github: Option<Arc<dyn GitHub>>,
        tasks: Vec<WorkflowMeta>,
        scripts: &[(&str, TaskScript)],
        adjust: impl FnOnce(&mut Services, &Pipeline) + 'static,
    ) -> World {
        let (p, services) = Case::new(script)
            .config(config)
            .github_client(github)
            .adjust(adjust)
            .services();
        let workflow = FakeWorkflowStep::new(services.clone(), scripts);
        World {
            p,
            services,
            workflow,
            commit_failures: 0,
            tasks,
        }
    }

    /// A world with `config` and `github` planning the one task "parser", run as `parser` says.
    fn parser(
        script: &Value,
        config: RoverConfig,
        github: Option<Arc<dyn GitHub>>,
        parser: TaskScript,
    ) -> World {
        World::new(
            script,
            config,
            github,
            vec![task("parser")],
            &[("parser", parser)],
        )
    }

    /// A world with the test config and `github` whose resolver pushes, planning two tasks
    /// ("parser", "tests") that write a file each.
    fn parser_and_tests(github: Option<Arc<dyn GitHub>>) -> World {
        World::new(
            &push_script(),
            test_config(),
            github,
            vec![task("parser"), task("tests")],
            &[
                ("parser", write("parser.txt", "parser")),
                ("tests", write("tests.txt", "tests")),
            ],
        )
    }

    fn orchestrator(&self, commit_failures: usize) -> StepOrchestrator {
        self.p.orchestrator(vec![
            Arc::new(FakeCoordinateStep {
                tasks: self.tasks.clone(),
            }),
            self.workflow.clone(),
            Arc::new(FakeCommitStep {
                fail_times: AtomicUsize::new(commit_failures),
            }),
            Arc::new(ResolveStep::new(self.services.clone())),
            Arc::new(PushStep::new(self.services.clone())),
            Arc::new(FakeNotifyStep),
            Arc::new(rover::steps::NoopStep),
        ])
    }

    async fn run_local(&self, request: &str) -> Uuid {
        let trace = self.p.submit(request);
        self.p.run(&self.orchestrator(self.commit_failures)).await;
        trace
    }

    /// Runs a trace for issue `number` (`submit_issue`) until idle; returns the trace.
    async fn run_issue(&self, number: u64) -> Uuid {
        let trace = submit_issue(&self.p, number);
        self.p.run(&self.orchestrator(0)).await;
        trace
    }

    /// `run_local`, then checks the trace's chain of steps (`short`): the trace and its view.
    async fn run_local_as(&self, request: &str, short: &str) -> (Uuid, TraceView) {
        let trace = self.run_local(request).await;
        let view = self.p.trace(trace);
        assert_chain(&view, short);
        (trace, view)
    }

    fn resolve_calls(&self) -> usize {
        self.p.agents.calls().len()
    }

    fn origin_has(&self, branch: &str) -> bool {
        std::process::Command::new("git")
            .arg("-C")
            .arg(&self.p.repo.origin)
            .args([
                "rev-parse",
                "--verify",
                "--quiet",
                &format!("refs/heads/{branch}"),
            ])
            .envs(HERMETIC_ENV)
            .output()
            .expect("git")
            .status
            .success()
    }
}

/// Run the orchestrator's loop until `done` holds (checked every 50 ms), then shut it down.
async fn run_until(orch: &StepOrchestrator, mut done: impl FnMut() -> bool) {
    let token = CancellationToken::new();
    let run = orch.run(token.clone());
    tokio::pin!(run);
    let limit = tokio::time::sleep(Duration::from_secs(60));
    tokio::pin!(limit);
    loop {
        tokio::select! {
            result = &mut run => {
                result.expect("orchestrator loop");
                return;
            }
            () = &mut limit => panic!("the condition did not hold within a minute"),
            () = tokio::time::sleep(Duration::from_millis(50)) => {
                if done() {
                    token.cancel();
                }
            }
        }
    }
}

fn origin_file(origin: &Path, branch: &str, file: &str) -> String {
    crate::support::gitrepo::show(origin, branch, file)
}

fn span_meta(p: &Pipeline, trace: Uuid, step: &str) -> serde_json::Map<String, Value> {
    last_span(&p.trace(trace), step).meta
}

fn notify_of(p: &Pipeline, trace: Uuid) -> NotifyMeta {
    serde_json::from_value(Value::Object(span_meta(p, trace, "notify"))).expect("notify meta")
}

fn github(fake: &FakeGitHub) -> Arc<dyn GitHub> {
    Arc::new(fake.client_with(&GitHubSettings {
        request_timeout_secs: 5,
        ..GitHubSettings::default()
    }))
}

/// A trace for `IssuesEvent opened #number` (public issue).
fn submit_issue(p: &Pipeline, number: u64) -> Uuid {
    let mut event = NormalizedEvent::local("4242", "alice", "", chrono::Utc::now());
    event.kind = EventKind::Issues;
    event.action = Some(EventAction::Opened);
    REPO.clone_into(&mut event.repo);
    event.number = Some(number);
    event.body = None;
    event.channel = rover::github::Channel::IssueComment { number };
    event.visibility = Visibility::Public;
    let (root, first) = rover::intake::github_trace(
        &rover::intake::Entry::new(p.project_id.clone(), rover::steps::kinds::FIRST_STEP),
        &event,
    );
    p.store
        .create_trace(&root, Some(&first), std::slice::from_ref(&event.id))
        .expect("create trace");
    root.id
}

/// The GitHub token handed to `Services` in the push test.
const SECRET_TOKEN: &str = "ghp_pushtoken0123456789abcdefghijkl";

fn push_script() -> Value {
    json!([{"structured": resolve("push", json!({}))}])
}

// ---------------------------------------------------------------------------------------------
// Resolver

#[tokio::test]
async fn resolver_waits_for_a_queued_workflow_then_one_of_two_resolves_pushes() {
    let w = World::parser_and_tests(None);
    w.workflow.hold.lock().expect("lock").insert("tests".into());
    let trace = w.p.submit("add a parser with tests");
    let orch = w.orchestrator(0);
    // A waiting action keeps `run_until_idle` busy: run until the resolve is seen waiting.
    run_until(&orch, || {
        orch.waiting()
            .values()
            .any(|why| why.contains("waiting for the workflow action"))
    })
    .await;
    // The resolve of the first task stays queued, without a span, while "tests" is queued.
    let view = w.p.trace(trace);
    assert!(
        !view.spans.iter().any(|s| s.step == StepKind::Resolve),
        "{:?}",
        w.p.chain(trace)
    );
    assert!(view.spans.iter().any(|s| s.step == StepKind::Commit));
    let mut queued: Vec<String> = view.pending.iter().map(|p| p.action.to_string()).collect();
    queued.sort();
    assert_eq!(queued, vec!["resolve", "workflow"]);
    assert_eq!(w.resolve_calls(), 0);

    w.workflow.hold.lock().expect("lock").clear();
    w.p.run(&w.orchestrator(0)).await;
    let chain = w.p.chain(trace);
    assert_eq!(
        chain.iter().filter(|s| s.starts_with("resolve")).count(),
        2,
        "{chain:?}"
    );
    assert_eq!(
        chain.iter().filter(|s| *s == "push:completed").count(),
        1,
        "{chain:?}"
    );
    assert_eq!(chain.last().map(String::as_str), Some("notify:completed"));
    // One resolve decided (the agent ran once), the other was superseded by it.
    assert_eq!(w.resolve_calls(), 1);
    let view = w.p.trace(trace);
    let resolves: Vec<_> = spans_of(&view, StepKind::Resolve);
    let decided = resolves
        .iter()
        .find(|s| s.meta.get("decision") == Some(&json!("push")))
        .expect("a push decision");
    let superseded = resolves
        .iter()
        .find(|s| s.meta.contains_key("supersededBy"))
        .expect("a superseded resolve");
    assert_eq!(superseded.meta["supersededBy"], json!(decided.id));
    assert_eq!(
        superseded.summary.as_deref(),
        Some(format!("superseded by {}", decided.id).as_str())
    );
    // The push carried both branches and consolidated them.
    let push_action = view
        .actions
        .iter()
        .find(|a| a.action == StepKind::Push)
        .expect("push action");
    let pm: PushMeta = meta::read(push_action).expect("push meta");
    assert_eq!(pm.branches.len(), 2, "{pm:?}");
    let target = &pm.branches[0];
    assert!(origin_file(&w.p.repo.origin, target, "parser.txt").contains("parser"));
    assert!(origin_file(&w.p.repo.origin, target, "tests.txt").contains("tests"));
    let notify = notify_of(&w.p, trace);
    assert_eq!(notify.purpose, NotifyPurpose::Pushed);
}

#[tokio::test]
async fn resolver_iterates_on_the_same_task_and_branch() {
    let script = resolve_script(&[
        resolve(
            "iterate",
            json!({"instructions": "use a table-driven parser"}),
        ),
        resolve("push", json!({})),
    ]);
    let w = World::parser(
        &script,
        test_config(),
        None,
        TaskScript {
            fail_runs: 1,
            ..write("parser.txt", "parser")
        },
    );
    let (_, view) = w
        .run_local_as(
            "add a parser",
            "event coordinate workflow:failed commit resolve workflow commit resolve push notify",
        )
        .await;
    let workflows: Vec<_> = actions_of(&view, StepKind::Workflow);
    assert_eq!(workflows.len(), 2);
    let second: WorkflowMeta = meta::read(workflows[1]).expect("meta");
    assert_eq!(second.iterate_on, Some(workflows[0].id));
    assert_eq!(second.branch.as_deref(), Some("rover/parser"));
    assert_eq!(
        second.instructions.as_deref(),
        Some("use a table-driven parser")
    );
    assert_eq!(second.title, "parser");
    // The failure's details reached the agent, which ran in rover's empty dir, not the worktree.
    let calls = w.p.agents.calls();
    assert!(prompt_of(&calls).contains("tests still fail"));
    assert!(calls[0]["cwd"]
        .as_str()
        .expect("cwd")
        .ends_with("agent-cwd"));
    let first_resolve = first_span(&view, "resolve");
    assert_eq!(first_resolve.meta["decision"], json!("iterate"));
    assert!(w.origin_has("rover/parser"));
}

#[tokio::test]
async fn resolver_retries_a_failed_commit_after_fixing_the_environment() {
    let fix = json!({"command": "npm install -g lint-tool", "purpose": "install the hook's tool"});
    let script = resolve_script(&[
        resolve(
            "retry",
            json!({"retry_step": "commit", "corrective_commands": [fix]}),
        ),
        resolve("push", json!({})),
    ]);
    let mut w = World::parser(&script, test_config(), None, write("parser.txt", "parser"));
    w.commit_failures = 1;
    let (_, view) = w
        .run_local_as(
            "add a parser",
            "event coordinate workflow commit:error resolve commit resolve push notify",
        )
        .await;
    let commits: Vec<_> = actions_of(&view, StepKind::Commit);
    assert_eq!(commits.len(), 2);
    // The same commit meta, re-enqueued.
    assert_eq!(commits[0].meta, commits[1].meta);
    let retry = first_span(&view, "resolve");
    assert_eq!(retry.meta["decision"], json!("retry"));
    assert_eq!(retry.meta["retryStep"], json!("commit"));
    assert_eq!(
        retry.meta["correctiveCommands"][0]["command"],
        json!("npm install -g lint-tool")
    );
    // No Docker in this world: the commands are recorded as not run, and why (never the host).
    assert_eq!(
        retry.meta["correctiveRuns"]["ran"],
        json!(false),
        "{:?}",
        retry.meta
    );
    // The agent saw the hook's stderr.
    let calls = w.p.agents.calls();
    assert!(prompt_of(&calls).contains("lint-tool: command not found"));
}

#[tokio::test]
async fn resolver_fails_without_the_agent_when_retries_are_exhausted() {
    let mut config = test_config();
    config.autopilot.pipeline.max_retries = 1;
    let script = json!([{"structured": resolve("iterate", json!({"instructions": "try again"}))}]);
    let w = World::parser(&script, config, None, failing(10));
    let (trace, _) = w
        .run_local_as(
            "add a parser",
            "event coordinate workflow:failed commit resolve workflow:failed commit resolve notify",
        )
        .await;
    // The agent decided the first resolve only.
    assert_eq!(w.resolve_calls(), 1);
    let last = span_meta(&w.p, trace, "resolve");
    assert_eq!(last["decision"], json!("fail"));
    assert_eq!(last["quickExit"], json!("maxRetries"));
    assert_eq!(last["retries"], json!(1));
    let notify = notify_of(&w.p, trace);
    assert_eq!(notify.purpose, NotifyPurpose::Failure);
    assert_eq!(notify.failed_step.as_deref(), Some("workflow"));
    assert!(notify.error.expect("why").contains("gave up after 1"));
}

/// A resolver `wait` is a decision like the others (not an error): the span completes saying
/// so and a resolve of the trace is scheduled; past `maxWaits` the trace fails, saying why.
#[tokio::test]
async fn a_resolver_wait_is_a_scheduled_look_again_bounded_by_max_waits() {
    let mut config = test_config();
    config.autopilot.pipeline.wait_secs = 0;
    config.autopilot.pipeline.max_waits = 1;
    let script = resolve_script(&[
        resolve("wait", json!({"reasoning": "CI is still running"})),
        resolve("wait", json!({"reasoning": "CI is still running"})),
    ]);
    let w = World::parser(&script, config, None, write("p.txt", "p\n"));
    let trace = w.p.submit("add a parser");
    w.p.run_with_retries(&w.orchestrator(0)).await;
    let view = w.p.trace(trace);
    assert_eq!(
        w.p.chain(trace),
        vec![
            "event:completed",
            "coordinate:completed",
            "workflow:completed",
            "commit:completed",
            "resolve:completed",
            "resolve:completed",
            "notify:completed",
        ],
        "{:#?}",
        view.spans
            .iter()
            .map(|s| (&s.step, &s.summary))
            .collect::<Vec<_>>()
    );
    let resolves: Vec<_> = spans_of(&view, StepKind::Resolve);
    assert_eq!(resolves[0].meta["decision"], json!("wait"));
    assert_eq!(resolves[0].meta["wait"]["round"], json!(1));
    assert!(resolves[0].meta.get("error").is_none(), "not an error");
    let scheduled = view
        .actions
        .iter()
        .find(|a| a.action == StepKind::Resolve && a.span_id == resolves[0].id)
        .expect("a scheduled resolve");
    assert!(
        scheduled.meta.contains_key("notBefore"),
        "{:?}",
        scheduled.meta
    );
    assert_eq!(resolves[1].meta["decision"], json!("fail"));
    assert_eq!(resolves[1].meta["quickExit"], json!("maxWaits"));
    let notify = notify_of(&w.p, trace);
    assert_eq!(notify.purpose, NotifyPurpose::Failure);
    assert!(notify.error.expect("why").contains("kept answering wait"));
}

#[tokio::test]
async fn resolver_notifies_the_findings_of_a_review() {
    let script = resolve_script(&[resolve(
        "notify",
        json!({"message": "Two findings: the parser panics on empty input."}),
    )]);
    let mut review = task("review the parser");
    review.workflow_type = meta::WorkflowType::CodeReview;
    let w = World::new(&script, test_config(), None, vec![review], &[]);
    let trace = w.run_local("review the parser").await;
    assert_eq!(
        w.p.chain(trace).last().map(String::as_str),
        Some("notify:completed")
    );
    let notify = notify_of(&w.p, trace);
    assert_eq!(notify.purpose, NotifyPurpose::Review);
    assert_eq!(
        notify.message.as_deref(),
        Some("Two findings: the parser panics on empty input.")
    );
    assert!(!w.origin_has("rover/review-the-parser"));
}

#[tokio::test]
async fn resolver_fails_with_the_agents_message() {
    let script = resolve_script(&[resolve(
        "fail",
        json!({"message": "The task asks for a database this repository does not have."}),
    )]);
    let w = World::parser(&script, test_config(), None, failing(1));
    let (trace, _) = w
        .run_local_as(
            "add a parser",
            "event coordinate workflow:failed commit resolve notify",
        )
        .await;
    let resolve = span_meta(&w.p, trace, "resolve");
    assert_eq!(resolve["decision"], json!("fail"));
    assert_eq!(resolve["reasoning"], json!("decided fail"));
    let notify = notify_of(&w.p, trace);
    assert_eq!(notify.purpose, NotifyPurpose::Failure);
    assert_eq!(notify.failed_step.as_deref(), Some("workflow"));
    assert_eq!(
        notify.error.as_deref(),
        Some("The task asks for a database this repository does not have.")
    );
}

// ---------------------------------------------------------------------------------------------
// Pusher

#[tokio::test]
async fn pusher_consolidates_two_branches_and_opens_a_pr_that_closes_the_issue() {
    let fake = parser_crashes().await;
    let gh = github(&fake);
    let w = World::parser_and_tests(Some(gh.clone()));
    let trace = w.run_issue(12).await;
    let chain = w.p.chain(trace);
    assert_eq!(
        chain.iter().filter(|s| *s == "push:completed").count(),
        1,
        "{chain:?}"
    );
    let push = span_meta(&w.p, trace, "push");
    let branch = push["branch"].as_str().expect("branch").to_owned();
    assert_eq!(push["merged"].as_array().expect("merged").len(), 1);
    assert_eq!(push["prCreated"], json!(true));
    assert!(origin_file(&w.p.repo.origin, &branch, "parser.txt").contains("parser"));
    assert!(origin_file(&w.p.repo.origin, &branch, "tests.txt").contains("tests"));
    assert_eq!(fake.count(&Method::POST, "/pulls"), 1);
    let number = push["prNumber"].as_u64().expect("pr number");
    let pr = gh.get_pull_request(number).await.expect("pr");
    assert_eq!(pr.head_branch, branch);
    assert_eq!(pr.base_branch, "main");
    assert!(pr.title.starts_with("parser"), "{}", pr.title);
    assert!(pr.body.contains("Closes #12"), "{}", pr.body);
    assert!(
        pr.body.contains(rover::github::deliver::FOOTER_TEXT),
        "{}",
        pr.body
    );
    assert!(pr.body.contains("<!-- rover"), "{}", pr.body);
    let lower = pr.body.to_lowercase();
    assert!(
        !lower.contains("claude") && !lower.contains("co-authored-by"),
        "{}",
        pr.body
    );
    let notify = notify_of(&w.p, trace);
    assert_eq!(notify.purpose, NotifyPurpose::Pushed);
    assert_eq!(notify.pr_url.as_deref(), Some(pr.html_url.as_str()));
}

#[tokio::test]
async fn pusher_finds_the_existing_pr_instead_of_opening_another() {
    let fake = parser_crashes().await;
    fake.add_pull(31, "Fix the parser", BOT, "rover/parser", "0000000", "main");
    let gh = github(&fake);
    let w = World::parser(
        &push_script(),
        test_config(),
        Some(gh),
        write("parser.txt", "parser"),
    );
    let trace = w.run_issue(12).await;
    let push = span_meta(&w.p, trace, "push");
    assert_eq!(push["prNumber"], json!(31), "{push:?}");
    assert_eq!(push["prCreated"], json!(false));
    assert_eq!(fake.count(&Method::POST, "/pulls"), 0);
    assert!(notify_of(&w.p, trace)
        .pr_url
        .expect("pr url")
        .ends_with("/pull/31"));
    assert!(w.origin_has("rover/parser"));
}

#[tokio::test]
async fn pusher_rebases_onto_a_diverged_remote_and_never_forces() {
    // Every `git` the workspace runs goes through a wrapper that records its argv and whether
    // the token variable reached it.
    let commands = Arc::new(Mutex::new(PathBuf::new()));
    let recorded = commands.clone();
    let w = World::new_with(
        &push_script(),
        test_config(),
        None,
        vec![task("parser")],
        &[("parser", write("parser.txt", "parser"))],
        move |services, p| {
            let dir = p.repo.dir.path().join("wrapper");
            std::fs::create_dir_all(&dir).expect("mkdir");
            let log = p.repo.dir.path().join("git-commands.log");
            let real = String::from_utf8(
                std::process::Command::new("sh")
                    .args(["-c", "command -v git"])
                    .output()
                    .expect("sh")
                    .stdout,
            )
            .expect("utf-8");
            let wrapper = dir.join("git");
            write_executable(&wrapper, &format!(
                    "#!/bin/sh\nprintf '%s\\n' \"token=${{ROVER_GIT_TOKEN:+set}} $*\" >> '{}'\nexec '{}' \"$@\"\n",
                    log.display(),
                    real.trim()
                ));
            let path = format!(
                "{}:{}",
                dir.display(),
                std::env::var("PATH").unwrap_or_default()
            );
            services.git_env.push(("PATH".into(), path));
            services.github_token = Some(SECRET_TOKEN.into());
            *recorded.lock().expect("lock") = log;
        },
    );
    let origin = w.p.repo.origin.clone();
    git(&origin, &["config", "receive.denyNonFastForwards", "true"]);
    // Every ref update the remote accepts is logged by its update hook.
    let log = w.p.repo.dir.path().join("updates.log");
    let hook = origin.join("hooks").join("update");
    write_executable(
        &hook,
        &format!("#!/bin/sh\necho \"$1 $2 $3\" >> '{}'\n", log.display()),
    );
    // Someone else already pushed a commit to the task's branch.
    let other = w.p.repo.dir.path().join("other");
    git(
        w.p.repo.dir.path(),
        &["clone", "--quiet", origin.to_str().expect("utf-8"), "other"],
    );
    git(&other, &["checkout", "--quiet", "-b", "rover/parser"]);
    std::fs::write(other.join("notes.txt"), "by someone else\n").expect("write");
    git(&other, &["add", "-A"]);
    git(
        &other,
        &[
            "-c",
            "user.name=Other",
            "-c",
            "user.email=other@example.com",
            "commit",
            "--quiet",
            "-m",
            "Other work",
        ],
    );
    git(&other, &["push", "--quiet", "origin", "rover/parser"]);
    let theirs = git(&other, &["rev-parse", "HEAD"]);

    let trace = w.run_local("add a parser").await;
    assert_eq!(
        w.p.chain(trace).last().map(String::as_str),
        Some("notify:completed"),
        "{:?}",
        w.p.chain(trace)
    );
    let push = span_meta(&w.p, trace, "push");
    assert_eq!(push["rebased"], json!(true));
    // Their commit is kept under ours: the branch only moved forward.
    git(
        &origin,
        &[
            "merge-base",
            "--is-ancestor",
            &theirs,
            "refs/heads/rover/parser",
        ],
    );
    assert!(origin_file(&origin, "rover/parser", "parser.txt").contains("parser"));
    let updates = std::fs::read_to_string(&log).expect("update log");
    let lines: Vec<&str> = updates.lines().collect();
    assert_eq!(lines.len(), 2, "{updates}");
    for line in lines {
        let parts: Vec<&str> = line.split(' ').collect();
        let (old, new) = (parts[1], parts[2]);
        if old.chars().all(|c| c == '0') {
            continue;
        }
        git(&origin, &["merge-base", "--is-ancestor", old, new]);
    }
    // The commands: push rejected, pull --rebase, push again; never forced, token only in env.
    let log = commands.lock().expect("lock").clone();
    let commands = std::fs::read_to_string(&log).expect("git command log");
    let pushes: Vec<&str> = commands
        .lines()
        .filter(|l| l.split(' ').any(|w| w == "push"))
        .collect();
    assert_eq!(pushes.len(), 2, "{commands}");
    for push in &pushes {
        // On rover's registered git dir, hooks looked up nowhere while git holds the token.
        assert!(push.starts_with("token=set --git-dir="), "{push}");
        assert!(push.contains("-c core.hooksPath=/dev/null"), "{push}");
        assert!(
            push.ends_with("origin refs/heads/rover/parser:refs/heads/rover/parser"),
            "{push}"
        );
    }
    assert!(commands.contains("pull --rebase"), "{commands}");
    for forced in ["--force", " -f ", "+refs/", "--mirror", "--delete"] {
        assert!(!commands.contains(forced), "{forced} in {commands}");
    }
    assert!(!commands.contains(SECRET_TOKEN), "{commands}");
    let spans = serde_json::to_string(&w.p.trace(trace).spans).expect("json");
    assert!(!spans.contains(SECRET_TOKEN));
}

#[tokio::test]
/// A consolidation conflict fails the push (listing the files) and goes to the resolver; a
/// resolver that only answers `push` again, with nothing committed since, fails the trace
/// instead of looping.
async fn a_merge_conflict_goes_to_the_resolver_and_a_blind_push_fails_the_trace() {
    let w = World::new(
        &push_script(),
        test_config(),
        None,
        vec![task("parser"), task("lexer")],
        &[
            ("parser", write("shared.txt", "parser version")),
            ("lexer", write("shared.txt", "lexer version")),
        ],
    );
    let trace = w.run_local("add a parser and a lexer").await;
    let chain = w.p.chain(trace);
    assert!(chain.contains(&"push:failed".to_owned()), "{chain:?}");
    assert_eq!(chain.last().map(String::as_str), Some("notify:completed"));
    let view = w.p.trace(trace);
    let push = last_span(&view, "push");
    assert_eq!(push.status, SpanStatus::Failed);
    assert_eq!(push.meta["conflict"]["files"], json!(["shared.txt"]));
    let error = &push.meta["error"];
    assert_eq!(error["conflicts"], json!(["shared.txt"]), "{error}");
    assert!(error["message"]
        .as_str()
        .expect("message")
        .contains("shared.txt"));
    let resolve = last_span(&view, "resolve");
    assert_eq!(resolve.meta["quickExit"], json!("conflictUnchanged"));
    let notify = notify_of(&w.p, trace);
    assert_eq!(notify.purpose, NotifyPurpose::Failure);
    assert!(notify.error.expect("why").contains("still conflict"));
    // Nothing was pushed.
    assert!(!w.origin_has("rover/parser"));
    assert!(!w.origin_has("rover/lexer"));
}

#[tokio::test]
async fn pusher_pushes_a_local_event_without_a_pr() {
    let fake = FakeGitHub::start().await;
    let gh = github(&fake);
    let w = World::parser(
        &push_script(),
        test_config(),
        Some(gh),
        write("parser.txt", "parser"),
    );
    let (trace, _) = w
        .run_local_as(
            "add a parser",
            "event coordinate workflow commit resolve push notify",
        )
        .await;
    assert!(w.origin_has("rover/parser"));
    assert!(origin_file(&w.p.repo.origin, "rover/parser", "parser.txt").contains("parser"));
    assert!(fake.requests().is_empty(), "{:?}", fake.requests().len());
    let push = span_meta(&w.p, trace, "push");
    assert_eq!(push["prUrl"], Value::Null);
    assert_eq!(push["pullRequest"], json!("none: local event"));
    assert!(notify_of(&w.p, trace).pr_url.is_none());
}
