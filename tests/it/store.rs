//! The store: records against hand-written JSON in the spec's format, the span lifecycle,
//! corrupt files, restart recovery, crash safety under SIGKILL and locking across processes.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::Path;
use std::time::Duration;

use chrono::Utc;
use rover::store::{
    Action, AutopilotStore, Cursor, LogEntry, Meta, PendingAction, Recovery, Span, SpanStatus,
    State, StepKind, StoreError, TraceEntry, TraceIndex, TraceOutcome, TracesCache,
    TRACES_LOG_LINES,
};
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::{json, Value};
use uuid::Uuid;

use crate::support::child::{self, Rng};
use crate::support::env::TestEnv;

fn fixture(name: &str) -> Value {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/store")
        .join(name);
    serde_json::from_str(&fs::read_to_string(&path).unwrap()).unwrap()
}

/// Parse the fixture into `T`, write it back, and compare as JSON: nothing lost, nothing renamed.
fn round_trip<T: DeserializeOwned + Serialize>(name: &str) -> T {
    let original = fixture(name);
    let record: T =
        serde_json::from_value(original.clone()).unwrap_or_else(|e| panic!("{name}: {e}"));
    assert_eq!(
        serde_json::to_value(&record).unwrap(),
        original,
        "{name} changed in a round trip"
    );
    record
}

#[test]
fn every_record_round_trips_through_the_spec_format() {
    let span: Span = round_trip("span.json");
    assert_eq!(span.step, StepKind::Coordinate);
    assert_eq!(span.status, SpanStatus::Completed);
    assert_eq!(
        span.parent_id.unwrap().to_string(),
        "0b6f7c1e-8a4e-4c1b-9f8e-2d2b1c3e4f50"
    );
    assert_eq!(span.meta["decision"], "plan");

    let root: Span = round_trip("span_root_running.json");
    assert_eq!(
        (
            root.parent_id,
            root.status,
            root.completed,
            root.summary.clone()
        ),
        (None, SpanStatus::Running, None, None)
    );
    assert_eq!(root.trace(), Some(root.id), "a root span is its own trace");

    let action: Action = round_trip("action.json");
    assert_eq!(
        (action.action.clone(), action.reason.as_str()),
        (StepKind::Plan, "Feature request needs task decomposition")
    );

    let state: State = round_trip("state.json");
    assert_eq!(state.pending.len(), 1);
    assert_eq!(state.pending[0].action, StepKind::Plan);
    assert_eq!(
        state.task_mappings["2c4e6a80-1b3d-4f5a-9c7e-0d2f4a6b8c0e"].branch_name,
        "rover/0b6f7c1e-add-json-flag"
    );

    let extras: State = round_trip("state_rover_extras.json");
    assert_eq!(extras.pending[0].attempts, 2);
    assert!(extras.pending[0].running_span_id.is_some());
    assert_eq!(
        extras.pending[0].extra["futureField"],
        json!({"kept": true})
    );
    assert_eq!(
        extras
            .task_mappings
            .values()
            .next()
            .unwrap()
            .container_id
            .as_deref(),
        Some("d1e2f3a4b5c6")
    );

    let cursor: Cursor = round_trip("cursor.json");
    assert_eq!(
        cursor.processed_event_ids,
        ["44718923011", "44718923012", "44718923015"]
    );

    let _: TracesCache = round_trip("traces.json");
    let index: TraceIndex = round_trip("trace_index.json");
    assert_eq!(index.spans.len(), 2);
    let entry: LogEntry = round_trip("log_entry.json");
    assert_eq!(entry.fields["step"], "coordinate");
}

#[test]
fn records_missing_a_spec_field_or_with_a_bad_value_are_rejected() {
    for (name, field, bad) in [
        ("span.json", "parentId", None),
        ("span.json", "status", Some(json!("done"))),
        ("span.json", "timestamp", Some(json!("yesterday"))),
        ("span.json", "version", Some(json!("2.0"))),
        ("action.json", "reason", None),
        ("state.json", "taskMappings", None),
        ("cursor.json", "processedEventIds", None),
    ] {
        let mut v = fixture(name);
        match bad {
            Some(bad) => v[field] = bad,
            None => {
                v.as_object_mut().unwrap().remove(field);
            }
        }
        let ok = match name {
            "span.json" => serde_json::from_value::<Span>(v).is_ok(),
            "action.json" => serde_json::from_value::<Action>(v).is_ok(),
            "state.json" => serde_json::from_value::<State>(v).is_ok(),
            _ => serde_json::from_value::<Cursor>(v).is_ok(),
        };
        assert!(!ok, "{name} without a valid {field} must not parse");
    }
}

#[test]
fn unknown_action_types_survive_as_dead_letters_instead_of_failing_the_queue() {
    let mut v = fixture("state.json");
    v["pending"][0]["action"] = json!("deploy");
    let state: State = serde_json::from_value(v.clone()).unwrap();
    assert_eq!(state.pending[0].action, StepKind::Other("deploy".into()));
    assert_eq!(serde_json::to_value(&state).unwrap(), v);
}

#[test]
fn a_span_is_finalized_once_and_is_immutable_after() {
    let env = TestEnv::new();
    let store = env.store();
    let mut root = Span::root(Uuid::new_v4(), Utc::now(), Meta::new());
    assert_eq!(root.status, SpanStatus::Running);
    let mut more = Meta::new();
    more.insert("answer".into(), json!(42));
    root.meta.insert("initial".into(), json!(true));
    assert!(
        root.finish(SpanStatus::Running, "x", Meta::new(), Utc::now())
            .is_err(),
        "running is not final"
    );
    root.finish(SpanStatus::Completed, "done", more, Utc::now())
        .unwrap();
    assert_eq!(
        root.meta["initial"], true,
        "finish merges meta over the initial meta"
    );
    assert_eq!(root.meta["answer"], 42);
    assert!(root.completed.unwrap() >= root.timestamp);
    assert!(
        root.finish(SpanStatus::Failed, "again", Meta::new(), Utc::now())
            .is_err(),
        "finalized once"
    );

    store.write_span(&root).unwrap();
    store.write_span(&root).unwrap(); // the same content again is harmless
    let mut changed = root.clone();
    changed.summary = Some("rewritten history".into());
    let err = store.write_span(&changed).unwrap_err();
    assert!(err.to_string().contains("immutable"), "{err}");
    assert_eq!(
        store.read_span(root.id).unwrap().summary.as_deref(),
        Some("done")
    );
}

#[test]
fn actions_are_immutable() {
    let env = TestEnv::new();
    let store = env.store();
    let root = Span::root(Uuid::new_v4(), Utc::now(), Meta::new());
    let action = Action::new(
        StepKind::Coordinate,
        &root,
        "because",
        Meta::new(),
        Utc::now(),
    );
    store.write_action(&action).unwrap();
    store.write_action(&action).unwrap();
    let mut other = action.clone();
    other.reason = "a different reason".into();
    assert!(store.write_action(&other).is_err());
    assert_eq!(store.read_action(action.id).unwrap().reason, "because");
}

fn new_trace(store: &AutopilotStore, label: &str) -> (Span, Action) {
    let now = Utc::now();
    let mut meta = Meta::new();
    meta.insert("label".into(), json!(label));
    let mut root = Span::root(Uuid::new_v4(), now, meta);
    root.finish(SpanStatus::Completed, label, Meta::new(), now)
        .unwrap();
    let first = Action::new(StepKind::Coordinate, &root, "new event", Meta::new(), now);
    assert!(store
        .create_trace(&root, Some(&first), &[format!("ev-{}", root.id)])
        .unwrap());
    (root, first)
}

#[test]
fn a_step_run_moves_the_queue_forward_and_the_trace_records_it() {
    let env = TestEnv::new();
    let store = env.store();
    let (root, first) = new_trace(&store, "push to main");
    assert_eq!(store.read_state().unwrap().pending.len(), 1);

    let run = store.begin_step(first.id, &StepKind::Coordinate).unwrap();
    assert_eq!(run.pending.attempts, 1);
    assert_eq!(
        store.read_span(run.span.id).unwrap().status,
        SpanStatus::Running
    );
    let view = store.load_trace(root.id).unwrap();
    assert_eq!(
        rover::steps::kinds::trace_outcome(&view),
        TraceOutcome::Running
    );
    assert!(
        view.spans.iter().any(|s| s.id == run.span.id),
        "a running span shows in its trace"
    );

    let mut span = run.span;
    span.finish(SpanStatus::Completed, "CI green", Meta::new(), Utc::now())
        .unwrap();
    let noop = Action::new(
        StepKind::Noop,
        &span,
        "nothing to do",
        Meta::new(),
        Utc::now(),
    );
    store
        .complete_step(&span, std::slice::from_ref(&noop))
        .unwrap();
    let state = store.read_state().unwrap();
    assert_eq!(
        state
            .pending
            .iter()
            .map(|p| p.action_id)
            .collect::<Vec<_>>(),
        [noop.id]
    );
    assert_eq!(state.pending[0].span_id, span.id);
    assert_eq!(state.pending[0].trace_id, root.id);

    let run = store.begin_step(noop.id, &StepKind::Noop).unwrap();
    let mut span = run.span;
    span.finish(
        SpanStatus::Completed,
        "no action needed",
        Meta::new(),
        Utc::now(),
    )
    .unwrap();
    store.complete_step(&span, &[]).unwrap();
    let view = store.load_trace(root.id).unwrap();
    assert_eq!(
        rover::steps::kinds::trace_outcome(&view),
        TraceOutcome::Finished {
            step: StepKind::Noop,
            status: SpanStatus::Completed
        }
    );
    assert_eq!(
        view.spans
            .iter()
            .map(|s| s.step.as_str())
            .collect::<Vec<_>>(),
        ["event", "coordinate", "noop"]
    );
    assert!(view.pending.is_empty() && view.missing.is_empty());
    assert_eq!(
        store.read_cursor().unwrap().processed_event_ids,
        [format!("ev-{}", root.id)]
    );
}

#[test]
fn ingesting_an_event_again_never_starts_a_second_trace() {
    let env = TestEnv::new();
    let store = env.store();
    let (root, first) = new_trace(&store, "issue opened");
    assert!(!store.create_trace(&root, Some(&first), &[]).unwrap());
    assert_eq!(
        store.read_state().unwrap().pending.len(),
        1,
        "the first action is queued once"
    );
    let run = store.begin_step(first.id, &StepKind::Coordinate).unwrap();
    let mut span = run.span;
    span.finish(SpanStatus::Completed, "noop", Meta::new(), Utc::now())
        .unwrap();
    store.complete_step(&span, &[]).unwrap();
    assert!(!store.create_trace(&root, Some(&first), &[]).unwrap());
    assert!(
        store.read_state().unwrap().pending.is_empty(),
        "a consumed first action is not queued again"
    );
}

#[test]
fn recovery_closes_interrupted_spans_and_finishes_cut_off_hand_overs() {
    let env = TestEnv::new();
    let store = env.store();
    // Trace A: a step cut off while running.
    let (a_root, a_first) = new_trace(&store, "a");
    let a_run = store.begin_step(a_first.id, &StepKind::Coordinate).unwrap();
    // Trace B: a step that finished, with the crash before its actions were queued.
    let (_b_root, b_first) = new_trace(&store, "b");
    let b_run = store.begin_step(b_first.id, &StepKind::Coordinate).unwrap();
    let mut b_span = b_run.span.clone();
    b_span
        .finish(SpanStatus::Completed, "plan it", Meta::new(), Utc::now())
        .unwrap();
    let b_next = Action::new(
        StepKind::Plan,
        &b_span,
        "needs a plan",
        Meta::new(),
        Utc::now(),
    );
    store.write_action(&b_next).unwrap();
    let mut with_ids = b_span.clone();
    with_ids
        .meta
        .insert(rover::store::PRODUCED_KEY.into(), json!([b_next.id]));
    store.write_span(&with_ids).unwrap();

    let done = store.recover(|_, _| false).unwrap();
    assert!(
        done.contains(&Recovery::Interrupted {
            span: a_run.span.id,
            action: a_first.id
        }),
        "{done:?}"
    );
    assert!(
        done.contains(&Recovery::HandedOver {
            span: b_run.span.id,
            actions: 1
        }),
        "{done:?}"
    );

    let a_span = store.read_span(a_run.span.id).unwrap();
    assert_eq!(a_span.status, SpanStatus::Error);
    assert!(a_span.summary.unwrap().contains("interrupted"));
    let state = store.read_state().unwrap();
    let a_pending = state
        .pending_for(a_first.id)
        .expect("the interrupted action stays queued");
    assert_eq!((a_pending.attempts, a_pending.running_span_id), (1, None));
    assert!(
        state.pending_for(b_first.id).is_none(),
        "the finished step's action is consumed"
    );
    assert!(
        state.pending_for(b_next.id).is_some(),
        "its produced action is queued"
    );
    assert!(
        store
            .load_trace(a_root.id)
            .unwrap()
            .spans
            .iter()
            .any(|s| s.id == a_span.id),
        "the error span is part of the trace"
    );
    assert!(
        store.recover(|_, _| false).unwrap().is_empty(),
        "recovery is idempotent"
    );
    let again = store.begin_step(a_first.id, &StepKind::Coordinate).unwrap();
    assert_eq!(
        again.pending.attempts, 2,
        "attempts are counted across runs"
    );
}

#[test]
fn a_corrupt_state_file_is_an_error_naming_it_and_is_never_overwritten() {
    for name in ["state.json", "cursor.json"] {
        let env = TestEnv::new();
        let store = env.store();
        let (_root, first) = new_trace(&store, "before the damage");
        let path = store.autopilot_dir().join(name);
        let garbage = b"{\"version\": \"1.0\", \"pending\": [ {\"traceId\": tru";
        fs::write(&path, garbage).unwrap();

        let err = if name == "state.json" {
            store.enqueue(&first, first.trace_id.unwrap()).unwrap_err()
        } else {
            new_trace_result(&store).unwrap_err()
        };
        let message = err.to_string();
        assert!(matches!(err, StoreError::Corrupt { .. }), "{err:?}");
        assert!(
            message.contains(&path.display().to_string()),
            "names the file: {message}"
        );
        assert_eq!(
            fs::read(&path).unwrap(),
            garbage,
            "{name} is left as it was"
        );
        let kept: Vec<_> = fs::read_dir(store.autopilot_dir())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .filter(|n| n.starts_with(&format!("{name}.corrupt-")))
            .collect();
        assert_eq!(kept.len(), 1, "a copy is kept aside: {kept:?}");

        // The binary says the same, exit 65 (corrupt), and still does not touch the file.
        let out = env.rover(&["autopilot", "status"]);
        if name == "state.json" {
            assert_eq!(out.status.code(), Some(65));
            let err = crate::support::env::stderr(&out);
            assert!(
                err.contains("state.json") && err.starts_with("error:"),
                "{err}"
            );
        }
        assert_eq!(fs::read(&path).unwrap(), garbage);
    }
}

fn new_trace_result(store: &AutopilotStore) -> Result<bool, StoreError> {
    let now = Utc::now();
    let mut root = Span::root(Uuid::new_v4(), now, Meta::new());
    root.finish(SpanStatus::Completed, "x", Meta::new(), now)
        .unwrap();
    store.create_trace(&root, None, &["ev-1".into()])
}

#[test]
fn a_corrupt_cache_is_rebuilt_from_the_spans() {
    let env = TestEnv::new();
    let store = env.store();
    let (root, _) = new_trace(&store, "cached");
    fs::write(store.traces_path(), "not json").unwrap();
    fs::write(store.trace_index_path(root.id), "{\"broken\":").unwrap();
    let recent = store.recent_traces(10).unwrap();
    assert_eq!(recent.len(), 1, "traces.json is rebuilt");
    let view = store.load_trace(root.id).unwrap();
    assert_eq!(
        view.actions.len(),
        1,
        "an unreadable index is rebuilt by a scan"
    );
    assert_eq!(store.rebuild_indexes().unwrap(), 1);
    let view = store.load_trace(root.id).unwrap();
    assert_eq!(view.index.event, "cached");
    assert_eq!(view.actions.len(), 1, "actions found again by the scan");
}

// ---- crash safety ---------------------------------------------------------------------------

const CRASH_TRACES: usize = 24;

/// The deterministic ids of event `i`, as a poller would derive them from a GitHub event id.
fn log_lines(store: &AutopilotStore) -> Vec<TraceEntry> {
    fs::read_to_string(store.traces_log_path())
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

#[test]
fn a_new_trace_appends_a_line_and_the_list_is_rewritten_once_per_hundred() {
    let env = TestEnv::new();
    let store = env.store();
    // The store's first trace writes `traces.json` (there is none to append to).
    new_trace(&store, "t0");
    let snapshot = fs::read(store.traces_path()).unwrap();
    assert!(!store.traces_log_path().exists());
    for i in 1..TRACES_LOG_LINES {
        new_trace(&store, &format!("t{i}"));
    }
    assert_eq!(
        fs::read(store.traces_path()).unwrap(),
        snapshot,
        "traces.json is not rewritten while the log has room"
    );
    let logged = log_lines(&store);
    assert_eq!(logged.len(), TRACES_LOG_LINES - 1);
    assert_eq!(logged[0].event, "t1");
    let recent = store.recent_traces(1000).unwrap();
    assert_eq!(
        recent.len(),
        TRACES_LOG_LINES,
        "the list is traces.json plus the log"
    );
    assert_eq!(recent[0].event, format!("t{}", TRACES_LOG_LINES - 1));
    assert_eq!(recent.last().unwrap().event, "t0");

    // The log is full: the next trace folds it into traces.json and removes it.
    new_trace(&store, "last");
    assert!(!store.traces_log_path().exists());
    let cache: TracesCache =
        serde_json::from_str(&fs::read_to_string(store.traces_path()).unwrap()).unwrap();
    assert_eq!(cache.traces.len(), TRACES_LOG_LINES + 1);
    assert_eq!(cache.traces.last().unwrap().event, "last");
    assert_eq!(store.recent_traces(1).unwrap()[0].event, "last");
}

#[test]
fn a_torn_last_line_of_the_traces_log_is_left_out_and_cut_off_by_the_next_trace() {
    let env = TestEnv::new();
    let store = env.store();
    new_trace(&store, "a");
    new_trace(&store, "b");
    let path = store.traces_log_path();
    let mut bytes = fs::read(&path).unwrap();
    bytes.extend_from_slice(b"{\"traceId\":\"0000");
    fs::write(&path, &bytes).unwrap();
    let events = |store: &AutopilotStore| -> Vec<String> {
        store
            .recent_traces(10)
            .unwrap()
            .into_iter()
            .map(|e| e.event)
            .collect()
    };
    assert_eq!(events(&store), ["b", "a"]);
    new_trace(&store, "c");
    assert_eq!(events(&store), ["c", "b", "a"]);
    let logged: Vec<String> = log_lines(&store).into_iter().map(|e| e.event).collect();
    assert_eq!(
        logged,
        ["b", "c"],
        "the torn bytes are gone, every line parses"
    );
}

#[test]
fn a_trace_in_both_traces_json_and_the_log_is_listed_once() {
    // A crash between writing traces.json and removing the log it folded in.
    let env = TestEnv::new();
    let store = env.store();
    new_trace(&store, "a");
    new_trace(&store, "b");
    let log = fs::read(store.traces_log_path()).unwrap();
    // `b` and 98 more fill the log; the 99th folds it.
    for i in 0..TRACES_LOG_LINES - 1 {
        new_trace(&store, &format!("t{i}"));
    }
    assert!(!store.traces_log_path().exists(), "folded");
    fs::write(store.traces_log_path(), log).unwrap();
    let recent = store.recent_traces(1000).unwrap();
    assert_eq!(recent.len(), TRACES_LOG_LINES + 1);
    assert_eq!(
        recent.iter().filter(|e| e.event == "b").count(),
        1,
        "listed once"
    );
}

#[test]
fn a_damaged_traces_log_is_rebuilt_from_the_spans_like_traces_json() {
    let env = TestEnv::new();
    let store = env.store();
    new_trace(&store, "a");
    new_trace(&store, "b");
    fs::write(store.traces_log_path(), "not json\n").unwrap();
    let recent = store.recent_traces(10).unwrap();
    assert_eq!(recent.len(), 2, "rebuilt by a scan of the root spans");
}

fn event_ids(i: usize) -> (Uuid, Uuid, String) {
    let root = Uuid::new_v5(&Uuid::NAMESPACE_OID, format!("crash-event-{i}").as_bytes());
    let first = Uuid::new_v5(&root, b"first");
    (root, first, format!("crash-event-{i}"))
}

/// One run of a tiny pipeline over the real store: ingest events not yet in the cursor, then
/// process pending actions coordinate → plan → workflow → noop until nothing is left.
fn drive(store: &AutopilotStore) {
    store.recover(|_, _| false).unwrap();
    for i in 0..CRASH_TRACES {
        let (root_id, first_id, event) = event_ids(i);
        if store.read_cursor().unwrap().contains(&event) {
            continue;
        }
        let now = Utc::now();
        let mut meta = Meta::new();
        meta.insert("label".into(), json!(event));
        let mut root = Span::root(root_id, now, meta);
        root.finish(SpanStatus::Completed, "event", Meta::new(), now)
            .unwrap();
        let mut first = Action::new(StepKind::Coordinate, &root, "new event", Meta::new(), now);
        first.id = first_id;
        store.create_trace(&root, Some(&first), &[event]).unwrap();
    }
    loop {
        let state = store.read_state().unwrap();
        let Some(pending) = state
            .pending
            .iter()
            .find(|p| p.running_span_id.is_none())
            .cloned()
        else {
            break;
        };
        let run = store
            .begin_step(pending.action_id, &pending.action)
            .unwrap();
        let mut span = run.span;
        span.finish(SpanStatus::Completed, "done", Meta::new(), Utc::now())
            .unwrap();
        let next = match pending.action {
            StepKind::Coordinate => vec![StepKind::Plan],
            StepKind::Plan => vec![StepKind::Workflow, StepKind::Workflow],
            StepKind::Workflow => vec![StepKind::Noop],
            _ => vec![],
        };
        let produced: Vec<Action> = next
            .into_iter()
            .map(|k| Action::new(k, &span, "next", Meta::new(), Utc::now()))
            .collect();
        store.complete_step(&span, &produced).unwrap();
    }
}

#[test]
#[ignore = "child process of crash_safety_under_sigkill"]
fn crash_child() {
    let Some(dir) = child::instruction("ROVER_TEST_STORE") else {
        return;
    };
    let store = AutopilotStore::open(Path::new(&dir), "crash").unwrap();
    drive(&store);
}

/// Every file of the store parses.
fn assert_all_files_parse(store: &AutopilotStore) -> usize {
    let mut n = 0;
    for (dir, kind) in [
        (store.spans_dir(), "span"),
        (store.actions_dir(), "action"),
        (store.trace_index_dir(), "index"),
    ] {
        for entry in fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            if name.starts_with(".tmp-") {
                continue; // an interrupted write's temp file: never read
            }
            let text = fs::read_to_string(&path).unwrap();
            let ok = match kind {
                "span" => serde_json::from_str::<Span>(&text).is_ok(),
                "action" => serde_json::from_str::<Action>(&text).is_ok(),
                _ => serde_json::from_str::<TraceIndex>(&text).is_ok(),
            };
            assert!(ok, "{} does not parse: {text:?}", path.display());
            n += 1;
        }
    }
    for (path, ok) in [
        (
            store.state_path(),
            fs::read_to_string(store.state_path())
                .map(|t| serde_json::from_str::<State>(&t).is_ok()),
        ),
        (
            store.cursor_path(),
            fs::read_to_string(store.cursor_path())
                .map(|t| serde_json::from_str::<Cursor>(&t).is_ok()),
        ),
        (
            store.traces_path(),
            fs::read_to_string(store.traces_path())
                .map(|t| serde_json::from_str::<TracesCache>(&t).is_ok()),
        ),
    ] {
        assert!(ok.unwrap_or(true), "{} does not parse", path.display());
    }
    // The traces log: every whole line parses (a torn last one is a write cut off by the kill).
    let log = fs::read_to_string(store.traces_log_path()).unwrap_or_default();
    let whole = log.rfind('\n').map_or("", |at| &log[..at]);
    for line in whole.lines() {
        assert!(
            serde_json::from_str::<TraceEntry>(line).is_ok(),
            "traces.jsonl: {line:?} does not parse"
        );
    }
    n
}

#[test]
fn crash_safety_under_sigkill() {
    let env = TestEnv::new();
    let dir = env.path().join("data");
    let store = AutopilotStore::open(&dir, "crash").unwrap();
    // A new seed each run widens coverage over time; it is printed so a failure can be replayed.
    let seed = std::env::var("ROVER_TEST_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            u64::from(
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .unwrap()
                    .subsec_nanos(),
            )
        });
    eprintln!("crash safety: seed {seed} (replay with ROVER_TEST_SEED={seed})");
    let mut rng = Rng::new(seed);
    let mut kills = 0;
    for round in 0..60 {
        let mut child = child::spawn(
            "store::crash_child",
            &[("ROVER_TEST_STORE", dir.display().to_string())],
        );
        std::thread::sleep(Duration::from_millis(2 + rng.below(40)));
        let finished = child.try_wait().unwrap().is_some();
        let _ = child.kill(); // SIGKILL
        let status = child.wait().unwrap();
        if !finished {
            kills += 1;
        }
        assert_all_files_parse(&store);
        // No pending action lost: every ingested trace is queued, running or finished.
        let cursor = store.read_cursor().unwrap();
        for i in 0..CRASH_TRACES {
            let (root_id, _, event) = event_ids(i);
            if cursor.contains(&event) {
                let view = store
                    .load_trace(root_id)
                    .unwrap_or_else(|e| panic!("round {round}: trace {i}: {e}"));
                if rover::steps::kinds::trace_outcome(&view) == TraceOutcome::Stalled {
                    let state = store.read_state().unwrap();
                    panic!("seed {seed} round {round}: trace {i} lost its work ({status})\nspans: {:#?}\nactions: {:#?}\nindex: {:#?}\npending: {:#?}", view.spans.iter().map(|s| (s.id, s.step.clone(), s.status, s.action_id)).collect::<Vec<_>>(), view.actions.iter().map(|a| (a.id, a.action.clone(), a.span_id)).collect::<Vec<_>>(), view.index, state.pending);
                }
            }
        }
    }
    assert!(
        kills >= 20,
        "the children must really be cut off mid-run (killed {kills} of 60)"
    );

    // A last run to the end: every trace finishes, every action ran to completion exactly once.
    drive(&store);
    assert_all_files_parse(&store);
    assert!(store.read_state().unwrap().pending.is_empty());
    let mut completed_runs: BTreeMap<Uuid, usize> = BTreeMap::new();
    let mut traces = BTreeSet::new();
    for i in 0..CRASH_TRACES {
        let (root_id, _, _) = event_ids(i);
        let view = store.load_trace(root_id).unwrap();
        assert_eq!(
            rover::steps::kinds::trace_outcome(&view),
            TraceOutcome::Finished {
                step: StepKind::Noop,
                status: SpanStatus::Completed
            }
        );
        assert!(
            view.missing.is_empty(),
            "trace {i} misses files: {:?}",
            view.missing
        );
        let noops = view
            .spans
            .iter()
            .filter(|s| s.step == StepKind::Noop && s.status == SpanStatus::Completed)
            .count();
        assert_eq!(noops, 2, "trace {i}: one noop per workflow");
        for span in view
            .spans
            .iter()
            .filter(|s| s.status == SpanStatus::Completed)
        {
            if let Some(action) = span.action_id {
                *completed_runs.entry(action).or_default() += 1;
            }
        }
        // Every produced action was taken.
        for action in &view.actions {
            assert!(
                view.spans
                    .iter()
                    .any(|s| s.action_id == Some(action.id) && s.status == SpanStatus::Completed),
                "trace {i}: action {} never ran",
                action.action
            );
        }
        traces.insert(root_id);
    }
    assert_eq!(traces.len(), CRASH_TRACES);
    let listed: Vec<Uuid> = store
        .recent_traces(1000)
        .unwrap()
        .into_iter()
        .map(|e| e.trace_id)
        .collect();
    assert_eq!(
        listed.len(),
        CRASH_TRACES,
        "every trace listed once by `traces`"
    );
    assert_eq!(listed.into_iter().collect::<BTreeSet<_>>(), traces);
    let twice: Vec<_> = completed_runs.iter().filter(|(_, n)| **n > 1).collect();
    assert!(
        twice.is_empty(),
        "actions completed more than once: {twice:?}"
    );
    eprintln!("crash safety: {kills} kills survived, {CRASH_TRACES} traces, 0 lost");
}

// ---- locking across processes ---------------------------------------------------------------

const LOCK_CHILDREN: usize = 4;
const LOCK_OPS: usize = 40;

fn lock_action(child: usize, i: usize, trace: Uuid) -> Action {
    let now = Utc::now();
    let root = Span::root(trace, now, Meta::new());
    let mut action = Action::new(
        StepKind::Coordinate,
        &root,
        format!("child {child} op {i}"),
        Meta::new(),
        now,
    );
    action.id = Uuid::new_v5(&Uuid::NAMESPACE_OID, format!("lock-{child}-{i}").as_bytes());
    action
}

#[test]
#[ignore = "child process of queue_operations_from_several_processes_are_exact"]
fn lock_child() {
    let Some(dir) = child::instruction("ROVER_TEST_STORE") else {
        return;
    };
    let me: usize = child::instruction("ROVER_TEST_CHILD_INDEX")
        .unwrap()
        .parse()
        .unwrap();
    let store = AutopilotStore::open(Path::new(&dir), "locks").unwrap();
    let trace = Uuid::new_v4();
    for i in 0..LOCK_OPS {
        store.enqueue(&lock_action(me, i, trace), trace).unwrap();
        if i % 2 == 1 {
            let gone = store.dequeue(lock_action(me, i - 1, trace).id).unwrap();
            assert!(gone.is_some(), "my own entry was there to dequeue");
        }
    }
}

#[test]
fn queue_operations_from_several_processes_are_exact() {
    let env = TestEnv::new();
    let dir = env.path().join("data");
    let children: Vec<_> = (0..LOCK_CHILDREN)
        .map(|i| {
            child::spawn(
                "store::lock_child",
                &[
                    ("ROVER_TEST_STORE", dir.display().to_string()),
                    ("ROVER_TEST_CHILD_INDEX", i.to_string()),
                ],
            )
        })
        .collect();
    for c in children {
        let out = c.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "child failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let store = AutopilotStore::open(&dir, "locks").unwrap();
    let pending: Vec<PendingAction> = store.read_state().unwrap().pending;
    let got: BTreeSet<Uuid> = pending.iter().map(|p| p.action_id).collect();
    let want: BTreeSet<Uuid> = (0..LOCK_CHILDREN)
        .flat_map(|c| {
            (0..LOCK_OPS)
                .filter(|i| i % 2 == 1)
                .map(move |i| lock_action(c, i, Uuid::nil()).id)
        })
        .collect();
    assert_eq!(pending.len(), got.len(), "no entry twice");
    assert_eq!(
        got, want,
        "exactly the entries that were enqueued and not dequeued"
    );
}

#[test]
fn stale_temp_files_of_interrupted_writes_are_swept_and_fresh_ones_kept() {
    let env = TestEnv::new();
    let store = env.store();
    let stale = store.spans_dir().join(".tmp-stale");
    let fresh = store.actions_dir().join(".tmp-fresh");
    let kept = store.spans_dir().join("not-a-temp.json");
    for f in [&stale, &fresh, &kept] {
        fs::write(f, "{").unwrap();
    }
    let old = std::time::SystemTime::now() - Duration::from_secs(3600);
    fs::File::options()
        .write(true)
        .open(&stale)
        .unwrap()
        .set_modified(old)
        .unwrap();
    assert_eq!(store.sweep_temp_files(Duration::from_secs(60)).unwrap(), 1);
    assert!(!stale.exists(), "an hour-old temp file is a leftover");
    assert!(fresh.exists(), "a fresh one may be a write in progress");
    assert!(kept.exists(), "nothing but temp files is touched");
}

/// A queue with `n` queued actions in one trace, written through the journal.
fn journaled_queue(store: &AutopilotStore, n: usize) -> Vec<Uuid> {
    let (root, _first) = new_trace(store, "journal");
    (0..n)
        .map(|_| {
            let a = Action::new(StepKind::Notify, &root, "queued", Meta::new(), Utc::now());
            store.enqueue(&a, root.id).unwrap();
            a.id
        })
        .collect()
}

fn queued(state: &State) -> BTreeSet<Uuid> {
    state.pending.iter().map(|p| p.action_id).collect()
}

#[test]
fn queue_operations_are_journaled_and_every_reader_sees_them() {
    let env = TestEnv::new();
    let store = env.store();
    let ids = journaled_queue(&store, 3);
    let journal = fs::read_to_string(store.journal_path()).unwrap();
    assert!(journal.lines().count() > 3, "{journal}");
    // Another handle (another process) and the lock-free reader see the appended records.
    let other = env.store();
    for state in [store.read_state().unwrap(), other.read_state().unwrap()] {
        assert!(ids.iter().all(|id| queued(&state).contains(id)));
    }
    other.dequeue(ids[0]).unwrap().expect("queued");
    // The first handle's kept state is brought up to date by the other's record.
    assert!(store.dequeue(ids[0]).unwrap().is_none());
    assert!(!queued(&store.read_state().unwrap()).contains(&ids[0]));

    // Compaction folds the journal into state.json, which then holds the queue alone.
    let before = queued(&store.read_state().unwrap());
    store.compact_state().unwrap();
    let on_disk: State =
        serde_json::from_str(&fs::read_to_string(store.state_path()).unwrap()).unwrap();
    assert_eq!(queued(&on_disk), before);
    assert_eq!(
        fs::read_to_string(store.journal_path())
            .unwrap()
            .lines()
            .count(),
        1
    );
}

#[test]
fn a_torn_last_journal_record_is_ignored_and_cut_off_by_the_next_write() {
    let env = TestEnv::new();
    let store = env.store();
    let ids = journaled_queue(&store, 2);
    let mut bytes = fs::read(store.journal_path()).unwrap();
    let acknowledged = bytes.len();
    bytes.extend_from_slice(b"1234abcd {\"seq\":99,\"ops\":[{\"remove\":");
    fs::write(store.journal_path(), &bytes).unwrap();

    let fresh = env.store();
    assert_eq!(queued(&fresh.read_state().unwrap()).len(), 3);
    fresh.dequeue(ids[1]).unwrap().expect("queued");
    let after = fs::read(store.journal_path()).unwrap();
    assert_eq!(&after[..acknowledged], &bytes[..acknowledged]);
    assert!(after.ends_with(b"\n"), "the torn record was cut off");
    let state = store.read_state().unwrap();
    assert!(queued(&state).contains(&ids[0]) && !queued(&state).contains(&ids[1]));
}

#[test]
fn a_damaged_journal_record_before_the_last_is_an_error_naming_the_file() {
    let env = TestEnv::new();
    let store = env.store();
    journaled_queue(&store, 3);
    let text = fs::read_to_string(store.journal_path()).unwrap();
    let mut lines: Vec<String> = text.lines().map(str::to_owned).collect();
    lines[1] = lines[1].replacen("\"seq\"", "\"sEq\"", 1);
    fs::write(store.journal_path(), lines.join("\n") + "\n").unwrap();

    let fresh = env.store();
    let err = fresh.read_state().unwrap_err().to_string();
    assert!(
        err.contains("state.journal") && err.contains("record 2"),
        "{err}"
    );
    let err = fresh.dequeue(Uuid::new_v4()).unwrap_err().to_string();
    assert!(err.contains("state.journal"), "{err}");
}

#[test]
fn a_crash_between_writing_state_json_and_replacing_the_journal_duplicates_nothing() {
    let env = TestEnv::new();
    let store = env.store();
    let ids = journaled_queue(&store, 3);
    let journal = fs::read(store.journal_path()).unwrap();
    store.compact_state().unwrap();
    // The old journal back: as if the compaction stopped after writing state.json.
    fs::write(store.journal_path(), &journal).unwrap();

    let fresh = env.store();
    let state = fresh.read_state().unwrap();
    assert_eq!(state.pending.len(), 4, "each action once");
    fresh.dequeue(ids[2]).unwrap().expect("queued");
    let state = store.read_state().unwrap();
    assert_eq!(state.pending.len(), 3);
    assert!(!queued(&state).contains(&ids[2]));
}

#[test]
fn a_start_between_full_sweeps_lists_only_the_autopilot_dir() {
    let env = TestEnv::new();
    let store = env.store();
    let old = std::time::SystemTime::now() - Duration::from_secs(3600);
    let stale = |path: &Path| {
        fs::write(path, "{").unwrap();
        fs::File::options()
            .write(true)
            .open(path)
            .unwrap()
            .set_modified(old)
            .unwrap();
    };
    let day = Duration::from_secs(86_400);
    let in_spans = store.spans_dir().join(".tmp-a");
    stale(&in_spans);
    // No sweep yet: a full one, noted.
    assert_eq!(
        store
            .sweep_temp_files_due(Duration::from_secs(60), day)
            .unwrap(),
        1
    );
    assert!(!in_spans.exists());
    assert!(store.temp_sweep_path().is_file());
    // Within the day: the history's directories wait, `autopilot/` is swept.
    stale(&in_spans);
    let in_autopilot = store.autopilot_dir().join(".tmp-b");
    stale(&in_autopilot);
    assert_eq!(
        store
            .sweep_temp_files_due(Duration::from_secs(60), day)
            .unwrap(),
        1
    );
    assert!(in_spans.exists(), "left for the next full sweep");
    assert!(!in_autopilot.exists());
    // Once the day is over, the full sweep again.
    assert_eq!(
        store
            .sweep_temp_files_due(Duration::from_secs(60), Duration::ZERO)
            .unwrap(),
        1
    );
    assert!(!in_spans.exists());
}

#[test]
fn compacting_a_folded_queue_writes_nothing_and_a_journal_is_still_folded() {
    let env = TestEnv::new();
    let store = env.store();
    let root = Span::root(Uuid::new_v4(), Utc::now(), Meta::new());
    let a = Action::new(StepKind::Coordinate, &root, "x", Meta::new(), Utc::now());
    store.enqueue(&a, root.id).unwrap();
    store.compact_state().unwrap();
    let state_file = fs::metadata(store.state_path()).unwrap();
    let journal = fs::read(store.journal_path()).unwrap();
    // Nothing to fold: neither file is replaced (an idle `start --once` costs nothing per
    // pending action).
    store.compact_state().unwrap();
    assert_eq!(
        fs::metadata(store.state_path())
            .unwrap()
            .modified()
            .unwrap(),
        state_file.modified().unwrap()
    );
    assert_eq!(fs::read(store.journal_path()).unwrap(), journal);
    // A record appended: folded as before.
    store.dequeue(a.id).unwrap();
    store.compact_state().unwrap();
    let on_disk: Value = serde_json::from_slice(&fs::read(store.state_path()).unwrap()).unwrap();
    assert_eq!(on_disk["pending"], json!([]));
    assert_eq!(store.read_state().unwrap().pending.len(), 0);
}

#[test]
fn an_old_state_without_journal_seq_opens_and_compacts_to_nothing() {
    let env = TestEnv::new();
    let store = env.store();
    let root = Span::root(Uuid::new_v4(), Utc::now(), Meta::new());
    let a = Action::new(StepKind::Coordinate, &root, "x", Meta::new(), Utc::now());
    let mut state = State::new(Utc::now());
    state.pending.push(a.pending(root.id, Utc::now()));
    fs::create_dir_all(store.autopilot_dir()).unwrap();
    fs::write(
        store.state_path(),
        serde_json::to_vec_pretty(&state).unwrap(),
    )
    .unwrap();
    let before = fs::read(store.state_path()).unwrap();
    store.compact_state().unwrap();
    assert_eq!(
        fs::read(store.state_path()).unwrap(),
        before,
        "a store an older rover wrote is left as it was until something changes"
    );
    store.dequeue(a.id).unwrap();
    assert!(store.read_state().unwrap().pending.is_empty());
}
