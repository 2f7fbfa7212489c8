//! The daemon file's one webhook endpoint (`start --config FILE --webhook ADDR`): intake's
//! routed server (`intake::webhook_routes`), bound before any repository starts and served until
//! the daemon stops. Each served repository adds itself to its routes from its own table
//! (`Topology::webhook_server`) and `fleet` marks it failing or gone when it stops; a refused
//! delivery is a line of `<data dir>/daemon/refused.jsonl`.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::host_env::HostEnv;
use crate::intake::webhook::WebhookServer;
use crate::intake::webhook_routes::{RoutedEndpoint, Routes};

use super::StartError;

/// Where the refused deliveries are recorded, one JSON line each.
pub fn refused_path(data_dir: &Path) -> PathBuf {
    data_dir.join("daemon").join("refused.jsonl")
}

/// The served endpoint: its routes, and the task serving it.
pub(super) struct FleetWebhook {
    pub(super) routes: Routes,
    stop: CancellationToken,
    task: JoinHandle<Result<(), String>>,
}

/// The webhook's secret for `--webhook`, checked first (before anything starts).
pub(super) fn secret(
    addr: Option<SocketAddr>,
    host: &HostEnv,
) -> Result<Option<Vec<u8>>, StartError> {
    let Some(_) = addr else { return Ok(None) };
    let secret = crate::github::webhook::secret_from_env(host).ok_or_else(|| {
        StartError::Setting(format!(
            "--webhook needs the webhook's secret: set {} to the secret configured in the webhook settings of every repository (or of the GitHub App) this daemon serves (docs/webhooks.md)",
            crate::github::webhook::SECRET_ENV
        ))
    })?;
    Ok(Some(secret.into_bytes()))
}

/// Binds `addr` and serves it until `shutdown` (or [`FleetWebhook::end`]); a server that fails
/// stops the daemon, as a one-repository daemon's does.
pub(super) async fn start(
    addr: SocketAddr,
    secret: Vec<u8>,
    data_dir: &Path,
    installations: Option<Arc<tokio::sync::Notify>>,
    shutdown: &CancellationToken,
) -> Result<FleetWebhook, StartError> {
    let routes = Routes::default();
    let endpoint = RoutedEndpoint {
        secret,
        routes: routes.clone(),
        refused_log: refused_path(data_dir),
        installations,
        refused_lock: std::sync::Mutex::new(()),
    };
    let server = WebhookServer::bind_routed(addr, endpoint)
        .await
        .map_err(|e| {
            StartError::Unavailable(format!("cannot listen for webhooks on {addr}: {e}"))
        })?;
    let bound = server
        .local_addr()
        .map_err(|e| StartError::Unavailable(format!("cannot listen for webhooks: {e}")))?;
    println!(
        "webhook listening on {bound} (every repository of the daemon file, routed by repository)"
    );
    tracing::info!(addr = %bound, "webhook listening for every served repository");
    let stop = shutdown.child_token();
    let task = {
        let (stop, shutdown) = (stop.clone(), shutdown.clone());
        tokio::spawn(async move {
            let served = server.serve(stop).await.map_err(|e| e.to_string());
            if let Err(e) = &served {
                println!("error: the webhook server failed: {e}");
                tracing::error!(error = %e, "the webhook server failed; the daemon stops");
                shutdown.cancel();
            }
            served
        })
    };
    Ok(FleetWebhook { routes, stop, task })
}

impl FleetWebhook {
    /// Stops serving (requests in flight finish) and makes a failure of the server the daemon's.
    pub(super) async fn end(self) -> Result<(), StartError> {
        self.stop.cancel();
        match self.task.await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(StartError::Internal(format!(
                "the webhook server failed: {e}; what was running is recovered at the next start"
            ))),
            Err(e) => Err(StartError::Internal(format!(
                "the webhook server ended abnormally: {e}"
            ))),
        }
    }
}
