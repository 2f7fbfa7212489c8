//! The sandbox's closed network, tried from inside a running sandbox by the real claude CLI as
//! the workflow agent (against the fake model API): with the default egress (`model-only`) the
//! model API is reached through rover's proxy and nothing else is: not the host (by its
//! loopback through the proxy, by its bridge or LAN address directly), not another container,
//! not an arbitrary address, not a host name; every attempt through the proxy is recorded as
//! denied in the workflow span; and the model key is in no environment variable, process
//! argument or file the container can see.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use serde_json::json;

use crate::real_cli::{cli_env, json_flag_answers, real_sandbox_image};
use crate::support::fake_anthropic::{FakeAnthropic, Reply};
use crate::support::scenario::{chain, merge, Scenario};

/// The key rover holds in these tests (see `cli_env`).
const KEY: &str = "sk-ant-api03-fake-key-for-tests";

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

/// Another container, on Docker's default bridge, that accepts TCP on port 9000 (rover's relay
/// mode, pointed at a socket that does not exist): its name and address.
fn other_container(image: &str) -> (String, String) {
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
    assert!(run.status.success(), "{}", String::from_utf8_lossy(&run.stderr));
    let ip = std::process::Command::new("docker")
        .args([
            "inspect",
            "-f",
            "{{.NetworkSettings.IPAddress}}",
            &name,
        ])
        .output()
        .unwrap();
    let ip = String::from_utf8_lossy(&ip.stdout).trim().to_owned();
    assert!(!ip.is_empty(), "the peer container has an address");
    (name, ip)
}

/// The probe the agent runs with its Bash tool: raw connections, the same destinations
/// through the proxy (as any `HTTPS_PROXY` client asks), a name lookup, a control that must
/// connect, and what of the container could hold the key.
fn probe_script(targets: &[(&str, String)], via_proxy: &[(&str, String)]) -> String {
    let mut s = String::from(
        r#"set +e
out=/workspace/probe.txt
: > "$out"
raw() { if timeout 4 bash -c "exec 3<>/dev/tcp/$2/$3" 2>/dev/null; then echo "raw $1 open" >> "$out"; else echo "raw $1 closed" >> "$out"; fi; }
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
        s.push_str(&format!("raw {name} {host} {port}\n"));
    }
    for (name, target) in via_proxy {
        s.push_str(&format!("proxied {name} {target}\n"));
    }
    s.push_str(
        r#"if getent hosts example.com >/dev/null 2>&1; then echo "dns example.com resolved" >> "$out"; else echo "dns example.com failed" >> "$out"; fi
for f in /proc/[0-9]*/environ /proc/[0-9]*/cmdline; do tr '\0' '\n' < "$f" 2>/dev/null; echo; done > /workspace/procdump.txt
n1=fake-key; n2=-for-tests
# What is written at run time (the image was built before any key existed), every mount
# included: /tmp (HOME), /workspace, /rover*, /etc (the engine's hosts and resolv.conf), /run.
grep -rlF "$n1$n2" /tmp /workspace /rover /rover-git /rover-git-objects /etc /run /home /root /var/tmp 2>/dev/null > /workspace/keyfiles.txt
cat /proc/self/mountinfo > /workspace/mounts.txt
echo done >> "$out"
"#,
    );
    s
}

#[tokio::test]
async fn from_inside_a_sandbox_only_the_model_api_is_reachable_and_the_key_is_nowhere() {
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
    let script = probe_script(&targets, &via_proxy);
    let workflow = json!({
        "__tools": [{"name": "Bash", "input": {"command": script, "description": "probe the network", "timeout": 120000}}],
        "answer": {"status": "completed", "summary": "Probed the network.", "files_changed": ["probe.txt"]}});
    let api =
        FakeAnthropic::scripted(vec![Reply::BySystem(json_flag_answers(Some(workflow)))]).await;
    let mut s = Scenario::new().await;
    let home = s.env.path().join("home");
    std::fs::create_dir_all(&home).unwrap();
    merge(
        &mut s.extra_config,
        &json!({"autopilot": {
            "agent": {"extraEnv": ["CLAUDE_CODE_MAX_RETRIES"]},
            "sandbox": {"image": image, "memoryMb": 2048, "cpus": 1.0, "timeoutSecs": 300,
                "envAllow": ["CLAUDE_CODE_MAX_RETRIES", "IS_SANDBOX"]}}}),
    );
    s.github
        .add_issue(81, "Add a --json flag", "Please add --json.", "alice", &[]);
    s.github.seed_event("IssuesEvent", "alice", json!({"action": "opened", "issue": {"number": 81, "title": "Add a --json flag", "body": "Please add --json.", "user": {"login": "alice"}}}));
    s.env_vars.extend(cli_env(&api, &home));
    s.env_vars.push((
        "ROVER_CLAUDE_BIN".into(),
        crate::proof::escape::real_claude().display().to_string(),
    ));
    s.run_until_settled(40).await;
    let _ = std::process::Command::new("docker")
        .args(["rm", "-f", &peer])
        .output();
    let trace = s.the_trace();
    let workflow = trace
        .spans
        .iter()
        .find(|sp| sp.step.as_str() == "workflow")
        .unwrap();
    assert_eq!(
        workflow.status.to_string(),
        "completed",
        "{:?}",
        workflow.meta
    );
    assert_eq!(chain(&trace).last().map(String::as_str), Some("notify:completed"));
    let push = trace
        .spans
        .iter()
        .find(|sp| sp.step.as_str() == "push")
        .unwrap();
    let branch = push.meta["branch"].as_str().unwrap();
    let shipped = |file: &str| {
        crate::support::gitrepo::git(&s.origin, &["show", &format!("{branch}:{file}")])
    };
    let probe = shipped("probe.txt");
    eprintln!("what the sandbox saw:\n{probe}");
    assert!(probe.ends_with("done"), "{probe}");
    // The probe can tell: the relay, the one member of its network, answers.
    assert!(probe.contains("raw control-relay open"), "{probe}");
    for (name, _) in &targets {
        if *name != "control-relay" {
            assert!(probe.contains(&format!("raw {name} closed")), "{name}: {probe}");
        }
    }
    for (name, _) in &via_proxy {
        assert!(
            probe.contains(&format!("proxy {name} HTTP/1.1 403")),
            "{name}: {probe}"
        );
    }
    assert!(probe.contains("dns example.com failed"), "{probe}");
    assert_eq!(public_hits.load(Ordering::SeqCst), 0, "the host's service was reached");
    assert_eq!(loopback_hits.load(Ordering::SeqCst), 0, "the host's loopback was reached");

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
    assert!(wire["requests"].as_u64().unwrap() >= 2, "{wire}");

    // The model key is nowhere in the container: not in any process's environment or
    // arguments, not in any file. The run's token is (that is how the agent authenticates).
    let procdump = shipped("procdump.txt");
    assert!(procdump.contains("ANTHROPIC_API_KEY=rover-run-"), "the dump is real");
    assert!(!procdump.contains(KEY), "the model key is visible in /proc");
    assert!(!procdump.contains("fake-key-for-tests"), "the model key is visible in /proc");
    assert_eq!(shipped("keyfiles.txt"), "", "files in the container hold the key");
    // The API saw the real key on every model request.
    assert!(api
        .requests()
        .iter()
        .filter(|r| r.path == "/v1/messages")
        .all(|r| r.key.as_deref() == Some(KEY)));
    let denied = rows.len();
    eprintln!(
        "closed network: {} raw connections failed, {denied} destinations denied and recorded by the proxy, {} model requests proxied ({} bytes down)",
        targets.len() - 1,
        wire["requests"],
        wire["bytesDown"]
    );
}
