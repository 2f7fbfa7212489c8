//! A trace's spend as the proxy sees it before forwarding a model request: the grant's baseline
//! (the trace's recorded spend at launch, live runs excluded) plus the ledger of every live run
//! of the trace. Ended runs are left out: the daemon folds their spend into the live grants'
//! baselines when it collects them.

use std::path::Path;

use super::error::ProxyError;
use super::grant::{is_valid_run, Grant, RUNS_DIR};
use super::ledger::Ledger;

/// The spend of `grant`'s trace in USD (blocking: reads every run's grant and ledger).
pub fn trace_spend(dir: &Path, grant: &Grant) -> Result<f64, ProxyError> {
    let mut spend = grant.budget.map_or(0.0, |b| b.baseline_usd);
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
                    tracing::warn!(run, error = %e, "skipping an unreadable grant in the trace's spend");
                    None
                }
            }
        };
        let Some(other) = other else { continue };
        if other.trace_id != grant.trace_id || other.ended {
            continue;
        }
        // This trace's own ledgers are counted even if broken: refuse rather than undercount.
        if let Some(ledger) = Ledger::load(dir, &run)? {
            spend += ledger.usd;
        }
    }
    Ok(spend)
}
