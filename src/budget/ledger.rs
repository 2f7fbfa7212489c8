//! `autopilot/budget.json`: spend per day and per recent trace, recent trace starts and PRs
//! opened (for the hourly caps), and the circuit breaker. Updated when a span finishes, under
//! the store lock and atomically; the spend part can be rebuilt from the spans at any time.

use std::collections::{BTreeMap, VecDeque};
use std::path::PathBuf;

use chrono::{DateTime, Datelike, Duration, Utc};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use super::usage::SpanUsage;
use super::BudgetError;
use super::PullRequestOpened;
use crate::store::fsio::{read_json, write_json_atomic};
use crate::store::{AutopilotStore, Span, SpanStatus, StoreError, StoreLock};

/// Days of spend kept (two months covers "this month").
const DAYS_KEPT: usize = 62;
/// Recent traces whose spend is kept (for per-trace limits).
const TRACES_KEPT: usize = 500;
/// Span ids remembered so a span is never counted twice.
const COUNTED_KEPT: usize = 500;

/// The breaker's state.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BreakerState {
    /// Traces that failed in a row (reset by a trace that ends well and by `resume`).
    pub consecutive_failures: u32,
    /// Set when the breaker tripped; cleared by `rover autopilot resume`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tripped: Option<Tripped>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Tripped {
    pub at: DateTime<Utc>,
    pub reason: String,
    /// The failed traces, oldest first.
    pub traces: Vec<Uuid>,
}

/// Spend of one recent trace.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TraceSpend {
    pub usage: SpanUsage,
    pub last_at: Option<DateTime<Utc>>,
}

/// See the module documentation.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct Ledger {
    /// `YYYY-MM-DD` (UTC) → usage.
    pub days: BTreeMap<String, SpanUsage>,
    pub traces: BTreeMap<Uuid, TraceSpend>,
    pub counted: VecDeque<Uuid>,
    /// When new traces were started (last hour).
    pub trace_starts: Vec<DateTime<Utc>>,
    /// When rover opened a pull request (last hour).
    pub prs_opened: Vec<DateTime<Utc>>,
    pub breaker: BreakerState,
    /// Recent failed traces, for the breaker's report.
    pub failed_traces: Vec<Uuid>,
}

pub fn day_key(t: DateTime<Utc>) -> String {
    t.format("%Y-%m-%d").to_string()
}

impl Ledger {
    pub fn path(store: &AutopilotStore) -> PathBuf {
        store.autopilot_dir().join("budget.json")
    }

    /// The ledger as it is on disk (no lock needed: the file is replaced atomically).
    pub fn load(store: &AutopilotStore) -> Result<Ledger, BudgetError> {
        let path = Ledger::path(store);
        match read_json::<Ledger>(&path) {
            Ok(l) => Ok(l.unwrap_or_default()),
            Err(StoreError::Unreadable { reason, .. }) => {
                Err(BudgetError::Unreadable { path, reason })
            }
            Err(e) => Err(BudgetError::Store(e)),
        }
    }

    /// Change the ledger under the store lock; an unreadable one is rebuilt from the spans
    /// first (the breaker state is lost then, and said so in the log).
    pub fn update<R>(
        store: &AutopilotStore,
        f: impl FnOnce(&mut Ledger) -> R,
    ) -> Result<R, BudgetError> {
        let _lock = StoreLock::acquire(&store.lock_path())?;
        let mut ledger = match Ledger::load(store) {
            Ok(l) => l,
            Err(BudgetError::Unreadable { path, reason }) => {
                tracing::warn!(path = %path.display(), %reason, "the budget ledger is unreadable; rebuilding it from the spans");
                Ledger::rebuild(store)?
            }
            Err(e) => return Err(e),
        };
        let before = ledger.clone();
        let out = f(&mut ledger);
        if ledger != before {
            write_json_atomic(&Ledger::path(store), &ledger)?;
        }
        Ok(out)
    }

    /// The spend part from every span in the store (trace starts and PRs of the last hour too).
    pub fn rebuild(store: &AutopilotStore) -> Result<Ledger, BudgetError> {
        let mut ledger = Ledger::default();
        let dir = store.spans_dir();
        let entries = match std::fs::read_dir(&dir) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(ledger),
            Err(e) => {
                return Err(BudgetError::Store(StoreError::io("list", &dir)(e)));
            }
        };
        let mut spans: Vec<Span> = Vec::new();
        for entry in entries.flatten() {
            let path = entry.path();
            if path.extension().and_then(|e| e.to_str()) != Some("json") {
                continue;
            }
            if let Ok(Some(span)) = read_json::<Span>(&path) {
                spans.push(span);
            }
        }
        spans.sort_by_key(|s| s.completed.unwrap_or(s.timestamp));
        let hour_ago = Utc::now() - Duration::hours(1);
        let mut first_runs = std::collections::HashSet::new();
        for span in &spans {
            ledger.record_span(span);
            // A trace starts when the action its root event produced first runs: a step run
            // under the root (an intervention under it runs no action), once per action.
            if let Some(action) = span.action_id.filter(|_| span.parent_id == span.trace_id) {
                if span.timestamp > hour_ago && first_runs.insert(action) {
                    ledger.trace_starts.push(span.timestamp);
                }
            }
        }
        Ok(ledger)
    }

    /// Count a finished span's agent usage and a PR it opened, once per span (a span with
    /// neither leaves the ledger untouched). Returns `false` for a span counted before.
    pub fn record_span(&mut self, span: &Span) -> bool {
        if !span.status.is_final() || span.status == SpanStatus::Running {
            return false;
        }
        if self.counted.contains(&span.id) {
            return false;
        }
        let usage = SpanUsage::of(span);
        let pr_created = PullRequestOpened::by(span);
        if usage.is_none() && !pr_created {
            return true;
        }
        self.counted.push_back(span.id);
        while self.counted.len() > COUNTED_KEPT {
            self.counted.pop_front();
        }
        let at = span.completed.unwrap_or(span.timestamp);
        if pr_created {
            self.prs_opened.push(at);
        }
        let Some(usage) = usage else {
            return true;
        };
        *self.days.entry(day_key(at)).or_default() += usage;
        while self.days.len() > DAYS_KEPT {
            self.days.pop_first();
        }
        if let Some(trace) = span.trace_id {
            let entry = self.traces.entry(trace).or_default();
            entry.usage += usage;
            entry.last_at = Some(at);
            if self.traces.len() > TRACES_KEPT {
                if let Some(oldest) = self
                    .traces
                    .iter()
                    .min_by_key(|(_, t)| t.last_at)
                    .map(|(id, _)| *id)
                {
                    self.traces.remove(&oldest);
                }
            }
        }
        true
    }

    /// Spend of the UTC day of `now`.
    pub fn today(&self, now: DateTime<Utc>) -> SpanUsage {
        self.days.get(&day_key(now)).copied().unwrap_or_default()
    }

    /// Spend of the UTC month of `now`.
    pub fn this_month(&self, now: DateTime<Utc>) -> SpanUsage {
        let prefix = format!("{:04}-{:02}-", now.year(), now.month());
        let mut total = SpanUsage::default();
        for (day, u) in &self.days {
            if day.starts_with(&prefix) {
                total += *u;
            }
        }
        total
    }

    pub fn trace(&self, trace_id: Uuid) -> SpanUsage {
        self.traces
            .get(&trace_id)
            .map(|t| t.usage)
            .unwrap_or_default()
    }

    /// Drop hourly records older than an hour.
    pub fn prune(&mut self, now: DateTime<Utc>) {
        let hour_ago = now - Duration::hours(1);
        self.trace_starts.retain(|t| *t > hour_ago);
        self.prs_opened.retain(|t| *t > hour_ago);
    }

    pub fn starts_last_hour(&self, now: DateTime<Utc>) -> usize {
        let hour_ago = now - Duration::hours(1);
        self.trace_starts.iter().filter(|t| **t > hour_ago).count()
    }

    pub fn prs_last_hour(&self, now: DateTime<Utc>) -> usize {
        let hour_ago = now - Duration::hours(1);
        self.prs_opened.iter().filter(|t| **t > hour_ago).count()
    }

    /// Record how a trace ended; returns the trip if this one trips the breaker (`max` > 0).
    pub fn trace_ended(
        &mut self,
        trace_id: Uuid,
        failed: bool,
        max: u32,
        now: DateTime<Utc>,
    ) -> Option<Tripped> {
        if !failed {
            if self.breaker.consecutive_failures > 0 || !self.failed_traces.is_empty() {
                self.breaker.consecutive_failures = 0;
                self.failed_traces.clear();
            }
            return None;
        }
        if self.failed_traces.contains(&trace_id) {
            return None;
        }
        self.breaker.consecutive_failures += 1;
        self.failed_traces.push(trace_id);
        if self.failed_traces.len() > 20 {
            self.failed_traces.remove(0);
        }
        if max == 0 || self.breaker.consecutive_failures < max || self.breaker.tripped.is_some() {
            return None;
        }
        let tripped = Tripped {
            at: now,
            reason: format!(
                "{} traces failed in a row",
                self.breaker.consecutive_failures
            ),
            traces: self.failed_traces.clone(),
        };
        self.breaker.tripped = Some(tripped.clone());
        Some(tripped)
    }

    /// Whether the failed end of `trace_id` would trip the breaker (`max` > 0), and why.
    pub fn would_trip(&self, trace_id: Uuid, max: u32) -> Option<String> {
        let failures = self.breaker.consecutive_failures + 1;
        (max > 0
            && failures >= max
            && self.breaker.tripped.is_none()
            && !self.failed_traces.contains(&trace_id))
        .then(|| format!("{failures} traces failed in a row"))
    }

    /// Lift the breaker; returns whether it was tripped.
    pub fn resume(&mut self) -> bool {
        let was = self.breaker.tripped.is_some();
        self.breaker = BreakerState::default();
        self.failed_traces.clear();
        was
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::Meta;
    use crate::store::StepKind;
    use chrono::TimeZone;
    use serde_json::json;

    fn spent(at: DateTime<Utc>, usd: f64) -> Span {
        let serde_json::Value::Object(meta) =
            json!({"agent": {"costUsd": usd, "inputTokens": 1, "outputTokens": 2}})
        else {
            unreachable!()
        };
        let mut s = Span::root(Uuid::new_v4(), at, Meta::new());
        s.step = StepKind::Plan;
        s.trace_id = Some(Uuid::nil());
        s.finish(SpanStatus::Completed, "x", meta, at).unwrap();
        s
    }

    #[test]
    fn a_span_counts_once_and_days_add_up_to_the_month() {
        let mut l = Ledger::default();
        let d1 = Utc.with_ymd_and_hms(2026, 3, 1, 10, 0, 0).unwrap();
        let d2 = Utc.with_ymd_and_hms(2026, 3, 2, 10, 0, 0).unwrap();
        let prev = Utc.with_ymd_and_hms(2026, 2, 28, 10, 0, 0).unwrap();
        let s = spent(d1, 1.0);
        assert!(l.record_span(&s));
        assert!(!l.record_span(&s), "counted once");
        l.record_span(&spent(d2, 2.0));
        l.record_span(&spent(prev, 4.0));
        assert!((l.today(d2).cost_usd - 2.0).abs() < 1e-9);
        assert!((l.this_month(d2).cost_usd - 3.0).abs() < 1e-9);
        assert_eq!(l.this_month(d2).tokens(), 6);
        assert!((l.trace(Uuid::nil()).cost_usd - 7.0).abs() < 1e-9);
    }
}
