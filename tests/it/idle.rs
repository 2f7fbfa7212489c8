//! `run_until_idle` (`start --once`, and the suites' `run`) stops only when nothing can have been
//! enqueued since the queue was read: a run that finishes while a drain is under way (after the
//! drain read the queue, before the drain's idle check) queues a follow-up that the next drain
//! must see. Under load this was seen once as two commits finishing together and the resolve
//! they queued never running; here the interleaving is forced, so the test is deterministic.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use async_trait::async_trait;
use rover::orchestrator::{
    Finished, NextAction, OrchestratorSettings, Outcome, Readiness, Step, StepContext, StepError,
    StepOrchestrator,
};
use rover::store::{PendingAction, StepKind, StepRun};
use tokio::sync::Notify;

use crate::support::env::TestEnv;
use crate::support::orch::{run_until_idle, submit_local, wait_until};

/// Finishes at once, queueing `next`.
struct Passing {
    kind: StepKind,
    next: Vec<StepKind>,
}

#[async_trait]
impl Step for Passing {
    fn max_parallel(&self) -> usize {
        2
    }
    fn kind(&self) -> StepKind {
        self.kind.clone()
    }
    async fn process(&self, _ctx: &StepContext, _run: &StepRun) -> Result<Outcome, StepError> {
        let mut f = Finished::completed("done");
        for k in &self.next {
            f = f.then(NextAction::new(k.clone(), format!("then {k}")));
        }
        Ok(Outcome::Finished(f))
    }
}

/// The workflow: runs until released, then finishes queueing a resolve (the follow-up that was
/// lost).
struct Held {
    release: Arc<Notify>,
}

#[async_trait]
impl Step for Held {
    fn max_parallel(&self) -> usize {
        2
    }
    fn kind(&self) -> StepKind {
        StepKind::Workflow
    }
    async fn process(&self, _ctx: &StepContext, _run: &StepRun) -> Result<Outcome, StepError> {
        self.release.notified().await;
        Ok(Outcome::Finished(
            Finished::completed("held, then done")
                .then(NextAction::new(StepKind::Resolve, "after the workflow")),
        ))
    }
}

/// The plan: its readiness check runs inside a drain, after the drain has read the queue. The
/// first look asks for another drain; the second lets the held workflow finish and waits until
/// its run is over (its resolve queued, nothing in flight); later looks are ready.
struct Probe {
    release: Arc<Notify>,
    orch: Arc<OnceLock<StepOrchestrator>>,
    looks: AtomicUsize,
}

#[async_trait]
impl Step for Probe {
    fn max_parallel(&self) -> usize {
        2
    }
    fn kind(&self) -> StepKind {
        StepKind::Plan
    }
    async fn ready(&self, _ctx: &StepContext, _p: &PendingAction) -> Result<Readiness, StepError> {
        let orch = self.orch.get().expect("orchestrator set");
        match self.looks.fetch_add(1, Ordering::SeqCst) {
            0 => {
                orch.wake();
                Ok(Readiness::Wait("first look".into()))
            }
            1 => {
                self.release.notify_one();
                wait_until(30, 5, "the workflow finishes", || orch.in_flight() == 0).await;
                Ok(Readiness::Wait("second look".into()))
            }
            _ => Ok(Readiness::Ready),
        }
    }
    async fn process(&self, _ctx: &StepContext, _run: &StepRun) -> Result<Outcome, StepError> {
        Ok(Outcome::Finished(Finished::completed("planned")))
    }
}

#[tokio::test]
async fn a_run_that_finishes_during_a_drain_is_not_mistaken_for_idle() {
    let env = TestEnv::new();
    let store = env.store();
    let release = Arc::new(Notify::new());
    let cell = Arc::new(OnceLock::new());
    let steps: Vec<Arc<dyn Step>> = vec![
        Arc::new(Passing {
            kind: StepKind::Coordinate,
            next: vec![StepKind::Workflow, StepKind::Plan],
        }),
        Arc::new(Held {
            release: release.clone(),
        }),
        Arc::new(Probe {
            release,
            orch: cell.clone(),
            looks: AtomicUsize::new(0),
        }),
        Arc::new(Passing {
            kind: StepKind::Resolve,
            next: Vec::new(),
        }),
    ];
    // A fallback timer of an hour: only the wake-ups can carry this through.
    let orch = StepOrchestrator::new(
        store.clone(),
        steps,
        OrchestratorSettings {
            fallback_interval: Duration::from_secs(3600),
            shutdown_grace: Duration::from_secs(2),
            ..OrchestratorSettings::default()
        },
    );
    assert!(cell.set(orch.clone()).is_ok());
    let trace = submit_local(&store, "wake-up");

    run_until_idle(&orch, 60, "settles without the fallback timer").await;

    let chain = crate::support::chain::chain(&store.load_trace(trace).unwrap());
    assert!(
        chain.contains(&"resolve:completed".to_owned()),
        "the resolve queued during the drain ran: {chain:?}"
    );
    assert!(chain.contains(&"plan:completed".to_owned()), "{chain:?}");
    let left = store.read_state().unwrap().pending;
    assert!(left.is_empty(), "nothing left queued: {left:?}");
}

/// The other suspect: a store handle keeps the queue between transactions and reads only what
/// was appended since. Two handles (as the daemon and a CLI command) take turns appending,
/// removing and compacting, quickly (compactions in one timestamp tick can reuse an inode);
/// after every operation each handle's locked view equals a fresh read of the files.
#[test]
fn a_store_handle_sees_every_queue_change_another_handle_makes() {
    use rover::store::{Action, Meta};

    let env = TestEnv::new();
    let handles = [env.store(), env.store()];
    let (root, first) =
        rover::intake::local_trace(&rover::steps::kinds::FIRST_STEP, "two handles", "tester");
    handles[0].create_trace(&root, Some(&first), &[]).unwrap();
    let mut queued = vec![first.id];
    let view = |h: &rover::store::AutopilotStore| {
        let mut ids: Vec<uuid::Uuid> = h
            .transact(|t| Ok(t.state()?.pending.iter().map(|p| p.action_id).collect()))
            .unwrap();
        ids.sort();
        ids
    };
    for i in 0..120usize {
        let h = &handles[i % 2];
        match i % 5 {
            0 | 1 | 3 => {
                let a = Action::new(
                    StepKind::Notify,
                    &root,
                    "queued",
                    Meta::new(),
                    chrono::Utc::now(),
                );
                h.enqueue(&a, root.id).unwrap();
                queued.push(a.id);
            }
            2 => {
                let id = queued.remove(i % queued.len());
                assert!(h.dequeue(id).unwrap().is_some(), "step {i}: {id} queued");
            }
            _ => h.compact_state().unwrap(),
        }
        let mut want = queued.clone();
        want.sort();
        let mut fresh: Vec<uuid::Uuid> = handles[0]
            .read_state()
            .unwrap()
            .pending
            .iter()
            .map(|p| p.action_id)
            .collect();
        fresh.sort();
        assert_eq!(fresh, want, "step {i}: the files");
        for (n, other) in handles.iter().enumerate() {
            assert_eq!(view(other), want, "step {i}: handle {n}'s kept state");
        }
    }
}
