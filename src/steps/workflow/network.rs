//! An agent run's network (see [`crate::sandbox::runnet`] and [`crate::proxy`]): before the
//! container starts, its grant (the hash of a token made for this run, what it may reach, its
//! trace's budget) and its network; the variables that point the agent at rover's proxy; and
//! once the run is collected, what the proxy saw, the grant revoked, the network removed.

use std::path::{Path, PathBuf};

use chrono::Utc;
use uuid::Uuid;

use super::WorkflowStep;
use crate::agents::AgentKind;
use crate::orchestrator::{StepContext, StepError};
use crate::proxy::{self, Grant, GrantBudget, Ledger, PeriodBudget, Provider};
use crate::sandbox::runnet::{PROXY_ALIAS, PROXY_PORT};
use crate::sandbox::{RunConnect, Sandbox};
use crate::store::AutopilotStore;

/// `<store>/proxy`: the grants, the ledgers and the server's socket.
pub fn proxy_dir(store: &AutopilotStore) -> PathBuf {
    store.proxy_dir()
}

/// The variables that point an agent at rover's proxy with the run's `token`: the model API's
/// base URL and key for its CLI, and the proxy for anything else it runs (curl, pip, npm,
/// cargo and git read these).
pub fn agent_env(kind: AgentKind, token: &str) -> Vec<(String, String)> {
    let base = format!("http://{PROXY_ALIAS}:{PROXY_PORT}");
    let mut env = match kind {
        AgentKind::Claude => vec![
            ("ANTHROPIC_BASE_URL".to_owned(), format!("{base}/anthropic")),
            ("ANTHROPIC_API_KEY".to_owned(), token.to_owned()),
        ],
        AgentKind::Codex => vec![
            ("OPENAI_BASE_URL".to_owned(), format!("{base}/openai")),
            ("CODEX_API_KEY".to_owned(), token.to_owned()),
            ("OPENAI_API_KEY".to_owned(), token.to_owned()),
        ],
    };
    let proxy = format!("http://rover:{token}@{PROXY_ALIAS}:{PROXY_PORT}");
    for name in ["HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy"] {
        env.push((name.to_owned(), proxy.clone()));
    }
    let direct = format!("{PROXY_ALIAS},localhost,127.0.0.1");
    env.push(("NO_PROXY".to_owned(), direct.clone()));
    env.push(("no_proxy".to_owned(), direct));
    // The CLIs' telemetry and update checks would only be refused and recorded.
    env.push((
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC".to_owned(),
        "1".to_owned(),
    ));
    env.push(("DISABLE_AUTOUPDATER".to_owned(), "1".to_owned()));
    env
}

fn provider(kind: AgentKind) -> Provider {
    match kind {
        AgentKind::Claude => Provider::Anthropic,
        AgentKind::Codex => Provider::Openai,
    }
}

/// What the run got: the network its container joins and the variables rover sets in it.
pub(super) struct Connected {
    pub network: String,
    /// The network has no way out but the proxy (`--internal`).
    pub internal: bool,
    pub env: Vec<(String, String)>,
}

impl WorkflowStep {
    /// The budget limits the proxy enforces for a run of `trace_id`: the trace's `usd` and
    /// `tokens` when its action is `pause` or `stop` (both stop the trace), the day's and the
    /// month's `usd` when theirs is `stop`, each with what was recorded before (runs still going
    /// are counted by the proxy itself). `None` when no limit stops at the wire.
    async fn wire_budget(&self, ctx: &StepContext, trace_id: Uuid) -> Option<GrantBudget> {
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

    /// Gives the run `container` of `trace_id` its grant and network. `adopting`: the container
    /// runs already (a restart), so its grant stays as it is and only the network is ensured.
    pub(super) async fn connect(
        &self,
        ctx: &StepContext,
        sandbox: &dyn Sandbox,
        trace_id: Uuid,
        container: &str,
        adopting: bool,
    ) -> Result<Option<Connected>, StepError> {
        let settings = &self.services.config.autopilot.sandbox;
        let egress = settings.egress();
        if egress.is_none() {
            return Ok(None);
        }
        let kind = self.services.agent_settings().agent;
        let dir = proxy_dir(&ctx.store);
        let token = proxy::new_token();
        if !adopting {
            let grant = Grant {
                run: container.to_owned(),
                trace_id,
                token_sha256: proxy::token_sha256(&token),
                providers: vec![provider(kind)],
                egress: egress.policy(),
                budget: self.wire_budget(ctx, trace_id).await,
                max_requests: Some(settings.model_concurrency),
                ended: false,
                created_at: Utc::now(),
            };
            let saved = dir.clone();
            tokio::task::spawn_blocking(move || grant.save(&saved))
                .await
                .map_err(|e| StepError::fatal(format!("writing the run's grant stopped: {e}")))?
                .map_err(|e| {
                    StepError::from_error(&e, false).detail("proxyDir", dir.display().to_string())
                })?;
        }
        let prices =
            serde_json::to_value(&self.services.agent_settings().codex_prices).unwrap_or_default();
        let network = sandbox
            .connect_run(&RunConnect {
                run: container.to_owned(),
                project: self.services.project_id.clone(),
                internal: !egress.is_open(),
                proxy_dir: dir,
                server_env: proxy::env::server_env(|n| std::env::var(n).ok(), &prices),
            })
            .await
            .map_err(|e| {
                StepError::from_error(&e, e.is_retryable()).detail("container", container)
            })?;
        Ok(Some(Connected {
            network,
            internal: !egress.is_open(),
            env: agent_env(kind, &token),
        }))
    }
}

/// What the proxy saw of run `container` (`None`: it had no network, or saw nothing), and its
/// grant revoked: the token stops working now. The other live runs of its trace first count
/// its spend in their baseline (until the span's cost is recorded, see [`forget_run`]), so
/// it is never counted nowhere.
pub(super) async fn end_run(store: &AutopilotStore, container: &str) -> Option<Ledger> {
    let dir = proxy_dir(store);
    let run = container.to_owned();
    tokio::task::spawn_blocking(move || {
        let ledger = match Ledger::load(&dir, &run) {
            Ok(ledger) => ledger,
            Err(e) => {
                tracing::warn!(run = %run, error = %e, "cannot read what the proxy saw of a run");
                None
            }
        };
        if let Ok(Some(mut grant)) = Grant::load(&dir, &run) {
            if !grant.ended {
                if let Some(spent) = ledger
                    .as_ref()
                    .filter(|l| l.usd > 0.0 || l.usage.total() > 0)
                {
                    for mut other in live_grants(&dir, None) {
                        if other.run != run && fold(&mut other, grant.trace_id, spent) {
                            let _ = other.save(&dir);
                        }
                    }
                }
                grant.ended = true;
                if let Err(e) = grant.save(&dir) {
                    tracing::warn!(run = %run, error = %e, "cannot revoke a run's proxy grant");
                }
            }
        }
        ledger
    })
    .await
    .ok()
    .flatten()
}

/// The grants whose run has not ended (of `trace` only, when given).
fn live_grants(dir: &Path, trace: Option<Uuid>) -> Vec<Grant> {
    let Ok(entries) = std::fs::read_dir(dir.join(proxy::RUNS_DIR)) else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|entry| {
            let run = entry.file_name().to_string_lossy().into_owned();
            Grant::load(dir, &run).ok().flatten()
        })
        .filter(|g| trace.is_none_or(|t| g.trace_id == t) && !g.ended)
        .collect()
}

/// Once a run's span is final: its network goes, its files in the proxy dir go (the span
/// holds what they said), and the other live runs of its trace count its spend as recorded.
pub(super) async fn forget_run(store: &AutopilotStore, sandbox: &dyn Sandbox, container: &str) {
    if let Err(e) = sandbox.disconnect_run(container).await {
        tracing::warn!(run = %container, error = %e, "cannot remove a run's network; gc removes it later");
        return;
    }
    let dir = proxy_dir(store);
    let run = container.to_owned();
    let store = store.clone();
    let _ = tokio::task::spawn_blocking(move || {
        let trace = Grant::load(&dir, &run).ok().flatten().map(|g| g.trace_id);
        let _ = std::fs::remove_dir_all(Grant::run_dir(&dir, &run));
        if let Some(trace) = trace {
            rebaseline(&store, &dir, trace);
        }
    })
    .await;
}

/// The live grants take the recorded spend as their baselines: the trace's for those of
/// `trace`, the day's and the month's for all of them.
fn rebaseline(store: &AutopilotStore, dir: &Path, trace: Uuid) {
    let Ok(ledger) = crate::budget::Ledger::load(store) else {
        return;
    };
    let now = Utc::now();
    for mut grant in live_grants(dir, None) {
        let Some(budget) = grant.budget.as_mut() else {
            continue;
        };
        if grant.trace_id == trace {
            let spent = ledger.trace(trace);
            budget.baseline_usd = spent.cost_usd;
            budget.baseline_tokens = spent.tokens();
        }
        if let Some(day) = budget.day.as_mut() {
            day.period = day_period(now);
            day.baseline_usd = ledger.today(now).cost_usd;
        }
        if let Some(month) = budget.month.as_mut() {
            month.period = month_period(now);
            month.baseline_usd = ledger.this_month(now).cost_usd;
        }
        let _ = grant.save(dir);
    }
}

/// Count an ended run's spend (`spent`, of trace `ended_trace`) in the baselines of another
/// live grant: its trace's when it is the same trace, its day's and month's in any case.
/// Returns whether anything changed.
fn fold(grant: &mut Grant, ended_trace: Uuid, spent: &Ledger) -> bool {
    let same = grant.trace_id == ended_trace;
    let Some(budget) = grant.budget.as_mut() else {
        return false;
    };
    let mut changed = false;
    if same {
        budget.baseline_usd += spent.usd;
        budget.baseline_tokens += spent.usage.total();
        changed = true;
    }
    for period in [budget.day.as_mut(), budget.month.as_mut()]
        .into_iter()
        .flatten()
    {
        period.baseline_usd += spent.usd;
        changed = true;
    }
    changed
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
