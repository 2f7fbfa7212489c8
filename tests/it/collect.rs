//! Collecting a detached run as a run of its own (`orchestrator::collect`), on the real
//! orchestrator and store with in-process steps: the `collect` span below the run's span, a
//! collection that fails (an error with its command, exit code and stderr; a panic) failing its
//! span and the run forward, a retryable failure collected again, the drain going on while a
//! collection runs, and a collection cut off by a shutdown or a crash collected again.
//! The workflow step's collections on a real Docker engine are in `steps_workflow`.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use rover::orchestrator::{
    is_collection, Collected, Completion, Finished, NextAction, Outcome, Step, StepContext,
    StepError, StepOrchestrator,
};
use rover::store::{AutopilotStore, PendingAction, Span, SpanStatus, StepKind, StepRun};
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use crate::support::common::env_and_store;
use crate::support::orch::{orchestrator, run_until_idle, submit_local as submit, wait_until};

/// Turns the event's first action (coordinate) into a workflow, and a commit into nothing.
struct Passing(StepKind, Option<StepKind>);

#[async_trait]
impl Step for Passing {
    fn kind(&self) -> StepKind {
        self.0.clone()
    }
    fn max_parallel(&self) -> usize {
        3
    }
    async fn process(&self, _ctx: &StepContext, run: &StepRun) -> Result<Outcome, StepError> {
        let mut finished = Finished::completed(format!("{} done", self.0));
        if let Some(next) = &self.1 {
            finished = finished.then(NextAction::new(next.clone(), "next"));
        }
        // A commit records what it was handed: the workflow's error when the collection failed.
        if self.0 == StepKind::Commit {
            finished.summary = format!("commit of: {}", run.action.reason);
        }
        Ok(Outcome::Finished(finished))
    }
}

type CollectFn = dyn Fn(usize) -> Result<Collected, StepError> + Send + Sync;

/// Detaches every run; `monitor` reports each claimed run ended once `ended` is set; `collect`
/// waits for a permit of `gate` (when given), then answers as `answer` says for its n-th call.
struct Detaching {
    ended: Arc<std::sync::atomic::AtomicBool>,
    gate: Option<Arc<Semaphore>>,
    calls: Arc<AtomicUsize>,
    answer: Arc<CollectFn>,
}

#[async_trait]
impl Step for Detaching {
    fn kind(&self) -> StepKind {
        StepKind::Workflow
    }
    fn max_parallel(&self) -> usize {
        3
    }
    fn detached_holds_slot(&self) -> bool {
        true
    }
    async fn process(&self, _ctx: &StepContext, _run: &StepRun) -> Result<Outcome, StepError> {
        Ok(Outcome::Detached {
            meta: rover::store::Meta::new(),
        })
    }
    async fn monitor(&self, ctx: &StepContext) -> Result<Vec<Completion>, StepError> {
        if !self.ended.load(Ordering::SeqCst) {
            return Ok(Vec::new());
        }
        let state = ctx
            .store
            .read_state()
            .map_err(|e| StepError::from_error(&e, true))?;
        Ok(state
            .pending
            .iter()
            .filter(|p| p.action == StepKind::Workflow && p.running_span_id.is_some())
            .filter(|p| !ctx.in_process(p.action_id))
            .map(|p| Completion::new(p.action_id, "collecting: the container exited"))
            .collect())
    }
    async fn collect(
        &self,
        _ctx: &StepContext,
        _run: &StepRun,
        _ended: &Completion,
    ) -> Result<Collected, StepError> {
        let n = self.calls.fetch_add(1, Ordering::SeqCst) + 1;
        if let Some(gate) = &self.gate {
            gate.acquire().await.expect("open").forget();
        }
        (self.answer)(n)
    }
    async fn still_running(&self, _ctx: &StepContext, _p: &PendingAction, _s: &Span) -> bool {
        true
    }
}

struct Setup {
    ended: Arc<std::sync::atomic::AtomicBool>,
    gate: Option<Arc<Semaphore>>,
    calls: Arc<AtomicUsize>,
    answer: Arc<CollectFn>,
}

impl Setup {
    fn new(answer: impl Fn(usize) -> Result<Collected, StepError> + Send + Sync + 'static) -> Self {
        Setup {
            ended: Arc::new(std::sync::atomic::AtomicBool::new(true)),
            gate: None,
            calls: Arc::new(AtomicUsize::new(0)),
            answer: Arc::new(answer),
        }
    }

    fn orchestrator(&self, store: &AutopilotStore) -> StepOrchestrator {
        let steps: Vec<Arc<dyn Step>> = vec![
            Arc::new(Passing(StepKind::Coordinate, Some(StepKind::Workflow))),
            Arc::new(Detaching {
                ended: self.ended.clone(),
                gate: self.gate.clone(),
                calls: self.calls.clone(),
                answer: self.answer.clone(),
            }),
            Arc::new(Passing(StepKind::Commit, None)),
            Arc::new(Passing(StepKind::Noop, None)),
        ];
        orchestrator(
            store,
            steps,
            (
                Duration::from_millis(50),
                Duration::from_millis(20),
                Duration::from_millis(300),
            ),
        )
    }
}

impl Setup {
    /// Runs `orch`'s loop in a task of its own until the first collection has started: the
    /// token that stops the loop, and its task.
    async fn run_until_collecting(
        &self,
        orch: &StepOrchestrator,
    ) -> (
        CancellationToken,
        tokio::task::JoinHandle<Result<(), rover::store::StoreError>>,
    ) {
        let stop = CancellationToken::new();
        let running = tokio::spawn({
            let (orch, stop) = (orch.clone(), stop.clone());
            async move { orch.run(stop).await }
        });
        wait_until(30, 10, "the collection starts", || {
            self.calls.load(Ordering::SeqCst) != 0
        })
        .await;
        (stop, running)
    }
}

async fn settle(orch: &StepOrchestrator) {
    run_until_idle(orch, 30, "settles").await;
}

fn spans(store: &AutopilotStore, trace: Uuid) -> Vec<Span> {
    store.load_trace(trace).unwrap().spans
}

fn one(store: &AutopilotStore, trace: Uuid, step: &str) -> Vec<Span> {
    spans(store, trace)
        .into_iter()
        .filter(|s| s.step.as_str() == step)
        .collect()
}

fn done(summary: &str) -> Collected {
    Collected::of(Finished::completed(summary).then(NextAction::new(StepKind::Commit, "commit")))
}

#[tokio::test]
async fn a_collection_that_fails_is_an_error_span_with_the_whole_error_and_the_run_fails_forward() {
    let (_env, store) = env_and_store();
    let setup = Setup::new(|_| {
        Err(StepError::fatal("cannot read the agent's result")
            .detail("command", ["docker", "logs", "rover-c"])
            .detail("exitCode", 1)
            .detail("stderr", "Error: No such container: rover-c"))
    });
    let orch = setup.orchestrator(&store);
    let trace = submit(&store, "task");
    settle(&orch).await;

    let collect = one(&store, trace, "collect").remove(0);
    let workflow = one(&store, trace, "workflow").remove(0);
    assert_eq!(collect.status, SpanStatus::Error);
    assert_eq!(collect.parent_id, Some(workflow.id));
    let error = &collect.meta["error"];
    assert_eq!(error["message"], "cannot read the agent's result");
    assert_eq!(error["command"][0], "docker");
    assert_eq!(error["exitCode"], 1);
    assert_eq!(error["stderr"], "Error: No such container: rover-c");
    // The run fails forward with the error, naming its collection: the commit is handed it.
    assert_eq!(workflow.status, SpanStatus::Error);
    let message = workflow.meta["error"]["message"].as_str().unwrap();
    assert!(
        message.starts_with("collecting this run failed (collect span "),
        "{message}"
    );
    assert!(
        message.ends_with("cannot read the agent's result"),
        "{message}"
    );
    assert_eq!(
        workflow.meta["error"]["stderr"],
        "Error: No such container: rover-c"
    );
    assert_eq!(
        one(&store, trace, "commit")[0].status,
        SpanStatus::Completed
    );
    assert_eq!(
        setup.calls.load(Ordering::SeqCst),
        1,
        "a fatal error is not retried"
    );
    assert_eq!(orch.internal_errors(), 1);

    // `rover autopilot trace` shows it below the run, with its error in full.
    let text = rover::trace::render_tree(
        &store.load_trace(trace).unwrap(),
        rover::trace::Style { color: false },
        chrono::Utc::now(),
        rover::steps::kinds::ends_trace,
    );
    let at = text.find("collect ").expect(&text);
    let below = &text[at..];
    assert!(
        below.contains("error: cannot read the agent's result"),
        "{text}"
    );
    assert!(below.contains("command: docker logs rover-c"), "{text}");
    assert!(below.contains("exit code: 1"), "{text}");
    assert!(
        below.contains("Error: No such container: rover-c"),
        "{text}"
    );
}

#[tokio::test]
async fn a_collection_that_panics_is_an_error_span_and_the_run_fails_forward() {
    let (_env, store) = env_and_store();
    let setup = Setup::new(|_| panic!("the log parser fell over"));
    let orch = setup.orchestrator(&store);
    let trace = submit(&store, "task");
    settle(&orch).await;

    let collect = one(&store, trace, "collect").remove(0);
    assert_eq!(collect.status, SpanStatus::Error);
    let message = collect.meta["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("panicked: the log parser fell over"),
        "{message}"
    );
    assert_eq!(collect.meta["error"]["panic"], true);
    assert_eq!(one(&store, trace, "workflow")[0].status, SpanStatus::Error);
    assert_eq!(
        one(&store, trace, "commit")[0].status,
        SpanStatus::Completed
    );
}

#[tokio::test]
async fn a_retryable_collection_failure_is_collected_again_within_the_attempts() {
    let (_env, store) = env_and_store();
    let setup = Setup::new(|n| {
        if n == 1 {
            Err(StepError::retryable("the engine did not answer"))
        } else {
            Ok(done("the agent finished"))
        }
    });
    let orch = setup.orchestrator(&store);
    let trace = submit(&store, "task");
    tokio::time::timeout(Duration::from_secs(30), async {
        while one(&store, trace, "commit").is_empty() {
            orch.drain().await.unwrap();
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("collected again");
    settle(&orch).await;

    let collects = one(&store, trace, "collect");
    assert_eq!(collects.len(), 2, "{collects:?}");
    assert_eq!(collects[0].status, SpanStatus::Error);
    assert!(collects[0].meta["retryAt"].is_string());
    assert!(collects[0]
        .summary
        .as_deref()
        .unwrap()
        .contains("the run is collected again (attempt 1 of 3)"));
    assert_eq!(collects[1].status, SpanStatus::Completed);
    assert_eq!(collects[1].meta["attempt"], 2);
    let workflow = one(&store, trace, "workflow").remove(0);
    assert_eq!(workflow.status, SpanStatus::Completed);
    assert!(collects.iter().all(|c| c.parent_id == Some(workflow.id)));
}

#[tokio::test]
async fn the_drain_goes_on_while_a_collection_runs() {
    let (env, store) = env_and_store();
    let mut setup = Setup::new(|_| Ok(done("the agent finished")));
    let gate = Arc::new(Semaphore::new(0));
    setup.gate = Some(gate.clone());
    let orch = setup.orchestrator(&store);
    let first = submit(&store, "slow collection");
    // The first trace's run detaches and its collection starts, then blocks.
    let (stop, running) = setup.run_until_collecting(&orch).await;
    let collect = one(&store, first, "collect").remove(0);
    assert_eq!(collect.status, SpanStatus::Running, "listed while it runs");
    assert_eq!(
        collect.summary.as_deref(),
        Some("collecting: the container exited")
    );
    // `status` shows it under its run, as a person sees it.
    let run = collect.parent_id.expect("under the run's span");
    let out = env.rover(&["autopilot", "status"]);
    let text = crate::support::env::stdout(&out);
    assert!(
        text.contains(&format!(
            "collect  {} of run {} of trace {}",
            &collect.id.to_string()[..8],
            &run.to_string()[..8],
            &first.to_string()[..8]
        )) && text.contains("collecting: the container exited"),
        "{text}"
    );
    let out = env.rover(&["autopilot", "status", "--json"]);
    let status: serde_json::Value =
        serde_json::from_slice(&out.stdout).expect("status --json is JSON");
    assert_eq!(
        status["collecting"][0]["spanId"],
        serde_json::json!(collect.id),
        "{status}"
    );
    assert_eq!(status["collecting"][0]["runSpanId"], serde_json::json!(run));
    // Meanwhile a second trace runs through to its own detached run, and its collection too.
    let second = submit(&store, "another");
    tokio::time::timeout(Duration::from_secs(30), async {
        while one(&store, second, "collect").is_empty() {
            orch.wake();
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .expect("the drain goes on while a collection runs");
    assert_eq!(
        one(&store, first, "workflow")[0].status,
        SpanStatus::Running
    );
    gate.add_permits(2);
    wait_until(30, 10, "both are collected", || {
        !(one(&store, first, "commit").is_empty() || one(&store, second, "commit").is_empty())
    })
    .await;
    stop.cancel();
    running.await.unwrap().unwrap();
    for trace in [first, second] {
        assert_eq!(
            one(&store, trace, "collect")[0].status,
            SpanStatus::Completed
        );
        assert_eq!(
            one(&store, trace, "workflow")[0].status,
            SpanStatus::Completed
        );
    }
}

#[tokio::test]
async fn a_collection_cut_off_by_a_shutdown_is_closed_and_collected_again() {
    let (_env, store) = env_and_store();
    let mut setup = Setup::new(|_| Ok(done("the agent finished")));
    setup.gate = Some(Arc::new(Semaphore::new(0))); // never lets the first collection finish
    let orch = setup.orchestrator(&store);
    let trace = submit(&store, "task");
    let (stop, running) = setup.run_until_collecting(&orch).await;
    stop.cancel();
    running.await.unwrap().unwrap();
    let cut = one(&store, trace, "collect").remove(0);
    assert_eq!(cut.status, SpanStatus::Error);
    assert_eq!(cut.meta["interrupted"], true);
    assert!(cut
        .summary
        .unwrap()
        .contains("collected again at the next start"));
    // The run is still claimed: nothing of it was lost or handed over.
    assert_eq!(
        one(&store, trace, "workflow")[0].status,
        SpanStatus::Running
    );
    assert!(one(&store, trace, "commit").is_empty());

    // The next start collects it again.
    let setup = Setup::new(|_| Ok(done("the agent finished")));
    let orch = setup.orchestrator(&store);
    orch.recover().await.unwrap();
    settle(&orch).await;
    let collects = one(&store, trace, "collect");
    assert_eq!(collects.len(), 2);
    assert_eq!(collects[1].status, SpanStatus::Completed);
    assert_eq!(collects[1].meta["attempt"], 2);
    assert_eq!(
        one(&store, trace, "workflow")[0].status,
        SpanStatus::Completed
    );
}

/// A daemon killed mid-collection (its runtime dropped with the collection running, as a
/// crash leaves it): the next start closes the cut-off collection and collects the run again.
#[test]
fn a_collection_cut_off_by_a_crash_is_closed_at_the_next_start_and_collected_again() {
    crash_mid_collection(false);
}

/// The crash came between writing the collection's span file and listing it in its trace: the
/// next start still finds it (its id follows from the run's span and the attempt), closes it,
/// lists it, and collects the run again.
#[test]
fn a_collection_whose_span_a_crash_left_unlisted_is_found_closed_and_listed_at_the_next_start() {
    crash_mid_collection(true);
}

fn crash_mid_collection(unlisted: bool) {
    let (_env, store) = env_and_store();
    let trace = submit(&store, "task");
    let mut setup = Setup::new(|_| Ok(done("the agent finished")));
    setup.gate = Some(Arc::new(Semaphore::new(0)));
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let orch = setup.orchestrator(&store);
        tokio::time::timeout(Duration::from_secs(30), async {
            while setup.calls.load(Ordering::SeqCst) == 0 {
                orch.drain().await.unwrap();
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
        .await
        .expect("the collection starts");
    });
    runtime.shutdown_background(); // the crash: nothing of the collection closes
    let left = one(&store, trace, "collect").remove(0);
    assert_eq!(left.status, SpanStatus::Running);
    if unlisted {
        // As if the crash came before the trace listed it: its file alone is left.
        let path = store.trace_index_path(trace);
        let mut index: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
        index["spans"]
            .as_array_mut()
            .unwrap()
            .retain(|id| id.as_str() != Some(left.id.to_string().as_str()));
        std::fs::write(&path, serde_json::to_vec(&index).unwrap()).unwrap();
        assert!(one(&store, trace, "collect").is_empty(), "unlisted");
        assert!(store.span_path(left.id).is_file());
    }

    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let setup = Setup::new(|_| Ok(done("the agent finished")));
        let orch = setup.orchestrator(&store);
        let recovered = orch.recover().await.unwrap();
        assert!(
            matches!(
                recovered.as_slice(),
                [rover::store::Recovery::StillRunning { .. }]
            ),
            "{recovered:?}"
        );
        settle(&orch).await;
    });
    let collects = one(&store, trace, "collect");
    assert_eq!(collects.len(), 2, "{collects:?}");
    assert_eq!(collects[0].id, left.id);
    assert_eq!(collects[0].status, SpanStatus::Error);
    assert_eq!(collects[0].meta["interrupted"], true);
    assert!(collects[0]
        .summary
        .as_deref()
        .unwrap()
        .starts_with("interrupted: rover stopped before this collection finished"));
    assert_eq!(collects[1].status, SpanStatus::Completed);
    assert_eq!(
        one(&store, trace, "workflow")[0].status,
        SpanStatus::Completed
    );
    assert_eq!(one(&store, trace, "commit").len(), 1, "handed over once");
    assert!(spans(&store, trace)
        .iter()
        .filter(|s| is_collection(s))
        .all(|s| s.status.is_final()));
}
