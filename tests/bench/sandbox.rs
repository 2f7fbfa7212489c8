//! Sandbox figures: how long a container and a whole agent run (its network, relay and
//! container) take to start with the image cached; a per-repository environment built cold and
//! resolved again cached; the model proxy's added latency per request and per streamed byte; and
//! how many live agent runs one machine holds before a new one starts twice as slowly.
//!
//! Everything the section makes carries the label of a project of its own and is removed at the
//! end, a failure or a panic included ([`Cleanup`]).

use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::http::Uri;
use chrono::Utc;
use http::Request;
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;
use rover::environment::{self, BuildRequest, EnvironmentSettings};
use rover::git::Workspace;
use rover::proxy::{
    new_token, token_sha256, Credential, Grant, GrantBudget, Provider, ProxyConfig, ProxyPrices,
    Upstream, SOCKET_FILE,
};
use rover::sandbox::image::RootfsImage;
use rover::sandbox::runnet::{ProxyServer, RunNetwork};
use rover::sandbox::{
    DockerSandbox, Egress, EgressMode, Sandbox, SandboxLabels, SandboxSettings, SandboxSpec,
};
use serde_json::json;
use tokio::net::{TcpListener, TcpStream, UnixListener};
use tokio_util::sync::CancellationToken;

use crate::percentiles;

use crate::support::flood;

/// Container starts per start-latency figure.
const STARTS: usize = 30;
/// Requests per proxy-latency figure.
const REQUESTS: usize = 300;
/// The body of the streamed response of the per-byte figure.
const STREAM_BYTES: usize = 64 << 20;
/// Starts of one more run at each number of live runs.
const CAPACITY_STARTS: usize = 5;
/// What Docker says when its address pools have no subnet left for another network.
const POOLS_EXHAUSTED: &str = "could not find an available, non-overlapping";

pub fn run() {
    println!(
        "\n== sandbox (containers, run networks, environments, the model proxy; load {})",
        std::fs::read_to_string("/proc/loadavg")
            .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
            .unwrap_or_default()
    );
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime");
    runtime.block_on(async {
        proxy_latency().await;
        let docker = match DockerSandbox::connect(Vec::new(), &rover::host_env::HostEnv::from_process()).await {
            Ok(docker) => docker,
            Err(e) => {
                println!("not measured: containers, environments and capacity (no Docker engine: {e}; run `bash tests/setup-docker.sh`)");
                return;
            }
        };
        let bench = Bench::new(docker).await;
        bench.start_latency().await;
        bench.environments().await;
        bench.capacity().await;
    });
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

// ---------------------------------------------------------------------------------------------
// The model proxy, in process: a fake Anthropic API, `relay` on 127.0.0.1 and `serve` on a unix
// socket, as the relay and server containers run them.

/// The run the proxy figures are measured for.
const RUN: &str = "rover-bench-run";
const UNBUDGETED_RUN: &str = "rover-bench-run-unbudgeted";
/// The real key the proxy adds (the fake API checks it).
const API_KEY: &str = "sk-ant-bench-key";

/// An Anthropic-shaped stream: `message_start` with usage, text deltas of `text` bytes each
/// making about `total` bytes in all (one delta when `total` is small), `message_delta` with
/// the output usage, `message_stop`. One chunk per event, as the API sends them.
fn anthropic_stream(total: usize) -> Vec<Bytes> {
    let event = |name: &str, data: serde_json::Value| {
        Bytes::from(format!("event: {name}\ndata: {data}\n\n"))
    };
    let delta = |text: String| {
        event(
            "content_block_delta",
            json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": text}}),
        )
    };
    let mut chunks = vec![event(
        "message_start",
        json!({"type": "message_start", "message": {"id": "msg_1", "model": "claude-sonnet-4-5",
            "usage": {"input_tokens": 1000, "cache_read_input_tokens": 0,
                      "cache_creation_input_tokens": 0, "output_tokens": 1}}}),
    )];
    if total < 64 << 10 {
        chunks.push(delta("hello".to_owned()));
    } else {
        let piece = delta("x".repeat(16 << 10));
        chunks.extend(std::iter::repeat_n(piece.clone(), total / piece.len()));
    }
    chunks.push(event(
        "message_delta",
        json!({"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": 1000}}),
    ));
    chunks.push(event("message_stop", json!({"type": "message_stop"})));
    chunks
}

/// The fake model API: checks the key, answers `anthropic_stream(?bytes=N)`.
async fn fake_anthropic() -> SocketAddr {
    let app = axum::Router::new().fallback(|uri: Uri, headers: axum::http::HeaderMap| async move {
        if headers.get("x-api-key").is_none_or(|k| k != API_KEY) {
            return axum::http::Response::builder()
                .status(401)
                .body(Body::from("wrong key"))
                .expect("a response");
        }
        // The answer's size comes in a header: the proxy forwards no query but the CLI's own.
        let _ = uri;
        let total = headers
            .get("x-bench-bytes")
            .and_then(|v| v.to_str().ok())
            .and_then(|n| n.parse().ok())
            .unwrap_or(0);
        let chunks = anthropic_stream(total);
        axum::http::Response::builder()
            .header("content-type", "text/event-stream")
            .body(Body::from_stream(futures_util::stream::iter(
                chunks.into_iter().map(Ok::<_, Infallible>),
            )))
            .expect("a response")
    });
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("an address");
    tokio::spawn(async move { axum::serve(listener, app).await });
    addr
}

/// One way to the fake API: its address, the path prefix and the key to send.
#[derive(Clone)]
struct Route {
    addr: SocketAddr,
    prefix: &'static str,
    key: String,
}

impl Route {
    fn request(&self, bytes: usize) -> Request<Full<Bytes>> {
        let body = json!({"model": "claude-sonnet-4-5", "max_tokens": 10, "stream": true,
            "messages": [{"role": "user", "content": "hi"}]});
        Request::post(format!("{}/v1/messages", self.prefix))
            .header("x-bench-bytes", bytes.to_string())
            .header("host", self.addr.to_string())
            .header("content-type", "application/json")
            .header("anthropic-version", "2023-06-01")
            .header("x-api-key", &self.key)
            .body(Full::new(Bytes::from(body.to_string())))
            .expect("a request")
    }

    async fn connect(&self) -> SendRequest<Full<Bytes>> {
        let stream = TcpStream::connect(self.addr).await.expect("connect");
        stream.set_nodelay(true).expect("nodelay");
        let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .expect("an HTTP handshake");
        tokio::spawn(conn);
        sender
    }
}

/// Sends `request` and reads the answer to its end; gives the bytes of its body.
async fn exchange(sender: &mut SendRequest<Full<Bytes>>, request: Request<Full<Bytes>>) -> usize {
    sender.ready().await.expect("the connection is ready");
    let response = sender.send_request(request).await.expect("an answer");
    assert_eq!(response.status(), 200, "the fake API answers");
    let mut body = response.into_body();
    let mut bytes = 0;
    while let Some(frame) = body.frame().await {
        if let Some(data) = frame.expect("a body frame").data_ref() {
            bytes += data.len();
        }
    }
    bytes
}

/// Request latencies in microseconds: `n` requests on one kept-alive connection, or each on a
/// connection of its own.
async fn request_latencies(route: &Route, n: usize, fresh: bool) -> Vec<f64> {
    let mut kept = route.connect().await;
    // Warm up: the proxy's pooled upstream connection, the page cache of the grant.
    for _ in 0..10 {
        exchange(&mut kept, route.request(0)).await;
    }
    let mut samples = Vec::with_capacity(n);
    for _ in 0..n {
        let t = Instant::now();
        if fresh {
            let mut sender = route.connect().await;
            exchange(&mut sender, route.request(0)).await;
        } else {
            exchange(&mut kept, route.request(0)).await;
        }
        samples.push(t.elapsed().as_secs_f64() * 1e6);
    }
    samples
}

/// The best of three transfers of a `STREAM_BYTES` answer on a kept-alive connection: seconds
/// and bytes.
async fn stream_time(route: &Route) -> (f64, usize) {
    let mut sender = route.connect().await;
    let mut best = f64::MAX;
    let mut bytes = 0;
    for _ in 0..3 {
        let t = Instant::now();
        bytes = exchange(&mut sender, route.request(STREAM_BYTES)).await;
        best = best.min(t.elapsed().as_secs_f64());
    }
    (best, bytes)
}

async fn proxy_latency() {
    let upstream = fake_anthropic().await;
    let dir = tempfile::tempdir().expect("a temp dir");
    let config = ProxyConfig {
        dir: dir.path().to_owned(),
        anthropic: Some(Upstream {
            base_url: format!("http://{upstream}"),
            credential: Credential::ApiKey(API_KEY.to_owned()),
        }),
        openai: None,
        prices: ProxyPrices::default(),
        daemon_dir: None,
    };
    let shutdown = CancellationToken::new();
    let socket = dir.path().join(SOCKET_FILE);
    let listener = UnixListener::bind(&socket).expect("bind the proxy socket");
    tokio::spawn(rover::proxy::serve(config, listener, shutdown.clone()));
    let token = new_token();
    // As the workflow step writes it, with a budget: each request also reads the trace's spend.
    Grant {
        run: RUN.to_owned(),
        trace_id: uuid::Uuid::new_v4(),
        token_sha256: token_sha256(&token),
        providers: vec![Provider::Anthropic],
        egress: rover::proxy::Egress::ModelOnly,
        budget: Some(GrantBudget {
            stop_usd: Some(1e9),
            ..GrantBudget::default()
        }),
        max_requests: None,
        codex_prices: None,
        ended: false,
        created_at: Utc::now(),
    }
    .save(dir.path())
    .expect("save the grant");
    // The same without a budget: no spend read, no reservation.
    let unbudgeted = new_token();
    Grant {
        run: UNBUDGETED_RUN.to_owned(),
        trace_id: uuid::Uuid::new_v4(),
        token_sha256: token_sha256(&unbudgeted),
        providers: vec![Provider::Anthropic],
        egress: rover::proxy::Egress::ModelOnly,
        budget: None,
        max_requests: None,
        codex_prices: None,
        ended: false,
        created_at: Utc::now(),
    }
    .save(dir.path())
    .expect("save the grant");
    let relay_listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let relay_addr = relay_listener.local_addr().expect("an address");
    tokio::spawn(rover::proxy::relay(
        relay_listener,
        socket.clone(),
        None,
        RUN.to_owned(),
        shutdown.clone(),
    ));
    let plain_listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let plain_addr = plain_listener.local_addr().expect("an address");
    tokio::spawn(rover::proxy::relay(
        plain_listener,
        socket,
        None,
        UNBUDGETED_RUN.to_owned(),
        shutdown.clone(),
    ));
    let direct = Route {
        addr: upstream,
        prefix: "",
        key: API_KEY.to_owned(),
    };
    let proxied = Route {
        addr: relay_addr,
        prefix: "/anthropic",
        key: token,
    };
    println!(
        "model proxy in process: a fake Anthropic API (SSE with usage, {} B), directly and through relay -> unix socket -> serve (grant with a budget, ledger written per answer)",
        anthropic_stream(0).iter().map(Bytes::len).sum::<usize>()
    );
    for (what, fresh) in [
        ("kept-alive connection", false),
        ("a fresh connection each", true),
    ] {
        let (d50, d99) = percentiles(request_latencies(&direct, REQUESTS, fresh).await);
        let (p50, p99) = percentiles(request_latencies(&proxied, REQUESTS, fresh).await);
        println!(
            "  request, {what:<24} direct p50 {d50:>6.0} us p99 {d99:>6.0} us   proxied p50 {p50:>6.0} us p99 {p99:>6.0} us   added p50 {:>6.0} us p99 {:>6.0} us   ({REQUESTS} requests each)",
            p50 - d50,
            p99 - d99
        );
    }
    let plain = Route {
        addr: plain_addr,
        prefix: "/anthropic",
        key: unbudgeted,
    };
    let (with_budget, _) = percentiles(request_latencies(&proxied, REQUESTS, false).await);
    let (without, _) = percentiles(request_latencies(&plain, REQUESTS, false).await);
    println!(
        "  the budget at the wire (the spend read and the worst case reserved under one lock, released after the ledger write): proxied p50 {with_budget:.0} us with a budget, {without:.0} us without: {:.0} us added ({REQUESTS} requests each, kept-alive)",
        with_budget - without
    );
    let (direct_s, bytes) = stream_time(&direct).await;
    let (proxied_s, proxied_bytes) = stream_time(&proxied).await;
    assert_eq!(bytes, proxied_bytes, "the proxy passes every byte");
    let mb = bytes as f64 / 1e6;
    println!(
        "  a {:.0} MiB SSE answer (16 KiB deltas), best of 3: direct {:>6.0} MB/s   proxied {:>6.0} MB/s   added {:.2} ns/byte",
        bytes as f64 / f64::from(1 << 20),
        mb / direct_s,
        mb / proxied_s,
        (proxied_s - direct_s) * 1e9 / bytes as f64
    );
    println!(
        "  (each proxied answer ends after the run's ledger is written durably: one atomic write here takes p50 {:.0} us)",
        crate::store::floor_only()
    );
    shutdown.cancel();
    proxy_flood().await;
}

/// The real proxy server process under one run's flood of large bodies (see
/// `tests/it/support/flood.rs`): its memory and another run's wait.
async fn proxy_flood() {
    let rover = std::path::Path::new(env!("CARGO_BIN_EXE_rover"));
    let f = flood::flood(rover, 24, 31 << 20).await;
    println!(
        "  a run's flood against the proxy server process: {} requests of 32 MiB, 31 MiB of each sent and held: {} turned away at once (429), resident memory {:.1} MiB before, peak {:.1} MiB (+{:.1} MiB; body budget {} MiB, a run's share {} MiB); another run's request answered {} in {:.1} ms",
        f.requests,
        f.too_many,
        f.rss_before_kib as f64 / 1024.0,
        f.rss_peak_kib as f64 / 1024.0,
        (f.rss_peak_kib - f.rss_before_kib) as f64 / 1024.0,
        rover::proxy::BODY_BUDGET_BYTES >> 20,
        rover::proxy::RUN_BODY_BYTES >> 20,
        f.other_status,
        f.other_ms
    );
}

// ---------------------------------------------------------------------------------------------
// Containers and run networks on the real engine.

/// Removes every container and network of the bench's project when dropped (a panic included).
pub(crate) struct Cleanup {
    pub(crate) project: String,
}

impl Cleanup {
    fn containers(label: &str) -> Vec<String> {
        let out = Command::new("docker")
            .args(["ps", "-aq", "--filter", &format!("label={label}")])
            .output();
        out.map(|o| {
            String::from_utf8_lossy(&o.stdout)
                .split_whitespace()
                .map(str::to_owned)
                .collect()
        })
        .unwrap_or_default()
    }
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        let p = &self.project;
        let mut ids = Self::containers(&format!("rover.project={p}"));
        ids.extend(Self::containers(&format!("rover.proxy.project={p}")));
        if !ids.is_empty() {
            let _ = Command::new("docker")
                .args(["rm", "-f"])
                .args(&ids)
                .output();
        }
        let networks = Command::new("docker")
            .args([
                "network",
                "ls",
                "-q",
                "--filter",
                &format!("label=rover.proxy.project={p}"),
            ])
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap_or_default();
        let networks: Vec<&str> = networks.split_whitespace().collect();
        if !networks.is_empty() {
            let _ = Command::new("docker")
                .args(["network", "rm"])
                .args(&networks)
                .output();
        }
    }
}

struct Bench {
    docker: DockerSandbox,
    project: String,
    /// The sandbox image: the real one, or the busybox test image.
    image: String,
    real_image: bool,
    /// rover's binary as an image, for the proxy server and the relays.
    proxy_image: String,
    /// The proxy dir, the worktree.
    dir: tempfile::TempDir,
    proxy_up: std::sync::atomic::AtomicBool,
    // Last: dropped after everything above.
    _cleanup: Cleanup,
}

impl Bench {
    async fn new(docker: DockerSandbox) -> Bench {
        let project = format!(
            "rover-bench-{}",
            &uuid::Uuid::new_v4().simple().to_string()[..8]
        );
        let cleanup = Cleanup {
            project: project.clone(),
        };
        let (image, real_image) = match std::env::var("ROVER_TEST_SANDBOX_IMAGE") {
            Ok(image) if !image.is_empty() => (image, true),
            _ => (
                RootfsImage::new("rover-sandbox-test")
                    .binary("/usr/bin/git", "/usr/bin/git")
                    .ensure(&docker)
                    .await
                    .expect("build the busybox test image"),
                false,
            ),
        };
        let t = Instant::now();
        let proxy_image = docker
            .proxy_image_of(Path::new(env!("CARGO_BIN_EXE_rover")))
            .await
            .expect("rover's binary as an image");
        println!(
            "sandbox image {image}{}; proxy image {proxy_image} (found or imported in {:.1} s)",
            if real_image {
                " (the real one)"
            } else {
                " (busybox; set ROVER_TEST_SANDBOX_IMAGE for the real one)"
            },
            t.elapsed().as_secs_f64()
        );
        let dir = tempfile::tempdir().expect("a temp dir");
        std::fs::create_dir_all(dir.path().join("worktree")).expect("a worktree");
        Bench {
            docker,
            project,
            image,
            real_image,
            proxy_image,
            dir,
            proxy_up: std::sync::atomic::AtomicBool::new(false),
            _cleanup: cleanup,
        }
    }

    fn proxy_dir(&self) -> PathBuf {
        self.dir.path().join("proxy")
    }

    /// A sandbox spec for `name`: `sleep` over the worktree, on `network`.
    fn spec(&self, name: &str, network: &str) -> SandboxSpec {
        let settings = SandboxSettings {
            image: self.image.clone(),
            memory_mb: 512,
            cpus: 1.0,
            egress: Egress::Mode(EgressMode::None),
            ..SandboxSettings::default()
        };
        let mut spec = SandboxSpec::from_settings(
            &settings,
            vec!["sleep".into(), "3600".into()],
            self.dir.path().join("worktree"),
            SandboxLabels {
                project: self.project.clone(),
                trace: "bench".into(),
                action: name.into(),
            },
        );
        spec.name = Some(name.to_owned());
        network.clone_into(&mut spec.network);
        spec
    }

    /// The proxy server up (once), as `connect_run` makes it.
    async fn ensure_proxy(&self) {
        if self.proxy_up.load(std::sync::atomic::Ordering::Relaxed) {
            return;
        }
        let t = Instant::now();
        self.docker
            .ensure_proxy(&ProxyServer {
                project: self.project.clone(),
                dir: self.proxy_dir(),
                image: self.proxy_image.clone(),
                env: Vec::new(),
            })
            .await
            .expect("the proxy server starts");
        println!(
            "proxy server container up (created, started, socket answering) in {:.0} ms",
            ms(t.elapsed())
        );
        self.proxy_up
            .store(true, std::sync::atomic::Ordering::Relaxed);
    }

    fn run_network(&self, run: &str) -> RunNetwork {
        RunNetwork {
            run: run.to_owned(),
            project: self.project.clone(),
            internal: true,
            proxy_dir: self.proxy_dir(),
            key: None,
            image: self.proxy_image.clone(),
            overlay: false,
        }
    }

    /// An agent run started as the workflow step starts one (the proxy already up): its
    /// network and relay, then its container on that network. Gives the time to the network
    /// and the whole time; on an error, what was made of it is removed.
    async fn start_run(&self, run: &str) -> Result<(Duration, Duration), String> {
        let t = Instant::now();
        let network = self
            .docker
            .open_run_network(&self.run_network(run))
            .await
            .map_err(|e| chain(&e))?;
        let to_network = t.elapsed();
        if let Err(e) = self.docker.run(&self.spec(run, &network)).await {
            let _ = self.docker.close_run_network(run).await;
            return Err(chain(&e));
        }
        Ok((to_network, t.elapsed()))
    }

    async fn stop_run(&self, run: &str) {
        self.docker.remove(run).await.expect("remove the container");
        self.docker
            .close_run_network(run)
            .await
            .expect("remove the run's network");
    }

    async fn start_latency(&self) {
        let mut samples = Vec::with_capacity(STARTS);
        for i in 0..STARTS {
            let name = format!("{}-c{i}", self.project);
            let spec = self.spec(&name, "none");
            let t = Instant::now();
            let id = self.docker.run(&spec).await.expect("a container starts");
            samples.push(ms(t.elapsed()));
            self.docker.remove(&id).await.expect("remove");
        }
        let (p50, p99) = percentiles(samples);
        println!(
            "container start, cached image, no network (`run()`: create + start)   p50 {p50:>5.0} ms   p99 {p99:>5.0} ms   ({STARTS} starts)"
        );
        self.ensure_proxy().await;
        let (mut nets, mut whole) = (Vec::new(), Vec::new());
        for i in 0..STARTS {
            let run = format!("{}-r{i}", self.project);
            let (to_network, all) = self.start_run(&run).await.expect("a run starts");
            nets.push(ms(to_network));
            whole.push(ms(all));
            self.stop_run(&run).await;
        }
        let (n50, n99) = percentiles(nets);
        let (p50, p99) = percentiles(whole);
        println!(
            "agent run start on the closed network (network + relay + container)   p50 {p50:>5.0} ms   p99 {p99:>5.0} ms   ({STARTS} starts; of it the network + relay p50 {n50:.0} ms, p99 {n99:.0} ms)"
        );
    }

    async fn environments(&self) {
        let Some(cli) = devcontainer_cli() else {
            println!("not measured: environment builds (no dev container CLI: run `bash tests/setup-clis.sh devcontainer`)");
            return;
        };
        if !self.real_image {
            println!("note: the environment is built over the busybox test image");
        }
        let setup: &[(&str, &[u8])] = &[(
            ".rover/setup.sh",
            b"set -e\nmkdir -p /opt/env\necho ready > /opt/env/marker\n",
        )];
        self.environment(".rover/setup.sh over the sandbox image", setup, &cli)
            .await;
        let base = debian_base();
        if image_exists(&base) {
            let config = json!({"name": "bench", "image": base}).to_string();
            let files: &[(&str, &[u8])] = &[(".devcontainer/devcontainer.json", config.as_bytes())];
            self.environment("a dev container (an image, agents copied in)", files, &cli)
                .await;
        } else {
            println!("not measured: a dev container environment (no {base}: run `bash tests/setup-sandbox-image.sh`)");
        }
    }

    /// One environment built cold (no image, no build cache of it) and resolved again.
    async fn environment(&self, what: &str, files: &[(&str, &[u8])], cli: &Path) {
        let root = tempfile::tempdir().expect("a temp dir");
        let checkout = repository(root.path(), files);
        let ws = Workspace::open(&checkout)
            .await
            .expect("open the checkout")
            .with_env("GIT_CONFIG_GLOBAL", "/dev/null")
            .with_env("GIT_CONFIG_NOSYSTEM", "1");
        let settings = SandboxSettings {
            image: self.image.clone(),
            environment: EnvironmentSettings {
                devcontainer_cli: cli.display().to_string(),
                build_timeout_secs: 600,
                ..EnvironmentSettings::default()
            },
            ..SandboxSettings::default()
        };
        remove_agents_stage_cache(&self.image);
        let host = rover::host_env::HostEnv::from_process();
        let resolve = || async {
            let definition = environment::define(&ws, &settings, &host)
                .await
                .expect("the definition reads")
                .expect("the repository declares an environment");
            environment::build(&BuildRequest {
                definition: &definition,
                agents_image: &self.image,
                settings: &settings.environment,
                project: &self.project,
                ws: &ws,
                dir: root.path().join("build"),
                store: None,
                progress: None,
                host: &host,
            })
            .await
            .unwrap_or_else(|e| panic!("{what}: {}; log in {:?}", e.1, e.0.log))
        };
        let t = Instant::now();
        let cold = resolve().await;
        let cold_s = t.elapsed().as_secs_f64();
        assert!(cold.built, "{what}: the first resolve builds");
        let _image = RemoveImage(cold.image.clone());
        if files.iter().any(|(path, _)| *path == ".rover/setup.sh") {
            let marker = Command::new("docker")
                .args(["run", "--rm", &cold.image, "cat", "/opt/env/marker"])
                .output()
                .expect("docker run");
            assert_eq!(
                String::from_utf8_lossy(&marker.stdout).trim(),
                "ready",
                "{what}: the setup ran"
            );
        }
        let mut cached = Vec::new();
        for _ in 0..5 {
            let t = Instant::now();
            let again = resolve().await;
            cached.push(ms(t.elapsed()));
            assert!(!again.built && again.image == cold.image, "{what}: cached");
        }
        let (c50, _) = percentiles(cached);
        println!(
            "environment {what:<46} cold build {cold_s:>5.1} s   cached (define + resolve, nothing built) p50 {c50:>4.0} ms   (1 cold, 5 cached)"
        );
    }

    async fn capacity(&self) {
        self.ensure_proxy().await;
        let most: usize = std::env::var("ROVER_BENCH_MAX_RUNS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(64);
        println!(
            "live agent runs (each a network + relay + `sleep` container) and the start of one more (network + relay + container, p50 of {CAPACITY_STARTS}):"
        );
        let mut live: Vec<String> = Vec::new();
        let mut first = None;
        let mut server_memory = None;
        let mut limit = None;
        let mut k = 0;
        'levels: while k <= most {
            while live.len() < k {
                let run = format!("{}-live{}", self.project, live.len());
                match self.start_run(&run).await {
                    Ok(_) => live.push(run),
                    Err(e) if e.contains(POOLS_EXHAUSTED) => {
                        limit = Some(live.len());
                        break 'levels;
                    }
                    Err(e) => panic!("a live run does not start: {e}"),
                }
            }
            let mut samples = Vec::with_capacity(CAPACITY_STARTS);
            for i in 0..CAPACITY_STARTS {
                let run = format!("{}-next{i}", self.project);
                match self.start_run(&run).await {
                    Ok((_, all)) => samples.push(ms(all)),
                    Err(e) if e.contains(POOLS_EXHAUSTED) => {
                        limit = Some(live.len());
                        break 'levels;
                    }
                    Err(e) => panic!("a run does not start: {e}"),
                }
                self.stop_run(&run).await;
            }
            let (p50, _) = percentiles(samples);
            let base = *first.get_or_insert(p50);
            let (containers, memory) = self.memory();
            let memory = memory / f64::from(1 << 20);
            let server = *server_memory.get_or_insert(memory);
            println!(
                "  K = {k:>2} live runs   one more starts in p50 {p50:>5.0} ms ({:.2}x K=0)   memory of the {containers} containers {memory:>6.1} MiB{}",
                p50 / base,
                if k == 0 {
                    " (the proxy server)".to_owned()
                } else {
                    format!(", {:.1} MiB a run", (memory - server) / k as f64)
                }
            );
            if p50 >= 2.0 * base {
                println!("  the start latency doubled at K = {k}");
                break;
            }
            k = if k < 8 { k + 4 } else { k + 8 };
        }
        if let Some(n) = limit {
            let others = user_networks() - n;
            println!(
                "  the engine refused network {}: \"{POOLS_EXHAUSTED} IPv4 address pool\"; with {others} other user network(s) on the engine, its default address pools held {} run networks: the limit is K = {n}, not memory or CPU",
                n + 1,
                n
            );
        } else if k > most {
            println!("  stopped at K = {most} without doubling");
        }
        for run in &live {
            self.stop_run(run).await;
        }
    }

    /// The containers of the bench's project and the memory they use (`docker stats`).
    fn memory(&self) -> (usize, f64) {
        let mut ids = Cleanup::containers(&format!("rover.project={}", self.project));
        ids.extend(Cleanup::containers(&format!(
            "rover.proxy.project={}",
            self.project
        )));
        let out = Command::new("docker")
            .args(["stats", "--no-stream", "--format", "{{.MemUsage}}"])
            .args(&ids)
            .output()
            .expect("docker stats");
        let total = String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter_map(|l| l.split('/').next().map(str::trim).and_then(parse_size))
            .sum();
        (ids.len(), total)
    }
}

/// `1.5MiB`, `812KiB`, `1.2GiB`, `0B` in bytes.
fn parse_size(text: &str) -> Option<f64> {
    let split = text.find(|c: char| c.is_ascii_alphabetic())?;
    let (number, unit) = text.split_at(split);
    let factor = match unit {
        "B" => 1.0,
        "KiB" | "kB" => 1024.0,
        "MiB" | "MB" => 1024.0 * 1024.0,
        "GiB" | "GB" => 1024.0 * 1024.0 * 1024.0,
        _ => return None,
    };
    number.parse::<f64>().ok().map(|n| n * factor)
}

/// User-defined networks on the engine (not `bridge`, `host`, `none`).
fn user_networks() -> usize {
    Command::new("docker")
        .args(["network", "ls", "-q", "--filter", "type=custom"])
        .output()
        .map_or(0, |o| {
            String::from_utf8_lossy(&o.stdout)
                .split_whitespace()
                .count()
        })
}

/// An error and its causes on one line.
fn chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

/// Removes an environment image when dropped.
struct RemoveImage(String);

impl Drop for RemoveImage {
    fn drop(&mut self) {
        let _ = environment::gc::remove(&self.0);
    }
}

/// The dev container CLI `tests/setup-clis.sh devcontainer` installs, if it is there.
fn devcontainer_cli() -> Option<PathBuf> {
    if let Some(path) = std::env::var_os("ROVER_TEST_DEVCONTAINER_BIN").filter(|p| !p.is_empty()) {
        return Some(path.into());
    }
    let home = std::env::var_os("HOME").map_or_else(|| "/root".into(), PathBuf::from);
    let cached =
        home.join(".cache/rover-test-clis/devcontainer-0.89.0/node_modules/.bin/devcontainer");
    cached.exists().then_some(cached)
}

/// The Debian base `tests/setup-sandbox-image.sh` imports (as tests/it/environments.rs names it).
fn debian_base() -> String {
    use sha2::Digest as _;
    let digest = sha2::Sha256::digest(b"bookworm minbase git,ca-certificates\n");
    let hex = digest.iter().fold(String::new(), |mut hex, b| {
        use std::fmt::Write as _;
        let _ = write!(hex, "{b:02x}");
        hex
    });
    format!("local/bookworm-minbase:{}", &hex[..12])
}

fn image_exists(image: &str) -> bool {
    Command::new("docker")
        .args(["image", "inspect", image])
        .output()
        .is_ok_and(|o| o.status.success())
}

/// The build cache a dev container environment's build leaves besides its image: the stage
/// that copies the agent CLIs out of the sandbox image (the classic builder keeps it as an
/// untagged intermediate image, a child of the sandbox image). Removed so the build is cold.
fn remove_agents_stage_cache(agents_image: &str) {
    let Ok(parent) = Command::new("docker")
        .args(["image", "inspect", "--format", "{{.Id}}", agents_image])
        .output()
    else {
        return;
    };
    let parent = String::from_utf8_lossy(&parent.stdout).trim().to_owned();
    let all = Command::new("docker")
        .args(["images", "-aq", "--no-trunc"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default();
    let ids: Vec<&str> = all.split_whitespace().collect();
    if ids.is_empty() {
        return;
    }
    let inspected = Command::new("docker")
        .args([
            "image",
            "inspect",
            "--format",
            "{{.Id}} {{.Parent}} {{json .ContainerConfig.Cmd}}",
        ])
        .args(&ids)
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default();
    for line in inspected.lines() {
        let mut words = line.splitn(3, ' ');
        let (Some(id), Some(of), Some(cmd)) = (words.next(), words.next(), words.next()) else {
            continue;
        };
        if of == parent && cmd.contains("/rover-agents") {
            let _ = Command::new("docker").args(["image", "rm", id]).output();
        }
    }
}

fn git(dir: &Path, args: &[&str]) {
    let out = Command::new("git")
        .args(args)
        .current_dir(dir)
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .output()
        .expect("git runs");
    assert!(
        out.status.success(),
        "git {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A checkout whose `origin/main` holds `files`.
pub(crate) fn repository(root: &Path, files: &[(&str, &[u8])]) -> PathBuf {
    git(root, &["init", "-q", "--bare", "-b", "main", "origin.git"]);
    let checkout = root.join("checkout");
    std::fs::create_dir_all(&checkout).expect("a checkout dir");
    git(&checkout, &["init", "-q", "-b", "main"]);
    for (path, bytes) in files {
        let path = checkout.join(path);
        std::fs::create_dir_all(path.parent().expect("a parent")).expect("dirs");
        std::fs::write(path, bytes).expect("write");
    }
    git(&checkout, &["add", "-A"]);
    git(
        &checkout,
        &[
            "-c",
            "user.name=b",
            "-c",
            "user.email=b@b",
            "commit",
            "-q",
            "-m",
            "environment",
        ],
    );
    let origin = root.join("origin.git");
    git(
        &checkout,
        &[
            "remote",
            "add",
            "origin",
            origin.to_str().expect("a utf-8 path"),
        ],
    );
    git(&checkout, &["push", "-q", "origin", "main"]);
    git(&checkout, &["fetch", "-q", "origin"]);
    checkout
}
