//! The budget of a daemon serving many repositories (`"daemon": {"budget": ...}` in the daemon
//! file), above each repository's own `autopilot.budget`: day's and month's limits in USD and
//! tokens, summed across every repository served, and a circuit breaker that opens when
//! several repositories' breakers are open.
//!
//! ```json
//! "budget": {
//!   "day": {"usd": 50, "tokens": 20000000, "action": "stop"},
//!   "month": {"usd": 800, "action": "pause"},
//!   "circuitBreaker": {"maxTrippedRepositories": 2}
//! }
//! ```
//!
//! A period's spend is what the repositories' budgets recorded (the sum of their
//! `autopilot/budget.json`) plus what their proxies saw answered for the runs not recorded yet
//! (the daemon's wire file, [`crate::proxy::DaemonSpend`]). Over a limit, `warn` logs it once; `pause` and `stop` hold
//! every repository's new agent runs (the shared slots say why); `stop` also refuses model
//! requests at the wire, in every repository, running ones included.

use chrono::{DateTime, Utc};
use serde::Deserialize;

use super::ledger::Ledger;
use super::settings::BudgetAction;
use super::usage::usd;
use crate::proxy::{Tally, WireStops};

/// A calendar period's daemon-wide limits (UTC). A limit left out is no limit.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "camelCase")]
pub struct DaemonPeriodLimit {
    pub usd: Option<f64>,
    /// Tokens (input, cached, cache-write and output) of every agent call.
    pub tokens: Option<u64>,
    pub action: BudgetAction,
}

/// The daemon-wide circuit breaker.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "camelCase")]
pub struct DaemonBreakerSettings {
    /// Repositories whose own circuit breaker is open that hold every repository's new agent
    /// runs; 0 turns it off.
    pub max_tripped_repositories: u32,
}

impl Default for DaemonBreakerSettings {
    fn default() -> DaemonBreakerSettings {
        DaemonBreakerSettings {
            max_tripped_repositories: 3,
        }
    }
}

/// The daemon file's `"daemon": {"budget": ...}`.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "camelCase")]
pub struct DaemonBudgetSettings {
    pub day: DaemonPeriodLimit,
    pub month: DaemonPeriodLimit,
    pub circuit_breaker: DaemonBreakerSettings,
}

impl DaemonBudgetSettings {
    /// What is wrong with it (named by its key under `at`), if anything.
    pub fn check(&self, at: &str) -> Result<(), String> {
        for (name, period) in [("day", &self.day), ("month", &self.month)] {
            if let Some(usd) = period.usd.filter(|u| !u.is_finite() || *u <= 0.0) {
                return Err(format!(
                    "{at}.budget.{name}.usd is {usd}: give a positive amount in USD, or leave it out for no limit"
                ));
            }
            if period.tokens == Some(0) {
                return Err(format!(
                    "{at}.budget.{name}.tokens is 0: give a positive count, or leave it out for no limit"
                ));
            }
        }
        Ok(())
    }

    /// The limits whose action is `stop`, as the proxies enforce them.
    pub fn wire_stops(&self) -> WireStops {
        let stop = |p: &DaemonPeriodLimit| p.action == BudgetAction::Stop;
        WireStops {
            day_usd: self.day.usd.filter(|_| stop(&self.day)),
            day_tokens: self.day.tokens.filter(|_| stop(&self.day)),
            month_usd: self.month.usd.filter(|_| stop(&self.month)),
            month_tokens: self.month.tokens.filter(|_| stop(&self.month)),
        }
    }

    /// Whether it sets any limit of spend.
    pub fn has_limits(&self) -> bool {
        [&self.day, &self.month]
            .iter()
            .any(|p| p.usd.is_some() || p.tokens.is_some())
    }
}

/// What the repositories' budgets recorded for the day and the month of `now`, summed.
pub fn recorded_sum<'a>(
    ledgers: impl IntoIterator<Item = &'a Ledger>,
    now: DateTime<Utc>,
) -> (Tally, Tally) {
    let mut day = Tally::default();
    let mut month = Tally::default();
    for ledger in ledgers {
        let today = ledger.today(now);
        day.add(today.cost_usd, today.tokens());
        let this_month = ledger.this_month(now);
        month.add(this_month.cost_usd, this_month.tokens());
    }
    (day, month)
}

/// A limit reached: its key, its action, and what to say.
#[derive(Debug, Clone, PartialEq)]
pub struct DaemonOver {
    pub key: String,
    pub action: BudgetAction,
    pub reason: String,
}

/// The limits `day` and `month` (the daemon-wide spend of the periods of `now`) have reached.
pub fn over_limits(settings: &DaemonBudgetSettings, day: Tally, month: Tally) -> Vec<DaemonOver> {
    let mut out = Vec::new();
    for (name, what, resets, limit, spent) in [
        (
            "day",
            "daily",
            "it resets at midnight UTC",
            &settings.day,
            day,
        ),
        (
            "month",
            "monthly",
            "it resets on the 1st (UTC)",
            &settings.month,
            month,
        ),
    ] {
        if let Some(stop) = limit.usd.filter(|l| spent.usd >= *l) {
            out.push(DaemonOver {
                key: format!("daemon.budget.{name}.usd"),
                action: limit.action,
                reason: format!(
                    "the daemon's {what} budget is spent ({} of {} across every repository it serves; daemon.budget.{name} in the daemon file); {resets}",
                    usd(spent.usd),
                    usd(stop)
                ),
            });
        }
        if let Some(stop) = limit.tokens.filter(|l| spent.tokens >= *l) {
            out.push(DaemonOver {
                key: format!("daemon.budget.{name}.tokens"),
                action: limit.action,
                reason: format!(
                    "the daemon's {what} budget is spent ({} of {stop} tokens across every repository it serves; daemon.budget.{name} in the daemon file); {resets}",
                    spent.tokens
                ),
            });
        }
    }
    out
}

/// Why the daemon-wide circuit breaker is open (`tripped`: the repositories whose own breaker
/// is open), if it is.
pub fn breaker_open(settings: &DaemonBudgetSettings, tripped: &[String]) -> Option<String> {
    let max = settings.circuit_breaker.max_tripped_repositories as usize;
    (max > 0 && tripped.len() >= max).then(|| {
        format!(
            "the daemon's circuit breaker is open: {} repositories have their own breaker open ({}; daemon.budget.circuitBreaker.maxTrippedRepositories is {max}); run `rover autopilot resume` in them to take new work",
            tripped.len(),
            tripped.join(", ")
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::budget::SpanUsage;

    #[test]
    fn the_repositories_spend_is_summed_and_each_limit_says_its_key() {
        let now = Utc::now();
        let day = crate::budget::day_key(now);
        let ledger = |usd: f64, tokens: u64| {
            let mut l = Ledger::default();
            l.days.insert(
                day.clone(),
                SpanUsage {
                    cost_usd: usd,
                    input_tokens: tokens,
                    ..SpanUsage::default()
                },
            );
            l
        };
        let ledgers = [ledger(0.5, 100), ledger(0.75, 50), Ledger::default()];
        let (d, m) = recorded_sum(&ledgers, now);
        assert!((d.usd - 1.25).abs() < 1e-9 && d.tokens == 150, "{d:?}");
        assert!((m.usd - d.usd).abs() < 1e-9 && m.tokens == 150, "{m:?}");
        let settings: DaemonBudgetSettings = serde_json::from_str(
            r#"{"day": {"usd": 1, "action": "stop"}, "month": {"tokens": 1000, "action": "pause"}}"#,
        )
        .unwrap();
        let over = over_limits(&settings, d, m);
        assert_eq!(over.len(), 1, "{over:?}");
        assert_eq!(over[0].key, "daemon.budget.day.usd");
        assert_eq!(over[0].action, BudgetAction::Stop);
        assert!(
            over[0].reason.contains("$1.25 of $1.00"),
            "{}",
            over[0].reason
        );
        assert_eq!(
            settings.wire_stops(),
            WireStops {
                day_usd: Some(1.0),
                ..WireStops::default()
            }
        );
        // The breaker: 3 by default.
        let tripped = ["a/x".to_owned(), "b/y".to_owned()];
        assert!(breaker_open(&settings, &tripped).is_none());
        let mut two = settings.clone();
        two.circuit_breaker.max_tripped_repositories = 2;
        assert!(breaker_open(&two, &tripped).unwrap().contains("a/x, b/y"));
        two.circuit_breaker.max_tripped_repositories = 0;
        assert!(breaker_open(&two, &tripped).is_none());
    }

    #[test]
    fn a_limit_that_cannot_work_is_an_error_naming_its_key() {
        for (text, says) in [
            (r#"{"day": {"usd": 0}}"#, "daemon.budget.day.usd is 0"),
            (
                r#"{"month": {"tokens": 0}}"#,
                "daemon.budget.month.tokens is 0",
            ),
        ] {
            let s: DaemonBudgetSettings = serde_json::from_str(text).unwrap();
            let err = s.check("daemon").unwrap_err();
            assert!(err.contains(says), "{text}: {err}");
        }
        let err =
            serde_json::from_str::<DaemonBudgetSettings>(r#"{"day": {"usdd": 1}}"#).unwrap_err();
        assert!(err.to_string().contains("usdd"), "{err}");
    }
}
