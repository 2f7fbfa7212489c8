//! `rover autopilot start` outside a checkout: one daemon for every repository the daemon file
//! lists (`config::DaemonFile`). Each repository stays its own: its checkout, its `rover.json`,
//! its store (the layout of a one-repository daemon, so `rover autopilot trace` in its checkout
//! reads it as before) and its lock, run by the same table of components as a one-repository
//! daemon (`super::run`), side by side in one process. A repository with nothing at its
//! checkout's path is cloned there first. A repository whose set-up or run fails (a clone that
//! fails, a bad `rover.json`, no access, another daemon holding it) is recorded in
//! `<data dir>/daemon/repositories.json` with the reason and tried again with a growing delay;
//! the others go on. One signal stops them all; SIGUSR1 wakes them all. With `--webhook ADDR`,
//! one endpoint takes the deliveries of every repository, routed to each served one
//! (`fleet_webhook`). With `"repositories": "installed"` the set follows a GitHub App's
//! installations (`super::installed`). The agent slots are shared by all (`orchestrator::slots`).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;

use super::{StartError, StartOptions};
use crate::config::{DaemonFile, RoverConfig, ServedRepo};
use crate::error::Kinded;
use crate::host_env::HostEnv;
use crate::intake::webhook_routes::Routes;
use crate::orchestrator::SlotBoard;
use crate::project::{Project, ProjectError};
use crate::store::{AutopilotStore, DaemonLock};

/// The first delay before a failed repository is tried again; it doubles up to [`MAX_RETRY`].
const FIRST_RETRY: Duration = Duration::from_secs(5);
/// The longest delay between two tries of a failed repository.
const MAX_RETRY: Duration = Duration::from_secs(600);

/// Where the daemon records how each repository it serves stands.
pub fn status_path(data_dir: &Path) -> PathBuf {
    data_dir.join("daemon").join("repositories.json")
}

/// How each served repository stands, as `status` reads it.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct FleetStatus {
    /// The daemon file it serves.
    pub file: PathBuf,
    pub pid: u32,
    pub repositories: Vec<RepoStatus>,
    /// With `"repositories": "installed"`: the latest listing of the app's installations.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_listing: Option<ListingStatus>,
    /// Why new agent runs are held in every repository (the daemon's budget or circuit
    /// breaker, `super::fleet_budget`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub paused: Option<String>,
}

/// How the latest listing of the app's installations went.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ListingStatus {
    pub at: DateTime<Utc>,
    /// Why it failed (the repositories served stay as they were), with what to do.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// How many repositories it found to serve.
    #[serde(default)]
    pub repositories: usize,
}

/// One repository's standing.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct RepoStatus {
    /// `owner/name`.
    pub repo: String,
    /// Its store's project id, once known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub project_id: Option<String>,
    pub state: RepoState,
    /// Why it is not served, with what to do.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// The error kind of that reason (`docs/cli.md`, Exit codes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    /// When it is tried again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_at: Option<DateTime<Utc>>,
    /// How many tries failed in a row.
    #[serde(default)]
    pub failures: u32,
    pub since: DateTime<Utc>,
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub enum RepoState {
    /// Being set up (its checkout, `rover.json`, store).
    Starting,
    /// Served: its poller and drain run.
    Serving,
    /// Its set-up or run failed; tried again at `retryAt`.
    Failing,
    /// Stopped with the daemon (or done, with `--once`).
    Stopped,
    /// No longer one the app is installed on: stopped, its store kept.
    Removed,
    /// One the app is installed on that is not served (archived, disabled): `reason` says.
    Skipped,
}

impl RepoState {
    pub fn as_str(self) -> &'static str {
        match self {
            RepoState::Starting => "starting",
            RepoState::Serving => "serving",
            RepoState::Failing => "failing",
            RepoState::Stopped => "stopped",
            RepoState::Removed => "removed",
            RepoState::Skipped => "skipped",
        }
    }
}

/// The status file, written whole after each change (atomic).
#[derive(Clone)]
pub(super) struct Board {
    path: PathBuf,
    status: Arc<std::sync::Mutex<FleetStatus>>,
}

impl Board {
    fn new(data_dir: &Path, file: &DaemonFile) -> Board {
        let now = Utc::now();
        // The stores already known (a project id does not change): the daemon's budget counts
        // them from the start, before each repository is set up again.
        let known: HashMap<String, String> =
            crate::store::fsio::read_json::<FleetStatus>(&status_path(data_dir))
                .ok()
                .flatten()
                .filter(|s| s.file == file.path)
                .map(|s| {
                    s.repositories
                        .into_iter()
                        .filter_map(|r| Some((r.repo, r.project_id?)))
                        .collect()
                })
                .unwrap_or_default();
        let status = FleetStatus {
            file: file.path.clone(),
            pid: std::process::id(),
            repositories: file
                .repositories
                .iter()
                .map(|r| RepoStatus {
                    repo: r.full_name(),
                    project_id: known.get(&r.full_name()).cloned(),
                    state: RepoState::Starting,
                    reason: None,
                    kind: None,
                    retry_at: None,
                    failures: 0,
                    since: now,
                })
                .collect(),
            last_listing: None,
            paused: None,
        };
        let board = Board {
            path: status_path(data_dir),
            status: Arc::new(std::sync::Mutex::new(status)),
        };
        board.write();
        board
    }

    /// The entry of `repo`, added (or made new again) as starting.
    pub(super) fn entry(&self, repo: &str) -> usize {
        let index = {
            let mut status = self.lock();
            let fresh = RepoStatus {
                repo: repo.to_owned(),
                project_id: None,
                state: RepoState::Starting,
                reason: None,
                kind: None,
                retry_at: None,
                failures: 0,
                since: Utc::now(),
            };
            if let Some(at) = status.repositories.iter().position(|r| r.repo == repo) {
                let project_id = status.repositories[at].project_id.take();
                status.repositories[at] = RepoStatus {
                    project_id,
                    ..fresh
                };
                at
            } else {
                status.repositories.push(fresh);
                status.repositories.len() - 1
            }
        };
        self.write();
        index
    }

    /// Records how a listing of the app's installations went.
    pub(super) fn listed(&self, listing: ListingStatus) {
        self.lock().last_listing = Some(listing);
        self.write();
    }

    /// Why new agent runs are held in every repository (`None`: they are not).
    pub(super) fn paused(&self, why: Option<String>) {
        self.lock().paused = why;
        self.write();
    }

    /// The served repositories whose store is known: (`owner/name`, project id).
    pub(super) fn projects(&self) -> Vec<(String, String)> {
        self.lock()
            .repositories
            .iter()
            .filter_map(|r| Some((r.repo.clone(), r.project_id.clone()?)))
            .collect()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, FleetStatus> {
        self.status
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    pub(super) fn update(&self, index: usize, change: impl FnOnce(&mut RepoStatus)) {
        {
            let mut status = self.lock();
            let entry = &mut status.repositories[index];
            let before = entry.state;
            change(entry);
            if entry.state != before {
                entry.since = Utc::now();
            }
        }
        self.write();
    }

    /// Written under the lock: two tasks changing their entries at once must not write their
    /// copies in the other order (the older one last).
    fn write(&self) {
        let status = self.lock();
        let written = self
            .path
            .parent()
            .map_or(Ok(()), crate::store::fsio::ensure_dir)
            .and_then(|()| crate::store::fsio::write_json_atomic(&self.path, &*status));
        if let Err(e) = written {
            tracing::warn!(error = %e, "cannot record how the served repositories stand");
        }
    }
}

/// Serves every repository of `file` until stopped (or once each, with `--once`).
pub fn start_fleet(
    file: &DaemonFile,
    options: StartOptions,
    host: &HostEnv,
) -> Result<ExitCode, StartError> {
    let secret = super::fleet_webhook::secret(options.webhook, host)?;
    if options.local {
        return Err(StartError::Setting(
            "--local serves one checkout's local requests: run it in that checkout".into(),
        ));
    }
    let data_dir = crate::project::data_dir(host)?;
    let daemon_dir = data_dir.join("daemon");
    crate::store::fsio::ensure_dir(&daemon_dir)?;
    let process = super::process::Process::start()?;
    // One daemon file, one daemon: a second start is refused with the first one's pid.
    let lock = DaemonLock::try_acquire(&daemon_dir.join("daemon.lock"))?;
    let log_path = daemon_dir.join("log.jsonl");
    let log = crate::logging::init(&log_path, host).map_err(|e| {
        StartError::Internal(format!("cannot open the log {}: {e}", log_path.display()))
    })?;
    let what = match &file.installed {
        Some(app) => format!("every repository GitHub App {} is installed on", app.app_id),
        None => format!("{} repositories", file.repositories.len()),
    };
    println!(
        "rover: serving {what} of {} (their standing: rover autopilot status --config {})",
        file.path.display(),
        file.path.display()
    );
    // Lists an app's installations again; the endpoint's installation deliveries notify it.
    let relist = Arc::new(tokio::sync::Notify::new());
    let webhook = match (options.webhook, secret) {
        (Some(addr), Some(secret)) => {
            Some(process.runtime.block_on(super::fleet_webhook::start(
                addr,
                secret,
                &data_dir,
                Some(relist.clone()),
                &process.shutdown,
            ))?)
        }
        _ => None,
    };
    let slots = SlotBoard::new(file.slots.clone());
    let board = Board::new(&data_dir, file);
    // The daemon-wide budget: its stop limits in the wire file before any proxy reads it.
    let mut budget = super::fleet_budget::FleetBudget::new(
        file.budget.clone(),
        data_dir.clone(),
        board.clone(),
        slots.clone(),
    );
    budget.look();
    let budget = Arc::new(std::sync::Mutex::new(budget));
    let watching = process.runtime.spawn(super::fleet_budget::watch(
        budget.clone(),
        process.shutdown.clone(),
    ));
    let wire =
        (!file.budget.wire_stops().is_empty()).then(|| super::fleet_budget::wire_dir(&data_dir));
    let fleet = Fleet {
        wire,
        budget,
        data_dir: data_dir.clone(),
        options,
        host: host.clone(),
        shutdown: process.shutdown.clone(),
        board,
        wakes: Arc::default(),
        relist,
        routes: webhook.as_ref().map(|w| w.routes.clone()),
        slots,
    };
    let ended = process
        .runtime
        .block_on(serve_all(file, &fleet, &process.wake));
    watching.abort();
    // With `--once`, cron sees a repository that failed: the first failure, by its kind.
    let code = ended.into_iter().try_fold(ExitCode::SUCCESS, |code, end| {
        end.map(|c| if c == ExitCode::SUCCESS { code } else { c })
    });
    // Every repository stopped: the proxy server they share, unless a run still needs it.
    process
        .runtime
        .block_on(super::proxy::release_shared_proxy(&data_dir, host));
    let served = webhook.map_or(Ok(()), |w| process.runtime.block_on(w.end()));
    let code = code.and_then(|code| served.map(|()| code));
    let code = process.stop(code);
    drop(log);
    drop(lock);
    code
}

/// How a served repository's task ended.
pub(super) type Ended = Result<ExitCode, StartError>;

/// Each repository in a task of its own; a SIGUSR1 wakes every one (and lists an app's
/// installations again).
async fn serve_all(
    file: &DaemonFile,
    fleet: &Fleet,
    wake: &Arc<tokio::sync::Notify>,
) -> Vec<Ended> {
    let fan_out = {
        let (wake, fleet) = (wake.clone(), fleet.clone());
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    () = wake.notified() => fleet.wake_all(),
                    () = fleet.shutdown.cancelled() => return,
                }
            }
        })
    };
    let codes = if let Some(app) = &file.installed {
        super::installed::serve_installed(app, fleet).await
    } else {
        fleet.expect_at_start(
            file.repositories
                .iter()
                .map(ServedRepo::full_name)
                .collect(),
        );
        let mut tasks = tokio::task::JoinSet::new();
        for repo in &file.repositories {
            fleet.spawn(&mut tasks, repo.clone(), fleet.shutdown.clone());
        }
        join_all(tasks).await
    };
    fan_out.abort();
    codes
}

/// How long, at most, the agent slots wait after a start for every repository to offer its work
/// before giving any out.
const START_GRACE: Duration = Duration::from_secs(15);

impl Fleet {
    /// The agent slots wait (at most [`START_GRACE`]) for `repos` to offer their work once, so
    /// the repositories that come up first do not take every slot; the board is woken when the
    /// grace has passed. Not with `--once`: a pass ends when its drain is idle, and a run held
    /// back for the others would wait for the next pass.
    pub(super) fn expect_at_start(&self, repos: Vec<String>) {
        if self.options.once {
            return;
        }
        self.slots.expect(repos, START_GRACE);
        let (slots, stop) = (self.slots.clone(), self.shutdown.clone());
        tokio::spawn(async move {
            tokio::select! {
                () = tokio::time::sleep(START_GRACE) => slots.wake_all(),
                () = stop.cancelled() => {}
            }
        });
    }
}

/// Waits for every task of `tasks`.
pub(super) async fn join_all(mut tasks: tokio::task::JoinSet<Ended>) -> Vec<Ended> {
    let mut codes = Vec::new();
    while let Some(ended) = tasks.join_next().await {
        codes.push(ended.unwrap_or_else(|e| {
            Err(StartError::Internal(format!(
                "a served repository's task ended abnormally: {e}"
            )))
        }));
    }
    codes
}

/// What every served repository runs with, and the set of them.
#[derive(Clone)]
pub(super) struct Fleet {
    pub data_dir: PathBuf,
    /// The wire dir of the daemon's budget, when it has stop limits: each repository's proxy
    /// is given it.
    wire: Option<PathBuf>,
    /// The daemon-wide budget and breaker, looked at by each repository once set up.
    budget: super::fleet_budget::SharedBudget,
    pub options: StartOptions,
    pub host: HostEnv,
    pub shutdown: CancellationToken,
    pub board: Board,
    /// Each served repository's wake, by name.
    wakes: Arc<Mutex<HashMap<String, Arc<tokio::sync::Notify>>>>,
    /// Lists the app's installations again: notified by SIGUSR1 and (for the webhook endpoint)
    /// by the `installation` and `installation_repositories` deliveries.
    pub relist: Arc<tokio::sync::Notify>,
    /// The daemon's one webhook endpoint, when it serves one.
    routes: Option<Routes>,
    /// The agent slots every repository shares (the daemon file's `"daemon"`).
    slots: Arc<SlotBoard>,
}

impl Fleet {
    /// Serves `repo` in a task of `tasks` until `stop` (the shutdown, or a child of it) is
    /// cancelled.
    pub(super) fn spawn(
        &self,
        tasks: &mut tokio::task::JoinSet<Ended>,
        repo: ServedRepo,
        stop: CancellationToken,
    ) {
        let wake = Arc::new(tokio::sync::Notify::new());
        self.wakes
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .insert(repo.full_name(), wake.clone());
        let served = Served {
            index: self.board.entry(&repo.full_name()),
            host: host_for(&self.host, &repo, self.wire.as_deref()),
            repo,
            data_dir: self.data_dir.clone(),
            // The daemon's one endpoint takes the deliveries: no repository binds its own.
            options: StartOptions {
                webhook: None,
                ..self.options
            },
            routes: self.routes.clone(),
            shutdown: self.shutdown.clone(),
            stop,
            wake,
            board: self.board.clone(),
            slots: self.slots.clone(),
            budget: self.budget.clone(),
        };
        tasks.spawn(served.serve());
    }

    fn wake_all(&self) {
        let wakes = self
            .wakes
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        wakes.values().for_each(|w| w.notify_one());
        self.relist.notify_one();
    }
}

/// rover's environment for `repo`: its own API when the daemon file names one, and the wire
/// dir of the daemon's budget for its proxy.
fn host_for(host: &HostEnv, repo: &ServedRepo, wire: Option<&Path>) -> HostEnv {
    let host = match wire {
        Some(dir) => host.with(crate::proxy::env::DAEMON_DIR, dir),
        None => host.clone(),
    };
    let host = match &repo.api_url {
        Some(url) => host.with(crate::github::API_URL_ENV, url),
        None => host,
    };
    match &repo.app {
        Some(app) => host.with(crate::github::app::APP_KEY_ENV, &app.private_key_file),
        None => host,
    }
}

/// One served repository and what it runs with.
struct Served {
    index: usize,
    repo: ServedRepo,
    data_dir: PathBuf,
    options: StartOptions,
    /// The daemon's one webhook endpoint, when it serves one.
    routes: Option<Routes>,
    host: HostEnv,
    shutdown: CancellationToken,
    /// Stops this repository alone (the shutdown, or a child of it).
    stop: CancellationToken,
    wake: Arc<tokio::sync::Notify>,
    board: Board,
    /// The agent slots every repository shares (the daemon file's `"daemon"`).
    slots: Arc<SlotBoard>,
    budget: super::fleet_budget::SharedBudget,
}

impl Served {
    /// Serves the repository until the daemon stops; a failure is recorded and tried again
    /// after a delay that doubles (with `--once`, it is this run's exit code).
    async fn serve(self) -> Result<ExitCode, StartError> {
        let mut delay = FIRST_RETRY;
        let mut failures = 0u32;
        self.route_failing("starting (not served yet)");
        loop {
            match self.serve_once().await {
                Ok(code) => {
                    self.stopped();
                    return Ok(code);
                }
                Err(e) => {
                    failures += 1;
                    let kind = e.kind();
                    let why = e.to_string();
                    let retry = !self.options.once && !self.stop.is_cancelled();
                    let retry_at = retry.then(|| {
                        Utc::now() + chrono::Duration::from_std(delay).unwrap_or_default()
                    });
                    tracing::error!(repo = %self.repo.full_name(), error = %why, failures, "a served repository failed; the others go on");
                    println!(
                        "rover: {} is not served: {why}{}",
                        self.repo.full_name(),
                        if retry {
                            format!(" (tried again in {} s)", delay.as_secs())
                        } else {
                            String::new()
                        }
                    );
                    self.route_failing(&why);
                    self.slots.not_coming(&self.repo.full_name());
                    self.board.update(self.index, |s| {
                        s.state = RepoState::Failing;
                        s.reason = Some(why);
                        s.kind = Some(kind.as_str().to_owned());
                        s.retry_at = retry_at;
                        s.failures = failures;
                    });
                    if !retry {
                        return Err(StartError::Repository {
                            repo: self.repo.full_name(),
                            source: Box::new(e),
                        });
                    }
                    tokio::select! {
                        () = tokio::time::sleep(delay) => {}
                        () = self.stop.cancelled() => {
                            self.stopped();
                            return Ok(ExitCode::SUCCESS);
                        }
                    }
                    delay = (delay * 2).min(MAX_RETRY);
                }
            }
        }
    }

    /// Stopped with the daemon, or removed alone (no longer installed on).
    fn stopped(&self) {
        if let Some(routes) = &self.routes {
            routes.remove(&self.repo.full_name());
        }
        self.slots.not_coming(&self.repo.full_name());
        let removed = !self.shutdown.is_cancelled() && self.stop.is_cancelled();
        self.board.update(self.index, |s| {
            s.state = if removed {
                RepoState::Removed
            } else {
                RepoState::Stopped
            };
            s.reason = removed.then(|| {
                "no longer one of the repositories the GitHub App is installed on (its store is kept)".to_owned()
            });
            s.kind = None;
            s.retry_at = None;
        });
    }

    /// One try: the checkout, its `rover.json`, its store and lock, then the daemon's table of
    /// components until it stops.
    async fn serve_once(&self) -> Result<ExitCode, StartError> {
        self.clone_if_missing().await?;
        let project = self.project()?;
        let mut config = RoverConfig::load(&project.root)?;
        super::installed::serve_as_app(&self.repo, &mut config);
        let store = AutopilotStore::open(&self.data_dir, &project.id)?;
        let lock_path = store.daemon_lock_path();
        let lock = tokio::task::spawn_blocking(move || DaemonLock::try_acquire(&lock_path))
            .await
            .map_err(|e| StartError::Internal(format!("cannot take the store's lock: {e}")))??;
        let id = project.id.clone();
        self.board.update(self.index, |s| {
            s.project_id = Some(id);
            s.state = RepoState::Serving;
            s.reason = None;
            s.kind = None;
            s.retry_at = None;
        });
        // Its spend and breaker count before its first drain.
        super::fleet_budget::look(&self.budget, Some(project.id.clone())).await;
        let code = super::run(
            project,
            config,
            store.clone(),
            self.options,
            self.host.clone(),
            super::Shared {
                // Its own stop, under the repository's: a `--once` pass that ends, or a
                // component that stops this repository, cancels it and never the others' runs.
                shutdown: self.stop.child_token(),
                wake: self.wake.clone(),
                slots: self.slots.clone(),
                routes: self.routes.clone(),
                one_of_many: true,
                proxy_server: Some(super::proxy::shared_proxy_dir(&self.data_dir)),
            },
        )
        .await;
        if let Err(e) = store.compact_state() {
            tracing::warn!(
                error = &e as &dyn std::error::Error,
                "cannot fold the queue journal into state.json"
            );
        }
        drop(lock);
        code
    }

    /// Its webhook deliveries refused, saying `why`, until it is served (again).
    fn route_failing(&self, why: &str) {
        if let Some(routes) = &self.routes {
            routes.failing(&self.repo.full_name(), why);
        }
    }

    /// A repository with nothing at its checkout's path is cloned there first (its `cloneUrl`,
    /// else its GitHub URL, with rover's token as a fetch has it); a path that exists is never
    /// cloned over.
    async fn clone_if_missing(&self) -> Result<(), StartError> {
        let checkout = self.repo.checkout_in(&self.data_dir);
        if std::fs::symlink_metadata(&checkout).is_ok() {
            return Ok(());
        }
        let api_url = crate::github::octo::api_url_from_env(&self.host);
        let url = self.repo.clone_source(&api_url);
        let shown = crate::git::shown_url(&url);
        let name = self.repo.full_name();
        println!(
            "rover: cloning {name} from {shown} into {}",
            checkout.display()
        );
        let token = super::installed::clone_token(&self.repo, &api_url, &self.host).await?;
        crate::git::clone_checkout(&url, &checkout, token.as_deref())
            .await
            .map_err(|e| {
                let why = match &e {
                    crate::git::GitError::Command(failure) => failure
                        .stderr
                        .lines()
                        .map(str::trim)
                        .filter(|l| !l.is_empty())
                        .collect::<Vec<_>>()
                        .join("; ")
                        .chars()
                        .take(500)
                        .collect(),
                    other => crate::error::error_chain(other),
                };
                StartError::Unavailable(format!(
                    "cannot clone {name} from {shown} into {}: {why} (check \"cloneUrl\" in the daemon file and that rover's token can read the repository, or clone it there yourself)",
                    checkout.display()
                ))
            })
    }

    /// The repository's checkout, as rover's project, named as the daemon file names it.
    fn project(&self) -> Result<Project, StartError> {
        let checkout = self.repo.checkout_in(&self.data_dir);
        if !checkout.is_dir() {
            return Err(StartError::Setting(format!(
                "{} is not a checkout of {}: move it away (rover clones the repository where nothing is), or name its clone with \"checkout\" in the daemon file",
                checkout.display(),
                self.repo.full_name()
            )));
        }
        let mut project = Project::discover(&checkout).map_err(|e| match e {
            ProjectError::NotARepository { dir } => StartError::Setting(format!(
                "{} is not a git checkout: clone {} there, or name its clone with \"checkout\" in the daemon file",
                dir.display(),
                self.repo.full_name()
            )),
            other => StartError::Project(other),
        })?;
        // A folder inside another repository's checkout is not this repository's checkout.
        let canonical = |p: &Path| p.canonicalize().unwrap_or_else(|_| p.to_path_buf());
        if canonical(&project.root) != canonical(&checkout) {
            return Err(StartError::Setting(format!(
                "{} is not a git checkout (it is inside {}): clone {} there, or name its clone with \"checkout\" in the daemon file",
                checkout.display(),
                project.root.display(),
                self.repo.full_name()
            )));
        }
        project.repo = Some(self.repo.slug.clone());
        Ok(project)
    }
}
