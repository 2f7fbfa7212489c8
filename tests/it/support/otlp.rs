//! An OTLP trace receiver, as an OpenTelemetry Collector's `otlp` receiver serves it: over HTTP,
//! `POST /v1/traces` with an `application/x-protobuf` body, decoded as the real
//! `ExportTraceServiceRequest` (the `opentelemetry-proto` crate's prost types) and answered with
//! an `ExportTraceServiceResponse` (anything else is refused, as the collector refuses it); over
//! gRPC, the generated `TraceService` server of the same crate on tonic.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use axum::body::Bytes;
use axum::http::{HeaderMap, StatusCode};
use axum::response::IntoResponse;
use axum::routing::post;
use axum::Router;
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
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
    record(&inner, headers, &request);
    let reply = ExportTraceServiceResponse::default().encode_to_vec();
    (
        StatusCode::OK,
        [("content-type", "application/x-protobuf")],
        reply,
    )
        .into_response()
}

fn record(inner: &Mutex<Inner>, headers: HeaderMap, request: &ExportTraceServiceRequest) {
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
}

struct Grpc(Arc<Mutex<Inner>>);

#[tonic::async_trait]
impl TraceService for Grpc {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        let headers = request.metadata().clone().into_headers();
        record(&self.0, headers, request.get_ref());
        Ok(tonic::Response::new(ExportTraceServiceResponse::default()))
    }
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

    /// The same receiver over gRPC (`TraceService/Export`, HTTP/2 without TLS).
    pub async fn start_grpc() -> OtlpReceiver {
        let inner = Arc::new(Mutex::new(Inner::default()));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let service = TraceServiceServer::new(Grpc(inner.clone()));
        let task = tokio::spawn(async move {
            tonic::transport::Server::builder()
                .add_service(service)
                .serve_with_incoming(tokio_stream_of(listener))
                .await
                .expect("the gRPC receiver serves");
        });
        OtlpReceiver {
            url: format!("http://{addr}"),
            inner,
            _served: Served::from_task(addr, task),
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

/// A listener's connections as the stream tonic serves.
fn tokio_stream_of(
    listener: tokio::net::TcpListener,
) -> impl futures_util::Stream<Item = std::io::Result<tokio::net::TcpStream>> {
    futures_util::stream::unfold(listener, |l| async move {
        let conn = l.accept().await.map(|(s, _)| s);
        Some((conn, l))
    })
}
