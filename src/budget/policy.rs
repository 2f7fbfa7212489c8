//! Decisions from the settings and the ledger: whether new work may start, and what a finished
//! span means for the trace's and the period's limits and for the circuit breaker.

use chrono::{DateTime, Utc};
use serde::Serialize;
use uuid::Uuid;

use super::ledger::{BreakerState, Ledger, Tripped};
use super::settings::{BudgetAction, BudgetSettings};
use super::usage::{usd, SpanUsage};
use super::NotifyHeader;
use crate::store::{Meta, Span, SpanStatus};

/// Which limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum Limit {
    TraceTokens,
    TraceUsd,
    TraceWall,
    Day,
    Month,
}

/// What a finished span means.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SpanVerdict {
    /// Limits crossed with `warn` (log them, note them in the span's meta `budgetWarnings`).
    pub warnings: Vec<String>,
    /// The trace must stop (a trace limit with `pause` or `stop`).
    pub stop_trace: Option<String>,
    /// Every running agent must stop (a day or month limit with `stop`).
    pub stop_all: Option<String>,
    /// The trace ended: `Some(true)` if it failed.
    pub trace_failed: Option<bool>,
    /// This span tripped the circuit breaker.
    pub tripped: Option<Tripped>,
}

/// Where the budget stands now, for `status` and the gates.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Standing {
    pub today: SpanUsage,
    pub month: SpanUsage,
    pub day_limit_usd: Option<f64>,
    pub month_limit_usd: Option<f64>,
    /// Why new traces wait (empty: they may start).
    pub new_traces_wait: Vec<String>,
    /// Why pushes wait.
    pub pushes_wait: Option<String>,
    /// A period limit with `stop` is reached: nothing but notify and cleanup runs.
    pub stopped: Option<String>,
    pub breaker: BreakerState,
    pub traces_last_hour: usize,
    pub prs_last_hour: usize,
}

/// See the module documentation.
#[derive(Debug, Clone, Default)]
pub struct Budget {
    settings: BudgetSettings,
}

fn over(spent: f64, limit: Option<f64>) -> Option<f64> {
    limit.filter(|l| spent >= *l)
}

impl Budget {
    pub fn new(settings: BudgetSettings) -> Budget {
        Budget { settings }
    }

    pub fn settings(&self) -> &BudgetSettings {
        &self.settings
    }

    /// The day's and the month's limits that are reached, with their actions.
    fn period_over(
        &self,
        ledger: &Ledger,
        now: DateTime<Utc>,
    ) -> Vec<(Limit, BudgetAction, String)> {
        let mut out = Vec::new();
        let today = ledger.today(now).cost_usd;
        if let Some(l) = over(today, self.settings.day.usd) {
            out.push((
                Limit::Day,
                self.settings.day.action,
                format!("the daily budget is spent ({} of {}; autopilot.budget.day); it resets at midnight UTC", usd(today), usd(l)),
            ));
        }
        let month = ledger.this_month(now).cost_usd;
        if let Some(l) = over(month, self.settings.month.usd) {
            out.push((
                Limit::Month,
                self.settings.month.action,
                format!("the monthly budget is spent ({} of {}; autopilot.budget.month); it resets on the 1st (UTC)", usd(month), usd(l)),
            ));
        }
        out
    }

    /// Where things stand.
    pub fn standing(&self, ledger: &Ledger, now: DateTime<Utc>) -> Standing {
        let mut new_traces_wait = Vec::new();
        let mut stopped = None;
        if let Some(t) = &ledger.breaker.tripped {
            new_traces_wait.push(format!(
                "the circuit breaker is open since {}: {}; run `rover autopilot resume` to take new work",
                t.at.format("%Y-%m-%d %H:%M UTC"),
                t.reason
            ));
        }
        for (_, action, reason) in self.period_over(ledger, now) {
            match action {
                BudgetAction::Warn => {}
                BudgetAction::Pause => new_traces_wait.push(reason),
                BudgetAction::Stop => {
                    new_traces_wait.push(reason.clone());
                    stopped.get_or_insert(reason);
                }
            }
        }
        let starts = ledger.starts_last_hour(now);
        if let Some(cap) = self.settings.caps.traces_per_hour {
            if starts >= cap as usize {
                new_traces_wait.push(format!(
                    "{starts} traces started in the last hour (cap {cap}, autopilot.budget.caps.tracesPerHour)"
                ));
            }
        }
        let prs = ledger.prs_last_hour(now);
        let pushes_wait = self.settings.caps.prs_per_hour.and_then(|cap| {
            (prs >= cap as usize).then(|| {
                format!("{prs} pull requests opened in the last hour (cap {cap}, autopilot.budget.caps.prsPerHour)")
            })
        });
        Standing {
            today: ledger.today(now),
            month: ledger.this_month(now),
            day_limit_usd: self.settings.day.usd,
            month_limit_usd: self.settings.month.usd,
            new_traces_wait,
            pushes_wait,
            stopped,
            breaker: ledger.breaker.clone(),
            traces_last_hour: starts,
            prs_last_hour: prs,
        }
    }

    /// Why a new trace may not start now (`None`: it may).
    pub fn gate_new_trace(&self, ledger: &Ledger, now: DateTime<Utc>) -> Option<String> {
        self.standing(ledger, now)
            .new_traces_wait
            .into_iter()
            .next()
    }

    /// Why a push may not run now (the PR cap).
    pub fn gate_push(&self, ledger: &Ledger, now: DateTime<Utc>) -> Option<String> {
        self.standing(ledger, now).pushes_wait
    }

    /// The first trace limit `usage` (or the wall time since `started`) has reached.
    pub fn trace_over(
        &self,
        usage: SpanUsage,
        started: DateTime<Utc>,
        now: DateTime<Utc>,
    ) -> Option<(Limit, String)> {
        let t = &self.settings.trace;
        if let Some(l) = t.tokens.filter(|l| usage.tokens() >= *l) {
            return Some((
                Limit::TraceTokens,
                format!(
                    "the trace used {} tokens (limit {l}, autopilot.budget.trace.tokens)",
                    usage.tokens()
                ),
            ));
        }
        if let Some(l) = over(usage.cost_usd, t.usd) {
            return Some((
                Limit::TraceUsd,
                format!(
                    "the trace cost {} (limit {}, autopilot.budget.trace.usd)",
                    usd(usage.cost_usd),
                    usd(l)
                ),
            ));
        }
        let secs = u64::try_from((now - started).num_seconds()).unwrap_or(0);
        if let Some(l) = t.wall_secs.filter(|l| secs >= *l) {
            return Some((
                Limit::TraceWall,
                format!("the trace ran {secs}s (limit {l}s, autopilot.budget.trace.wallSecs)"),
            ));
        }
        None
    }

    /// Whether a trace limit stops traces (`pause` and `stop` both do).
    pub fn trace_limit_stops(&self) -> bool {
        self.settings.trace.action != BudgetAction::Warn
    }

    /// Count `span` in `ledger` and say what it means. `verdict`: the span ends its trace and
    /// is its verdict for the circuit breaker (as the pipeline declares its step);
    /// `action_meta` is the meta of the action the span processed; `trace_started` the trace's
    /// event time.
    pub fn after_span(
        &self,
        ledger: &mut Ledger,
        span: &Span,
        verdict: bool,
        action_meta: &Meta,
        trace_started: DateTime<Utc>,
        now: DateTime<Utc>,
    ) -> SpanVerdict {
        let gives_verdict = verdict;
        let mut verdict = SpanVerdict::default();
        let trace_id = span.trace_id.unwrap_or(Uuid::nil());
        let trace_before = ledger.trace(trace_id);
        let periods_before: Vec<Limit> = self
            .period_over(ledger, now)
            .into_iter()
            .map(|p| p.0)
            .collect();
        ledger.prune(now);
        if !ledger.record_span(span) {
            return verdict;
        }
        // Trace limits.
        let trace_after = ledger.trace(trace_id);
        if let Some((_, reason)) = self.trace_over(trace_after, trace_started, now) {
            if self.trace_limit_stops() {
                verdict.stop_trace = Some(reason);
            } else if self.trace_over(trace_before, trace_started, now).is_none() {
                verdict.warnings.push(reason);
            }
        }
        // Period limits.
        for (limit, action, reason) in self.period_over(ledger, now) {
            match action {
                BudgetAction::Warn if !periods_before.contains(&limit) => {
                    verdict.warnings.push(reason);
                }
                BudgetAction::Stop => {
                    verdict.stop_all.get_or_insert(reason);
                }
                _ => {}
            }
        }
        // The circuit breaker: how a trace ended.
        if let Some(failed) = trace_end(span, gives_verdict, action_meta) {
            verdict.trace_failed = Some(failed);
            verdict.tripped = ledger.trace_ended(
                trace_id,
                failed,
                self.settings.circuit_breaker.max_consecutive_failures,
                now,
            );
        }
        verdict
    }
}

impl Budget {
    /// The breaker's announcement to add to a failure notify that is about to end its trace
    /// and will trip the breaker, so the trace is answered once (`circuitBreaker.notify`).
    pub fn breaker_note(
        &self,
        ledger: &Ledger,
        trace_id: Uuid,
        action_meta: &Meta,
    ) -> Option<String> {
        let breaker = &self.settings.circuit_breaker;
        let header = NotifyHeader::of(action_meta);
        if !breaker.notify || !header.is_failure() {
            return None;
        }
        ledger
            .would_trip(trace_id, breaker.max_consecutive_failures)
            .map(|reason| breaker_message(&reason))
    }
}

/// What rover says when the circuit breaker opens.
pub fn breaker_message(reason: &str) -> String {
    format!(
        "circuit breaker open: {reason}; rover takes no new work until `rover autopilot resume`"
    )
}

/// Whether `span` (the trace's verdict when `verdict`) ends its trace, and if so whether the
/// trace failed: a verdict that ended in error, or an answer of a failure. Budget and breaker
/// answers do not count.
fn trace_end(span: &Span, verdict: bool, action_meta: &Meta) -> Option<bool> {
    if !verdict {
        return None;
    }
    let header = NotifyHeader::of(action_meta);
    if header.is_rovers_own() {
        return None;
    }
    Some(span.status == SpanStatus::Error || header.is_failure())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::budget::settings::PeriodLimit;
    use crate::store::StepKind;
    use serde_json::{json, Value};

    fn span(step: StepKind, status: SpanStatus, meta: Value, trace: Uuid) -> Span {
        let Value::Object(m) = meta else { panic!() };
        let mut s = Span::root(Uuid::new_v4(), Utc::now(), m);
        s.step = step;
        s.status = status;
        s.completed = Some(Utc::now());
        s.trace_id = Some(trace);
        s
    }

    #[test]
    fn the_breaker_trips_after_n_failures_and_a_success_resets_it() {
        let budget = Budget::default();
        let mut ledger = Ledger::default();
        let now = Utc::now();
        let failure = json!({"purpose": "failure"});
        let Value::Object(failure) = failure else {
            panic!()
        };
        for i in 0..2 {
            let v = budget.after_span(
                &mut ledger,
                &span(
                    StepKind::Notify,
                    SpanStatus::Completed,
                    json!({}),
                    Uuid::new_v4(),
                ),
                true,
                &failure,
                now,
                now,
            );
            assert_eq!(v.trace_failed, Some(true));
            assert!(v.tripped.is_none(), "{i}");
        }
        let ok = budget.after_span(
            &mut ledger,
            &span(
                StepKind::Noop,
                SpanStatus::Completed,
                json!({}),
                Uuid::new_v4(),
            ),
            true,
            &Meta::new(),
            now,
            now,
        );
        assert_eq!(ok.trace_failed, Some(false));
        assert_eq!(ledger.breaker.consecutive_failures, 0);
        let mut tripped = None;
        for _ in 0..3 {
            tripped = budget
                .after_span(
                    &mut ledger,
                    &span(StepKind::Noop, SpanStatus::Error, json!({}), Uuid::new_v4()),
                    true,
                    &Meta::new(),
                    now,
                    now,
                )
                .tripped;
        }
        assert!(tripped.is_some());
        assert!(budget
            .gate_new_trace(&ledger, now)
            .unwrap()
            .contains("resume"));
        assert!(ledger.resume());
        assert!(budget.gate_new_trace(&ledger, now).is_none());
    }

    #[test]
    fn period_limits_warn_once_pause_and_stop() {
        let now = Utc::now();
        let trace = Uuid::new_v4();
        let cost = json!({"agent": {"costUsd": 0.6, "inputTokens": 1, "outputTokens": 1}});
        let mut settings = BudgetSettings {
            day: PeriodLimit {
                usd: Some(1.0),
                action: BudgetAction::Warn,
            },
            ..BudgetSettings::default()
        };
        let budget = Budget::new(settings.clone());
        let mut ledger = Ledger::default();
        let first = budget.after_span(
            &mut ledger,
            &span(StepKind::Plan, SpanStatus::Completed, cost.clone(), trace),
            false,
            &Meta::new(),
            now,
            now,
        );
        assert!(first.warnings.is_empty());
        let second = budget.after_span(
            &mut ledger,
            &span(StepKind::Plan, SpanStatus::Completed, cost.clone(), trace),
            false,
            &Meta::new(),
            now,
            now,
        );
        assert_eq!(second.warnings.len(), 1, "{second:?}");
        let third = budget.after_span(
            &mut ledger,
            &span(StepKind::Plan, SpanStatus::Completed, cost.clone(), trace),
            false,
            &Meta::new(),
            now,
            now,
        );
        assert!(third.warnings.is_empty(), "warned once");
        assert!(
            budget.gate_new_trace(&ledger, now).is_none(),
            "warn never holds work"
        );
        settings.day.action = BudgetAction::Pause;
        assert!(Budget::new(settings.clone())
            .gate_new_trace(&ledger, now)
            .unwrap()
            .contains("daily budget"));
        settings.day.action = BudgetAction::Stop;
        let stop = Budget::new(settings).after_span(
            &mut ledger,
            &span(StepKind::Plan, SpanStatus::Completed, cost, trace),
            false,
            &Meta::new(),
            now,
            now,
        );
        assert!(stop.stop_all.is_some());
    }
}
