//! Reclaiming the resources of ended traces: past `pipeline.retainDays`, and kept for a pull
//! request GitHub says is closed; at start, then hourly as the `reclaim loop` component.

use std::sync::Arc;
use std::time::Duration;

use crate::store::AutopilotStore;

use super::supervise::Policy;
use super::topology::Topology;

/// The pull requests traces are kept for that GitHub says are closed (one request each; one that
/// cannot be read is kept and logged).
async fn closed_pull_requests(
    store: &AutopilotStore,
    retain_days: u64,
    github: &dyn crate::github::GitHub,
) -> Vec<u64> {
    let store = store.clone();
    let plan = tokio::task::spawn_blocking(move || {
        crate::steps::gc::plan(
            &store,
            crate::steps::gc::retention(retain_days),
            chrono::Utc::now(),
        )
    })
    .await;
    let plan = match plan {
        Ok(Ok(plan)) => plan,
        Ok(Err(e)) => {
            tracing::warn!(
                error = &e as &dyn std::error::Error,
                "cannot plan which pull requests to look at for reclaiming"
            );
            return Vec::new();
        }
        // A panic in the planning: said, not swallowed (the reclaim loop goes on).
        Err(e) => {
            tracing::error!(error = %e, "planning the reclaiming of ended traces panicked");
            println!("warning: planning the reclaiming of ended traces panicked: {e}");
            return Vec::new();
        }
    };
    let mut closed = Vec::new();
    for number in plan.open_prs.iter().filter_map(|r| r.pr_number) {
        match github.get_pull_request(number).await {
            Ok(pr) if pr.state == crate::github::IssueState::Closed => closed.push(number),
            Ok(_) => {}
            Err(e) => tracing::warn!(
                pr = number,
                error = %crate::error::error_chain(&e),
                "cannot read the state of a pull request a trace is kept for"
            ),
        }
    }
    closed
}

/// Queue the cleanup of every ended trace past its retention, and of every trace kept for a pull
/// request GitHub says is closed; returns how many were queued.
async fn reclaim_due(
    store: AutopilotStore,
    retain_days: u64,
    github: Option<Arc<dyn crate::github::GitHub>>,
) -> usize {
    let closed = match github {
        Some(github) => closed_pull_requests(&store, retain_days, github.as_ref()).await,
        None => Vec::new(),
    };
    // Planned again after the requests (not reusing the plan they were made from): a trace may
    // have taken new work while GitHub answered, and a live trace is never reclaimed.
    let done = tokio::task::spawn_blocking(move || {
        crate::steps::gc::run_releasing(&store, retain_days, "rover (pipeline.retainDays)", &closed)
    })
    .await;
    match done {
        Ok(Ok((plan, queued))) => {
            for r in &plan.due {
                println!(
                    "reclaiming trace {} ({} task(s), ended {}): {}",
                    crate::trace::short(r.trace_id),
                    r.tasks.len(),
                    r.ended_at.format("%Y-%m-%d"),
                    r.label
                );
            }
            if !queued.is_empty() {
                tracing::info!(
                    traces = queued.len(),
                    retain_days,
                    "reclaiming ended traces"
                );
            }
            queued.len()
        }
        Ok(Err(e)) => {
            tracing::warn!(
                error = &e as &dyn std::error::Error,
                "cannot plan the reclaiming of ended traces"
            );
            println!("warning: cannot plan the reclaiming of ended traces: {e}");
            0
        }
        Err(e) => {
            tracing::error!(error = %e, "reclaiming ended traces panicked");
            println!("warning: reclaiming ended traces panicked: {e}");
            0
        }
    }
}

/// rover's containers, networks and volumes whose store is gone or whose daemon is dead with no
/// live run, of any store on this machine (see [`crate::sandbox::leftovers`]): removed, and
/// said. Hourly only, not at start: a sweep holds a dead store's daemon lock for a moment, and a
/// daemon restarting on it then waits.
async fn sweep_leftovers(host: &crate::host_env::HostEnv) {
    let sweep = crate::sandbox::leftovers::sweep(false, host).await;
    for l in &sweep.removed {
        println!("removed rover's {l}");
    }
    for e in &sweep.errors {
        tracing::warn!(error = %e, "sweeping rover's leftover containers");
    }
}

impl Topology {
    /// Resources of ended traces, by `pipeline.retainDays`: now, then every hour (not with
    /// `--once`), with the leftovers of any store when Docker answers.
    pub(super) async fn reclaim(&mut self) {
        let retain_days = self.config.autopilot.pipeline.retain_days;
        let github = self.services.github.clone();
        if reclaim_due(self.store.clone(), retain_days, github.clone()).await > 0 {
            self.orchestrator.wake();
        }
        if self.options.once {
            return;
        }
        let (store, orch, stop) = (
            self.store.clone(),
            self.orchestrator.clone(),
            self.shutdown.clone(),
        );
        let docker = self.services.sandbox.is_some();
        let host = self.services.host.clone();
        self.supervisor
            .spawn("reclaim loop", Policy::Restart, move || {
                let (store, orch, stop, github, host) = (
                    store.clone(),
                    orch.clone(),
                    stop.clone(),
                    github.clone(),
                    host.clone(),
                );
                async move {
                    loop {
                        tokio::select! {
                            () = tokio::time::sleep(Duration::from_secs(3600)) => {}
                            () = stop.cancelled() => return Ok(()),
                        }
                        if reclaim_due(store.clone(), retain_days, github.clone()).await > 0 {
                            orch.wake();
                        }
                        if docker {
                            sweep_leftovers(&host).await;
                        }
                    }
                }
            });
    }
}
