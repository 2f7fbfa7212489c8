//! The daemon-wide budget at the wire: a daemon serving many repositories (a daemon file) has
//! one proxy server for all of them (and, until its next start, a repository's own for a store
//! whose runs were in flight on it), and its day's and month's stop limits
//! (`"daemon": {"budget": ...}` in the daemon file) count what every one of them forwards. They
//! share one file, `<data dir>/daemon/wire/spend.json`, read and written whole under
//! `spend.lock` (an exclusive file lock: the proxies are processes of their own):
//!
//! - `stops`: the limits whose action is `stop`, written by the daemon;
//! - `recorded`: by period (`YYYY-MM-DD`, `YYYY-MM`, UTC), the spend every served repository's
//!   budget has recorded (`autopilot/budget.json`), summed by the daemon: what each store's own
//!   period limits count as their baseline;
//! - `live`: by run, what the proxies saw answered for the runs whose spend is not recorded yet
//!   (each response's USD and tokens, the figures written to the run's ledger in its
//!   repository's store): what each store's limits count from the live runs' ledgers;
//! - `held`: the worst cases reserved by requests in flight, in any repository.
//!
//! A period's spend is `recorded` plus every `live` run plus what is `held`: the per-store
//! count, summed over the stores. A run's entry is marked once its repository has recorded its
//! spend ([`run_recorded`], when its files are forgotten) and dropped once a sum of the daemon
//! read [`RECORD_GRACE_SECS`] after the mark holds it, so a run is counted twice for a minute,
//! never nowhere. Before
//! a request is forwarded its worst case is reserved as [`super::reserve`] does for one store: a
//! limit with nothing left refuses it, what is left of a limit goes to one request at a time,
//! and once its answer is in its run's ledger the reservation is replaced by the real spend in
//! one write. A reservation whose proxy died with it is dropped after [`HOLD_TTL_SECS`], a run's
//! entry nothing updated for [`LIVE_TTL_SECS`].

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use super::error::ProxyError;
use super::ledger::Stopped;
use super::reserve::{OverLimit, Worst};
use crate::store::fsio;
use crate::store::{StoreError, StoreLock};

/// The file every proxy of a daemon shares, in the daemon's wire dir.
pub const SPEND_FILE: &str = "spend.json";
const LOCK_FILE: &str = "spend.lock";
/// A reservation older than this is taken for one whose proxy stopped before releasing it.
pub const HOLD_TTL_SECS: i64 = 3600;
/// A run's entry nothing updated (no answer, not forgotten) for this long is taken for one
/// whose daemon stopped before forgetting it.
pub const LIVE_TTL_SECS: i64 = 6 * 3600;
/// A run is forgotten as its step ends, a moment before its span (and its spend) is recorded:
/// its entry stays this long after, counted twice meanwhile rather than nowhere.
pub const RECORD_GRACE_SECS: i64 = 60;
/// Days of `recorded` kept (months: 2).
const DAYS_KEPT: usize = 3;

/// USD and tokens.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct Tally {
    pub usd: f64,
    pub tokens: u64,
}

impl Tally {
    pub fn add(&mut self, usd: f64, tokens: u64) {
        self.usd += usd;
        self.tokens = self.tokens.saturating_add(tokens);
    }
}

/// The daemon-wide limits whose action is `stop` (none: not enforced at the wire).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct WireStops {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub day_usd: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub day_tokens: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub month_usd: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub month_tokens: Option<u64>,
}

impl WireStops {
    pub fn is_empty(&self) -> bool {
        *self == WireStops::default()
    }
}

/// A request's reservation.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Held {
    pub usd: f64,
    pub tokens: u64,
    /// Less than its worst case: what was left of a limit.
    pub partial: bool,
    pub at: DateTime<Utc>,
}

/// A live run's spend as its proxy saw it.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LiveRun {
    pub usd: f64,
    pub tokens: u64,
    pub updated: DateTime<Utc>,
    /// When its repository recorded its spend (its entry goes once the daemon's sum is newer).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recorded_at: Option<DateTime<Utc>>,
}

/// `spend.json` (see the module documentation).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct DaemonSpend {
    pub stops: WireStops,
    pub recorded: BTreeMap<String, Tally>,
    pub live: BTreeMap<String, LiveRun>,
    pub held: BTreeMap<String, Held>,
}

/// `YYYY-MM-DD` and `YYYY-MM` of `now` (UTC).
pub fn periods(now: DateTime<Utc>) -> (String, String) {
    (
        now.format("%Y-%m-%d").to_string(),
        now.format("%Y-%m").to_string(),
    )
}

impl DaemonSpend {
    pub fn path(dir: &Path) -> PathBuf {
        dir.join(SPEND_FILE)
    }

    /// The file as it is (missing: empty; corrupt: an error naming it).
    pub fn load(dir: &Path) -> Result<DaemonSpend, ProxyError> {
        let path = DaemonSpend::path(dir);
        match fsio::read_json::<DaemonSpend>(&path) {
            Ok(spend) => Ok(spend.unwrap_or_default()),
            Err(StoreError::Unreadable { reason, .. }) => {
                Err(ProxyError::Unreadable { path, reason })
            }
            Err(e) => Err(e.into()),
        }
    }

    /// Change the file under its lock (blocking); written atomically when it changed.
    pub fn update<R>(
        dir: &Path,
        now: DateTime<Utc>,
        change: impl FnOnce(&mut DaemonSpend) -> R,
    ) -> Result<R, ProxyError> {
        std::fs::create_dir_all(dir).map_err(ProxyError::io("create", dir))?;
        let _lock = StoreLock::acquire(&dir.join(LOCK_FILE))?;
        let mut spend = DaemonSpend::load(dir)?;
        let before = spend.clone();
        spend.prune(now);
        let out = change(&mut spend);
        if spend != before {
            fsio::write_json_atomic(&DaemonSpend::path(dir), &spend)?;
        }
        Ok(out)
    }

    /// Reservations past their time, and periods long over, go.
    fn prune(&mut self, now: DateTime<Utc>) {
        self.held
            .retain(|_, h| (now - h.at).num_seconds() < HOLD_TTL_SECS);
        self.live
            .retain(|_, l| (now - l.updated).num_seconds() < LIVE_TTL_SECS);
        {
            let map = &mut self.recorded;
            let mut days: Vec<String> = map.keys().filter(|k| k.len() == 10).cloned().collect();
            let mut months: Vec<String> = map.keys().filter(|k| k.len() == 7).cloned().collect();
            days.sort();
            months.sort();
            let old_days = days.len().saturating_sub(DAYS_KEPT);
            let old_months = months.len().saturating_sub(2);
            for key in days
                .iter()
                .take(old_days)
                .chain(months.iter().take(old_months))
            {
                map.remove(key);
            }
        }
    }

    /// What the current `period` has spent: its recorded spend and every live run's.
    pub fn spent(&self, period: &str) -> Tally {
        let mut sum = self.recorded.get(period).copied().unwrap_or_default();
        for run in self.live.values() {
            sum.add(run.usd, run.tokens);
        }
        sum
    }

    /// The repositories' recorded spend of the day and the month (`day`, `month`: their
    /// keys), summed from ledgers read at `read_at`: the runs recorded before it leave `live`.
    pub fn set_recorded(
        &mut self,
        (day, day_spent): (String, Tally),
        (month, month_spent): (String, Tally),
        read_at: DateTime<Utc>,
    ) {
        self.recorded.insert(day, day_spent);
        self.recorded.insert(month, month_spent);
        let grace = chrono::Duration::seconds(RECORD_GRACE_SECS);
        self.live
            .retain(|_, l| l.recorded_at.is_none_or(|at| at + grace >= read_at));
    }

    /// What requests in flight hold, and how many of them hold less than their worst case.
    fn in_flight(&self) -> (Tally, usize) {
        let mut sum = Tally::default();
        let mut partial = 0;
        for held in self.held.values() {
            sum.add(held.usd, held.tokens);
            partial += usize::from(held.partial);
        }
        (sum, partial)
    }

    /// What is left under the tightest stop limit (USD, tokens), or the limit that has
    /// nothing left.
    fn room(&self, now: DateTime<Utc>) -> Result<(f64, u64, Option<Stopped>), OverLimit> {
        let (day, month) = periods(now);
        let (held, requests) = self.in_flight();
        let s = &self.stops;
        let mut usd_room = f64::INFINITY;
        let mut token_room = u64::MAX;
        let mut binding = None;
        for (period, what, key_usd, key_tokens, stop_usd, stop_tokens) in [
            (
                &day,
                "daily",
                "daemon.budget.day.usd",
                "daemon.budget.day.tokens",
                s.day_usd,
                s.day_tokens,
            ),
            (
                &month,
                "monthly",
                "daemon.budget.month.usd",
                "daemon.budget.month.tokens",
                s.month_usd,
                s.month_tokens,
            ),
        ] {
            let spent = self.spent(period);
            let held_note = if requests > 0 {
                format!("; {requests} request(s) in flight hold part of it")
            } else {
                String::new()
            };
            if let Some(stop) = stop_usd {
                let total = spent.usd + held.usd;
                let stopped = Stopped {
                    at: now,
                    limit: Some(key_usd.to_owned()),
                    spend_usd: total,
                    stop_usd: stop,
                    spend_tokens: None,
                    stop_tokens: None,
                };
                if total >= stop - 1e-9 {
                    return Err(OverLimit {
                        reason: format!(
                            "rover: the daemon's {what} budget stop limit is reached ({} of {} across every repository it serves, {key_usd} in the daemon file{held_note}); the request was not sent",
                            crate::agents::usd(total),
                            crate::agents::usd(stop)
                        ),
                        stopped,
                    });
                }
                if stop - total < usd_room {
                    usd_room = stop - total;
                    binding = Some(stopped);
                }
            }
            if let Some(stop) = stop_tokens {
                let total = spent.tokens.saturating_add(held.tokens);
                let stopped = Stopped {
                    at: now,
                    limit: Some(key_tokens.to_owned()),
                    spend_usd: spent.usd + held.usd,
                    stop_usd: 0.0,
                    spend_tokens: Some(total),
                    stop_tokens: Some(stop),
                };
                if total >= stop {
                    return Err(OverLimit {
                        reason: format!(
                            "rover: the daemon's {what} budget stop limit is reached ({total} of {stop} tokens across every repository it serves, {key_tokens} in the daemon file{held_note}); the request was not sent"
                        ),
                        stopped,
                    });
                }
                if stop - total < token_room {
                    token_room = stop - total;
                    binding.get_or_insert(stopped);
                }
            }
        }
        Ok((usd_room, token_room, binding))
    }

    /// Reserve `worst` (or what is left of the tightest limit) as `id`, or refuse.
    fn reserve(&mut self, id: &str, worst: Worst, now: DateTime<Utc>) -> Result<(), OverLimit> {
        let (usd_room, token_room, binding) = self.room(now)?;
        let partial = worst.usd > usd_room || worst.tokens > token_room;
        if partial && self.in_flight().1 > 0 {
            let stopped = binding.unwrap_or(Stopped {
                at: now,
                limit: None,
                spend_usd: 0.0,
                stop_usd: 0.0,
                spend_tokens: None,
                stop_tokens: None,
            });
            return Err(OverLimit {
                reason: format!(
                    "rover: what is left of the daemon's budget stop limit ({}) is held by a request in flight; the request was not sent",
                    stopped.describe()
                ),
                stopped,
            });
        }
        self.held.insert(
            id.to_owned(),
            Held {
                usd: worst.usd.min(usd_room).max(0.0),
                tokens: worst.tokens.min(token_room),
                partial,
                at: now,
            },
        );
        Ok(())
    }
}

/// A request's reservation in the daemon's file; released when dropped unless settled.
#[derive(Debug)]
pub(crate) struct DaemonHold {
    dir: PathBuf,
    id: String,
    run: String,
    done: bool,
}

/// Reserve `worst` against the daemon's stop limits in `dir` (blocking). `Ok(None)`: the
/// daemon sets no stop limit.
pub(crate) fn admit(
    dir: &Path,
    run: &str,
    worst: Worst,
) -> Result<Option<DaemonHold>, DaemonRefusal> {
    let id = Uuid::new_v4().to_string();
    let now = Utc::now();
    let admitted = DaemonSpend::update(dir, now, |spend| {
        if spend.stops.is_empty() {
            return Ok(false);
        }
        spend.reserve(&id, worst, now).map(|()| true)
    })
    .map_err(DaemonRefusal::Unreadable)?;
    match admitted {
        Ok(true) => Ok(Some(DaemonHold {
            dir: dir.to_owned(),
            id,
            run: run.to_owned(),
            done: false,
        })),
        Ok(false) => Ok(None),
        Err(over) => Err(DaemonRefusal::Over(over)),
    }
}

/// Why the daemon's limits did not admit a request.
#[derive(Debug)]
pub(crate) enum DaemonRefusal {
    Over(OverLimit),
    Unreadable(ProxyError),
}

impl DaemonHold {
    /// The answer's real spend replaces the reservation (blocking; after the run's ledger
    /// holds it).
    pub(crate) fn settle(mut self, usd: f64, tokens: u64) -> Result<(), ProxyError> {
        self.done = true;
        let now = Utc::now();
        DaemonSpend::update(&self.dir, now, |spend| {
            spend.held.remove(&self.id);
            let run = spend.live.entry(self.run.clone()).or_insert(LiveRun {
                usd: 0.0,
                tokens: 0,
                updated: now,
                recorded_at: None,
            });
            run.usd += usd;
            run.tokens = run.tokens.saturating_add(tokens);
            run.updated = now;
        })
    }

    fn release(dir: &Path, id: &str) {
        if let Err(e) = DaemonSpend::update(dir, Utc::now(), |spend| {
            spend.held.remove(id);
        }) {
            tracing::warn!(error = %e, "cannot release a reservation of the daemon's budget (it lapses in an hour)");
        }
    }
}

/// Run `run`'s spend is recorded in its repository's budget (blocking): its entry goes once the
/// daemon's sum holds it.
pub fn run_recorded(dir: &Path, run: &str) -> Result<(), ProxyError> {
    let now = Utc::now();
    DaemonSpend::update(dir, now, |spend| {
        if let Some(live) = spend.live.get_mut(run) {
            live.recorded_at = Some(now);
            live.updated = now;
        }
    })
}

impl Drop for DaemonHold {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        let (dir, id) = (self.dir.clone(), std::mem::take(&mut self.id));
        match tokio::runtime::Handle::try_current() {
            Ok(handle) => {
                handle.spawn_blocking(move || DaemonHold::release(&dir, &id));
            }
            Err(_) => DaemonHold::release(&dir, &id),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn worst(usd: f64, tokens: u64) -> Worst {
        Worst { usd, tokens }
    }

    fn live(usd: f64, tokens: u64) -> LiveRun {
        LiveRun {
            usd,
            tokens,
            updated: Utc::now(),
            recorded_at: None,
        }
    }

    #[test]
    fn a_period_counts_the_recorded_spend_the_live_runs_and_what_is_held() {
        let now = Utc::now();
        let (day, month) = periods(now);
        let mut spend = DaemonSpend {
            stops: WireStops {
                day_usd: Some(1.0),
                month_tokens: Some(10_000),
                ..WireStops::default()
            },
            ..DaemonSpend::default()
        };
        spend.recorded.insert(
            day.clone(),
            Tally {
                usd: 0.25,
                tokens: 10,
            },
        );
        spend.recorded.insert(
            month.clone(),
            Tally {
                usd: 0.25,
                tokens: 3990,
            },
        );
        spend.live.insert("run-a".into(), live(0.25, 10));
        assert_eq!(
            spend.spent(&day),
            Tally {
                usd: 0.5,
                tokens: 20
            }
        );
        // Room: $0.50 of the day, 6000 tokens of the month.
        spend.reserve("a", worst(0.2, 1000), now).expect("room");
        let (usd_room, token_room, _) = spend.room(now).expect("room");
        assert!((usd_room - 0.3).abs() < 1e-9, "{usd_room}");
        assert_eq!(token_room, 5000);
        // A request larger than what is left takes the remainder; a second one is refused.
        spend
            .reserve("b", worst(1.0, 10), now)
            .expect("the remainder");
        assert!(spend.held["b"].partial);
        let over = spend.reserve("c", worst(0.01, 10), now).expect_err("spent");
        assert_eq!(over.stopped.limit.as_deref(), Some("daemon.budget.day.usd"));
        assert!(
            over.reason.contains("across every repository"),
            "{}",
            over.reason
        );
        // The month's tokens once the day has room again.
        spend.held.clear();
        spend.stops.day_usd = None;
        spend.live.insert("run-b".into(), live(0.0, 6000));
        let over = spend.reserve("d", worst(0.01, 10), now).expect_err("spent");
        assert_eq!(
            over.stopped.limit.as_deref(),
            Some("daemon.budget.month.tokens")
        );
    }

    #[test]
    fn a_recorded_run_leaves_the_live_ones_once_the_daemons_sum_holds_it() {
        let dir = tempfile::tempdir().expect("tempdir");
        let now = Utc::now();
        let (day, month) = periods(now);
        DaemonSpend::update(dir.path(), now, |s| {
            s.live.insert("run-a".into(), live(0.5, 50));
            s.live.insert("run-b".into(), live(0.25, 5));
        })
        .expect("written");
        // Read right after run-a was recorded: it stays (its span may not be in the sum yet).
        run_recorded(dir.path(), "run-a").expect("marked");
        let read_before = Utc::now();
        let sums = |usd| {
            (
                (day.clone(), Tally { usd, tokens: 0 }),
                (month.clone(), Tally { usd, tokens: 0 }),
            )
        };
        DaemonSpend::update(dir.path(), Utc::now(), |s| {
            let (d, m) = sums(0.5);
            s.set_recorded(d, m, read_before);
        })
        .expect("written");
        let spend = DaemonSpend::load(dir.path()).expect("read");
        assert!(spend.live.contains_key("run-a"));
        assert!((spend.spent(&day).usd - 1.25).abs() < 1e-9);
        // Read a minute after: it goes, the other live run stays.
        let read_after = Utc::now() + chrono::Duration::seconds(RECORD_GRACE_SECS + 1);
        DaemonSpend::update(dir.path(), Utc::now(), |s| {
            let (d, m) = sums(0.5);
            s.set_recorded(d, m, read_after);
        })
        .expect("written");
        let spend = DaemonSpend::load(dir.path()).expect("read");
        assert_eq!(spend.live.keys().collect::<Vec<_>>(), ["run-b"]);
        assert!((spend.spent(&month).usd - 0.75).abs() < 1e-9);
    }

    #[test]
    fn holds_settle_into_the_runs_spend_or_are_released_and_lapse() {
        let dir = tempfile::tempdir().expect("tempdir");
        assert!(admit(dir.path(), "run-a", worst(1.0, 1))
            .expect("admitted")
            .is_none());
        DaemonSpend::update(dir.path(), Utc::now(), |s| {
            s.stops.day_usd = Some(2.0);
        })
        .expect("written");
        let hold = admit(dir.path(), "run-a", worst(1.5, 100))
            .expect("admitted")
            .expect("held");
        let second = admit(dir.path(), "run-b", worst(1.0, 100))
            .expect("admitted")
            .expect("held");
        assert!(matches!(
            admit(dir.path(), "run-c", worst(0.1, 1)),
            Err(DaemonRefusal::Over(_))
        ));
        hold.settle(0.75, 50).expect("settled");
        drop(second);
        let spend = DaemonSpend::load(dir.path()).expect("read");
        assert!(spend.held.is_empty(), "{spend:?}");
        assert_eq!(
            (spend.live["run-a"].usd, spend.live["run-a"].tokens),
            (0.75, 50)
        );
        assert!(!spend.live.contains_key("run-b"));
        // A reservation of a proxy that died lapses, and so does a run nothing updated.
        let mut spend = spend;
        let long_ago = Utc::now() - chrono::Duration::seconds(LIVE_TTL_SECS + 1);
        spend.held.insert(
            "old".into(),
            Held {
                usd: 5.0,
                tokens: 0,
                partial: false,
                at: long_ago,
            },
        );
        spend.live.get_mut("run-a").unwrap().updated = long_ago;
        spend.prune(Utc::now());
        assert!(spend.held.is_empty() && spend.live.is_empty());
        // A corrupt file is an error naming it.
        std::fs::write(DaemonSpend::path(dir.path()), "{").expect("write");
        let err = DaemonSpend::load(dir.path()).expect_err("corrupt");
        assert!(err.to_string().contains(SPEND_FILE), "{err}");
    }
}
