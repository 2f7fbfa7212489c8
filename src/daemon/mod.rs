//! `rover autopilot start`: the daemon. One per project (the daemon lock), it checks what it
//! needs before taking work (a GitHub token unless `--local`, the agent CLI), recovers what a
//! crash left, then polls the event sources and runs the orchestrator until SIGINT/SIGTERM
//! (graceful; a second signal exits at once). `--once` is one poll and one drain, for cron.
//! SIGUSR1 (sent by `rover autopilot submit`) wakes it to pick up new local requests at once.
//! `--webhook ADDR` also serves GitHub webhook deliveries. The event sources themselves (poll,
//! webhook, reconcile) are `intake`'s; the daemon runs them as supervised components.

mod console;
mod export;
mod github;
mod proxy;
mod reactions;
mod reclaim;
mod supervise;

use std::net::SocketAddr;
use std::panic::AssertUnwindSafe;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use futures_util::FutureExt as _;
use tokio_util::sync::CancellationToken;
use tracing::Instrument as _;

use crate::agents::agent_from_settings;
use crate::config::RoverConfig;
use crate::github::{GitHub, Redactor};
use crate::intake::{poll, webhook, Queue};
use crate::orchestrator::StepOrchestrator;
use crate::project::{Project, ProjectError};
use crate::sandbox::{Sandbox, SandboxError};
use crate::secrets::{HeldSecrets, LiveSecrets};
use crate::steps::{build_steps, Services};
use crate::store::{AutopilotStore, DaemonLock, StoreError};
use supervise::{Policy, Supervisor};

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
    /// A start that cannot go on, with what to do about it.
    #[error("{0}")]
    Refused(String),
}

/// The exit code of a `--once` run that could not reach GitHub: sysexits' `EX_TEMPFAIL`.
pub const EX_TEMPFAIL: u8 = 75;

/// Run the daemon for `project` (resolved by the command line, `cli::start`) until it is
/// stopped, or once with `--once`.
pub fn start(project: Project, options: StartOptions) -> Result<ExitCode, StartError> {
    let config = RoverConfig::load(&project.root)
        .map_err(|e| StartError::Refused(crate::error::error_chain(&e)))?;
    let data_dir = crate::project::data_dir()?;
    let store = AutopilotStore::open(&data_dir, &project.id)?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| StartError::Refused(format!("cannot start the async runtime: {e}")))?;
    // Signals before the lock: once the lock names this pid, a SIGTERM is a graceful stop.
    let shutdown = CancellationToken::new();
    let wake = Arc::new(tokio::sync::Notify::new());
    let signal_failure = Arc::new(std::sync::Mutex::new(None));
    let signals = runtime
        .block_on(async { spawn_signals(shutdown.clone(), wake.clone(), signal_failure.clone()) });
    let lock = DaemonLock::try_acquire(&store.daemon_lock_path())?;
    let log = crate::logging::init(&store.log_path()).map_err(|e| {
        StartError::Refused(format!(
            "cannot open the log {}: {e}",
            store.log_path().display()
        ))
    })?;
    let mut code = runtime.block_on(run(project, config, store.clone(), options, shutdown, wake));
    // The signal handler lives as long as the daemon: ended here, its end seen.
    if let Some(signals) = signals {
        signals.abort();
        if let Err(e) = runtime.block_on(signals) {
            if !e.is_cancelled() {
                tracing::error!(error = %e, "the signal handler ended abnormally");
            }
        }
    }
    let failed = signal_failure
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .take();
    if let (Some(why), Ok(_)) = (failed, &code) {
        code = Err(StartError::Refused(format!(
            "rover stopped: {why}; what was running is recovered at the next start"
        )));
    }
    runtime.shutdown_timeout(Duration::from_secs(2));
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

/// rover's own sandbox image when `autopilot.sandbox.image` is left at its default: the config
/// then names it (`rover-sandbox:<hash>`), and the engine builds it on first use, its log in the
/// store's `images/`. A build setting rover cannot use stops `start`.
fn own_image(
    config: &mut RoverConfig,
    store: &AutopilotStore,
) -> Result<Option<Arc<crate::sandbox::OwnImage>>, StartError> {
    let settings = &mut config.autopilot.sandbox;
    if settings.image != crate::sandbox::own_image::DEFAULT_IMAGE {
        return Ok(None);
    }
    let own = crate::sandbox::OwnImage::resolve(
        &settings.build,
        &store.root().join("images"),
        Duration::from_secs(settings.environment.build_timeout_secs),
    )
    .map_err(|e| StartError::Refused(crate::error::error_chain(&e)))?;
    own.reference().clone_into(&mut settings.image);
    tracing::info!(image = %settings.image, "the sandbox image is rover's own, built on first use");
    Ok(Some(Arc::new(own)))
}

/// The secrets rover holds, for redaction and the push scan alike: the GitHub tokens (both
/// variables, taken out of the environment at start), the webhook secret (served or not), the
/// model keys, the value of every variable `envAllow` or `extraEnv` may hand an agent that looks
/// secret, and every variable of rover's environment whose name says it is a secret.
fn held_secrets(
    tokens: Vec<(&str, String)>,
    webhook_secret: Option<String>,
    config: &RoverConfig,
) -> HeldSecrets {
    let mut held = HeldSecrets::new();
    for (name, token) in tokens {
        held.add(name, &token);
    }
    if let Some(secret) = webhook_secret {
        held.add(crate::github::webhook::SECRET_ENV, &secret);
    }
    for (name, value) in crate::telemetry::settings::header_values() {
        held.add(name, &value);
    }
    held.with_env(crate::secrets::MODEL_KEY_ENV)
        .with_env_if_secret(&config.autopilot.sandbox.env_allow)
        .with_env_if_secret(&config.autopilot.agent.extra_env)
        .with_secret_env()
}

async fn run(
    project: Project,
    mut config: RoverConfig,
    store: AutopilotStore,
    options: StartOptions,
    shutdown: CancellationToken,
    wake: Arc<tokio::sync::Notify>,
) -> Result<ExitCode, StartError> {
    // The webhook secret, when webhooks are served: checked first, it is the newest requirement.
    let webhook_secret = match options.webhook {
        Some(_) => Some(crate::github::webhook::secret_from_env().ok_or_else(|| {
            StartError::Refused(format!(
                "--webhook needs the webhook's secret: set {} to the secret configured in the repository's webhook settings (docs/webhooks.md)",
                crate::github::webhook::SECRET_ENV
            ))
        })?),
        None => None,
    };
    // GitHub: required unless the daemon serves local requests only. The secrets rover holds
    // grow while it runs (a GitHub App's tokens), so the set is made first.
    let secrets = LiveSecrets::default();
    let mut normalize = None;
    let mut auth = None;
    let github: Option<Arc<dyn GitHub>> = if options.local {
        None
    } else {
        let connected = github::connect(&project, &mut config, &secrets).await?;
        normalize = Some(connected.client.normalize_options().clone());
        auth = Some(connected.auth);
        Some(Arc::new(connected.client))
    };

    // The agent CLI must answer before rover takes any work.
    let agent = agent_from_settings(&config.autopilot.agent);
    let version = agent
        .check()
        .await
        .map_err(|e| StartError::Refused(crate::error::error_chain(&e)))?;
    tracing::info!(agent = %version, "agent ready");

    // rover's own sandbox image when none is named: its name now (a hash of what goes into
    // it), built on first use.
    let own_image = own_image(&mut config, &store)?;
    // Docker is needed by workflows only: without it rover still answers, and workflows fail
    // with a clear reason.
    let sandbox: Option<Arc<dyn Sandbox>> =
        match crate::sandbox::connect(&config.autopilot.sandbox, own_image).await {
            Ok(s) => Some(s),
            Err(e @ (SandboxError::BackendUnavailable { .. } | SandboxError::Swarm { .. })) => {
                return Err(StartError::Refused(crate::error::error_chain(&e)));
            }
            Err(e) => {
                println!(
                    "warning: {}; workflows will fail until Docker answers",
                    crate::error::error_chain(&e)
                );
                tracing::warn!(error = &e as &dyn std::error::Error, "no Docker engine");
                None
            }
        };

    // A repository that declares its environment needs the dev container CLI: now, not at the
    // first trace.
    if let Some((source, version)) =
        crate::environment::preflight::check(&project.root, &config.autopilot.sandbox)
            .await
            .map_err(StartError::Refused)?
    {
        tracing::info!(?source, devcontainer = %version, "the repository declares its environment; the dev container CLI answers");
    }
    proxy::warn_without_proxy_key(&config);
    if config.autopilot.sandbox.hooks == crate::git::HookMode::Host {
        let text = "autopilot.sandbox.hooks is \"host\": the repository's own git hooks run on this machine with the agent's worktree as their working directory, so a hook that runs a file from the worktree (./scripts/lint, make, npm, node_modules/.bin, a hook manager) runs code the agent wrote; remove the setting to run every hook in a sandbox";
        println!("warning: {text}");
        tracing::warn!(hooks = "host", "{text}");
    }
    let held = held_secrets(
        crate::github::octo::held_tokens(),
        crate::github::webhook::secret_from_env(),
        &config,
    );
    for secret in held.iter() {
        secrets.add(secret.name(), secret.value());
    }
    let held = secrets.snapshot();
    let names: Vec<&str> = held.iter().map(crate::secrets::HeldSecret::name).collect();
    tracing::info!(
        secrets = ?names,
        "secret values held: redacted from messages, refused in pushes"
    );
    let services = Arc::new(Services {
        repo_root: project.root.clone(),
        repo: project.repo.clone(),
        project_id: project.id.clone(),
        agent,
        // Steps read GitHub through the recording client (kept for `rover autopilot replay`).
        github: github.clone().map(|g| {
            crate::github::recorded::RecordingGitHub::wrap(g, Redactor::from_live(secrets.clone()))
        }),
        sandbox,
        redactor: Redactor::from_live(secrets.clone()),
        github_token: auth,
        git_env: Vec::new(),
        store_root: Some(store.root().to_owned()),
        config: config.clone(),
    });
    let telemetry = export::start(&config, &store, &services).await?;
    let orchestrator = StepOrchestrator::new(
        store.clone(),
        build_steps(&services),
        config.autopilot.pipeline.orchestrator(),
    )
    .with_pipeline(crate::steps::pipeline::pipeline())
    .with_budget(crate::budget::Budget::new(config.autopilot.budget.clone()));
    // The console (a view: it holds no work) restarts after a panic, saying so.
    let console = tokio::spawn(console::supervised(
        orchestrator.subscribe(),
        orchestrator.progress_feed(),
        store.clone(),
    ));
    println!(
        "rover autopilot {} for {} (project {}, store {})",
        if options.once {
            "running once"
        } else {
            "started"
        },
        project
            .repo
            .as_ref()
            .map_or_else(|| project.root.display().to_string(), ToString::to_string),
        project.id,
        store.root().display()
    );
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
            .map_err(|e| StartError::Refused(format!("compaction panicked: {e}")))??;
    }
    let recovered = orchestrator.recover().await?;
    if !recovered.is_empty() {
        println!(
            "recovered {} step run(s) left by the last stop",
            recovered.len()
        );
    }
    // Say at once what holds new work (an open circuit breaker, a spent budget, a cap).
    match crate::budget::Ledger::load(&store) {
        Ok(ledger) => {
            let budget = crate::budget::Budget::new(config.autopilot.budget.clone());
            for reason in budget.standing(&ledger, chrono::Utc::now()).new_traces_wait {
                println!("paused: new traces wait: {reason}");
            }
        }
        Err(e) => println!("warning: {}", crate::error::error_chain(&e)),
    }
    // Containers and worktrees no task mapping names (left by a crash between creating them
    // and recording them, or by a removed mapping): reported, then removed.
    if services.sandbox.is_some() {
        let orphans = crate::steps::sweep_orphans(&services, &store).await;
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

    // The long-lived tasks, supervised (see `supervise`): a failure or panic is said and the
    // task restarted, or the daemon stopped with it; never silently gone.
    let mut supervisor = Supervisor::new(shutdown.clone());

    // Resources of ended traces, by `pipeline.retainDays`: now, then every hour.
    {
        let retain_days = config.autopilot.pipeline.retain_days;
        let github = services.github.clone();
        if reclaim::reclaim_due(store.clone(), retain_days, github.clone()).await > 0 {
            orchestrator.wake();
        }
        if !options.once {
            let (store, orch, stop) = (store.clone(), orchestrator.clone(), shutdown.clone());
            let docker = services.sandbox.is_some();
            supervisor.spawn("reclaim loop", Policy::Restart, move || {
                let (store, orch, stop, github) =
                    (store.clone(), orch.clone(), stop.clone(), github.clone());
                async move {
                    loop {
                        tokio::select! {
                            () = tokio::time::sleep(Duration::from_secs(3600)) => {}
                            () = stop.cancelled() => return Ok(()),
                        }
                        if reclaim::reclaim_due(store.clone(), retain_days, github.clone()).await
                            > 0
                        {
                            orch.wake();
                        }
                        if docker {
                            reclaim::sweep_leftovers().await;
                        }
                    }
                }
            });
        }
    }

    // SIGUSR1 (a new local request) wakes the drain loop.
    {
        let (orch, wake, stop) = (orchestrator.clone(), wake.clone(), shutdown.clone());
        supervisor.spawn("wake loop", Policy::Restart, move || {
            let (orch, wake, stop) = (orch.clone(), wake.clone(), stop.clone());
            async move {
                loop {
                    tokio::select! {
                        () = wake.notified() => orch.wake(),
                        () = stop.cancelled() => return Ok(()),
                    }
                }
            }
        });
    }

    // Webhooks: bound now, so a taken address stops the start; served until the shutdown, which
    // stops accepting and lets requests in flight finish. A server that fails stops the daemon
    // (a daemon that silently stopped hearing webhooks would miss events until the next poll).
    if let (Some(addr), Some(secret)) = (options.webhook, webhook_secret) {
        let state = webhook::WebhookState {
            store: store.clone(),
            project_id: project.id.clone(),
            repo: project.repo.as_ref().map(ToString::to_string),
            normalize: normalize.clone().unwrap_or_default(),
            secret: secret.into_bytes(),
            queue: Arc::new(orchestrator.clone()),
        };
        let server = webhook::WebhookServer::bind(addr, state)
            .await
            .map_err(|e| {
                StartError::Refused(format!("cannot listen for webhooks on {addr}: {e}"))
            })?;
        let bound = server
            .local_addr()
            .map_err(|e| StartError::Refused(format!("cannot listen for webhooks: {e}")))?;
        println!("webhook listening on {bound}");
        tracing::info!(addr = %bound, "webhook listening");
        let server = Arc::new(std::sync::Mutex::new(Some(server)));
        let stop = shutdown.clone();
        supervisor.spawn("webhook server", Policy::Stop, move || {
            let (server, stop) = (server.lock().ok().and_then(|mut s| s.take()), stop.clone());
            async move {
                let server = server.ok_or("its listener is gone; it cannot be served again")?;
                server.serve(stop).await.map_err(|e| e.to_string())
            }
        });
    }

    // The stop reaction on the posts of running traces (see `reactions`).
    let stop_watch = match (&github, &config.autopilot.github.reactions.stop) {
        (Some(gh), Some(stop)) => {
            let (gh, stop, store, orch) = (
                gh.clone(),
                stop.clone(),
                store.clone(),
                orchestrator.clone(),
            );
            let settings = config.autopilot.github.clone();
            Some(move || reactions::StopWatch {
                store: store.clone(),
                github: gh.clone(),
                trust: crate::github::TrustPolicy::new(&settings.trust),
                stop: stop.clone(),
                every: Duration::from_secs(settings.reactions.poll_secs.max(1)),
                bot_login: settings.bot_login.clone(),
                orchestrator: orch.clone(),
            })
        }
        _ => None,
    };
    let poll = github.map(|gh| {
        let queue: Arc<dyn Queue> = Arc::new(orchestrator.clone());
        let (store, token) = (store.clone(), shutdown.clone());
        let project_id = project.id.clone();
        let settings = config.autopilot.github.poll.clone();
        let (once, backlog) = (options.once, options.backlog);
        let normalize = normalize.clone().unwrap_or_default();
        move || {
            poll::poll_loop(
                store.clone(),
                project_id.clone(),
                gh.clone(),
                settings.clone(),
                normalize.clone(),
                backlog,
                queue.clone(),
                token.clone(),
                once,
            )
        }
    });

    let (mut unavailable, mut once_failure) = (None, None);
    let result = if options.once {
        if let Some(poll) = poll {
            match tokio::spawn(poll()).await {
                Ok(end) => {
                    unavailable = end.unavailable;
                    once_failure = end.failed.map(|e| format!("the poller failed: {e}"));
                }
                Err(e) => {
                    tracing::error!(error = %e, "the poller stopped");
                    unavailable = Some(format!("the poller stopped: {e}"));
                }
            }
        }
        if let Some(watch) = stop_watch {
            if let Err(e) = tokio::spawn(watch().run(shutdown.clone(), true)).await {
                tracing::error!(error = %e, "the stop-reaction watch stopped");
            }
        }
        let r = orchestrator.run_until_idle(shutdown.clone()).await;
        // The tasks that hold the orchestrator (the wake loop) end with the token, so the
        // console sees its channel close at once instead of waiting out its timeout.
        shutdown.cancel();
        r.map_err(StartError::from)
    } else {
        if let Some(poll) = poll {
            let stop = shutdown.clone();
            supervisor.spawn("poller", Policy::Restart, move || {
                let (run, stop) = (poll(), stop.clone());
                async move {
                    let end = run.await;
                    match end.failed {
                        Some(e) if !stop.is_cancelled() => Err(e),
                        _ => Ok(()),
                    }
                }
            });
        }
        if let Some(watch) = stop_watch {
            let stop = shutdown.clone();
            supervisor.spawn("stop-reaction watch", Policy::Restart, move || {
                let (watch, stop) = (watch(), stop.clone());
                async move {
                    watch.run(stop, false).await;
                    Ok(())
                }
            });
        }
        let (orch, stop) = (orchestrator.clone(), shutdown.clone());
        supervisor.spawn("drain", Policy::Stop, move || {
            let (orch, stop) = (orch.clone(), stop.clone());
            async move {
                // Ended by the shutdown: the others end with it. An error stops the daemon
                // through the supervisor, which says why.
                let ran = orch.run(stop.clone()).await;
                if ran.is_ok() {
                    stop.cancel();
                }
                ran.map_err(|e| crate::error::error_chain(&e))
            }
        });
        shutdown.cancelled().await;
        Ok(())
    };
    let stopped_by = supervisor.join().await.or(once_failure);
    let internal_errors = orchestrator.internal_errors();
    drop(orchestrator);
    proxy::release_proxy(&services, &store).await;
    if let Some(t) = telemetry {
        t.finish().await;
    }
    match tokio::time::timeout(Duration::from_secs(1), console).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => tracing::error!(error = %e, "the console ended abnormally"),
        Err(_) => tracing::warn!("the console did not end within 1 s of the stop"),
    }
    result?;
    if let Some(why) = stopped_by {
        return Err(StartError::Refused(format!(
            "rover stopped: {why}; what was running is recovered at the next start"
        )));
    }
    println!("rover autopilot stopped");
    // For cron: a step that hit an internal error (an error or panic inside it) makes the run
    // fail, so the user hears about it; the trace says what happened.
    if options.once && internal_errors > 0 {
        eprintln!("error: {internal_errors} step run(s) hit an internal error; see `rover autopilot traces`");
        return Ok(ExitCode::FAILURE);
    }
    // For cron: GitHub did not answer within the run. Nothing is lost (the cursor is where it
    // was); the next run picks up from there. sysexits' EX_TEMPFAIL, so cron wrappers can tell.
    if let Some(error) = unavailable {
        eprintln!(
            "error: GitHub is unavailable ({error}); nothing was lost, try again later (the next run starts where this one stopped)"
        );
        return Ok(ExitCode::from(EX_TEMPFAIL));
    }
    Ok(ExitCode::SUCCESS)
}

/// SIGINT/SIGTERM: the first stops gracefully, a second exits at once. SIGUSR1: drain now.
/// Runs in the `component` span `signals`; a panic in it stops the daemon (without it, a
/// signal could no longer stop it gracefully), saying why in `failure`.
fn spawn_signals(
    shutdown: CancellationToken,
    wake: Arc<tokio::sync::Notify>,
    failure: Arc<std::sync::Mutex<Option<String>>>,
) -> Option<tokio::task::JoinHandle<()>> {
    use tokio::signal::unix::{signal, SignalKind};
    let (Ok(mut term), Ok(mut int), Ok(mut usr1)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
        signal(SignalKind::user_defined1()),
    ) else {
        tracing::error!("cannot install signal handlers");
        return None;
    };
    let stop = shutdown.clone();
    let fault = supervise::injected_fault("signals", 1);
    let handler = async move {
        if let Some(fault) = fault {
            panic!("{fault}");
        }
        let mut stopping = false;
        loop {
            tokio::select! {
                _ = term.recv() => {}
                _ = int.recv() => {}
                _ = usr1.recv() => { wake.notify_one(); continue; }
            }
            if stopping {
                eprintln!(
                    "second signal: exiting now; cut-off steps are recovered at the next start"
                );
                std::process::exit(130);
            }
            stopping = true;
            println!("stopping: no new work; running steps get their grace period (signal again to exit at once)");
            shutdown.cancel();
        }
    };
    let handler = async move {
        let panicked = AssertUnwindSafe(handler).catch_unwind().await.err();
        if let Some(text) = panicked.map(|p| supervise::panic_text(&p)) {
            let why = format!("the signal handler panicked: {text}");
            tracing::error!(component = "signals", error = %why, "stopping the daemon");
            println!("error: {why}; rover is stopping");
            failure
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .get_or_insert(why);
            stop.cancel();
        }
    };
    Some(tokio::spawn(handler.instrument(tracing::info_span!(
        "component",
        name = "signals"
    ))))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::github::Visibility;

    /// Every secret rover was handed is held, so redaction and the push scan know it: both token
    /// variables, the webhook secret even when no webhook is served, and what `envAllow` lets
    /// into a sandbox when it looks secret (by name or by shape), not what does not.
    #[test]
    fn the_redactor_holds_every_secret_rover_was_handed() {
        let id = uuid::Uuid::new_v4()
            .simple()
            .to_string()
            .to_ascii_uppercase();
        let named = format!("ROVER_TEST_{id}_DEPLOY_KEY");
        let shaped = format!("ROVER_TEST_{id}_SHAPED");
        let plain = format!("ROVER_TEST_{id}_PLAIN");
        std::env::set_var(&named, "deploy-key-value-1234");
        std::env::set_var(&shaped, "xoxb-1234567890-abcdefghij");
        std::env::set_var(&plain, "not-a-secret-value");
        let mut config = RoverConfig::default();
        config.autopilot.sandbox.env_allow = vec![named.clone(), shaped.clone(), plain.clone()];
        let held = held_secrets(
            vec![
                ("GITHUB_TOKEN", "first-token-value-0001".into()),
                ("GH_TOKEN", "second-token-value-0002".into()),
            ],
            Some("webhook-secret-value-0003".into()),
            &config,
        );
        for var in [&named, &shaped, &plain] {
            std::env::remove_var(var);
        }
        let names: Vec<&str> = held.iter().map(crate::secrets::HeldSecret::name).collect();
        for name in [
            "GITHUB_TOKEN",
            "GH_TOKEN",
            "ROVER_WEBHOOK_SECRET",
            named.as_str(),
            shaped.as_str(),
        ] {
            assert!(names.contains(&name), "{name} not held: {names:?}");
        }
        assert!(!names.contains(&plain.as_str()), "{names:?}");
        let redactor = Redactor::from_held(held);
        let text = "t first-token-value-0001 second-token-value-0002 w webhook-secret-value-0003 k deploy-key-value-1234";
        for visibility in [Visibility::Public, Visibility::Private] {
            let out = redactor.redact(text, visibility);
            assert!(!out.contains("value-000"), "{out}");
            assert!(!out.contains("deploy-key-value"), "{out}");
        }
    }
}
