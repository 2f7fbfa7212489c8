//! The daemon's agent slots across repositories: one board shared by the orchestrators of three
//! repositories (each its own real store), with test steps whose runs detach and hold their
//! slot until released. Six ready tasks (one labelled `critical`, one a retry, one unblocking
//! two others) start in the order of the documented score, never more than `maxRuns` at once,
//! each run's span saying why, and no repository waits behind another's whole backlog.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use rover::orchestrator::{
    Collected, Completion, Finished, NextAction, Outcome, ScoreWeights, SlotBoard, SlotFacts,
    SlotSettings, Step, StepContext, StepError, StepOrchestrator,
};
use rover::store::{AutopilotStore, PendingAction, RunSpanMeta, Span, StepKind, StepRun};
use serde_json::{json, Value};
use uuid::Uuid;

use crate::support::common::env_and_store;
use crate::support::env::TestEnv;
use crate::support::orch::{orchestrator, submit_local, wait_until};

/// Hands each request's text (JSON: the task's name and its facts) to a workflow action.
struct Plan;

#[async_trait]
impl Step for Plan {
    fn kind(&self) -> StepKind {
        StepKind::Coordinate
    }
    fn max_parallel(&self) -> usize {
        4
    }
    async fn process(&self, ctx: &StepContext, run: &StepRun) -> Result<Outcome, StepError> {
        let view = ctx
            .store
            .load_trace(run.pending.trace_id)
            .map_err(|e| StepError::from_error(&e, false))?;
        let request = view
            .root()
            .and_then(|r| {
                r.meta
                    .get("request")
                    .and_then(Value::as_str)
                    .map(str::to_owned)
            })
            .ok_or_else(|| StepError::fatal("no request"))?;
        let task: Value = serde_json::from_str(&request).expect("a task as JSON");
        Ok(Outcome::Finished(Finished::completed("planned").then(
            NextAction::new(StepKind::Workflow, "run the task").with_meta(&json!({"task": task})),
        )))
    }
}

/// An agent run: detaches holding its slot; `monitor` collects the runs the test released.
struct Agent {
    repo: &'static str,
    started: Arc<Mutex<Vec<String>>>,
    released: Arc<Mutex<HashSet<String>>>,
}

fn task_of(store: &AutopilotStore, action_id: Uuid) -> Value {
    store.read_action(action_id).expect("action").meta["task"].clone()
}

#[async_trait]
impl Step for Agent {
    fn kind(&self) -> StepKind {
        StepKind::Workflow
    }
    fn max_parallel(&self) -> usize {
        3
    }
    fn detached_holds_slot(&self) -> bool {
        true
    }
    fn takes_agent_slot(&self) -> bool {
        true
    }
    async fn slot_facts(&self, ctx: &StepContext, pending: &PendingAction) -> SlotFacts {
        let task = task_of(&ctx.store, pending.action_id);
        SlotFacts {
            unblocks: usize::try_from(task["unblocks"].as_u64().unwrap_or(0)).unwrap(),
            labels: task["labels"]
                .as_array()
                .map(|l| {
                    l.iter()
                        .filter_map(|v| v.as_str().map(str::to_owned))
                        .collect()
                })
                .unwrap_or_default(),
            retries: u32::try_from(task["retries"].as_u64().unwrap_or(0)).unwrap(),
        }
    }
    async fn process(&self, ctx: &StepContext, run: &StepRun) -> Result<Outcome, StepError> {
        let name = task_of(&ctx.store, run.pending.action_id)["name"]
            .as_str()
            .unwrap()
            .to_owned();
        self.started
            .lock()
            .unwrap()
            .push(format!("{}:{name}", self.repo));
        Ok(Outcome::Detached {
            meta: rover::store::Meta::new(),
        })
    }
    async fn monitor(&self, ctx: &StepContext) -> Result<Vec<Completion>, StepError> {
        let state = ctx
            .store
            .read_state()
            .map_err(|e| StepError::from_error(&e, true))?;
        let released = self.released.lock().unwrap().clone();
        Ok(state
            .pending
            .iter()
            .filter(|p| p.action == StepKind::Workflow && p.running_span_id.is_some())
            .filter(|p| !ctx.in_process(p.action_id))
            .filter(|p| {
                let name = task_of(&ctx.store, p.action_id)["name"]
                    .as_str()
                    .unwrap()
                    .to_owned();
                released.contains(&format!("{}:{name}", self.repo))
            })
            .map(|p| Completion::new(p.action_id, "the container exited"))
            .collect())
    }
    async fn collect(
        &self,
        _ctx: &StepContext,
        _run: &StepRun,
        _ended: &Completion,
    ) -> Result<Collected, StepError> {
        Ok(Collected::of(Finished::completed("the agent finished")))
    }
    async fn still_running(&self, _ctx: &StepContext, _p: &PendingAction, _s: &Span) -> bool {
        true
    }
}

/// One served repository: its store, its orchestrator at the shared board.
struct Repo {
    env: TestEnv,
    store: AutopilotStore,
    orch: StepOrchestrator,
}

fn repo(
    name: &'static str,
    board: &Arc<SlotBoard>,
    started: &Arc<Mutex<Vec<String>>>,
    released: &Arc<Mutex<HashSet<String>>>,
) -> Repo {
    let (env, store) = env_and_store();
    let steps: Vec<Arc<dyn Step>> = vec![
        Arc::new(Plan),
        Arc::new(Agent {
            repo: name,
            started: started.clone(),
            released: released.clone(),
        }),
    ];
    let orch = orchestrator(
        &store,
        steps,
        (
            std::time::Duration::from_secs(3600),
            std::time::Duration::from_millis(20),
            std::time::Duration::from_secs(2),
        ),
    )
    .with_slots(board.clone(), name);
    Repo { env, store, orch }
}

/// The `meta.scheduled` of every workflow span of `store`, by task name.
fn scheduled(store: &AutopilotStore) -> Vec<(String, rover::store::ScheduledMeta)> {
    let mut out = Vec::new();
    for entry in store.recent_traces(100).unwrap() {
        let view = store.load_trace(entry.trace_id).unwrap();
        for span in view.spans.iter().filter(|s| s.step == StepKind::Workflow) {
            let action = span
                .action_id
                .map(|id| task_of(store, id)["name"].as_str().unwrap().to_owned());
            if let (Some(name), Some(s)) = (action, RunSpanMeta::of(span).scheduled) {
                out.push((name, s));
            }
        }
    }
    out
}

#[tokio::test]
async fn six_tasks_of_three_repositories_start_in_the_order_of_the_score_two_at_a_time() {
    let board = SlotBoard::new(SlotSettings {
        max_runs: 2,
        max_runs_per_repository: 2,
        weights: ScoreWeights::default(),
    });
    let started = Arc::new(Mutex::new(Vec::new()));
    let released = Arc::new(Mutex::new(HashSet::new()));
    let a = repo("o/a", &board, &started, &released);
    let b = repo("o/b", &board, &started, &released);
    let c = repo("o/c", &board, &started, &released);
    // A repository whose two long runs hold both slots while the others queue their work.
    let busy = repo("o/busy", &board, &started, &released);
    for n in 0..2 {
        submit_local(
            &busy.store,
            &json!({"name": format!("long{n}")}).to_string(),
        );
    }
    busy.orch.drain().await.unwrap();
    let all = [&a, &b, &c, &busy];
    settle(&all).await;
    let mut first = started.lock().unwrap().clone();
    first.sort();
    assert_eq!(first, ["o/busy:long0", "o/busy:long1"]);

    for (r, task) in [
        (&a, json!({"name": "critical", "labels": ["critical"]})),
        (&a, json!({"name": "a-plain"})),
        (&b, json!({"name": "retry", "retries": 1})),
        (&b, json!({"name": "b-plain"})),
        (&c, json!({"name": "unblocker", "unblocks": 2})),
        (&c, json!({"name": "c-plain"})),
    ] {
        submit_local(&r.store, &task.to_string());
    }
    settle(&all).await;
    assert_eq!(
        started.lock().unwrap().len(),
        2,
        "the board is full: all wait"
    );
    let waiting = a.orch.waiting();
    assert!(
        waiting
            .values()
            .all(|w| w.starts_with("waiting for an agent slot: 2 of 2 taken")),
        "{waiting:?}"
    );
    // `status`, another process, says it too.
    let status = a.env.rover(&["autopilot", "status"]);
    let text = crate::support::env::stdout(&status);
    let held: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with("queued   workflow "))
        .collect();
    assert_eq!(held.len(), 2, "{text}");
    assert!(
        held.iter()
            .all(|l| l
                .contains(": waiting for an agent slot: 2 of 2 taken (autopilot.daemon.maxRuns)")),
        "{text}"
    );

    // Each released run frees one slot; the next start is the best score across repositories.
    // The order runs end in, and the start each end lets in (scores in docs/configuration.md):
    let steps = [
        ("o/busy:long0", Some("o/a:critical")),  // 300
        ("o/a:critical", Some("o/c:unblocker")), // 200
        // 0 each; b, never given a slot, before a (round-robin); c's is -150 (c runs one)
        ("o/busy:long1", Some("o/b:b-plain")),
        // a's (0) before c's (0): a was given a slot longer ago; b's retry is -50 - 150
        ("o/c:unblocker", Some("o/a:a-plain")),
        ("o/b:b-plain", Some("o/c:c-plain")), // 0 before b's retry, -50
        ("o/a:a-plain", Some("o/b:retry")),
        ("o/c:c-plain", None),
        ("o/b:retry", None),
    ];
    for (release, expect) in steps {
        let before = started.lock().unwrap().len();
        released.lock().unwrap().insert(release.to_owned());
        settle(&all).await;
        let now = started.lock().unwrap().clone();
        match expect {
            Some(expect) => {
                assert_eq!(now.len(), before + 1, "after {release}: {now:?}");
                assert_eq!(now[before], expect, "after {release}: {now:?}");
            }
            None => assert_eq!(now.len(), before, "after {release}: {now:?}"),
        }
        assert!(
            board.held() <= 2,
            "never more than maxRuns: {}",
            board.held()
        );
    }
    assert_eq!(board.held(), 0);
    // Every run recorded why it got its slot.
    let recorded: Vec<(String, rover::store::ScheduledMeta)> = [&a, &b, &c]
        .iter()
        .flat_map(|r| scheduled(&r.store))
        .collect();
    assert_eq!(recorded.len(), 6, "{recorded:?}");
    let why = |name: &str| {
        recorded
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, s)| s.clone())
            .unwrap()
    };
    assert_eq!(why("critical").score, 300);
    assert_eq!(why("critical").why, ["label critical: +300"]);
    assert_eq!(why("critical").repository, "o/a");
    assert_eq!(why("critical").max_runs, 2);
    assert_eq!(why("unblocker").why, ["unblocks 2 queued task(s): +200"]);
    assert_eq!(why("retry").why, ["retry 1: -50"]);
    assert_eq!(why("retry").score, -50);
}

/// Drains every repository until two rounds in a row start or collect nothing (a slot the
/// board leaves for a repository is taken at its next drain).
async fn settle(repos: &[&Repo]) {
    let mut quiet = 0;
    for _ in 0..50 {
        let mut moved = false;
        for r in repos {
            let report = r.orch.drain().await.unwrap();
            moved |= report.started > 0 || report.completed_detached > 0;
        }
        wait_until(30, 5, "runs detach and collections end", || {
            repos.iter().all(|r| r.orch.in_flight() == 0)
        })
        .await;
        quiet = if moved { 0 } else { quiet + 1 };
        if quiet == 2 {
            return;
        }
    }
    panic!("the repositories never settled");
}
