//! A flood of large model requests from one run against the real proxy server process
//! (`rover autopilot proxy serve`), with another run's request in the middle of it: what the
//! server's memory peaked at, how many of the flood were turned away at once, and how long the
//! other run waited. Shared by the integration test and the bench (`#[path]`).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::UnixStream;

/// What one flood measured.
#[derive(Debug, Clone)]
pub struct Flood {
    /// The server's resident memory before the flood and its peak (VmHWM) after it, KiB.
    pub rss_before_kib: u64,
    pub rss_peak_kib: u64,
    /// Flood requests answered `429` before their bodies (past the run's requests in flight).
    pub too_many: usize,
    /// The flood requests in all.
    pub requests: usize,
    /// The other run's request: its status and the time to its whole answer.
    pub other_status: u16,
    pub other_ms: f64,
}

const KEY: &str = "sk-ant-flood-test-key";

/// An upstream that answers any request with a short SSE answer once it has read its body.
async fn upstream() -> std::net::SocketAddr {
    let app = axum::Router::new().fallback(|body: axum::body::Bytes| async move {
        let _ = body.len();
        let events = concat!(
            "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"m\",\"model\":\"claude-test\",\"usage\":{\"input_tokens\":10,\"output_tokens\":1}}}\n\n",
            "event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\"},\"usage\":{\"output_tokens\":5}}\n\n",
            "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n"
        );
        axum::http::Response::builder()
            .header("content-type", "text/event-stream")
            .body(axum::body::Body::from(events))
            .expect("a response")
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move { axum::serve(listener, app).await });
    addr
}

/// Kills the server when dropped.
struct Server(std::process::Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn status_kib(pid: u32, field: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

fn grant(dir: &Path, run: &str, token: &str) {
    rover::proxy::Grant {
        run: run.to_owned(),
        trace_id: uuid::Uuid::new_v4(),
        token_sha256: rover::proxy::token_sha256(token),
        providers: vec![rover::proxy::Provider::Anthropic],
        egress: rover::proxy::Egress::ModelOnly,
        budget: None,
        max_requests: None,
        codex_prices: None,
        ended: false,
        created_at: chrono::Utc::now(),
    }
    .save(dir)
    .expect("a grant");
}

async fn connect(socket: &Path, run: &str) -> UnixStream {
    let mut stream = UnixStream::connect(socket).await.expect("connect");
    stream
        .write_all(rover::proxy::preamble(None, run).as_bytes())
        .await
        .expect("preamble");
    stream
}

/// Floods a real proxy server with `requests` requests of just under 32 MiB from one run, each
/// sending `sent` bytes of its body and holding the rest, then times another run's request.
pub async fn flood(rover: &Path, requests: usize, sent: usize) -> Flood {
    let api = upstream().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let child = std::process::Command::new(rover)
        .args(["autopilot", "proxy", "serve", "--dir"])
        .arg(dir.path())
        .env_clear()
        .env(rover::proxy::env::ANTHROPIC_URL, format!("http://{api}"))
        .env(rover::proxy::env::ANTHROPIC_KEY, KEY)
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("rover autopilot proxy serve");
    let pid = child.id();
    let _server = Server(child);
    let socket: PathBuf =
        rover::sandbox::runnet::socket_dir(dir.path()).join(rover::proxy::SOCKET_FILE);
    for _ in 0..500 {
        if UnixStream::connect(&socket).await.is_ok() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    grant(dir.path(), "run-flood", "rover-run-flood");
    grant(dir.path(), "run-other", "rover-run-other");
    let rss_before_kib = status_kib(pid, "VmRSS:");

    let head = format!(
        "POST /anthropic/v1/messages HTTP/1.1\r\nHost: rover-proxy\r\nx-api-key: rover-run-flood\r\nContent-Length: {}\r\n\r\n",
        rover::proxy::MAX_REQUEST_BYTES - 1
    );
    let mut streams = Vec::new();
    for _ in 0..requests {
        let mut stream = connect(&socket, "run-flood").await;
        stream.write_all(head.as_bytes()).await.expect("head");
        streams.push(stream);
    }
    // The refusals come at once; all streams are read together, each for up to 3 s (a loaded
    // machine answered some later than the 300 ms one read at a time allowed).
    let answers =
        futures_util::future::join_all(streams.into_iter().map(|mut stream| async move {
            let mut first = [0u8; 12];
            let refused =
                match tokio::time::timeout(Duration::from_secs(3), stream.read(&mut first)).await {
                    Ok(Ok(n)) => first[..n].starts_with(b"HTTP/1.1 429"),
                    _ => false,
                };
            (stream, refused)
        }))
        .await;
    let too_many = answers.iter().filter(|(_, refused)| *refused).count();
    let mut held: Vec<_> = answers
        .into_iter()
        .filter(|(_, refused)| !refused)
        .map(|(stream, _)| stream)
        .collect();
    // The held ones send `sent` bytes each, as far as the server reads them within 3 s.
    let chunk = vec![b'{'; 1 << 20];
    let deadline = Instant::now() + Duration::from_secs(3);
    let writes = held.iter_mut().map(|stream| {
        let chunk = &chunk;
        async move {
            let mut left = sent;
            while left > 0 && Instant::now() < deadline {
                let n = left.min(chunk.len());
                match tokio::time::timeout_at(deadline.into(), stream.write_all(&chunk[..n])).await
                {
                    Ok(Ok(())) => left -= n,
                    _ => break,
                }
            }
        }
    });
    futures_util::future::join_all(writes).await;

    // Another run's request in the middle of it.
    let started = Instant::now();
    let mut other = connect(&socket, "run-other").await;
    let body = r#"{"model":"claude-test","max_tokens":10,"stream":true,"messages":[{"role":"user","content":"hi"}]}"#;
    other
        .write_all(
            format!(
                "POST /anthropic/v1/messages HTTP/1.1\r\nHost: rover-proxy\r\nx-api-key: rover-run-other\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            )
            .as_bytes(),
        )
        .await
        .expect("the other request");
    let mut answer = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(30), other.read_to_end(&mut answer)).await;
    let other_ms = started.elapsed().as_secs_f64() * 1e3;
    let text = String::from_utf8_lossy(&answer);
    let other_status = text
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let rss_peak_kib = status_kib(pid, "VmHWM:");
    drop(held);
    Flood {
        rss_before_kib,
        rss_peak_kib,
        too_many,
        requests,
        other_status,
        other_ms,
    }
}
