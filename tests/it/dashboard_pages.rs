//! The dashboard's newer parts over HTTP, against the real binary: each running agent's last
//! output line on Now, read from its log's tail and escaped; the proxy's recent refusals, live
//! and recorded; the spend by model on Outcomes; the lessons, their forget and pin; a store
//! created after the dashboard started, watched.

use std::io::Write;

use chrono::{TimeZone, Utc};
use rover::proxy::{Ledger, Refusal, TokenUsage};
use rover::store::{AutopilotStore, SpanStatus, StepKind};
use serde_json::json;

use crate::dashboard::{csrf_of, read_until, Dashboard};
use crate::memory::seeded_book;
use crate::support::env::TestEnv;
use crate::support::storegen::{example_store, Gen, TraceWriter};

/// An agent's text written to break out of the page and steer a terminal.
const HOSTILE_SAID: &str =
    "<script>document.title='pwned'</script> \u{1b}[31mall red\u{1b}[0m\u{7}";

/// Claude's stream-json lines: a long first stretch (the tail read skips it), a tool call,
/// then the hostile text.
fn agent_log() -> String {
    let assistant = |block: serde_json::Value| {
        json!({"type": "assistant", "message": {"role": "assistant", "content": [block]}})
            .to_string()
    };
    let mut log = String::new();
    for i in 0..2_000 {
        log.push_str(&assistant(
            json!({"type": "text", "text": format!("early line {i}")}),
        ));
        log.push('\n');
    }
    log.push_str(&assistant(
        json!({"type": "tool_use", "name": "Bash", "input": {"command": "cargo test"}}),
    ));
    log.push('\n');
    log.push_str(&assistant(json!({"type": "text", "text": HOSTILE_SAID})));
    log.push('\n');
    log
}

#[test]
fn now_shows_each_running_agents_last_output_line_escaped() {
    let env = TestEnv::new();
    let store = env.store();
    let example = example_store(&store);
    let running = store
        .load_trace(example)
        .unwrap()
        .spans
        .into_iter()
        .find(|s| s.status == SpanStatus::Running)
        .unwrap();
    let dir = store.artifacts_dir(running.id);
    std::fs::create_dir_all(&dir).unwrap();
    let log = agent_log();
    assert!(log.len() > 100_000, "more than the tail the page reads");
    std::fs::write(dir.join("agent.log"), &log).unwrap();
    let dash = Dashboard::start(&env, &[], &[]);

    let now = dash.get("/", &[]);
    assert_eq!(now.status, 200, "{}", now.body);
    let shown = "<q class=\"agent-said\" title=\"written by the agent\">\
                 &lt;script&gt;document.title=&#39;pwned&#39;&lt;/script&gt; all red</q>";
    assert!(now.body.contains(shown), "{}", now.body);
    assert!(!now.body.contains("<script>document"));
    assert!(!now.body.contains('\u{1b}') && !now.body.contains("[31m"));

    // The live stream carries it too, and the line after the agent's next output.
    let mut stream = dash.live();
    let first = read_until(&mut stream, "event: now");
    assert!(first.contains(shown), "{first}");
    let tool = json!({"type": "assistant", "message": {"content": [
        {"type": "tool_use", "name": "Edit", "input": {"file_path": "src/lib.rs"}}]}});
    let mut file = std::fs::OpenOptions::new()
        .append(true)
        .open(dir.join("agent.log"))
        .unwrap();
    writeln!(file, "{tool}").unwrap();
    // While a run goes on, the stream sends the live part again by itself (the agent's log is
    // not watched): its next output line arrives with no span or queue written.
    let next = read_until(&mut stream, "Edit: src/lib.rs");
    assert!(next.contains("agent-said"), "{next}");
    // A span written wakes the stream too; the agent's line is read again with it.
    let bash = json!({"type": "assistant", "message": {"content": [
        {"type": "tool_use", "name": "Bash", "input": {"command": "cargo test"}}]}});
    writeln!(file, "{bash}").unwrap();
    store.write_span(&running).unwrap();
    let next = read_until(&mut stream, "Bash: cargo test");
    assert!(next.contains("agent-said"), "{next}");
}

/// A ledger of `run` in trace `trace` with refusals at the given minutes past 09:00 UTC.
fn ledger(run: &str, trace: uuid::Uuid, refusals: &[(u32, &str)]) -> Ledger {
    let mut ledger = Ledger::new(run, trace);
    ledger.refused = refusals.len() as u64;
    ledger.refusals = refusals
        .iter()
        .map(|(min, reason)| Refusal {
            at: Utc.with_ymd_and_hms(2026, 11, 20, 9, *min, 0).unwrap(),
            reason: (*reason).to_owned(),
        })
        .collect();
    ledger
}

#[test]
fn now_lists_the_proxys_recent_refusals_live_and_recorded_and_names_a_corrupt_ledger() {
    let env = TestEnv::new();
    let store = env.store();
    let example = example_store(&store);
    // A live run's ledger, as the proxy writes it.
    let runs = store.proxy_dir().join("runs");
    std::fs::create_dir_all(runs.join("run-live")).unwrap();
    let live = ledger(
        "run-live",
        example,
        &[(30, "egress denied: evil.example:443 <script>x</script>")],
    );
    std::fs::write(
        runs.join("run-live/ledger.json"),
        serde_json::to_vec(&live).unwrap(),
    )
    .unwrap();
    // A finished run's ledger, recorded in its span.
    let mut gen = Gen::new(21);
    let mut t = TraceWriter::start(&store, &mut gen, 90_000, "LocalRequest done");
    let recorded_trace = t.trace_id;
    let a = t.act(t.trace_id, StepKind::Coordinate, "look", json!({}));
    let done = ledger(
        "run-done",
        recorded_trace,
        &[(10, "model request refused: the run's budget is spent")],
    );
    t.run(
        &a,
        100,
        SpanStatus::Completed,
        "looked",
        json!({"egress": "model-only", "network": done}),
    );
    let dash = Dashboard::start(&env, &[], &[]);

    let now = dash.get("/", &[]);
    assert_eq!(now.status, 200, "{}", now.body);
    assert!(now.body.contains("id=\"refusal-count\">2<"), "{}", now.body);
    let first = now
        .body
        .find("egress denied: evil.example:443 &lt;script&gt;x&lt;/script&gt;")
        .expect("the live refusal, escaped");
    let second = now
        .body
        .find("model request refused: the run&#39;s budget is spent")
        .expect("the recorded refusal");
    assert!(first < second, "newest first");
    assert!(!now.body.contains("<script>x"));
    assert!(now
        .body
        .contains(&format!("<a href=\"/trace/{recorded_trace}\">")));
    assert!(now
        .body
        .contains("<time datetime=\"2026-11-20T09:30:00Z\">"));

    // A corrupt ledger is named on the page; the rest still shows.
    std::fs::create_dir_all(runs.join("run-bad")).unwrap();
    std::fs::write(runs.join("run-bad/ledger.json"), "{not json").unwrap();
    let now = dash.get("/", &[]);
    assert_eq!(now.status, 200, "{}", now.body);
    assert!(
        now.body.contains("run-bad/ledger.json"),
        "the corrupt file named: {}",
        now.body
    );
    assert!(now.body.contains("id=\"refusal-count\">2<"));
}

#[test]
fn outcomes_show_the_spend_by_model_the_proxys_ledgers_recorded() {
    let env = TestEnv::new();
    let store = env.store();
    let mut gen = Gen::new(31);
    let tokens = |input, output| TokenUsage {
        input,
        cached: 100,
        cache_write: 0,
        output,
    };
    for (start, calls) in [
        vec![
            ("claude-sonnet-4-5", 1000, 200, 0.25),
            ("claude-haiku-4-5", 50, 10, 0.01),
        ],
        vec![
            ("claude-sonnet-4-5", 3000, 400, 0.75),
            ("<b>gpt</b>\u{1b}[1m", 7, 3, 0.5),
        ],
    ]
    .into_iter()
    .zip([0, 10_000])
    .map(|(calls, start)| (start, calls))
    {
        let mut t = TraceWriter::start(&store, &mut gen, start, "LocalRequest m");
        let a = t.act(t.trace_id, StepKind::Coordinate, "look", json!({}));
        // The proxy's own bookkeeping, as a run's ledger recorded in its span.
        let mut ledger = Ledger::new("run", t.trace_id);
        for (model, input, output, usd) in calls {
            ledger.record_response(1, 1, &tokens(input, output), usd, Some(model));
        }
        t.run(
            &a,
            100,
            SpanStatus::Completed,
            "looked",
            json!({"egress": "model-only", "network": ledger}),
        );
    }
    // A span written before the models were kept: read, and counted in no model.
    let mut t = TraceWriter::start(&store, &mut gen, 30_000, "LocalRequest old");
    let a = t.act(t.trace_id, StepKind::Coordinate, "look", json!({}));
    let mut old = serde_json::to_value(Ledger::new("old", t.trace_id)).unwrap();
    old["requests"] = json!(4);
    t.run(
        &a,
        100,
        SpanStatus::Completed,
        "old",
        json!({"network": old}),
    );

    let dash = Dashboard::start(&env, &[], &[]);
    let page = dash.get("/outcomes", &[]);
    assert_eq!(page.status, 200, "{}", page.body);
    assert!(page.body.contains("id=\"model-chart\""));
    let table = &page.body[page.body.find("id=\"models\"").expect("the table")..];
    let table = &table[..table.find("</table>").unwrap()];
    // The store's own figures: every span's recorded ledger, by model.
    let mut expected: std::collections::BTreeMap<String, rover::proxy::ModelUsage> =
        std::collections::BTreeMap::default();
    for entry in store.recent_traces(100).unwrap() {
        for span in store.load_trace(entry.trace_id).unwrap().spans {
            if let Some(ledger) = rover::agent_run::RunNetworkMeta::of(&span.meta).network {
                for (model, u) in ledger.by_model {
                    expected.entry(model).or_default().add(&u);
                }
            }
        }
    }
    assert_eq!(
        expected.keys().collect::<Vec<_>>(),
        ["bgpt/b1m", "claude-haiku-4-5", "claude-sonnet-4-5"],
        "the names as the proxy cleaned them"
    );
    assert_eq!(table.matches("<tr data-key=").count(), expected.len());
    for (model, u) in &expected {
        let row = format!(
            "<tr data-key=\"{model}\"><td>{model}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            u.requests,
            rover::budget::usd(u.usd),
            u.usage.input + u.usage.cached + u.usage.cache_write,
            u.usage.output
        );
        assert!(table.contains(&row), "{row} in {table}");
    }
    let sonnet = &expected["claude-sonnet-4-5"];
    assert_eq!(
        (sonnet.requests, sonnet.usage.input, sonnet.usage.output),
        (2, 4000, 600)
    );
    assert!(table.contains("<td>$1.00</td>"), "{table}");
    assert!(!page.body.contains("<b>gpt"));
}

#[test]
fn the_lessons_page_shows_each_lesson_as_untrusted_text_and_forgets_and_pins_as_the_cli_does() {
    let env = TestEnv::new();
    let store = env.store();
    let example = example_store(&store);
    let (test, lint) = seeded_book(&env, "<script>document.title='pwned'</script>", example);
    // A CI lesson: its check (a name a workflow file chose) and its conclusions, as text.
    rover::memory::LessonBook::update(&store, |b| {
        b.learn(
            rover::memory::NewLesson {
                kind: rover::memory::LessonKind::Ci,
                statement: "The CI check failed; it passed after this fix: y".into(),
                concerns: vec!["<b>ci</b>".into()],
                topic: "Add widget".into(),
                evidence: rover::memory::Evidence {
                    check: Some("<b>ci</b>".into()),
                    conclusions: vec!["failure".into(), "success".into()],
                    ..rover::memory::Evidence::new(
                        example,
                        vec![uuid::Uuid::new_v4()],
                        chrono::Utc::now(),
                    )
                },
            },
            200,
        );
    })
    .unwrap();
    let read_only = Dashboard::start(&env, &[], &[]);
    let page = read_only.get("/memory", &[]);
    assert_eq!(page.status, 200, "{}", page.body);
    for id in [&test, &lint] {
        assert!(page
            .body
            .contains(&format!("<tr class=\"lesson\" data-lesson=\"{id}\">")));
    }
    assert!(page.body.contains(
        "<span class=\"untrusted\">learned from untrusted work:</span> <q>The required gate \
         `make test` failed; it passed after this fix: &lt;script&gt;document.title=&#39;pwned&#39;&lt;/script&gt;</q>"
    ), "{}", page.body);
    assert!(!page.body.contains("<script>document"));
    assert!(page
        .body
        .contains(&format!("<a href=\"/trace/{example}\">")));
    assert!(page.body.contains("<code>make test</code> (exit 2 then 0)"));
    assert!(
        page.body
            .contains("check <code>&lt;b&gt;ci&lt;/b&gt;</code> (failure then success)"),
        "{}",
        page.body
    );
    assert!(page.body.contains("<td class=\"weight\">1</td>"));
    assert!(
        !page.body.contains("action=\"/memory/"),
        "read-only: no button"
    );
    let pin = format!("/memory/{test}/pin");
    assert_eq!(read_only.post(&pin, &[], "pinned=true").status, 403);

    let dash = Dashboard::start(&env, &["--allow-actions"], &[]);
    let page = dash.get("/memory", &[]);
    assert!(page
        .body
        .contains(&format!("action=\"/memory/{test}/forget\"")));
    let csrf = csrf_of(&page.body);
    assert_eq!(
        dash.post(&pin, &[], "pinned=true").status,
        403,
        "no CSRF token"
    );
    let other = dash.post(
        &pin,
        &["Origin: http://attacker.example"],
        &format!("csrf={csrf}&pinned=true"),
    );
    assert_eq!(other.status, 403, "another origin");
    let book = || rover::memory::LessonBook::load(&store).unwrap();
    assert!(book().lessons.iter().all(|l| !l.pinned));

    let pinned = dash.post(&pin, &[], &format!("csrf={csrf}&pinned=true"));
    assert_eq!(pinned.status, 303, "{}", pinned.body);
    assert_eq!(pinned.header("location").as_deref(), Some("/memory"));
    assert!(book().find(&test).unwrap().pinned);
    assert!(dash
        .get("/memory", &[])
        .body
        .contains("<td class=\"pinned\">pinned</td>"));
    assert_eq!(
        dash.post(&pin, &[], &format!("csrf={csrf}&pinned=false"))
            .status,
        303
    );
    assert!(!book().find(&test).unwrap().pinned);

    let forget = format!("/memory/{}/forget", &lint[..8]);
    assert_eq!(dash.post(&forget, &[], "").status, 403);
    assert_eq!(dash.post(&forget, &[], &format!("csrf={csrf}")).status, 303);
    let left: Vec<String> = book().lessons.into_iter().map(|l| l.id).collect();
    assert!(left.contains(&test) && !left.contains(&lint), "{left:?}");
    assert_eq!(left.len(), 2, "the CI lesson stays: {left:?}");
    assert_eq!(
        dash.post(&forget, &[], &format!("csrf={csrf}")).status,
        404,
        "forgotten"
    );
}

#[test]
fn a_store_created_after_the_dashboard_started_is_watched() {
    let env = TestEnv::new();
    let checkout = env.repo();
    let project = rover::project::Project::discover(&checkout).unwrap().id;
    // The daemon file serves one repository that has no store yet (its data dir exists: the
    // daemon ran before).
    std::fs::create_dir_all(&env.data_dir).unwrap();
    let file = env.path().join("daemon.json");
    std::fs::write(
        &file,
        json!({"repositories": [{"repo": "acme/late", "checkout": checkout}]}).to_string(),
    )
    .unwrap();
    let dash = Dashboard::start(&env, &["--config", file.to_str().unwrap()], &[]);
    let mut stream = dash.live();
    let first = read_until(&mut stream, "event: now");
    assert!(first.contains("acme/late: no store yet"), "{first}");

    let store = AutopilotStore::open(&env.data_dir, &project).unwrap();
    let appeared = read_until(&mut stream, "<h2>acme/late</h2>");
    assert!(appeared.contains("running-count\">0<"), "{appeared}");
    // A span written in the new store now reaches the stream, without a reload.
    let mut gen = Gen::new(41);
    let mut t = TraceWriter::start(&store, &mut gen, 0, "LocalRequest late");
    let a = t.act(t.trace_id, StepKind::Coordinate, "look", json!({}));
    let span = t.run(&a, 10, SpanStatus::Running, "", json!({}));
    let opened = read_until(&mut stream, &format!("data-span=\"{}\"", span.id));
    assert!(opened.contains("running-count\">1<"), "{opened}");
}

/// The link to a trace's GitHub thread goes to the repository's GitHub: github.com by default, a
/// GitHub Enterprise host's web address when rover's API is that host's (`/api/v3`).
#[test]
fn a_traces_thread_link_goes_to_the_github_rover_serves() {
    use rover::github::{Channel, EventAction, EventKind, NormalizedEvent, Visibility};
    let env = TestEnv::new();
    let store = env.store();
    let mut event = NormalizedEvent::local("0", "alice", "", Utc::now());
    event.id = "ghe-1".into();
    event.kind = EventKind::Issues;
    event.action = Some(EventAction::Opened);
    event.repo = "tools/lint".into();
    event.number = Some(12);
    event.channel = Channel::IssueComment { number: 12 };
    event.visibility = Visibility::Public;
    let (root, first) = rover::intake::github_trace(
        &rover::intake::Entry::new("p", rover::steps::kinds::FIRST_STEP),
        &event,
    );
    store
        .create_trace(&root, Some(&first), std::slice::from_ref(&event.id))
        .unwrap();
    let page = |vars: &[(&str, &str)]| {
        let dash = Dashboard::start(&env, &[], vars);
        let page = dash.get(&format!("/trace/{}", root.id), &[]);
        assert_eq!(page.status, 200, "{}", page.body);
        page.body
    };
    let enterprise = page(&[("ROVER_GITHUB_API_URL", "https://ghe.example.com/api/v3")]);
    assert!(
        enterprise.contains("<a href=\"https://ghe.example.com/tools/lint/issues/12\""),
        "{enterprise}"
    );
    let public = page(&[("ROVER_GITHUB_API_URL", "https://api.github.com")]);
    assert!(
        public.contains("<a href=\"https://github.com/tools/lint/issues/12\""),
        "{public}"
    );
}
