//! `rover autopilot trace|traces|status` on generated stores, run as a user runs them.

use std::fs;

use serde_json::Value;

use crate::support::env::{stderr, stdout, TestEnv};
use crate::support::storegen::{example_store, Gen, TraceWriter};
use rover::store::{SpanStatus, StepKind};

/// Times that depend on the clock of the run are replaced before snapshotting.
fn snapshot_filters() -> Vec<(&'static str, &'static str)> {
    vec![
        (r"\d+[smhd] ago", "[age]"),
        (
            r"running  (\d+(\.\d+)?(ms|s|m|h))( \d+[sm])?",
            "running  [elapsed]",
        ),
        (
            r"\(\d+(\.\d+)?(ms|s|m|h)( \d+[sm])? so far",
            "([elapsed] so far",
        ),
    ]
}

#[test]
fn trace_shows_the_tree_with_decisions_errors_and_pending_work() {
    let env = TestEnv::new();
    let trace_id = example_store(&env.store());
    let out = env.rover(&["autopilot", "trace", &trace_id.to_string()]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    assert!(!text.contains('\x1b'), "no colour without a terminal");
    insta::with_settings!({filters => snapshot_filters()}, {
        insta::assert_snapshot!("trace_example", text);
    });
}

#[test]
fn trace_accepts_a_span_or_action_id_or_a_prefix_and_prints_the_same_trace() {
    let env = TestEnv::new();
    let store = env.store();
    let trace_id = example_store(&store);
    let view = store.load_trace(trace_id).unwrap();
    let by_trace = stdout(&env.rover(&["autopilot", "trace", &trace_id.to_string(), "--json"]));
    let span = view.spans.last().unwrap().id.to_string();
    let action = view.actions[3].id.to_string();
    for id in [
        span.as_str(),
        action.as_str(),
        &trace_id.to_string()[..8],
        &span[..10],
        &action.to_uppercase(),
    ] {
        let out = env.rover(&["autopilot", "trace", id, "--json"]);
        assert!(out.status.success(), "{id}: {}", stderr(&out));
        let a: Value = serde_json::from_str(&stdout(&out)).unwrap();
        let b: Value = serde_json::from_str(&by_trace).unwrap();
        assert_eq!(a["traceId"], b["traceId"], "{id}");
        assert_eq!(
            a["spans"].as_array().unwrap().len(),
            b["spans"].as_array().unwrap().len(),
            "{id}"
        );
    }
}

#[test]
fn trace_json_is_the_stored_records_plus_derived_fields() {
    let env = TestEnv::new();
    let store = env.store();
    let trace_id = example_store(&store);
    let out = env.rover(&["autopilot", "trace", &trace_id.to_string(), "--json"]);
    let v: Value = serde_json::from_str(&stdout(&out)).unwrap();
    assert_eq!(v["traceId"], trace_id.to_string());
    assert_eq!(
        v["event"],
        "IssuesEvent opened #12 by alice: Add a --json flag to export"
    );
    assert_eq!(v["outcome"], serde_json::json!({"state": "running"}));
    assert_eq!(v["createdAt"], "2026-11-20T09:15:00.000Z");
    let spans = v["spans"].as_array().unwrap();
    let steps: Vec<&str> = spans.iter().map(|s| s["step"].as_str().unwrap()).collect();
    assert_eq!(
        steps,
        [
            "event",
            "coordinate",
            "plan",
            "workflow",
            "commit",
            "resolve",
            "commit",
            "workflow"
        ]
    );
    for span in spans {
        // Every span as stored: the spec's fields, and rover's trace id.
        for field in [
            "id",
            "version",
            "timestamp",
            "step",
            "parentId",
            "status",
            "completed",
            "summary",
            "meta",
            "traceId",
        ] {
            assert!(span.get(field).is_some(), "span misses {field}: {span}");
        }
        assert_eq!(span["version"], "1.0");
        assert_eq!(span["traceId"], trace_id.to_string());
    }
    let commit_error = &spans[4];
    assert_eq!(commit_error["status"], "error");
    assert_eq!(commit_error["meta"]["error"]["exitCode"], 1);
    assert_eq!(spans[7]["status"], "running");
    assert_eq!(spans[7]["completed"], Value::Null);
    let actions = v["actions"].as_array().unwrap();
    assert_eq!(actions.len(), 8);
    let pending: Vec<&Value> = actions.iter().filter(|a| a["pending"] == true).collect();
    assert_eq!(
        pending.len(),
        2,
        "the second task's workflow (running) and the last resolve"
    );
    assert!(actions
        .iter()
        .all(|a| a["reason"].is_string() && a["spanId"].is_string()));
    let queue = v["pending"].as_array().unwrap();
    assert_eq!(queue.len(), 2);
    assert!(queue
        .iter()
        .any(|p| p["action"] == "resolve" && p["runningSpanId"].is_null()));
    assert!(queue
        .iter()
        .any(|p| p["action"] == "workflow" && p["runningSpanId"] == spans[7]["id"]));
    assert_eq!(v["missing"], serde_json::json!([]));
}

#[test]
fn traces_lists_newest_first_with_outcomes() {
    let env = TestEnv::new();
    let store = env.store();
    example_store(&store);
    let mut gen = Gen::new(2);
    let mut t = TraceWriter::start(
        &store,
        &mut gen,
        60_000,
        "PushEvent to main by bob (4f2a9c1)",
    );
    let root = t.trace_id;
    let a = t.act(
        root,
        StepKind::Coordinate,
        "push to the default branch",
        serde_json::json!({}),
    );
    let c = t.run(
        &a,
        2_000,
        SpanStatus::Completed,
        "CI is green",
        serde_json::json!({"decision": "noop"}),
    );
    let n = t.act(
        c.id,
        StepKind::Noop,
        "CI passed, no issues found",
        serde_json::json!({}),
    );
    t.run(
        &n,
        400,
        SpanStatus::Completed,
        "Push to main; CI passed; nothing to do",
        serde_json::json!({}),
    );
    let mut t = TraceWriter::start(
        &store,
        &mut gen,
        120_000,
        "IssueCommentEvent created #7 by carol",
    );
    let root = t.trace_id;
    let a = t.act(
        root,
        StepKind::Coordinate,
        "comment on an issue",
        serde_json::json!({}),
    );
    t.run(
        &a,
        1_000,
        SpanStatus::Completed,
        "decided plan",
        serde_json::json!({}),
    );

    let out = env.rover(&["autopilot", "traces"]);
    assert!(out.status.success(), "{}", stderr(&out));
    insta::with_settings!({filters => snapshot_filters()}, {
        insta::assert_snapshot!("traces_list", stdout(&out));
    });

    let v: Value = serde_json::from_str(&stdout(&env.rover(&[
        "autopilot",
        "traces",
        "--json",
        "--limit",
        "2",
    ])))
    .unwrap();
    let traces = v["traces"].as_array().unwrap();
    assert_eq!(traces.len(), 2, "--limit is honoured");
    assert_eq!(traces[0]["event"], "IssueCommentEvent created #7 by carol");
    assert_eq!(
        traces[0]["outcome"],
        serde_json::json!({"state": "stalled"})
    );
    assert_eq!(
        traces[1]["outcome"],
        serde_json::json!({"state": "finished", "step": "noop", "status": "completed"})
    );
    assert_eq!(traces[1]["spans"], 3);
    assert_eq!(traces[1]["lastStep"], "noop");

    // A store without its caches (another implementation of the format, or the caches deleted)
    // lists the same traces, rebuilt from the spans: never "no traces yet".
    let listed = stdout(&env.rover(&["autopilot", "traces", "--json"]));
    std::fs::remove_file(store.traces_path()).unwrap();
    for cache in [store.trace_index_dir(), store.ids_dir()] {
        if cache.exists() {
            std::fs::remove_dir_all(cache).unwrap();
        }
    }
    assert!(!store.trace_index_dir().exists());
    let out = env.rover(&["autopilot", "traces", "--json"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(
        stdout(&out),
        listed,
        "the same list, rebuilt from the spans"
    );
    let text = stdout(&env.rover(&["autopilot", "traces"]));
    assert!(!text.contains("no traces yet"), "{text}");
}

#[test]
fn unknown_ambiguous_and_short_ids_are_one_clear_error() {
    let env = TestEnv::new();
    let store = env.store();
    example_store(&store);
    // Two records whose ids share a 9-character prefix make that prefix ambiguous.
    let view = store
        .load_trace(store.recent_traces(1).unwrap()[0].trace_id)
        .unwrap();
    let a = view.spans[1].id.to_string();
    let twin = format!("{}{}", &a[..9], &view.spans[2].id.to_string()[9..]);
    let mut copy = view.spans[2].clone();
    copy.id = twin.parse().unwrap();
    store.write_span(&copy).unwrap();

    // Each failure exits with the code of its kind, and says it in one line; with --json, the
    // same as a record on stdout.
    for (args, expect, code, kind) in [
        (
            vec!["autopilot", "trace", "00000000-0000-4000-8000-000000000000"],
            "no span, action or trace matches",
            66,
            "not_found",
        ),
        (
            vec!["autopilot", "trace", "deadbeefdead"],
            "no span, action or trace matches",
            66,
            "not_found",
        ),
        (vec!["autopilot", "trace", "abc"], "too short", 2, "usage"),
        (vec!["autopilot", "trace", &a[..9]], "ambiguous", 2, "usage"),
    ] {
        let out = env.rover(&args);
        assert_eq!(out.status.code(), Some(code), "{args:?}");
        let err = stderr(&out);
        assert!(
            err.starts_with("error: ") && err.contains(expect),
            "{args:?}: {err}"
        );
        assert_eq!(err.lines().count(), 1, "one line: {err}");
        assert!(stdout(&out).is_empty());
        let json_args: Vec<&str> = args.iter().copied().chain(["--json"]).collect();
        let out = env.rover(&json_args);
        assert_eq!(out.status.code(), Some(code), "{json_args:?}");
        let record: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap();
        let error = &record["error"];
        assert_eq!(error["kind"], kind, "{record}");
        assert_eq!(error["exitCode"], code, "{record}");
        assert!(
            error["message"].as_str().unwrap().contains(expect),
            "{record}"
        );
        assert!(!error["hint"].as_str().unwrap().is_empty(), "{record}");
    }
    let out = env.rover(&["autopilot", "trace"]);
    assert_eq!(out.status.code(), Some(2), "usage error");
}

#[test]
fn a_missing_store_is_an_error_and_is_not_created_by_looking() {
    let env = TestEnv::new();
    for cmd in ["traces", "status"] {
        let out = env.rover(&["autopilot", cmd]);
        assert_eq!(out.status.code(), Some(66), "not found");
        assert!(
            stderr(&out).contains("no rover store at"),
            "{}",
            stderr(&out)
        );
    }
    assert!(!env.data_dir.exists(), "inspection never creates a store");
}

#[test]
fn the_project_is_found_from_the_repository_in_the_current_directory() {
    let env = TestEnv::new();
    let repo = env.path().join("widgets");
    fs::create_dir_all(&repo).unwrap();
    let git = |args: &[&str]| {
        let ok = std::process::Command::new("git")
            .args(args)
            .current_dir(&repo)
            .env("GIT_CONFIG_GLOBAL", "/dev/null")
            .status()
            .unwrap();
        assert!(ok.success());
    };
    git(&["init", "-q"]);
    git(&["remote", "add", "origin", "git@github.com:Acme/widgets.git"]);
    let project = rover::project::Project::discover(&repo).unwrap();
    assert_eq!(project.repo.unwrap().to_string(), "Acme/widgets");
    let store = rover::store::AutopilotStore::open(&env.data_dir, &project.id).unwrap();
    example_store(&store);
    let out = std::process::Command::new(crate::support::env::rover_bin())
        .args(["autopilot", "traces"])
        .current_dir(repo.join("."))
        .env("ROVER_DATA_DIR", &env.data_dir)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stdout(&out).contains("IssuesEvent opened #12"));
}

#[test]
fn status_reports_the_queue_running_steps_and_dead_letters() {
    let env = TestEnv::new();
    let store = env.store();
    let trace_id = example_store(&store);
    let view = store.load_trace(trace_id).unwrap();
    let mut gen = Gen::new(3);
    let mut t = TraceWriter {
        store: &store,
        gen: &mut gen,
        trace_id,
        clock: 900_000,
    };
    t.act(
        view.spans[1].id,
        StepKind::Other("deploy".into()),
        "an action type nobody handles",
        serde_json::json!({}),
    );
    let out = env.rover(&["autopilot", "status"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    assert!(text.contains("daemon   not running"), "{text}");
    assert!(
        text.contains("pending  3 (deploy 1, resolve 1, workflow 1)"),
        "{text}"
    );
    assert!(text.contains("running  workflow"), "{text}");
    assert!(
        text.contains("dead letter") && text.contains("\"deploy\""),
        "{text}"
    );
    let v: Value =
        serde_json::from_str(&stdout(&env.rover(&["autopilot", "status", "--json"]))).unwrap();
    assert_eq!(v["daemon"]["running"], false);
    assert_eq!(v["pendingTotal"], 3);
    assert_eq!(v["deadLetters"].as_array().unwrap().len(), 1);
    assert_eq!(v["running"][0]["step"], "workflow");
}

#[test]
fn status_shows_the_soonest_waits_and_counts_the_rest() {
    let env = TestEnv::new();
    let store = env.store();
    let trace_id = example_store(&store);
    let root = store.load_trace(trace_id).unwrap().spans[0].clone();
    let now = chrono::Utc::now();
    store
        .transact(|txn| {
            // 25 waits, queued latest first: the listing must sort them.
            for i in (0..25i64).rev() {
                let a = rover::store::Action::new(
                    StepKind::Coordinate,
                    &root,
                    format!("wait number {i}"),
                    rover::store::Meta::new(),
                    now,
                );
                let mut p = a.pending(trace_id, now);
                p.not_before = Some(now + chrono::Duration::hours(i + 1));
                txn.push_pending(p)?;
            }
            Ok(())
        })
        .unwrap();
    let out = env.rover(&["autopilot", "status"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    let shown: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with("later    coordinate"))
        .collect();
    assert_eq!(shown.len(), 10, "{text}");
    assert!(shown[0].ends_with("wait number 0"), "{text}");
    assert!(shown[9].ends_with("wait number 9"), "{text}");
    assert!(
        text.contains("later    ... and 15 more (`rover autopilot status --json` lists them all)"),
        "{text}"
    );
    let v: Value =
        serde_json::from_str(&stdout(&env.rover(&["autopilot", "status", "--json"]))).unwrap();
    assert_eq!(v["later"].as_array().unwrap().len(), 25);
}

/// The first fenced block after `heading` in `text`.
fn block_after(text: &str, heading: &str) -> String {
    let rest = &text[text.find(heading).expect("the heading") + heading.len()..];
    let start = rest.find("```\n").expect("a block") + 4;
    let end = rest[start..].find("```").expect("its end");
    rest[start..start + end].to_owned()
}

/// The command list is one: README's and `docs/cli.md`'s blocks are the same text, and name
/// exactly the commands `rover autopilot --help` lists, so neither can drift again.
#[test]
fn the_command_lists_in_the_docs_are_the_commands_rover_has() {
    let help = crate::support::env::stdout(
        &std::process::Command::new(crate::support::env::rover_bin())
            .args(["autopilot", "--help"])
            .output()
            .expect("rover --help"),
    );
    let section = &help[help.find("Commands:\n").expect("a command list") + 10..];
    let mut commands: Vec<&str> = section
        .lines()
        .take_while(|l| !l.trim().is_empty())
        .filter_map(|l| l.split_whitespace().next())
        .filter(|c| *c != "help")
        .collect();
    commands.sort_unstable();
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let readme = block_after(
        &std::fs::read_to_string(root.join("README.md")).expect("README"),
        "## Commands",
    );
    let cli = block_after(
        &std::fs::read_to_string(root.join("docs/cli.md")).expect("cli.md"),
        "# Commands",
    );
    assert_eq!(
        readme, cli,
        "README.md and docs/cli.md list the commands differently"
    );
    let mut listed: Vec<&str> = readme
        .lines()
        .filter_map(|l| l.strip_prefix("rover autopilot "))
        .filter_map(|l| l.split_whitespace().next())
        .collect();
    listed.sort_unstable();
    listed.dedup();
    assert_eq!(
        listed, commands,
        "the docs' command list is not `rover autopilot --help`'s"
    );
}
