//! The daemon-wide budget at the wire: a daemon serving many repositories (a daemon file) has
//! one proxy server per repository's store, and its day's and month's stop limits
//! (`"daemon": {"budget": ...}` in the daemon file) count what every one of them forwards. They
//! share one file, `<data dir>/daemon/wire/spend.json`, read and written whole under
//! `spend.lock` (an exclusive file lock: the proxies are processes of their own):
//!
//! - `stops`: the limits whose action is `stop`, written by the daemon;
//! - `recorded`: by period (`YYYY-MM-DD`, `YYYY-MM`, UTC), the spend every served repository's
//!   budget has recorded (`autopilot/budget.json`), summed by the daemon;
//! - `wire`: by period, what the proxies saw answered (each response's USD and tokens, the
//!   figures written to the run's ledger in its repository's store);
//! - `held`: the worst cases reserved by requests in flight, in any repository.
//!
//! A period's spend is the larger of `recorded` and `wire` (each counts the same requests, one
//! once they are recorded, the other as they are answered; the larger never counts one twice)
//! plus what is held. Before a request is forwarded its worst case is reserved as
//! [`super::reserve`] does for one store: a limit with nothing left refuses it, what is left of
//! a limit goes to one request at a time, and once its answer is in its run's ledger the
//! reservation is replaced by the real spend in one write. A reservation whose proxy died
//! with it is dropped after [`HOLD_TTL_SECS`].

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
/// Days of `wire` and `recorded` kept (months: 2).
const DAYS_KEPT: usize = 3;

/// USD and tokens.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct Tally {
    pub usd: f64,
    pub tokens: u64,
}

impl Tally {
    /// The larger of each.
    #[must_use]
    pub fn max(self, other: Tally) -> Tally {
        Tally {
            usd: self.usd.max(other.usd),
            tokens: self.tokens.max(other.tokens),
        }
    }

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

/// `spend.json` (see the module documentation).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct DaemonSpend {
    pub stops: WireStops,
    pub recorded: BTreeMap<String, Tally>,
    pub wire: BTreeMap<String, Tally>,
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
        for map in [&mut self.recorded, &mut self.wire] {
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

    /// What `period` has spent: the larger of the recorded and the wire spend.
    pub fn spent(&self, period: &str) -> Tally {
        let get = |map: &BTreeMap<String, Tally>| map.get(period).copied().unwrap_or_default();
        get(&self.recorded).max(get(&self.wire))
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
    done: bool,
}

/// Reserve `worst` against the daemon's stop limits in `dir` (blocking). `Ok(None)`: the
/// daemon sets no stop limit.
pub(crate) fn admit(dir: &Path, worst: Worst) -> Result<Option<DaemonHold>, DaemonRefusal> {
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
        let (day, month) = periods(now);
        DaemonSpend::update(&self.dir, now, |spend| {
            spend.held.remove(&self.id);
            for period in [day, month] {
                spend.wire.entry(period).or_default().add(usd, tokens);
            }
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

    #[test]
    fn a_period_counts_the_larger_of_recorded_and_wire_spend_and_what_is_held() {
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
                usd: 0.5,
                tokens: 10,
            },
        );
        spend.wire.insert(
            day.clone(),
            Tally {
                usd: 0.25,
                tokens: 4000,
            },
        );
        spend.wire.insert(
            month.clone(),
            Tally {
                usd: 0.25,
                tokens: 4000,
            },
        );
        assert_eq!(
            spend.spent(&day),
            Tally {
                usd: 0.5,
                tokens: 4000
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
        spend.wire.insert(
            month,
            Tally {
                usd: 0.25,
                tokens: 10_000,
            },
        );
        let over = spend.reserve("d", worst(0.01, 10), now).expect_err("spent");
        assert_eq!(
            over.stopped.limit.as_deref(),
            Some("daemon.budget.month.tokens")
        );
    }

    #[test]
    fn holds_settle_into_the_wire_spend_or_are_released_and_lapse() {
        let dir = tempfile::tempdir().expect("tempdir");
        assert!(admit(dir.path(), worst(1.0, 1))
            .expect("admitted")
            .is_none());
        DaemonSpend::update(dir.path(), Utc::now(), |s| {
            s.stops.day_usd = Some(2.0);
        })
        .expect("written");
        let hold = admit(dir.path(), worst(1.5, 100))
            .expect("admitted")
            .expect("held");
        let second = admit(dir.path(), worst(1.0, 100))
            .expect("admitted")
            .expect("held");
        assert!(matches!(
            admit(dir.path(), worst(0.1, 1)),
            Err(DaemonRefusal::Over(_))
        ));
        hold.settle(0.75, 50).expect("settled");
        drop(second);
        let spend = DaemonSpend::load(dir.path()).expect("read");
        assert!(spend.held.is_empty(), "{spend:?}");
        let (day, month) = periods(Utc::now());
        assert_eq!(
            spend.wire[&day],
            Tally {
                usd: 0.75,
                tokens: 50
            }
        );
        assert_eq!(
            spend.wire[&month],
            Tally {
                usd: 0.75,
                tokens: 50
            }
        );
        // A reservation of a proxy that died lapses.
        let mut spend = spend;
        spend.held.insert(
            "old".into(),
            Held {
                usd: 5.0,
                tokens: 0,
                partial: false,
                at: Utc::now() - chrono::Duration::seconds(HOLD_TTL_SECS + 1),
            },
        );
        spend.prune(Utc::now());
        assert!(spend.held.is_empty());
        // A corrupt file is an error naming it.
        std::fs::write(DaemonSpend::path(dir.path()), "{").expect("write");
        let err = DaemonSpend::load(dir.path()).expect_err("corrupt");
        assert!(err.to_string().contains(SPEND_FILE), "{err}");
    }
}
