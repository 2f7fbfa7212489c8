//! What a step that runs an agent in a sandbox (the workflow, the self-review) decides about
//! the run's authority, handed to the agent run service ([`crate::agent_run`]): the variables
//! the container may get, the budget limits enforced at the wire, and the spend the budget
//! recorded, which the live runs take as their baselines once a run is forgotten.

use std::path::Path;
use std::sync::Arc;

use chrono::Utc;
use uuid::Uuid;

use super::Services;
use crate::agent_run::{AgentRuns, GrantBudget, PeriodBudget, PeriodSpend, RecordedSpend};
use crate::agents;
use crate::orchestrator::{StepContext, StepError};
use crate::sandbox::{Sandbox, ALWAYS_REFUSED_ENV};
use crate::store::AutopilotStore;

/// The agent run service for `store`'s runs in `sandbox`.
pub fn agent_runs(
    services: &Services,
    store: &AutopilotStore,
    sandbox: Arc<dyn Sandbox>,
) -> AgentRuns {
    let proxy_dir = store.proxy_dir();
    // A repository of a daemon file: its runs go through the server every repository shares
    // (its `<store>/proxy` leads there), whose environment must be the same for all of them.
    let shared = crate::agent_run::SharedServer::of_link(&proxy_dir);
    let prices = &services.agent_settings().codex_prices;
    let server_prices = match shared {
        Some(_) => agents::CodexPrices::default(),
        None => prices.clone(),
    };
    let runs = AgentRuns::new(
        sandbox,
        &services.config.autopilot.sandbox,
        proxy_dir,
        services.project_id.clone(),
        crate::agent_run::proxy_server_env(|n| services.host.var(n), &server_prices),
    );
    match shared {
        Some(server) => runs.on_shared_server(server, prices.clone()),
        None => runs,
    }
}

/// The budget limits the proxy enforces for a run of `trace_id`: the trace's `usd` and
/// `tokens` when its action is `pause` or `stop` (both stop the trace), the day's and the
/// month's `usd` when theirs is `stop`, each with what was recorded before (runs still going
/// are counted by the proxy itself). `None` when no limit stops at the wire.
pub async fn wire_budget(
    services: &Services,
    ctx: &StepContext,
    trace_id: Uuid,
) -> Option<GrantBudget> {
    let settings = &services.config.autopilot.budget;
    let store = ctx.store.clone();
    let ledger = tokio::task::spawn_blocking(move || crate::budget::Ledger::load(&store))
        .await
        .ok()
        .and_then(Result::ok)
        .unwrap_or_default();
    let budget = wire_limits(settings, &ledger, trace_id, Utc::now());
    (!budget.is_empty()).then_some(budget)
}

/// The env of a sandboxed agent: the agent's extra names and the `fixed` pairs that
/// `autopilot.sandbox.envAllow` lets in, and `IS_SANDBOX=1`. Never a GitHub token (by name
/// or value) and never a model credential or endpoint (by name or value): the agent
/// reaches the model API through rover's proxy, whose variables rover sets itself.
pub fn sandbox_env(services: &Services, fixed: &[(String, String)]) -> Vec<(String, String)> {
    let allow = &services.config.autopilot.sandbox.env_allow;
    let tokens: Vec<String> = services
        .github_token
        .as_ref()
        .map(crate::github::GitHubAuth::known_tokens)
        .unwrap_or_default()
        .into_iter()
        .filter(|t| t.len() >= 8)
        .collect();
    let host = &services.host;
    let model_keys: Vec<String> = crate::secrets::MODEL_KEY_ENV
        .iter()
        .filter_map(|name| host.var(name))
        .filter(|value| value.len() >= 8)
        .collect();
    let refused = |name: &str, value: &str| {
        ALWAYS_REFUSED_ENV
            .iter()
            .chain(crate::sandbox::MODEL_ENV_REFUSED)
            .any(|r| r.eq_ignore_ascii_case(name))
            || agents::ALWAYS_DENIED_ENV.contains(&name)
            || tokens.iter().any(|t| value.contains(t.as_str()))
            || model_keys.iter().any(|k| value.contains(k.as_str()))
            || !allow.iter().any(|a| a == name)
    };
    let mut env: Vec<(String, String)> = Vec::new();
    for name in &services.agent_settings().extra_env {
        if let Some(value) = host.var(name) {
            if !refused(name, &value) && !env.iter().any(|(n, _)| n == name) {
                env.push((name.clone(), value));
            }
        }
    }
    if !refused("IS_SANDBOX", "1") {
        env.push(("IS_SANDBOX".into(), "1".into()));
    }
    for (name, value) in fixed {
        if !refused(name, value) {
            env.retain(|(n, _)| n != name);
            env.push((name.clone(), value.clone()));
        }
    }
    env
}

/// What the budget of `store` has recorded for `trace` and for today and this month, as the
/// live grants take it for their baselines (blocking: it reads the budget's ledger).
pub fn recorded_spend(store: &AutopilotStore, trace: Uuid) -> Option<RecordedSpend> {
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

/// The agent's output parsed from its log, a line at a time (never the whole file in memory).
pub async fn parse_log(
    kind: agents::AgentKind,
    log: &Path,
) -> Result<agents::AgentResponse, agents::ParseError> {
    let log = log.to_path_buf();
    let parsed = tokio::task::spawn_blocking(move || match std::fs::File::open(&log) {
        Ok(file) => agents::parse_output_reader(kind, std::io::BufReader::new(file), true),
        Err(_) => agents::parse_output_reader(kind, std::io::empty(), true),
    })
    .await;
    parsed.unwrap_or_else(|e| {
        Err(agents::ParseError::Invalid {
            reason: format!("the parser stopped: {e}"),
        })
    })
}

/// The run's figures for the budgets: the agent's own, unless rover's proxy saw it spend more
/// (an agent cut off before its report, or one that under-reports): then the proxy's.
pub fn wire_usage(
    reported: Option<crate::store::AgentMeta>,
    wire: Option<&crate::agent_run::WireLedger>,
) -> Option<crate::store::AgentMeta> {
    use crate::store::{AgentMeta, AgentUsage};
    let Some(wire) = wire.filter(|w| w.usd > 0.0 || w.requests > 0) else {
        return reported;
    };
    match reported {
        Some(AgentMeta::Used(mut usage)) => {
            if usage.cost_usd.unwrap_or(0.0) < wire.usd {
                usage.cost_usd = Some(wire.usd);
            }
            Some(AgentMeta::Used(usage))
        }
        _ => Some(AgentMeta::Used(AgentUsage {
            turns: None,
            cost_usd: Some(wire.usd),
            input_tokens: wire.usage.input,
            output_tokens: wire.usage.output,
            cached_tokens: wire.usage.cached,
            attempts: None,
            first_error: None,
        })),
    }
}

/// A run that could not be prepared or started, as the step's error: the sandbox's own error
/// (its message and retryability as the engine gave them) with the container and image.
pub fn run_error(e: crate::agent_run::AgentRunError, image: &str) -> StepError {
    match e {
        crate::agent_run::AgentRunError::Sandbox { container, source }
        | crate::agent_run::AgentRunError::Returned { container, source } => {
            StepError::from_error(&source, source.is_retryable())
                .detail("container", container)
                .detail("image", image)
        }
        crate::agent_run::AgentRunError::Grant { proxy_dir, source } => {
            StepError::from_error(&source, false)
                .detail("proxyDir", proxy_dir.display().to_string())
        }
        crate::agent_run::AgentRunError::Stopped(_) => StepError::fatal(e.to_string()),
    }
}
