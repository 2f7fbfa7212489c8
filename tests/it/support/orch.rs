//! An in-process orchestrator over a bare store, for the tests of the orchestrator itself and
//! of `super::pipeline`: the real pipeline's routes with test steps and short timers, a local
//! request to start a trace, a drain until idle that cannot hang the suite.

use std::sync::Arc;
use std::time::Duration;

use rover::orchestrator::{OrchestratorSettings, Step, StepOrchestrator};
use rover::store::AutopilotStore;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

/// An orchestrator over `store` running `steps` on the real pipeline, with its fallback timer,
/// retry backoff and shutdown grace.
pub fn orchestrator(
    store: &AutopilotStore,
    steps: Vec<Arc<dyn Step>>,
    (fallback, backoff, grace): (Duration, Duration, Duration),
) -> StepOrchestrator {
    StepOrchestrator::new(
        store.clone(),
        steps,
        OrchestratorSettings {
            fallback_interval: fallback,
            retry_backoff: backoff,
            shutdown_grace: grace,
            ..OrchestratorSettings::default()
        },
    )
    .with_pipeline(rover::steps::pipeline::pipeline())
}

/// Starts a trace from a local request by `tester`; returns its id.
pub fn submit_local(store: &AutopilotStore, text: &str) -> Uuid {
    let (root, first) =
        rover::intake::local_trace(&rover::steps::kinds::FIRST_STEP, text, "tester");
    store
        .create_trace(&root, Some(&first), &[])
        .expect("create trace");
    root.id
}

/// Drains until nothing is runnable, within `secs` (else panics with `what`).
pub async fn run_until_idle(orchestrator: &StepOrchestrator, secs: u64, what: &str) {
    tokio::time::timeout(
        Duration::from_secs(secs),
        orchestrator.run_until_idle(CancellationToken::new()),
    )
    .await
    .expect(what)
    .expect("drain");
}

/// Polls `done` every `every_ms` until it holds, within `secs` (else panics with `what`).
pub async fn wait_until(secs: u64, every_ms: u64, what: &str, done: impl Fn() -> bool) {
    tokio::time::timeout(Duration::from_secs(secs), async {
        while !done() {
            tokio::time::sleep(Duration::from_millis(every_ms)).await;
        }
    })
    .await
    .expect(what);
}
