//! One webhook endpoint for every repository of a daemon file: signed deliveries for two served
//! repositories are routed each to its own store and answered on its own fake GitHub; one for a
//! repository the daemon does not serve, one for a repository being retried and one naming no
//! repository are answered 404 and recorded in `<data dir>/daemon/refused.jsonl`; a bad
//! signature is refused before anything is parsed, and nothing of it is stored or recorded.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::Stdio;
use std::time::Duration;

use axum::http::Method;
use rover::github::webhook::sign;
use rover::store::AutopilotStore;
use serde_json::{json, Value};

use super::{answers, output, rover, script, standing, wait_for, Daemon, Repo};
use crate::support::env::{stderr, TestEnv};
use crate::webhook::http;

pub(crate) const SECRET: &str = "one-secret-for-every-repository";

/// A delivery as GitHub sends it, signed with `secret`: status and body.
pub(crate) fn deliver(
    addr: SocketAddr,
    event: &str,
    delivery: &str,
    body: &Value,
    secret: &str,
) -> (u16, String) {
    let body = serde_json::to_vec(body).unwrap();
    let head = format!(
        "POST /github HTTP/1.1\r\nHost: {addr}\r\nUser-Agent: GitHub-Hookshot/test\r\nContent-Type: application/json\r\nX-GitHub-Event: {event}\r\nX-GitHub-Delivery: {delivery}\r\nX-Hub-Signature-256: {}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        sign(secret.as_bytes(), &body),
        body.len()
    );
    http(addr, head.as_bytes(), &body)
}

/// An `issues` `opened` delivery for issue 1 of `full_name`, titled `title`.
fn opened(full_name: &str, title: &str) -> Value {
    json!({"action": "opened",
           "issue": {"number": 1, "title": title, "body": "Please answer.", "user": {"login": "alice"},
                     "updated_at": "2026-11-29T10:00:00Z"},
           "repository": {"id": 1, "full_name": full_name, "private": false},
           "sender": {"login": "alice", "id": 2, "type": "User"}})
}

/// The traces of `repo`'s store: `(id, event)`.
fn traces(env: &TestEnv, project_id: &str) -> Vec<(String, String)> {
    let store = AutopilotStore::open(&env.path().join("data"), project_id).expect("its store");
    store
        .recent_traces(100)
        .unwrap()
        .into_iter()
        .map(|t| (t.trace_id.to_string(), t.event))
        .collect()
}

/// The lines of the refused log.
fn refused(env: &TestEnv) -> Vec<Value> {
    let path = env.path().join("data/daemon/refused.jsonl");
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).expect("one JSON object a line"))
        .collect()
}

/// The daemon started with `--webhook 127.0.0.1:0`, and the address it says it listens on.
pub(crate) fn start(env: &TestEnv, home: &std::path::Path, script: &Value) -> (Daemon, SocketAddr) {
    let mut child = rover(env, home, &["start", "--webhook", "127.0.0.1:0"], script)
        .env("ROVER_WEBHOOK_SECRET", SECRET)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("start the daemon");
    let (tx, rx) = std::sync::mpsc::channel();
    let lines = BufReader::new(child.stdout.take().unwrap()).lines();
    std::thread::spawn(move || {
        for line in lines.map_while(Result::ok) {
            if let Some(rest) = line.strip_prefix("webhook listening on ") {
                let addr = rest.split(' ').next().unwrap_or_default();
                let _ = tx.send(addr.parse::<SocketAddr>().expect("an address"));
            }
        }
    });
    let daemon = Daemon(child);
    let addr = rx
        .recv_timeout(Duration::from_secs(90))
        .expect("a `webhook listening on` line");
    (daemon, addr)
}

/// The repository has polled its feed once: its intake is routed (it adds itself first).
fn routed(repo: &Repo) -> bool {
    repo.github.count(&Method::GET, "/events") > 0
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_endpoint_routes_each_delivery_to_its_repository_and_records_what_it_refuses() {
    let env = TestEnv::new();
    let (home, alpha, beta, _broken) = super::alpha_beta_broken(&env).await;
    // The issues exist on GitHub; only the deliveries tell rover (the feeds stay empty).
    for r in [&alpha, &beta] {
        let short = r.name.split('/').nth(1).unwrap();
        r.github.add_issue(
            1,
            &format!("Question for {short}"),
            "Please answer.",
            "alice",
            &[],
        );
    }
    let script = script(&["alpha", "beta"]);

    // Without the secret, the endpoint is refused before anything starts.
    let out = output({
        let mut cmd = rover(&env, &home, &["start", "--webhook", "127.0.0.1:0"], &script);
        cmd.env_remove("ROVER_WEBHOOK_SECRET");
        cmd
    });
    assert_eq!(out.status.code(), Some(78), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("ROVER_WEBHOOK_SECRET"),
        "{}",
        stderr(&out)
    );

    let (daemon, addr) = start(&env, &home, &script);
    wait_for("both good repositories served", || {
        routed(&alpha) && routed(&beta)
    });
    wait_for("the broken one failing", || {
        standing(&env, &home)["octo-org/broken"]["state"] == "failing"
    });

    // A bad signature: refused before anything is parsed; nothing stored, nothing recorded.
    let (status, text) = deliver(
        addr,
        "issues",
        "d-forged",
        &opened("octo-org/alpha", "Question for alpha"),
        "not the secret",
    );
    assert_eq!(status, 401, "{text}");

    // Each served repository's delivery goes to its own store (names are not case-sensitive).
    let mut ids = Vec::new();
    for (full_name, short) in [("Octo-Org/Alpha", "alpha"), ("octo-org/beta", "beta")] {
        let body = opened(full_name, &format!("Question for {short}"));
        let (status, text) = deliver(addr, "issues", &format!("d-{short}"), &body, SECRET);
        assert_eq!(status, 200, "{full_name}: {text}");
        let id = text
            .trim()
            .strip_prefix("ingested: trace ")
            .unwrap_or_else(|| panic!("{full_name}: {text}"))
            .to_owned();
        ids.push(id);
    }
    // Not served: unknown, being retried, or naming no repository.
    let unknown = deliver(
        addr,
        "issues",
        "d-gamma",
        &opened("octo-org/gamma", "Hi"),
        SECRET,
    );
    let failing = deliver(
        addr,
        "issues",
        "d-broken",
        &opened("octo-org/broken", "Hi"),
        SECRET,
    );
    let nameless = deliver(
        addr,
        "meta",
        "d-meta",
        &json!({"action": "deleted", "hook_id": 7}),
        SECRET,
    );
    for (status, text) in [&unknown, &failing, &nameless] {
        assert_eq!(*status, 404, "{text}");
        let said: Value = serde_json::from_str(text.trim()).expect("a JSON body");
        assert!(said["refused"].is_string(), "{said}");
    }
    // Sent to a GitHub App: answered, with no repository to route to.
    let (status, text) = deliver(
        addr,
        "installation_repositories",
        "d-install",
        &json!({"action": "added", "installation": {"id": 9}, "repositories_added": [{"full_name": "octo-org/delta"}]}),
        SECRET,
    );
    assert_eq!(status, 202, "{text}");
    let (status, text) = deliver(
        addr,
        "ping",
        "d-ping",
        &json!({"zen": "Keep it simple.", "hook_id": 1}),
        SECRET,
    );
    assert_eq!(status, 200, "{text}");

    // Answered each on its own thread, by its own store's trace.
    wait_for("both answered", || {
        answers(&alpha, 1) == ["Here is the answer for alpha."]
            && answers(&beta, 1) == ["Here is the answer for beta."]
    });
    let now = standing(&env, &home);
    for (name, id) in [("octo-org/alpha", &ids[0]), ("octo-org/beta", &ids[1])] {
        let held = traces(
            &env,
            now[name]["projectId"].as_str().expect("its project id"),
        );
        assert_eq!(held.len(), 1, "{name}: one trace, the delivery's: {held:?}");
        assert_eq!(&held[0].0, id, "{name}");
        assert_eq!(held[0].1, "IssuesEvent opened #1 by alice", "{name}");
    }

    // What was refused is recorded, one line each with exactly its fields; the forged one not.
    let lines = refused(&env);
    let by_id = |id: &str| {
        lines
            .iter()
            .find(|l| l["deliveryId"] == id)
            .unwrap_or_else(|| panic!("no line for {id}: {lines:?}"))
            .clone()
    };
    assert_eq!(lines.len(), 3, "{lines:?}");
    let gamma = by_id("d-gamma");
    assert_eq!(gamma.as_object().unwrap().len(), 5, "{gamma}");
    assert_eq!(gamma["event"], "issues");
    assert_eq!(gamma["repo"], "octo-org/gamma");
    assert_eq!(gamma["reason"], "not served by this daemon");
    let at = gamma["at"].as_str().expect("a time");
    assert!(
        at.ends_with('Z') && chrono::DateTime::parse_from_rfc3339(at).is_ok(),
        "{at}"
    );
    let broken_line = by_id("d-broken");
    let reason = broken_line["reason"].as_str().unwrap();
    assert!(
        reason.starts_with("failing: ") && reason.contains("pipline"),
        "{reason}"
    );
    let meta = by_id("d-meta");
    assert_eq!(meta["repo"], Value::Null);
    assert_eq!(meta["event"], "meta");
    assert!(!lines.iter().any(|l| l["deliveryId"] == "d-forged"));

    let mut daemon = daemon;
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(i32::try_from(daemon.0.id()).unwrap()),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    assert_eq!(daemon.0.wait().expect("the daemon stops").code(), Some(0));
}
