//! The dashboard in a real browser: Debian's chromium, headless, driven through chromedriver
//! (WebDriver) by `fantoccini`; `tests/setup-browser.sh` installs both (tests/run.sh runs it).
//! What a person sees: a running workflow on Now, then its completion without a reload; a
//! trace's every span in time order with its cost; a filter narrowing the list; a hostile
//! title rendered as text with no element injected and no script run; a cancel from the page.
//! It writes the screenshot the README shows (docs/dashboard.png). chromedriver and chromium
//! get a temporary directory of the test's own (`TMPDIR`, and the profile in it), removed when
//! the test ends: nothing of theirs is left in the system's temporary directory.

use std::collections::BTreeSet;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use fantoccini::{Client, ClientBuilder, Locator};
use rover::store::{Meta, SpanStatus};
use serde_json::json;

use crate::dashboard::{hostile_trace, Dashboard, HOSTILE_TITLE};
use crate::support::env::TestEnv;
use crate::support::storegen::example_store;

/// chromedriver on a free port of loopback, its and chromium's temporary files in `tmp`;
/// stopped, and `tmp` removed, on drop.
struct Driver {
    child: Child,
    url: String,
    tmp: tempfile::TempDir,
}

/// What chromium leaves in a temporary directory when it has none of its own.
fn chromium_leftovers(dir: &Path) -> BTreeSet<PathBuf> {
    std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .flatten()
                .filter(|e| {
                    e.file_name()
                        .to_string_lossy()
                        .contains("org.chromium.Chromium.")
                })
                .map(|e| e.path())
                .collect()
        })
        .unwrap_or_default()
}

impl Driver {
    fn start() -> Driver {
        let tmp = tempfile::Builder::new()
            .prefix("rover-browser-test-")
            .tempdir()
            .expect("a temporary directory for chromium");
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port();
        let child = Command::new("chromedriver")
            .arg(format!("--port={port}"))
            .env("TMPDIR", tmp.path())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("chromedriver (tests/setup-browser.sh installs chromium and chromium-driver)");
        let url = format!("http://127.0.0.1:{port}");
        let start = Instant::now();
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(
                start.elapsed() < Duration::from_secs(20),
                "chromedriver did not answer"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        Driver { child, url, tmp }
    }

    /// The profile chromium runs with, inside the test's temporary directory.
    fn profile(&self) -> PathBuf {
        self.tmp.path().join("profile")
    }
}

impl Drop for Driver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

async fn browser(driver: &Driver) -> Client {
    let mut caps = serde_json::Map::new();
    caps.insert(
        "goog:chromeOptions".into(),
        json!({
            "binary": "/usr/bin/chromium",
            "args": ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                     "--window-size=1280,900", "--no-first-run", "--disable-extensions",
                     format!("--user-data-dir={}", driver.profile().display())]
        }),
    );
    ClientBuilder::new(hyper_util::client::legacy::connect::HttpConnector::new())
        .capabilities(caps)
        .connect(&driver.url)
        .await
        .expect("a headless chromium session")
}

/// Waits (up to 10 s) until `script` returns true in the page.
async fn until(c: &Client, what: &str, script: &str) {
    let start = Instant::now();
    loop {
        let v = c
            .execute(script, vec![])
            .await
            .expect("run a check in the page");
        if v == json!(true) {
            return;
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "timed out: {what}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn rows(c: &Client, css: &str) -> usize {
    c.find_all(Locator::Css(css)).await.expect("find").len()
}

fn agent(cost: f64, input: u64, output: u64) -> serde_json::Value {
    json!({"costUsd": cost, "inputTokens": input, "outputTokens": output})
}

/// An issue taken to a pull request: coordinate, plan, two tasks (one retried), commit, push.
fn screenshot_trace(store: &rover::store::AutopilotStore) -> uuid::Uuid {
    use rover::store::StepKind;
    let mut gen = crate::support::storegen::Gen::new(21);
    let mut t = crate::support::storegen::TraceWriter::start(
        store,
        &mut gen,
        900_000,
        "IssuesEvent opened #42 by alice: Export the report as CSV",
    );
    let root = t.trace_id;
    let a = t.act(
        root,
        StepKind::Coordinate,
        "new issue from a collaborator",
        json!({}),
    );
    let c = t.run(
        &a,
        4_100,
        SpanStatus::Completed,
        "decided plan (confidence 0.91)",
        json!({"decision": "plan", "agent": agent(0.0312, 8_400, 610)}),
    );
    let a = t.act(
        c.id,
        StepKind::Plan,
        "two tasks: the export, then its tests",
        json!({}),
    );
    let p = t.run(
        &a,
        11_800,
        SpanStatus::Completed,
        "2 tasks",
        json!({"decision": "tasks", "agent": agent(0.0845, 15_200, 1_900)}),
    );
    let w1 = t.act(
        p.id,
        StepKind::Workflow,
        "add --format csv to the export",
        json!({}),
    );
    let w2 = t.act(
        p.id,
        StepKind::Workflow,
        "tests for the CSV export",
        json!({}),
    );
    let s1 = t.run(
        &w1,
        141_000,
        SpanStatus::Completed,
        "task completed: 3 files changed",
        json!({"agent": agent(0.6120, 182_000, 9_400)}),
    );
    t.clock += 2_000;
    let s2 = t.run(&w2, 38_000, SpanStatus::Failed, "the tests did not pass",
        json!({"agent": agent(0.2210, 61_000, 3_100), "error": {"message": "gate failed: cargo test exited with 101"}}));
    let r = t.act(s2.id, StepKind::Resolve, "a task failed", json!({}));
    let rs = t.run(
        &r,
        6_300,
        SpanStatus::Completed,
        "retry the tests with the fixture path fixed",
        json!({"decision": "retry", "agent": agent(0.0290, 7_900, 420)}),
    );
    let w2b = t.act(
        rs.id,
        StepKind::Workflow,
        "tests for the CSV export, again",
        json!({}),
    );
    let s2b = t.run(
        &w2b,
        52_000,
        SpanStatus::Completed,
        "task completed: 2 files changed",
        json!({"agent": agent(0.2950, 80_300, 4_200)}),
    );
    let k = t.act(s1.id, StepKind::Commit, "both tasks done", json!({}));
    let _ = s2b;
    let k = t.run(
        &k,
        1_200,
        SpanStatus::Completed,
        "committed 9c1e2f4 on rover/42-csv",
        json!({}),
    );
    let push = t.act(k.id, StepKind::Push, "open the pull request", json!({}));
    let pushed = t.run(
        &push,
        2_400,
        SpanStatus::Completed,
        "opened pull request #43",
        json!({}),
    );
    let n = t.act(
        pushed.id,
        StepKind::Notify,
        "say the pull request is open",
        json!({}),
    );
    t.run(&n, 900, SpanStatus::Completed, "answered on #42", json!({}));
    root
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_person_sees_live_runs_timelines_filters_and_hostile_text_as_text_and_cancels() {
    let env = TestEnv::new();
    let store = env.store();
    let example = example_store(&store);
    let hostile = hostile_trace(&store);
    let dash = Dashboard::start(&env, &["--allow-actions"], &[]);
    let base = format!("http://{}", dash.addr);
    let driver = Driver::start();
    let system_tmp = driver.tmp.path().parent().expect("a parent").to_owned();
    let before = chromium_leftovers(&system_tmp);
    let c = browser(&driver).await;

    // Now: the running workflow, then its completion, without a reload.
    let view = store.load_trace(example).unwrap();
    let running = view
        .spans
        .iter()
        .find(|s| s.status == SpanStatus::Running)
        .unwrap()
        .clone();
    c.goto(&format!("{base}/")).await.unwrap();
    let row = format!("tr.run[data-span=\"{}\"]", running.id);
    until(
        &c,
        "the running workflow",
        &format!("return document.querySelector('{row}') !== null"),
    )
    .await;
    // Read in one script: a live update may replace the row between a find and a read.
    let step = c
        .execute(
            &format!("return document.querySelector('{row} td.step').textContent.trim()"),
            vec![],
        )
        .await
        .unwrap();
    assert_eq!(step, "workflow");
    c.execute("window.roverMark = 'same page'; return true", vec![])
        .await
        .unwrap();
    until(
        &c,
        "the live stream connected",
        "return document.getElementById('now').hasAttribute('data-updates')",
    )
    .await;
    let mut done = running.clone();
    let action = running.action_id.unwrap();
    let ended = running.timestamp + chrono::Duration::seconds(95);
    done.finish(
        SpanStatus::Completed,
        "task completed: 2 files changed",
        Meta::new(),
        ended,
    )
    .unwrap();
    store.write_span(&done).unwrap();
    store
        .transact(|txn| {
            txn.remove_pending(action)?;
            txn.add_to_trace(example, &[done.id], &[], ended)
        })
        .unwrap();
    until(
        &c,
        "the completion shown live",
        &format!("return document.querySelector('{row}') === null"),
    )
    .await;
    let mark = c
        .execute("return window.roverMark || null", vec![])
        .await
        .unwrap();
    assert_eq!(mark, json!("same page"), "no reload");

    // A trace: every span, in time order, with its cost.
    c.goto(&format!("{base}/trace/{example}")).await.unwrap();
    let view = store.load_trace(example).unwrap();
    let starts = c
        .execute(
            "return Array.from(document.querySelectorAll('tr.span')).map(r => [r.dataset.span, Number(r.dataset.startMs)])",
            vec![],
        )
        .await
        .unwrap();
    let starts = starts.as_array().unwrap();
    assert_eq!(starts.len(), view.spans.len());
    let mut by_time = view.spans.clone();
    by_time.sort_by_key(|s| s.timestamp);
    let shown: Vec<String> = starts
        .iter()
        .map(|p| p[0].as_str().unwrap().to_owned())
        .collect();
    let expected: Vec<String> = by_time.iter().map(|s| s.id.to_string()).collect();
    assert_eq!(shown, expected, "every span, in time order");
    let bars = rows(&c, "svg#waterfall g.bar rect").await;
    assert_eq!(bars, view.spans.len());
    // The README's picture: a trace with its spend, as a person opens it.
    let shown = screenshot_trace(&store);
    c.goto(&format!("{base}/trace/{shown}")).await.unwrap();
    assert_eq!(rows(&c, "svg#waterfall g.bar").await, 10);
    std::fs::write(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/dashboard.png"),
        c.screenshot().await.unwrap(),
    )
    .unwrap();

    // The hostile trace: its title and summary are text; nothing ran, nothing was injected.
    c.goto(&format!("{base}/trace/{hostile}")).await.unwrap();
    let title = c
        .find(Locator::Id("event"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(title.ends_with(HOSTILE_TITLE), "{title}");
    assert_eq!(rows(&c, "main img").await, 0, "no injected image");
    assert_eq!(rows(&c, "main script").await, 0, "no injected script");
    let page_title = c.title().await.unwrap();
    assert!(!page_title.contains("pwned"), "a script ran: {page_title}");
    let cost = c.find(Locator::Css("td.cost")).await;
    let costs = c.find_all(Locator::Css("td.cost")).await.unwrap();
    let mut texts = Vec::new();
    for cell in costs {
        texts.push(cell.text().await.unwrap());
    }
    assert!(
        cost.is_ok() && texts.contains(&"$0.0421".to_owned()),
        "{texts:?}"
    );

    // The list, narrowed by a filter.
    c.goto(&format!("{base}/traces")).await.unwrap();
    assert_eq!(rows(&c, "tr.trace").await, 3);
    c.find(Locator::Css("select[name=outcome] option[value=completed]"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    c.find(Locator::Css("#filters button"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    until(
        &c,
        "the filtered list",
        "return location.search.includes('outcome=completed')",
    )
    .await;
    let mut listed = Vec::new();
    for row in c.find_all(Locator::Css("tr.trace")).await.unwrap() {
        listed.push(row.attr("data-trace").await.unwrap().unwrap_or_default());
    }
    assert!(listed.contains(&hostile.to_string()), "{listed:?}");
    assert!(
        !listed.contains(&example.to_string()),
        "the running trace is filtered out"
    );
    assert!(listed.len() < 3);

    // Cancel from the page.
    c.goto(&format!("{base}/trace/{example}")).await.unwrap();
    c.find(Locator::Id("cancel"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    until(
        &c,
        "the trace page again",
        "return document.getElementById('outcome') !== null",
    )
    .await;
    let cancel = store
        .load_trace(example)
        .unwrap()
        .spans
        .into_iter()
        .find(|s| s.step.as_str() == "cancel")
        .expect("the page cancelled the trace");
    assert_eq!(cancel.meta["by"], "dashboard");
    c.close().await.unwrap();
    let own = driver.tmp.path().to_owned();
    drop(driver);
    assert!(!own.exists(), "the test's temporary directory is removed");
    let left: Vec<_> = chromium_leftovers(&system_tmp)
        .difference(&before)
        .cloned()
        .collect();
    assert!(
        left.is_empty(),
        "chromium left {left:?} in {}",
        system_tmp.display()
    );
}
