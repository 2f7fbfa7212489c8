//! The orchestrator with in-process test steps: eager cascading, `maxParallel`, per-trace
//! exclusivity, fail forward from errors and panics, dead letters, retries with backoff,
//! readiness waits, detached work finished by `monitor`, and restart recovery.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use rover::orchestrator::{
    Collected, Completion, Finished, NextAction, OrchestratorSettings, Outcome, Readiness, Step,
    StepContext, StepError, StepOrchestrator,
};
use rover::store::{
    AutopilotStore, PendingAction, Span, SpanStatus, StepKind, StepRun, TraceOutcome,
};
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use crate::support::chain::steps as expected;
use crate::support::common::env_and_store;
use crate::support::orch::{run_until_idle, submit_local as submit, wait_until};

type Behaviour = Arc<dyn Fn(&StepRun, usize) -> Result<Outcome, StepError> + Send + Sync>;

/// A configurable test step that records how many of its runs overlap.
struct TestStep {
    kind: StepKind,
    max: usize,
    exclusive: bool,
    delay: Duration,
    behaviour: Behaviour,
    runs: AtomicUsize,
    now: AtomicUsize,
    peak: AtomicUsize,
    per_trace: Mutex<HashMap<Uuid, usize>>,
    trace_peak: AtomicUsize,
    /// When set, `ready` keeps the step's actions waiting until it holds true.
    open: Option<Arc<std::sync::atomic::AtomicBool>>,
    /// Which scheduled actions a signal makes due (`Step::woken_by`); none when unset.
    woken_by: Option<fn(&rover::store::Action, &rover::intake::Signal) -> bool>,
}

impl TestStep {
    fn new(kind: StepKind, max: usize, behaviour: Behaviour) -> TestStep {
        TestStep {
            kind,
            max,
            exclusive: false,
            delay: Duration::ZERO,
            behaviour,
            runs: AtomicUsize::new(0),
            now: AtomicUsize::new(0),
            peak: AtomicUsize::new(0),
            per_trace: Mutex::new(HashMap::new()),
            trace_peak: AtomicUsize::new(0),
            open: None,
            woken_by: None,
        }
    }

    /// Finishes completed with `summary`, producing nothing.
    fn finishing(kind: StepKind, max: usize, summary: &'static str) -> TestStep {
        TestStep::new(
            kind,
            max,
            Arc::new(move |_run, _n| Ok(Outcome::Finished(Finished::completed(summary)))),
        )
    }

    /// Finishes completed, producing the given next steps.
    fn passing(kind: StepKind, max: usize, next: Vec<StepKind>) -> TestStep {
        TestStep::new(
            kind,
            max,
            Arc::new(move |_run, _n| {
                let mut f = Finished::completed("done");
                for k in &next {
                    f = f.then(NextAction::new(k.clone(), format!("then {k}")));
                }
                Ok(Outcome::Finished(f))
            }),
        )
    }
}

#[async_trait]
impl Step for TestStep {
    fn kind(&self) -> StepKind {
        self.kind.clone()
    }
    fn max_parallel(&self) -> usize {
        self.max
    }
    fn exclusive_per_trace(&self) -> bool {
        self.exclusive
    }
    fn woken_by(&self, action: &rover::store::Action, signal: &rover::intake::Signal) -> bool {
        self.woken_by.is_some_and(|woken| woken(action, signal))
    }
    async fn ready(&self, _ctx: &StepContext, _p: &PendingAction) -> Result<Readiness, StepError> {
        Ok(match &self.open {
            Some(open) if !open.load(Ordering::SeqCst) => {
                Readiness::Wait("the other task is still running".into())
            }
            _ => Readiness::Ready,
        })
    }
    async fn process(&self, _ctx: &StepContext, run: &StepRun) -> Result<Outcome, StepError> {
        let n = self.runs.fetch_add(1, Ordering::SeqCst);
        let now = self.now.fetch_add(1, Ordering::SeqCst) + 1;
        self.peak.fetch_max(now, Ordering::SeqCst);
        {
            let mut per = self.per_trace.lock().unwrap();
            let c = per.entry(run.pending.trace_id).or_default();
            *c += 1;
            self.trace_peak.fetch_max(*c, Ordering::SeqCst);
        }
        if !self.delay.is_zero() {
            tokio::time::sleep(self.delay).await;
        }
        *self
            .per_trace
            .lock()
            .unwrap()
            .get_mut(&run.pending.trace_id)
            .unwrap() -= 1;
        self.now.fetch_sub(1, Ordering::SeqCst);
        (self.behaviour)(run, n)
    }
}

fn orchestrator(
    store: &AutopilotStore,
    steps: Vec<Arc<dyn Step>>,
    fallback: Duration,
) -> StepOrchestrator {
    crate::support::orch::orchestrator(
        store,
        steps,
        (fallback, Duration::from_millis(20), Duration::from_secs(2)),
    )
}

/// An orchestrator over `steps` whose fallback timer is an hour: only eager drains move it.
fn hourly(store: &AutopilotStore, steps: Vec<Arc<dyn Step>>) -> StepOrchestrator {
    orchestrator(store, steps, Duration::from_secs(3600))
}

/// A `TestStep::passing` of `kind` (at most `max` at once) producing `next`, to hand the
/// orchestrator.
fn passing(kind: StepKind, max: usize, next: &[StepKind]) -> Arc<dyn Step> {
    Arc::new(TestStep::passing(kind, max, next.to_vec()))
}

async fn settle(orch: &StepOrchestrator) {
    run_until_idle(orch, 30, "settles without waiting for the fallback timer").await;
}

/// Asserts that `trace`'s chain (collections included) is `short` (see `chain::steps`).
#[track_caller]
fn assert_steps(store: &AutopilotStore, trace: Uuid, short: &str) {
    assert_eq!(chain(store, trace), expected(short));
}

/// `step:status` of every span of `trace`, collections included, in creation order.
fn chain(store: &AutopilotStore, trace: Uuid) -> Vec<String> {
    store
        .load_trace(trace)
        .unwrap()
        .spans
        .iter()
        .map(|s| format!("{}:{}", s.step, s.status))
        .collect()
}

#[tokio::test]
async fn a_cascade_runs_through_without_waiting_for_the_timer() {
    let (_env, store) = env_and_store();
    let steps: Vec<Arc<dyn Step>> = vec![
        passing(StepKind::Coordinate, 3, &[StepKind::Plan]),
        passing(StepKind::Plan, 2, &[StepKind::Workflow]),
        passing(StepKind::Workflow, 3, &[StepKind::Noop]),
        Arc::new(rover::steps::NoopStep),
    ];
    // A fallback timer of an hour: only eager drains can finish this within the timeout.
    let orch = hourly(&store, steps);
    let trace = submit(&store, "cascade");
    settle(&orch).await;
    assert_steps(&store, trace, "event coordinate plan workflow noop");
    let view = store.load_trace(trace).unwrap();
    assert_eq!(
        rover::steps::kinds::trace_outcome(&view),
        TraceOutcome::Finished {
            step: StepKind::Noop,
            status: SpanStatus::Completed
        }
    );
    let noop = view.spans.last().unwrap();
    assert!(
        noop.meta["summary"]
            .as_str()
            .unwrap()
            .contains("coordinate: done → plan: done"),
        "{:?}",
        noop.meta
    );
}

#[tokio::test]
async fn max_parallel_is_never_exceeded_and_is_used() {
    let (_env, store) = env_and_store();
    let mut coordinate = TestStep::passing(StepKind::Coordinate, 2, vec![StepKind::Noop]);
    coordinate.delay = Duration::from_millis(60);
    let coordinate = Arc::new(coordinate);
    let orch = hourly(
        &store,
        vec![coordinate.clone(), Arc::new(rover::steps::NoopStep)],
    );
    let traces: Vec<Uuid> = (0..8)
        .map(|i| submit(&store, &format!("request {i}")))
        .collect();
    settle(&orch).await;
    assert_eq!(coordinate.runs.load(Ordering::SeqCst), 8);
    assert_eq!(
        coordinate.peak.load(Ordering::SeqCst),
        2,
        "two at a time, never more"
    );
    for t in traces {
        assert_eq!(chain(&store, t).last().unwrap(), "noop:completed");
    }
}

#[tokio::test]
async fn an_exclusive_step_runs_once_per_trace_at_a_time() {
    let (_env, store) = env_and_store();
    let fan_out = TestStep::passing(
        StepKind::Coordinate,
        3,
        vec![StepKind::Resolve, StepKind::Resolve, StepKind::Resolve],
    );
    let mut resolve = TestStep::passing(StepKind::Resolve, 3, vec![]);
    resolve.exclusive = true;
    resolve.delay = Duration::from_millis(40);
    let resolve = Arc::new(resolve);
    let orch = hourly(&store, vec![Arc::new(fan_out), resolve.clone()]);
    submit(&store, "a");
    submit(&store, "b");
    settle(&orch).await;
    assert_eq!(resolve.runs.load(Ordering::SeqCst), 6);
    assert_eq!(
        resolve.trace_peak.load(Ordering::SeqCst),
        1,
        "never two resolves of one trace at once"
    );
    assert_eq!(
        resolve.peak.load(Ordering::SeqCst),
        2,
        "but two traces' resolves together"
    );
}

#[tokio::test]
async fn errors_and_panics_become_error_spans_and_fail_forward() {
    let (_env, store) = env_and_store();
    let panicking = submit(&store, "please panic");
    let erroring = submit(&store, "fine");
    let coordinate = TestStep::new(
        StepKind::Coordinate,
        3,
        Arc::new(move |run, _| {
            // A real panic inside a step, as a bug would raise.
            assert!(
                run.pending.trace_id != panicking,
                "the coordinator tripped over its own feet"
            );
            Ok(Outcome::Finished(
                Finished::completed("ok").then(NextAction::new(StepKind::Workflow, "work")),
            ))
        }),
    );
    let workflow = TestStep::new(
        StepKind::Workflow,
        3,
        Arc::new(|_, _| {
            Err(StepError::fatal("docker is not reachable")
                .detail("command", ["docker", "run"])
                .detail("exitCode", 125)
                .detail("stderr", "Cannot connect to the Docker daemon"))
        }),
    );
    let commit = TestStep::passing(StepKind::Commit, 3, vec![StepKind::Notify]);
    let notify = TestStep::passing(StepKind::Notify, 3, vec![]);
    let orch = hourly(
        &store,
        vec![
            Arc::new(coordinate),
            Arc::new(workflow),
            Arc::new(commit),
            Arc::new(notify),
        ],
    );
    settle(&orch).await;

    assert_steps(&store, panicking, "event coordinate:error notify");
    let view = store.load_trace(panicking).unwrap();
    let span = &view.spans[1];
    assert!(span
        .summary
        .as_deref()
        .unwrap()
        .contains("panicked: the coordinator tripped over its own feet"));
    assert_eq!(span.meta["error"]["panic"], true);
    assert_eq!(
        view.actions.last().unwrap().meta["purpose"],
        "failure",
        "fail forward to a notify saying why"
    );
    assert_eq!(
        rover::steps::kinds::trace_outcome(&view),
        TraceOutcome::Finished {
            step: StepKind::Notify,
            status: SpanStatus::Completed
        }
    );

    assert_steps(
        &store,
        erroring,
        "event coordinate workflow:error commit notify",
    );
    let view = store.load_trace(erroring).unwrap();
    let error = &view.spans[2].meta["error"];
    assert_eq!(error["message"], "docker is not reachable");
    assert_eq!(error["exitCode"], 125);
    assert_eq!(error["stderr"], "Cannot connect to the Docker daemon");
    assert_eq!(error["command"], serde_json::json!(["docker", "run"]));
    assert!(orch.internal_errors() >= 2);
}

#[tokio::test]
async fn unknown_action_types_are_dead_letters_that_stay_queued() {
    let (env, store) = env_and_store();
    let coordinate = TestStep::passing(
        StepKind::Coordinate,
        3,
        vec![StepKind::Other("deploy".into())],
    );
    let orch = hourly(&store, vec![Arc::new(coordinate)]);
    let mut progress = orch.subscribe();
    let trace = submit(&store, "deploy it");
    settle(&orch).await;
    let view = store.load_trace(trace).unwrap();
    assert_eq!(view.pending.len(), 1);
    assert_eq!(view.pending[0].action, StepKind::Other("deploy".into()));
    let mut notices = Vec::new();
    while let Ok(p) = progress.try_recv() {
        if let rover::orchestrator::Progress::Notice(text) = p {
            notices.push(text);
        }
    }
    assert!(
        notices
            .iter()
            .any(|n| n.contains("dead letter") && n.contains("deploy")),
        "{notices:?}"
    );
    let out = env.rover(&["autopilot", "trace", &trace.to_string()]);
    assert!(
        crate::support::env::stdout(&out).contains("dead letter"),
        "{}",
        crate::support::env::stdout(&out)
    );
}

#[tokio::test]
async fn a_retryable_error_is_retried_with_backoff_then_given_up_with_a_reason() {
    let (_env, store) = env_and_store();
    // Fails twice with a retryable error, then succeeds.
    let flaky = TestStep::new(
        StepKind::Coordinate,
        3,
        Arc::new(|_, n| {
            if n < 2 {
                Err(StepError::retryable("GitHub answered 502"))
            } else {
                Ok(Outcome::Finished(Finished::completed("third time lucky")))
            }
        }),
    );
    let orch = orchestrator(&store, vec![Arc::new(flaky)], Duration::from_millis(50));
    let trace = submit(&store, "flaky");
    settle_with_backoff(&orch).await;
    assert_steps(
        &store,
        trace,
        "event coordinate:error coordinate:error coordinate",
    );
    let view = store.load_trace(trace).unwrap();
    assert!(view.spans[1].meta["retryAt"].is_string());

    // Always failing: three attempts, then the action is given up and the trace fails forward.
    let (_env, store) = env_and_store();
    let broken = TestStep::new(
        StepKind::Coordinate,
        3,
        Arc::new(|_, _| Err(StepError::retryable("GitHub answered 502"))),
    );
    let notify = TestStep::passing(StepKind::Notify, 3, vec![]);
    let orch = orchestrator(
        &store,
        vec![Arc::new(broken), Arc::new(notify)],
        Duration::from_millis(50),
    );
    let trace = submit(&store, "always broken");
    settle_with_backoff(&orch).await;
    assert_steps(
        &store,
        trace,
        "event coordinate:error coordinate:error coordinate:error notify",
    );
}

/// Backed-off actions are "not runnable now" for `--once`; the daemon loop waits for them.
async fn settle_with_backoff(orch: &StepOrchestrator) {
    let token = CancellationToken::new();
    let runner = orch.clone();
    let t = token.clone();
    let task = tokio::spawn(async move { runner.run(t).await });
    let store = orch.store().clone();
    tokio::time::timeout(Duration::from_secs(20), async {
        loop {
            tokio::time::sleep(Duration::from_millis(50)).await;
            let state = store.read_state().unwrap();
            if state.pending.is_empty() && orch.in_flight() == 0 {
                break;
            }
        }
    })
    .await
    .expect("retries finish");
    token.cancel();
    task.await.unwrap().unwrap();
}

#[tokio::test]
async fn a_step_that_is_not_ready_keeps_its_action_without_a_span() {
    let (_env, store) = env_and_store();
    let open = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut resolve = TestStep::finishing(StepKind::Resolve, 3, "resolved");
    resolve.open = Some(open.clone());
    let orch = hourly(
        &store,
        vec![
            passing(StepKind::Coordinate, 3, &[StepKind::Resolve]),
            Arc::new(resolve),
        ],
    );
    let trace = submit(&store, "wait for it");
    settle(&orch).await;
    assert_eq!(
        chain(&store, trace),
        expected("event coordinate"),
        "no span while waiting"
    );
    assert_eq!(store.load_trace(trace).unwrap().pending.len(), 1);
    assert!(orch.waiting().values().any(|r| r.contains("still running")));
    open.store(true, Ordering::SeqCst);
    settle(&orch).await;
    assert_steps(&store, trace, "event coordinate resolve");
}

/// Detached work: `process` starts it, `monitor` finishes it once "the container" exits.
struct DetachedStep {
    done: Arc<std::sync::atomic::AtomicBool>,
    alive: bool,
}

#[async_trait]
impl Step for DetachedStep {
    fn kind(&self) -> StepKind {
        StepKind::Workflow
    }
    fn max_parallel(&self) -> usize {
        3
    }
    async fn process(&self, _ctx: &StepContext, _run: &StepRun) -> Result<Outcome, StepError> {
        let mut meta = rover::store::Meta::new();
        meta.insert("containerId".into(), "rover-test".into());
        Ok(Outcome::Detached { meta })
    }
    async fn monitor(&self, ctx: &StepContext) -> Result<Vec<Completion>, StepError> {
        if !self.done.load(Ordering::SeqCst) {
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
            .map(|p| Completion::new(p.action_id, "the container exited"))
            .collect())
    }
    async fn collect(
        &self,
        _ctx: &StepContext,
        _run: &StepRun,
        _ended: &Completion,
    ) -> Result<Collected, StepError> {
        Ok(Collected::of(
            Finished::completed("the agent finished").then(NextAction::new(StepKind::Noop, "done")),
        ))
    }
    async fn still_running(&self, _ctx: &StepContext, _p: &PendingAction, _s: &Span) -> bool {
        self.alive
    }
}

#[tokio::test]
async fn detached_work_is_finished_by_monitor_and_survives_a_restart() {
    let (_env, store) = env_and_store();
    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let steps = |alive: bool| -> Vec<Arc<dyn Step>> {
        vec![
            passing(StepKind::Coordinate, 3, &[StepKind::Workflow]),
            Arc::new(DetachedStep {
                done: done.clone(),
                alive,
            }),
            Arc::new(rover::steps::NoopStep),
        ]
    };
    let orch = hourly(&store, steps(true));
    let trace = submit(&store, "long task");
    settle(&orch).await;
    assert_eq!(
        chain(&store, trace),
        expected("event coordinate workflow:running"),
        "--once leaves detached work running"
    );

    // A restart while the container runs: recovery leaves the span alone (re-attached).
    let orch = hourly(&store, steps(true));
    let recovered = orch.recover().await.unwrap();
    assert!(
        matches!(
            recovered.as_slice(),
            [rover::store::Recovery::StillRunning { .. }]
        ),
        "{recovered:?}"
    );
    done.store(true, Ordering::SeqCst);
    settle(&orch).await;
    assert_steps(&store, trace, "event coordinate workflow collect noop");
    let view = store.load_trace(trace).unwrap();
    let (workflow, collect) = (&view.spans[2], &view.spans[3]);
    assert_eq!(
        workflow.meta["containerId"], "rover-test",
        "meta recorded at detach is kept"
    );
    // The collection is a span of its own below the run's, timed within it.
    assert_eq!(collect.parent_id, Some(workflow.id));
    assert_eq!(collect.action_id, None);
    assert_eq!(
        collect.summary.as_deref(),
        Some("collected: the agent finished")
    );
    assert!(collect.timestamp >= workflow.timestamp);
    assert!(collect.completed <= workflow.completed);
}

/// A step whose runs go on outside the process; `monitor` collects up to `release` of them
/// (never one whose `process` has not returned) and reports every claimed entry it saw
/// in process.
struct SlotStep {
    holds: bool,
    release: Arc<AtomicUsize>,
    seen_in_process: Arc<AtomicUsize>,
}

#[async_trait]
impl Step for SlotStep {
    fn kind(&self) -> StepKind {
        StepKind::Workflow
    }
    fn max_parallel(&self) -> usize {
        2
    }
    fn detached_holds_slot(&self) -> bool {
        self.holds
    }
    async fn process(&self, _ctx: &StepContext, _run: &StepRun) -> Result<Outcome, StepError> {
        Ok(Outcome::Detached {
            meta: rover::store::Meta::new(),
        })
    }
    async fn monitor(&self, ctx: &StepContext) -> Result<Vec<Completion>, StepError> {
        let state = ctx
            .store
            .read_state()
            .map_err(|e| StepError::from_error(&e, true))?;
        let mut done = Vec::new();
        for p in state
            .pending
            .iter()
            .filter(|p| p.action == StepKind::Workflow && p.running_span_id.is_some())
        {
            if ctx.in_process(p.action_id) {
                self.seen_in_process.fetch_add(1, Ordering::SeqCst);
                continue;
            }
            let left = self.release.load(Ordering::SeqCst);
            if left == 0 {
                break;
            }
            self.release.store(left - 1, Ordering::SeqCst);
            done.push(Completion::new(p.action_id, "the container exited"));
        }
        Ok(done)
    }
    async fn collect(
        &self,
        _ctx: &StepContext,
        _run: &StepRun,
        _ended: &Completion,
    ) -> Result<Collected, StepError> {
        Ok(Collected::of(Finished::completed("the container finished")))
    }
    async fn still_running(&self, _ctx: &StepContext, _p: &PendingAction, _s: &Span) -> bool {
        true
    }
}

fn workflow_runs(store: &AutopilotStore) -> (usize, usize) {
    let state = store.read_state().unwrap();
    let workflows = state
        .pending
        .iter()
        .filter(|p| p.action == StepKind::Workflow);
    let running = workflows.clone().filter(|p| p.running_span_id.is_some());
    (running.count(), workflows.count())
}

#[tokio::test]
async fn detached_runs_hold_their_steps_slots_until_monitor_collects_them() {
    let (_env, store) = env_and_store();
    let release = Arc::new(AtomicUsize::new(0));
    let seen_in_process = Arc::new(AtomicUsize::new(0));
    let steps = |holds: bool| -> Vec<Arc<dyn Step>> {
        vec![
            passing(StepKind::Coordinate, 5, &[StepKind::Workflow]),
            Arc::new(SlotStep {
                holds,
                release: release.clone(),
                seen_in_process: seen_in_process.clone(),
            }),
        ]
    };
    for i in 0..5 {
        submit(&store, &format!("task {i}"));
    }
    let orch = hourly(&store, steps(true));
    settle(&orch).await;
    assert_eq!(
        workflow_runs(&store),
        (2, 5),
        "two detached runs hold both slots; three wait"
    );
    let waiting = orch.waiting();
    assert_eq!(waiting.len(), 3, "{waiting:?}");
    assert!(
        waiting
            .values()
            .all(|r| r.contains("detached") && r.contains("maxParallel 2")),
        "{waiting:?}"
    );

    // A restart while both run: they still hold their slots.
    let orch = hourly(&store, steps(true));
    let recovered = orch.recover().await.unwrap();
    assert_eq!(recovered.len(), 2, "{recovered:?}");
    let report = orch.drain().await.unwrap();
    assert_eq!(report.started, 0, "{report:?}");
    assert_eq!(workflow_runs(&store), (2, 5));

    // Each collected run frees one slot, never more runs than slots.
    let mut completed = 0;
    while workflow_runs(&store).1 > 0 {
        release.store(1, Ordering::SeqCst);
        let report = orch.drain().await.unwrap();
        completed += report.completed_detached;
        // The collection runs as a task of its own, holding its slot until it is done; the
        // drain its end wakes starts a run in the freed slot, which detaches in turn.
        for _ in 0..2 {
            wait_until(30, 5, "collections end and runs detach", || {
                orch.in_flight() == 0
            })
            .await;
            let (running, _) = workflow_runs(&store);
            assert!(running <= 2, "{running} detached runs with maxParallel 2");
            orch.drain().await.unwrap();
        }
        let (running, queued) = workflow_runs(&store);
        assert!(running <= 2, "{running} detached runs with maxParallel 2");
        assert!(running == 2 || running == queued, "a free slot is used");
    }
    assert_eq!(completed, 5);

    // Without the flag (the default), detached runs give their slot back when they detach.
    for i in 0..3 {
        submit(&store, &format!("more {i}"));
    }
    let orch = hourly(&store, steps(false));
    settle(&orch).await;
    assert_eq!(workflow_runs(&store), (3, 3));
}

#[tokio::test]
async fn shutdown_cuts_off_slow_steps_and_their_actions_run_again_next_time() {
    let (_env, store) = env_and_store();
    let mut slow = TestStep::passing(StepKind::Coordinate, 3, vec![]);
    slow.delay = Duration::from_secs(30);
    let orch = StepOrchestrator::new(
        store.clone(),
        vec![Arc::new(slow)],
        OrchestratorSettings {
            shutdown_grace: Duration::from_millis(200),
            ..OrchestratorSettings::default()
        },
    );
    let trace = submit(&store, "slow");
    let token = CancellationToken::new();
    let runner = orch.clone();
    let t = token.clone();
    let task = tokio::spawn(async move { runner.run(t).await });
    tokio::time::timeout(Duration::from_secs(10), async {
        while orch.in_flight() == 0 || chain(&store, trace).len() < 2 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .unwrap();
    token.cancel();
    tokio::time::timeout(Duration::from_secs(10), task)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_steps(&store, trace, "event coordinate:error");
    let view = store.load_trace(trace).unwrap();
    assert_eq!(view.spans[1].meta["interrupted"], true);
    assert_eq!(
        view.pending.len(),
        1,
        "the action is still queued for the next start"
    );
    assert_eq!(view.pending[0].running_span_id, None);

    // The next run picks it up.
    let orch = hourly(&store, vec![passing(StepKind::Coordinate, 3, &[])]);
    settle(&orch).await;
    assert_steps(&store, trace, "event coordinate:error coordinate");
}

#[test]
fn every_step_is_registered_exactly_once() {
    let pipeline = crate::support::pipeline::Pipeline::new();
    let services = pipeline.services(
        &serde_json::json!([]),
        crate::support::pipeline::test_config(),
        None,
        None,
    );
    let mut kinds: Vec<String> = rover::steps::build_steps(&services)
        .iter()
        .map(|s| s.kind().to_string())
        .collect();
    kinds.sort();
    assert_eq!(
        kinds,
        [
            "cleanup",
            "commit",
            "coordinate",
            "merge",
            "noop",
            "notify",
            "plan",
            "push",
            "release",
            "resolve",
            "review",
            "workflow"
        ]
    );
    let noop = rover::steps::build_steps(&services)
        .into_iter()
        .find(|s| s.kind() == StepKind::Noop)
        .unwrap();
    assert_eq!(noop.max_parallel(), 5);
}

/// Whether `action` waits on the CI outcome `signal`: its reason names the commit
/// (`watch <sha>`).
fn watches(action: &rover::store::Action, signal: &rover::intake::Signal) -> bool {
    let rover::intake::Signal::Ci(outcome) = signal;
    action
        .reason
        .strip_prefix("watch ")
        .is_some_and(|sha| outcome.is_for(sha))
}

/// Intake hands a CI outcome to the orchestrator as a signal: of the queued actions, only those
/// scheduled for later whose step says they wait on it become due (on disk), once; an action
/// due anyway, or waiting on another commit, is left as it is.
#[tokio::test]
async fn a_ci_signal_makes_due_only_the_scheduled_runs_whose_step_waits_on_it() {
    use rover::intake::{CiOutcome, Queue, Signal};
    let (_env, store) = env_and_store();
    let root = Span::root(
        Uuid::new_v4(),
        chrono::Utc::now(),
        rover::store::Meta::new(),
    );
    store.create_trace(&root, None, &[]).unwrap();
    let (ours, other) = ("a".repeat(40), "b".repeat(40));
    let later = (chrono::Utc::now() + chrono::Duration::hours(1)).to_rfc3339();
    let mut scheduled = rover::store::Meta::new();
    scheduled.insert("notBefore".into(), serde_json::json!(later));
    let action = |reason: String, meta: &rover::store::Meta| {
        let a = rover::store::Action::new(
            StepKind::Notify,
            &root,
            reason,
            meta.clone(),
            chrono::Utc::now(),
        );
        store.enqueue(&a, root.id).unwrap();
        a.id
    };
    let waiting = action(format!("watch {ours}"), &scheduled);
    let elsewhere = action(format!("watch {other}"), &scheduled);
    let due = action(format!("watch {ours}"), &rover::store::Meta::new());
    let mut watching = TestStep::finishing(StepKind::Notify, 1, "looked");
    watching.woken_by = Some(watches);
    let watching = Arc::new(watching);
    let orch = hourly(&store, vec![watching.clone()]);
    let not_before = |id: Uuid| {
        store
            .read_state()
            .unwrap()
            .pending_for(id)
            .unwrap()
            .not_before
    };

    let ci = Signal::Ci(CiOutcome::new(&ours.to_uppercase(), "check_run completed"));
    assert_eq!(orch.signal(&ci).await.unwrap(), 1);
    assert_eq!(not_before(waiting), None);
    assert!(not_before(elsewhere).is_some());
    assert_eq!(not_before(due), None);
    assert_eq!(orch.signal(&ci).await.unwrap(), 0, "once");

    settle(&orch).await;
    assert_eq!(watching.runs.load(Ordering::SeqCst), 2);
    let left: Vec<Uuid> = store
        .read_state()
        .unwrap()
        .pending
        .iter()
        .map(|p| p.action_id)
        .collect();
    assert_eq!(left, [elsewhere], "the other commit's watch keeps its time");
}
