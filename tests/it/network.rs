//! The sandbox's closed network, tried from inside a running sandbox by the real claude CLI as
//! the workflow agent (against the fake model API): with the default egress (`model-only`) the
//! model API is reached through rover's proxy and nothing else is: not the host (by its
//! loopback through the proxy, by its bridge or LAN address directly), not another container,
//! not an arbitrary address, not a host name; every attempt through the proxy is recorded as
//! denied in the workflow span; and the model key is in no environment variable, process
//! argument or file the container can see.

use std::fmt::Write as _;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use serde_json::json;

use crate::real_cli::{cli_env, json_flag_answers, real_codex_env, real_sandbox_image};
use crate::support::fake_anthropic::{FakeAnthropic, Reply};
use crate::support::fake_openai::{FakeOpenAi, Reply as OpenAiReply};
use crate::support::pipeline::first_span;
use crate::support::scenario::{chain, merge, Scenario};

/// The keys rover holds in these tests (see `cli_env` and `real_codex_env`); the probe looks
/// for this part of either, built at run time so its own command line does not hold it.
const CLAUDE_KEY: &str = "sk-ant-api03-fake-key-for-tests";
const CODEX_KEY: &str = "sk-proj-fake-key-for-tests-0123456789";

/// Which real CLI is the workflow agent, with its fake model API.
enum Api {
    Claude(FakeAnthropic),
    Codex(FakeOpenAi),
}

impl Api {
    /// A scenario whose workflow agent (the real CLI in the real sandbox image) runs `script`
    /// with its shell tool (twice when `commands` has two), each answer reporting
    /// `input_tokens`; the other steps answer "add a --json flag".
    async fn start(codex: bool, commands: &[String], input_tokens: u64, s: &mut Scenario) -> Api {
        let image = real_sandbox_image();
        let answer = json!({"status": "completed", "summary": "Ran the commands.", "files_changed": ["probe.txt"]});
        let config = if codex {
            let tools: Vec<_> = commands
                .iter()
                .map(|c| json!({"name": "exec_command", "arguments": {"cmd": c, "yield_time_ms": 120_000}}))
                .collect();
            let workflow =
                json!({"__input_tokens": input_tokens, "__tools": tools, "answer": answer});
            let api = FakeOpenAi::start(vec![OpenAiReply::ByPrompt(json_flag_answers(Some(
                workflow,
            )))])
            .await;
            real_codex_env(&api, s);
            merge(
                &mut s.extra_config,
                &json!({"autopilot": {"agent": {"agent": "codex"}}}),
            );
            Api::Codex(api)
        } else {
            let tools: Vec<_> = commands
                .iter()
                .map(|c| json!({"name": "Bash", "input": {"command": c, "description": "run it", "timeout": 120_000}}))
                .collect();
            let workflow =
                json!({"__input_tokens": input_tokens, "__tools": tools, "answer": answer});
            let api =
                FakeAnthropic::scripted(vec![Reply::BySystem(json_flag_answers(Some(workflow)))])
                    .await;
            let home = s.env.path().join("home");
            std::fs::create_dir_all(&home).unwrap();
            s.env_vars.extend(cli_env(&api, &home));
            s.env_vars.push((
                "ROVER_CLAUDE_BIN".into(),
                crate::proof::escape::real_claude().display().to_string(),
            ));
            merge(
                &mut s.extra_config,
                &json!({"autopilot": {"agent": {"extraEnv": ["CLAUDE_CODE_MAX_RETRIES"]}}}),
            );
            Api::Claude(api)
        };
        merge(
            &mut s.extra_config,
            &json!({"autopilot": {"sandbox": {"image": image, "memoryMb": 2048, "cpus": 1.0, "timeoutSecs": 300,
                "envAllow": ["CLAUDE_CODE_MAX_RETRIES", "IS_SANDBOX"]}}}),
        );
        s.github
            .add_issue(81, "Add a --json flag", "Please add --json.", "alice", &[]);
        s.github.seed_event("IssuesEvent", "alice", json!({"action": "opened", "issue": {"number": 81, "title": "Add a --json flag", "body": "Please add --json.", "user": {"login": "alice"}}}));
        config
    }

    /// The key rover holds for this CLI.
    fn key(&self) -> &'static str {
        match self {
            Api::Claude(_) => CLAUDE_KEY,
            Api::Codex(_) => CODEX_KEY,
        }
    }

    /// The path of every request the API got.
    fn all_paths(&self) -> Vec<String> {
        match self {
            Api::Claude(api) => api.requests().into_iter().map(|r| r.path).collect(),
            Api::Codex(api) => api.requests().into_iter().map(|r| r.path).collect(),
        }
    }

    /// The calls the workflow agent made (method and path, as the API got them through the
    /// proxy): those whose prompt is the workflow agent's.
    fn workflow_calls(&self) -> Vec<(String, String)> {
        const ROLE: &str = "Role: rover workflow agent";
        match self {
            Api::Claude(api) => api
                .requests()
                .into_iter()
                .filter(|r| r.body.to_string().contains(ROLE))
                .map(|r| (r.method, r.path))
                .collect(),
            Api::Codex(api) => api
                .requests()
                .into_iter()
                .filter(|r| r.body.to_string().contains(ROLE))
                .map(|r| (r.method, r.path))
                .collect(),
        }
    }

    /// The credential of every model request the API got, and whether the workflow agent sent it.
    fn model_requests(&self) -> Vec<(Option<String>, bool)> {
        const ROLE: &str = "Role: rover workflow agent";
        match self {
            Api::Claude(api) => api
                .requests()
                .into_iter()
                .filter(|r| r.path == "/v1/messages")
                .map(|r| (r.key, r.body["system"].to_string().contains(ROLE)))
                .collect(),
            Api::Codex(api) => api
                .responses_requests()
                .into_iter()
                .map(|r| (r.key, r.body.to_string().contains(ROLE)))
                .collect(),
        }
    }
}

/// A TCP listener on `addr` that counts the connections it accepts.
async fn counting_listener(addr: &str) -> (SocketAddr, Arc<AtomicUsize>) {
    let listener = tokio::net::TcpListener::bind(addr).await.unwrap();
    let local = listener.local_addr().unwrap();
    let count = Arc::new(AtomicUsize::new(0));
    let seen = count.clone();
    tokio::spawn(async move {
        while let Ok((_stream, _)) = listener.accept().await {
            seen.fetch_add(1, Ordering::SeqCst);
        }
    });
    (local, count)
}

/// The first address of this host that is neither loopback nor a Docker bridge's.
fn host_lan_ip() -> Option<String> {
    let out = std::process::Command::new("hostname")
        .arg("-I")
        .output()
        .ok()?;
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .find(|ip| !ip.starts_with("172.") && !ip.contains(':'))
        .map(str::to_owned)
}

/// Removes a container when dropped (a failed assertion included).
struct Removed(String);

impl Drop for Removed {
    fn drop(&mut self) {
        let _ = std::process::Command::new("docker")
            .args(["rm", "-f", &self.0])
            .output();
    }
}

/// Another container, on Docker's default bridge, that accepts TCP on port 9000 (rover's relay
/// mode, pointed at a socket that does not exist): it, and its address.
fn other_container(image: &str) -> (Removed, String) {
    let name = format!("rover-net-peer-{}", uuid::Uuid::new_v4().simple());
    let rover = env!("CARGO_BIN_EXE_rover");
    let run = std::process::Command::new("docker")
        .args(["run", "-d", "--name", &name, "-v"])
        .arg(format!("{rover}:/usr/local/bin/rover-peer:ro"))
        .args([
            image,
            "/usr/local/bin/rover-peer",
            "autopilot",
            "proxy",
            "relay",
            "--run",
            "peer",
            "--socket",
            "/nonexistent.sock",
            "--listen",
            "0.0.0.0:9000",
        ])
        .output()
        .unwrap();
    assert!(
        run.status.success(),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
    let ip = std::process::Command::new("docker")
        .args(["inspect", "-f", "{{.NetworkSettings.IPAddress}}", &name])
        .output()
        .unwrap();
    let ip = String::from_utf8_lossy(&ip.stdout).trim().to_owned();
    let peer = Removed(name);
    assert!(!ip.is_empty(), "the peer container has an address");
    (peer, ip)
}

/// `api METHOD PATH`: the run's token sent to another call of the model API through the proxy,
/// as a prompt-injected agent would; the status line goes to `$out`.
const API_CALL_SH: &str = r#"tok=${ANTHROPIC_API_KEY:-$CODEX_API_KEY}
api() {
  if exec 4<>/dev/tcp/rover-proxy/8080; then
    printf '%s %s HTTP/1.1\r\nHost: rover-proxy\r\nx-api-key: %s\r\nAuthorization: Bearer %s\r\nContent-Type: application/json\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}' "$1" "$2" "$tok" "$tok" >&4
    IFS= read -r -t 20 line <&4
    echo "api $1 $2 ${line%$'\r'}" >> "$out"
    exec 4<&-
  else
    echo "api $1 $2 unreachable" >> "$out"
  fi
}
"#;

/// The probe the agent runs with its Bash tool: raw connections, the same destinations
/// through the proxy (as any `HTTPS_PROXY` client asks), a name lookup, a control that must
/// connect, and what of the container could hold the key.
fn probe_script(
    targets: &[(&str, String)],
    via_proxy: &[(&str, String)],
    api_calls: &[(&str, &str)],
) -> String {
    // Quick enough for a CLI's shell tool (codex waits about 30 s): the raw tries in parallel.
    let mut s = String::from(
        r#"set +e
out=/workspace/probe.txt
: > "$out"
for f in /proc/[0-9]*/environ /proc/[0-9]*/cmdline; do tr '\0' '\n' < "$f" 2>/dev/null; echo; done > /workspace/procdump.txt
n1=fake-key; n2=-for-tests
# What is written at run time (the image was built before any key existed), every mount
# included: /tmp (HOME), /workspace, /rover*, /etc (the engine's hosts and resolv.conf), /run.
grep -rlF "$n1$n2" /tmp /workspace /rover /rover-git /rover-git-objects /etc /run /home /root /var/tmp 2>/dev/null > /workspace/keyfiles.txt
cat /proc/self/mountinfo > /workspace/mounts.txt
raw() { if timeout 3 bash -c "exec 3<>/dev/tcp/$2/$3" 2>/dev/null; then echo "raw $1 open" > "/tmp/raw-$1"; else echo "raw $1 closed" > "/tmp/raw-$1"; fi; }
token=${HTTPS_PROXY#http://rover:}; token=${token%@*}
auth=$(printf 'rover:%s' "$token" | base64 -w0)
proxied() {
  if exec 3<>/dev/tcp/rover-proxy/8080; then
    printf 'CONNECT %s HTTP/1.1\r\nHost: %s\r\nProxy-Authorization: Basic %s\r\n\r\n' "$2" "$2" "$auth" >&3
    IFS= read -r -t 10 line <&3
    echo "proxy $1 ${line%$'\r'}" >> "$out"
    exec 3<&-
  else
    echo "proxy $1 unreachable" >> "$out"
  fi
}
"#,
    );
    for (name, target) in targets {
        let (host, port) = target.rsplit_once(':').unwrap();
        let _ = writeln!(s, "raw {name} {host} {port} &");
    }
    s.push_str("wait\ncat /tmp/raw-* >> \"$out\"\n");
    for (name, target) in via_proxy {
        let _ = writeln!(s, "proxied {name} {target}");
    }
    // The run's token sent to the model API's other calls, as a prompt-injected agent would.
    s.push_str(API_CALL_SH);
    for (method, path) in api_calls {
        let _ = writeln!(s, "api {method} {path}");
    }
    s.push_str(
        r#"if timeout 5 getent hosts example.com >/dev/null 2>&1; then echo "dns example.com resolved" >> "$out"; else echo "dns example.com failed" >> "$out"; fi
if timeout 5 getent hosts rover-proxy >/dev/null 2>&1; then echo "dns rover-proxy resolved" >> "$out"; else echo "dns rover-proxy failed" >> "$out"; fi
for name in leak-probe.example.org localhost.leak-probe; do timeout 3 getent hosts "$name" >/dev/null 2>&1; done
echo done >> "$out"
"#,
    );
    s
}

#[tokio::test]
async fn from_inside_the_real_claude_sandbox_only_the_model_api_is_reachable_and_the_key_is_nowhere(
) {
    probe_the_closed_network(false).await;
}

#[tokio::test]
async fn from_inside_the_real_codex_sandbox_only_the_model_api_is_reachable_and_the_key_is_nowhere()
{
    probe_the_closed_network(true).await;
}

/// A DNS resolver on the host's loopback (127.0.0.1:53), where an engine without the fix for
/// CVE-2024-29018 forwards an internal network's lookups when the host's resolver is there:
/// the queries it received (from any test of this binary). Started once.
fn host_resolver() -> Arc<AtomicUsize> {
    static SEEN: std::sync::OnceLock<Arc<AtomicUsize>> = std::sync::OnceLock::new();
    SEEN.get_or_init(|| {
        let socket = std::net::UdpSocket::bind("127.0.0.1:53")
            .expect("the test resolver binds 127.0.0.1:53 (free on the test machine; run as root)");
        let seen = Arc::new(AtomicUsize::new(0));
        let count = seen.clone();
        std::thread::spawn(move || {
            let mut buf = [0u8; 1500];
            while let Ok((n, from)) = socket.recv_from(&mut buf) {
                eprintln!("the host's loopback resolver got {n} bytes from {from}");
                count.fetch_add(1, Ordering::SeqCst);
            }
        });
        seen
    })
    .clone()
}

async fn probe_the_closed_network(codex: bool) {
    let _resolver = host_resolver();
    let image = real_sandbox_image();
    let (public, public_hits) = counting_listener("0.0.0.0:0").await;
    let (loopback, loopback_hits) = counting_listener("127.0.0.1:0").await;
    let (peer, peer_ip) = other_container(&image);
    let lan = host_lan_ip();
    let mut targets = vec![
        ("host-bridge", format!("172.17.0.1:{}", public.port())),
        ("other-container", format!("{peer_ip}:9000")),
        ("arbitrary", "1.1.1.1:80".to_owned()),
        ("control-relay", "rover-proxy:8080".to_owned()),
    ];
    if let Some(ip) = &lan {
        targets.push(("host-lan", format!("{ip}:{}", public.port())));
    }
    let via_proxy = vec![
        ("host-loopback", format!("127.0.0.1:{}", loopback.port())),
        ("host-bridge", format!("172.17.0.1:{}", public.port())),
        ("other-container", format!("{peer_ip}:9000")),
        ("arbitrary", "1.1.1.1:80".to_owned()),
        ("name", "example.com:443".to_owned()),
        ("model-host", "api.anthropic.com:443".to_owned()),
    ];
    // What the key would open upstream, and the token must not.
    let api_calls: &[(&str, &str)] = if codex {
        &[
            ("GET", "/openai/files"),
            ("GET", "/openai/batches"),
            ("POST", "/openai/batches"),
            ("GET", "/openai/organization/admin_api_keys"),
        ]
    } else {
        &[
            ("GET", "/anthropic/v1/files"),
            ("GET", "/anthropic/v1/messages/batches"),
            ("POST", "/anthropic/v1/messages/batches"),
            ("GET", "/anthropic/v1/organizations/api_keys"),
        ]
    };
    let script = probe_script(&targets, &via_proxy, api_calls);
    let mut s = Scenario::new().await;
    let api = Api::start(codex, &[script], 12, &mut s).await;
    s.run_until_settled(40).await;
    drop(peer);
    let trace = s.the_trace();
    let workflow = first_span(&trace, "workflow");
    assert_eq!(
        workflow.status.to_string(),
        "completed",
        "{:?}",
        workflow.meta
    );
    assert_eq!(
        chain(&trace).last().map(String::as_str),
        Some("notify:completed")
    );
    let push = first_span(&trace, "push");
    let branch = push.meta["branch"].as_str().unwrap();
    let shipped = |file: &str| crate::support::gitrepo::show(&s.origin, branch, file);
    let probe = shipped("probe.txt");
    eprintln!("what the sandbox saw:\n{probe}");
    assert!(probe.ends_with("done"), "{probe}");
    // The probe can tell: the relay, the one member of its network, answers.
    assert!(probe.contains("raw control-relay open"), "{probe}");
    for (name, _) in &targets {
        if *name != "control-relay" {
            assert!(
                probe.contains(&format!("raw {name} closed")),
                "{name}: {probe}"
            );
        }
    }
    for (name, _) in &via_proxy {
        assert!(
            probe.contains(&format!("proxy {name} HTTP/1.1 403")),
            "{name}: {probe}"
        );
    }
    assert!(probe.contains("dns example.com failed"), "{probe}");
    assert!(probe.contains("dns rover-proxy resolved"), "{probe}");
    assert_eq!(
        host_resolver().load(Ordering::SeqCst),
        0,
        "a name lookup from the sandbox reached the resolver on the host's loopback"
    );
    for (method, path) in api_calls {
        assert!(
            probe.contains(&format!("api {method} {path} HTTP/1.1 403")),
            "{method} {path}: {probe}"
        );
    }
    assert_eq!(
        public_hits.load(Ordering::SeqCst),
        0,
        "the host's service was reached"
    );
    assert_eq!(
        loopback_hits.load(Ordering::SeqCst),
        0,
        "the host's loopback was reached"
    );

    // `trace` lists them under the workflow.
    let tree = crate::support::env::stdout(&s.env.rover(&[
        "autopilot",
        "trace",
        &trace.trace_id().to_string(),
    ]));
    eprintln!("{tree}");
    assert!(
        tree.contains("network: model-only;")
            && tree.contains("denied: ")
            && tree.contains("example.com:443 ×1"),
        "{tree}"
    );
    // Every attempt through the proxy is in the span, denied, once.
    let wire = &workflow.meta["network"];
    let rows = wire["connections"].as_array().unwrap();
    for (name, target) in &via_proxy {
        let (host, port) = target.rsplit_once(':').unwrap();
        let row = rows
            .iter()
            .find(|r| r["host"] == host && r["port"] == port.parse::<u16>().unwrap())
            .unwrap_or_else(|| panic!("{name} ({target}) is not recorded: {wire}"));
        assert_eq!(row["allowed"], false, "{row}");
        assert_eq!(row["count"], 1, "{row}");
    }
    assert!(rows.iter().all(|r| r["allowed"] == false), "{wire}");
    // The agent asked the model through the proxy: for its tool, then after it.
    assert!(wire["requests"].as_u64().unwrap() >= 2, "{wire}");
    // Each of them counted under the model it named (the dashboard's spend by model).
    let by_model = wire["byModel"].as_object().expect("the responses by model");
    let counted: u64 = by_model
        .values()
        .map(|m| m["requests"].as_u64().unwrap())
        .sum();
    assert_eq!(counted, wire["requests"].as_u64().unwrap(), "{wire}");
    assert!(!by_model.contains_key("unknown"), "{wire}");
    let requests = api.model_requests();
    // The token's other calls were refused and recorded, and never reached the API; every call
    // the real CLI made is one of the proxy's routes (and none of its own was refused).
    let refusals = wire["refusals"].to_string();
    for (method, path) in api_calls {
        assert!(
            refusals.contains(&format!("not {method} {path}")),
            "{method} {path}: {refusals}"
        );
    }
    let provider = if codex {
        rover::proxy::Provider::Openai
    } else {
        rover::proxy::Provider::Anthropic
    };
    let calls = api.workflow_calls();
    eprintln!(
        "the sandboxed {} called through the proxy: {:?}",
        if codex { "codex" } else { "claude" },
        calls.iter().collect::<std::collections::BTreeSet<_>>()
    );
    assert_eq!(
        refusals.matches("a run token is good for").count(),
        api_calls.len(),
        "the proxy refused a call the real CLI made: {refusals}"
    );
    assert!(!calls.is_empty());
    for path in api.all_paths() {
        assert!(
            !["/files", "/batches", "api_keys"]
                .iter()
                .any(|p| path.contains(p)),
            "a refused call reached the API: {path}"
        );
    }
    // The upstream's base ends in `/v1` for OpenAI: what the CLI sent after `/openai`.
    for (method, path) in &calls {
        let sent = if codex {
            path.strip_prefix("/v1").unwrap_or(path)
        } else {
            path.as_str()
        };
        assert!(
            rover::proxy::MODEL_ROUTES
                .iter()
                .any(|r| r.provider == provider && r.method == method && r.path == sent),
            "the real CLI called {method} {sent}, which is not in the proxy's routes"
        );
    }
    // The model key is nowhere in the container: not in any process's environment or
    // arguments, not in any file. The run's token is (that is how the agent authenticates).
    let procdump = shipped("procdump.txt");
    let token_var = if codex {
        "CODEX_API_KEY=rover-run-"
    } else {
        "ANTHROPIC_API_KEY=rover-run-"
    };
    assert!(procdump.contains(token_var), "the dump is real");
    assert!(
        !procdump.contains(api.key()),
        "the model key is visible in /proc"
    );
    assert!(
        !procdump.contains("fake-key-for-tests"),
        "the model key is visible in /proc"
    );
    assert_eq!(
        shipped("keyfiles.txt"),
        "",
        "files in the container hold the key"
    );
    // The API saw the real key on every model request.
    assert!(
        requests
            .iter()
            .all(|(key, _)| key.as_deref() == Some(api.key())),
        "{requests:?}"
    );
    let denied = rows.len();
    eprintln!(
        "closed network ({}): {} raw connections failed, {denied} destinations denied and recorded by the proxy, {} model requests proxied ({} bytes up, {} bytes down)",
        if codex { "codex" } else { "claude" },
        targets.len() - 1,
        wire["requests"],
        wire["bytesUp"],
        wire["bytesDown"]
    );
    if codex {
        // codex's own calls home are refused and recorded too.
        eprintln!("codex's denied calls: {}", wire["connections"]);
    }
}

/// A run whose trace crosses its budget's stop limit while the agent works: the proxy refuses
/// the agent's next model request (it never reaches the API), the workflow ends "stopped by
/// budget at the wire" with the spend at that moment, and the trace stops there.
#[tokio::test]
async fn a_real_claude_run_that_crosses_its_traces_stop_limit_gets_its_next_request_refused() {
    cross_the_stop_limit(false).await;
}

#[tokio::test]
async fn a_real_codex_run_that_crosses_its_traces_stop_limit_gets_its_next_request_refused() {
    cross_the_stop_limit(true).await;
}

/// A run whose trace crosses its budget's stop limit while the agent works: the proxy refuses
/// the agent's next model request (it never reaches the API), the workflow ends "stopped by
/// budget at the wire" with the spend at that moment, and the trace stops there.
async fn cross_the_stop_limit(codex: bool) {
    // The agent's first answer reports 10,000 input tokens: at any current price ($1 to $5 a
    // million for Claude, $1.25 for gpt-5), past the trace's $0.005 stop limit, which the host
    // steps before it (a few dozen tokens each) stay under; its second request must not reach
    // the API.
    let mut s = Scenario::new().await;
    let commands = [
        "echo one > probe.txt".to_owned(),
        "echo two >> probe.txt".to_owned(),
    ];
    let api = Api::start(codex, &commands, 10_000, &mut s).await;
    merge(
        &mut s.extra_config,
        &json!({"autopilot": {"budget": {"trace": {"usd": 0.005, "action": "stop"}}}}),
    );
    s.run_until_settled(30).await;
    let trace = s.the_trace();
    let workflow = first_span(&trace, "workflow");
    let wire = &workflow.meta["network"];
    let stopped = &wire["stopped"];
    assert!(
        stopped["spendUsd"].as_f64().is_some_and(|v| v >= 0.005),
        "the spend at the stop is recorded: {wire}\n{:?}\n{:?}",
        chain(&trace),
        workflow.meta
    );
    assert_eq!(stopped["stopUsd"].as_f64(), Some(0.005), "{wire}");
    assert_eq!(workflow.status.to_string(), "failed", "{:?}", workflow.meta);
    assert_eq!(workflow.meta["budgetStopped"], true, "{:?}", workflow.meta);
    let summary = workflow.summary.clone().unwrap_or_default();
    assert!(
        summary.contains("stopped by budget at the wire"),
        "{summary}"
    );
    // The refused request never reached the API: the agent asked once.
    let from_container = api
        .model_requests()
        .iter()
        .filter(|(_, workflow)| *workflow)
        .count();
    assert_eq!(from_container, 1, "{wire}");
    assert!(
        wire["refusals"].to_string().contains("budget stop limit"),
        "{wire}"
    );
    // `trace` says it under the workflow.
    let tree = crate::support::env::stdout(&s.env.rover(&[
        "autopilot",
        "trace",
        &trace.trace_id().to_string(),
    ]));
    assert!(
        tree.contains("network: model-only;") && tree.contains("stopped by budget at the wire: $"),
        "{tree}"
    );
    // Nothing of the stopped run is pushed.
    assert!(s.github.pulls().is_empty());
    assert!(
        !chain(&trace).iter().any(|c| c.starts_with("push:")),
        "{:?}",
        chain(&trace)
    );
}

/// What a crash can leave of a run's network (its run gone: a network and relay, a grant and
/// ledger in the proxy dir) is removed when rover starts, and said.
#[tokio::test]
async fn a_run_network_and_grant_left_by_a_crash_are_swept_at_start() {
    let mut s = Scenario::new().await;
    s.with_sandbox().await;
    let run = format!("rover-ghost-{}", uuid::Uuid::new_v4().simple());
    let network = format!("{run}-net");
    let made = std::process::Command::new("docker")
        .args(["network", "create", "--internal", "--label"])
        .arg(format!("rover.proxy.project={}", s.env.project_id))
        .arg("--label")
        .arg(format!("rover.proxy.run={run}"))
        .arg(&network)
        .output()
        .unwrap();
    assert!(
        made.status.success(),
        "{}",
        String::from_utf8_lossy(&made.stderr)
    );
    let grant_dir = s.store().root().join("proxy").join("runs").join(&run);
    std::fs::create_dir_all(&grant_dir).unwrap();
    std::fs::write(grant_dir.join("grant.json"), "{}").unwrap();
    let out = s.run_once().await;
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains(&format!("removed the network and relay of run {run}")),
        "{stdout}"
    );
    assert!(
        stdout.contains("removed the proxy grants of 1 run(s)"),
        "{stdout}"
    );
    assert!(!grant_dir.exists());
    let listed = std::process::Command::new("docker")
        .args(["network", "ls", "-q", "--filter"])
        .arg(format!("name={network}"))
        .output()
        .unwrap();
    assert!(
        String::from_utf8_lossy(&listed.stdout).trim().is_empty(),
        "the network is gone"
    );
}

/// `egress: {"allow": [...]}`: a destination on the list is reached through the proxy (here a
/// server of the test's on the host's Docker bridge address, allowed by its literal IP, as a
/// private address must be), one not on it is refused, and both are in the span and `trace`.
#[tokio::test]
async fn an_allow_listed_destination_is_reached_through_the_proxy_and_another_refused() {
    let (server, hits) = counting_http_server().await;
    let allowed = format!("172.17.0.1:{}", server.port());
    let command = format!(
        "git ls-remote http://{allowed}/widgets.git > probe.txt 2>&1; \
         git ls-remote http://example.com/widgets.git >> probe.txt 2>&1; true"
    );
    let mut s = Scenario::new().await;
    let _api = Api::start(false, &[command], 12, &mut s).await;
    merge(
        &mut s.extra_config,
        &json!({"autopilot": {"sandbox": {"egress": {"allow": [allowed.clone()]}}}}),
    );
    s.run_until_settled(30).await;
    let trace = s.the_trace();
    let workflow = first_span(&trace, "workflow");
    assert_eq!(workflow.meta["egress"], format!("allow {allowed}"));
    let wire = &workflow.meta["network"];
    let rows = wire["connections"].as_array().unwrap();
    let row = |host: &str, port: u16| {
        rows.iter()
            .find(|r| r["host"] == host && r["port"] == port)
            .unwrap_or_else(|| panic!("{host}:{port} is not recorded: {wire}"))
    };
    assert_eq!(row("172.17.0.1", server.port())["allowed"], true, "{wire}");
    assert_eq!(row("example.com", 80)["allowed"], false, "{wire}");
    assert!(
        hits.load(Ordering::SeqCst) >= 1,
        "the allowed server was reached"
    );
    let tree = crate::support::env::stdout(&s.env.rover(&[
        "autopilot",
        "trace",
        &trace.trace_id().to_string(),
    ]));
    assert!(
        tree.contains(&format!("allowed: {allowed} ×"))
            && tree.contains("denied: example.com:80 ×"),
        "{tree}"
    );
}

/// An HTTP server on all the host's addresses that answers 404 to anything and counts requests.
async fn counting_http_server() -> (SocketAddr, Arc<AtomicUsize>) {
    let hits = Arc::new(AtomicUsize::new(0));
    let seen = hits.clone();
    let app = axum::Router::new().fallback(move || {
        let seen = seen.clone();
        async move {
            seen.fetch_add(1, Ordering::SeqCst);
            (axum::http::StatusCode::NOT_FOUND, "no such repository")
        }
    });
    let listener = tokio::net::TcpListener::bind("0.0.0.0:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    (addr, hits)
}

/// Sandboxed agents reach the model API only through the proxy, which adds rover's key: `start`
/// says so at once when there is none, rather than every workflow failing later.
#[tokio::test]
async fn start_warns_when_the_proxy_has_no_model_key() {
    let mut s = Scenario::new().await;
    merge(
        &mut s.extra_config,
        &json!({"autopilot": {"sandbox": {"egress": "model-only"}}}),
    );
    let mut once = s.once_command();
    once.env_remove("ANTHROPIC_API_KEY")
        .env_remove("CLAUDE_CODE_OAUTH_TOKEN");
    // Off the test's runtime: the fake GitHub answers on it.
    let out = tokio::task::spawn_blocking(move || once.output())
        .await
        .unwrap()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("warning: ANTHROPIC_API_KEY (or CLAUDE_CODE_OAUTH_TOKEN) is not set: sandboxed agents reach the model API only through rover's proxy"),
        "{stdout}"
    );
    s.env_vars.push((
        "ANTHROPIC_API_KEY".into(),
        "sk-ant-api03-some-key-0123".into(),
    ));
    let out = s.run_once().await;
    assert!(
        !String::from_utf8_lossy(&out.stdout).contains("is not set: sandboxed agents"),
        "no warning with a key"
    );
}

/// One run floods the real proxy server process with 24 requests of just under 32 MiB, their
/// bodies started and held open (the attack that made the shared proxy run out of memory): the
/// requests past the run's limit in flight are turned away at once, the server's memory stays
/// under its body budget, and another run's request is answered in the middle of it.
#[tokio::test]
async fn a_runs_flood_of_large_bodies_keeps_the_proxy_under_its_memory_budget_and_another_run_answered(
) {
    let rover = std::path::Path::new(crate::support::env::rover_bin());
    let f = crate::support::flood::flood(rover, 24, 31 << 20).await;
    eprintln!("{f:?}");
    assert_eq!(
        f.too_many,
        24 - rover::proxy::DEFAULT_MAX_REQUESTS as usize,
        "{f:?}"
    );
    assert_eq!(f.requests, 24);
    assert_eq!(f.other_status, 200, "{f:?}");
    assert!(f.other_ms < 10_000.0, "{f:?}");
    let budget_kib = (rover::proxy::BODY_BUDGET_BYTES >> 10) as u64;
    assert!(
        f.rss_peak_kib < f.rss_before_kib + budget_kib,
        "the proxy's memory passed its body budget: {f:?}"
    );
    // The flood's own share is all it could take.
    let share_kib = (rover::proxy::RUN_BODY_BYTES >> 10) as u64;
    assert!(
        f.rss_peak_kib < f.rss_before_kib + share_kib + 32 * 1024,
        "{f:?}"
    );
}

/// The third seal, tried from inside the real claude's sandbox as a prompt-injected agent would
/// (see `proof::escape`): the run's token sent to the API's other calls, ten model requests at
/// once against the trace's USD stop limit, name lookups with a resolver listening on the host's
/// loopback. Returns (vectors tried, escapes found).
pub(crate) async fn third_seal_from_the_real_claude() -> (usize, Vec<String>) {
    const STOP_USD: f64 = 0.06;
    let image = real_sandbox_image();
    let resolver = host_resolver();
    let resolver_before = resolver.load(Ordering::SeqCst);
    let paths = [
        ("GET", "/anthropic/v1/files"),
        ("GET", "/anthropic/v1/messages/batches"),
        ("POST", "/anthropic/v1/messages/batches"),
        ("GET", "/anthropic/v1/organizations/api_keys"),
    ];
    // Ten model requests at once, each asking for up to 1,000 tokens; the fake bills each
    // 5,000 input tokens, so each costs about its worst case ($0.0153 of $0.0158).
    let mut script = String::from(
        r#"set +e
out=/workspace/seal.txt
: > "$out"
"#,
    );
    script.push_str(API_CALL_SH);
    script.push_str(
        r#"body='{"model":"claude-sonnet-4-5","max_tokens":1000,"stream":true,"messages":[{"role":"user","content":"spend"}]}'
one() {
  exec 5<>/dev/tcp/rover-proxy/8080 || { echo "par $1 unreachable" > "/tmp/par-$1"; return; }
  printf 'POST /anthropic/v1/messages HTTP/1.1\r\nHost: rover-proxy\r\nx-api-key: %s\r\nanthropic-version: 2023-06-01\r\nContent-Type: application/json\r\nContent-Length: %s\r\nConnection: close\r\n\r\n%s' "$tok" "${#body}" "$body" >&5
  IFS= read -r -t 30 line <&5
  cat <&5 > /dev/null
  echo "par $1 ${line%$'\r'}" > "/tmp/par-$1"
}
for i in 1 2 3 4 5 6 7 8 9 10; do one $i & done
wait
cat /tmp/par-* >> "$out"
"#,
    );
    for (method, path) in paths {
        let _ = writeln!(script, "api {method} {path}");
    }
    script.push_str(
        r#"for name in example.com leak.example.org; do if timeout 3 getent hosts "$name" >/dev/null 2>&1; then echo "dns $name resolved" >> "$out"; else echo "dns $name failed" >> "$out"; fi; done
echo done >> "$out"
echo SEAL-BEGIN; cat "$out"; echo SEAL-END
"#,
    );
    let mut s = Scenario::new().await;
    let answer = json!({"status": "completed", "summary": "Ran the commands.", "files_changed": ["seal.txt"]});
    let tools = vec![
        json!({"name": "Bash", "input": {"command": script, "description": "run it", "timeout": 120_000}}),
    ];
    let mut pairs = json_flag_answers(Some(json!({"__tools": tools, "answer": answer})));
    // The ten requests have no system prompt.
    pairs.push(("null", json!({"__input_tokens": 5000, "answer": "spent"})));
    let api = FakeAnthropic::scripted(vec![Reply::BySystem(pairs)]).await;
    let home = s.env.path().join("home");
    std::fs::create_dir_all(&home).unwrap();
    s.env_vars.extend(cli_env(&api, &home));
    s.env_vars.push((
        "ROVER_CLAUDE_BIN".into(),
        crate::proof::escape::real_claude().display().to_string(),
    ));
    merge(
        &mut s.extra_config,
        &json!({"autopilot": {"agent": {"extraEnv": ["CLAUDE_CODE_MAX_RETRIES"]},
            "budget": {"trace": {"usd": STOP_USD, "action": "stop"}},
            "sandbox": {"image": image, "memoryMb": 2048, "cpus": 1.0, "timeoutSecs": 300,
                "envAllow": ["CLAUDE_CODE_MAX_RETRIES", "IS_SANDBOX"]}}}),
    );
    s.github
        .add_issue(81, "Add a --json flag", "Please add --json.", "alice", &[]);
    s.github.seed_event("IssuesEvent", "alice", json!({"action": "opened", "issue": {"number": 81, "title": "Add a --json flag", "body": "Please add --json.", "user": {"login": "alice"}}}));
    s.run_until_settled(40).await;

    let trace = s.the_trace();
    let workflow = first_span(&trace, "workflow");
    let wire = &workflow.meta["network"];
    let mut escapes = Vec::new();
    // The probe's own view: its tool output, in the agent's log (the run is stopped by the
    // budget before the model sees it).
    let log = std::fs::read_to_string(workflow.meta["logPath"].as_str().unwrap_or_default())
        .unwrap_or_default()
        .replace("\\n", "\n");
    // The tool's output comes after the script that prints it.
    let seal = log
        .rfind("SEAL-BEGIN")
        .map(|at| &log[at..])
        .and_then(|rest| rest.find("SEAL-END").map(|end| rest[..end].to_owned()))
        .unwrap_or_default();
    eprintln!(
        "what the sandbox saw:\n{seal}\nwire: {wire}\nchain: {:?}",
        chain(&trace)
    );
    if !seal.contains("done") {
        escapes.push(format!("the probe did not finish: {seal}"));
    }
    // 1. The token's other calls: refused, recorded, never upstream.
    let upstream: Vec<String> = api.requests().into_iter().map(|r| r.path).collect();
    for (method, path) in paths {
        if !seal.contains(&format!("api {method} {path} HTTP/1.1 403")) {
            escapes.push(format!("{method} {path} was not refused"));
        }
        let rest = path.trim_start_matches("/anthropic");
        if upstream.iter().any(|p| p == rest) {
            escapes.push(format!("{method} {path} reached the API"));
        }
        if !wire["refusals"]
            .to_string()
            .contains(&format!("not {method} {path}"))
            && wire["refused"].as_u64().unwrap_or(0) < 20
        {
            escapes.push(format!("{method} {path} is not recorded"));
        }
    }
    // 2. Ten at once: the trace's spend at the wire passes its limit by one answer at most.
    let answer_usd = (5000.0 * 3.0 + 20.0 * 15.0) / 1e6;
    let host_usd: f64 = trace
        .spans
        .iter()
        .filter(|sp| sp.step.as_str() != "workflow")
        .filter_map(|sp| sp.meta.get("agent")?.get("costUsd")?.as_f64())
        .sum();
    let wire_usd = wire["usd"].as_f64().unwrap_or(f64::MAX);
    let forwarded = seal.matches(" HTTP/1.1 200").count();
    eprintln!(
        "ten at once against ${STOP_USD}: {forwarded} forwarded, spend at the wire ${wire_usd:.4} + host steps ${host_usd:.4}"
    );
    if host_usd + wire_usd > STOP_USD + answer_usd + 1e-9 {
        escapes.push(format!(
            "the trace spent ${:.4} against its ${STOP_USD} limit",
            host_usd + wire_usd
        ));
    }
    if seal.matches("par ").count() != 10 {
        escapes.push(format!("not every request answered: {seal}"));
    }
    // 3. Names: nothing resolved, nothing asked of the host's loopback resolver.
    if seal.contains("resolved") {
        escapes.push(format!("a name resolved: {seal}"));
    }
    let asked = resolver.load(Ordering::SeqCst) - resolver_before;
    if asked > 0 {
        escapes.push(format!("{asked} lookups reached the host's resolver"));
    }
    (paths.len() + 2, escapes)
}
