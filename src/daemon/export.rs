//! OpenTelemetry export at start: the settings resolved (a bad one refuses the start, naming
//! it), the store armed or disarmed, the exporter running beside the pipeline.

use crate::config::RoverConfig;
use crate::steps::Services;
use crate::store::AutopilotStore;
use crate::telemetry::{ExportSetup, Telemetry, TelemetrySettings};

use super::StartError;

pub(super) async fn start(
    config: &RoverConfig,
    store: &AutopilotStore,
    services: &Services,
    one_of_many: bool,
) -> Result<Option<Telemetry>, StartError> {
    let settings = TelemetrySettings::resolve(&config.autopilot.telemetry, &services.host)
        .map_err(StartError::Setting)?;
    let shown = format!(
        "{} ({}{})",
        settings.shown_endpoint,
        settings.protocol.as_str(),
        if settings.content {
            ", with content"
        } else {
            ""
        }
    );
    let telemetry = crate::telemetry::start(ExportSetup {
        store: store.clone(),
        settings,
        agent: config.autopilot.agent.clone(),
        redactor: services.redactor.clone(),
        project_id: services.project_id.clone(),
        repo: services.repo.as_ref().map(ToString::to_string),
        host: services.host.clone(),
        one_of_many,
    })
    .await
    .map_err(StartError::Setting)?;
    if telemetry.is_some() {
        println!("telemetry: exporting traces to {shown}");
        tracing::info!(endpoint = %shown, "OpenTelemetry export on");
    }
    Ok(telemetry)
}
