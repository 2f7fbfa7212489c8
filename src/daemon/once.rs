//! `--once`, for cron: one poll, one look at the stop reactions, one drain until idle, each
//! awaited in turn (not supervised: there is nothing to restart), then the shutdown.

use crate::store::StoreError;

use super::poller::Poller;
use super::reactions::StopWatch;
use super::topology::{Ended, Topology};
use super::StartError;

impl Topology {
    /// Run the sources once and drain what they brought; the stop follows.
    pub(super) async fn once(
        &self,
        poll: Option<Poller>,
        stop_watch: Option<impl Fn() -> StopWatch>,
    ) -> Ended {
        let (mut unavailable, mut failure) = (None, None);
        if let Some(poll) = poll {
            match tokio::spawn(poll.run()).await {
                Ok(end) => {
                    unavailable = end.unavailable;
                    failure = end.failed.map(|e| format!("the poller failed: {e}"));
                }
                Err(e) => {
                    tracing::error!(error = %e, "the poller stopped");
                    unavailable = Some(format!("the poller stopped: {e}"));
                }
            }
        }
        if let Some(watch) = stop_watch {
            if let Err(e) = tokio::spawn(watch().run(self.shutdown.clone(), true)).await {
                tracing::error!(error = %e, "the stop-reaction watch stopped");
            }
        }
        let r: Result<(), StoreError> = self
            .orchestrator
            .run_until_idle(self.shutdown.clone())
            .await;
        // The tasks that hold the orchestrator (the wake loop) end with the token, so the
        // console sees its channel close at once instead of waiting out its timeout.
        self.shutdown.cancel();
        Ended {
            result: r.map_err(StartError::from),
            unavailable,
            failure,
        }
    }
}
