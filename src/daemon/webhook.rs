//! The webhook server as a component (`--webhook ADDR`): intake's server, bound at start and
//! served until the shutdown. A repository of a daemon file binds none: it adds its intake to
//! the daemon's one routed endpoint (`fleet_webhook`).

use std::sync::Arc;

use crate::intake::webhook;

use super::supervise::Policy;
use super::topology::Topology;
use super::StartError;

impl Topology {
    /// Webhooks: bound now, so a taken address stops the start; served until the shutdown,
    /// which stops accepting and lets requests in flight finish. A server that fails stops the
    /// daemon (a daemon that silently stopped hearing webhooks would miss events until the next
    /// poll).
    pub(super) async fn webhook_server(&mut self) -> Result<(), StartError> {
        if let (Some(routes), Some(repo)) = (&self.routes, &self.project.repo) {
            routes.serve(&repo.to_string(), self.webhook_state());
            return Ok(());
        }
        let (Some(addr), Some(secret)) = (self.options.webhook, self.webhook_secret.take()) else {
            return Ok(());
        };
        let endpoint = webhook::Endpoint {
            secret: secret.into_bytes(),
            state: Arc::new(self.webhook_state()),
        };
        let server = webhook::WebhookServer::bind(addr, endpoint)
            .await
            .map_err(|e| {
                StartError::Unavailable(format!("cannot listen for webhooks on {addr}: {e}"))
            })?;
        let bound = server
            .local_addr()
            .map_err(|e| StartError::Unavailable(format!("cannot listen for webhooks: {e}")))?;
        println!("webhook listening on {bound}");
        tracing::info!(addr = %bound, "webhook listening");
        let server = Arc::new(std::sync::Mutex::new(Some(server)));
        let stop = self.shutdown.clone();
        self.supervisor
            .spawn("webhook server", Policy::Stop, move || {
                let (server, stop) = (server.lock().ok().and_then(|mut s| s.take()), stop.clone());
                async move {
                    let server = server.ok_or("its listener is gone; it cannot be served again")?;
                    server.serve(stop).await.map_err(|e| e.to_string())
                }
            });
        Ok(())
    }

    /// What a delivery for this repository is handed to: its store, trust and queue.
    fn webhook_state(&self) -> webhook::WebhookState {
        webhook::WebhookState {
            store: self.store.clone(),
            entry: crate::intake::Entry::new(
                self.project.id.clone(),
                crate::steps::kinds::FIRST_STEP,
            ),
            repo: self.project.repo.as_ref().map(ToString::to_string),
            normalize: self.normalize.clone().unwrap_or_default(),
            queue: Arc::new(self.orchestrator.clone()),
        }
    }
}
