//! One agent CLI run in a sandbox, as a service at the edge: "run this agent on this workspace
//! under these limits, with this egress" in, "it runs (or ran already), and here is what the
//! proxy saw of it" out. It owns everything a run's authority is made of: the grant and the
//! run's token, the variables that point the CLI at rover's proxy, the agent's argv, the run's
//! network (and the DNS of a closed one), starting or adopting the container, and at the end
//! the revocation and the wire ledger; once the run is recorded, its network and files go.
//! A run a step waits for runs to its end in one call (`to_end.rs`); one it leaves running is
//! looked at again and again (`detached.rs`): its log followed, stopped past its limit or
//! stuck, its log taken once it ended and the run released once the step's record is final.
//!
//! The egress setting is read once, when the service is made ([`AgentRuns::new`]); a step
//! never sees a token, a grant or the proxy: it hands a [`RunPlan`] and gets a
//! [`PreparedRun`], then a [`Started`] run.

mod detached;
mod error;
mod network;
mod record;
mod returned;
mod start;
mod to_end;
mod watch;

/// What a shipped run's returned workspace changed in its worktree.
pub use crate::sandbox::returned::Applied;
pub use detached::{DetachedRun, LogNotKept, Look};
pub use error::AgentRunError;
pub use network::{agent_env, forget_files_except};
pub use record::RunNetworkMeta;
pub use returned::take_back;
pub use start::Started;
pub use to_end::RanToEnd;
pub use watch::{OnEnd, RunWatch};

use std::path::PathBuf;
use std::sync::Arc;

use uuid::Uuid;

use crate::agents::{AgentKind, AgentRequest};
pub use crate::sandbox::runnet::SharedServer;
use crate::sandbox::{Egress, Sandbox, SandboxSettings, SandboxSpec};

/// What the budget lets a run spend at the wire, and what it recorded, handed back when a
/// run's files are forgotten.
pub use crate::proxy::{GrantBudget, PeriodBudget, PeriodSpend, RecordedSpend};
/// What the proxy saw of a run: its model requests, tokens, USD, connections and refusals; and
/// the budget limit that stopped it at the wire, when one did.
pub use crate::proxy::{Ledger as WireLedger, Stopped as WireStop};

/// The environment of rover's proxy server (each provider's upstream and the key it adds, the
/// codex prices), from `get` (rover's own environment, the variables its host-side agents
/// read).
pub fn proxy_server_env(
    get: impl Fn(&str) -> Option<String>,
    codex_prices: &crate::agents::CodexPrices,
) -> Vec<(String, String)> {
    let prices = serde_json::to_value(codex_prices).unwrap_or_default();
    crate::proxy::env::server_env(get, &prices)
}

/// The agent runs of one project and store: the sandbox they run in, rover's proxy dir, and
/// the settings every run shares.
#[derive(Clone)]
pub struct AgentRuns {
    sandbox: Arc<dyn Sandbox>,
    /// `<store>/proxy`: the grants, the ledgers and the server's socket.
    proxy_dir: PathBuf,
    project: String,
    /// `autopilot.sandbox.egress` (or the `network` key it replaced), read once here.
    egress: Egress,
    /// The most model requests one run may have in flight.
    model_concurrency: u32,
    /// The proxy server's environment (upstreams, model keys, prices).
    server_env: Vec<(String, String)>,
    /// The server the repositories of a daemon file share, when this store's runs go through
    /// it (see [`AgentRuns::on_shared_server`]).
    shared: Option<Shared>,
}

/// A store's runs on the proxy server the repositories of a daemon file share.
#[derive(Clone)]
struct Shared {
    server: SharedServer,
    /// The repository's `autopilot.agent.codexPrices`, in each grant: the server's own are
    /// the same for every repository (another table would restart it for each in turn).
    codex_prices: crate::agents::CodexPrices,
}

/// One run to start: which CLI, the request it answers, the container it runs in (image,
/// workspace, limits, labels, mounts, the variables the user lets in), the trace it spends for
/// and what the budget lets it spend at the wire.
pub struct RunPlan {
    pub kind: AgentKind,
    pub request: AgentRequest,
    pub spec: SandboxSpec,
    pub trace_id: Uuid,
    pub budget: Option<GrantBudget>,
}

/// A run ready to start: its container spec complete (argv, network, rover's variables), and
/// what it was given, for the span.
pub struct PreparedRun {
    pub spec: SandboxSpec,
    /// The egress as written in `rover.json`.
    pub egress: String,
    /// The names of the variables the container gets (never their values).
    pub env_names: Vec<String>,
}

impl AgentRuns {
    /// The service for `project`'s runs in `sandbox`, with rover's proxy in `proxy_dir` and
    /// the proxy server's environment `server_env`.
    pub fn new(
        sandbox: Arc<dyn Sandbox>,
        settings: &SandboxSettings,
        proxy_dir: PathBuf,
        project: impl Into<String>,
        server_env: Vec<(String, String)>,
    ) -> AgentRuns {
        AgentRuns {
            sandbox,
            proxy_dir,
            project: project.into(),
            egress: settings.egress(),
            model_concurrency: settings.model_concurrency,
            server_env,
            shared: None,
        }
    }

    /// The runs go through the proxy server `server` that the repositories of a daemon file
    /// share (their files stay in the store's proxy dir, which leads there), their spend
    /// counted at `codex_prices`, the repository's own.
    #[must_use]
    pub fn on_shared_server(
        mut self,
        server: SharedServer,
        codex_prices: crate::agents::CodexPrices,
    ) -> AgentRuns {
        self.shared = Some(Shared {
            server,
            codex_prices,
        });
        self
    }

    /// The sandbox the runs go to.
    pub fn sandbox(&self) -> &Arc<dyn Sandbox> {
        &self.sandbox
    }

    /// The egress every run gets.
    pub fn egress(&self) -> &Egress {
        &self.egress
    }

    /// Makes `plan`'s container spec: the agent's argv, and unless the egress is `none`, the
    /// run's grant and token (kept as it is when the container runs already: a restart) and
    /// its network with rover's proxy as the only way out.
    pub async fn prepare(&self, plan: RunPlan) -> Result<PreparedRun, AgentRunError> {
        let RunPlan {
            kind,
            request,
            mut spec,
            trace_id,
            budget,
        } = plan;
        let container = spec.container_name();
        let connected = if self.egress.is_none() {
            None
        } else {
            let adopting = self.runs_already(&container).await;
            Some(
                self.connect(kind, trace_id, &container, budget, adopting)
                    .await?,
            )
        };
        let base_url = connected.as_ref().map(|c| c.model_base_url.clone());
        spec.cmd = crate::agents::sandbox_argv(kind, &request, base_url.as_deref());
        if let Some(connected) = connected {
            spec.network = connected.network;
            if connected.internal {
                spec.dns = vec![crate::sandbox::DNS_SINK.to_owned()];
            }
            spec.rover_env = connected.env;
            spec.proxy_dir = Some(self.proxy_dir.clone());
        }
        let env_names = spec
            .env
            .iter()
            .chain(&spec.rover_env)
            .map(|(k, _)| k.clone())
            .collect();
        Ok(PreparedRun {
            spec,
            egress: self.egress.describe(),
            env_names,
        })
    }
}
