//! Deterministic stores for snapshots and benchmarks: fixed ids (a counter) and fixed times, built
//! through the store's own write paths.

use chrono::{DateTime, Duration, TimeZone, Utc};
use rover::store::{Action, AutopilotStore, Meta, Span, SpanStatus, StepKind};
use serde_json::{json, Value};
use uuid::Uuid;

/// Ids and times that are the same on every run.
pub struct Gen {
    next: u128,
    pub t0: DateTime<Utc>,
}

impl Gen {
    pub fn new(seed: u128) -> Gen {
        Gen {
            next: seed << 64,
            t0: Utc.with_ymd_and_hms(2026, 11, 20, 9, 15, 0).unwrap(),
        }
    }

    pub fn id(&mut self) -> Uuid {
        self.next += 1;
        // A v4-shaped id so prefixes look like real ones.
        let raw = self
            .next
            .wrapping_mul(0x9E37_79B9_7F4A_7C15_F39C_C060_5CED_C835);
        uuid::Builder::from_random_bytes(raw.to_be_bytes()).into_uuid()
    }

    pub fn at(&self, ms: i64) -> DateTime<Utc> {
        self.t0 + Duration::milliseconds(ms)
    }
}

pub fn meta(v: Value) -> Meta {
    v.as_object().cloned().unwrap_or_default()
}

/// Writes one trace step by step, as the pipeline would.
pub struct TraceWriter<'a> {
    pub store: &'a AutopilotStore,
    pub gen: &'a mut Gen,
    pub trace_id: Uuid,
    pub clock: i64,
}

impl<'a> TraceWriter<'a> {
    /// A trace whose root event span is finished, with its label in `meta.label`.
    pub fn start(
        store: &'a AutopilotStore,
        gen: &'a mut Gen,
        start_ms: i64,
        label: &str,
    ) -> TraceWriter<'a> {
        let id = gen.id();
        let mut root = Span::root(
            id,
            gen.at(start_ms),
            meta(json!({"type": "IssuesEvent", "action": "opened", "label": label})),
        );
        root.finish(
            SpanStatus::Completed,
            label,
            Meta::new(),
            gen.at(start_ms + 5),
        )
        .unwrap();
        store.create_trace(&root, None, &[]).unwrap();
        TraceWriter {
            store,
            gen,
            trace_id: id,
            clock: start_ms + 5,
        }
    }

    /// An action produced by `from`, queued.
    pub fn act(&mut self, from: Uuid, step: StepKind, reason: &str, meta_v: Value) -> Action {
        self.clock += 1;
        let action = Action {
            id: self.gen.id(),
            version: "1.0".into(),
            timestamp: self.gen.at(self.clock),
            action: step,
            span_id: from,
            reason: reason.into(),
            meta: meta(meta_v),
            trace_id: Some(self.trace_id),
        };
        let trace_id = self.trace_id;
        let at = self.gen.at(self.clock);
        self.store.write_action(&action).unwrap();
        self.store
            .transact(|txn| {
                txn.push_pending(action.pending(trace_id, at))?;
                txn.add_to_trace(trace_id, &[], &[action.id], at)
            })
            .unwrap();
        action
    }

    /// A span processing `action`, taking `ms`, finished with `status`; dequeues the action.
    pub fn run(
        &mut self,
        action: &Action,
        ms: i64,
        status: SpanStatus,
        summary: &str,
        meta_v: Value,
    ) -> Span {
        self.clock += 1;
        let mut span = Span::start(
            action.action.clone(),
            action,
            self.trace_id,
            self.gen.at(self.clock),
        );
        span.id = self.gen.id();
        self.clock += ms;
        if status != SpanStatus::Running {
            span.finish(status, summary, meta(meta_v), self.gen.at(self.clock))
                .unwrap();
        }
        self.store.write_span(&span).unwrap();
        let trace_id = self.trace_id;
        let at = self.gen.at(self.clock);
        let running = status == SpanStatus::Running;
        self.store
            .transact(|txn| {
                if running {
                    if let Some(p) = txn.pending_mut(action.id)? {
                        p.running_span_id = Some(span.id);
                        p.attempts += 1;
                    }
                } else {
                    txn.remove_pending(action.id)?;
                    txn.add_to_trace(trace_id, &[span.id], &[], at)?;
                }
                Ok(())
            })
            .unwrap();
        span
    }
}

/// The spec's "issue opened" example, mid-flight: two tasks, one failed with a commit error and
/// retried, one still pending its resolve.
pub fn example_store(store: &AutopilotStore) -> Uuid {
    let mut gen = Gen::new(1);
    let mut t = TraceWriter::start(
        store,
        &mut gen,
        0,
        "IssuesEvent opened #12 by alice: Add a --json flag to export",
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
        3_200,
        SpanStatus::Completed,
        "decided plan (confidence 0.86)",
        json!({"decision": "plan", "confidence": 0.86}),
    );
    let a = t.act(
        c.id,
        StepKind::Plan,
        "feature request needs task decomposition",
        json!({}),
    );
    let p = t.run(
        &a,
        12_400,
        SpanStatus::Completed,
        "2 tasks: implement the flag, then tests",
        json!({}),
    );
    let w1 = t.act(
        p.id,
        StepKind::Workflow,
        "implement --json in the export command",
        json!({"title": "Implement --json"}),
    );
    let w2 = t.act(
        p.id,
        StepKind::Workflow,
        "add tests for --json",
        json!({"title": "Tests", "dependsOn": w1.id}),
    );
    let s1 = t.run(
        &w1,
        123_000,
        SpanStatus::Completed,
        "task completed: 3 files changed",
        json!({"taskId": "task-1"}),
    );
    let c1 = t.act(s1.id, StepKind::Commit, "task finished", json!({}));
    let k1 = t.run(&c1, 900, SpanStatus::Error, "pre-commit hook failed", json!({"error": {
        "message": "git commit failed: the pre-commit hook exited with 127",
        "command": ["git", "commit", "-F", "-"],
        "exitCode": 1,
        "stderr": "lint-staged: command not found\nhusky - pre-commit hook exited with code 127 (error)"
    }}));
    let r1 = t.act(
        k1.id,
        StepKind::Resolve,
        "commit finished with error",
        json!({}),
    );
    let rs = t.run(
        &r1,
        20_000,
        SpanStatus::Completed,
        "installed lint-staged; retrying the commit",
        json!({"decision": "retry"}),
    );
    let c1b = t.act(
        rs.id,
        StepKind::Commit,
        "retry after installing lint-staged",
        json!({}),
    );
    let k1b = t.run(
        &c1b,
        1_100,
        SpanStatus::Completed,
        "committed 4f2a9c1 on rover/0b6f-add-json",
        json!({"sha": "4f2a9c1"}),
    );
    let _r2 = t.act(k1b.id, StepKind::Resolve, "commit completed", json!({}));
    let _ = t.run(&w2, 5_000, SpanStatus::Running, "", json!({}));
    root
}
