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
use crate::proxy::{self, Grant, GrantBudget, Ledger, Provider};
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
    pub env: Vec<(String, String)>,
}

impl WorkflowStep {
    /// The trace's budget as the proxy enforces it: only a `usd` limit that stops, with what
    /// the trace has spent so far (runs still going are counted by the proxy itself).
    async fn wire_budget(&self, ctx: &StepContext, trace_id: Uuid) -> Option<GrantBudget> {
        let limits = &self.services.config.autopilot.budget.trace;
        let stop_usd = limits.usd?;
        if limits.action == crate::budget::BudgetAction::Warn {
            return None;
        }
        let store = ctx.store.clone();
        let spent = tokio::task::spawn_blocking(move || crate::budget::Ledger::load(&store))
            .await
            .ok()
            .and_then(Result::ok)
            .map_or(0.0, |l| l.trace(trace_id).cost_usd);
        Some(GrantBudget {
            stop_usd,
            baseline_usd: spent,
        })
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
                let spent = ledger.as_ref().map_or(0.0, |l| l.usd);
                if spent > 0.0 {
                    for mut other in live_grants(&dir, grant.trace_id) {
                        if other.run != run {
                            if let Some(budget) = other.budget.as_mut() {
                                budget.baseline_usd += spent;
                                let _ = other.save(&dir);
                            }
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

/// The grants of `trace` whose run has not ended.
fn live_grants(dir: &Path, trace: Uuid) -> Vec<Grant> {
    let Ok(entries) = std::fs::read_dir(dir.join(proxy::RUNS_DIR)) else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|entry| {
            let run = entry.file_name().to_string_lossy().into_owned();
            Grant::load(dir, &run).ok().flatten()
        })
        .filter(|g| g.trace_id == trace && !g.ended)
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

/// The live grants of `trace` take the trace's recorded spend as their baseline.
fn rebaseline(store: &AutopilotStore, dir: &Path, trace: Uuid) {
    let Ok(ledger) = crate::budget::Ledger::load(store) else {
        return;
    };
    let spent = ledger.trace(trace).cost_usd;
    for mut grant in live_grants(dir, trace) {
        if let Some(budget) = grant.budget.as_mut() {
            budget.baseline_usd = spent;
            let _ = grant.save(dir);
        }
    }
}
