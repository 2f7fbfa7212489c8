//! The proxy end to end on real sockets: relays on 127.0.0.1, the server on a unix socket, fake
//! model APIs (axum) that check the credential they get, and a TCP echo server for tunnels.
//! The harness is here; the model proxy's tests are in `model`, the egress proxy's in `egress`.

mod egress;
mod model;
mod seal;
mod seal_daemon;
mod shared;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Body;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::Router;
use base64::Engine as _;
use chrono::Utc;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::{Bytes, Incoming};
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream, UnixListener, UnixStream};
use tokio::sync::oneshot;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use super::*;

const ANTHROPIC_KEY: &str = "sk-ant-real-key";
const OPENAI_KEY: &str = "sk-openai-real-key";

/// A fake model API that checks the real credential, records every credential header it saw
/// and streams a scripted answer in small pieces, optionally pausing after the first event.
#[derive(Default)]
struct FakeState {
    credentials: Mutex<Vec<String>>,
    /// When set, the next stream waits for it after its first event.
    gate: Mutex<Option<oneshot::Receiver<()>>>,
    /// When set, every stream waits after its first event until it says `true`.
    hold_all: Mutex<Option<tokio::sync::watch::Receiver<bool>>>,
    /// Requests answered.
    answered: std::sync::atomic::AtomicUsize,
    last_sent: AtomicBool,
}

struct Fake {
    url: String,
    state: Arc<FakeState>,
}

impl Fake {
    fn credentials(&self) -> Vec<String> {
        self.state.credentials.lock().expect("lock").clone()
    }

    /// Make every stream pause after its first event until the sender says `true`.
    fn hold_all(&self) -> tokio::sync::watch::Sender<bool> {
        let (tx, rx) = tokio::sync::watch::channel(false);
        *self.state.hold_all.lock().expect("lock") = Some(rx);
        tx
    }

    /// Requests the fake answered (with the right credential).
    fn answered(&self) -> usize {
        self.state.answered.load(Ordering::SeqCst)
    }

    /// Make the next stream pause after its first event until the sender fires.
    fn hold_next(&self) -> oneshot::Sender<()> {
        let (tx, rx) = oneshot::channel();
        *self.state.gate.lock().expect("lock") = Some(rx);
        self.state.last_sent.store(false, Ordering::SeqCst);
        tx
    }
}

fn anthropic_events() -> Vec<String> {
    let event = |name: &str, data: Value| format!("event: {name}\ndata: {data}\n\n");
    vec![
        event(
            "message_start",
            json!({"type": "message_start", "message": {"id": "msg_1", "model": "claude-test",
                "usage": {"input_tokens": 1000, "cache_read_input_tokens": 0,
                          "cache_creation_input_tokens": 0, "output_tokens": 1}}}),
        ),
        event(
            "content_block_delta",
            json!({"type": "content_block_delta", "index": 0,
                   "delta": {"type": "text_delta", "text": "hello"}}),
        ),
        event(
            "message_delta",
            json!({"type": "message_delta", "delta": {"stop_reason": "end_turn"},
                   "usage": {"output_tokens": 1000}}),
        ),
        event("message_stop", json!({"type": "message_stop"})),
    ]
}

fn openai_events() -> Vec<String> {
    let event = |data: Value| {
        format!(
            "event: {}\ndata: {data}\n\n",
            data["type"].as_str().unwrap_or("")
        )
    };
    vec![
        event(json!({"type": "response.created", "response": {"id": "resp_1"}})),
        event(json!({"type": "response.output_text.delta", "delta": "hi"})),
        event(
            json!({"type": "response.completed", "response": {"id": "resp_1", "model": "gpt-test",
            "usage": {"input_tokens": 100, "input_tokens_details": {"cached_tokens": 40},
                      "output_tokens": 20, "output_tokens_details": {"reasoning_tokens": 5},
                      "total_tokens": 120}}}),
        ),
    ]
}

/// The cost of one fake Anthropic answer at the default Claude price ($5 in, $25 out).
const ANTHROPIC_ANSWER_USD: f64 = (1000.0 * 5.0 + 1000.0 * 25.0) / 1e6;
/// The cost of one fake OpenAI answer at the default codex price.
const OPENAI_ANSWER_USD: f64 = (60.0 * 1.25 + 40.0 * 0.125 + 20.0 * 10.0) / 1e6;

async fn start_fake(provider: Provider) -> Fake {
    let state = Arc::new(FakeState::default());
    let app = Router::new()
        .fallback(
            move |State(state): State<Arc<FakeState>>, headers: HeaderMap| async move {
                answer(provider, &state, &headers)
            },
        )
        .with_state(state.clone());
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move { axum::serve(listener, app).await });
    Fake {
        url: format!("http://{addr}"),
        state,
    }
}

fn answer(provider: Provider, state: &Arc<FakeState>, headers: &HeaderMap) -> Response<Body> {
    let mut seen = Vec::new();
    for name in ["x-api-key", "authorization", "proxy-authorization"] {
        for value in headers.get_all(name) {
            seen.push(format!("{name}: {}", value.to_str().unwrap_or("?")));
        }
    }
    state.credentials.lock().expect("lock").extend(seen);
    let authorized = match provider {
        Provider::Anthropic => headers.get("x-api-key").is_some_and(|v| v == ANTHROPIC_KEY),
        Provider::Openai => headers
            .get("authorization")
            .is_some_and(|v| v == format!("Bearer {OPENAI_KEY}").as_str()),
    };
    if !authorized {
        return Response::builder()
            .status(401)
            .body(Body::from("fake: wrong credential"))
            .expect("response");
    }
    let events = match provider {
        Provider::Anthropic => anthropic_events(),
        Provider::Openai => openai_events(),
    };
    let gate = state.gate.lock().expect("lock").take();
    let hold_all = state.hold_all.lock().expect("lock").clone();
    state.answered.fetch_add(1, Ordering::SeqCst);
    let state = state.clone();
    let (tx, rx) = tokio::sync::mpsc::channel::<Bytes>(4);
    tokio::spawn(async move {
        let mut events = events.into_iter();
        let first = events.next().expect("an event");
        if tx.send(Bytes::from(first)).await.is_err() {
            return;
        }
        if let Some(gate) = gate {
            let _ = gate.await;
        }
        if let Some(mut all) = hold_all {
            let _ = all.wait_for(|go| *go).await;
        }
        // The rest in pieces that split events and lines anywhere.
        let rest: String = events.collect();
        for piece in rest.as_bytes().chunks(7) {
            if tx.send(Bytes::copy_from_slice(piece)).await.is_err() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        state.last_sent.store(true, Ordering::SeqCst);
    });
    let stream = futures_util::stream::unfold(rx, |mut rx| async move {
        rx.recv()
            .await
            .map(|chunk| (Ok::<_, Infallible>(chunk), rx))
    });
    Response::builder()
        .header("content-type", "text/event-stream")
        .body(Body::from_stream(stream))
        .expect("response")
}

/// The proxy server, its fakes and one relay per run.
struct Harness {
    dir: tempfile::TempDir,
    anthropic: Fake,
    openai: Fake,
    shutdown: CancellationToken,
    trace: Uuid,
}

impl Harness {
    async fn start() -> Harness {
        Harness::start_with(None).await
    }

    /// A proxy server sharing the daemon's wire dir `daemon_dir` (a daemon file's budget).
    async fn start_with(daemon_dir: Option<PathBuf>) -> Harness {
        let dir = tempfile::tempdir().expect("tempdir");
        let anthropic = start_fake(Provider::Anthropic).await;
        let openai = start_fake(Provider::Openai).await;
        let config = ProxyConfig {
            dir: dir.path().to_owned(),
            anthropic: Some(Upstream {
                base_url: anthropic.url.clone(),
                credential: Credential::ApiKey(ANTHROPIC_KEY.into()),
            }),
            openai: Some(Upstream {
                base_url: openai.url.clone(),
                credential: Credential::ApiKey(OPENAI_KEY.into()),
            }),
            prices: ProxyPrices::default(),
            daemon_dir,
        };
        let listener = UnixListener::bind(dir.path().join(SOCKET_FILE)).expect("bind the socket");
        let shutdown = CancellationToken::new();
        tokio::spawn(serve(config, listener, shutdown.clone()));
        Harness {
            dir,
            anthropic,
            openai,
            shutdown,
            trace: Uuid::new_v4(),
        }
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }

    fn socket(&self) -> PathBuf {
        self.path().join(SOCKET_FILE)
    }

    /// Write a grant for `run` of the harness's trace and give its token.
    fn grant(&self, run: &str, change: impl FnOnce(&mut Grant)) -> String {
        self.grant_in(self.path(), run, change)
    }

    /// Write a grant for `run` of the harness's trace in the proxy dir `dir` (a store's under
    /// a shared server) and give its token.
    fn grant_in(&self, dir: &Path, run: &str, change: impl FnOnce(&mut Grant)) -> String {
        let token = new_token();
        let mut grant = Grant {
            run: run.into(),
            trace_id: self.trace,
            token_sha256: token_sha256(&token),
            providers: vec![Provider::Anthropic, Provider::Openai],
            egress: Egress::ModelOnly,
            budget: None,
            max_requests: None,
            codex_prices: None,
            ended: false,
            created_at: Utc::now(),
        };
        change(&mut grant);
        grant.save(dir).expect("save the grant");
        token
    }

    /// Start `run`'s relay and give its address.
    async fn relay(&self, run: &str) -> SocketAddr {
        self.relay_keyed(None, run).await
    }

    /// Start the relay of `run` of the store `key` (none: the server's own dir).
    async fn relay_keyed(&self, key: Option<&str>, run: &str) -> SocketAddr {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        tokio::spawn(relay(
            listener,
            self.socket(),
            key.map(str::to_owned),
            run.to_owned(),
            self.shutdown.clone(),
        ));
        addr
    }

    /// The ledger of `run` once `done` holds for it (the write may trail the response).
    async fn ledger_when(&self, run: &str, done: impl Fn(&Ledger) -> bool) -> Ledger {
        for _ in 0..200 {
            if let Some(ledger) = Ledger::load(self.path(), run).expect("ledger") {
                if done(&ledger) {
                    return ledger;
                }
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!(
            "the ledger of {run} never got there: {:?}",
            Ledger::load(self.path(), run)
        );
    }
}

impl Drop for Harness {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

/// An HTTP/1.1 client connection (kept alive across requests) to `addr`.
async fn client(addr: SocketAddr) -> SendRequest<Full<Bytes>> {
    let stream = TcpStream::connect(addr)
        .await
        .expect("connect to the relay");
    let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .expect("handshake");
    tokio::spawn(conn);
    sender
}

fn post(path: &str, headers: &[(&str, &str)], body: &Value) -> Request<Full<Bytes>> {
    let mut builder = Request::post(path)
        .header("host", "relay:8080")
        .header("content-type", "application/json");
    for (name, value) in headers {
        builder = builder.header(*name, *value);
    }
    builder
        .body(Full::new(Bytes::from(body.to_string())))
        .expect("request")
}

fn anthropic_request(token: &str) -> Request<Full<Bytes>> {
    post(
        "/anthropic/v1/messages?beta=true",
        &[("x-api-key", token), ("anthropic-version", "2023-06-01")],
        &json!({"model": "claude-test", "max_tokens": 10, "stream": true,
                "messages": [{"role": "user", "content": "hi"}]}),
    )
}

/// A request the fake's answer (1,000 tokens in, 1,000 out) cannot cost more than its worst
/// case: a body of 1,200 bytes and `max_tokens` 1,000.
fn honest_anthropic_request(token: &str) -> Request<Full<Bytes>> {
    let body = json!({"model": "claude-test", "max_tokens": 1000, "stream": true,
        "messages": [{"role": "user", "content": "x".repeat(1100)}]});
    post(
        "/anthropic/v1/messages?beta=true",
        &[("x-api-key", token), ("anthropic-version", "2023-06-01")],
        &body,
    )
}

fn openai_request(token: &str) -> Request<Full<Bytes>> {
    let bearer = format!("Bearer {token}");
    post(
        "/openai/responses",
        &[("authorization", &bearer)],
        &json!({"model": "gpt-test", "stream": true, "input": "hi"}),
    )
}

async fn send(
    client: &mut SendRequest<Full<Bytes>>,
    request: Request<Full<Bytes>>,
) -> (StatusCode, String) {
    client.ready().await.expect("the connection is usable");
    let response = client.send_request(request).await.expect("a response");
    let status = response.status();
    (status, read_all(response).await)
}

async fn read_all(response: Response<Incoming>) -> String {
    let bytes = response
        .into_body()
        .collect()
        .await
        .expect("the body")
        .to_bytes();
    String::from_utf8_lossy(&bytes).into_owned()
}

/// A raw HTTP exchange on a fresh relay connection: the response head and what follows.
async fn raw(addr: SocketAddr, request: &str) -> (String, TcpStream) {
    let mut stream = TcpStream::connect(addr).await.expect("connect");
    stream.write_all(request.as_bytes()).await.expect("write");
    let head = read_head(&mut stream).await;
    (head, stream)
}

async fn read_head<S: tokio::io::AsyncRead + Unpin>(stream: &mut S) -> String {
    let mut head = Vec::new();
    while !head.ends_with(b"\r\n\r\n") {
        let byte = tokio::time::timeout(Duration::from_secs(5), stream.read_u8())
            .await
            .expect("the head arrives")
            .expect("a byte");
        head.push(byte);
    }
    String::from_utf8_lossy(&head).into_owned()
}

fn proxy_auth(token: &str) -> String {
    let encoded = base64::engine::general_purpose::STANDARD.encode(format!("rover:{token}"));
    format!("Proxy-Authorization: Basic {encoded}\r\n")
}

async fn echo_server() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                let (mut r, mut w) = stream.split();
                let _ = tokio::io::copy(&mut r, &mut w).await;
            });
        }
    });
    addr
}
