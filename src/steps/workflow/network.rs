//! What the workflow step decides about a run's authority, handed to the agent run service
//! ([`crate::agent_run`]): the budget limits enforced at the wire, and the spend the budget
//! recorded, which the live runs take as their baselines once a run is forgotten.

use std::sync::Arc;

use chrono::Utc;
use uuid::Uuid;

use super::WorkflowStep;
use crate::agent_run::{AgentRuns, GrantBudget, PeriodBudget, PeriodSpend, RecordedSpend};
use crate::orchestrator::{StepContext, StepError};
use crate::sandbox::Sandbox;
use crate::store::AutopilotStore;

impl WorkflowStep {
    /// The agent run service for this store's runs in `sandbox`.
    pub(super) fn agent_runs(
        &self,
        store: &AutopilotStore,
        sandbox: Arc<dyn Sandbox>,
    ) -> AgentRuns {
        AgentRuns::new(
            sandbox,
            &self.services.config.autopilot.sandbox,
            store.proxy_dir(),
            self.services.project_id.clone(),
            crate::agent_run::proxy_server_env(
                |n| self.services.host.var(n),
                &self.services.agent_settings().codex_prices,
            ),
        )
    }

    /// The agent run service, or the error of a step without a sandbox.
    pub(super) fn runs(&self, store: &AutopilotStore) -> Result<AgentRuns, StepError> {
        Ok(self.agent_runs(store, self.sandbox()?))
    }

    /// The budget limits the proxy enforces for a run of `trace_id`: the trace's `usd` and
    /// `tokens` when its action is `pause` or `stop` (both stop the trace), the day's and the
    /// month's `usd` when theirs is `stop`, each with what was recorded before (runs still going
    /// are counted by the proxy itself). `None` when no limit stops at the wire.
    pub(super) async fn wire_budget(
        &self,
        ctx: &StepContext,
        trace_id: Uuid,
    ) -> Option<GrantBudget> {
        let settings = &self.services.config.autopilot.budget;
        let store = ctx.store.clone();
        let ledger = tokio::task::spawn_blocking(move || crate::budget::Ledger::load(&store))
            .await
            .ok()
            .and_then(Result::ok)
            .unwrap_or_default();
        let budget = wire_limits(settings, &ledger, trace_id, Utc::now());
        (!budget.is_empty()).then_some(budget)
    }
}

/// What the budget of `store` has recorded for `trace` and for today and this month, as the
/// live grants take it for their baselines (blocking: it reads the budget's ledger).
pub(super) fn recorded_spend(store: &AutopilotStore, trace: Uuid) -> Option<RecordedSpend> {
    let ledger = crate::budget::Ledger::load(store).ok()?;
    let now = Utc::now();
    let spent = ledger.trace(trace);
    Some(RecordedSpend {
        trace_id: trace,
        trace_usd: spent.cost_usd,
        trace_tokens: spent.tokens(),
        day: PeriodSpend {
            period: day_period(now),
            usd: ledger.today(now).cost_usd,
        },
        month: PeriodSpend {
            period: month_period(now),
            usd: ledger.this_month(now).cost_usd,
        },
    })
}

/// `YYYY-MM-DD` of `now` (UTC), as a day's grant names its period.
fn day_period(now: chrono::DateTime<Utc>) -> String {
    crate::budget::day_key(now)
}

/// `YYYY-MM` of `now` (UTC).
fn month_period(now: chrono::DateTime<Utc>) -> String {
    now.format("%Y-%m").to_string()
}

/// The limits of `settings` that stop work at the wire, with what `ledger` recorded before.
pub fn wire_limits(
    settings: &crate::budget::BudgetSettings,
    ledger: &crate::budget::Ledger,
    trace_id: Uuid,
    now: chrono::DateTime<Utc>,
) -> GrantBudget {
    use crate::budget::BudgetAction;
    let mut budget = GrantBudget::default();
    let trace = &settings.trace;
    if trace.action != BudgetAction::Warn {
        let spent = ledger.trace(trace_id);
        budget.stop_usd = trace.usd;
        budget.baseline_usd = spent.cost_usd;
        budget.stop_tokens = trace.tokens;
        budget.baseline_tokens = spent.tokens();
    }
    if settings.day.action == BudgetAction::Stop {
        budget.day = settings.day.usd.map(|stop_usd| PeriodBudget {
            period: day_period(now),
            stop_usd,
            baseline_usd: ledger.today(now).cost_usd,
        });
    }
    if settings.month.action == BudgetAction::Stop {
        budget.month = settings.month.usd.map(|stop_usd| PeriodBudget {
            period: month_period(now),
            stop_usd,
            baseline_usd: ledger.this_month(now).cost_usd,
        });
    }
    budget
}
