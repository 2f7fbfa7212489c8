//! A run's authority: its grant (the hash of a token made for this run, the model API it may
//! call, where else it may connect, its trace's budget, how many requests at once), its
//! network through rover's proxy, and the variables that point the agent there; at the end,
//! the grant revoked and what the proxy saw; once recorded, the network and files gone.

use std::path::Path;

use chrono::Utc;
use uuid::Uuid;

use super::{AgentRunError, AgentRuns, RecordedSpend, WireLedger};
use crate::agents::AgentKind;
use crate::proxy::{self, Grant, GrantBudget};
use crate::sandbox::runnet::{PROXY_ALIAS, PROXY_PORT};
use crate::sandbox::{ContainerStatus, RunConnect};

/// What a run got: the network its container joins and the variables rover sets in it.
pub(super) struct Connected {
    pub network: String,
    /// The network has no way out but the proxy (`--internal`).
    pub internal: bool,
    pub env: Vec<(String, String)>,
    /// The model API's root at the proxy, for a CLI that takes it as an argument.
    pub model_base_url: String,
}

/// The variables that point an agent at rover's proxy with the run's `token`: the model API's
/// base URL and key for its CLI, and the proxy for anything else it runs (curl, pip, npm,
/// cargo and git read these).
pub fn agent_env(kind: AgentKind, token: &str) -> Vec<(String, String)> {
    let mut env = kind.cli().model_env(&model_base_url(kind), token);
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

/// The model API of `kind` at rover's proxy: `http://rover-proxy:<port>/<provider>`.
fn model_base_url(kind: AgentKind) -> String {
    format!(
        "http://{PROXY_ALIAS}:{PROXY_PORT}/{}",
        kind.provider().name()
    )
}

impl AgentRuns {
    /// Whether `container` runs or ran already (a restart adopts it).
    pub(super) async fn runs_already(&self, container: &str) -> bool {
        matches!(
            self.sandbox.status(container).await,
            Ok(ContainerStatus::Running | ContainerStatus::Exited { .. })
        )
    }

    /// Gives the run `container` of `trace_id` its grant and network. `adopting`: the
    /// container runs already (a restart), so its grant stays as it is and only the network is
    /// ensured.
    pub(super) async fn connect(
        &self,
        kind: AgentKind,
        trace_id: Uuid,
        container: &str,
        budget: Option<GrantBudget>,
        adopting: bool,
    ) -> Result<Connected, AgentRunError> {
        let token = proxy::new_token();
        if !adopting {
            let grant = Grant {
                run: container.to_owned(),
                trace_id,
                token_sha256: proxy::token_sha256(&token),
                providers: vec![kind.provider()],
                egress: self.egress.policy(),
                budget,
                max_requests: Some(self.model_concurrency),
                codex_prices: self.shared.as_ref().map(|s| s.codex_prices.clone()),
                ended: false,
                created_at: Utc::now(),
            };
            let dir = self.proxy_dir.clone();
            tokio::task::spawn_blocking(move || grant.save(&dir))
                .await
                .map_err(|e| AgentRunError::Stopped(format!("writing the run's grant: {e}")))?
                .map_err(|source| AgentRunError::Grant {
                    proxy_dir: self.proxy_dir.clone(),
                    source,
                })?;
        }
        let internal = !self.egress.is_open();
        let network = self
            .sandbox
            .connect_run(&RunConnect {
                run: container.to_owned(),
                project: self.project.clone(),
                internal,
                proxy_dir: self.proxy_dir.clone(),
                shared_server: self.shared.as_ref().map(|s| s.server.clone()),
                server_env: self.server_env.clone(),
            })
            .await
            .map_err(|source| AgentRunError::Sandbox {
                container: container.to_owned(),
                source,
            })?;
        Ok(Connected {
            network,
            internal,
            env: agent_env(kind, &token),
            model_base_url: model_base_url(kind),
        })
    }

    /// The end of run `container`: what the proxy saw of it (`None`: it had no network, or
    /// the proxy saw nothing), and its grant revoked (the token stops working now).
    pub async fn end(&self, container: &str) -> Option<WireLedger> {
        if self.egress.is_none() {
            return None;
        }
        let dir = self.proxy_dir.clone();
        let run = container.to_owned();
        tokio::task::spawn_blocking(move || proxy::end_run(&dir, &run))
            .await
            .ok()
            .flatten()
    }

    /// Once run `container`'s span is final: its network goes, then its files in the proxy
    /// dir (the span holds what they said), and the other live runs take `recorded` (asked
    /// with the run's trace: the spend the budget has recorded) as their baselines.
    pub async fn forget(
        &self,
        container: &str,
        recorded: impl FnOnce(Uuid) -> Option<RecordedSpend> + Send + 'static,
    ) {
        // Its span is final, so its spend is in its repository's budget: the daemon's wire
        // file (a daemon file's budget) stops counting it as live once the daemon's sum has it.
        let daemon_dir = self
            .server_env
            .iter()
            .find(|(k, _)| k == proxy::env::DAEMON_DIR)
            .map(|(_, v)| std::path::PathBuf::from(v));
        if let Some(daemon_dir) = daemon_dir {
            let run = container.to_owned();
            let marked =
                tokio::task::spawn_blocking(move || proxy::daemon_run_recorded(&daemon_dir, &run))
                    .await;
            if let Ok(Err(e)) = marked {
                tracing::warn!(run = %container, error = %e, "cannot mark a run recorded in the daemon's spend (it lapses in 6 hours)");
            }
        }
        if let Err(e) = self.sandbox.disconnect_run(container).await {
            tracing::warn!(run = %container, error = %e, "cannot remove a run's network; gc removes it later");
            return;
        }
        let dir = self.proxy_dir.clone();
        let run = container.to_owned();
        let _ = tokio::task::spawn_blocking(move || {
            let recorded = proxy::run_trace(&dir, &run).and_then(recorded);
            proxy::forget_run(&dir, &run, recorded.as_ref());
        })
        .await;
    }
}

/// Removes the proxy files in `proxy_dir` of every run not in `named` (a crash between
/// collecting a run and forgetting it; their spans hold what they said): the runs removed,
/// and the errors. Blocking.
pub fn forget_files_except(proxy_dir: &Path, named: &[&str]) -> (Vec<String>, Vec<String>) {
    let (mut removed, mut errors) = (Vec::new(), Vec::new());
    for run in proxy::runs_with_files(proxy_dir) {
        if named.contains(&run.as_str()) {
            continue;
        }
        match std::fs::remove_dir_all(Grant::run_dir(proxy_dir, &run)) {
            Ok(()) => removed.push(run),
            Err(e) => errors.push(format!("proxy files of {run}: {e}")),
        }
    }
    (removed, errors)
}
