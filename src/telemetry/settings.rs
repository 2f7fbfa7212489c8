//! Whether and where to export: `autopilot.telemetry` in `rover.json` and the standard
//! `OTEL_*` variables, resolved once at start. The variables win over the file, as in every
//! OpenTelemetry SDK; the OTLP crate itself reads the endpoint, headers, timeout and
//! compression variables when it builds the exporter.

use std::time::Duration;

use crate::config::TelemetryConfig;
use crate::host_env::HostEnv;

/// The standard variables rover reads itself (the OTLP crate reads the rest).
pub const ENDPOINT_ENV: &str = "OTEL_EXPORTER_OTLP_ENDPOINT";
pub const TRACES_ENDPOINT_ENV: &str = "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT";
pub const PROTOCOL_ENV: &str = "OTEL_EXPORTER_OTLP_PROTOCOL";
pub const TRACES_PROTOCOL_ENV: &str = "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL";
pub const HEADERS_ENV: &str = "OTEL_EXPORTER_OTLP_HEADERS";
pub const TRACES_HEADERS_ENV: &str = "OTEL_EXPORTER_OTLP_TRACES_HEADERS";
pub const SERVICE_NAME_ENV: &str = "OTEL_SERVICE_NAME";
pub const RESOURCE_ATTRIBUTES_ENV: &str = "OTEL_RESOURCE_ATTRIBUTES";
pub const SDK_DISABLED_ENV: &str = "OTEL_SDK_DISABLED";
pub const TRACES_EXPORTER_ENV: &str = "OTEL_TRACES_EXPORTER";

/// How spans travel to the collector.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocol {
    /// OTLP over HTTP with protobuf bodies (`POST <endpoint>/v1/traces`), port 4318.
    HttpProtobuf,
    /// OTLP over gRPC (`TraceService/Export`), port 4317.
    Grpc,
}

impl Protocol {
    pub fn as_str(self) -> &'static str {
        match self {
            Protocol::HttpProtobuf => "http/protobuf",
            Protocol::Grpc => "grpc",
        }
    }

    fn parse(value: &str, from: &str) -> Result<Protocol, String> {
        match value.trim().to_ascii_lowercase().as_str() {
            "http/protobuf" => Ok(Protocol::HttpProtobuf),
            "grpc" => Ok(Protocol::Grpc),
            "http/json" => Err(format!(
                "{from} is \"http/json\", which rover does not send: use \"http/protobuf\" or \"grpc\""
            )),
            other => Err(format!(
                "{from} is {other:?}: use \"http/protobuf\" or \"grpc\""
            )),
        }
    }

    fn default_endpoint(self) -> &'static str {
        match self {
            Protocol::HttpProtobuf => "http://localhost:4318/v1/traces",
            Protocol::Grpc => "http://localhost:4317",
        }
    }
}

/// Resolved telemetry settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TelemetrySettings {
    pub enabled: bool,
    pub protocol: Protocol,
    /// The endpoint from `rover.json` when no variable names one (the crate reads those).
    pub config_endpoint: Option<String>,
    /// Where spans go, as shown by `status` (credentials and query left out).
    pub shown_endpoint: String,
    /// `service.name` unless a variable sets it.
    pub service_name: Option<String>,
    /// Export span text (redacted); off by default.
    pub content: bool,
}

/// The per-batch limit when `OTEL_EXPORTER_OTLP_TIMEOUT` does not say (the SDK's default).
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);

impl TelemetrySettings {
    /// Resolve from the file's section and rover's environment (`host`). An unusable value is
    /// an error naming it.
    pub fn resolve(config: &TelemetryConfig, host: &HostEnv) -> Result<TelemetrySettings, String> {
        Self::resolve_with(config, |name| host.non_empty(name))
    }

    /// [`TelemetrySettings::resolve`] over any environment (tests).
    pub fn resolve_with(
        config: &TelemetryConfig,
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<TelemetrySettings, String> {
        let env_endpoint = env(TRACES_ENDPOINT_ENV)
            .map(|e| (e, true))
            .or_else(|| env(ENDPOINT_ENV).map(|e| (e, false)));
        let disabled = env(SDK_DISABLED_ENV).is_some_and(|v| v.trim().eq_ignore_ascii_case("true"))
            || env(TRACES_EXPORTER_ENV).is_some_and(|v| v.trim().eq_ignore_ascii_case("none"));
        let enabled = !disabled && (config.enabled || env_endpoint.is_some());
        let protocol = match (
            env(TRACES_PROTOCOL_ENV),
            env(PROTOCOL_ENV),
            &config.protocol,
        ) {
            (Some(p), _, _) => Protocol::parse(&p, TRACES_PROTOCOL_ENV)?,
            (None, Some(p), _) => Protocol::parse(&p, PROTOCOL_ENV)?,
            (None, None, Some(p)) => Protocol::parse(p, "autopilot.telemetry.protocol")?,
            (None, None, None) => Protocol::HttpProtobuf,
        };
        let config_endpoint = match &env_endpoint {
            Some(_) => None,
            None => config.endpoint.clone().filter(|e| !e.trim().is_empty()),
        };
        let target = match (&env_endpoint, &config_endpoint) {
            (Some((e, true)), _) => e.clone(),
            (Some((e, false)), _) | (None, Some(e)) => signal_url(e, protocol),
            (None, None) => protocol.default_endpoint().to_owned(),
        };
        if enabled
            && !target
                .trim_start()
                .to_ascii_lowercase()
                .starts_with("http://")
        {
            return Err(format!(
                "the OpenTelemetry endpoint {} is not plain http://: rover sends OTLP without TLS, to a collector or agent next to it (which forwards over TLS); see docs/observability.md",
                shown(&target)
            ));
        }
        Ok(TelemetrySettings {
            enabled,
            protocol,
            config_endpoint: config_endpoint.map(|e| signal_url(&e, protocol)),
            shown_endpoint: shown(&target),
            service_name: config.service_name.clone(),
            content: config.content,
        })
    }
}

/// The traces URL of a base endpoint: HTTP appends `/v1/traces`, gRPC takes it as it is.
fn signal_url(base: &str, protocol: Protocol) -> String {
    match protocol {
        Protocol::HttpProtobuf => format!("{}/v1/traces", base.trim_end_matches('/')),
        Protocol::Grpc => base.to_owned(),
    }
}

/// An endpoint without what may be a credential: user info and query.
pub fn shown(url: &str) -> String {
    let no_query = url.split(['?', '#']).next().unwrap_or_default();
    match no_query.split_once("://") {
        Some((scheme, rest)) => {
            let host_path = rest.rsplit_once('@').map_or(rest, |(_, h)| h);
            format!("{scheme}://{host_path}")
        }
        None => no_query.to_owned(),
    }
}

/// The values of `OTEL_EXPORTER_OTLP_HEADERS`-style variables (`k1=v1,k2=v2`): credentials of
/// the collector, which rover holds as secrets (redacted wherever it writes).
pub fn header_values(host: &HostEnv) -> Vec<(&'static str, String)> {
    let mut out = Vec::new();
    for name in [HEADERS_ENV, TRACES_HEADERS_ENV] {
        if let Some(text) = host.non_empty(name) {
            for pair in text.split(',') {
                if let Some((_, v)) = pair.split_once('=') {
                    let v = v.trim();
                    if !v.is_empty() {
                        out.push((name, v.to_owned()));
                    }
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env<'a>(pairs: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |name| {
            pairs
                .iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| (*v).to_owned())
        }
    }

    #[test]
    fn off_by_default_on_by_the_endpoint_variable_or_the_file() {
        let off = TelemetrySettings::resolve_with(&TelemetryConfig::default(), env(&[])).unwrap();
        assert!(!off.enabled);
        let on = TelemetrySettings::resolve_with(
            &TelemetryConfig::default(),
            env(&[(ENDPOINT_ENV, "http://collector:4318/")]),
        )
        .unwrap();
        assert!(on.enabled);
        assert_eq!(on.shown_endpoint, "http://collector:4318/v1/traces");
        assert_eq!(on.config_endpoint, None, "the crate reads the variable");
        let file = TelemetryConfig {
            enabled: true,
            endpoint: Some("http://otel:4317".into()),
            protocol: Some("grpc".into()),
            ..TelemetryConfig::default()
        };
        let s = TelemetrySettings::resolve_with(&file, env(&[])).unwrap();
        assert_eq!(
            (s.protocol, s.config_endpoint.as_deref()),
            (Protocol::Grpc, Some("http://otel:4317"))
        );
        let disabled = TelemetrySettings::resolve_with(
            &file,
            env(&[(SDK_DISABLED_ENV, "true"), (ENDPOINT_ENV, "http://c:4318")]),
        )
        .unwrap();
        assert!(!disabled.enabled);
    }

    #[test]
    fn the_variables_win_and_bad_values_are_named() {
        let file = TelemetryConfig {
            enabled: true,
            protocol: Some("grpc".into()),
            ..TelemetryConfig::default()
        };
        let s = TelemetrySettings::resolve_with(&file, env(&[(PROTOCOL_ENV, "http/protobuf")]))
            .unwrap();
        assert_eq!(s.protocol, Protocol::HttpProtobuf);
        let err = TelemetrySettings::resolve_with(&file, env(&[(PROTOCOL_ENV, "http/json")]))
            .unwrap_err();
        assert!(err.contains(PROTOCOL_ENV), "{err}");
        let err = TelemetrySettings::resolve_with(
            &file,
            env(&[(ENDPOINT_ENV, "https://user:pw@api.example.com?key=1")]),
        )
        .unwrap_err();
        assert!(
            err.contains("https://api.example.com")
                && !err.contains("pw")
                && !err.contains("key=1"),
            "{err}"
        );
    }
}
