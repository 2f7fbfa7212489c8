//! The workflow, commit and cleanup steps on the real orchestrator: real git repositories, a
//! real Docker engine running the fake agent (installed as `/usr/local/bin/claude` in a rootfs
//! image), the fake agent on the host for commit messages.

use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use rover::config::RoverConfig;
use rover::orchestrator::{Finished, Outcome, Step, StepContext, StepError, StepOrchestrator};
use rover::sandbox::{
    ContainerStatus, DockerSandbox, GateSettings, Sandbox, SandboxError, SandboxLabels, SandboxSpec,
};
use rover::steps::cleanup::CleanupStep;
use rover::steps::commit::CommitStep;
use rover::steps::meta::{CleanupMeta, CommitMeta, TaskStatus, WorkflowMeta};
use rover::steps::tasks::{self, Task};
use rover::steps::workflow::{sweep_orphans, WorkflowStep};
use rover::steps::{NoopStep, Services};
use rover::store::{Action, Recovery, Span, SpanStatus, StepKind, StepRun, TaskMapping};
use serde_json::{json, Value};
use uuid::Uuid;

use crate::support::docker::{fake_agent_image, Around, Wrapped};
use crate::support::gitrepo::git;
use crate::support::pipeline::{last_span, sandbox_config, Pipeline, Sandboxed, SCRIPT_ENV};

const FAKE_TOKEN: &str = "ghp_fakeTOKENfakeTOKENfakeTOKEN1234";

/// Stands in for the resolver: finishes at once.
pub(crate) struct FakeResolveStep;

#[async_trait]
impl Step for FakeResolveStep {
    fn kind(&self) -> StepKind {
        StepKind::Resolve
    }
    fn max_parallel(&self) -> usize {
        1
    }
    async fn process(&self, _ctx: &StepContext, _run: &StepRun) -> Result<Outcome, StepError> {
        Ok(Outcome::Finished(Finished::completed("resolved (fake)")))
    }
}

fn unreachable() -> SandboxError {
    SandboxError::DaemonUnreachable {
        host: "unix:///nowhere/docker.sock".into(),
        source: bollard::errors::Error::IOError {
            err: std::io::Error::new(std::io::ErrorKind::NotFound, "no socket"),
        },
    }
}

/// An engine that does not answer once `down` is set (from the start, or mid-run).
struct Flaky {
    down: std::sync::atomic::AtomicBool,
}

impl Around for Flaky {
    fn before(&self) -> Result<(), SandboxError> {
        if self.down.load(std::sync::atomic::Ordering::SeqCst) {
            Err(unreachable())
        } else {
            Ok(())
        }
    }
}

/// Each container's env as it really got it, inspected as it starts (workflow containers are
/// removed once collected).
#[derive(Default)]
struct Envs(std::sync::Mutex<Vec<Vec<String>>>);

#[async_trait]
impl Around for Envs {
    async fn started(&self, engine: &DockerSandbox, id: &str) {
        let inspect = engine
            .client()
            .inspect_container(id, None)
            .await
            .expect("inspect a started container");
        let env = inspect.config.and_then(|c| c.env).unwrap_or_default();
        self.0.lock().expect("envs").push(env);
    }
}

pub(crate) fn env_allow() -> Vec<String> {
    [SCRIPT_ENV, "IS_SANDBOX", "ANTHROPIC_API_KEY"]
        .map(String::from)
        .to_vec()
}

pub(crate) async fn docker() -> Arc<DockerSandbox> {
    Arc::new(crate::support::docker::connect(env_allow()).await)
}

pub(crate) async fn agent_image(docker: &DockerSandbox) -> String {
    fake_agent_image(docker).await
}

pub(crate) fn config(image: &str, timeout_secs: u64, gates: Vec<GateSettings>) -> RoverConfig {
    sandbox_config(image, timeout_secs, env_allow(), gates)
}

/// One test's world: a sandboxed pipeline whose services hold a GitHub token (a task must never
/// see it), its containers removed on drop.
pub(crate) struct World(Sandboxed);

impl std::ops::Deref for World {
    type Target = Sandboxed;
    fn deref(&self) -> &Sandboxed {
        &self.0
    }
}

impl World {
    pub(crate) fn new() -> World {
        World(Sandboxed::new("wf-test").with_github_token(FAKE_TOKEN))
    }

    pub(crate) fn steps(services: &Arc<Services>, sandbox_script: &Value) -> Vec<Arc<dyn Step>> {
        vec![
            Arc::new(
                WorkflowStep::new(services.clone())
                    .with_sandbox_env(SCRIPT_ENV, sandbox_script.to_string())
                    .with_sandbox_env("GITHUB_TOKEN", FAKE_TOKEN),
            ),
            Arc::new(CommitStep::new(services.clone())),
            Arc::new(CleanupStep::new(services.clone())),
            Arc::new(FakeResolveStep),
            Arc::new(NoopStep),
        ]
    }

    /// A trace whose first action is `first`; more actions of the same trace via `enqueue`.
    pub(crate) fn trace_with(&self, kind: StepKind, meta: &Value) -> (Uuid, Action) {
        self.p.trace_with("workflow test", kind, meta)
    }

    /// Runs one task titled `title` through the workflow's steps, the agent in the sandbox
    /// scripted by `script`, until the pipeline settles: its trace, its action, and the
    /// orchestrator (for more).
    pub(crate) async fn run_task(
        &self,
        services: &Arc<Services>,
        script: &Value,
        title: &str,
    ) -> (Uuid, Action, StepOrchestrator) {
        let orch = self.p.orchestrator(World::steps(services, script));
        let (trace, action) = self.trace_with(StepKind::Workflow, &task(title, &[]));
        settle(&self.p, &orch).await;
        (trace, action, orch)
    }

    fn enqueue(&self, trace: Uuid, kind: StepKind, meta: &Value) -> Action {
        self.p.enqueue(trace, kind, meta)
    }
}

/// A world on the real engine: the engine (the fake agent's image built) and the services of a
/// workflow whose runs may take `timeout_secs`, committed by `commit_rule`.
pub(crate) async fn on_docker(timeout_secs: u64) -> (World, Arc<DockerSandbox>, Arc<Services>) {
    let w = World::new();
    let docker = docker().await;
    let image = agent_image(&docker).await;
    let services = w.services(
        &commit_rule(),
        config(&image, timeout_secs, Vec::new()),
        Some(docker.clone()),
    );
    (w, docker, services)
}

pub(crate) fn task(title: &str, depends_on: &[Uuid]) -> Value {
    serde_json::to_value(WorkflowMeta {
        title: title.to_owned(),
        description: format!("do {title}"),
        acceptance_criteria: vec!["it is done".into()],
        depends_on: depends_on.to_vec(),
        ..WorkflowMeta::default()
    })
    .expect("meta")
}

/// A sandbox rule: for the task titled `title`, write `files` and report `completed`.
pub(crate) fn writes(title: &str, files: &[(&str, &str)]) -> Value {
    let write: serde_json::Map<String, Value> = files
        .iter()
        .map(|(k, v)| ((*k).to_owned(), json!(v)))
        .collect();
    json!({"prompt_contains": format!("## Task: {title}"), "write": write,
        "structured": {"status": "completed", "summary": format!("{title} done"),
            "files_changed": files.iter().map(|(k, _)| *k).collect::<Vec<_>>()}})
}

/// The chain of a task whose work was committed (after its first span).
pub(crate) const COMMITTED: [&str; 3] = [
    "workflow:completed",
    "commit:completed",
    "resolve:completed",
];

pub(crate) fn commit_rule() -> Value {
    json!([{"prompt_contains": "", "structured": {"subject": "Add the greeting", "body": "Written by the task."}}])
}

/// Drains until nothing is queued and nothing runs (bounded).
pub(crate) async fn settle(p: &Pipeline, orch: &StepOrchestrator) {
    tokio::time::timeout(Duration::from_secs(120), async {
        loop {
            orch.drain().await.expect("drain");
            let pending = p.store.read_state().expect("state").pending.len();
            if pending == 0 && orch.in_flight() == 0 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(150)).await;
        }
    })
    .await
    .expect("the pipeline settles within two minutes");
}

pub(crate) fn chain_of(p: &Pipeline, trace: Uuid) -> Vec<String> {
    p.chain(trace).into_iter().skip(1).collect()
}

fn span_of(p: &Pipeline, trace: Uuid, action: Uuid) -> Span {
    p.trace(trace)
        .spans
        .into_iter()
        .rev()
        .find(|s| s.action_id == Some(action) && s.status.is_final())
        .expect("a finished span for the action")
}

/// The one `collect` span of the run `run_span` (a detached run's collection).
fn collection_of(p: &Pipeline, trace: Uuid, run_span: &Span) -> Span {
    let mut found: Vec<Span> = p
        .collections(trace)
        .into_iter()
        .filter(|s| s.parent_id == Some(run_span.id))
        .collect();
    assert_eq!(
        found.len(),
        1,
        "one collection of {}: {found:?}",
        run_span.id
    );
    found.remove(0)
}

fn produced(p: &Pipeline, trace: Uuid, span: &Span) -> Vec<Action> {
    p.trace(trace)
        .actions
        .into_iter()
        .filter(|a| a.span_id == span.id)
        .collect()
}

#[tokio::test]
async fn a_task_runs_in_a_container_and_is_committed_then_cleaned_up() {
    let w = World::new();
    let docker = docker().await;
    let image = agent_image(&docker).await;
    let inspecting = Arc::new(Wrapped {
        inner: docker.clone(),
        around: Envs::default(),
    });
    let services = w.services(
        &commit_rule(),
        config(&image, 300, Vec::new()),
        Some(inspecting.clone()),
    );
    let sandbox_script = json!([writes(
        "Greeting",
        &[("hello.txt", "hello from the sandbox\n")]
    )]);
    let (trace, wf, orch) = w.run_task(&services, &sandbox_script, "Greeting").await;

    assert_eq!(chain_of(&w.p, trace), COMMITTED);
    let view = w.p.trace(trace);
    let wf_span = last_span(&view, "workflow");
    let branch = wf_span.meta["branchName"]
        .as_str()
        .expect("branch")
        .to_owned();
    assert!(branch.starts_with("rover/"), "{branch}");
    assert_eq!(wf_span.meta["exitCode"], json!(0));
    assert_eq!(wf_span.meta["diff"]["files"], json!(["hello.txt"]));
    let log = PathBuf::from(wf_span.meta["logPath"].as_str().expect("log path"));
    assert!(std::fs::read_to_string(&log)
        .expect("agent log")
        .contains("\"type\":\"result\""));
    // The host committed the agent's file on the task branch, with the agent's message.
    assert_eq!(
        crate::support::gitrepo::show(&w.p.repo.checkout, &branch, "hello.txt"),
        "hello from the sandbox"
    );
    assert_eq!(
        git(&w.p.repo.checkout, &["log", "-1", "--format=%s", &branch]),
        "Add the greeting"
    );
    // Collected in a run of its own: a `collect` span below the workflow's, within its time.
    let collect = collection_of(&w.p, trace, &wf_span);
    assert_eq!(collect.status, SpanStatus::Completed);
    assert_eq!(collect.meta["containerId"], wf_span.meta["containerId"]);
    assert_eq!(
        collect.meta["containerStatus"],
        json!({"state": "exited", "code": 0, "oom_killed": false})
    );
    assert_eq!(collect.meta["taskStatus"], json!("completed"));
    assert_eq!(collect.meta["gates"], json!("none configured"));
    assert!(collect
        .summary
        .as_deref()
        .unwrap_or_default()
        .starts_with("collected: the run completed: "));
    assert!(collect.timestamp >= wf_span.timestamp && collect.completed <= wf_span.completed);
    let commit = last_span(&view, "commit");
    assert_eq!(commit.meta["committed"], json!(true));
    assert_eq!(commit.meta["messageSource"], json!("agent"));
    let resolve = produced(&w.p, trace, &commit);
    assert_eq!(resolve.len(), 1);
    assert_eq!(
        resolve[0].meta["workflowActionId"],
        json!(wf.id.to_string())
    );

    // Exactly one container ran, with no GitHub token in its environment (by name or value);
    // collected (its logs are in the artifacts, read above), it is gone.
    let envs = inspecting.around.0.lock().expect("envs").clone();
    assert_eq!(envs.len(), 1, "one container started: {envs:?}");
    let env = &envs[0];
    assert!(
        w.containers(&docker, wf.id).await.is_empty(),
        "the collected container was removed"
    );
    assert!(
        env.iter()
            .any(|e| e.starts_with("ROVER_FAKE_AGENT_SCRIPT=")),
        "{env:?}"
    );
    assert!(env.iter().any(|e| e == "IS_SANDBOX=1"), "{env:?}");
    assert!(
        !env.iter()
            .any(|e| e.contains("GITHUB_TOKEN") || e.contains(FAKE_TOKEN)),
        "{env:?}"
    );

    // Cleanup removes worktree, branch and mapping (the container is already gone)...
    let worktree = PathBuf::from(wf_span.meta["worktreePath"].as_str().expect("worktree"));
    assert!(worktree.exists());
    let cleanup_meta = serde_json::to_value(CleanupMeta {
        tasks: vec![wf.id],
        branch: None,
    })
    .expect("meta");
    let first = w.enqueue(trace, StepKind::Cleanup, &cleanup_meta);
    settle(&w.p, &orch).await;
    let span = span_of(&w.p, trace, first.id);
    assert_eq!(span.status, SpanStatus::Completed);
    let report = &span.meta["tasks"][0];
    assert_eq!(
        report["containers"]["result"],
        json!("alreadyGone"),
        "{report}"
    );
    for key in ["worktree", "branchRemoval", "mapping"] {
        assert_eq!(report[key]["result"], json!("removed"), "{key}: {report}");
    }
    assert!(w.containers(&docker, wf.id).await.is_empty());
    assert!(!worktree.exists());
    assert!(git(&w.p.repo.checkout, &["branch", "--list", &branch]).is_empty());
    assert!(tasks::load_task(&w.p.store, wf.id)
        .await
        .expect("state")
        .is_none());

    // ...and a second cleanup finds each already gone, still completing.
    let second = w.enqueue(trace, StepKind::Cleanup, &cleanup_meta);
    settle(&w.p, &orch).await;
    let span = span_of(&w.p, trace, second.id);
    assert_eq!(span.status, SpanStatus::Completed);
    let report = &span.meta["tasks"][0];
    assert_eq!(
        report["mapping"]["result"],
        json!("alreadyGone"),
        "{report}"
    );
    assert_eq!(
        report["branchRemoval"]["result"],
        json!("alreadyGone"),
        "{report}"
    );
}

#[tokio::test]
async fn a_dependent_task_forks_from_its_dependency_after_it_is_committed() {
    let (w, _docker, services) = on_docker(300).await;
    let sandbox_script = json!([
        writes("Alpha", &[("a.txt", "alpha\n")]),
        writes("Beta", &[("b.txt", "beta\n")]),
        writes("Gamma", &[("c.txt", "gamma\n")]),
        writes("Delta", &[("d.txt", "delta\n")]),
    ]);
    let orch = w.p.orchestrator(World::steps(&services, &sandbox_script));
    let (trace, a) = w.trace_with(StepKind::Workflow, &task("Alpha", &[]));
    let b = w.enqueue(trace, StepKind::Workflow, &task("Beta", &[a.id]));
    let c = w.enqueue(trace, StepKind::Workflow, &task("Gamma", &[]));
    let d = w.enqueue(trace, StepKind::Workflow, &task("Delta", &[b.id, c.id]));
    settle(&w.p, &orch).await;

    // Delta builds on both of its dependencies: forked from Beta's branch, Gamma's merged in.
    let d_span = span_of(&w.p, trace, d.id);
    assert_eq!(d_span.status, SpanStatus::Completed, "{:?}", d_span.summary);
    let d_branch = d_span.meta["branchName"].as_str().expect("branch");
    for (file, text) in [
        ("a.txt", "alpha"),
        ("b.txt", "beta"),
        ("c.txt", "gamma"),
        ("d.txt", "delta"),
    ] {
        assert_eq!(
            git(&w.p.repo.checkout, &["show", &format!("{d_branch}:{file}")]),
            text
        );
    }

    let a_span = span_of(&w.p, trace, a.id);
    let b_span = span_of(&w.p, trace, b.id);
    assert_eq!(a_span.status, SpanStatus::Completed);
    assert_eq!(b_span.status, SpanStatus::Completed);
    let a_commit = span_of(&w.p, trace, produced(&w.p, trace, &a_span).remove(0).id);
    assert_eq!(a_commit.meta["committed"], json!(true));
    // B started only after A's commit finished.
    assert!(b_span.timestamp >= a_commit.completed.expect("finished"));
    let b_branch = b_span.meta["branchName"].as_str().expect("branch");
    assert_eq!(
        git(&w.p.repo.checkout, &["show", &format!("{b_branch}:a.txt")]),
        "alpha"
    );
    assert_eq!(
        git(&w.p.repo.checkout, &["show", &format!("{b_branch}:b.txt")]),
        "beta"
    );
}

#[tokio::test]
async fn a_failed_dependency_fails_the_dependent_task_with_a_reason() {
    let (w, docker, services) = on_docker(300).await;
    let sandbox_script = json!([
        {"prompt_contains": "## Task: Alpha", "mode": "crash", "exit": 3, "text": "alpha cannot run"},
        writes("Beta", &[("b.txt", "beta\n")]),
    ]);
    let orch = w.p.orchestrator(World::steps(&services, &sandbox_script));
    let (trace, a) = w.trace_with(StepKind::Workflow, &task("Alpha", &[]));
    let b = w.enqueue(trace, StepKind::Workflow, &task("Beta", &[a.id]));
    settle(&w.p, &orch).await;

    let a_span = span_of(&w.p, trace, a.id);
    assert_eq!(a_span.status, SpanStatus::Failed);
    assert_eq!(a_span.meta["exitCode"], json!(3));
    assert!(a_span
        .summary
        .as_deref()
        .unwrap_or_default()
        .contains("code 3"));
    let b_span = span_of(&w.p, trace, b.id);
    assert_eq!(b_span.status, SpanStatus::Failed);
    let reason = b_span.summary.clone().unwrap_or_default();
    assert!(reason.contains("dependency `Alpha`"), "{reason}");
    // B never got a container; both hand over to commit, which records and goes to resolve.
    assert!(w.containers(&docker, b.id).await.is_empty());
    let chain = chain_of(&w.p, trace);
    assert_eq!(
        chain.iter().filter(|s| *s == "commit:completed").count(),
        2,
        "{chain:?}"
    );
    assert_eq!(
        chain.iter().filter(|s| *s == "resolve:completed").count(),
        2,
        "{chain:?}"
    );
    let commit = produced(&w.p, trace, &b_span).remove(0);
    let commit_span = span_of(&w.p, trace, commit.id);
    assert_eq!(commit_span.meta["committed"], json!(false));
    assert_eq!(commit_span.meta["taskStatus"], json!("failed"));
}

#[tokio::test]
async fn an_overdue_agent_is_killed_and_the_task_fails() {
    let (w, _docker, services) = on_docker(2).await;
    let sandbox_script = json!([{"prompt_contains": "## Task: Slow", "mode": "hang"}]);
    let (trace, wf, _orch) = w.run_task(&services, &sandbox_script, "Slow").await;

    assert_eq!(
        chain_of(&w.p, trace),
        ["workflow:failed", "commit:completed", "resolve:completed"]
    );
    let span = span_of(&w.p, trace, wf.id);
    assert_eq!(span.meta["timedOut"], json!(true));
    assert_eq!(span.meta["exitCode"], json!(137));
    assert!(span.summary.unwrap_or_default().contains("limit"));
}

#[tokio::test]
async fn a_required_gate_that_fails_fails_the_task_with_its_output() {
    let w = World::new();
    let docker = docker().await;
    let image = agent_image(&docker).await;
    let gates = vec![
        GateSettings {
            command: vec![
                "/bin/sh".into(),
                "-c".into(),
                "echo lint-broken; exit 4".into(),
            ],
            timeout_secs: 60,
            required: true,
        },
        GateSettings {
            command: vec!["/bin/sh".into(), "-c".into(), "test -f hello.txt".into()],
            timeout_secs: 60,
            required: true,
        },
    ];
    let services = w.services(
        &commit_rule(),
        config(&image, 300, gates),
        Some(docker.clone()),
    );
    let sandbox_script = json!([writes("Gated", &[("hello.txt", "hi\n")])]);
    let (trace, wf, _orch) = w.run_task(&services, &sandbox_script, "Gated").await;

    assert_eq!(
        chain_of(&w.p, trace),
        ["workflow:failed", "commit:completed", "resolve:completed"]
    );
    let span = span_of(&w.p, trace, wf.id);
    let results = &span.meta["gates"]["results"];
    assert_eq!(results[0]["outcome"], json!("failed"), "{results}");
    assert!(results[0]["output"]
        .as_str()
        .unwrap_or_default()
        .contains("lint-broken"));
    assert_eq!(results[1]["outcome"], json!("passed"), "{results}");
    assert!(span.summary.clone().unwrap_or_default().contains("gate"));
    // The gates ran inside the collection, whose span fails with the gate's command, exit
    // code and output.
    let collect = collection_of(&w.p, trace, &span);
    assert_eq!(collect.status, SpanStatus::Failed);
    assert_eq!(collect.meta["gates"]["results"], *results);
    let error = &collect.meta["error"];
    assert_eq!(
        error["message"],
        json!("the required gate `/bin/sh -c echo lint-broken; exit 4` failed with exit code 4")
    );
    assert_eq!(
        error["command"],
        json!(["/bin/sh", "-c", "echo lint-broken; exit 4"])
    );
    assert_eq!(error["exitCode"], json!(4));
    assert!(error["stderr"]
        .as_str()
        .unwrap_or_default()
        .contains("lint-broken"));
}

#[tokio::test]
async fn a_missing_image_is_an_error_span_that_still_reaches_resolve() {
    let w = World::new();
    let docker = docker().await;
    let services = w.services(
        &commit_rule(),
        config("rover-no-such-image:never", 300, Vec::new()),
        Some(docker.clone()),
    );
    let orch = w.p.orchestrator(World::steps(&services, &json!([])));
    let (trace, wf) = w.trace_with(StepKind::Workflow, &task("Nothing", &[]));
    settle(&w.p, &orch).await;

    assert_eq!(
        chain_of(&w.p, trace),
        ["workflow:error", "commit:completed", "resolve:completed"]
    );
    let span = span_of(&w.p, trace, wf.id);
    assert!(span.summary.unwrap_or_default().contains("not present"));
    assert_eq!(
        span.meta["error"]["image"],
        json!("rover-no-such-image:never")
    );
    assert!(w.containers(&docker, wf.id).await.is_empty());
}

#[tokio::test]
async fn no_sandbox_or_an_unreachable_engine_is_an_error_span_that_still_reaches_resolve() {
    let down = Wrapped {
        inner: docker().await,
        around: Flaky {
            down: std::sync::atomic::AtomicBool::new(true),
        },
    };
    for sandbox in [None, Some(Arc::new(down) as Arc<dyn Sandbox>)] {
        let unreachable = sandbox.is_some();
        let w = World::new();
        let services = w.services(
            &commit_rule(),
            config("any:image", 300, Vec::new()),
            sandbox,
        );
        let orch = w.p.orchestrator(World::steps(&services, &json!([])));
        let (trace, wf) = w.trace_with(StepKind::Workflow, &task("Nothing", &[]));
        settle(&w.p, &orch).await;

        let chain = chain_of(&w.p, trace);
        assert_eq!(
            chain[chain.len() - 3..],
            ["workflow:error", "commit:completed", "resolve:completed"],
            "{chain:?}"
        );
        let span = span_of(&w.p, trace, wf.id);
        let summary = span.summary.unwrap_or_default();
        if unreachable {
            // Retried (the engine may come back), then given up with the advice.
            assert!(chain.len() > 3, "{chain:?}");
            assert!(
                summary.contains("cannot reach the Docker engine"),
                "{summary}"
            );
        } else {
            assert_eq!(chain.len(), 3, "{chain:?}");
            assert!(
                summary.contains("no Docker sandbox is configured"),
                "{summary}"
            );
        }
    }
}

#[tokio::test]
async fn a_restarted_daemon_reattaches_to_the_running_container() {
    restart_with_container(false).await;
}

#[tokio::test]
async fn a_container_that_exited_while_rover_was_down_is_collected_not_rerun() {
    restart_with_container(true).await;
}

async fn restart_with_container(exited_while_down: bool) {
    let (w, docker, services) = on_docker(300).await;
    let mut rule = writes("Long", &[("long.txt", "done\n")]);
    if !exited_while_down {
        rule["delay_ms"] = json!(4000);
    }
    let sandbox_script = json!([rule]);
    let (trace, wf) = w.trace_with(StepKind::Workflow, &task("Long", &[]));
    {
        let first = w.p.orchestrator(World::steps(&services, &sandbox_script));
        // Start the workflow (one drain: no monitor runs after it), wait until its container
        // is up, then "crash" (drop without shutdown).
        first.drain().await.expect("drain");
        tokio::time::timeout(Duration::from_secs(60), async {
            loop {
                if first.in_flight() == 0 && !w.containers(&docker, wf.id).await.is_empty() {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        })
        .await
        .expect("the container starts");
    }
    let state = w.p.store.read_state().expect("state");
    let pending = state.pending_for(wf.id).expect("still claimed");
    let running = pending.running_span_id.expect("a running span");
    let container = &w.containers(&docker, wf.id).await[0].id;
    if exited_while_down {
        let status = docker.wait(container).await.expect("wait");
        assert!(
            matches!(status, ContainerStatus::Exited { code: 0, .. }),
            "{status:?}"
        );
    } else {
        assert_eq!(
            docker.status(container).await.expect("status"),
            ContainerStatus::Running
        );
    }

    // The daemon's start sweep leaves a container whose result is not recorded yet.
    let swept = sweep_orphans(&services, &w.p.store).await;
    assert!(
        swept.containers.is_empty() && swept.collected.is_empty(),
        "{swept:?}"
    );
    assert_eq!(w.containers(&docker, wf.id).await.len(), 1);

    let second = w.p.orchestrator(World::steps(&services, &sandbox_script));
    let recovered = second.recover().await.expect("recover");
    assert_eq!(recovered, vec![Recovery::StillRunning { span: running }]);
    settle(&w.p, &second).await;

    assert_eq!(chain_of(&w.p, trace), COMMITTED);
    let span = span_of(&w.p, trace, wf.id);
    assert_eq!(span.id, running);
    assert_eq!(span.meta["diff"]["files"], json!(["long.txt"]));
    // Collected from the first run's container (no second run), which is then removed.
    let log = PathBuf::from(span.meta["logPath"].as_str().expect("log path"));
    assert!(std::fs::read_to_string(&log)
        .expect("agent log")
        .contains("\"type\":\"result\""));
    assert!(w.containers(&docker, wf.id).await.is_empty());
}

#[tokio::test]
async fn a_collected_container_left_behind_is_removed_by_the_start_sweep() {
    // A crash after the result was recorded but before the container was removed (or a store
    // of an older version, which kept every container): the start sweep removes it.
    let (w, docker, services) = on_docker(300).await;
    let sandbox_script = json!([writes("Left", &[("left.txt", "x\n")])]);
    let (trace, wf, _orch) = w.run_task(&services, &sandbox_script, "Left").await;
    assert_eq!(span_of(&w.p, trace, wf.id).status, SpanStatus::Completed);
    assert!(w.containers(&docker, wf.id).await.is_empty());
    // Its container as a crash or an older version leaves it: exited, still there.
    let task = tasks::load_task(&w.p.store, wf.id)
        .await
        .expect("state")
        .expect("mapping");
    let mut spec = SandboxSpec::from_settings(
        &services.config.autopilot.sandbox,
        vec!["/bin/true".into()],
        task.mapping.worktree_path.as_deref().expect("worktree"),
        SandboxLabels {
            project: w.project.clone(),
            trace: trace.to_string(),
            action: wf.id.to_string(),
        },
    );
    spec.env.clear();
    let id = docker.run(&spec).await.expect("leftover container");
    docker.wait(&id).await.expect("exits");

    let report = sweep_orphans(&services, &w.p.store).await;
    assert_eq!(report.collected, vec![spec.container_name()], "{report:?}");
    assert!(report.containers.is_empty(), "{report:?}");
    assert!(report.errors.is_empty(), "{report:?}");
    assert!(w.containers(&docker, wf.id).await.is_empty());
    // The mapping and worktree stay (reclaimed by cleanup/gc).
    assert!(task.mapping.worktree_path.expect("worktree").exists());
}

#[tokio::test]
async fn a_killed_or_vanished_container_ends_the_task_and_still_reaches_resolve() {
    let (w, docker, services) = on_docker(300).await;
    let sandbox_script = json!([
        {"prompt_contains": "## Task: Killed", "mode": "killed"},
        {"prompt_contains": "## Task: Vanished", "mode": "hang"},
    ]);
    let orch = w.p.orchestrator(World::steps(&services, &sandbox_script));
    let (trace, killed) = w.trace_with(StepKind::Workflow, &task("Killed", &[]));
    let vanished = w.enqueue(trace, StepKind::Workflow, &task("Vanished", &[]));
    // Remove the hanging container by hand once it runs (not while only created: the step
    // starts a created container over, which is another story).
    tokio::time::timeout(Duration::from_secs(60), async {
        loop {
            orch.drain().await.expect("drain");
            let containers = w.containers(&docker, vanished.id).await;
            if let Some(c) = containers.iter().find(|c| c.state == "running") {
                docker.remove(&c.id).await.expect("remove");
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await
    .expect("the container starts");
    settle(&w.p, &orch).await;

    let span = span_of(&w.p, trace, killed.id);
    assert_eq!(span.status, SpanStatus::Failed);
    assert_eq!(span.meta["exitCode"], json!(137));
    assert_eq!(
        collection_of(&w.p, trace, &span).status,
        SpanStatus::Completed,
        "a killed agent's result is read: the collection went well"
    );
    let span = span_of(&w.p, trace, vanished.id);
    assert_eq!(span.status, SpanStatus::Error);
    assert!(span
        .summary
        .clone()
        .unwrap_or_default()
        .contains("disappeared"));
    // Its collection could not read the result: an error span saying why, with the container.
    let collect = collection_of(&w.p, trace, &span);
    assert_eq!(collect.status, SpanStatus::Error);
    assert_eq!(collect.meta["containerStatus"], json!({"state": "gone"}));
    let error = &collect.meta["error"];
    assert!(error["message"]
        .as_str()
        .unwrap_or_default()
        .contains("is gone: the agent's result cannot be read"));
    assert_eq!(error["container"], span.meta["containerId"]);
    for wf in [killed.id, vanished.id] {
        let span = span_of(&w.p, trace, wf);
        let commit = produced(&w.p, trace, &span).remove(0);
        let commit_span = span_of(&w.p, trace, commit.id);
        assert_eq!(commit_span.meta["committed"], json!(false));
        assert_eq!(
            produced(&w.p, trace, &commit_span)[0].action,
            StepKind::Resolve
        );
    }
}

#[tokio::test]
async fn an_iteration_reuses_the_task_branch_and_worktree() {
    let (w, _docker, services) = on_docker(300).await;
    let sandbox_script = json!([
        {"prompt_contains": "also add second.txt", "write": {"second.txt": "two\n"},
         "structured": {"status": "completed", "summary": "added second", "files_changed": ["second.txt"]}},
        writes("First", &[("first.txt", "one\n")]),
    ]);
    let (trace, first, orch) = w.run_task(&services, &sandbox_script, "First").await;
    let mut again: WorkflowMeta = serde_json::from_value(task("First", &[])).expect("meta");
    again.iterate_on = Some(first.id);
    again.instructions = Some("also add second.txt".into());
    let second = w.enqueue(
        trace,
        StepKind::Workflow,
        &serde_json::to_value(&again).expect("meta"),
    );
    settle(&w.p, &orch).await;

    let a = span_of(&w.p, trace, first.id);
    let b = span_of(&w.p, trace, second.id);
    assert_eq!(b.status, SpanStatus::Completed);
    assert_eq!(a.meta["branchName"], b.meta["branchName"]);
    assert_eq!(a.meta["worktreePath"], b.meta["worktreePath"]);
    let branch = b.meta["branchName"].as_str().expect("branch");
    let log = git(
        &w.p.repo.checkout,
        &["log", "--format=%s", &format!("main..{branch}")],
    );
    assert_eq!(log.lines().count(), 2, "{log}");
    assert_eq!(
        crate::support::gitrepo::show(&w.p.repo.checkout, branch, "first.txt"),
        "one"
    );
    assert_eq!(
        crate::support::gitrepo::show(&w.p.repo.checkout, branch, "second.txt"),
        "two"
    );
}

/// A worktree with a change and its task mapping, as the workflow step leaves them, plus a
/// trace with a `commit` action for it.
async fn seeded_commit(w: &World) -> (Uuid, Action, Task) {
    let ws = w.p.repo.workspace().await;
    let action_id = Uuid::new_v4();
    let path = Services::worktrees_dir(&w.p.store).join(action_id.to_string());
    let branch = format!("rover/seeded-{}", &action_id.simple().to_string()[..8]);
    let prepared = ws
        .prepare_worktree(&branch, rover::git::BranchBase::DefaultBranch, &path)
        .await
        .expect("worktree");
    std::fs::write(path.join("change.txt"), "changed\n").expect("write");
    let task = Task {
        action_id,
        mapping: TaskMapping {
            worktree_path: Some(prepared.path.clone()),
            fork_point: Some(prepared.fork_point),
            title: Some("Seeded change".into()),
            ..TaskMapping::new(&action_id.to_string(), &branch, Uuid::nil(), Uuid::nil())
        },
    };
    tasks::save_task(&w.p.store, &task).await.expect("mapping");
    let meta = serde_json::to_value(CommitMeta {
        workflow_action_id: Some(action_id),
        task_status: TaskStatus::Completed,
        summary: Some("changed a file".into()),
    })
    .expect("meta");
    let (trace, commit) = w.trace_with(StepKind::Commit, &meta);
    (trace, commit, task)
}

fn commit_only_steps(services: &Arc<Services>) -> Vec<Arc<dyn Step>> {
    vec![
        Arc::new(CommitStep::new(services.clone())),
        Arc::new(FakeResolveStep),
    ]
}

#[tokio::test]
async fn a_failing_pre_commit_hook_is_an_error_span_with_its_stderr() {
    let w = World::new();
    let hooks = w.p.repo.checkout.join(".git/hooks");
    std::fs::create_dir_all(&hooks).expect("hooks dir");
    let hook = hooks.join("pre-commit");
    std::fs::write(
        &hook,
        "#!/bin/sh\necho 'lint-tool: command not found' >&2\nexit 1\n",
    )
    .expect("hook");
    std::fs::set_permissions(&hook, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    // The agent is down: the fallback message is used. The hook runs on the host, as
    // `hooks: "host"` asks (by default it would need a sandbox, which this world has not).
    let mut config = crate::support::pipeline::test_config();
    config.autopilot.sandbox.hooks = rover::git::HookMode::Host;
    let services = w.services(&json!([{"mode": "crash", "exit": 2}]), config, None);
    let (trace, commit, task) = seeded_commit(&w).await;
    let orch = w.p.orchestrator(commit_only_steps(&services));
    settle(&w.p, &orch).await;

    assert_eq!(chain_of(&w.p, trace), ["commit:error", "resolve:completed"]);
    let span = span_of(&w.p, trace, commit.id);
    let error = &span.meta["error"];
    assert_eq!(error["exitCode"], json!(1), "{error}");
    assert!(error["stderr"]
        .as_str()
        .unwrap_or_default()
        .contains("lint-tool: command not found"));
    assert_eq!(error["command"][0], json!("git"), "{error}");
    assert!(error["command"]
        .as_array()
        .expect("argv")
        .iter()
        .any(|a| a == "commit"));
    assert!(!error["command"].to_string().contains("--no-verify"));
    assert_eq!(span.meta["messageSource"], json!("fallback"));
    // Nothing was committed; the change is still there for the resolver.
    assert_eq!(
        git(
            &w.p.repo.checkout,
            &["rev-parse", &task.mapping.branch_name]
        ),
        task.mapping.fork_point.clone().expect("fork point")
    );
    let resolve = produced(&w.p, trace, &span);
    assert_eq!(
        resolve[0].meta["workflowActionId"],
        json!(task.action_id.to_string())
    );
}

#[tokio::test]
async fn a_signing_failure_is_an_error_span_with_its_stderr() {
    let w = World::new();
    git(&w.p.repo.checkout, &["config", "commit.gpgsign", "true"]);
    git(
        &w.p.repo.checkout,
        &["config", "gpg.program", "/nonexistent/gpg"],
    );
    let services = w.services(
        &commit_rule(),
        crate::support::pipeline::test_config(),
        None,
    );
    let (trace, commit, _task) = seeded_commit(&w).await;
    let orch = w.p.orchestrator(commit_only_steps(&services));
    settle(&w.p, &orch).await;

    assert_eq!(chain_of(&w.p, trace), ["commit:error", "resolve:completed"]);
    let span = span_of(&w.p, trace, commit.id);
    let stderr = span.meta["error"]["stderr"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    assert!(
        stderr.contains("gpg") || stderr.contains("sign"),
        "{stderr}"
    );
    assert_ne!(span.meta["error"]["exitCode"], json!(0));
}

#[tokio::test]
async fn commit_uses_the_fallback_message_and_the_trailer_only_with_attribution() {
    let w = World::new();
    let config = RoverConfig {
        attribution: true,
        ..crate::support::pipeline::test_config()
    };
    let services = w.services(&json!([{"mode": "crash", "exit": 2}]), config, None);
    let (trace, commit, task) = seeded_commit(&w).await;
    let orch = w.p.orchestrator(commit_only_steps(&services));
    settle(&w.p, &orch).await;

    assert_eq!(
        chain_of(&w.p, trace),
        ["commit:completed", "resolve:completed"]
    );
    let span = span_of(&w.p, trace, commit.id);
    assert_eq!(span.meta["messageSource"], json!("fallback"));
    let message = git(
        &w.p.repo.checkout,
        &["log", "-1", "--format=%B", &task.mapping.branch_name],
    );
    assert!(
        message.starts_with("Seeded change\n\nchanged a file"),
        "{message}"
    );
    assert!(message.ends_with(rover::git::ROVER_TRAILER), "{message}");
    // A second commit action finds nothing left to commit and says so.
    let again = w.enqueue(
        trace,
        StepKind::Commit,
        &serde_json::to_value(CommitMeta {
            workflow_action_id: Some(task.action_id),
            task_status: TaskStatus::Completed,
            summary: None,
        })
        .expect("meta"),
    );
    settle(&w.p, &orch).await;
    let span = span_of(&w.p, trace, again.id);
    assert_eq!(span.status, SpanStatus::Completed);
    assert_eq!(span.meta["noChanges"], json!(true));
}

#[tokio::test]
async fn sweep_removes_unmapped_containers_and_worktrees_only() {
    let (w, docker, services) = on_docker(300).await;
    // A mapped task (kept) and an orphan container and worktree (removed).
    let (_trace, _commit, kept) = seeded_commit(&w).await;
    let orphan_dir = Services::worktrees_dir(&w.p.store).join("orphan-worktree");
    std::fs::create_dir_all(&orphan_dir).expect("orphan dir");
    let orphan_action = Uuid::new_v4();
    let mut spec = SandboxSpec::from_settings(
        &services.config.autopilot.sandbox,
        vec!["/bin/sleep".into(), "60".into()],
        &orphan_dir,
        SandboxLabels {
            project: w.project.clone(),
            trace: Uuid::new_v4().to_string(),
            action: orphan_action.to_string(),
        },
    );
    spec.env.clear();
    docker.run(&spec).await.expect("orphan container");
    // A shipped workspace's archive a kill left half fetched beside the kept worktree.
    let kept_path = kept.mapping.worktree_path.clone().expect("kept worktree");
    let archive = rover::sandbox::returned::sibling(&kept_path, "rover-returned.tar");
    std::fs::write(&archive, b"half a tar").expect("archive");

    let report = sweep_orphans(&services, &w.p.store).await;
    assert_eq!(report.containers, vec![spec.container_name()], "{report:?}");
    let mut expected = vec![orphan_dir.clone(), archive.clone()];
    expected.sort();
    assert_eq!(report.worktrees, expected, "{report:?}");
    assert!(report.errors.is_empty(), "{report:?}");
    assert!(!orphan_dir.exists());
    assert!(!archive.exists());
    assert!(kept.mapping.worktree_path.expect("kept worktree").exists());
    assert!(w.containers(&docker, orphan_action).await.is_empty());
}

#[tokio::test]
async fn at_most_three_sandboxes_run_at_once() {
    let (w, _docker, services) = on_docker(300).await;
    let titles = ["One", "Two", "Three", "Four"];
    let rules: Vec<Value> = titles
        .iter()
        .map(|t| {
            let mut rule = writes(t, &[(&format!("{t}.txt"), "x\n")]);
            rule["delay_ms"] = json!(1500);
            rule
        })
        .collect();
    let orch = w.p.orchestrator(World::steps(&services, &json!(rules)));
    let (trace, first) = w.trace_with(StepKind::Workflow, &task(titles[0], &[]));
    let mut ids = vec![first.id];
    for t in &titles[1..] {
        ids.push(w.enqueue(trace, StepKind::Workflow, &task(t, &[])).id);
    }
    let mut saw_wait = false;
    tokio::time::timeout(Duration::from_secs(120), async {
        loop {
            orch.drain().await.expect("drain");
            saw_wait |= orch.waiting().values().any(|r| r.contains("still running"));
            let pending = w.p.store.read_state().expect("state").pending.len();
            if pending == 0 && orch.in_flight() == 0 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await
    .expect("settles");
    assert!(saw_wait, "the fourth task waited for a slot");
    let mut spans: Vec<Span> = ids.iter().map(|id| span_of(&w.p, trace, *id)).collect();
    assert!(spans.iter().all(|s| s.status == SpanStatus::Completed));
    spans.sort_by_key(|s| s.timestamp);
    let first_done = spans[..3]
        .iter()
        .filter_map(|s| s.completed)
        .min()
        .expect("finished");
    assert!(
        spans[3].timestamp >= first_done,
        "the fourth started before a slot was free"
    );
}

#[tokio::test]
async fn an_agent_out_of_memory_fails_the_task_saying_so() {
    let w = World::new();
    let docker = docker().await;
    let image = agent_image(&docker).await;
    let mut config = config(&image, 300, Vec::new());
    config.autopilot.sandbox.memory_mb = 16;
    let services = w.services(&commit_rule(), config, Some(docker.clone()));
    let sandbox_script =
        json!([{"prompt_contains": "## Task: Hungry", "mode": "huge_line", "bytes": 200_000_000}]);
    let (trace, wf, _orch) = w.run_task(&services, &sandbox_script, "Hungry").await;

    assert_eq!(
        chain_of(&w.p, trace),
        ["workflow:failed", "commit:completed", "resolve:completed"]
    );
    let span = span_of(&w.p, trace, wf.id);
    assert_eq!(span.meta["exitCode"], json!(137));
    assert_eq!(span.meta["oomKilled"], json!(true));
    assert!(span.summary.unwrap_or_default().contains("out of memory"));
}

#[tokio::test]
async fn an_engine_that_goes_away_mid_run_ends_the_task_after_its_time_limit() {
    let w = World::new();
    let docker = docker().await;
    let image = agent_image(&docker).await;
    let flaky = Arc::new(Wrapped {
        inner: docker.clone(),
        around: Flaky {
            down: std::sync::atomic::AtomicBool::new(false),
        },
    });
    let services = w.services(
        &commit_rule(),
        config(&image, 2, Vec::new()),
        Some(flaky.clone()),
    );
    let sandbox_script = json!([{"prompt_contains": "## Task: Orphaned", "mode": "hang"}]);
    let orch = w.p.orchestrator(World::steps(&services, &sandbox_script));
    let (trace, wf) = w.trace_with(StepKind::Workflow, &task("Orphaned", &[]));
    orch.drain().await.expect("drain");
    tokio::time::timeout(Duration::from_secs(60), async {
        while orch.in_flight() > 0 || w.containers(&docker, wf.id).await.is_empty() {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await
    .expect("the container starts");
    flaky
        .around
        .down
        .store(true, std::sync::atomic::Ordering::SeqCst);
    settle(&w.p, &orch).await;

    assert_eq!(
        chain_of(&w.p, trace),
        ["workflow:error", "commit:completed", "resolve:completed"]
    );
    let span = span_of(&w.p, trace, wf.id);
    let summary = span.summary.unwrap_or_default();
    assert!(
        summary.contains("cannot check the sandbox container"),
        "{summary}"
    );
    assert!(
        summary.contains("cannot reach the Docker engine"),
        "{summary}"
    );
}

#[tokio::test]
async fn a_worktree_whose_git_file_changed_is_refused_as_tampered_and_nothing_is_committed() {
    let w = World::new();
    let services = w.services(
        &json!([{"structured": {"subject": "Commit the change", "body": null}}]),
        crate::support::pipeline::test_config(),
        None,
    );
    let (trace, commit, task) = seeded_commit(&w).await;
    // What a sandbox would have done had it been able to: point `.git` at a repository of its own.
    let worktree = task.mapping.worktree_path.clone().expect("worktree");
    std::fs::write(worktree.join(".git"), "gitdir: /workspace/.evil\n").expect("tamper");
    let orch = w.p.orchestrator(commit_only_steps(&services));
    settle(&w.p, &orch).await;

    assert_eq!(chain_of(&w.p, trace), ["commit:error", "resolve:completed"]);
    let span = span_of(&w.p, trace, commit.id);
    assert_eq!(span.meta["tampered"], json!(true), "{:?}", span.meta);
    assert_eq!(span.meta["committed"], json!(false));
    assert!(span
        .summary
        .as_deref()
        .unwrap_or_default()
        .contains("tampered"));
    assert_eq!(span.meta["error"]["tampered"], json!(true));
    assert_eq!(span.meta["error"]["retryable"], json!(false));
    // Nothing was committed, and no agent was asked for a message.
    assert_eq!(
        git(
            &w.p.repo.checkout,
            &["rev-parse", &task.mapping.branch_name]
        ),
        task.mapping.fork_point.clone().expect("fork point")
    );
    assert!(w.p.agents.calls().is_empty());
}

/// A detached run is collected when its container ends, not at the daemon's next fallback tick:
/// the agent's follower wakes the orchestrator. The loop here sleeps an hour between drains
/// unless something wakes it, so a run left to the timer would never be collected in time.
#[tokio::test]
async fn an_ended_run_is_collected_at_once_not_at_the_fallback_tick() {
    let (w, _docker, services) = on_docker(300).await;
    // The agent works for 3 s: every drain the launch causes looks at it while it runs.
    let mut rule = writes("Woken", &[("woken.txt", "collected at once\n")]);
    rule["delay_ms"] = json!(3000);
    let sandbox_script = json!([rule]);
    let orch = crate::support::orch::orchestrator(
        &w.p.store,
        World::steps(&services, &sandbox_script),
        (
            Duration::from_secs(3600),
            Duration::from_millis(50),
            Duration::from_secs(5),
        ),
    );
    let (trace, _) = w.trace_with(StepKind::Workflow, &task("Woken", &[]));
    let shutdown = tokio_util::sync::CancellationToken::new();
    let daemon = tokio::spawn({
        let orch = orch.clone();
        let shutdown = shutdown.clone();
        async move { orch.run(shutdown).await }
    });
    crate::support::orch::wait_until(
        120,
        100,
        "the ended run collected and committed without the fallback timer",
        || chain_of(&w.p, trace) == COMMITTED,
    )
    .await;
    shutdown.cancel();
    daemon.await.expect("the loop").expect("the store");
    let collected = collection_of(&w.p, trace, &last_span(&w.p.trace(trace), "workflow"));
    assert_eq!(
        collected.status,
        SpanStatus::Completed,
        "{:?}",
        collected.summary
    );
}
