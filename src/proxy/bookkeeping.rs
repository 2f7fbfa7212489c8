//! The grants' bookkeeping over a run's life, for whoever starts runs: the end of a run (what
//! the proxy saw of it, its grant revoked, its spend counted by the other live runs until it
//! is recorded) and its files forgotten once recorded (the live grants then take the recorded
//! spend as their baselines). Blocking file work; every write is the grant's atomic save.

use std::path::Path;

use uuid::Uuid;

use super::grant::Grant;
use super::ledger::Ledger;
use super::RUNS_DIR;

/// A calendar period's recorded USD (`period`: `YYYY-MM-DD` or `YYYY-MM`, UTC).
#[derive(Debug, Clone, PartialEq)]
pub struct PeriodSpend {
    pub period: String,
    pub usd: f64,
}

/// What the budget's ledger has recorded, once a run's spend is in it: its trace's USD and
/// tokens, the day's and the month's USD. The live grants take these as their baselines.
#[derive(Debug, Clone, PartialEq)]
pub struct RecordedSpend {
    pub trace_id: Uuid,
    pub trace_usd: f64,
    pub trace_tokens: u64,
    pub day: PeriodSpend,
    pub month: PeriodSpend,
}

/// What the proxy saw of `run` (`None`: nothing, or unreadable: logged), and its grant revoked:
/// the token stops working now. The other live runs first count its spend in their baselines
/// (until [`forget_run`] rebaselines them on the recorded spend), so it is never counted
/// nowhere.
pub fn end_run(dir: &Path, run: &str) -> Option<Ledger> {
    let ledger = match Ledger::load(dir, run) {
        Ok(ledger) => ledger,
        Err(e) => {
            tracing::warn!(run = %run, error = %e, "cannot read what the proxy saw of a run");
            None
        }
    };
    if let Ok(Some(mut grant)) = Grant::load(dir, run) {
        if !grant.ended {
            if let Some(spent) = ledger
                .as_ref()
                .filter(|l| l.usd > 0.0 || l.usage.total() > 0)
            {
                for mut other in live_grants(dir) {
                    if other.run != run && fold(&mut other, grant.trace_id, spent) {
                        let _ = other.save(dir);
                    }
                }
            }
            grant.ended = true;
            if let Err(e) = grant.save(dir) {
                tracing::warn!(run = %run, error = %e, "cannot revoke a run's proxy grant");
            }
        }
    }
    ledger
}

/// The trace `run`'s grant spent for, when its grant is there.
pub fn run_trace(dir: &Path, run: &str) -> Option<Uuid> {
    Grant::load(dir, run).ok().flatten().map(|g| g.trace_id)
}

/// Once a run's spend is recorded: its files in the proxy dir go (its span holds what they
/// said), and the live grants take `recorded` (the spend of the run's trace, the day's and
/// the month's) as their baselines.
pub fn forget_run(dir: &Path, run: &str, recorded: Option<&RecordedSpend>) {
    let _ = std::fs::remove_dir_all(Grant::run_dir(dir, run));
    if let Some(recorded) = recorded {
        rebaseline(dir, recorded);
    }
}

/// The runs that have files in the proxy dir (grants, ledgers), by container name.
pub fn runs_with_files(dir: &Path) -> Vec<String> {
    let Ok(entries) = std::fs::read_dir(dir.join(RUNS_DIR)) else {
        return Vec::new();
    };
    entries
        .flatten()
        .map(|entry| entry.file_name().to_string_lossy().into_owned())
        .collect()
}

/// The runs under the proxy dir `dir` that may still need the proxy: those whose grant has not
/// ended, or cannot be read (counted rather than cut off).
pub fn runs_in_flight(dir: &Path) -> Vec<String> {
    runs_with_files(dir)
        .into_iter()
        .filter(|run| super::grant::is_valid_run(run))
        .filter(|run| !matches!(Grant::load(dir, run), Ok(Some(g)) if g.ended))
        .collect()
}

/// The runs of every store under the dir `root` of a proxy server the repositories of a daemon
/// file share (`<key>/<run>`) that may still need it (see [`runs_in_flight`]).
pub fn shared_runs_in_flight(root: &Path) -> Vec<String> {
    let Ok(entries) = std::fs::read_dir(root) else {
        return Vec::new();
    };
    let mut runs: Vec<String> = entries
        .flatten()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|key| super::grant::is_valid_key(key))
        .flat_map(|key| {
            runs_in_flight(&root.join(&key))
                .into_iter()
                .map(move |run| format!("{key}/{run}"))
        })
        .collect();
    runs.sort();
    runs
}

/// The grants whose run has not ended.
fn live_grants(dir: &Path) -> Vec<Grant> {
    runs_with_files(dir)
        .iter()
        .filter_map(|run| Grant::load(dir, run).ok().flatten())
        .filter(|g| !g.ended)
        .collect()
}

/// The live grants take the recorded spend as their baselines: the trace's for those of its
/// trace, the day's and the month's for all of them.
fn rebaseline(dir: &Path, recorded: &RecordedSpend) {
    for mut grant in live_grants(dir) {
        let Some(budget) = grant.budget.as_mut() else {
            continue;
        };
        if grant.trace_id == recorded.trace_id {
            budget.baseline_usd = recorded.trace_usd;
            budget.baseline_tokens = recorded.trace_tokens;
        }
        if let Some(day) = budget.day.as_mut() {
            day.period.clone_from(&recorded.day.period);
            day.baseline_usd = recorded.day.usd;
        }
        if let Some(month) = budget.month.as_mut() {
            month.period.clone_from(&recorded.month.period);
            month.baseline_usd = recorded.month.usd;
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
