//! rover's sandbox proxy as the daemon sees it: a warning at start when the key it adds is
//! missing, and its release at stop when no run needs it any more.

use crate::config::RoverConfig;
use crate::host_env::HostEnv;
use crate::steps::Services;
use crate::store::AutopilotStore;

/// A sandboxed agent reaches its model API only through rover's proxy, which adds the key
/// from rover's environment: without one, every workflow would fail at its first request.
pub(super) fn warn_without_proxy_key(config: &RoverConfig, host: &HostEnv) {
    if config.autopilot.sandbox.egress().is_none() {
        return;
    }
    let keys = config.autopilot.agent.agent.provider().key_names();
    let missing = (!keys.iter().any(|name| host.is_set(name))).then(|| match keys {
        [first, rest @ ..] if !rest.is_empty() => format!("{first} (or {})", rest.join(", ")),
        _ => keys.join(", "),
    });
    if let Some(names) = missing {
        let text = format!("{names} is not set: sandboxed agents reach the model API only through rover's proxy, which adds that key (a login of the CLI on this machine does not reach the sandbox), so workflows will fail until it is set in rover's environment");
        println!("warning: {text}");
        tracing::warn!("{text}");
    }
}

/// rover's sandbox proxy outlives the process only while an agent run still needs it (a
/// `--once` run leaves its workflows running): with none left, it is stopped.
pub(super) async fn release_proxy(services: &Services, store: &AutopilotStore) {
    let Some(sandbox) = &services.sandbox else {
        return;
    };
    match sandbox.run_networks(&services.project_id).await {
        Ok(runs) if runs.is_empty() => {
            let dir = store.proxy_dir();
            if let Err(e) = sandbox.stop_proxy(&dir).await {
                tracing::warn!(error = %e, "cannot stop rover's sandbox proxy");
            }
        }
        Ok(runs) => {
            tracing::info!(
                runs = runs.len(),
                "rover's sandbox proxy stays up for the runs still going"
            );
        }
        Err(e) => {
            tracing::warn!(error = %e, "cannot tell whether runs still need rover's sandbox proxy");
        }
    }
}
