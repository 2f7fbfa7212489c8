//! Intake that loses nothing: the poller follows the feed's `Link` pages until it meets an event
//! it has seen, says when events may have been missed, and every event rover does not act on is
//! in `rover autopilot events` with its reason; the first start says what backlog it skipped.

use axum::http::Method;
use rover::github::{OctoGitHub, PollSettings};
use rover::intake::poll::{poll_github, resume_poller};
use rover::store::{AutopilotStore, IntakeOutcome};
use serde_json::{json, Value};

use crate::support::env::{stderr, stdout};
use crate::support::fake_github::{FakeGitHub, BOT, REPO, REPO_ID};
use crate::support::scenario::{chain, merge, Scenario, COORDINATE};

const SHA: &str = "184cb4b61e26de7cccc385d37da25cd8bd817d27";

fn client(fake: &FakeGitHub) -> OctoGitHub {
    fake.client()
}

fn settings() -> PollSettings {
    PollSettings {
        min_interval_secs: 0,
        skip_backlog: false,
        ..PollSettings::default()
    }
}

/// One poll by a poller resumed from the store's cursor, as after a restart (so no poll
/// interval is waited for).
async fn poll(store: &AutopilotStore, gh: &OctoGitHub) -> rover::intake::poll::IngestReport {
    let mut poller = resume_poller(store, settings()).unwrap();
    poll_github(
        store,
        &rover::intake::Entry::new("p", rover::steps::kinds::FIRST_STEP),
        gh,
        &mut poller,
    )
    .await
    .unwrap()
}

/// Seed `n` issue comments (comment ids `first..first+n`) as feed events.
fn seed_comments(fake: &FakeGitHub, first: u64, n: u64) {
    for id in first..first + n {
        fake.seed_event(
            "IssueCommentEvent",
            "alice",
            json!({"action": "created", "issue": {"number": 7},
                   "comment": {"id": id, "body": format!("comment {id}"), "html_url": "h"}}),
        );
    }
}

/// The `(path, page, if-none-match sent)` of every events request so far.
fn event_requests(fake: &FakeGitHub) -> Vec<(String, String, bool)> {
    fake.requests()
        .into_iter()
        .filter(|r| r.path.ends_with("/events"))
        .map(|r| {
            let page = r
                .query
                .split('&')
                .find_map(|kv| kv.strip_prefix("page="))
                .unwrap_or("1")
                .to_owned();
            (r.path, page, r.headers.contains_key("if-none-match"))
        })
        .collect()
}

/// The comment ids of the intake records of ingested events, in the order they were ingested.
fn ingested_comment_ids(store: &AutopilotStore) -> Vec<u64> {
    store
        .read_intake()
        .unwrap()
        .iter()
        .filter(|r| r.outcome == IntakeOutcome::Ingested)
        .map(|r| {
            let trace = store.load_trace(r.trace_id.unwrap()).unwrap();
            let root = trace.root().unwrap();
            root.meta["event"]["commentId"].as_u64().unwrap()
        })
        .collect()
}

/// `rover autopilot start` with `args`, run to its end: it exits 0 (its stderr in the failure).
async fn start_ok(s: &Scenario, args: &[&str]) -> std::process::Output {
    let mut cmd = s.start_command(args);
    let out = tokio::task::spawn_blocking(move || cmd.output().unwrap())
        .await
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    out
}

/// The comment ids of the events the traces started from.
fn comment_ids(s: &Scenario) -> std::collections::BTreeSet<u64> {
    s.traces()
        .iter()
        .map(|t| {
            t.root().unwrap().meta["event"]["commentId"]
                .as_u64()
                .unwrap()
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_pages_are_followed_and_250_new_events_ingested_once_oldest_first() {
    let fake = FakeGitHub::start().await;
    seed_comments(&fake, 1, 10);
    let gh = client(&fake);
    let dir = tempfile::tempdir().unwrap();
    let store = AutopilotStore::open(dir.path(), "pages").unwrap();
    let report = poll(&store, &gh).await;
    assert_eq!((report.new_traces.len(), report.pages), (10, 1));

    seed_comments(&fake, 11, 250);
    let report = poll(&store, &gh).await;
    assert_eq!(report.new_traces.len(), 250, "{report:?}");
    assert_eq!(report.pages, 3);
    assert_eq!(report.gap, None, "page 3 still has seen ids");
    let feed = format!("/repositories/{REPO_ID}/events");
    let repo_events = format!("/repos/{REPO}/events");
    assert_eq!(
        event_requests(&fake),
        [
            (repo_events.clone(), "1".to_owned(), false),
            (repo_events.clone(), "1".to_owned(), true),
            (feed.clone(), "2".to_owned(), false),
            (feed, "3".to_owned(), false),
        ],
        "page 1 with the ETag, pages 2 and 3 by the Link header without it"
    );
    assert_eq!(
        ingested_comment_ids(&store),
        (1..=260).collect::<Vec<_>>(),
        "each once, oldest first"
    );
    assert_eq!(store.recent_traces(1000).unwrap().len(), 260);

    // Nothing new: a free 304, no further page.
    let report = poll(&store, &gh).await;
    assert!(report.not_modified && report.new_traces.is_empty());
    assert_eq!(event_requests(&fake).len(), 5);
    assert!(fake.unknown_requests().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paging_stops_at_the_first_page_with_a_seen_id() {
    let fake = FakeGitHub::start().await;
    seed_comments(&fake, 1, 20);
    let gh = client(&fake);
    let dir = tempfile::tempdir().unwrap();
    let store = AutopilotStore::open(dir.path(), "stop").unwrap();
    poll(&store, &gh).await;
    seed_comments(&fake, 21, 150);
    let report = poll(&store, &gh).await;
    assert_eq!(report.new_traces.len(), 150);
    assert_eq!(report.pages, 2, "page 2 holds seen ids: no page 3");
    assert_eq!(report.gap, None);
    assert_eq!(event_requests(&fake).len(), 3);
    // Resumed from the cursor, the next poll asks for nothing more than page 1.
    let report = poll(&store, &gh).await;
    assert!(report.not_modified, "{report:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gap_is_reported_when_every_seen_id_is_gone_from_the_feed() {
    let fake = FakeGitHub::start().await;
    seed_comments(&fake, 1, 5);
    let gh = client(&fake);
    let dir = tempfile::tempdir().unwrap();
    let store = AutopilotStore::open(dir.path(), "gap").unwrap();
    poll(&store, &gh).await;
    // Rover was down for long: what it saw has aged out of the feed.
    fake.clear_events();
    seed_comments(&fake, 100, 3);
    let report = poll(&store, &gh).await;
    assert_eq!(
        report.new_traces.len(),
        3,
        "what is served is still ingested"
    );
    let gap = report.gap.expect("a gap");
    assert!(gap.contains("none of the 5 event ids seen before"), "{gap}");
    let notices: Vec<String> = store
        .read_intake()
        .unwrap()
        .into_iter()
        .filter(|r| r.outcome == IntakeOutcome::Notice)
        .filter_map(|r| r.reason)
        .collect();
    assert_eq!(notices.len(), 1, "{notices:?}");
    assert!(notices[0].starts_with("gap: none of the 5"), "{notices:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_low_rate_limit_stops_paging_and_says_events_may_be_missed() {
    let fake = FakeGitHub::start().await;
    seed_comments(&fake, 1, 5);
    let gh = client(&fake);
    let dir = tempfile::tempdir().unwrap();
    let store = AutopilotStore::open(dir.path(), "rate").unwrap();
    poll(&store, &gh).await;
    seed_comments(&fake, 10, 150);
    fake.set_rate_remaining(50);
    let report = poll(&store, &gh).await;
    assert_eq!(report.pages, 1, "no page 2 with 49 requests left");
    assert_eq!(report.new_traces.len(), 100);
    let gap = report.gap.expect("a gap");
    assert!(gap.contains("requests left in the rate limit"), "{gap}");
}

fn events_json(s: &Scenario) -> Vec<Value> {
    let out = s.env.rover(&["autopilot", "events", "--json"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    serde_json::from_str::<Value>(&stdout(&out))
        .unwrap()
        .as_array()
        .unwrap()
        .clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn autopilot_events_lists_every_event_with_what_became_of_it() {
    let mut s = Scenario::new().await;
    s.github.add_issue(7, "Crash", "boom", "alice", &[]);
    s.github.add_issue(9, "Leak", "drip", "mallory", &[]);
    s.answer(COORDINATE, json!({"decision": "noop", "confidence": 0.9, "reasoning": "Nothing to do.", "directive": null, "task": null, "message": null, "condition": null, "task_id": null}));
    s.github
        .seed_event("WatchEvent", "carol", json!({"action": "started"}));
    s.github.seed_event(
        "IssuesEvent",
        "alice",
        json!({"action": "milestoned", "issue": {"number": 7}}),
    );
    s.github.seed_event(
        "IssueCommentEvent",
        BOT,
        json!({"action": "created", "issue": {"number": 7}, "comment": {"id": 70, "body": "on it"}}),
    );
    s.github.seed_event(
        "IssueCommentEvent",
        "alice",
        json!({"action": "created", "issue": {"number": 7}, "comment": {"body": "no id"}}),
    );
    s.github.seed_event(
        "IssueCommentEvent",
        "alice",
        json!({"action": "created", "issue": {"number": 7}, "comment": {"id": 71, "body": "please look"}}),
    );
    s.github.seed_event(
        "IssuesEvent",
        "mallory",
        json!({"action": "opened", "issue": {"number": 9, "title": "Leak", "body": "drip"}}),
    );
    s.run_once().await;
    assert_eq!(s.traces().len(), 2);
    assert!(s
        .traces()
        .iter()
        .all(|t| chain(t).last().map(String::as_str) == Some("noop:completed")));

    let out = s.env.rover(&["autopilot", "events"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let text = stdout(&out);
    for expected in [
        "skipped   WatchEvent started by carol",
        "event type WatchEvent is not one rover reacts to",
        "skipped   IssuesEvent milestoned #7 by alice",
        "action `milestoned` is not one rover reacts to",
        &format!("skipped   IssueCommentEvent created #7 by {BOT}"),
        "rover's own event",
        "malformed payload: no comment id",
        "ingested  IssueCommentEvent created #7 by alice",
        "ingested  IssuesEvent opened #9 by mallory",
        "[noop: untrusted author",
    ] {
        assert!(text.contains(expected), "{expected:?} in:\n{text}");
    }
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 6, "one line per event:\n{text}");
    assert!(lines.iter().all(|l| l.contains("  poll ")), "{text}");

    let records = events_json(&s);
    assert_eq!(records.len(), 6);
    let untrusted = records
        .iter()
        .find(|r| r["number"] == 9)
        .expect("the untrusted author's issue");
    assert_eq!(untrusted["outcome"], "ingested");
    assert_eq!(untrusted["type"], "IssuesEvent");
    assert_eq!(untrusted["actor"], "mallory");
    assert_eq!(untrusted["via"], "poll");
    assert!(untrusted["traceId"].is_string());
    assert!(
        untrusted["traceOutcome"]
            .as_str()
            .unwrap()
            .starts_with("noop: untrusted author"),
        "{untrusted}"
    );
    let limited = s.env.rover(&["autopilot", "events", "--limit", "2"]);
    assert_eq!(stdout(&limited).lines().count(), 2);
    assert!(stdout(&limited).contains("#9 by mallory"), "newest last");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_corrupt_intake_log_is_an_error_naming_the_file() {
    let s = Scenario::new().await;
    let store = s.store();
    std::fs::create_dir_all(store.autopilot_dir()).unwrap();
    std::fs::write(store.intake_path(), "{\"at\": 1}\n").unwrap();
    let out = s.env.rover(&["autopilot", "events"]);
    assert_eq!(out.status.code(), Some(65));
    let err = stderr(&out);
    assert!(
        err.contains("intake.jsonl") && err.contains("line 1"),
        "{err}"
    );
}

fn skip_backlog(s: &mut Scenario) {
    merge(
        &mut s.extra_config,
        &json!({"autopilot": {"github": {"poll": {"skipBacklog": true}}}}),
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_first_start_says_how_much_backlog_it_skipped_and_backlog_n_processes_the_newest() {
    let mut s = Scenario::new().await;
    skip_backlog(&mut s);
    s.github.add_issue(7, "Crash", "boom", "alice", &[]);
    s.answer(COORDINATE, json!({"decision": "noop", "confidence": 0.9, "reasoning": "Nothing to do.", "directive": null, "task": null, "message": null, "condition": null, "task_id": null}));
    s.github
        .seed_event("WatchEvent", "carol", json!({"action": "started"}));
    for id in 1..=5 {
        s.github.seed_event(
            "IssueCommentEvent",
            "alice",
            json!({"action": "created", "issue": {"number": 7},
                   "comment": {"id": id, "body": format!("comment {id}")}}),
        );
    }
    let out = s.run_once().await;
    let text = stdout(&out);
    assert!(
        text.contains("first start: skipped 5 backlog event(s) already in the feed")
            && text.contains("rover autopilot start --backlog N"),
        "{text}"
    );
    assert!(s.traces().is_empty());
    let log = std::fs::read_to_string(s.store().log_path()).unwrap();
    assert!(
        log.lines().any(
            |l| l.contains("\"INFO\"") && l.contains("first start: skipped 5 backlog event(s)")
        ),
        "{log}"
    );
    let records = events_json(&s);
    let backlog = records
        .iter()
        .filter(|r| r["reason"].as_str().unwrap_or("").starts_with("backlog:"))
        .count();
    assert_eq!(backlog, 5, "{records:?}");
    assert!(records
        .iter()
        .any(|r| r["outcome"] == "notice"
            && r["reason"].as_str().unwrap().contains("skipped 5 backlog")));

    // Restarted with `--backlog 2`: the two most recent are processed, nothing else.
    start_ok(&s, &["--once", "--backlog", "2"]).await;
    let mut events: Vec<String> = s.traces().iter().map(|t| t.index.event.clone()).collect();
    events.sort();
    assert_eq!(events.len(), 2);
    let comment_ids = comment_ids(&s);
    assert_eq!(comment_ids, [4, 5].into());
    // And only once: a plain restart processes nothing more.
    s.run_once().await;
    assert_eq!(s.traces().len(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backlog_2_on_a_first_start_processes_the_two_most_recent() {
    let mut s = Scenario::new().await;
    skip_backlog(&mut s);
    s.github.add_issue(7, "Crash", "boom", "alice", &[]);
    s.answer(COORDINATE, json!({"decision": "noop", "confidence": 0.9, "reasoning": "Nothing to do.", "directive": null, "task": null, "message": null, "condition": null, "task_id": null}));
    for id in 1..=4 {
        s.github.seed_event(
            "IssueCommentEvent",
            "alice",
            json!({"action": "created", "issue": {"number": 7},
                   "comment": {"id": id, "body": format!("comment {id}")}}),
        );
    }
    let out = start_ok(&s, &["--once", "--backlog", "2"]).await;
    assert!(
        stdout(&out).contains("first start: skipped 2 backlog event(s)"),
        "{}",
        stdout(&out)
    );
    let comment_ids = comment_ids(&s);
    assert_eq!(comment_ids, [3, 4].into());
    assert!(s
        .traces()
        .iter()
        .all(|t| chain(t).last().map(String::as_str) == Some("noop:completed")));
    assert_eq!(s.github.count(&Method::GET, "/events"), 1);
}

fn enable_reconcile(s: &mut Scenario) {
    merge(
        &mut s.extra_config,
        &json!({"autopilot": {"github": {"poll": {"reconcileIntervalSecs": 900}}}}),
    );
}

fn noop(s: &mut Scenario) {
    s.answer(COORDINATE, json!({"decision": "noop", "confidence": 0.9, "reasoning": "Nothing to do.", "directive": null, "task": null, "message": null, "condition": null, "task_id": null}));
}

/// The `(via, outcome, type, number, actor)` of each intake record about an event.
fn intake_rows(s: &Scenario) -> Vec<(String, String, String, Option<u64>, String)> {
    s.store()
        .read_intake()
        .unwrap()
        .into_iter()
        .filter(|r| r.outcome != IntakeOutcome::Notice)
        .map(|r| {
            (
                r.via,
                r.outcome.as_str().to_owned(),
                r.kind.unwrap_or_default(),
                r.number,
                r.actor.unwrap_or_default(),
            )
        })
        .collect()
}

fn row(
    via: &str,
    outcome: &str,
    kind: &str,
    number: u64,
    actor: &str,
) -> (String, String, String, Option<u64>, String) {
    (
        via.into(),
        outcome.into(),
        kind.into(),
        Some(number),
        actor.into(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_reconciles_what_only_the_list_apis_show_through_the_same_filters() {
    let mut s = Scenario::new().await;
    enable_reconcile(&mut s);
    noop(&mut s);
    s.github.add_issue(7, "Crash", "boom", "alice", &[]);
    s.github.add_comment(7, "alice", "It crashes on start.");
    s.github
        .add_pull(8, "Rename the parser", "alice", "rename", SHA, "main");
    s.github
        .seed_event("WatchEvent", "carol", json!({"action": "started"}));
    s.github.backdate(3600);
    s.run_once().await;
    assert!(s.traces().is_empty(), "the past is not reconciled");

    // While rover is down, things happen that the feed never shows, and one it does.
    s.github
        .add_issue(12, "Export fails", "on csv", "alice", &[]);
    let news = s.github.add_comment(7, "alice", "Any news?");
    s.github
        .add_comment(7, "mallory", "Run this script for me.");
    s.github.add_comment(7, BOT, "Looking into it.");
    s.github.add_review(
        8,
        "bob",
        "CHANGES_REQUESTED",
        "Please keep the old name too.",
    );
    s.github
        .add_review_comment(8, "bob", "Why this name?", None);
    let both = s.github.add_comment(7, "bob", "Me too.");
    s.github.seed_event(
        "IssueCommentEvent",
        "bob",
        json!({"action": "created", "issue": {"number": 7},
               "comment": {"id": both, "body": "Me too.", "html_url": "h"}}),
    );
    let out = s.run_once().await;
    let text = stdout(&out);
    assert!(
        text.contains("reconcile (restart): 5 event(s) the feed and webhooks missed"),
        "{text}"
    );
    let mut rows = intake_rows(&s);
    rows.sort();
    let mut expected = vec![
        row("poll", "ingested", "IssueCommentEvent", 7, "bob"),
        row("reconcile", "ingested", "IssuesEvent", 12, "alice"),
        row("reconcile", "ingested", "IssueCommentEvent", 7, "alice"),
        row("reconcile", "ingested", "IssueCommentEvent", 7, "mallory"),
        row("reconcile", "ingested", "PullRequestReviewEvent", 8, "bob"),
        row(
            "reconcile",
            "ingested",
            "PullRequestReviewCommentEvent",
            8,
            "bob",
        ),
    ];
    let mut watch = row("poll", "skipped", "WatchEvent", 0, "carol");
    watch.3 = None;
    expected.push(watch);
    expected.sort();
    assert_eq!(
        rows, expected,
        "bob's comment came by the feed first: the sweep leaves it; rover's own is not an event"
    );
    let traces = s.traces();
    assert_eq!(traces.len(), 6, "one trace per event");
    let ids: Vec<String> = traces
        .iter()
        .map(|t| {
            t.root().unwrap().meta["event"]["id"]
                .as_str()
                .unwrap()
                .to_owned()
        })
        .collect();
    assert!(
        ids.contains(&format!("reconcile:IssueCommentEvent:comment:{news}")),
        "{ids:?}"
    );
    assert!(ids.contains(&"reconcile:IssuesEvent:opened:#12".to_owned()));
    let records = events_json(&s);
    let mallory = records
        .iter()
        .find(|r| r["actor"] == "mallory")
        .expect("mallory's comment");
    assert!(
        mallory["traceOutcome"]
            .as_str()
            .unwrap()
            .starts_with("noop: untrusted author"),
        "reconciled events meet the same trust check: {mallory}"
    );
    let cursor = s.store().read_cursor().unwrap();
    assert!(cursor.reconcile.and_then(|r| r.last_run_at).is_some());

    // The next sweep overlaps the last one: nothing is ingested twice.
    s.run_once().await;
    assert_eq!(s.traces().len(), 6);
    assert_eq!(intake_rows(&s).len(), 7);
    let listed = s.env.rover(&["autopilot", "events"]);
    assert!(
        stdout(&listed).contains("reconcile ingested  IssuesEvent opened #12 by alice"),
        "{}",
        stdout(&listed)
    );
}

/// A running daemon with its stdout collected.
struct Daemon {
    child: std::process::Child,
    out: std::sync::Arc<std::sync::Mutex<String>>,
}

impl Daemon {
    fn start(s: &Scenario) -> Daemon {
        use std::io::BufRead;
        let mut child = s
            .start_command(&[])
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("start rover");
        let out = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
        let sink = out.clone();
        let reader = std::io::BufReader::new(child.stdout.take().unwrap());
        std::thread::spawn(move || {
            for line in reader.lines().map_while(Result::ok) {
                let mut all = sink.lock().unwrap();
                all.push_str(&line);
                all.push('\n');
            }
        });
        Daemon { child, out }
    }

    fn output(&self) -> String {
        self.out.lock().unwrap().clone()
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Wait for the daemon to get somewhere (it polls the fake every second).
fn wait_for(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while !done() {
        assert!(std::time::Instant::now() < deadline, "waited for {what}");
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gap_in_the_feed_triggers_a_reconcile_and_the_feed_later_finds_the_same_event() {
    let mut s = Scenario::new().await;
    enable_reconcile(&mut s);
    noop(&mut s);
    s.github.add_issue(7, "Crash", "boom", "alice", &[]);
    s.github
        .seed_event("WatchEvent", "carol", json!({"action": "started"}));
    s.github.backdate(3600);
    let daemon = Daemon::start(&s);
    wait_for("the first poll", || {
        s.store().read_intake().is_ok_and(|r| !r.is_empty())
    });

    // Everything rover saw ages out of the feed, and a comment is lost with it.
    s.github.clear_events();
    let lost = s.github.add_comment(7, "alice", "Still broken on v2.");
    s.github
        .seed_event("WatchEvent", "dave", json!({"action": "started"}));
    let notices = || -> Vec<String> {
        s.store()
            .read_intake()
            .unwrap()
            .into_iter()
            .filter(|r| r.outcome == IntakeOutcome::Notice)
            .filter_map(|r| r.reason)
            .collect()
    };
    // The reconcile's notice is written after its traces.
    wait_for("the reconcile", || notices().len() == 2);
    let trace = s.the_trace();
    assert_eq!(
        trace.root().unwrap().meta["event"]["id"],
        format!("reconcile:IssueCommentEvent:comment:{lost}")
    );
    let notices = notices();
    assert!(
        notices[0].starts_with("gap: none of the 1 event ids seen before"),
        "{notices:?}"
    );
    assert!(
        notices[1].starts_with("reconcile (a gap in the events feed): 1 event(s)"),
        "{notices:?}"
    );

    // GitHub's feed catches up and serves the same comment: it is folded into the trace.
    s.github.seed_event(
        "IssueCommentEvent",
        "alice",
        json!({"action": "created", "issue": {"number": 7},
               "comment": {"id": lost, "body": "Still broken on v2.", "html_url": "h"}}),
    );
    wait_for("the feed's copy", || {
        intake_rows(&s).contains(&row("poll", "duplicate", "IssueCommentEvent", 7, "alice"))
    });
    assert_eq!(
        s.traces().len(),
        1,
        "one trace for the event seen both ways"
    );
    wait_for("the trace to finish", || {
        chain(&s.the_trace()).last().map(String::as_str) == Some("noop:completed")
    });
    let out = daemon.output();
    assert!(
        out.contains("warning: a gap in the events feed may exist: none of the 1 event ids"),
        "{out}"
    );
    assert!(
        out.contains(
            "reconcile (a gap in the events feed): 1 event(s) the feed and webhooks missed"
        ),
        "{out}"
    );
}

/// A poll cursor that does not parse is an error naming `cursor.json`, never a silent restart
/// of the feed (which would re-read the backlog); a good one survives a restart.
#[test]
fn a_poll_cursor_that_does_not_parse_is_an_error_naming_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let store = AutopilotStore::open(dir.path(), "poll-cursor").unwrap();
    store
        .transact(|txn| {
            txn.cursor_mut()?.poll = Some(rover::store::PollCursor {
                etag: Some("\"e1\"".into()),
                seen: ["1".to_owned()].into(),
                primed: true,
            });
            Ok(())
        })
        .unwrap();
    let poller = resume_poller(&store, settings()).unwrap();
    assert_eq!(poller.cursor().etag.as_deref(), Some("\"e1\""));
    assert!(poller.cursor().primed);

    let path = store.cursor_path();
    let mut cursor: Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    assert_eq!(cursor["poll"]["etag"], "\"e1\"", "{cursor}");
    cursor["poll"] = json!({"etag": 7, "seen": "not a list"});
    std::fs::write(&path, serde_json::to_vec(&cursor).unwrap()).unwrap();
    let err = resume_poller(&store, settings())
        .map(|_| ())
        .expect_err("a cursor that does not parse");
    assert!(err.to_string().contains("cursor.json"), "{err}");
}

/// `events` lists local requests too, with their source, so it is every event rover was told
/// about whatever the path.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn autopilot_events_lists_local_requests_with_their_source() {
    let s = Scenario::new().await;
    let out = s
        .env
        .rover(&["autopilot", "submit", "Add a --json flag to export"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let records = events_json(&s);
    assert_eq!(records.len(), 1, "{records:?}");
    assert_eq!(records[0]["via"], json!("local"));
    assert_eq!(records[0]["outcome"], json!("ingested"));
    assert_eq!(records[0]["type"], json!("LocalRequest"));
    let trace = records[0]["traceId"].as_str().expect("a trace").to_owned();
    assert_eq!(s.traces().len(), 1);
    assert_eq!(s.traces()[0].index.trace_id.to_string(), trace);
    let text = crate::support::env::stdout(&s.env.rover(&["autopilot", "events"]));
    assert!(
        text.contains("local") && text.contains("LocalRequest"),
        "{text}"
    );
}
