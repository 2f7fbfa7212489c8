//! `rover autopilot resume` and the budget part of `status`: spend today and this month, the
//! circuit breaker, and why new work waits.

use std::fmt::Write as _;
use std::process::ExitCode;

use chrono::Utc;
use serde_json::Value;

use super::{CliError, Context, Output};
use crate::budget::{usd, Budget, BudgetError, Ledger, Standing};
use crate::config::RoverConfig;
use crate::store::AutopilotStore;

fn budget_error(e: &BudgetError) -> CliError {
    CliError::Internal(crate::error::error_chain(e))
}

/// The budget settings of the project (defaults when `rover.json` cannot be found or read).
fn budget_of(ctx: &Context) -> Budget {
    let settings = ctx
        .project()
        .ok()
        .and_then(|p| RoverConfig::load(&p.root).ok())
        .map(|c| c.autopilot.budget)
        .unwrap_or_default();
    Budget::new(settings)
}

/// Where the budget stands, for `status`.
pub fn standing(ctx: &Context, store: &AutopilotStore) -> Result<Standing, CliError> {
    let ledger = Ledger::load(store).map_err(|e| budget_error(&e))?;
    Ok(budget_of(ctx).standing(&ledger, Utc::now()))
}

pub fn standing_json(standing: &Standing) -> Value {
    serde_json::to_value(standing).expect("the standing serializes")
}

/// The human lines of `status`.
pub fn standing_text(s: &Standing) -> String {
    let mut text = String::new();
    let limit = |l: Option<f64>| l.map(|l| format!(" of {}", usd(l))).unwrap_or_default();
    let _ = writeln!(
        text,
        "spend    today {}{} ({} tok), this month {}{} ({} tok)",
        usd(s.today.cost_usd),
        limit(s.day_limit_usd),
        s.today.tokens(),
        usd(s.month.cost_usd),
        limit(s.month_limit_usd),
        s.month.tokens()
    );
    match &s.breaker.tripped {
        Some(t) => {
            let _ = writeln!(
                text,
                "breaker  OPEN since {}: {}; `rover autopilot resume` lifts it",
                t.at.format("%Y-%m-%d %H:%M:%S UTC"),
                t.reason
            );
        }
        None => {
            let _ = writeln!(
                text,
                "breaker  closed ({} failed trace(s) in a row)",
                s.breaker.consecutive_failures
            );
        }
    }
    let _ = writeln!(
        text,
        "hourly   {} trace(s) started, {} PR(s) opened in the last hour",
        s.traces_last_hour, s.prs_last_hour
    );
    if let Some(reason) = &s.stopped {
        let _ = writeln!(text, "stopped  {reason}");
    }
    for reason in &s.new_traces_wait {
        let _ = writeln!(text, "paused   new traces wait: {reason}");
    }
    if let Some(reason) = &s.pushes_wait {
        let _ = writeln!(text, "paused   pushes wait: {reason}");
    }
    text
}

/// `rover autopilot resume`: close the circuit breaker (the state is in the store, so a running
/// daemon sees it at its next drain; it is woken now).
pub fn resume(ctx: &Context, out: &mut Output) -> Result<ExitCode, CliError> {
    let store = ctx.existing_store()?;
    let was = Ledger::update(&store, Ledger::resume).map_err(|e| budget_error(&e))?;
    if was {
        out.print("circuit breaker closed: rover takes new work again\n")?;
    } else {
        out.print("the circuit breaker was not open; nothing to resume\n")?;
    }
    let standing = budget_of(ctx).standing(
        &Ledger::load(&store).map_err(|e| budget_error(&e))?,
        Utc::now(),
    );
    for reason in &standing.new_traces_wait {
        out.print(&format!("still waiting: {reason}\n"))?;
    }
    super::wake_daemon(&store);
    Ok(ExitCode::SUCCESS)
}
