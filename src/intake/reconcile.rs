//! Reconcile as a source: a sweep of the list APIs (`github::reconcile`) for events neither the
//! feed nor a webhook brought, after a restart, after a gap in the feed and every
//! `reconcileIntervalSecs`. What no path ingested yet starts a trace through the same
//! [`super::ingest`] (and its content-key matching); the watermark is kept in `cursor.json`
//! under `reconcile`.

use std::time::{Duration, Instant};

use chrono::Utc;
use uuid::Uuid;

use super::{ingest, Arrival, IngestError, Ingested, Via};
use crate::github::{GitHub, NormalizeOptions, PollSettings};
use crate::store::{AutopilotStore, IntakeOutcome, IntakeRecord, ReconcileCursor, StoreError};

/// When to reconcile next, and why.
#[derive(Debug)]
pub struct Reconciler {
    every: Duration,
    enabled: bool,
    why: Option<String>,
    next: Instant,
}

impl Reconciler {
    /// A restart (the poller's cursor was primed) sweeps at once; a first start sweeps nothing
    /// before itself.
    pub fn new(settings: &PollSettings, restart: bool) -> Self {
        let enabled = settings.reconcile_interval_secs > 0;
        let every = Duration::from_secs(settings.reconcile_interval_secs);
        Self {
            every,
            enabled,
            why: (enabled && restart).then(|| "restart".to_owned()),
            next: Instant::now() + every,
        }
    }

    pub fn enabled(&self) -> bool {
        self.enabled
    }

    /// A gap in the feed: sweep after this poll.
    pub fn on_gap(&mut self) {
        if self.enabled {
            self.why = Some("a gap in the events feed".into());
        }
    }

    /// Why a sweep is due now, if one is.
    fn due(&mut self) -> Option<String> {
        if self.enabled && self.why.is_none() && Instant::now() >= self.next {
            self.why = Some("periodic".into());
        }
        self.why.take()
    }

    /// How long until the next periodic sweep.
    pub fn until_next(&self) -> Option<Duration> {
        self.enabled
            .then(|| self.next.saturating_duration_since(Instant::now()))
    }

    /// Sweep if due: report on stdout and in the log; a failure is retried after the next poll.
    /// Returns whether traces were started.
    pub async fn run_if_due(
        &mut self,
        store: &AutopilotStore,
        entry: &super::Entry,
        github: &dyn GitHub,
        normalize: &NormalizeOptions,
    ) -> bool {
        let Some(why) = self.due() else {
            return false;
        };
        let fallback =
            Utc::now() - chrono::TimeDelta::from_std(self.every).unwrap_or(chrono::TimeDelta::MAX);
        self.next = Instant::now() + self.every;
        match reconcile_github(store, entry, github, normalize, fallback, &why).await {
            Ok(report) => {
                tracing::info!(why = %why, since = %report.since, found = report.found, new = report.new_traces.len(), "reconciled with the list APIs");
                if !report.new_traces.is_empty() {
                    println!(
                        "reconcile ({why}): {} event(s) the feed and webhooks missed",
                        report.new_traces.len()
                    );
                }
                !report.new_traces.is_empty()
            }
            Err(e) => {
                tracing::warn!(error = &e as &dyn std::error::Error, why = %why, "reconciling with GitHub failed");
                println!(
                    "warning: reconciling with GitHub failed: {}; retrying after the next poll",
                    crate::error::error_chain(&e)
                );
                self.why = Some(why);
                false
            }
        }
    }
}

/// Sweeps overlap by this much, so an item stamped a little before the last sweep started is
/// still found (found twice, it is recognised by its content key).
const RECONCILE_OVERLAP_SECS: i64 = 60;

/// The watermark, if any (a `reconcile` that does not parse fails the read of `cursor.json`).
fn read_reconcile_cursor(store: &AutopilotStore) -> Result<Option<ReconcileCursor>, StoreError> {
    Ok(store.read_cursor()?.reconcile)
}

/// Record `at` as the reconcile watermark unless there is one: a first start has nothing
/// before it to reconcile (the backlog is the poller's). Blocking (store I/O).
pub fn init_reconcile_watermark(
    store: &AutopilotStore,
    at: chrono::DateTime<Utc>,
) -> Result<(), StoreError> {
    // GitHub's times have whole seconds: something created in the second rover started is
    // after it.
    let at = chrono::DurationRound::duration_trunc(at, chrono::TimeDelta::seconds(1)).unwrap_or(at);
    store.transact(|txn| {
        let cursor = txn.cursor_mut()?;
        if cursor.reconcile.is_none() {
            cursor.reconcile = Some(ReconcileCursor {
                last_run_at: Some(at),
                since: None,
                not_before: Some(at),
            });
        }
        Ok(())
    })
}

/// What one reconcile did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReconcileReport {
    pub since: chrono::DateTime<Utc>,
    /// Events the list APIs showed since then.
    pub found: usize,
    /// Of them, the ones no path had ingested: each started a trace.
    pub new_traces: Vec<Uuid>,
}

/// Sweep the list APIs since the watermark (or `fallback` without one) and start a trace for
/// every event found that no path ingested yet; then move the watermark. `why` is recorded.
pub async fn reconcile_github(
    store: &AutopilotStore,
    entry: &super::Entry,
    github: &dyn GitHub,
    options: &NormalizeOptions,
    fallback: chrono::DateTime<Utc>,
    why: &str,
) -> Result<ReconcileReport, IngestError> {
    let started = Utc::now();
    let watermark = {
        let store = store.clone();
        tokio::task::spawn_blocking(move || read_reconcile_cursor(&store))
            .await
            .expect("reading the cursor does not panic")?
    };
    let watermark = watermark.unwrap_or_default();
    let not_before = watermark.not_before;
    let since = watermark
        .last_run_at
        .map_or(fallback, |t| {
            t - chrono::TimeDelta::seconds(RECONCILE_OVERLAP_SECS)
        })
        .max(not_before.unwrap_or(chrono::DateTime::<Utc>::MIN_UTC));
    let sweep = crate::github::reconcile::sweep(github, since, options).await?;
    let found = sweep.events.len();
    let store = store.clone();
    let entry = entry.clone();
    let why = why.to_owned();
    let new_traces = tokio::task::spawn_blocking(move || {
        // Only what no path ingested: an event polled or delivered already is left alone.
        let known: std::collections::HashSet<String> = store
            .read_cursor()?
            .event_keys
            .into_iter()
            .map(|k| k.key)
            .collect();
        let mut new = Vec::new();
        let mut records = Vec::new();
        for event in &sweep.events {
            if event.dedupe_key.as_ref().is_some_and(|k| known.contains(k)) {
                continue;
            }
            // Its intake record goes with it (none when a later sweep finds it again).
            let arrival = Arrival::Github {
                event,
                via: Via::Reconcile,
            };
            if let Ingested::New(trace) = ingest(&store, &entry, arrival)? {
                new.push(trace);
            }
        }
        store.transact(|txn| {
            let value = ReconcileCursor {
                last_run_at: Some(started),
                since: Some(since),
                not_before,
            };
            txn.cursor_mut()?.reconcile = Some(value);
            Ok(())
        })?;
        if !new.is_empty() {
            records.push(
                IntakeRecord::new(Via::Reconcile.as_str(), IntakeOutcome::Notice, Utc::now())
                    .reason(format!(
                        "reconcile ({why}): {} event(s) since {} that neither the feed nor a webhook brought; each started a trace",
                        new.len(),
                        since.to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
                    )),
            );
        }
        store.append_intake(&records)?;
        Ok::<_, StoreError>(new)
    })
    .await
    .expect("ingestion does not panic")?;
    Ok(ReconcileReport {
        since,
        found,
        new_traces,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(secs: u64) -> PollSettings {
        PollSettings {
            reconcile_interval_secs: secs,
            ..PollSettings::default()
        }
    }

    #[test]
    fn the_watermark_is_a_field_of_the_cursor_and_one_that_does_not_parse_names_cursor_json() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = AutopilotStore::open(dir.path(), "reconcile-cursor").expect("opens");
        let at = chrono::DateTime::parse_from_rfc3339("2026-01-02T03:04:05Z")
            .expect("a time")
            .with_timezone(&Utc);
        init_reconcile_watermark(&store, at).expect("records the watermark");
        let path = store.cursor_path();
        let mut on_disk: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&path).expect("reads")).expect("json");
        assert_eq!(
            on_disk["reconcile"],
            serde_json::json!({
                "lastRunAt": "2026-01-02T03:04:05Z", "since": null, "notBefore": "2026-01-02T03:04:05Z"
            })
        );
        let read = read_reconcile_cursor(&store)
            .expect("reads")
            .expect("a watermark");
        assert_eq!(read.not_before, Some(at));

        on_disk["reconcile"] = serde_json::json!({"lastRunAt": 7});
        std::fs::write(&path, serde_json::to_vec(&on_disk).expect("json")).expect("writes");
        let err = read_reconcile_cursor(&store).expect_err("a watermark that does not parse");
        assert!(err.to_string().contains("cursor.json"), "{err}");
    }

    #[test]
    fn a_restart_and_a_gap_make_a_sweep_due_once_each() {
        let mut r = Reconciler::new(&settings(900), true);
        assert_eq!(r.due().as_deref(), Some("restart"));
        assert_eq!(r.due(), None, "not again until the interval passes");
        r.on_gap();
        assert_eq!(r.due().as_deref(), Some("a gap in the events feed"));
        assert_eq!(r.due(), None);
        assert!(r.until_next().is_some());

        let mut first = Reconciler::new(&settings(900), false);
        assert_eq!(first.due(), None, "a first start has nothing before it");
    }

    #[test]
    fn zero_turns_reconcile_off() {
        let mut r = Reconciler::new(&settings(0), true);
        r.on_gap();
        assert_eq!(r.due(), None);
        assert_eq!(r.until_next(), None);
        assert!(!r.enabled());
    }
}
