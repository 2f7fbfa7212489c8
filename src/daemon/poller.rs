//! The GitHub poller as a component: intake's poll loop (the events feed, with its reconcile
//! sweeps), handed the orchestrator as its `Queue`. Restarted after a failure; one pass with
//! `--once` (see `once`).

use std::future::Future;
use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use crate::github::{GitHub, NormalizeOptions, PollSettings};
use crate::intake::poll::{self, PollEnd};
use crate::intake::Queue;
use crate::store::AutopilotStore;

use super::supervise::Policy;
use super::topology::Topology;

/// What each run of the poll loop is started with.
pub(super) struct Poller {
    store: AutopilotStore,
    entry: crate::intake::Entry,
    github: Arc<dyn GitHub>,
    settings: PollSettings,
    normalize: NormalizeOptions,
    backlog: Option<usize>,
    queue: Arc<dyn Queue>,
    token: CancellationToken,
    once: bool,
}

impl Poller {
    /// One run of the poll loop.
    pub(super) fn run(&self) -> impl Future<Output = PollEnd> + Send + 'static {
        poll::poll_loop(
            self.store.clone(),
            self.entry.clone(),
            self.github.clone(),
            self.settings.clone(),
            self.normalize.clone(),
            self.backlog,
            self.queue.clone(),
            self.token.clone(),
            self.once,
        )
    }
}

impl Topology {
    /// The poller, when rover reads GitHub (not with `--local`); it takes the sources' client.
    pub(super) fn poller(&mut self) -> Option<Poller> {
        let gh = self.github.take()?;
        let queue: Arc<dyn Queue> = Arc::new(self.orchestrator.clone());
        Some(Poller {
            store: self.store.clone(),
            entry: crate::intake::Entry::new(
                self.project.id.clone(),
                crate::steps::kinds::FIRST_STEP,
            ),
            github: gh,
            settings: self.config.autopilot.github.poll.clone(),
            normalize: self.normalize.clone().unwrap_or_default(),
            backlog: self.options.backlog,
            queue,
            token: self.shutdown.clone(),
            once: self.options.once,
        })
    }

    /// The poller as a component, until the shutdown: a failure of its loop (not one it meets
    /// while stopping) restarts it.
    pub(super) fn supervise_poller(&mut self, poller: Poller) {
        let stop = self.shutdown.clone();
        self.supervisor.spawn("poller", Policy::Restart, move || {
            let (run, stop) = (poller.run(), stop.clone());
            async move {
                let end = run.await;
                match end.failed {
                    Some(e) if !stop.is_cancelled() => Err(e),
                    _ => Ok(()),
                }
            }
        });
    }
}
