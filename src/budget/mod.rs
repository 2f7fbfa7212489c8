//! Cost, budgets, the circuit breaker and hourly caps.
//!
//! [`SpanUsage`] is the one typed shape of an agent call's tokens and USD; [`Ledger`] keeps the
//! spend per day and per recent trace in `autopilot/budget.json` (rebuildable from the spans)
//! with the breaker's state; [`Budget`] turns [`BudgetSettings`] and the ledger into decisions:
//! may a new trace start ([`Budget::gate_new_trace`]), may a push run ([`Budget::gate_push`]),
//! and what a finished span means ([`Budget::after_span`]).

mod daemon_wide;
mod ledger;
mod notify;
mod policy;
mod pull_request;
mod settings;
mod usage;

use std::path::PathBuf;

pub use daemon_wide::{
    breaker_open, over_limits, recorded_sum, DaemonBreakerSettings, DaemonBudgetSettings,
    DaemonOver, DaemonPeriodLimit,
};
pub use ledger::{day_key, BreakerState, Ledger, TraceSpend, Tripped};
pub use notify::{NotifyHeader, NotifyPurpose};
pub use policy::{breaker_message, Budget, Limit, SpanVerdict, Standing};
pub use pull_request::PullRequestOpened;
pub use settings::{
    BreakerSettings, BudgetAction, BudgetSettings, PeriodLimit, RateCaps, TraceLimits,
};
pub use usage::{trace_usage, usd, SpanUsage};

use crate::store::StoreError;

/// Why the budget ledger could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum BudgetError {
    #[error("the budget ledger {path} is unreadable ({reason}); delete it and it is rebuilt from the spans (the circuit breaker's state is lost)")]
    Unreadable { path: PathBuf, reason: String },
    #[error("cannot update the budget ledger")]
    Store(#[from] StoreError),
}

impl BudgetError {
    /// Whether trying again may help (a busy or flaky disk; not a corrupt file).
    pub fn is_retryable(&self) -> bool {
        matches!(self, BudgetError::Store(StoreError::Io { .. }))
    }
}
