//! `autopilot.budget` in `rover.json`: spending limits per trace, day and month, the circuit
//! breaker, hourly caps on traces and pull requests, and stuck detection of workflow agents.

use serde::{Deserialize, Serialize};

/// What rover does when a limit is reached.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum BudgetAction {
    /// Log it and note it in the trace; work goes on.
    #[default]
    Warn,
    /// Finish running work, start no new trace until the limit allows.
    Pause,
    /// Cancel running agents (their traces end with a budget notify) and start no new trace.
    Stop,
}

/// Limits of one trace. A limit left out is no limit.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "camelCase")]
pub struct TraceLimits {
    /// Tokens (input + output) of all agent calls of the trace.
    pub tokens: Option<u64>,
    /// USD of all agent calls of the trace.
    pub usd: Option<f64>,
    /// Seconds since the trace's event.
    pub wall_secs: Option<u64>,
    /// `warn`, or `pause`/`stop` (both stop the trace: a trace cannot be paused alone).
    pub action: BudgetAction,
}

/// A spending limit of a calendar period (UTC).
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "camelCase")]
pub struct PeriodLimit {
    pub usd: Option<f64>,
    pub action: BudgetAction,
}

/// The circuit breaker: consecutive failed traces pause new work until `rover autopilot resume`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "camelCase")]
pub struct BreakerSettings {
    /// Failed traces in a row that trip the breaker; 0 turns it off.
    pub max_consecutive_failures: u32,
    /// Also post a notify on the channel of the trace that tripped it.
    pub notify: bool,
}

impl Default for BreakerSettings {
    fn default() -> BreakerSettings {
        BreakerSettings {
            max_consecutive_failures: 3,
            notify: true,
        }
    }
}

/// Hourly caps (a sliding hour). Over a cap, work waits.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "camelCase")]
pub struct RateCaps {
    pub traces_per_hour: Option<u32>,
    pub prs_per_hour: Option<u32>,
}

/// The whole `autopilot.budget` section.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "camelCase")]
pub struct BudgetSettings {
    pub trace: TraceLimits,
    pub day: PeriodLimit,
    pub month: PeriodLimit,
    pub circuit_breaker: BreakerSettings,
    pub caps: RateCaps,
    /// A workflow agent whose container writes no log output and changes no file in its
    /// worktree for this many seconds is stopped and reported as stuck; 0 turns it off.
    pub stuck_after_secs: u64,
}

impl Default for BudgetSettings {
    fn default() -> BudgetSettings {
        BudgetSettings {
            trace: TraceLimits::default(),
            day: PeriodLimit::default(),
            month: PeriodLimit::default(),
            circuit_breaker: BreakerSettings::default(),
            caps: RateCaps::default(),
            stuck_after_secs: 900,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_and_unknown_keys() {
        let s: BudgetSettings = serde_json::from_str("{}").unwrap();
        assert_eq!(s.circuit_breaker.max_consecutive_failures, 3);
        assert_eq!(s.trace.action, BudgetAction::Warn);
        let s: BudgetSettings = serde_json::from_str(
            r#"{"day": {"usd": 2.5, "action": "pause"}, "trace": {"tokens": 10, "action": "stop"}}"#,
        )
        .unwrap();
        assert_eq!(s.day.usd, Some(2.5));
        assert_eq!(s.trace.action, BudgetAction::Stop);
        let err = serde_json::from_str::<BudgetSettings>(r#"{"dayy": {}}"#).unwrap_err();
        assert!(err.to_string().contains("dayy"), "{err}");
    }
}
