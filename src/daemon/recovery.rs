//! What a crash or a stop left, taken up before the components start: temp files of interrupted
//! writes, the queue journal, the step runs cut off, what holds new work, and the containers
//! and worktrees no task names.

use std::time::Duration;

use crate::config::RoverConfig;
use crate::orchestrator::StepOrchestrator;
use crate::steps::Services;
use crate::store::AutopilotStore;

use super::StartError;

/// Recover the store and the orchestrator's runs, then say what holds new work and clear the
/// orphans.
pub(super) async fn recover(
    store: &AutopilotStore,
    config: &RoverConfig,
    orchestrator: &StepOrchestrator,
    services: &Services,
) -> Result<(), StartError> {
    // Temp files of writes a crash interrupted (never read; old ones only; the history's
    // directories once a day, so a start under cron does not list them every time).
    if let Ok(n) = store.sweep_temp_files_due(Duration::from_secs(60), Duration::from_secs(86_400))
    {
        if n > 0 {
            tracing::info!(files = n, "removed temp files of interrupted writes");
        }
    }
    // The queue journal folded into `state.json`, so each start begins with a short journal.
    {
        let store = store.clone();
        tokio::task::spawn_blocking(move || store.compact_state())
            .await
            .map_err(|e| StartError::Internal(format!("compaction panicked: {e}")))??;
    }
    let recovered = orchestrator.recover().await?;
    if !recovered.is_empty() {
        println!(
            "recovered {} step run(s) left by the last stop",
            recovered.len()
        );
    }
    // Say at once what holds new work (an open circuit breaker, a spent budget, a cap).
    match crate::budget::Ledger::load(store) {
        Ok(ledger) => {
            let budget = crate::budget::Budget::new(config.autopilot.budget.clone());
            for reason in budget.standing(&ledger, chrono::Utc::now()).new_traces_wait {
                println!("paused: new traces wait: {reason}");
            }
        }
        Err(e) => println!("warning: {}", crate::error::error_chain(&e)),
    }
    if services.sandbox.is_some() {
        sweep_orphans(services, store).await;
    }
    Ok(())
}

/// Containers and worktrees no task mapping names (left by a crash between creating them and
/// recording them, or by a removed mapping): reported, then removed.
async fn sweep_orphans(services: &Services, store: &AutopilotStore) {
    let orphans = crate::steps::sweep_orphans(services, store).await;
    for c in &orphans.containers {
        println!("removed orphan container {c}");
    }
    for w in &orphans.worktrees {
        println!("removed orphan worktree {}", w.display());
    }
    for run in &orphans.networks {
        println!("removed the network and relay of run {run}, whose container is gone");
    }
    if !orphans.grants.is_empty() {
        println!(
            "removed the proxy grants of {} run(s) no task names",
            orphans.grants.len()
        );
    }
    for e in &orphans.errors {
        println!("warning: orphan cleanup: {e}");
    }
}
