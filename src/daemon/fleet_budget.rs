//! The daemon-wide budget and circuit breaker of a daemon serving many repositories
//! (`crate::budget::DaemonBudgetSettings`, the daemon file's `"daemon": {"budget": ...}`).
//!
//! Every [`EVERY`] the daemon sums what each served repository's budget recorded for the day
//! and the month, writes the sums and the `stop` limits into the wire file its proxies share
//! (`<data dir>/daemon/wire/spend.json`, `crate::proxy::DaemonSpend`), and reads back what the
//! proxies saw answered for the runs not recorded yet. Over a `pause` or `stop` limit, or with the daemon-wide breaker open,
//! the shared agent slots hold every repository's new agent runs with the reason (each queued
//! run's `status` says it); a `warn` limit is logged once a period. The `stop` limits are also
//! enforced by each proxy on every model request, so a run crossing one is refused its next
//! request whatever its repository.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use chrono::Utc;
use tokio_util::sync::CancellationToken;

use super::fleet::Board;
use crate::budget::{
    breaker_open, over_limits, recorded_sum, BudgetAction, DaemonBudgetSettings, Ledger,
};
use crate::orchestrator::SlotBoard;
use crate::proxy::{periods, DaemonSpend};
use crate::store::AutopilotStore;

/// How often the daemon-wide spend is summed.
pub const EVERY: Duration = Duration::from_secs(2);

/// The wire dir every proxy of the daemon shares.
pub fn wire_dir(data_dir: &Path) -> PathBuf {
    data_dir.join("daemon").join("wire")
}

/// Where the daemon-wide budget stands.
#[derive(Debug, Default)]
struct Standing {
    /// Why new agent runs are held in every repository.
    paused: Option<String>,
    /// `warn` limits reached: (key and period, what to say).
    warnings: Vec<(String, String)>,
}

/// The watcher's state between two looks.
pub(super) struct FleetBudget {
    settings: DaemonBudgetSettings,
    data_dir: PathBuf,
    board: Board,
    slots: Arc<SlotBoard>,
    stores: HashMap<String, AutopilotStore>,
    warned: HashSet<String>,
    paused: Option<String>,
}

impl FleetBudget {
    pub(super) fn new(
        settings: DaemonBudgetSettings,
        data_dir: PathBuf,
        board: Board,
        slots: Arc<SlotBoard>,
    ) -> FleetBudget {
        FleetBudget {
            settings,
            data_dir,
            board,
            slots,
            stores: HashMap::new(),
            warned: HashSet::new(),
            paused: None,
        }
    }

    /// Looks once (blocking): the wire file is written, the slots paused or let go.
    pub(super) fn look(&mut self) {
        let standing = self.standing();
        for (key, text) in standing.warnings {
            if self.warned.insert(key) {
                tracing::warn!("{text}");
                println!("rover: warning: {text}");
            }
        }
        if standing.paused != self.paused {
            match &standing.paused {
                Some(why) => {
                    tracing::warn!(reason = %why, "new agent runs are paused in every repository");
                    println!("rover: new agent runs are paused in every repository: {why}");
                }
                None => println!("rover: new agent runs may start again in every repository"),
            }
            self.board.paused(standing.paused.clone());
            self.paused.clone_from(&standing.paused);
        }
        self.slots.pause(standing.paused);
    }

    fn standing(&mut self) -> Standing {
        // Before the ledgers are read: a run recorded after it stays live in the wire file.
        let now = Utc::now();
        let mut ledgers = Vec::new();
        let mut tripped = Vec::new();
        for (repo, project_id) in self.board.projects() {
            if !self.stores.contains_key(&project_id) {
                match AutopilotStore::open(&self.data_dir, &project_id) {
                    Ok(store) => {
                        self.stores.insert(project_id.clone(), store);
                    }
                    Err(e) => {
                        tracing::warn!(repo, error = %e, "cannot open a served repository's store for the daemon's budget");
                        continue;
                    }
                }
            }
            match Ledger::load(&self.stores[&project_id]) {
                Ok(ledger) => {
                    if ledger.breaker.tripped.is_some() {
                        tripped.push(repo);
                    }
                    ledgers.push(ledger);
                }
                Err(e) => {
                    tracing::warn!(repo, error = %e, "cannot read a served repository's budget ledger for the daemon's budget");
                }
            }
        }
        let (day, month) = recorded_sum(&ledgers, now);
        let (day_key, month_key) = periods(now);
        let stops = self.settings.wire_stops();
        let wire = wire_dir(&self.data_dir);
        let spend = DaemonSpend::update(&wire, Utc::now(), |spend| {
            spend.stops = stops;
            spend.set_recorded((day_key.clone(), day), (month_key.clone(), month), now);
            spend.clone()
        });
        let (day, month) = match spend {
            Ok(spend) => (spend.spent(&day_key), spend.spent(&month_key)),
            Err(e) => {
                // The recorded sums still hold the limits here (the live runs left out); the
                // proxies refuse what they cannot count.
                tracing::error!(error = %e, "cannot read or write the daemon's wire spend");
                (day, month)
            }
        };
        let mut standing = Standing::default();
        for over in over_limits(&self.settings, day, month) {
            match over.action {
                BudgetAction::Warn => {
                    let period = if over.key.contains(".day.") {
                        &day_key
                    } else {
                        &month_key
                    };
                    standing
                        .warnings
                        .push((format!("{} {period}", over.key), over.reason));
                }
                BudgetAction::Pause | BudgetAction::Stop => {
                    standing.paused.get_or_insert(over.reason);
                }
            }
        }
        if standing.paused.is_none() {
            standing.paused = breaker_open(&self.settings, &tripped);
        }
        standing
    }
}

/// The watcher, shared by the loop and the repositories (each looks once it is set up, before
/// its first drain).
pub(super) type SharedBudget = Arc<std::sync::Mutex<FleetBudget>>;

/// Looks once, off the runtime (with `project_id`, only when that store is not counted yet: a
/// repository set up for the first time).
pub(super) async fn look(budget: &SharedBudget, project_id: Option<String>) {
    let looking = budget.clone();
    let _ = tokio::task::spawn_blocking(move || {
        let mut budget = looking
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if project_id.is_none_or(|id| !budget.stores.contains_key(&id)) {
            budget.look();
        }
    })
    .await;
}

/// Looks every [`EVERY`] until `shutdown`.
pub(super) async fn watch(budget: SharedBudget, shutdown: CancellationToken) {
    loop {
        look(&budget, None).await;
        tokio::select! {
            () = tokio::time::sleep(EVERY) => {}
            () = shutdown.cancelled() => return,
        }
    }
}
