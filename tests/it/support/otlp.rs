//! An OTLP/HTTP trace receiver, as an OpenTelemetry Collector's `otlp` receiver serves it:
//! `POST /v1/traces` with an `application/x-protobuf` body, decoded as the real
//! `ExportTraceServiceRequest` (the `opentelemetry-proto` crate's prost types), answered with an
//! `ExportTraceServiceResponse`. Anything else is refused, as the collector refuses it.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use axum::body::Bytes;
use axum::http::{HeaderMap, StatusCode};
use axum::response::IntoResponse;
use axum::routing::post;
use axum::Router;
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::any_value::Value as AnyValue;
use opentelemetry_proto::tonic::common::v1::KeyValue;
use prost::Message;

use super::fake_server::{serve, Served};

/// One received span, flattened: its resource's attributes beside its own.
#[derive(Debug, Clone)]
pub struct Received {
    pub trace_id: String,
    pub span_id: String,
    pub parent_span_id: String,
    pub name: String,
    pub kind: i32,
    pub start_ns: u64,
    pub end_ns: u64,
    pub attrs: BTreeMap<String, String>,
    pub resource: BTreeMap<String, String>,
    /// `(code, message)` of the span's status.
    pub status: (i32, String),
    pub scope: String,
}

impl Received {
    pub fn attr(&self, key: &str) -> Option<&str> {
        self.attrs.get(key).map(String::as_str)
    }
}

#[derive(Default)]
struct Inner {
    spans: Vec<Received>,
    requests: usize,
    headers: Vec<HeaderMap>,
}

/// The receiver; spans are kept in arrival order.
pub struct OtlpReceiver {
    pub url: String,
    inner: Arc<Mutex<Inner>>,
    _served: Served,
}

fn value(v: Option<&opentelemetry_proto::tonic::common::v1::AnyValue>) -> String {
    match v.and_then(|v| v.value.as_ref()) {
        Some(AnyValue::StringValue(s)) => s.clone(),
        Some(AnyValue::BoolValue(b)) => b.to_string(),
        Some(AnyValue::IntValue(i)) => i.to_string(),
        Some(AnyValue::DoubleValue(d)) => d.to_string(),
        Some(AnyValue::ArrayValue(a)) => a
            .values
            .iter()
            .map(|v| value(Some(v)))
            .collect::<Vec<_>>()
            .join(","),
        Some(other) => format!("{other:?}"),
        None => String::new(),
    }
}

fn attrs(kvs: &[KeyValue]) -> BTreeMap<String, String> {
    kvs.iter()
        .map(|kv| (kv.key.clone(), value(kv.value.as_ref())))
        .collect()
}

fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write as _;
    bytes.iter().fold(String::new(), |mut s, b| {
        let _ = write!(s, "{b:02x}");
        s
    })
}

async fn traces(
    axum::extract::State(inner): axum::extract::State<Arc<Mutex<Inner>>>,
    headers: HeaderMap,
    body: Bytes,
) -> axum::response::Response {
    let content_type = headers
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    if content_type != "application/x-protobuf" {
        return (
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            format!("content-type {content_type:?}"),
        )
            .into_response();
    }
    let request = match ExportTraceServiceRequest::decode(body) {
        Ok(r) => r,
        Err(e) => return (StatusCode::BAD_REQUEST, e.to_string()).into_response(),
    };
    let mut inner = inner.lock().unwrap();
    inner.requests += 1;
    inner.headers.push(headers);
    for rs in &request.resource_spans {
        let resource = rs
            .resource
            .as_ref()
            .map(|r| attrs(&r.attributes))
            .unwrap_or_default();
        for ss in &rs.scope_spans {
            let scope = ss
                .scope
                .as_ref()
                .map(|s| s.name.clone())
                .unwrap_or_default();
            for s in &ss.spans {
                inner.spans.push(Received {
                    trace_id: hex(&s.trace_id),
                    span_id: hex(&s.span_id),
                    parent_span_id: hex(&s.parent_span_id),
                    name: s.name.clone(),
                    kind: s.kind,
                    start_ns: s.start_time_unix_nano,
                    end_ns: s.end_time_unix_nano,
                    attrs: attrs(&s.attributes),
                    resource: resource.clone(),
                    status: s
                        .status
                        .as_ref()
                        .map(|st| (st.code, st.message.clone()))
                        .unwrap_or_default(),
                    scope: scope.clone(),
                });
            }
        }
    }
    let reply = ExportTraceServiceResponse::default().encode_to_vec();
    (
        StatusCode::OK,
        [("content-type", "application/x-protobuf")],
        reply,
    )
        .into_response()
}

impl OtlpReceiver {
    pub async fn start() -> OtlpReceiver {
        let inner = Arc::new(Mutex::new(Inner::default()));
        let app = Router::new()
            .route("/v1/traces", post(traces))
            .with_state(inner.clone());
        let served = serve(app, "the OTLP receiver").await;
        OtlpReceiver {
            url: format!("http://{}", served.addr),
            inner,
            _served: served,
        }
    }

    pub fn spans(&self) -> Vec<Received> {
        self.inner.lock().unwrap().spans.clone()
    }

    pub fn requests(&self) -> usize {
        self.inner.lock().unwrap().requests
    }

    /// The headers of every request (to check `OTEL_EXPORTER_OTLP_HEADERS` reached it).
    pub fn headers(&self) -> Vec<HeaderMap> {
        self.inner.lock().unwrap().headers.clone()
    }
}

/// A loopback port nothing listens on (bound, then let go).
pub fn dead_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().port()
}
