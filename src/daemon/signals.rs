//! Signals: SIGINT/SIGTERM stop the daemon (the first gracefully, a second at once), SIGUSR1
//! (sent by `rover autopilot submit`) wakes the drain through the `wake loop` component.

use std::panic::AssertUnwindSafe;
use std::sync::Arc;

use futures_util::FutureExt as _;
use tokio_util::sync::CancellationToken;
use tracing::Instrument as _;

use super::supervise::{self, Policy};
use super::topology::Topology;

/// SIGINT/SIGTERM: the first stops gracefully, a second exits at once. SIGUSR1: drain now.
/// Runs in the `component` span `signals`; a panic in it stops the daemon (without it, a
/// signal could no longer stop it gracefully), saying why in `failure`.
pub(super) fn spawn_signals(
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

impl Topology {
    /// SIGUSR1 (a new local request) wakes the drain loop.
    pub(super) fn wake_loop(&mut self, wake: Arc<tokio::sync::Notify>) {
        let (orch, stop) = (self.orchestrator.clone(), self.shutdown.clone());
        self.supervisor
            .spawn("wake loop", Policy::Restart, move || {
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
}
