//! The events feed as a source: the poll loop (the feed whenever the poller is due, and the
//! reconcile sweeps), one poll's events into the store through [`super::ingest_in`] with the
//! poller's cursor in the same locked update. When to poll and which events are new is
//! `github::poll`'s (the wire's ETag, `X-Poll-Interval`, pages).

use std::sync::Arc;
use std::time::Duration;

use chrono::Utc;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use super::reconcile;
use super::{event_record, ingest_in, skipped_record, Arrival, IngestError, Ingested, Queue, Via};
use crate::github::{poll_once, GitHub, Poller};
use crate::store::{AutopilotStore, IntakeOutcome, IntakeRecord, StoreError};

/// Poll GitHub whenever the poller is due (it obeys `X-Poll-Interval` and rate limits), and
/// reconcile with the list APIs after a restart, after a gap in the feed and every
/// `reconcileIntervalSecs` (0: never).
#[allow(clippy::too_many_arguments, reason = "the loop's parts, passed once")]
pub async fn poll_loop(
    store: AutopilotStore,
    entry: super::Entry,
    github: Arc<dyn GitHub>,
    settings: crate::github::PollSettings,
    normalize: crate::github::NormalizeOptions,
    backlog: Option<usize>,
    queue: Arc<dyn Queue>,
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
        match init {
            Ok(Err(e)) => tracing::warn!(
                error = &e as &dyn std::error::Error,
                "cannot record the reconcile watermark"
            ),
            // A panic is the poller's: its supervisor restarts it (or stops the daemon) and says so.
            Err(join) if join.is_panic() => std::panic::resume_unwind(join.into_panic()),
            Ok(Ok(())) | Err(_) => {}
        }
    }
    let mut attempt = 0;
    loop {
        match poll_github(&store, &entry, github.as_ref(), &mut poller).await {
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
                    queue.wake();
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
            .run_if_due(&store, &entry, github.as_ref(), &normalize)
            .await
        {
            queue.wake();
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
pub struct PollEnd {
    /// A `--once` run could not reach GitHub after its retries: the last error.
    pub unavailable: Option<String>,
    /// The loop could not go on (an unreadable cursor): why.
    pub failed: Option<String>,
}

/// Retries of a failed poll within one `--once` run, and the first delay (doubling).
const ONCE_POLL_RETRIES: u32 = 3;
const ONCE_FIRST_DELAY: Duration = Duration::from_secs(1);

/// Whether a failed poll is GitHub being unavailable for now (5xx, network, a rate limit).
fn is_transient(error: &IngestError) -> bool {
    matches!(error, IngestError::GitHub(e) if e.is_retryable())
}

/// The delay before the next try of a `--once` poll that failed with `error` after `attempt`
/// retries; `None` to stop (not transient, out of retries, or a rate limit resetting later than
/// the run should wait).
fn once_retry_delay(error: &IngestError, attempt: u32) -> Option<Duration> {
    let IngestError::GitHub(error) = error else {
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

/// What one GitHub poll did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct IngestReport {
    pub polled: bool,
    pub not_modified: bool,
    pub new_traces: Vec<Uuid>,
    pub skipped: usize,
    /// How many pages of the feed were read.
    pub pages: usize,
    /// Relevant events of the backlog not processed on the first start.
    pub backlog_skipped: usize,
    /// Why events may have been missed, when they may have been (a reconcile is due).
    pub gap: Option<String>,
}

/// The poller, resumed from `cursor.json` (its ETag and the ids it has seen).
pub fn resume_poller(
    store: &AutopilotStore,
    settings: crate::github::PollSettings,
) -> Result<Poller, StoreError> {
    // A `poll` that does not parse fails the read of `cursor.json`, naming the file.
    let poll = store.read_cursor()?.poll.unwrap_or_default();
    Ok(Poller::new(settings, poll))
}

/// Poll GitHub once if due and start a trace for every new relevant event; every event not
/// acted on is recorded in `intake.jsonl` with its reason.
pub async fn poll_github(
    store: &AutopilotStore,
    entry: &super::Entry,
    github: &dyn GitHub,
    poller: &mut Poller,
) -> Result<IngestReport, IngestError> {
    let Some(result) = poll_once(github, poller, Utc::now()).await? else {
        return Ok(IngestReport::default());
    };
    let mut report = IngestReport {
        polled: true,
        not_modified: result.not_modified,
        skipped: result.skipped,
        pages: result.pages,
        backlog_skipped: result.backlog.len(),
        gap: result.gap.clone(),
        ..IngestReport::default()
    };
    let poll_cursor = poller.cursor().clone();
    let store = store.clone();
    let entry = entry.clone();
    report.new_traces = tokio::task::spawn_blocking(move || {
        let mut new = Vec::new();
        let mut records: Vec<IntakeRecord> = result
            .new_skipped
            .iter()
            .map(|s| skipped_record(s, Via::Poll))
            .collect();
        if !result.backlog.is_empty() {
            let reason = "backlog: already in the feed at the first start (`rover autopilot start --backlog N` processes the N most recent)";
            for event in &result.backlog {
                records.push(
                    event_record(event, Via::Poll, IntakeOutcome::Skipped).reason(reason),
                );
            }
            records.push(
                IntakeRecord::new(Via::Poll.as_str(), IntakeOutcome::Notice, Utc::now())
                    .reason(backlog_notice(result.backlog.len())),
            );
        }
        if let Some(gap) = &result.gap {
            records.push(
                IntakeRecord::new(Via::Poll.as_str(), IntakeOutcome::Notice, Utc::now())
                    .reason(format!("gap: {gap}")),
            );
        }
        // One locked update: the new traces, the poller's ETag and seen ids, and the intake
        // records (the skipped and notices first, then each event's), so an arrival by another
        // path is logged after them; a crash before it leaves the poll to be done again.
        store.transact(|txn| {
            for record in records {
                txn.record_intake(record);
            }
            for event in &result.new_events {
                let arrival = Arrival::Github {
                    event,
                    via: Via::Poll,
                };
                if let Ingested::New(trace) = ingest_in(&store, txn, &entry, arrival)? {
                    new.push(trace);
                }
            }
            txn.cursor_mut()?.poll = Some(poll_cursor);
            Ok(())
        })?;
        Ok::<_, StoreError>(new)
    })
    .await
    .expect("ingestion does not panic")?;
    Ok(report)
}

/// What the first start says about the backlog it skipped.
pub fn backlog_notice(skipped: usize) -> String {
    format!(
        "first start: skipped {skipped} backlog event(s) already in the feed; to process the N most recent, restart with `rover autopilot start --backlog N` (or set autopilot.github.poll.backlog before a first start); `rover autopilot events` lists them"
    )
}
