//! The daemon as a topology: one builder ([`Topology`]) holds what the components share and
//! starts each under its supervisor (see `supervise`). Each component adds itself from its own
//! file (`reclaim`, `signals`, `webhook`, `reactions`, `poller`, `drain`, `once`); `run` lists
//! them in the order they start.

use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use crate::config::RoverConfig;
use crate::github::{GitHub, NormalizeOptions};
use crate::orchestrator::StepOrchestrator;
use crate::project::Project;
use crate::steps::Services;
use crate::store::AutopilotStore;

use super::poller::Poller;
use super::preflight::Ready;
use super::reactions::StopWatch;
use super::supervise::Supervisor;
use super::{StartError, StartOptions};

/// What the components share, and the supervisor of those started.
pub(super) struct Topology {
    pub project: Project,
    pub config: RoverConfig,
    pub store: AutopilotStore,
    pub options: StartOptions,
    pub shutdown: CancellationToken,
    pub services: Arc<Services>,
    pub orchestrator: StepOrchestrator,
    /// GitHub as the sources read it; `None` with `--local`, and once the poller has it.
    pub github: Option<Arc<dyn GitHub>>,
    pub normalize: Option<NormalizeOptions>,
    /// The webhook's secret, when webhooks are served; taken by the webhook server.
    pub webhook_secret: Option<String>,
    /// A daemon file's one webhook endpoint, which this repository's deliveries are routed
    /// from (it then binds no server of its own).
    pub routes: Option<crate::intake::webhook_routes::Routes>,
    /// The long-lived tasks, supervised: a failure or panic is said and the task restarted, or
    /// the daemon stopped with it; never silently gone.
    pub supervisor: Supervisor,
}

/// How the components ended, for the shutdown.
pub(super) struct Ended {
    /// The drain's own error (`--once`; without it, the supervisor has it).
    pub result: Result<(), StartError>,
    /// `--once`: GitHub did not answer within the run.
    pub unavailable: Option<String>,
    /// `--once`: a component that failed (the supervisor says it for the others).
    pub failure: Option<String>,
}

impl Topology {
    pub(super) fn new(
        project: Project,
        config: RoverConfig,
        store: AutopilotStore,
        options: StartOptions,
        shutdown: CancellationToken,
        ready: Ready,
        orchestrator: StepOrchestrator,
    ) -> Topology {
        Topology {
            project,
            config,
            store,
            options,
            supervisor: Supervisor::new(shutdown.clone()),
            shutdown,
            services: ready.services,
            orchestrator,
            github: ready.github,
            normalize: ready.normalize,
            webhook_secret: ready.webhook_secret,
            routes: None,
        }
    }
}

impl Topology {
    /// Run the sources and the drain, supervised, until the shutdown (the drain's end, a
    /// signal, or a component that stops the daemon).
    pub(super) async fn until_stopped(
        &mut self,
        poll: Option<Poller>,
        stop_watch: Option<impl Fn() -> StopWatch + Send + 'static>,
    ) -> Ended {
        if let Some(poll) = poll {
            self.supervise_poller(poll);
        }
        if let Some(watch) = stop_watch {
            self.supervise_stop_watch(watch);
        }
        self.supervise_drain();
        self.shutdown.cancelled().await;
        Ended {
            result: Ok(()),
            unavailable: None,
            failure: None,
        }
    }
}
