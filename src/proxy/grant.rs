//! The grant of one run (`runs/<run>/grant.json`): what the daemon allows the run's agent to do
//! through the proxy, written by the daemon and read by the proxy on every request.

use std::path::{Path, PathBuf};

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use uuid::Uuid;

use super::error::ProxyError;
use crate::store::fsio;

/// The folder under the proxy dir that holds one folder per run.
pub const RUNS_DIR: &str = "runs";
const GRANT_FILE: &str = "grant.json";

/// A model provider the proxy forwards to: the API an agent CLI talks to.
pub use crate::agents::Provider;

/// Where the run's agent may open connections through the proxy (`CONNECT` and absolute-form
/// requests, what `HTTPS_PROXY`/`HTTP_PROXY` clients send). Loopback, link-local, the metadata
/// address and (unless allow-listed by literal IP) private ranges are refused in every mode.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "mode", rename_all = "camelCase")]
pub enum Egress {
    /// Model traffic only, through the reverse proxy; no other destination, not even the model
    /// hosts directly (a direct connection could carry the agent's own key out).
    #[default]
    ModelOnly,
    /// The listed destinations: `host` (ports 80 and 443), `*.suffix` (any subdomain of
    /// `suffix`, not `suffix` itself), `host:port`, an IP literal (`10.0.0.5`, `[fd00::1]:8080`).
    Allow { hosts: Vec<String> },
    /// Any public destination.
    Open,
    /// Nothing at all.
    #[serde(rename = "none")]
    Closed,
}

/// The budget limits the proxy enforces for a run: every limit whose action stops running work
/// (`autopilot.budget.trace` with `pause` or `stop`, `day` and `month` with `stop`), each with
/// the spend recorded before the run (runs still live are counted from their ledgers). A limit
/// left out is not enforced at the wire.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GrantBudget {
    /// The trace's USD stop limit (`autopilot.budget.trace.usd`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stop_usd: Option<f64>,
    /// The trace's recorded USD at launch, excluding runs still live (whose ledgers count).
    #[serde(default)]
    pub baseline_usd: f64,
    /// The trace's token stop limit (`autopilot.budget.trace.tokens`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stop_tokens: Option<u64>,
    /// The trace's recorded tokens at launch, excluding runs still live.
    #[serde(default)]
    pub baseline_tokens: u64,
    /// The UTC day's USD stop limit (`autopilot.budget.day.usd`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub day: Option<PeriodBudget>,
    /// The UTC month's USD stop limit (`autopilot.budget.month.usd`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub month: Option<PeriodBudget>,
}

impl GrantBudget {
    /// Whether any limit is set.
    pub fn is_empty(&self) -> bool {
        self.stop_usd.is_none()
            && self.stop_tokens.is_none()
            && self.day.is_none()
            && self.month.is_none()
    }
}

/// A calendar period's USD stop limit, with the period's recorded spend (every trace's, runs
/// still live excluded) when the grant was written or last rebaselined.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PeriodBudget {
    /// `YYYY-MM-DD` for a day, `YYYY-MM` for a month (UTC): the baseline is that period's; in
    /// a later period it no longer counts (the live runs' ledgers still do).
    pub period: String,
    pub stop_usd: f64,
    pub baseline_usd: f64,
}

/// The most model requests one run may have in flight at once, unless its grant says otherwise
/// (`autopilot.sandbox.modelConcurrency`).
pub const DEFAULT_MAX_REQUESTS: u32 = 8;

/// What one run may do through the proxy. Unknown keys are ignored so a newer daemon's grants
/// still load.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Grant {
    /// The run's container name; also its folder name.
    pub run: String,
    /// The trace the run spends for.
    pub trace_id: Uuid,
    /// Hex sha256 of the run's token ([`token_sha256`]); the token itself is never stored.
    pub token_sha256: String,
    /// The providers the run may call.
    #[serde(default)]
    pub providers: Vec<Provider>,
    /// Where else it may connect.
    #[serde(default)]
    pub egress: Egress,
    /// The budget limits enforced at the wire; none means no cap there.
    #[serde(default)]
    pub budget: Option<GrantBudget>,
    /// The most model requests the run may have in flight at once ([`DEFAULT_MAX_REQUESTS`]
    /// when not given).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_requests: Option<u32>,
    /// `autopilot.agent.codexPrices` of the run's repository, when the proxy server serves
    /// many repositories (a daemon file's): its spend is counted at these prices rather than the
    /// server's own, which are the same for every repository.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub codex_prices: Option<crate::agents::CodexPrices>,
    /// Set when the run is over: its token stops working at once.
    #[serde(default)]
    pub ended: bool,
    pub created_at: DateTime<Utc>,
}

impl Grant {
    /// The folder of `run` under the proxy dir `dir`.
    pub fn run_dir(dir: &Path, run: &str) -> PathBuf {
        dir.join(RUNS_DIR).join(run)
    }

    /// The grant file of `run` under the proxy dir `dir`.
    pub fn path(dir: &Path, run: &str) -> PathBuf {
        Grant::run_dir(dir, run).join(GRANT_FILE)
    }

    /// Write the grant atomically to `dir/runs/<run>/grant.json`, creating the folders.
    pub fn save(&self, dir: &Path) -> Result<(), ProxyError> {
        check_run(&self.run)?;
        let run_dir = Grant::run_dir(dir, &self.run);
        std::fs::create_dir_all(&run_dir).map_err(ProxyError::io("create", &run_dir))?;
        fsio::write_json_atomic(&Grant::path(dir, &self.run), self)?;
        Ok(())
    }

    /// The grant of `run`, or `None` when it has none.
    pub fn load(dir: &Path, run: &str) -> Result<Option<Grant>, ProxyError> {
        check_run(run)?;
        super::ledger::read_json(&Grant::path(dir, run))
    }

    /// Whether `token` is this run's token.
    pub fn accepts(&self, token: &str) -> bool {
        token_sha256(token).eq_ignore_ascii_case(&self.token_sha256)
    }
}

/// Hex sha256 of a run token, as grants store it.
pub fn token_sha256(token: &str) -> String {
    use std::fmt::Write as _;
    let mut hex = String::with_capacity(64);
    for b in Sha256::digest(token.as_bytes()) {
        let _ = write!(hex, "{b:02x}");
    }
    hex
}

/// A fresh run token: `rover-run-` and 32 hex digits (122 random bits of a v4 uuid).
pub fn new_token() -> String {
    format!("rover-run-{}", Uuid::new_v4().simple())
}

/// Whether `run` is a usable run name: `[A-Za-z0-9_.-]{1,128}`, and not `.` or `..` (it names a
/// folder).
pub fn is_valid_run(run: &str) -> bool {
    (1..=128).contains(&run.len())
        && run
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'))
        && run != "."
        && run != ".."
}

/// Whether `key` is a usable store key of a proxy server serving many repositories (a project
/// id): one plain path component, by the same rule as a run name ([`is_valid_run`]), and not a
/// name the server's own dir uses (`sock`, `runs`).
pub fn is_valid_key(key: &str) -> bool {
    is_valid_run(key) && key != "sock" && key != RUNS_DIR
}

pub(crate) fn check_run(run: &str) -> Result<(), ProxyError> {
    if is_valid_run(run) {
        Ok(())
    } else {
        Err(ProxyError::BadRun {
            run: run.chars().take(140).collect(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grants_round_trip_and_ignore_unknown_keys() {
        let text = r#"{"run":"rover-run-1","traceId":"6f1c2c1e-1111-4222-8333-444455556666",
            "tokenSha256":"ab","providers":["anthropic","openai"],
            "egress":{"mode":"allow","hosts":["pypi.org","*.pythonhosted.org"]},
            "budget":{"stopUsd":5.0,"baselineUsd":1.5},"ended":false,
            "createdAt":"2026-01-01T00:00:00Z","futureKey":{"x":1}}"#;
        let grant: Grant = serde_json::from_str(text).expect("parses");
        assert_eq!(grant.providers, vec![Provider::Anthropic, Provider::Openai]);
        assert_eq!(
            grant.egress,
            Egress::Allow {
                hosts: vec!["pypi.org".into(), "*.pythonhosted.org".into()]
            }
        );
        let again: Grant =
            serde_json::from_str(&serde_json::to_string(&grant).expect("serializes"))
                .expect("parses");
        assert_eq!(again, grant);
        for (mode, egress) in [
            ("modelOnly", Egress::ModelOnly),
            ("open", Egress::Open),
            ("none", Egress::Closed),
        ] {
            let parsed: Egress =
                serde_json::from_str(&format!(r#"{{"mode":"{mode}"}}"#)).expect(mode);
            assert_eq!(parsed, egress);
        }
    }

    #[test]
    fn run_names_that_could_leave_the_runs_folder_are_refused() {
        assert!(is_valid_run("rover-abc_1.2"));
        for bad in ["", ".", "..", "a/b", "a b", &"x".repeat(129)] {
            assert!(!is_valid_run(bad), "{bad:?}");
            assert!(!is_valid_key(bad), "{bad:?}");
        }
        assert!(is_valid_key("acme-web-1a2b3c4d"));
        for reserved in ["sock", "runs"] {
            assert!(!is_valid_key(reserved), "{reserved:?}");
        }
    }

    #[test]
    fn tokens_are_random_and_hashed() {
        let (a, b) = (new_token(), new_token());
        assert_ne!(a, b);
        assert!(a.starts_with("rover-run-") && a.len() == 42);
        assert_eq!(
            token_sha256("abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }
}
