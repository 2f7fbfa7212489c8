//! Structured logs: every tracing event becomes one [`LogEntry`] line in the project's
//! `autopilot/log.jsonl` (rotated at 5 MB, 3 backups), written off the hot path by
//! tracing-appender's worker. The level comes from `ROVER_LOG` (default `info`).
//!
//! An error logged as an error value (`error = &e as &dyn std::error::Error`) keeps its source
//! chain: `error` holds its message and `errorSources` the messages of its causes, outermost
//! first.

use std::io::Write;
use std::path::Path;

use serde_json::{Map, Value};
use tracing::field::{Field, Visit};
use tracing_appender::non_blocking::{NonBlocking, WorkerGuard};
use tracing_subscriber::layer::{Context, SubscriberExt};
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer};

use crate::host_env::HostEnv;
use crate::store::log::RotatingLog;
use crate::store::LogEntry;

/// The environment variable holding the tracing filter.
pub const LOG_ENV: &str = "ROVER_LOG";

/// Keeps the log writer alive; dropping it flushes what is buffered.
pub struct LogGuard {
    _worker: WorkerGuard,
}

/// Send this process's logs to `log_path`, filtered by `host`'s [`LOG_ENV`]. Returns an error if
/// the file cannot be opened.
pub fn init(log_path: &Path, host: &HostEnv) -> std::io::Result<LogGuard> {
    let log = RotatingLog::open(log_path)?;
    let (writer, worker) = tracing_appender::non_blocking(log);
    let filter = match host.var(LOG_ENV) {
        Some(spec) if !spec.trim().is_empty() => EnvFilter::try_new(&spec).unwrap_or_else(|e| {
            eprintln!("warning: {LOG_ENV}={spec:?} is not a valid filter ({e}); logging at info");
            EnvFilter::new("info")
        }),
        _ => EnvFilter::new("info"),
    };
    // A second init in one process (tests) keeps the first subscriber.
    let _ = tracing_subscriber::registry()
        .with(filter)
        .with(JsonLines { writer })
        .try_init();
    Ok(LogGuard { _worker: worker })
}

struct JsonLines {
    writer: NonBlocking,
}

/// The fields a span was opened with (e.g. a step run's trace, step, span and action ids),
/// kept in its extensions so every event inside it carries them.
struct SpanFields(Map<String, Value>);

impl<S> Layer<S> for JsonLines
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
{
    fn on_new_span(
        &self,
        attrs: &tracing::span::Attributes<'_>,
        id: &tracing::span::Id,
        ctx: Context<'_, S>,
    ) {
        let mut fields = FieldMap(Map::new());
        attrs.record(&mut fields);
        if let Some(span) = ctx.span(id) {
            span.extensions_mut().insert(SpanFields(fields.0));
        }
    }

    fn on_event(&self, event: &tracing::Event<'_>, ctx: Context<'_, S>) {
        let mut fields = FieldMap(Map::new());
        event.record(&mut fields);
        let mut fields = fields.0;
        // The enclosing spans' fields, innermost winning; the event's own fields win over all.
        if let Some(scope) = ctx.event_scope(event) {
            for span in scope {
                if let Some(outer) = span.extensions().get::<SpanFields>() {
                    for (k, v) in &outer.0 {
                        fields.entry(k.clone()).or_insert_with(|| v.clone());
                    }
                }
            }
        }
        let message = match fields.remove("message") {
            Some(Value::String(s)) => s,
            Some(other) => other.to_string(),
            None => String::new(),
        };
        let entry = LogEntry {
            timestamp: chrono::Utc::now(),
            level: event.metadata().level().to_string(),
            target: event.metadata().target().to_owned(),
            message,
            fields,
        };
        if let Ok(mut line) = serde_json::to_vec(&entry) {
            line.push(b'\n');
            // One write per entry, so rotation never splits a line.
            let _ = self.writer.clone().write_all(&line);
        }
    }
}

struct FieldMap(Map<String, Value>);

impl Visit for FieldMap {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0
            .insert(field.name().to_owned(), Value::String(format!("{value:?}")));
    }
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0
            .insert(field.name().to_owned(), Value::String(value.to_owned()));
    }
    fn record_i64(&mut self, field: &Field, value: i64) {
        self.0.insert(field.name().to_owned(), Value::from(value));
    }
    fn record_u64(&mut self, field: &Field, value: u64) {
        self.0.insert(field.name().to_owned(), Value::from(value));
    }
    fn record_bool(&mut self, field: &Field, value: bool) {
        self.0.insert(field.name().to_owned(), Value::Bool(value));
    }
    fn record_error(&mut self, field: &Field, value: &(dyn std::error::Error + 'static)) {
        self.0
            .insert(field.name().to_owned(), Value::String(value.to_string()));
        let sources: Vec<Value> = std::iter::successors(value.source(), |e| e.source())
            .map(|e| Value::String(e.to_string()))
            .collect();
        if !sources.is_empty() {
            self.0
                .insert(format!("{}Sources", field.name()), Value::Array(sources));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("cannot read the ledger")]
    struct Outer {
        #[source]
        source: std::io::Error,
    }

    #[test]
    fn an_error_value_keeps_its_causes_as_a_structured_field() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("log.jsonl");
        let (writer, worker) =
            tracing_appender::non_blocking(RotatingLog::open(&path).expect("log"));
        let subscriber = tracing_subscriber::registry().with(JsonLines { writer });
        tracing::subscriber::with_default(subscriber, || {
            let span = tracing::info_span!("step", trace = "t1");
            let _inside = span.enter();
            let e = Outer {
                source: std::io::Error::new(std::io::ErrorKind::NotFound, "no such file"),
            };
            tracing::warn!(error = &e as &dyn std::error::Error, "cannot go on");
        });
        drop(worker);
        let text = std::fs::read_to_string(&path).expect("read");
        let entry: LogEntry = serde_json::from_str(text.trim()).expect("one entry");
        assert_eq!(entry.message, "cannot go on");
        assert_eq!(entry.fields["error"], "cannot read the ledger");
        assert_eq!(
            entry.fields["errorSources"],
            serde_json::json!(["no such file"])
        );
        assert_eq!(entry.fields["trace"], "t1");
    }
}
