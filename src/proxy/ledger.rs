//! The ledger of one run (`runs/<run>/ledger.json`): what the proxy saw the run do (model
//! requests, tokens, USD, connections, refusals), written by the proxy and read by the daemon.
//!
//! Writers of one run's ledger take `runs/<run>/ledger.lock` (a `flock` on a file never renamed
//! over) and read-modify-write under it, so the proxy's concurrent connections and a restarted
//! proxy never lose an update; readers need no lock since the file is replaced atomically.

use std::collections::BTreeMap;
use std::path::Path;

use chrono::{DateTime, Utc};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use super::error::ProxyError;
use super::grant::{check_run, Grant};
use crate::store::{fsio, StoreLock};

const LEDGER_FILE: &str = "ledger.json";
const LOCK_FILE: &str = "ledger.lock";
/// Connection rows kept before the rest are counted in an `other` row.
pub const MAX_CONNECTION_ROWS: usize = 200;
/// Refusals kept (the most recent).
pub const MAX_REFUSALS: usize = 20;
/// The host of the row that counts connections past [`MAX_CONNECTION_ROWS`].
pub const OTHER_HOST: &str = "other";
/// Models a run's ledger names; the responses of any further model are counted under
/// [`OTHER_MODEL`].
pub const MAX_MODELS: usize = 8;
/// The longest model name kept (a model name is what a response said: untrusted).
pub const MAX_MODEL_CHARS: usize = 64;
/// The key of the models past [`MAX_MODELS`].
pub const OTHER_MODEL: &str = "other";
/// The key of responses whose model neither the request nor the response named.
pub const UNKNOWN_MODEL: &str = "unknown";

/// Tokens of the run's model calls, summed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TokenUsage {
    /// Input tokens neither read from nor written to the prompt cache.
    pub input: u64,
    /// Input tokens read from the prompt cache.
    pub cached: u64,
    /// Input tokens written to the prompt cache (Anthropic bills them above the input price).
    #[serde(default)]
    pub cache_write: u64,
    /// Output tokens (reasoning included).
    pub output: u64,
}

impl TokenUsage {
    /// Every token: input, cached, cache writes and output (what a token limit counts).
    pub fn total(&self) -> u64 {
        self.input + self.cached + self.cache_write + self.output
    }

    /// Add `other` to these counts.
    pub fn add(&mut self, other: &TokenUsage) {
        self.input += other.input;
        self.cached += other.cached;
        self.cache_write += other.cache_write;
        self.output += other.output;
    }
}

/// What one model's responses cost a run.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ModelUsage {
    #[serde(default)]
    pub requests: u64,
    #[serde(default)]
    pub usage: TokenUsage,
    #[serde(default)]
    pub usd: f64,
}

impl ModelUsage {
    /// Add `other` to these figures.
    pub fn add(&mut self, other: &ModelUsage) {
        self.requests += other.requests;
        self.usage.add(&other.usage);
        self.usd += other.usd;
    }
}

/// `model` as a ledger's key: only `[A-Za-z0-9._:/-]`, at most [`MAX_MODEL_CHARS`] characters,
/// [`UNKNOWN_MODEL`] when nothing is left.
pub fn model_key(model: Option<&str>) -> String {
    let key: String = model
        .unwrap_or_default()
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | ':' | '/' | '-'))
        .take(MAX_MODEL_CHARS)
        .collect();
    if key.is_empty() {
        UNKNOWN_MODEL.to_owned()
    } else {
        key
    }
}

/// Connections to one destination with one verdict.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ConnectionRow {
    pub host: String,
    pub port: u16,
    pub allowed: bool,
    pub count: u64,
    /// Why they were refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// A request the proxy refused.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Refusal {
    pub at: DateTime<Utc>,
    pub reason: String,
}

/// The first time a budget limit stopped a model request of the run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Stopped {
    pub at: DateTime<Utc>,
    /// The limit's key (`autopilot.budget.trace.usd`, `.trace.tokens`, `.day.usd`,
    /// `.month.usd`); none in ledgers written before there was more than the trace's USD.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<String>,
    /// The spend the limit counts when the request was refused (USD limits), requests in
    /// flight included.
    #[serde(default)]
    pub spend_usd: f64,
    /// The USD limit it reached.
    #[serde(default)]
    pub stop_usd: f64,
    /// For a token limit: the tokens counted, and the limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spend_tokens: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stop_tokens: Option<u64>,
}

impl Stopped {
    /// `$0.0312 of $0.0050 (autopilot.budget.trace.usd)` or `260000 of 200000 tokens
    /// (autopilot.budget.trace.tokens)`.
    pub fn describe(&self) -> String {
        let limit = self
            .limit
            .as_deref()
            .unwrap_or("autopilot.budget.trace.usd");
        match (self.spend_tokens, self.stop_tokens) {
            (Some(spend), Some(stop)) => format!("{spend} of {stop} tokens ({limit})"),
            _ => format!(
                "{} of {} ({limit})",
                crate::agents::usd(self.spend_usd),
                crate::agents::usd(self.stop_usd)
            ),
        }
    }
}

/// What the proxy saw one run do.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Ledger {
    pub run: String,
    pub trace_id: Uuid,
    /// Model requests forwarded upstream.
    #[serde(default)]
    pub requests: u64,
    /// Requests refused (model or egress).
    #[serde(default)]
    pub refused: u64,
    /// Model request body bytes sent upstream.
    #[serde(default)]
    pub bytes_up: u64,
    /// Model response body bytes streamed back.
    #[serde(default)]
    pub bytes_down: u64,
    #[serde(default)]
    pub usage: TokenUsage,
    /// The USD of `usage` at the proxy's prices.
    #[serde(default)]
    pub usd: f64,
    /// One row per (host, port, allowed), at most [`MAX_CONNECTION_ROWS`] plus `other` rows.
    #[serde(default)]
    pub connections: Vec<ConnectionRow>,
    /// The last [`MAX_REFUSALS`] refusals, oldest first.
    #[serde(default)]
    pub refusals: Vec<Refusal>,
    #[serde(default)]
    pub stopped: Option<Stopped>,
    /// The responses by model ([`model_key`]): at most [`MAX_MODELS`] models and an
    /// [`OTHER_MODEL`] row. Absent from a ledger written before it was kept.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub by_model: BTreeMap<String, ModelUsage>,
    pub updated_at: DateTime<Utc>,
}

impl Ledger {
    /// An empty ledger for `run` of `trace_id`.
    pub fn new(run: &str, trace_id: Uuid) -> Ledger {
        Ledger {
            run: run.to_owned(),
            trace_id,
            requests: 0,
            refused: 0,
            bytes_up: 0,
            bytes_down: 0,
            usage: TokenUsage::default(),
            usd: 0.0,
            connections: Vec::new(),
            refusals: Vec::new(),
            stopped: None,
            by_model: BTreeMap::new(),
            updated_at: Utc::now(),
        }
    }

    /// The ledger of `run` under the proxy dir `dir`, or `None` before the proxy wrote one.
    pub fn load(dir: &Path, run: &str) -> Result<Option<Ledger>, ProxyError> {
        check_run(run)?;
        read_json(&Grant::run_dir(dir, run).join(LEDGER_FILE))
    }

    /// Read-modify-write the ledger of `grant`'s run under its lock (blocking: call it off the
    /// async runtime). A missing ledger starts empty.
    pub fn update(
        dir: &Path,
        grant: &Grant,
        change: impl FnOnce(&mut Ledger),
    ) -> Result<Ledger, ProxyError> {
        check_run(&grant.run)?;
        let run_dir = Grant::run_dir(dir, &grant.run);
        std::fs::create_dir_all(&run_dir).map_err(ProxyError::io("create", &run_dir))?;
        let _lock = StoreLock::acquire(&run_dir.join(LOCK_FILE))?;
        let mut ledger = Ledger::load(dir, &grant.run)?
            .unwrap_or_else(|| Ledger::new(&grant.run, grant.trace_id));
        change(&mut ledger);
        ledger.updated_at = Utc::now();
        fsio::write_json_atomic(&run_dir.join(LEDGER_FILE), &ledger)?;
        Ok(ledger)
    }

    /// Count one finished (or cut off) model response of `model` (the request's, else the
    /// one the response named).
    pub fn record_response(
        &mut self,
        bytes_up: u64,
        bytes_down: u64,
        usage: &TokenUsage,
        usd: f64,
        model: Option<&str>,
    ) {
        self.requests += 1;
        self.bytes_up += bytes_up;
        self.bytes_down += bytes_down;
        self.usage.add(usage);
        self.usd += usd;
        let mut key = model_key(model);
        let named = self.by_model.keys().filter(|k| *k != OTHER_MODEL).count();
        if !self.by_model.contains_key(&key) && named >= MAX_MODELS {
            OTHER_MODEL.clone_into(&mut key);
        }
        self.by_model.entry(key).or_default().add(&ModelUsage {
            requests: 1,
            usage: *usage,
            usd,
        });
    }

    /// Count one refused request.
    pub fn record_refusal(&mut self, reason: &str) {
        self.refused += 1;
        self.refusals.push(Refusal {
            at: Utc::now(),
            reason: reason.to_owned(),
        });
        if self.refusals.len() > MAX_REFUSALS {
            let extra = self.refusals.len() - MAX_REFUSALS;
            self.refusals.drain(..extra);
        }
    }

    /// Count one connection attempt to `host:port`.
    pub fn record_connection(
        &mut self,
        host: &str,
        port: u16,
        allowed: bool,
        reason: Option<&str>,
    ) {
        if let Some(row) = self
            .connections
            .iter_mut()
            .find(|r| r.host == host && r.port == port && r.allowed == allowed)
        {
            row.count += 1;
            return;
        }
        let own_rows = self
            .connections
            .iter()
            .filter(|r| !(r.host == OTHER_HOST && r.port == 0))
            .count();
        if own_rows < MAX_CONNECTION_ROWS {
            self.connections.push(ConnectionRow {
                host: host.to_owned(),
                port,
                allowed,
                count: 1,
                reason: reason.map(str::to_owned),
            });
            return;
        }
        if let Some(other) = self
            .connections
            .iter_mut()
            .find(|r| r.host == OTHER_HOST && r.port == 0 && r.allowed == allowed)
        {
            other.count += 1;
        } else {
            self.connections.push(ConnectionRow {
                host: OTHER_HOST.to_owned(),
                port: 0,
                allowed,
                count: 1,
                reason: (!allowed).then(|| "more destinations than the ledger lists".to_owned()),
            });
        }
    }

    /// Note that the trace's spend stopped a request (the first time only).
    pub fn record_stop(&mut self, stop: Stopped) {
        if self.stopped.is_none() {
            self.stopped = Some(stop);
        }
    }
}

/// Parse the JSON file at `path`, or `None` when there is none: the store's reading, with the
/// proxy's word for a file that does not parse.
pub(crate) fn read_json<T: DeserializeOwned>(path: &Path) -> Result<Option<T>, ProxyError> {
    fsio::read_json(path).map_err(|e| match e {
        crate::store::StoreError::Unreadable { path, reason } => {
            ProxyError::Unreadable { path, reason }
        }
        other => ProxyError::Store(other),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connection_rows_are_capped_with_an_other_row() {
        let mut ledger = Ledger::new("r", Uuid::nil());
        for i in 0..MAX_CONNECTION_ROWS + 5 {
            ledger.record_connection(&format!("h{i}"), 443, false, Some("no"));
        }
        ledger.record_connection("h0", 443, false, Some("no"));
        assert_eq!(ledger.connections.len(), MAX_CONNECTION_ROWS + 1);
        assert_eq!(ledger.connections[0].count, 2);
        let other = ledger.connections.last().expect("other row");
        assert_eq!((other.host.as_str(), other.count), (OTHER_HOST, 5));
    }

    #[test]
    fn responses_are_counted_by_model_with_names_cleaned_and_capped() {
        let mut ledger = Ledger::new("r", Uuid::nil());
        let usage = TokenUsage {
            input: 10,
            cached: 1,
            cache_write: 0,
            output: 5,
        };
        ledger.record_response(1, 1, &usage, 0.5, Some("claude-<b>sonnet\u{1b}[31m"));
        ledger.record_response(1, 1, &usage, 0.25, Some("claude-bsonnet31m"));
        ledger.record_response(1, 1, &usage, 0.25, None);
        let long = "m".repeat(100);
        ledger.record_response(1, 1, &usage, 0.0, Some(&long));
        let one = &ledger.by_model["claude-bsonnet31m"];
        assert_eq!((one.requests, one.usage.input, one.usd), (2, 20, 0.75));
        assert_eq!(ledger.by_model[UNKNOWN_MODEL].requests, 1);
        assert!(ledger.by_model.contains_key(&"m".repeat(MAX_MODEL_CHARS)));
        for i in 0..10 {
            ledger.record_response(1, 1, &usage, 1.0, Some(&format!("model-{i}")));
        }
        assert_eq!(ledger.by_model.len(), MAX_MODELS + 1);
        assert_eq!(ledger.by_model[OTHER_MODEL].requests, 5);
        let requests: u64 = ledger.by_model.values().map(|m| m.requests).sum();
        assert_eq!(requests, ledger.requests);
        // A ledger written before the models were kept still reads.
        let mut old = serde_json::to_value(Ledger::new("r", Uuid::nil())).unwrap();
        old.as_object_mut().unwrap().remove("byModel");
        let read: Ledger = serde_json::from_value(old).unwrap();
        assert!(read.by_model.is_empty());
    }

    #[test]
    fn refusals_keep_the_last_twenty() {
        let mut ledger = Ledger::new("r", Uuid::nil());
        for i in 0..25 {
            ledger.record_refusal(&format!("r{i}"));
        }
        assert_eq!(ledger.refused, 25);
        assert_eq!(ledger.refusals.len(), MAX_REFUSALS);
        assert_eq!(ledger.refusals[0].reason, "r5");
    }
}
