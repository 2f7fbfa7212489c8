//! The daemon's long-lived tasks as supervised components. Each one (the GitHub poller, the
//! webhook server, the stop-reaction watch, the hourly reclaim, the wake loop, the drain) runs
//! in a `tracing` span named after it, and when it fails or panics the supervisor says so
//! (log and standard output, naming the component and the error) and then:
//! - [`Policy::Restart`]: starts it again after a backoff (1 s, doubling, at most 60 s); more
//!   than [`MAX_RESTARTS`] restarts within [`RESTART_WINDOW`] stops the daemon instead;
//! - [`Policy::Stop`]: stops the daemon (graceful: running steps get their grace period), and
//!   `start` exits 1 naming the component and its error.
//!
//! No component is ever silently gone: each is joined, its end (normal at shutdown or not) is
//! seen, and a panic in one never takes the others down without a word.

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::Instrument as _;

/// At most this many restarts of one component within [`RESTART_WINDOW`].
pub const MAX_RESTARTS: usize = 5;
/// See [`MAX_RESTARTS`].
pub const RESTART_WINDOW: Duration = Duration::from_secs(600);
const FIRST_BACKOFF: Duration = Duration::from_secs(1);
const MAX_BACKOFF: Duration = Duration::from_secs(60);

/// What a component's failure does to the daemon.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Policy {
    /// Started again (its state is on disk: nothing is lost), within the restart limit.
    Restart,
    /// The daemon stops with the component's error.
    Stop,
}

/// The restarts of one component in the last [`RESTART_WINDOW`].
#[derive(Debug, Default)]
struct Restarts {
    at: Vec<Instant>,
}

impl Restarts {
    /// Note a failure at `now`: the delay before the restart, or `None` when the limit is
    /// spent (the daemon stops).
    fn after_failure(&mut self, now: Instant) -> Option<Duration> {
        self.at
            .retain(|t| now.saturating_duration_since(*t) < RESTART_WINDOW);
        if self.at.len() >= MAX_RESTARTS {
            return None;
        }
        self.at.push(now);
        let doublings = u32::try_from(self.at.len() - 1).unwrap_or(u32::MAX).min(16);
        Some((FIRST_BACKOFF * 2u32.pow(doublings)).min(MAX_BACKOFF))
    }
}

/// The components of one daemon run and the failure that stopped it, if any.
pub struct Supervisor {
    shutdown: CancellationToken,
    stopped_by: Arc<Mutex<Option<String>>>,
    handles: Vec<(&'static str, JoinHandle<()>)>,
}

impl Supervisor {
    pub fn new(shutdown: CancellationToken) -> Supervisor {
        Supervisor {
            shutdown,
            stopped_by: Arc::new(Mutex::new(None)),
            handles: Vec::new(),
        }
    }

    /// Run component `name`: `make` gives one run of it (called again for a restart). A run
    /// that returns `Ok` ended on purpose (at shutdown); `Err` and a panic are failures.
    pub fn spawn<F, Fut>(&mut self, name: &'static str, policy: Policy, make: F)
    where
        F: Fn() -> Fut + Send + 'static,
        Fut: Future<Output = Result<(), String>> + Send + 'static,
    {
        let shutdown = self.shutdown.clone();
        let stopped_by = self.stopped_by.clone();
        let handle = tokio::spawn(async move {
            let mut restarts = Restarts::default();
            let mut runs = 0u32;
            loop {
                runs += 1;
                let run = make();
                let fault = injected_fault(name, runs);
                let joined = tokio::spawn(
                    async move {
                        if let Some(fault) = fault {
                            panic!("{fault}");
                        }
                        run.await
                    }
                    .instrument(tracing::info_span!("component", name)),
                )
                .await;
                let error = match joined {
                    Ok(Err(e)) => format!("failed: {e}"),
                    Err(e) if e.is_panic() => format!("panicked: {}", panic_text(&e.into_panic())),
                    // Ended on purpose, or cancelled with the runtime.
                    Ok(Ok(())) | Err(_) => return,
                };
                if shutdown.is_cancelled() {
                    // Stopping anyway: a component whose failure stops the daemon still makes
                    // the stop a failure; another is only logged.
                    tracing::warn!(
                        component = name,
                        error,
                        "a component ended with an error while stopping"
                    );
                    if policy == Policy::Stop {
                        let why = format!("the {name} {error}");
                        println!("error: {why}");
                        stopped_by
                            .lock()
                            .unwrap_or_else(std::sync::PoisonError::into_inner)
                            .get_or_insert(why);
                    }
                    return;
                }
                let delay = match policy {
                    Policy::Restart => restarts.after_failure(Instant::now()),
                    Policy::Stop => None,
                };
                let Some(delay) = delay else {
                    let why = match policy {
                        Policy::Restart => format!(
                            "the {name} {error} (more than {MAX_RESTARTS} restarts in {} minutes)",
                            RESTART_WINDOW.as_secs() / 60
                        ),
                        Policy::Stop => format!("the {name} {error}"),
                    };
                    tracing::error!(component = name, error = %why, "stopping the daemon");
                    println!("error: {why}; rover is stopping");
                    stopped_by
                        .lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner)
                        .get_or_insert(why);
                    shutdown.cancel();
                    return;
                };
                tracing::warn!(
                    component = name,
                    error,
                    restart_in_secs = delay.as_secs(),
                    "restarting a component"
                );
                println!(
                    "warning: the {name} {error}; restarting it in {} s ({} of at most {MAX_RESTARTS} in {} minutes)",
                    delay.as_secs(),
                    restarts.at.len(),
                    RESTART_WINDOW.as_secs() / 60
                );
                tokio::select! {
                    () = shutdown.cancelled() => return,
                    () = tokio::time::sleep(delay) => {}
                }
            }
        });
        self.handles.push((name, handle));
    }

    /// Wait for every component to end (they end at the shutdown); the failure that stopped
    /// the daemon, if one did.
    pub async fn join(self) -> Option<String> {
        for (name, handle) in self.handles {
            if let Err(e) = handle.await {
                tracing::error!(component = name, error = %e, "a component's supervisor ended abnormally");
            }
        }
        self.stopped_by
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take()
    }
}

pub(super) fn panic_text(payload: &Box<dyn std::any::Any + Send>) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "(no message)".to_owned())
}

/// Fault injection for the tests of this module's promises, in debug builds only:
/// `ROVER_TEST_PANIC=<component>[:<runs>]` makes that component panic at the start of its
/// first `runs` runs (every run without a count). A release build has no such hook.
pub(super) fn injected_fault(name: &str, run: u32) -> Option<String> {
    if !cfg!(debug_assertions) {
        return None;
    }
    let spec = std::env::var("ROVER_TEST_PANIC").ok()?;
    let (component, runs) = match spec.split_once(':') {
        Some((c, n)) => (c, n.parse::<u32>().ok()?),
        None => (spec.as_str(), u32::MAX),
    };
    (component == name && run <= runs)
        .then(|| format!("injected panic in the {name} (ROVER_TEST_PANIC, run {run})"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn restarts_back_off_and_stop_past_the_limit_in_the_window() {
        let mut r = Restarts::default();
        let t0 = Instant::now();
        let delays: Vec<_> = (0..MAX_RESTARTS)
            .map(|i| r.after_failure(t0 + Duration::from_secs(i as u64)))
            .collect();
        assert_eq!(
            delays,
            [1, 2, 4, 8, 16].map(|s| Some(Duration::from_secs(s)))
        );
        assert_eq!(r.after_failure(t0 + Duration::from_secs(10)), None);
        // Failures older than the window are forgotten.
        let later = t0 + RESTART_WINDOW + Duration::from_secs(5);
        assert_eq!(r.after_failure(later), Some(Duration::from_secs(1)));
    }

    #[tokio::test]
    async fn a_stopping_component_stops_the_daemon_and_says_why() {
        let shutdown = CancellationToken::new();
        let mut sup = Supervisor::new(shutdown.clone());
        let waiting = shutdown.clone();
        sup.spawn("waiter", Policy::Restart, move || {
            let waiting = waiting.clone();
            async move {
                waiting.cancelled().await;
                Ok(())
            }
        });
        sup.spawn("breaker", Policy::Stop, || async {
            Err("the socket is gone".to_owned())
        });
        let why = tokio::time::timeout(Duration::from_secs(5), sup.join())
            .await
            .expect("every component ended");
        assert_eq!(
            why.as_deref(),
            Some("the breaker failed: the socket is gone")
        );
        assert!(shutdown.is_cancelled());
    }

    #[tokio::test]
    async fn a_stop_component_failing_while_stopping_still_fails_the_daemon() {
        let shutdown = CancellationToken::new();
        let mut sup = Supervisor::new(shutdown.clone());
        let stop = shutdown.clone();
        sup.spawn("drain", Policy::Stop, move || {
            let stop = stop.clone();
            async move {
                stop.cancel();
                Err("the store is unreadable".to_owned())
            }
        });
        let why = tokio::time::timeout(Duration::from_secs(5), sup.join())
            .await
            .expect("ended");
        assert_eq!(
            why.as_deref(),
            Some("the drain failed: the store is unreadable")
        );
    }

    #[tokio::test]
    async fn a_panicking_component_is_restarted() {
        let shutdown = CancellationToken::new();
        let mut sup = Supervisor::new(shutdown.clone());
        let runs = Arc::new(std::sync::atomic::AtomicU32::new(0));
        let (counted, stop) = (runs.clone(), shutdown.clone());
        sup.spawn("flaky", Policy::Restart, move || {
            let (counted, stop) = (counted.clone(), stop.clone());
            async move {
                let n = counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                assert!(n > 0, "the first run panics");
                stop.cancel();
                Ok(())
            }
        });
        let why = tokio::time::timeout(Duration::from_secs(10), sup.join())
            .await
            .expect("ended");
        assert_eq!(why, None, "a restart is no failure of the daemon");
        assert_eq!(runs.load(std::sync::atomic::Ordering::SeqCst), 2);
    }
}
