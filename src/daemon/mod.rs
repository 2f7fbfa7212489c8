//! `rover autopilot start`: the daemon. One per project (the daemon lock), it checks what it
//! needs before taking work (a GitHub token unless `--local`, the agent CLI), recovers what a
//! crash left, then polls the event sources and runs the orchestrator until SIGINT/SIGTERM
//! (graceful; a second signal exits at once). `--once` is one poll and one drain, for cron.
//! SIGUSR1 (sent by `rover autopilot submit`) wakes it to pick up new local requests at once.
//! `--webhook ADDR` also serves GitHub webhook deliveries. The event sources themselves (poll,
//! webhook, reconcile) are `intake`'s; the daemon runs them as supervised components.
//!
//! `run` is the table of what runs. The checks are `preflight`, what a crash left is
//! `recovery`, the stop is `shutdown`; each component adds itself to the one builder
//! (`topology`) from its own file: the poller (`poller`), the webhook server (`webhook`), the
//! drain (`drain`), the stop-reaction watch (`reactions`), reclaim (`reclaim`), the wake on
//! SIGUSR1 and the signal handler (`signals`), the console (`console`), the OpenTelemetry
//! exporter (`export`), rover's sandbox proxy (`proxy`), and `--once` (`once`).
//!
//! Outside a checkout, `start` serves every repository of a daemon file (`fleet`): the same
//! table for each, side by side in one process, a failing one retried while the others go on.

mod console;
mod drain;
mod export;
mod fleet;
mod fleet_budget;
mod fleet_webhook;
mod github;
mod installed;
mod once;
mod poller;
mod preflight;
mod process;
mod proxy;
mod reactions;
mod reclaim;
mod recovery;
mod shutdown;
mod signals;
mod supervise;
mod topology;
mod webhook;

use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use crate::config::RoverConfig;
use crate::host_env::HostEnv;
use crate::orchestrator::SlotBoard;
use crate::project::{Project, ProjectError};
use crate::store::{AutopilotStore, DaemonLock, StoreError};
pub use fleet::{start_fleet, status_path, FleetStatus, ListingStatus, RepoState, RepoStatus};
use topology::Topology;

/// How `start` runs.
#[derive(Debug, Clone, Copy)]
pub struct StartOptions {
    pub once: bool,
    /// Only local requests (`rover autopilot submit`); no GitHub token needed.
    pub local: bool,
    /// Also serve GitHub webhook deliveries on this address (`POST /github`).
    pub webhook: Option<SocketAddr>,
    /// `--backlog N`: the first poll processes the N most recent events of the feed.
    pub backlog: Option<usize>,
}

/// Why the daemon did not start, or stopped on an error (the command line says it and exits 1).
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error(transparent)]
    Project(#[from] ProjectError),
    #[error(transparent)]
    Store(#[from] StoreError),
    /// `rover.json` cannot be read or is not valid.
    #[error(transparent)]
    Config(#[from] crate::config::ConfigError),
    /// GitHub refused the credentials, or did not answer.
    #[error(transparent)]
    GitHub(#[from] crate::github::GitHubError),
    /// The agent CLI does not answer `--version`, or has no credentials.
    #[error(transparent)]
    Agent(#[from] crate::agents::AgentError),
    /// The sandbox backend cannot be used as configured.
    #[error(transparent)]
    Sandbox(#[from] crate::sandbox::SandboxError),
    /// A setting that is missing or cannot be used, with what to set.
    #[error("{0}")]
    Setting(String),
    /// Something rover needs cannot be had now (an address taken); nothing was changed.
    #[error("{0}")]
    Unavailable(String),
    /// One repository of a daemon file could not be served (with `--once`: the run's failure).
    #[error("{repo} is not served: {source}")]
    Repository {
        repo: String,
        #[source]
        source: Box<StartError>,
    },
    /// The daemon could not start or stopped on a failure of its own (a runtime, the log, a
    /// component that panicked); what was running is recovered at the next start.
    #[error("{0}")]
    Internal(String),
}

impl crate::error::Kinded for StartError {
    fn kind(&self) -> crate::error::ErrorKind {
        use crate::error::ErrorKind;
        match self {
            StartError::Project(e) => e.kind(),
            StartError::Store(e) => e.kind(),
            StartError::Config(_) | StartError::Setting(_) => ErrorKind::Config,
            StartError::GitHub(e) => e.kind(),
            StartError::Agent(e) => e.kind(),
            StartError::Sandbox(e) => e.kind(),
            StartError::Unavailable(_) => ErrorKind::Unavailable,
            StartError::Internal(_) => ErrorKind::Internal,
            StartError::Repository { source, .. } => source.kind(),
        }
    }
}

/// What a repository's table runs with from the daemon process: its stop, its wake (SIGUSR1),
/// the agent slots every repository shares, and the one webhook endpoint's routes (a daemon
/// file's; `None`: a repository serves its own `--webhook`).
struct Shared {
    shutdown: CancellationToken,
    wake: Arc<tokio::sync::Notify>,
    slots: Arc<SlotBoard>,
    routes: Option<crate::intake::webhook_routes::Routes>,
    /// Served with other repositories from a daemon file.
    one_of_many: bool,
    /// The dir of the proxy server the repositories of a daemon file share (none: the store's
    /// own server).
    proxy_server: Option<std::path::PathBuf>,
}

/// The exit code of a `--once` run that could not reach GitHub: sysexits' `EX_TEMPFAIL`, the
/// code of every "try again later" (`ErrorKind::Unavailable`).
pub const EX_TEMPFAIL: u8 = 75;

/// Run the daemon for `project` (resolved by the command line, `cli::start`) until it is
/// stopped, or once with `--once`.
///
/// `host` is rover's environment, read once by the command line: everything below decides by
/// it, never by the process's variables.
pub fn start(
    project: Project,
    options: StartOptions,
    host: HostEnv,
) -> Result<ExitCode, StartError> {
    let config = RoverConfig::load(&project.root)?;
    let data_dir = crate::project::data_dir(&host)?;
    let store = AutopilotStore::open(&data_dir, &project.id)?;
    // Signals before the lock: once the lock names this pid, a SIGTERM is a graceful stop.
    let process = process::Process::start()?;
    let lock = DaemonLock::try_acquire(&store.daemon_lock_path())?;
    let log = crate::logging::init(&store.log_path(), &host).map_err(|e| {
        StartError::Internal(format!(
            "cannot open the log {}: {e}",
            store.log_path().display()
        ))
    })?;
    let slots = config
        .autopilot
        .daemon
        .slots("autopilot.daemon")
        .map_err(StartError::Setting)?;
    let code = process.runtime.block_on(run(
        project,
        config,
        store.clone(),
        options,
        host,
        Shared {
            shutdown: process.shutdown.clone(),
            wake: process.wake.clone(),
            slots: SlotBoard::new(slots),
            routes: None,
            one_of_many: false,
            proxy_server: None,
        },
    ));
    let code = process.stop(code);
    // `state.json` whole for whoever reads it alone while the daemon is stopped.
    if let Err(e) = store.compact_state() {
        tracing::warn!(
            error = &e as &dyn std::error::Error,
            "cannot fold the queue journal into state.json"
        );
    }
    drop(log);
    drop(lock);
    code
}

/// The daemon as a table of what runs, in the order it starts: the checks, the exporter, the
/// orchestrator and its console, the recovery, then the supervised components (reclaim, the
/// wake on SIGUSR1, the webhook server, the stop-reaction watch, the poller, the drain) until
/// the shutdown, or each once with `--once`; then the shutdown, in order. A repository of a
/// daemon file served with one webhook endpoint adds itself to its `routes` instead of binding
/// a server.
async fn run(
    project: Project,
    mut config: RoverConfig,
    store: AutopilotStore,
    options: StartOptions,
    host: HostEnv,
    shared: Shared,
) -> Result<ExitCode, StartError> {
    let Shared {
        shutdown,
        wake,
        slots,
        routes,
        one_of_many,
        proxy_server,
    } = shared;
    let ready = preflight::check(&project, &mut config, &store, options, host).await?;
    // Before any run is started or taken over: which proxy server its runs go through.
    proxy::settle_proxy_dir(&ready.services, &store, proxy_server.as_deref()).await;
    let telemetry = export::start(&config, &store, &ready.services, one_of_many).await?;
    let bidder = project
        .repo
        .as_ref()
        .map_or_else(|| project.id.clone(), ToString::to_string);
    let orchestrator =
        drain::orchestrator(&store, &ready.services, &config).with_slots(slots, &bidder);
    let console = console::spawn(&orchestrator, &store);
    console::started(&project, &store, options);
    recovery::recover(&store, &config, &orchestrator, &ready.services).await?;

    let mut daemon = Topology::new(
        project,
        config,
        store,
        options,
        shutdown,
        ready,
        orchestrator,
    );
    daemon.routes = routes;
    daemon.reclaim().await;
    daemon.wake_loop(wake);
    daemon.webhook_server().await?;
    let stop_watch = daemon.stop_watch();
    let poll = daemon.poller();
    let ended = if options.once {
        daemon.once(poll, stop_watch).await
    } else {
        daemon.until_stopped(poll, stop_watch).await
    };
    shutdown::wind_down(daemon, ended, console, telemetry).await
}
