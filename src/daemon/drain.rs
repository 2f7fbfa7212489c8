//! The orchestrator and its drain as a component: the steps built on the services, the
//! pipeline and the budget; the drain runs until the shutdown, and its error stops the daemon.

use std::sync::Arc;

use crate::config::RoverConfig;
use crate::orchestrator::StepOrchestrator;
use crate::steps::{build_steps, Services};
use crate::store::AutopilotStore;

use super::supervise::Policy;
use super::topology::Topology;

/// The orchestrator of the daemon's steps.
pub(super) fn orchestrator(
    store: &AutopilotStore,
    services: &Arc<Services>,
    config: &RoverConfig,
) -> StepOrchestrator {
    StepOrchestrator::new(
        store.clone(),
        build_steps(services),
        config.autopilot.pipeline.orchestrator(),
    )
    .with_pipeline(crate::steps::pipeline::pipeline_with(
        config.autopilot.memory.clone(),
    ))
    .with_budget(crate::budget::Budget::new(config.autopilot.budget.clone()))
}

impl Topology {
    /// The drain as a component, until the shutdown.
    pub(super) fn supervise_drain(&mut self) {
        let (orch, stop) = (self.orchestrator.clone(), self.shutdown.clone());
        self.supervisor.spawn("drain", Policy::Stop, move || {
            let (orch, stop) = (orch.clone(), stop.clone());
            async move {
                // Ended by the shutdown: the others end with it. An error stops the daemon
                // through the supervisor, which says why.
                let ran = orch.run(stop.clone()).await;
                if ran.is_ok() {
                    stop.cancel();
                }
                ran.map_err(|e| crate::error::error_chain(&e))
            }
        });
    }
}
