//! The process a daemon runs in, whether it serves one repository or a daemon file's: the async
//! runtime and the signal handler (SIGINT/SIGTERM a graceful stop, SIGUSR1 a wake), started
//! before the lock is taken, and at the end the handler's end seen and its failure made the
//! daemon's.

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::StartError;

pub(super) struct Process {
    pub(super) runtime: tokio::runtime::Runtime,
    /// Cancelled by SIGINT/SIGTERM.
    pub(super) shutdown: CancellationToken,
    /// Notified by SIGUSR1.
    pub(super) wake: Arc<tokio::sync::Notify>,
    failure: Arc<std::sync::Mutex<Option<String>>>,
    signals: Option<tokio::task::JoinHandle<()>>,
}

impl Process {
    /// The runtime, and the signal handler on it.
    pub(super) fn start() -> Result<Process, StartError> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .map_err(|e| StartError::Internal(format!("cannot start the async runtime: {e}")))?;
        let shutdown = CancellationToken::new();
        let wake = Arc::new(tokio::sync::Notify::new());
        let failure = Arc::new(std::sync::Mutex::new(None));
        let signals = runtime.block_on(async {
            super::signals::spawn_signals(shutdown.clone(), wake.clone(), failure.clone())
        });
        Ok(Process {
            runtime,
            shutdown,
            wake,
            failure,
            signals,
        })
    }

    /// Ends the signal handler and the runtime; a failure of the handler turns `result` into
    /// the daemon's error.
    pub(super) fn stop<T>(self, result: Result<T, StartError>) -> Result<T, StartError> {
        // The signal handler lives as long as the daemon: ended here, its end seen.
        if let Some(signals) = self.signals {
            signals.abort();
            if let Err(e) = self.runtime.block_on(signals) {
                if !e.is_cancelled() {
                    tracing::error!(error = %e, "the signal handler ended abnormally");
                }
            }
        }
        let failed = self
            .failure
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take();
        self.runtime.shutdown_timeout(Duration::from_secs(2));
        match (failed, result) {
            (Some(why), Ok(_)) => Err(StartError::Internal(format!(
                "rover stopped: {why}; what was running is recovered at the next start"
            ))),
            (_, result) => result,
        }
    }
}
