//! What a separate process (`submit`) pays for the queue: a new trace's first action is
//! journaled without reading `state.json`'s queue, and the sequence rules of the journal hold on
//! that path too (a torn last record, a compaction cut off between its two writes, a damaged
//! record, a journal ahead of `state.json`, a `state.json` another writer laid out).

use std::collections::BTreeSet;
use std::fs;

use chrono::Utc;
use rover::intake::{Arrival, Ingested};
use rover::store::{Action, AutopilotStore, Meta, Span, State, StepKind};
use serde_json::Value;
use uuid::Uuid;

use crate::support::env::{stderr, stdout, TestEnv};

/// A queue of `n` actions in one trace, folded into `state.json` (the journal then holds only
/// its header), written by another handle than the tests' cold one.
fn folded_queue(env: &TestEnv, n: usize) -> Vec<Uuid> {
    let store = env.store();
    let root = Span::root(Uuid::new_v4(), Utc::now(), Meta::new());
    let ids = (0..n)
        .map(|_| {
            let a = Action::new(StepKind::Notify, &root, "queued", Meta::new(), Utc::now());
            store.enqueue(&a, root.id).unwrap();
            a.id
        })
        .collect();
    store.compact_state().unwrap();
    ids
}

/// A local request through a fresh handle (a separate process, as `submit`): its first action.
fn submit(env: &TestEnv) -> Uuid {
    let trace = try_submit(env).unwrap().trace();
    // The first action's id derives from the trace's (`intake::local_trace`).
    Uuid::new_v5(&trace, b"coordinate")
}

/// What `submit` does, through a fresh handle: a local request through `intake::ingest`.
fn try_submit(env: &TestEnv) -> Result<Ingested, rover::store::StoreError> {
    let arrival = Arrival::Local {
        request: "look at the flaky test",
        actor: "alice",
    };
    rover::intake::ingest(
        &env.store(),
        &rover::intake::Entry::new(env.project_id.clone(), rover::steps::kinds::FIRST_STEP),
        arrival,
    )
}

fn queued(store: &AutopilotStore) -> Vec<Uuid> {
    store
        .read_state()
        .unwrap()
        .pending
        .iter()
        .map(|p| p.action_id)
        .collect()
}

/// The journal's lines as JSON (checksums dropped).
fn journal(store: &AutopilotStore) -> Vec<Value> {
    fs::read_to_string(store.journal_path())
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(&l[9..]).unwrap())
        .collect()
}

fn journal_seq(store: &AutopilotStore) -> u64 {
    let state: Value = serde_json::from_slice(&fs::read(store.state_path()).unwrap()).unwrap();
    state["journalSeq"].as_u64().unwrap()
}

#[test]
fn a_local_request_is_journaled_without_reading_the_queue() {
    let env = TestEnv::new();
    let ids = folded_queue(&env, 3);
    let store = env.store();
    let seq = journal_seq(&store);
    // The queue in the middle of state.json made unreadable (ends kept): a path that parsed it
    // would fail. The append reads the two ends and the journal only.
    let good = fs::read(store.state_path()).unwrap();
    let text = String::from_utf8(good.clone()).unwrap();
    let broken = text.replacen("\"pending\": [", "\"pending\": [[", 1);
    assert_ne!(broken, text);
    fs::write(store.state_path(), &broken).unwrap();
    let first = submit(&env);
    assert_eq!(
        fs::read_to_string(store.state_path()).unwrap(),
        broken,
        "state.json is neither read nor rewritten"
    );
    let lines = journal(&store);
    assert_eq!(lines.len(), 2, "{lines:?}");
    assert_eq!(lines[0]["after"], seq);
    assert_eq!(lines[1]["seq"], seq + 1);
    assert_eq!(lines[1]["ops"][0]["put"]["actionId"], first.to_string());
    // A damaged queue is still loud for every reader, and nothing is lost once it is repaired.
    let err = env.store().read_state().unwrap_err().to_string();
    assert!(err.contains("state.json"), "{err}");
    fs::write(store.state_path(), &good).unwrap();
    let mut want: BTreeSet<Uuid> = ids.into_iter().collect();
    want.insert(first);
    assert_eq!(
        queued(&env.store()).into_iter().collect::<BTreeSet<_>>(),
        want
    );
    // The next ones follow in sequence, and a daemon-like handle reads them.
    let second = submit(&env);
    assert_eq!(journal(&store)[2]["seq"], seq + 2);
    let q = queued(&store);
    assert_eq!(q.len(), 5);
    assert_eq!(&q[3..], &[first, second], "appended in order");
}

#[test]
fn a_torn_last_record_is_cut_off_before_the_local_request_follows() {
    let env = TestEnv::new();
    folded_queue(&env, 2);
    let store = env.store();
    let root = Span::root(Uuid::new_v4(), Utc::now(), Meta::new());
    let a = Action::new(StepKind::Notify, &root, "queued", Meta::new(), Utc::now());
    store.enqueue(&a, root.id).unwrap();
    let mut bytes = fs::read(store.journal_path()).unwrap();
    let acknowledged = bytes.len();
    bytes.extend_from_slice(b"1234abcd {\"seq\":99,\"ops\":[{\"remove\":");
    fs::write(store.journal_path(), &bytes).unwrap();
    let first = submit(&env);
    let after = fs::read(store.journal_path()).unwrap();
    assert_eq!(&after[..acknowledged], &bytes[..acknowledged]);
    let lines = journal(&env.store());
    assert_eq!(lines.len(), 3, "the torn record is gone: {lines:?}");
    assert_eq!(lines[2]["seq"], lines[1]["seq"].as_u64().unwrap() + 1);
    let q = queued(&env.store());
    assert_eq!(q.len(), 4);
    assert!(q.contains(&a.id) && q.contains(&first));
}

#[test]
fn a_compaction_cut_off_between_its_writes_sends_the_request_the_full_way() {
    let env = TestEnv::new();
    let store = env.store();
    let root = Span::root(Uuid::new_v4(), Utc::now(), Meta::new());
    let ids: Vec<Uuid> = (0..3)
        .map(|_| {
            let a = Action::new(StepKind::Notify, &root, "queued", Meta::new(), Utc::now());
            store.enqueue(&a, root.id).unwrap();
            a.id
        })
        .collect();
    let old = fs::read(store.journal_path()).unwrap();
    store.compact_state().unwrap();
    // The old journal back: the compaction stopped after writing state.json. Its records are
    // all at or below journalSeq: a record numbered after them would be skipped by every reader.
    fs::write(store.journal_path(), &old).unwrap();
    let seq = journal_seq(&store);
    assert!(journal(&store)
        .iter()
        .all(|l| l["seq"].as_u64().unwrap_or(0) < seq));
    let first = submit(&env);
    let lines = journal(&env.store());
    assert_eq!(lines[0]["after"], seq, "started afresh: {lines:?}");
    assert_eq!(lines[1]["seq"], seq + 1);
    assert_eq!(lines.len(), 2);
    let q = queued(&env.store());
    assert_eq!(q.len(), 4, "each action once: {q:?}");
    assert!(ids.iter().all(|id| q.contains(id)) && q.contains(&first));
}

#[test]
fn a_damaged_journal_or_one_ahead_of_state_json_fails_the_request_by_name() {
    let env = TestEnv::new();
    folded_queue(&env, 2);
    let store = env.store();
    let root = Span::root(Uuid::new_v4(), Utc::now(), Meta::new());
    for _ in 0..2 {
        let a = Action::new(StepKind::Notify, &root, "queued", Meta::new(), Utc::now());
        store.enqueue(&a, root.id).unwrap();
    }
    let good = fs::read_to_string(store.journal_path()).unwrap();
    let mut lines: Vec<&str> = good.lines().collect();
    let damaged = lines[1].replacen("\"seq\"", "\"sEq\"", 1);
    lines[1] = &damaged;
    fs::write(store.journal_path(), lines.join("\n") + "\n").unwrap();
    let err = try_submit(&env).unwrap_err().to_string();
    assert!(
        err.contains("state.journal") && err.contains("record 2"),
        "{err}"
    );
    assert!(
        fs::read_dir(store.autopilot_dir()).unwrap().any(|e| e
            .unwrap()
            .file_name()
            .to_string_lossy()
            .starts_with("state.journal.corrupt-")),
        "a copy is kept aside, as on the full path"
    );
    assert_eq!(
        fs::read_to_string(store.journal_path())
            .unwrap()
            .lines()
            .count(),
        3,
        "nothing appended after a damaged record"
    );

    // state.json replaced by an older copy: the journal continues a newer one.
    let env = TestEnv::new();
    folded_queue(&env, 2);
    let store = env.store();
    let older = fs::read(store.state_path()).unwrap();
    let a = Action::new(StepKind::Notify, &root, "queued", Meta::new(), Utc::now());
    store.enqueue(&a, root.id).unwrap();
    store.compact_state().unwrap();
    store.dequeue(a.id).unwrap();
    fs::write(store.state_path(), &older).unwrap();
    let err = try_submit(&env).unwrap_err().to_string();
    assert!(
        err.contains("state.journal") && err.contains("older copy"),
        "{err}"
    );
}

#[test]
fn a_state_json_another_writer_laid_out_is_read_the_full_way() {
    let env = TestEnv::new();
    let ids = folded_queue(&env, 2);
    let store = env.store();
    let seq = journal_seq(&store);
    // Compact JSON (another implementation, or a hand edit with the journal empty).
    let state: State = serde_json::from_slice(&fs::read(store.state_path()).unwrap()).unwrap();
    fs::write(store.state_path(), serde_json::to_vec(&state).unwrap()).unwrap();
    let first = submit(&env);
    let lines = journal(&env.store());
    assert_eq!(lines.last().unwrap()["seq"], seq + 1);
    let q = queued(&env.store());
    assert_eq!(q.len(), 3);
    assert!(ids.iter().all(|id| q.contains(id)) && q.contains(&first));
    // No journal at all: the full way too, which starts one.
    let env = TestEnv::new();
    folded_queue(&env, 1);
    let store = env.store();
    fs::remove_file(store.journal_path()).unwrap();
    let first = submit(&env);
    assert_eq!(journal(&store)[0]["after"], journal_seq(&store));
    assert!(queued(&env.store()).contains(&first));
}

#[test]
fn local_requests_fold_the_journal_once_it_outgrows_the_minimum() {
    let env = TestEnv::new();
    folded_queue(&env, 1);
    let store = env.store();
    let seq = journal_seq(&store);
    let mut firsts = Vec::new();
    // 64 KiB of records, about 450 bytes each.
    while journal_seq(&store) == seq {
        firsts.push(submit(&env));
        assert!(firsts.len() < 400, "never folded");
    }
    let on_disk: State = serde_json::from_slice(&fs::read(store.state_path()).unwrap()).unwrap();
    assert_eq!(on_disk.pending.len(), 1 + firsts.len());
    assert_eq!(journal(&store).len(), 1, "the journal started afresh");
    assert_eq!(&queued(&env.store())[1..], &firsts[..]);
}

#[test]
fn submit_through_the_binary_appends_one_record_and_leaves_state_json_alone() {
    let env = TestEnv::new();
    env.repo();
    folded_queue(&env, 5);
    let store = env.store();
    let before = fs::read(store.state_path()).unwrap();
    let out = env.rover(&["autopilot", "submit", "look at the flaky test"]);
    assert!(out.status.success(), "{}{}", stdout(&out), stderr(&out));
    assert_eq!(fs::read(store.state_path()).unwrap(), before);
    let lines = journal(&store);
    assert_eq!(lines.len(), 2);
    assert_eq!(lines[1]["ops"][0]["put"]["summary"], "new local request");
    let out = env.rover(&["autopilot", "status"]);
    assert!(stdout(&out).contains("pending  6"), "{}", stdout(&out));
}
