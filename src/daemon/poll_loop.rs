//! The GitHub poll loop: the events feed whenever the poller is due, and the reconcile sweeps.

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::reconcile;
use crate::github::GitHub;
use crate::orchestrator::StepOrchestrator;
use crate::steps::event::{backlog_notice, poll_github, resume_poller};
use crate::store::AutopilotStore;

/// Poll GitHub whenever the poller is due (it obeys `X-Poll-Interval` and rate limits), and
/// reconcile with the list APIs after a restart, after a gap in the feed and every
/// `reconcileIntervalSecs` (0: never).
#[allow(clippy::too_many_arguments, reason = "the loop's parts, passed once")]
pub(super) async fn poll_loop(
    store: AutopilotStore,
    project_id: String,
    github: Arc<dyn GitHub>,
    settings: crate::github::PollSettings,
    normalize: crate::github::NormalizeOptions,
    backlog: Option<usize>,
    orchestrator: StepOrchestrator,
    shutdown: CancellationToken,
    once: bool,
) -> PollEnd {
    let mut poller = match resume_poller(&store, settings) {
        Ok(p) => match backlog {
            Some(n) => p.with_backlog(n),
            None => p,
        },
        Err(e) => {
            tracing::error!(
                error = &e as &dyn std::error::Error,
                "cannot read the event cursor; not polling"
            );
            println!("error: cannot read the event cursor: {e}; not polling GitHub");
            return PollEnd {
                failed: Some(format!("cannot read the event cursor: {e}")),
                ..PollEnd::default()
            };
        }
    };
    // A restart sweeps what happened while rover was down; a first start has nothing before it
    // (the backlog is the poller's), so the sweeps start from now.
    let restart = poller.cursor().primed;
    let mut reconciler = reconcile::Reconciler::new(poller.settings(), restart);
    if reconciler.enabled() && !restart {
        let store = store.clone();
        let now = chrono::Utc::now();
        let init =
            tokio::task::spawn_blocking(move || reconcile::init_reconcile_watermark(&store, now))
                .await;
        if let Ok(Err(e)) = init {
            tracing::warn!(
                error = &e as &dyn std::error::Error,
                "cannot record the reconcile watermark"
            );
        }
    }
    let mut attempt = 0;
    loop {
        match poll_github(&store, &project_id, github.as_ref(), &mut poller).await {
            Ok(report) => {
                if report.backlog_skipped > 0 {
                    let notice = backlog_notice(report.backlog_skipped);
                    tracing::info!(skipped = report.backlog_skipped, "{notice}");
                    println!("{notice}");
                }
                if let Some(gap) = &report.gap {
                    tracing::warn!(gap = %gap, "a gap in the events feed may exist");
                    println!("warning: a gap in the events feed may exist: {gap}");
                    reconciler.on_gap();
                }
                if !report.new_traces.is_empty() {
                    println!("{} new event(s) from GitHub", report.new_traces.len());
                    orchestrator.wake();
                }
            }
            Err(e) => {
                tracing::warn!(
                    error = &e as &dyn std::error::Error,
                    attempt,
                    "polling GitHub failed"
                );
                println!(
                    "warning: polling GitHub failed: {}",
                    crate::error::error_chain(&e)
                );
                // A `--once` run retries a blip within itself, a few times with backoff and
                // never past a rate limit's reset; then it says GitHub is unavailable (75).
                if once {
                    match once_retry_delay(&e, attempt) {
                        Some(delay) => {
                            attempt += 1;
                            tokio::select! {
                                () = shutdown.cancelled() => return PollEnd::default(),
                                () = tokio::time::sleep(delay) => {}
                            }
                            poller.retry_now();
                            continue;
                        }
                        // Still down after the retries: try again later (75).
                        None if is_transient(&e) => {
                            return PollEnd {
                                unavailable: Some(crate::error::error_chain(&e)),
                                failed: None,
                            }
                        }
                        // Not a blip (credentials, a store error): warned, as in the daemon.
                        None => {}
                    }
                }
            }
        }
        if reconciler
            .run_if_due(&store, &project_id, github.as_ref(), &normalize)
            .await
        {
            orchestrator.wake();
        }
        if once {
            return PollEnd::default();
        }
        let mut wait = poller
            .next_poll_at()
            .and_then(|at| (at - chrono::Utc::now()).to_std().ok())
            .unwrap_or(Duration::from_secs(60))
            .max(Duration::from_millis(100));
        if let Some(until) = reconciler.until_next() {
            wait = wait.min(until.max(Duration::from_millis(100)));
        }
        tokio::select! {
            () = shutdown.cancelled() => return PollEnd::default(),
            () = tokio::time::sleep(wait) => {}
        }
    }
}

/// How the poll loop ended.
#[derive(Debug, Default)]
pub(super) struct PollEnd {
    /// A `--once` run could not reach GitHub after its retries: the last error.
    pub unavailable: Option<String>,
    /// The loop could not go on (an unreadable cursor): why.
    pub failed: Option<String>,
}

/// Retries of a failed poll within one `--once` run, and the first delay (doubling).
const ONCE_POLL_RETRIES: u32 = 3;
const ONCE_FIRST_DELAY: Duration = Duration::from_secs(1);

/// Whether a failed poll is GitHub being unavailable for now (5xx, network, a rate limit).
fn is_transient(error: &crate::steps::event::IngestError) -> bool {
    matches!(error, crate::steps::event::IngestError::GitHub(e) if e.is_retryable())
}

/// The delay before the next try of a `--once` poll that failed with `error` after `attempt`
/// retries; `None` to stop (not transient, out of retries, or a rate limit resetting later than
/// the run should wait).
fn once_retry_delay(error: &crate::steps::event::IngestError, attempt: u32) -> Option<Duration> {
    let crate::steps::event::IngestError::GitHub(error) = error else {
        return None;
    };
    if !error.is_retryable() || attempt >= ONCE_POLL_RETRIES {
        return None;
    }
    let backoff = ONCE_FIRST_DELAY * 2u32.pow(attempt);
    match error.retry_at() {
        Some(at) => {
            let until = (at - chrono::Utc::now()).to_std().unwrap_or_default();
            (until <= Duration::from_secs(60)).then(|| until.max(backoff))
        }
        None => Some(backoff),
    }
}
