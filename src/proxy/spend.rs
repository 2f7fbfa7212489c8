//! The spend the proxy sees before forwarding a model request: the grant's baselines (what was
//! recorded before the run, live runs excluded) plus the ledger of every live run. Ended runs
//! are left out: the daemon folds their spend into the live grants' baselines when it collects
//! them. Requests in flight are not here: [`super::reserve`] adds their reservations.

use std::path::Path;

use super::error::ProxyError;
use super::grant::{is_valid_run, Grant, RUNS_DIR};
use super::ledger::Ledger;

/// What the live runs' ledgers hold, for one grant.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct LiveSpend {
    /// USD of the live runs of the grant's trace (this run included).
    pub trace_usd: f64,
    /// Tokens (every input, cached and cache-write token, and every output token) of the live
    /// runs of the grant's trace.
    pub trace_tokens: u64,
    /// USD of every live run, whatever its trace (for the day's and month's limits; only when
    /// asked for).
    pub all_usd: f64,
}

/// The spend of `grant`'s trace in USD: its baseline and its live runs (blocking).
pub fn trace_spend(dir: &Path, grant: &Grant) -> Result<f64, ProxyError> {
    let baseline = grant.budget.as_ref().map_or(0.0, |b| b.baseline_usd);
    Ok(baseline + live_spend(dir, grant, false)?.trace_usd)
}

/// The live runs' spend as seen by `grant` (blocking: reads every run's grant, and the ledgers
/// of its trace's runs; with `all`, every live run's ledger, for a period's limit).
pub fn live_spend(dir: &Path, grant: &Grant, all: bool) -> Result<LiveSpend, ProxyError> {
    let mut spend = LiveSpend::default();
    let runs = dir.join(RUNS_DIR);
    let entries = match std::fs::read_dir(&runs) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(spend),
        Err(e) => return Err(ProxyError::io("list", &runs)(e)),
    };
    for entry in entries {
        let entry = entry.map_err(ProxyError::io("list", &runs))?;
        let Some(run) = entry.file_name().to_str().map(str::to_owned) else {
            continue;
        };
        if !is_valid_run(&run) {
            continue;
        }
        let other = if run == grant.run {
            Some(grant.clone())
        } else {
            match Grant::load(dir, &run) {
                Ok(other) => other,
                Err(e) => {
                    // Another run's broken grant must not stop this run's requests.
                    tracing::warn!(run, error = %e, "skipping an unreadable grant in the spend");
                    None
                }
            }
        };
        let Some(other) = other else { continue };
        if other.ended {
            continue;
        }
        let ours = other.trace_id == grant.trace_id;
        if !ours && !all {
            continue;
        }
        // This trace's own ledgers are counted even if broken: refuse rather than undercount.
        let ledger = match Ledger::load(dir, &run) {
            Ok(ledger) => ledger,
            Err(e) if ours => return Err(e),
            Err(e) => {
                tracing::warn!(run, error = %e, "skipping an unreadable ledger in the day's spend");
                None
            }
        };
        let Some(ledger) = ledger else { continue };
        spend.all_usd += ledger.usd;
        if ours {
            spend.trace_usd += ledger.usd;
            spend.trace_tokens += ledger.usage.total();
        }
    }
    Ok(spend)
}
