//! `rover autopilot start --webhook ADDR` as GitHub drives it: signed deliveries over plain HTTP
//! (a raw HTTP/1.1 client on a `TcpStream`), the daemon polling the fake GitHub at the same time,
//! and the store showing one trace per event however often and by whichever path it came.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Child, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use rover::github::webhook::sign;
use serde_json::{json, Value};

use crate::support::env::{stderr, stdout};
use crate::support::fake_github::REPO;
use crate::support::pipeline::first_span;
use crate::support::scenario::{chain, Scenario, COORDINATE, NOTIFY};

const SECRET: &str = "webhook-secret-for-tests";

/// A daemon started with `--webhook 127.0.0.1:0`, its bound address read from its stdout.
struct Daemon {
    child: Child,
    addr: SocketAddr,
    out: Arc<Mutex<String>>,
}

impl Daemon {
    fn start(s: &Scenario) -> Daemon {
        let mut child = s
            .start_command(&["--webhook", "127.0.0.1:0"])
            .env("ROVER_WEBHOOK_SECRET", SECRET)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("start rover");
        let out = Arc::new(Mutex::new(String::new()));
        let (tx, rx) = std::sync::mpsc::channel();
        let reader = BufReader::new(child.stdout.take().unwrap());
        let sink = out.clone();
        std::thread::spawn(move || {
            for line in reader.lines() {
                let Ok(line) = line else { return };
                if let Some(addr) = line.strip_prefix("webhook listening on ") {
                    let _ = tx.send(addr.parse::<SocketAddr>().unwrap());
                }
                let mut all = sink.lock().unwrap();
                all.push_str(&line);
                all.push('\n');
            }
        });
        let Ok(addr) = rx.recv_timeout(Duration::from_secs(60)) else {
            let _ = child.kill();
            panic!("no `webhook listening on` line: {}", out.lock().unwrap());
        };
        Daemon { child, addr, out }
    }

    /// POST /github as GitHub sends it; `signature: None` sends no signature header.
    fn deliver(
        &self,
        event: &str,
        delivery: &str,
        body: &[u8],
        signature: Option<&str>,
    ) -> (u16, String) {
        let mut head = format!(
            "POST /github HTTP/1.1\r\nHost: {}\r\nUser-Agent: GitHub-Hookshot/test\r\nContent-Type: application/json\r\nX-GitHub-Event: {event}\r\nX-GitHub-Delivery: {delivery}\r\nContent-Length: {}\r\nConnection: close\r\n",
            self.addr,
            body.len()
        );
        if let Some(sig) = signature {
            head.push_str("X-Hub-Signature-256: ");
            head.push_str(sig);
            head.push_str("\r\n");
        }
        head.push_str("\r\n");
        http(self.addr, head.as_bytes(), body)
    }

    /// A correctly signed delivery.
    fn signed(&self, event: &str, delivery: &str, body: &Value) -> (u16, String) {
        let body = serde_json::to_vec(body).unwrap();
        self.deliver(
            event,
            delivery,
            &body,
            Some(&sign(SECRET.as_bytes(), &body)),
        )
    }

    /// SIGTERM, then the exit code and everything it printed.
    fn stop(mut self) -> (Option<i32>, String) {
        kill(
            Pid::from_raw(i32::try_from(self.child.id()).unwrap()),
            Signal::SIGTERM,
        )
        .unwrap();
        let start = Instant::now();
        let code = loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                break status.code();
            }
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "the daemon did not stop"
            );
            std::thread::sleep(Duration::from_millis(20));
        };
        std::thread::sleep(Duration::from_millis(100));
        let out = self.out.lock().unwrap().clone();
        (code, out)
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// One HTTP/1.1 exchange on a fresh connection: status code and body.
pub(crate) fn http(addr: SocketAddr, head: &[u8], body: &[u8]) -> (u16, String) {
    let mut conn = TcpStream::connect(addr).unwrap();
    conn.set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    conn.write_all(head).unwrap();
    // The server may answer (413) before the body is all sent and close: not an error here.
    let _ = conn.write_all(body);
    let mut raw = Vec::new();
    let _ = conn.read_to_end(&mut raw);
    let text = String::from_utf8_lossy(&raw).into_owned();
    let status = text
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("not an HTTP response: {text:?}"));
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default();
    (status, body)
}

fn wait_for(what: &str, mut done: impl FnMut() -> bool) {
    let start = Instant::now();
    while !done() {
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "timed out waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A webhook body: the event's payload plus `sender` and `repository`, as GitHub sends it.
fn webhook_body(sender: &str, payload: &Value) -> Value {
    let mut body = payload.clone();
    body["sender"] = json!({"login": sender, "id": 1, "type": "User"});
    body["repository"] = json!({"id": 316_335_970, "full_name": REPO, "private": false});
    body
}

fn comment_payload(number: u64, comment_id: u64, text: &str) -> Value {
    json!({"action": "created",
           "issue": {"number": number, "title": "Export", "user": {"login": "alice"},
                     "updated_at": "2026-11-23T10:00:00Z"},
           "comment": {"id": comment_id, "body": text, "user": {"login": "alice"},
                       "html_url": format!("https://github.com/{REPO}/issues/{number}#issuecomment-{comment_id}")}})
}

fn noop_answer(s: &mut Scenario) {
    s.answer(COORDINATE, json!({"decision": "noop", "confidence": 0.9, "reasoning": "Nothing to do.", "directive": null, "task": null, "message": null, "condition": null, "task_id": null}));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_signed_delivery_is_ingested_once_answered_and_a_replay_is_ignored() {
    let mut s = Scenario::new().await;
    s.github
        .add_issue(5, "Is the export bug fixed?", "It crashed.", "alice", &[]);
    s.github
        .add_comment(5, "alice", "Is this still a problem in v2.1?");
    s.answer(COORDINATE, json!({"decision": "notify", "confidence": 0.9, "reasoning": "Already fixed in v2.1.", "directive": null, "task": null, "message": "This was resolved in v2.1.", "condition": null, "task_id": null}));
    s.answer(
        NOTIFY,
        json!({"message": "This was resolved in v2.1; please upgrade."}),
    );
    let daemon = Daemon::start(&s);
    let body = webhook_body(
        "alice",
        &comment_payload(5, 77, "Is this still a problem in v2.1?"),
    );
    let delivery = "72d3162e-cc78-11e3-81ab-4c9367dc0958";
    let sent = Instant::now();
    let (status, text) = daemon.signed("issue_comment", delivery, &body);
    let answered = sent.elapsed();
    assert_eq!(status, 200, "{text}");
    assert!(text.starts_with("ingested: trace "), "{text}");
    // Stored before the answer: the trace is there the moment the 200 is.
    let traces = s.traces();
    assert_eq!(traces.len(), 1);
    assert_eq!(
        traces[0].index.event,
        "IssueCommentEvent created #5 by alice"
    );
    assert_eq!(traces[0].spans[0].meta["source"], "github");
    wait_for("the answer on the issue", || {
        chain(&s.the_trace())
            == [
                "event:completed",
                "coordinate:completed",
                "notify:completed",
            ]
    });
    eprintln!(
        "webhook: 200 (stored) after {answered:?}, answer posted on the issue after {:?}",
        sent.elapsed()
    );
    // GitHub redelivers (the "Redeliver" button, or a retry): the same delivery id.
    let (status, text) = daemon.signed("issue_comment", delivery, &body);
    assert_eq!(status, 200, "{text}");
    assert!(text.starts_with("duplicate delivery"), "{text}");
    std::thread::sleep(Duration::from_millis(1500));
    assert_eq!(s.traces().len(), 1, "a replay starts no second trace");
    let ours: Vec<String> = s
        .github
        .comment_bodies(5)
        .into_iter()
        .filter(|b| b.contains("Generated by Rover"))
        .collect();
    assert_eq!(ours.len(), 1, "answered once: {ours:?}");
    assert!(ours[0].contains("This was resolved in v2.1; please upgrade."));
    let (code, out) = daemon.stop();
    assert_eq!(code, Some(0), "graceful stop: {out}");
    assert!(out.contains("rover autopilot stopped"), "{out}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_or_missing_signatures_are_refused_and_nothing_is_stored() {
    let s = Scenario::new().await;
    s.github.add_issue(6, "Crash", "It crashes.", "alice", &[]);
    let daemon = Daemon::start(&s);
    let body = serde_json::to_vec(&webhook_body(
        "alice",
        &json!({"action": "opened", "issue": {"number": 6, "title": "Crash", "body": "It crashes.", "user": {"login": "alice"}}}),
    ))
    .unwrap();
    let wrong = sign(b"not the secret", &body);
    let (status, text) = daemon.deliver("issues", "d-bad", &body, Some(&wrong));
    assert_eq!(status, 401, "{text}");
    let (status, text) = daemon.deliver("issues", "d-none", &body, None);
    assert_eq!(status, 401, "{text}");
    // Signed for another body (tampered in transit).
    let mut tampered = body.clone();
    tampered.extend_from_slice(b" ");
    let (status, _) = daemon.deliver(
        "issues",
        "d-tampered",
        &tampered,
        Some(&sign(SECRET.as_bytes(), &body)),
    );
    assert_eq!(status, 401);
    // A ping answers pong; an event rover does not react to is accepted and skipped.
    let ping = json!({"zen": "Design for failure.", "hook_id": 1});
    let (status, text) = daemon.signed("ping", "d-ping", &webhook_body("alice", &ping));
    assert_eq!((status, text.trim()), (200, "pong"));
    let (status, text) = daemon.signed(
        "star",
        "d-star",
        &webhook_body("alice", &json!({"action": "created"})),
    );
    assert_eq!(status, 202, "{text}");
    assert!(text.contains("star"), "{text}");
    // Over GitHub's 25 MB: refused by its length before it is read.
    let head = format!(
        "POST /github HTTP/1.1\r\nHost: x\r\nX-GitHub-Event: issues\r\nX-GitHub-Delivery: d-big\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        26 * 1024 * 1024
    );
    let (status, _) = http(daemon.addr, head.as_bytes(), b"{}");
    assert_eq!(status, 413);
    std::thread::sleep(Duration::from_millis(1500));
    assert!(s.traces().is_empty(), "nothing is stored");
    assert!(
        std::fs::read_dir(s.store().root().join("spans")).map_or(0, Iterator::count) == 0,
        "no span written"
    );
    // The ping and the skipped event are in the intake log with their reasons; refused
    // deliveries (unauthenticated) are not.
    let records = s.store().read_intake().unwrap();
    let got: Vec<[&str; 4]> = records
        .iter()
        .map(|r| {
            [
                r.event_id.as_deref().unwrap_or(""),
                r.kind.as_deref().unwrap_or(""),
                r.outcome.as_str(),
                r.reason.as_deref().unwrap_or(""),
            ]
        })
        .collect();
    assert_eq!(
        got,
        [
            ["d-ping", "ping", "skipped", "ping: the webhook says hello"],
            [
                "d-star",
                "star",
                "skipped",
                "event type `star` is not one rover reacts to"
            ],
        ]
    );
    assert!(records.iter().all(|r| r.via == "webhook"));
    let out = s.env.rover(&["autopilot", "events"]);
    assert!(
        stdout(&out).contains("webhook   skipped   star created by alice (event d-star)"),
        "{}",
        stdout(&out)
    );
    let log = std::fs::read_to_string(s.store().log_path()).unwrap();
    assert!(log.contains("webhook delivery refused"), "{log}");
    assert!(!log.contains("It crashes."), "the body is never logged");
    let (code, out) = daemon.stop();
    assert_eq!(code, Some(0), "{out}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_event_by_webhook_and_by_polling_is_one_trace() {
    let mut s = Scenario::new().await;
    s.github.add_issue(5, "Export", "How?", "alice", &[]);
    s.github.add_issue(6, "Import", "How?", "alice", &[]);
    noop_answer(&mut s);
    let daemon = Daemon::start(&s);

    // Webhook first, then the feed serves the same comment (another id, trimmed payload).
    let first = comment_payload(5, 501, "How do I export?");
    let (status, text) = daemon.signed("issue_comment", "d-501", &webhook_body("alice", &first));
    assert_eq!(status, 200, "{text}");
    assert!(text.starts_with("ingested"), "{text}");
    s.github.seed_event(
        "IssueCommentEvent",
        "alice",
        json!({"action": "created", "issue": {"number": 5},
               "comment": {"id": 501, "body": "How do I export?", "html_url": "h"}}),
    );
    let polls = || {
        s.github
            .requests()
            .iter()
            .filter(|r| r.path.ends_with("/events"))
            .count()
    };
    let before = polls();
    wait_for("two more polls", || polls() >= before + 2);

    // The feed first, then the webhook brings the same comment.
    s.github.seed_event(
        "IssueCommentEvent",
        "alice",
        json!({"action": "created", "issue": {"number": 6},
               "comment": {"id": 601, "body": "How do I import?", "html_url": "h"}}),
    );
    wait_for("the polled trace", || s.traces().len() == 2);
    let second = comment_payload(6, 601, "How do I import?");
    let (status, text) = daemon.signed("issue_comment", "d-601", &webhook_body("alice", &second));
    assert_eq!(status, 200, "{text}");
    assert!(text.contains("already ingested by polling"), "{text}");

    wait_for("both traces to finish", || {
        s.traces()
            .iter()
            .all(|t| chain(t).last().map(String::as_str) == Some("noop:completed"))
    });
    let events: Vec<String> = s.traces().iter().map(|t| t.index.event.clone()).collect();
    assert_eq!(
        events,
        [
            "IssueCommentEvent created #5 by alice",
            "IssueCommentEvent created #6 by alice"
        ],
        "one trace per event"
    );
    let cursor = s.store().read_cursor().unwrap();
    let keys: Vec<(&str, &str, bool)> = cursor
        .event_keys
        .iter()
        .map(|k| (k.key.as_str(), k.via.as_str(), k.paired))
        .collect();
    assert_eq!(
        keys,
        [
            ("IssueCommentEvent:comment:501", "webhook", true),
            ("IssueCommentEvent:comment:501", "poll", true),
            ("IssueCommentEvent:comment:601", "poll", true),
            ("IssueCommentEvent:comment:601", "webhook", true),
        ]
    );
    // Each arrival is in the intake log: the second one of each event as a duplicate.
    let intake: Vec<(String, String, Option<u64>)> = s
        .store()
        .read_intake()
        .unwrap()
        .into_iter()
        .filter(|r| r.kind.as_deref() == Some("IssueCommentEvent"))
        .map(|r| (r.via, r.outcome.as_str().to_owned(), r.number))
        .collect();
    assert_eq!(
        intake,
        [
            ("webhook".to_owned(), "ingested".to_owned(), Some(5)),
            ("poll".to_owned(), "duplicate".to_owned(), Some(5)),
            ("poll".to_owned(), "ingested".to_owned(), Some(6)),
            ("webhook".to_owned(), "duplicate".to_owned(), Some(6)),
        ]
    );
    let (code, out) = daemon.stop();
    assert_eq!(code, Some(0), "{out}");
}

#[tokio::test]
async fn webhook_needs_its_secret_and_does_not_combine_with_once() {
    let s = Scenario::new().await;
    let out = s
        .start_command(&["--webhook", "127.0.0.1:0", "--once"])
        .env("ROVER_WEBHOOK_SECRET", SECRET)
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(2),
        "a usage error: {}",
        stderr(&out)
    );
    assert!(stderr(&out).contains("--once"), "{}", stderr(&out));
    let out = s
        .start_command(&["--webhook", "127.0.0.1:0"])
        .env_remove("ROVER_WEBHOOK_SECRET")
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(78),
        "{}{}",
        stdout(&out),
        stderr(&out)
    );
    assert!(
        stderr(&out).contains("ROVER_WEBHOOK_SECRET"),
        "{}",
        stderr(&out)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_completed_check_run_wakes_the_ci_watch_of_rovers_pr() {
    let mut s = Scenario::new().await;
    s.with_sandbox().await;
    // Rover would look at its PR's CI only in an hour; the check run says so sooner.
    crate::support::scenario::merge(
        &mut s.extra_config,
        &json!({"autopilot": {"pipeline": {"followCi": true, "ciPollSecs": 3600}}}),
    );
    s.github.ci_on_new_commits(&["success"]);
    crate::support::scenario::csv_issue(&mut s, 30);
    s.answer(NOTIFY, json!({"message": "Done."}));
    let daemon = Daemon::start(&s);
    let store = s.store();
    let scheduled = || {
        store.read_state().unwrap().pending.iter().any(|p| {
            p.action.as_str() == "coordinate"
                && p.not_before.is_some_and(|t| t > chrono::Utc::now())
        })
    };
    wait_for("the push and its scheduled ci watch", scheduled);
    let trace = s.the_trace();
    let push = first_span(&trace, "push");
    let sha = push.meta["headSha"].as_str().unwrap().to_owned();

    // A check run still running is no outcome: nothing wakes.
    let mut run = json!({"action": "created", "check_run": {"id": 7, "name": "ci / test", "head_sha": sha,
        "status": "in_progress", "conclusion": null}});
    let (code, text) = daemon.signed(
        "check_run",
        "ci-1",
        &webhook_body("github-actions[bot]", &run),
    );
    assert_eq!(code, 202, "{text}");
    assert!(text.contains("skipped"), "{text}");
    assert!(scheduled());

    run["action"] = json!("completed");
    run["check_run"]["status"] = json!("completed");
    run["check_run"]["conclusion"] = json!("success");
    let (code, text) = daemon.signed(
        "check_run",
        "ci-2",
        &webhook_body("github-actions[bot]", &run),
    );
    assert_eq!(code, 202, "{text}");
    assert!(text.contains("1 ci watch(es) look now"), "{text}");
    let ready = || {
        s.the_trace().spans.iter().any(|sp| {
            sp.step.as_str() == "notify"
                && sp.meta.get("purpose").and_then(Value::as_str) == Some("ready")
        })
    };
    wait_for("the ready notify", ready);
    let (code, _) = daemon.stop();
    assert_eq!(code, Some(0));
    assert_eq!(
        s.traces().len(),
        1,
        "a ci delivery makes no trace of its own"
    );
}

/// One delivery attempt that may meet a daemon being killed: the status, or `None` when the
/// connection failed or was cut before an answer (GitHub then shows it as failed, to redeliver).
fn try_deliver(addr: SocketAddr, event: &str, delivery: &str, body: &Value) -> Option<u16> {
    let body = serde_json::to_vec(body).unwrap();
    let head = format!(
        "POST /github HTTP/1.1\r\nHost: {addr}\r\nUser-Agent: GitHub-Hookshot/test\r\nContent-Type: application/json\r\nX-GitHub-Event: {event}\r\nX-GitHub-Delivery: {delivery}\r\nX-Hub-Signature-256: {}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        sign(SECRET.as_bytes(), &body),
        body.len()
    );
    let mut conn = TcpStream::connect_timeout(&addr, Duration::from_secs(2)).ok()?;
    conn.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
    conn.write_all(head.as_bytes()).ok()?;
    conn.write_all(&body).ok()?;
    let mut raw = Vec::new();
    let _ = conn.read_to_end(&mut raw);
    String::from_utf8_lossy(&raw)
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
}

/// SIGKILLs of a daemon taking webhooks and reconciling at random moments: every event that
/// came by webhook (redelivered until acknowledged, as GitHub's "Redeliver" does, and replayed
/// once more at the end) or only through the list APIs (reconcile) starts exactly one trace and
/// is answered exactly once; the store parses.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_during_webhook_intake_and_reconcile_loses_nothing_and_duplicates_nothing() {
    use crate::support::child::Rng;
    use crate::support::local::{assert_trace_sound, every_file_parses};
    use crate::support::scenario::{coordinate, merge};
    let mut s = Scenario::new().await;
    merge(
        &mut s.extra_config,
        &json!({"autopilot": {"github": {"poll": {"reconcileIntervalSecs": 1}},
                "pipeline": {"maxAttempts": 100}}}),
    );
    s.rules
        .push(json!({"prompt_contains": COORDINATE, "delay_ms": 150,
        "structured": coordinate("notify", json!({"message": "Use export."}))}));
    s.rules
        .push(json!({"prompt_contains": NOTIFY, "delay_ms": 150,
        "structured": {"message": "Use `widgets export --json`."}}));
    // The issues are old; the first start: nothing before it is rover's business.
    let issues: Vec<u64> = (201..213).collect();
    for n in &issues {
        s.github
            .add_issue(*n, &format!("Question {n}"), "How?", "alice", &[]);
    }
    s.github.backdate(3600);
    s.run_once().await;
    assert!(s.traces().is_empty());
    // While rover runs (and is killed), a comment on each: only in the list APIs, or also
    // delivered by webhook.
    let mut deliveries = Vec::new();
    for &n in &issues {
        let text = format!("How do I export {n}?");
        let id = s.github.add_comment(n, "alice", &text);
        // Two in three come by webhook too (and are in the lists): one trace either way.
        if n % 3 != 0 {
            deliveries.push((
                format!("d-{n}"),
                webhook_body("alice", &comment_payload(n, id, &text)),
            ));
        }
    }
    let seed = u64::from(std::process::id()) ^ 0x7e6b;
    let mut rng = Rng::new(seed);
    let mut acknowledged = std::collections::BTreeSet::new();
    let (mut kills, mut unanswered) = (0, 0);
    for _ in 0..8 {
        let mut daemon = Daemon::start(&s);
        let addr = daemon.addr;
        let pending: Vec<(String, Value)> = deliveries
            .iter()
            .filter(|(d, _)| !acknowledged.contains(d))
            .cloned()
            .collect();
        let sender = std::thread::spawn(move || {
            let (mut acked, mut failed) = (Vec::new(), 0);
            // Spread out, so that kills land in the middle of intake.
            for (delivery, body) in pending {
                if try_deliver(addr, "issue_comment", &delivery, &body) == Some(200) {
                    acked.push(delivery);
                } else {
                    failed += 1;
                }
                std::thread::sleep(Duration::from_millis(150));
            }
            (acked, failed)
        });
        tokio::time::sleep(Duration::from_millis(100 + rng.below(1200))).await;
        if daemon.child.try_wait().unwrap().is_none() {
            kills += 1;
        }
        let _ = daemon.child.kill(); // SIGKILL
        let _ = daemon.child.wait();
        let (acked, failed) = sender.join().unwrap();
        acknowledged.extend(acked);
        unanswered += failed;
    }
    // A last run that is not killed: GitHub redelivers what got no answer, and replays
    // everything once more; the daemon works until all is answered.
    let daemon = Daemon::start(&s);
    for (delivery, body) in &deliveries {
        let status = daemon.signed("issue_comment", delivery, body).0;
        assert!(
            status == 200 || status == 202,
            "delivery {delivery}: {status}"
        );
    }
    wait_for("every event answered", || {
        let traces = s.traces();
        traces.len() >= issues.len()
            && traces.iter().all(|t| {
                matches!(
                    rover::steps::kinds::trace_outcome(t),
                    rover::store::TraceOutcome::Finished { .. }
                )
            })
            && s.store().read_state().unwrap().pending.is_empty()
    });
    let (code, _) = daemon.stop();
    assert_eq!(code, Some(0));
    assert!(
        kills >= 3,
        "daemons cut off mid-run ({kills} kills, seed {seed})"
    );
    let traces = s.traces();
    assert_eq!(
        traces.len(),
        issues.len(),
        "one trace per event, whichever path and however often it came (seed {seed})"
    );
    let mut actions = 0;
    for t in &traces {
        actions += assert_trace_sound(t, true);
    }
    for n in &issues {
        let ours = s
            .github
            .comment_bodies(*n)
            .iter()
            .filter(|b| b.contains("Generated by Rover"))
            .count();
        assert_eq!(ours, 1, "issue {n} answered exactly once (seed {seed})");
    }
    let files = every_file_parses(s.store().root());
    eprintln!(
        "proof chaos (webhook + reconcile): {kills} SIGKILLs of `start --webhook` survived (seed {seed}), {} events ({} also by webhook, {} acknowledged before the last run, {unanswered} attempts cut off by a kill) → {} traces, {actions} actions, {files} store files parsed, 0 lost, 0 duplicated",
        issues.len(),
        deliveries.len(),
        acknowledged.len(),
        traces.len()
    );
}
