//! The proxy end to end on real sockets: relays on 127.0.0.1, the server on a unix socket, fake
//! model APIs (axum) that check the credential they get, and a TCP echo server for tunnels.

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
        let token = new_token();
        let mut grant = Grant {
            run: run.into(),
            trace_id: self.trace,
            token_sha256: token_sha256(&token),
            providers: vec![Provider::Anthropic, Provider::Openai],
            egress: Egress::ModelOnly,
            budget: None,
            ended: false,
            created_at: Utc::now(),
        };
        change(&mut grant);
        grant.save(self.path()).expect("save the grant");
        token
    }

    /// Start `run`'s relay and give its address.
    async fn relay(&self, run: &str) -> SocketAddr {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        tokio::spawn(relay(
            listener,
            self.socket(),
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

fn openai_request(token: &str) -> Request<Full<Bytes>> {
    let bearer = format!("Bearer {token}");
    post(
        "/openai/v1/responses",
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

#[tokio::test]
async fn the_agent_token_is_swapped_for_the_real_key_on_one_kept_alive_connection() {
    let h = Harness::start().await;
    let token = h.grant("run-a", |_| {});
    let mut c = client(h.relay("run-a").await).await;
    let (status, body) = send(&mut c, anthropic_request(&token)).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert!(body.contains("message_stop"), "{body}");
    // Same connection, a Bearer token this time, and the other provider.
    let bearer = format!("Bearer {token}");
    let mut second = anthropic_request("unused");
    second.headers_mut().remove("x-api-key");
    second
        .headers_mut()
        .insert("authorization", bearer.parse().expect("header"));
    let (status, _) = send(&mut c, second).await;
    assert_eq!(status, StatusCode::OK);
    let (status, body) = send(&mut c, openai_request(&token)).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert!(body.contains("response.completed"));

    let seen = [h.anthropic.credentials(), h.openai.credentials()].concat();
    assert_eq!(seen.len(), 3, "{seen:?}");
    assert!(
        seen.iter().all(|c| !c.contains("rover-run-")),
        "the upstream saw the run token: {seen:?}"
    );
    assert!(seen.contains(&format!("x-api-key: {ANTHROPIC_KEY}")));
    assert!(seen.contains(&format!("authorization: Bearer {OPENAI_KEY}")));
    let ledger = h.ledger_when("run-a", |l| l.requests == 3).await;
    assert!(ledger.bytes_up > 0 && ledger.bytes_down > 0);

    // codex's WebSocket attempt gets the 426 that makes it fall back to SSE at once.
    let upgrade = Request::get("/openai/v1/responses")
        .header("host", "relay:8080")
        .header("connection", "Upgrade")
        .header("upgrade", "websocket")
        .header("authorization", &bearer)
        .body(Full::new(Bytes::new()))
        .expect("request");
    let mut fresh = client(h.relay("run-a").await).await;
    let (status, _) = send(&mut fresh, upgrade).await;
    assert_eq!(status, StatusCode::UPGRADE_REQUIRED);
}

#[tokio::test]
async fn unknown_ended_and_other_runs_tokens_are_refused() {
    let h = Harness::start().await;
    let token_a = h.grant("run-a", |_| {});
    let token_b = h.grant("run-b", |_| {});
    let token_e = h.grant("run-ended", |g| g.ended = true);
    let token_o = h.grant("run-openai-only", |g| g.providers = vec![Provider::Openai]);
    let mut clients = [
        client(h.relay("run-a").await).await,
        client(h.relay("run-ended").await).await,
        client(h.relay("run-openai-only").await).await,
    ];
    for (which, request, needle) in [
        (0, anthropic_request("rover-run-0123"), "not run run-a's"),
        (0, anthropic_request(&token_b), "not run run-a's"),
        (0, openai_request(&token_b), "not run run-a's"),
        (1, anthropic_request(&token_e), "has ended"),
        (
            2,
            anthropic_request(&token_o),
            "may not use the anthropic API",
        ),
    ] {
        let client = &mut clients[which];
        let openai = request.uri().path().starts_with("/openai");
        let (status, body) = send(client, request).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED, "{body}");
        let body: Value = serde_json::from_str(&body).expect("a JSON error");
        if openai {
            assert_eq!(body["error"]["code"], "invalid_api_key", "{body}");
            assert_eq!(body["error"]["type"], "invalid_request_error");
        } else {
            assert_eq!(body["type"], "error");
            assert_eq!(body["error"]["type"], "authentication_error", "{body}");
        }
        let message = body["error"]["message"].as_str().expect("message");
        assert!(message.contains(needle), "{message}");
    }
    // The refused requests never reached an upstream.
    assert!(h.anthropic.credentials().is_empty());
    assert!(h.openai.credentials().is_empty());
    let ledger = h.ledger_when("run-a", |l| l.refused == 3).await;
    assert_eq!(ledger.requests, 0);
    // The right token still works on the same connection.
    let (status, _) = send(&mut clients[0], anthropic_request(&token_a)).await;
    assert_eq!(status, StatusCode::OK);
}

#[tokio::test]
async fn the_stream_flows_event_by_event() {
    let h = Harness::start().await;
    let token = h.grant("run-a", |_| {});
    let mut c = client(h.relay("run-a").await).await;
    let release = h.anthropic.hold_next();
    c.ready().await.expect("ready");
    let response = c
        .send_request(anthropic_request(&token))
        .await
        .expect("response");
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(response.headers()["content-type"], "text/event-stream");
    let mut body = response.into_body();
    let mut got = String::new();
    while !got.contains("\n\n") {
        let frame = tokio::time::timeout(Duration::from_secs(5), body.frame())
            .await
            .expect("the first event arrives while the upstream waits")
            .expect("a frame")
            .expect("no error");
        if let Some(data) = frame.data_ref() {
            got.push_str(&String::from_utf8_lossy(data));
        }
    }
    assert!(got.contains("message_start"), "{got}");
    assert!(
        !h.anthropic.state.last_sent.load(Ordering::SeqCst),
        "the first event came only after the last was sent"
    );
    release.send(()).expect("the fake waits");
    let rest = body.collect().await.expect("the rest").to_bytes();
    assert!(String::from_utf8_lossy(&rest).contains("message_stop"));
    assert!(h.anthropic.state.last_sent.load(Ordering::SeqCst));
}

#[tokio::test]
async fn usage_read_from_split_chunks_lands_in_the_ledger() {
    let h = Harness::start().await;
    let token = h.grant("run-a", |_| {});
    let mut c = client(h.relay("run-a").await).await;
    let (status, _) = send(&mut c, anthropic_request(&token)).await;
    assert_eq!(status, StatusCode::OK);
    let (status, _) = send(&mut c, openai_request(&token)).await;
    assert_eq!(status, StatusCode::OK);
    let ledger = h.ledger_when("run-a", |l| l.requests == 2).await;
    assert_eq!(
        ledger.usage,
        TokenUsage {
            input: 1000 + 60,
            cached: 40,
            cache_write: 0,
            output: 1000 + 20,
        }
    );
    let expected = ANTHROPIC_ANSWER_USD + OPENAI_ANSWER_USD;
    assert!(
        (ledger.usd - expected).abs() < 1e-12,
        "{} vs {expected}",
        ledger.usd
    );
    assert_eq!(ledger.trace_id, h.trace);
}

#[tokio::test]
async fn a_trace_at_its_stop_limit_is_refused_while_the_request_in_flight_finishes() {
    let h = Harness::start().await;
    let budget = Some(GrantBudget {
        stop_usd: 0.05,
        baseline_usd: 0.01,
    });
    let token_a = h.grant("run-a", |g| g.budget = budget);
    let token_b = h.grant("run-b", |g| g.budget = budget);
    // An ended run of the trace: its spend is in the baselines, its ledger is not counted.
    let ended = Grant::load(h.path(), "run-a")
        .expect("load")
        .expect("grant");
    let ended = Grant {
        run: "run-old".into(),
        ended: true,
        ..ended
    };
    ended.save(h.path()).expect("save");
    Ledger::update(h.path(), &ended, |l| l.usd = 100.0).expect("ledger");
    // A run of another trace does not count either.
    let other = Grant {
        run: "run-other-trace".into(),
        trace_id: Uuid::new_v4(),
        ended: false,
        ..ended.clone()
    };
    other.save(h.path()).expect("save");
    Ledger::update(h.path(), &other, |l| l.usd = 100.0).expect("ledger");

    let mut a = client(h.relay("run-a").await).await;
    let mut b = client(h.relay("run-b").await).await;
    // run-a's request streams, held after its first event.
    let release = h.anthropic.hold_next();
    a.ready().await.expect("ready");
    let in_flight = a
        .send_request(anthropic_request(&token_a))
        .await
        .expect("response");
    assert_eq!(in_flight.status(), StatusCode::OK);
    // run-b spends $0.03 (0.01 + 0.03 < 0.05), then $0.03 more: the trace is at $0.07.
    for _ in 0..2 {
        let (status, body) = send(&mut b, anthropic_request(&token_b)).await;
        assert_eq!(status, StatusCode::OK, "{body}");
    }
    h.ledger_when("run-b", |l| l.requests == 2).await;
    let (status, body) = send(&mut b, anthropic_request(&token_b)).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    let error: Value = serde_json::from_str(&body).expect("json");
    assert_eq!(error["error"]["type"], "invalid_request_error");
    let message = error["error"]["message"].as_str().expect("message");
    assert!(
        message.contains("reached its budget stop limit ($0.0700 of $0.0500"),
        "{message}"
    );
    let mut c = client(h.relay("run-b").await).await;
    let (status, body) = send(&mut c, openai_request(&token_b)).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    let error: Value = serde_json::from_str(&body).expect("json");
    assert_eq!(error["error"]["code"], "budget_exceeded", "{body}");

    let ledger = h.ledger_when("run-b", |l| l.refused == 2).await;
    let stopped = ledger.stopped.expect("stopped recorded");
    let spend = 0.01 + 2.0 * ANTHROPIC_ANSWER_USD;
    assert!((stopped.spend_usd - spend).abs() < 1e-9, "{stopped:?}");
    assert!((stopped.stop_usd - 0.05).abs() < 1e-12);
    assert_eq!(ledger.requests, 2);

    // The request in flight was not cut: it ends normally and is counted.
    release.send(()).expect("the fake waits");
    let body = read_all(in_flight).await;
    assert!(body.contains("message_stop"), "{body}");
    let ledger = h.ledger_when("run-a", |l| l.requests == 1).await;
    assert!((ledger.usd - ANTHROPIC_ANSWER_USD).abs() < 1e-12);
    assert!(ledger.stopped.is_none());
    // And run-a's next one is refused too: the trace is over its limit.
    let (status, _) = send(&mut a, anthropic_request(&token_a)).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
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

#[tokio::test]
async fn connect_tunnels_to_an_allowed_ip_and_refuses_the_rest() {
    let h = Harness::start().await;
    let echo = echo_server().await;
    let token = h.grant("run-a", |g| {
        g.egress = Egress::Allow {
            hosts: vec![format!("127.0.0.1:{}", echo.port()), "pypi.org".into()],
        };
    });
    let relay = h.relay("run-a").await;
    let auth = proxy_auth(&token);

    let target = format!("127.0.0.1:{}", echo.port());
    let (head, mut tunnel) = raw(
        relay,
        &format!("CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n{auth}\r\n"),
    )
    .await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    tunnel
        .write_all(b"ping through the tunnel")
        .await
        .expect("write");
    let mut echoed = [0u8; 23];
    tunnel.read_exact(&mut echoed).await.expect("echo");
    assert_eq!(&echoed, b"ping through the tunnel");

    for _ in 0..2 {
        let (head, mut stream) = raw(
            relay,
            &format!(
                "CONNECT example.com:443 HTTP/1.1\r\nHost: example.com:443\r\n{auth}Connection: close\r\n\r\n"
            ),
        )
        .await;
        assert!(head.starts_with("HTTP/1.1 403"), "{head}");
        let mut body = String::new();
        let _ = stream.read_to_string(&mut body).await;
        assert!(
            body.contains("refused example.com:443") && body.contains("autopilot.sandbox.egress"),
            "{body}"
        );
    }
    let (head, _) = raw(
        relay,
        &format!("GET http://example.com/simple/ HTTP/1.1\r\nHost: example.com\r\n{auth}\r\n"),
    )
    .await;
    assert!(head.starts_with("HTTP/1.1 403"), "{head}");
    // Loopback by any other port than the listed one is refused, even by literal IP.
    let other = format!(
        "127.0.0.1:{}",
        h.anthropic.url.rsplit(':').next().expect("port")
    );
    let (head, _) = raw(
        relay,
        &format!("CONNECT {other} HTTP/1.1\r\nHost: {other}\r\n{auth}\r\n"),
    )
    .await;
    assert!(head.starts_with("HTTP/1.1 403"), "{head}");
    // No or a wrong proxy password: 407 with a challenge.
    for auth in [String::new(), proxy_auth("rover-run-wrong")] {
        let (head, _) = raw(
            relay,
            &format!("CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n{auth}\r\n"),
        )
        .await;
        assert!(head.starts_with("HTTP/1.1 407"), "{head}");
        assert!(
            head.to_ascii_lowercase()
                .contains("proxy-authenticate: basic"),
            "{head}"
        );
    }

    let ledger = h.ledger_when("run-a", |l| l.connections.len() == 4).await;
    let row = |host: &str, port: u16| {
        ledger
            .connections
            .iter()
            .find(|r| r.host == host && r.port == port)
            .unwrap_or_else(|| panic!("no row for {host}:{port}: {:?}", ledger.connections))
            .clone()
    };
    let allowed = row("127.0.0.1", echo.port());
    assert!(allowed.allowed && allowed.count == 1 && allowed.reason.is_none());
    let denied = row("example.com", 443);
    assert!(!denied.allowed);
    assert_eq!(denied.count, 2);
    assert!(
        denied
            .reason
            .as_deref()
            .is_some_and(|r| r.contains("allow list")),
        "{denied:?}"
    );
    let absolute = row("example.com", 80);
    assert!(!absolute.allowed && absolute.count == 1);
    assert_eq!(ledger.requests, 0);
}

#[tokio::test]
async fn absolute_form_http_is_forwarded_to_an_allowed_host() {
    let h = Harness::start().await;
    let app = Router::new().fallback(|headers: HeaderMap, uri: http::Uri| async move {
        format!(
            "path={} host={} proxy-auth={}",
            uri,
            headers
                .get("host")
                .and_then(|v| v.to_str().ok())
                .unwrap_or(""),
            headers.contains_key("proxy-authorization")
        )
    });
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let web = listener.local_addr().expect("addr");
    tokio::spawn(async move { axum::serve(listener, app).await });
    let token = h.grant("run-a", |g| {
        g.egress = Egress::Allow {
            hosts: vec![format!("127.0.0.1:{}", web.port())],
        };
    });
    let (head, mut stream) = raw(
        h.relay("run-a").await,
        &format!(
            "GET http://{web}/simple/x?q=1 HTTP/1.1\r\nHost: {web}\r\n{}Connection: close\r\n\r\n",
            proxy_auth(&token)
        ),
    )
    .await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    let mut body = String::new();
    let _ = stream.read_to_string(&mut body).await;
    assert!(
        body.contains(&format!("path=/simple/x?q=1 host={web} proxy-auth=false")),
        "{body}"
    );
}

#[tokio::test]
async fn model_only_egress_refuses_connect_to_the_model_host() {
    let h = Harness::start().await;
    let token = h.grant("run-a", |_| {});
    let model_host = h.anthropic.url.trim_start_matches("http://").to_owned();
    let (head, _) = raw(
        h.relay("run-a").await,
        &format!(
            "CONNECT {model_host} HTTP/1.1\r\nHost: {model_host}\r\n{}\r\n",
            proxy_auth(&token)
        ),
    )
    .await;
    assert!(head.starts_with("HTTP/1.1 403"), "{head}");
    let ledger = h.ledger_when("run-a", |l| !l.connections.is_empty()).await;
    let row = &ledger.connections[0];
    assert!(!row.allowed);
    assert!(
        row.reason
            .as_deref()
            .is_some_and(|r| r.contains("modelOnly")),
        "{row:?}"
    );
    assert!(h.anthropic.credentials().is_empty());
}

#[tokio::test]
async fn connections_without_a_valid_preamble_or_grant_are_refused() {
    let h = Harness::start().await;
    let token = h.grant("run-a", |_| {});
    for preamble in [
        "GET /anthropic/v1/messages HTTP/1.1\r\n\r\n".to_owned(),
        "ROVER-RUN ../etc\n".to_owned(),
        "ROVER-RUN no-such-run\n".to_owned(),
        "x".repeat(300),
    ] {
        let mut stream = UnixStream::connect(h.socket()).await.expect("connect");
        stream.write_all(preamble.as_bytes()).await.expect("write");
        let head = read_head(&mut stream).await;
        assert!(head.starts_with("HTTP/1.1 403"), "{preamble:?}: {head}");
        let mut rest = String::new();
        let _ = stream.read_to_string(&mut rest).await;
        assert!(rest.contains("refused this connection"), "{rest}");
    }
    // The server still serves good connections.
    let mut c = client(h.relay("run-a").await).await;
    let (status, _) = send(&mut c, anthropic_request(&token)).await;
    assert_eq!(status, StatusCode::OK);
}

#[tokio::test]
async fn a_client_gone_mid_stream_is_counted_with_what_was_seen() {
    let h = Harness::start().await;
    let token = h.grant("run-a", |_| {});
    let release = h.anthropic.hold_next();
    let mut c = client(h.relay("run-a").await).await;
    c.ready().await.expect("ready");
    let response = c
        .send_request(anthropic_request(&token))
        .await
        .expect("response");
    let mut body = response.into_body();
    let first = body.frame().await.expect("a frame").expect("no error");
    assert!(first.data_ref().is_some_and(|d| !d.is_empty()));
    drop(body);
    drop(c);
    let ledger = h.ledger_when("run-a", |l| l.requests == 1).await;
    // message_start said 1000 in and 1 out so far.
    assert_eq!((ledger.usage.input, ledger.usage.output), (1000, 1));
    assert!(ledger.bytes_down > 0);
    drop(release);
}

#[tokio::test]
async fn a_body_over_the_limit_is_refused_unread() {
    let h = Harness::start().await;
    let token = h.grant("run-a", |_| {});
    let (head, mut stream) = raw(
        h.relay("run-a").await,
        &format!(
            "POST /openai/v1/responses HTTP/1.1\r\nHost: relay\r\nAuthorization: Bearer {token}\r\nContent-Length: {}\r\n\r\n",
            MAX_REQUEST_BYTES + 1
        ),
    )
    .await;
    assert!(head.starts_with("HTTP/1.1 413"), "{head}");
    let mut buf = vec![0u8; 512];
    let n = stream.read(&mut buf).await.expect("the body");
    let body = String::from_utf8_lossy(&buf[..n]);
    assert!(body.contains("request_too_large"), "{body}");
    assert!(h.openai.credentials().is_empty());
}

#[tokio::test]
async fn an_https_upstream_starts_with_the_system_roots() {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = ProxyConfig {
        dir: dir.path().to_owned(),
        anthropic: Some(Upstream {
            base_url: "https://api.anthropic.com".into(),
            credential: Credential::OAuthToken("oat".into()),
        }),
        openai: None,
        prices: ProxyPrices::default(),
    };
    let listener = UnixListener::bind(dir.path().join(SOCKET_FILE)).expect("bind");
    let shutdown = CancellationToken::new();
    shutdown.cancel();
    serve(config.clone(), listener, shutdown.clone())
        .await
        .expect("native roots load here");
    let bad = ProxyConfig {
        anthropic: Some(Upstream {
            base_url: "https://api.anthropic.com".into(),
            credential: Credential::ApiKey("bad\nkey".into()),
        }),
        ..config
    };
    let listener = UnixListener::bind(dir.path().join("other.sock")).expect("bind");
    let err = serve(bad, listener, shutdown).await.expect_err("bad key");
    assert!(err.to_string().contains("anthropic credential"), "{err}");
}
