//! OpenTelemetry export of rover's traces (docs/observability.md): every span closed in the
//! store, by any process, is sent to an OTLP collector by the daemon, live, as one
//! OpenTelemetry span of the trace of the same id.
//!
//! The hook is the store's: closing a span (`AutopilotStore::write_span` with a final status)
//! appends its id to the outbox (`store::outbox`) while export is armed, whichever process
//! closes it (the daemon, `--once`, `submit`, an intervention, the recovery of a span a crash
//! left open). The daemon's exporter reads the outbox from the offset it exported up to, turns
//! each span into OTLP (`convert`) and sends batches with the `opentelemetry-otlp` exporter. A
//! span is exported once: the offset moves past a batch once the collector answered (or the
//! batch was counted dropped); a crash between the two sends that batch again with the same
//! ids.
//!
//! It never holds the pipeline up or fails it: steps only append 37 bytes; sending runs in its
//! own task. The queue is the outbox, bounded at [`MAX_QUEUE`] spans (older ones are dropped
//! and counted); a batch the collector refuses or does not answer in time is dropped and
//! counted. `rover autopilot status` shows the counts.

pub mod convert;
pub mod settings;
pub mod state;

use std::collections::{HashSet, VecDeque};
use std::time::Duration;

use chrono::Utc;
use opentelemetry::{InstrumentationScope, KeyValue};
use opentelemetry_otlp::WithExportConfig;
use opentelemetry_sdk::trace::{SpanData, SpanExporter as _};
use tokio_util::sync::CancellationToken;
use tracing::Instrument as _;
use uuid::Uuid;

use crate::github::{Redactor, Visibility};
use crate::host_env::HostEnv;
use crate::store::{blocking, outbox, AutopilotStore};

pub use convert::Convert;
pub use settings::{Protocol, TelemetrySettings};
pub use state::{Dropped, ExportState};

/// The most spans waiting in the outbox; beyond it the oldest are dropped (and counted).
pub const MAX_QUEUE: u64 = 10_000;
/// Spans per OTLP request.
pub const BATCH: usize = 256;
/// How long the last flush at stop may take before what is left waits for the next start.
pub const FLUSH_DEADLINE: Duration = Duration::from_secs(3);
/// How often the exporter looks at the outbox for spans other processes closed.
const LOOK_EVERY: Duration = Duration::from_millis(500);

/// The running exporter of a daemon.
pub struct Telemetry {
    task: tokio::task::JoinHandle<()>,
    stop: CancellationToken,
}

/// What the daemon knows that the export needs.
pub struct ExportSetup {
    pub store: AutopilotStore,
    pub settings: TelemetrySettings,
    pub agent: crate::agents::AgentSettings,
    pub redactor: Redactor,
    pub project_id: String,
    pub repo: Option<String>,
    /// rover's environment: the variables that name the service (read by the crate too).
    pub host: HostEnv,
    /// Served by a daemon with other repositories (a daemon file): the resource is the
    /// daemon's, the same for every repository, which each span names instead
    /// (`rover.repo`, `rover.project_id`).
    pub one_of_many: bool,
}

/// Start exporting (armed: closed spans are recorded) when the settings say so; otherwise
/// disarm the store, so no process records spans nobody sends. Must run inside the runtime.
pub async fn start(setup: ExportSetup) -> Result<Option<Telemetry>, String> {
    let ExportSetup {
        store,
        settings,
        agent,
        redactor,
        project_id,
        repo,
        host,
        one_of_many,
    } = setup;
    let enabled = settings.enabled;
    let shown = settings.shown_endpoint.clone();
    let protocol = settings.protocol;
    let state = blocking(store.clone(), move |s| {
        // Never on, nothing to undo: a start with export off touches nothing (cron's `--once`).
        if !enabled && !outbox::dir(s).exists() {
            return Ok(ExportState::default());
        }
        let mut state = state::load(s)?;
        if !enabled && !state.enabled && !outbox::is_armed(s) {
            return Ok(state);
        }
        state.enabled = enabled;
        if enabled {
            outbox::arm(s)?;
            state.endpoint = Some(shown);
            state.protocol = Some(protocol.as_str().to_owned());
        } else {
            outbox::disarm(s)?;
            state.offset = 0;
        }
        state::save(s, &state)?;
        Ok(state)
    })
    .await
    .map_err(|e| {
        format!(
            "cannot set up OpenTelemetry export: {}",
            crate::error::error_chain(&e)
        )
    })?;
    if !enabled {
        return Ok(None);
    }
    let mut exporter = build_exporter(&settings)?;
    let of = (!one_of_many).then_some((project_id.as_str(), repo.as_deref()));
    exporter.set_resource(&resource(&settings, &host, of));
    let convert = Convert {
        agent,
        content: settings.content,
        redactor,
        repo: repo.clone(),
        project_id,
        scope: InstrumentationScope::builder("rover")
            .with_version(env!("CARGO_PKG_VERSION"))
            .build(),
    };
    let stop = CancellationToken::new();
    let mut run = Run {
        store,
        exporter,
        convert,
        state,
        recent: Recent::default(),
    };
    let token = stop.clone();
    let task = tokio::spawn(async move { run.supervised(token).await }.instrument(
        tracing::info_span!("component", name = "telemetry exporter"),
    ));
    Ok(Some(Telemetry { task, stop }))
}

impl Telemetry {
    /// Send what is waiting (at most [`FLUSH_DEADLINE`]), then stop.
    pub async fn finish(self) {
        self.stop.cancel();
        match tokio::time::timeout(FLUSH_DEADLINE + Duration::from_secs(1), self.task).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => tracing::error!(error = %e, "the telemetry exporter ended abnormally"),
            Err(_) => tracing::warn!(
                "the telemetry exporter did not stop in time; what it had not sent stays in the outbox"
            ),
        }
    }
}

fn build_exporter(
    settings: &TelemetrySettings,
) -> Result<opentelemetry_otlp::SpanExporter, String> {
    let builder = opentelemetry_otlp::SpanExporter::builder();
    let built = match settings.protocol {
        Protocol::HttpProtobuf => {
            let mut http = builder
                .with_http()
                .with_protocol(opentelemetry_otlp::Protocol::HttpBinary);
            if let Some(e) = &settings.config_endpoint {
                http = http.with_endpoint(e.clone());
            }
            http.build()
        }
        Protocol::Grpc => {
            let mut grpc = builder.with_tonic();
            if let Some(e) = &settings.config_endpoint {
                grpc = grpc.with_endpoint(e.clone());
            }
            grpc.build()
        }
    };
    built.map_err(|e| format!("cannot build the OpenTelemetry exporter: {e}"))
}

/// `service.name` (`OTEL_SERVICE_NAME` or `OTEL_RESOURCE_ATTRIBUTES` win, then the file, then
/// `rover`), the version, and which project and repository the traces are of (`of`; `None` for
/// a daemon serving many repositories: one resource for them all).
fn resource(
    settings: &TelemetrySettings,
    host: &HostEnv,
    of: Option<(&str, Option<&str>)>,
) -> opentelemetry_sdk::Resource {
    let mut builder = opentelemetry_sdk::Resource::builder();
    let env_names = host
        .var(settings::SERVICE_NAME_ENV)
        .is_some_and(|v| !v.is_empty())
        || host
            .var(settings::RESOURCE_ATTRIBUTES_ENV)
            .is_some_and(|v| v.contains("service.name="));
    if !env_names {
        builder = builder.with_service_name(
            settings
                .service_name
                .clone()
                .unwrap_or_else(|| "rover".into()),
        );
    }
    let mut attrs = vec![KeyValue::new("service.version", env!("CARGO_PKG_VERSION"))];
    if let Some((project_id, repo)) = of {
        attrs.push(KeyValue::new("rover.project_id", project_id.to_owned()));
        if let Some(repo) = repo {
            attrs.push(KeyValue::new("rover.repo", repo.to_owned()));
        }
    }
    builder.with_attributes(attrs).build()
}

/// The ids exported lately, so that a span recorded twice (two processes closing it at once)
/// is sent once.
#[derive(Default)]
struct Recent {
    order: VecDeque<Uuid>,
    set: HashSet<Uuid>,
}

impl Recent {
    const CAP: usize = 4096;

    /// Whether `id` is new (and remember it).
    fn first(&mut self, id: Uuid) -> bool {
        if !self.set.insert(id) {
            return false;
        }
        self.order.push_back(id);
        if self.order.len() > Self::CAP {
            if let Some(old) = self.order.pop_front() {
                self.set.remove(&old);
            }
        }
        true
    }
}

struct Run {
    store: AutopilotStore,
    exporter: opentelemetry_otlp::SpanExporter,
    convert: Convert,
    state: ExportState,
    recent: Recent,
}

impl Run {
    /// [`Run::run`], started again after a panic (said in the log and on stdout; after 1 s,
    /// doubling to 60 s): what it had not sent is still in the outbox.
    async fn supervised(&mut self, stop: CancellationToken) {
        let mut backoff = Duration::from_secs(1);
        loop {
            let run = std::panic::AssertUnwindSafe(self.run(stop.clone()));
            let Err(panic) = futures_util::FutureExt::catch_unwind(run).await else {
                return;
            };
            let text = panic
                .downcast_ref::<&str>()
                .map(|s| (*s).to_owned())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "a panic without a message".into());
            drop(panic);
            tracing::error!(component = "telemetry exporter", error = %text, "the telemetry exporter panicked; restarting it");
            println!(
                "warning: the telemetry exporter panicked: {text}; restarting it in {}s",
                backoff.as_secs()
            );
            tokio::select! {
                () = stop.cancelled() => return,
                () = tokio::time::sleep(backoff) => {}
            }
            backoff = (backoff * 2).min(Duration::from_secs(60));
        }
    }

    async fn run(&mut self, stop: CancellationToken) {
        loop {
            while !stop.is_cancelled() && self.step(None).await {}
            tokio::select! {
                () = outbox::APPENDED.notified() => {}
                () = tokio::time::sleep(LOOK_EVERY) => {}
                () = stop.cancelled() => break,
            }
        }
        let deadline = tokio::time::Instant::now() + FLUSH_DEADLINE;
        while tokio::time::Instant::now() < deadline && self.step(Some(deadline)).await {}
        let _ = self.exporter.shutdown();
    }

    /// Export one batch from the outbox; false when there was nothing to send.
    async fn step(&mut self, deadline: Option<tokio::time::Instant>) -> bool {
        let offset = self.state.offset;
        let read = blocking(self.store.clone(), move |s| {
            let batch = outbox::read_from(s, offset, BATCH)?;
            Ok((batch, outbox::len(s)))
        })
        .await;
        let (batch, len) = match read {
            Ok(r) => r,
            Err(e) => {
                tracing::warn!(
                    error = &e as &dyn std::error::Error,
                    "cannot read the telemetry outbox"
                );
                return false;
            }
        };
        let start = if batch.reset { 0 } else { offset };
        if batch.ids.is_empty() && batch.damaged == 0 {
            if batch.reset || len == start && start > 0 {
                let at = start;
                let emptied = blocking(self.store.clone(), move |s| {
                    outbox::truncate_consumed(s, at)
                })
                .await
                .unwrap_or(false);
                if emptied || batch.reset {
                    self.state.offset = 0;
                    self.save().await;
                }
            }
            return false;
        }
        // The bound: the oldest spans beyond MAX_QUEUE are dropped, counted.
        let waiting = (len.saturating_sub(start)) / outbox::LINE;
        if waiting > MAX_QUEUE {
            let skip = waiting - MAX_QUEUE;
            self.state.dropped.queue_full += skip;
            self.state.offset = start + skip * outbox::LINE;
            tracing::warn!(
                dropped = skip,
                "telemetry queue full: the oldest spans were dropped"
            );
            self.save().await;
            return true;
        }
        let ids: Vec<Uuid> = batch
            .ids
            .iter()
            .copied()
            .filter(|id| self.recent.first(*id))
            .collect();
        let convert = self.convert.clone();
        let spans = blocking(self.store.clone(), move |s| {
            let mut out = Vec::new();
            let mut unreadable = 0u64;
            for id in ids {
                match s
                    .read_span(id)
                    .ok()
                    .and_then(|span| convert::to_span_data(&span, &convert))
                {
                    Some(data) => out.push(data),
                    None => unreadable += 1,
                }
            }
            Ok((out, unreadable))
        })
        .await;
        let (spans, unreadable) = spans.unwrap_or_else(|_| (Vec::new(), batch.ids.len() as u64));
        self.state.dropped.unreadable += unreadable + batch.damaged;
        self.send(spans, deadline).await;
        self.state.offset = batch.end;
        self.save().await;
        true
    }

    async fn send(&mut self, spans: Vec<SpanData>, deadline: Option<tokio::time::Instant>) {
        if spans.is_empty() {
            return;
        }
        let n = spans.len() as u64;
        // The exporter's own timeout (`OTEL_EXPORTER_OTLP_TIMEOUT`) bounds a request; this
        // bounds it again, and by the flush deadline at stop.
        let limit = settings::DEFAULT_TIMEOUT + Duration::from_secs(5);
        let until = deadline.map_or_else(
            || tokio::time::Instant::now() + limit,
            |d| d.min(tokio::time::Instant::now() + limit),
        );
        let result = tokio::time::timeout_at(until, self.exporter.export(spans)).await;
        let error = match result {
            Ok(Ok(())) => None,
            Ok(Err(e)) => Some(e.to_string()),
            Err(_) => Some("the collector did not answer in time".to_owned()),
        };
        match error {
            None => {
                self.state.exported += n;
                self.state.last_export_at = Some(Utc::now());
                if self.state.last_error.take().is_some() {
                    tracing::info!("OpenTelemetry export works again");
                }
            }
            Some(e) => {
                let e = self.convert.redactor.redact(&e, Visibility::Private);
                self.state.dropped.failed += n;
                if self.state.last_error.as_deref() != Some(e.as_str()) {
                    tracing::warn!(error = %e, dropped = n, "OpenTelemetry export failed; spans dropped");
                }
                self.state.last_error = Some(e);
                self.state.last_error_at = Some(Utc::now());
            }
        }
    }

    async fn save(&self) {
        let state = self.state.clone();
        if let Err(e) = blocking(self.store.clone(), move |s| state::save(s, &state)).await {
            tracing::warn!(
                error = &e as &dyn std::error::Error,
                "cannot record the telemetry state"
            );
        }
    }
}
