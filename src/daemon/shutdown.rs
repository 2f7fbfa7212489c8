//! The daemon's stop: every component joined, the proxy released when no run needs it, the
//! telemetry flushed, the console given a moment to end; then what the stop says and the exit
//! code.

use std::process::ExitCode;
use std::time::Duration;

use tokio::task::JoinHandle;

use crate::telemetry::Telemetry;

use super::topology::{Ended, Topology};
use super::{proxy, StartError, EX_TEMPFAIL};

/// Wind the components down after the shutdown, in order, and say how the run ended.
pub(super) async fn wind_down(
    daemon: Topology,
    ended: Ended,
    console: JoinHandle<()>,
    telemetry: Option<Telemetry>,
) -> Result<ExitCode, StartError> {
    let Topology {
        supervisor,
        orchestrator,
        services,
        store,
        options,
        ..
    } = daemon;
    let stopped_by = supervisor.join().await.or(ended.failure);
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
    ended.result?;
    if let Some(why) = stopped_by {
        return Err(StartError::Internal(format!(
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
    if let Some(error) = ended.unavailable {
        eprintln!(
            "error: GitHub is unavailable ({error}); nothing was lost, try again later (the next run starts where this one stopped)"
        );
        return Ok(ExitCode::from(EX_TEMPFAIL));
    }
    Ok(ExitCode::SUCCESS)
}
