//! Soak: 200 traces of every kind through the real binary (`rover autopilot start --once`, as
//! cron runs it) against the fake GitHub, the fake agent and a real Docker engine, then `gc`
//! with `retainDays` 0: disk, task mappings and containers must end bounded.

use std::path::Path;
use std::time::Instant;

use serde_json::json;

use crate::support::env::stdout;
use crate::support::scenario::{
    chain, coordinate, head_sha, merge, pr_payload, resolve, task, workflow_rule, Scenario, COMMIT,
    COORDINATE, NOTIFY, PLAN, RESOLVE,
};

/// Bytes under `dir` (files only, not following links).
fn du(dir: &Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    entries
        .flatten()
        .map(|e| match e.file_type() {
            Ok(t) if t.is_dir() => du(&e.path()),
            Ok(t) if t.is_file() => e.metadata().map_or(0, |m| m.len()),
            _ => 0,
        })
        .sum()
}

fn entries(dir: &Path) -> usize {
    std::fs::read_dir(dir).map_or(0, Iterator::count)
}

/// The mix, 200 traces: the container runs are what cost (a few seconds each on a quiet 2-core
/// machine, three at a time), so only 6 issues go through workflows in containers (3 that
/// succeed and are committed, 3 whose agent fails; the resolver gives up on both, so no pull
/// request keeps them alive); 6 red-CI pushes and 6 change requests on a human's pull request
/// are answered by the coordinator (event → coordinate → notify, host only); 172 local
/// submissions are answered the same way, and 10 more are cancelled by hand before they run.
/// Every kind of trace start and end is there; the count is in the host-only ones, which cost
/// two fake agent runs each.
const ISSUES: u64 = 6;
const CI_RED: u64 = 6;
const REVIEWS: u64 = 6;
const CANCELLED: usize = 10;
const LOCAL: usize = 172;
const _: () = assert!(ISSUES + CI_RED + REVIEWS + (LOCAL + CANCELLED) as u64 == 200);

#[tokio::test]
async fn two_hundred_traces_of_every_kind_end_with_bounded_disk_mappings_and_containers() {
    let clock = Instant::now();
    let mut s = Scenario::new().await;
    s.with_sandbox().await;
    // Rules, first match wins: per-step headings before the event texts they may quote.
    s.rules.push(workflow_rule(
        "Soak fix ok",
        json!({"ok.txt": "ok\n"}),
        "completed",
    ));
    s.rules.push(workflow_rule(
        "Soak fix bad",
        json!({"bad.txt": "half\n"}),
        "failed",
    ));
    s.answer(COMMIT, json!({"subject": "Soak change", "body": null}));
    s.answer(
        RESOLVE,
        resolve("fail", json!({"message": "Not shipping soak work."})),
    );
    s.answer(NOTIFY, json!({"message": "Answered."}));
    for kind in ["ok", "bad"] {
        s.answer(
            &format!("Soak directive {kind}"),
            json!({"analysis": "One task.", "clarification": null,
                "tasks": [task("t1", &format!("Soak fix {kind}"), &[], "swe")]}),
        );
        s.answer(
            &format!("Soak issue {kind}"),
            coordinate(
                "plan",
                json!({"directive": format!("Soak directive {kind}")}),
            ),
        );
    }
    s.answer(
        COORDINATE,
        coordinate("notify", json!({"message": "Here is the answer."})),
    );
    let _ = PLAN;

    // GitHub events.
    for n in 0..ISSUES {
        let kind = if n % 2 == 0 { "ok" } else { "bad" };
        let number = 100 + n;
        let title = format!("Soak issue {kind} {n}");
        s.github.add_issue(number, &title, "Please.", "alice", &[]);
        s.github.seed_event("IssuesEvent", "alice", json!({"action": "opened", "issue": {"number": number, "title": title, "body": "Please.", "user": {"login": "alice"}}}));
    }
    let sha = head_sha(&s.checkout);
    s.github.add_status(&sha, "failure", "ci/test");
    for n in 0..CI_RED {
        s.github.seed_event("PushEvent", "alice", json!({"repository_id": 1, "push_id": 300 + n, "ref": "refs/heads/main", "head": sha, "before": "0000000000000000000000000000000000000000"}));
    }
    for n in 0..REVIEWS {
        let number = 200 + n;
        let branch = format!("feature-{n}");
        s.github
            .add_pull(number, "A human's change", "bob", &branch, &sha, "main");
        let body = "Please rename the flag.";
        s.github
            .add_review(number, "alice", "CHANGES_REQUESTED", body);
        s.github.seed_event("PullRequestReviewEvent", "alice", json!({"action": "created", "pull_request": pr_payload(number, &branch, &sha),
            "review": {"id": 900 + n, "body": body, "state": "changes_requested", "commit_id": sha, "html_url": "h"}}));
    }
    // Local submissions, some cancelled before they run.
    let mut cancelled = Vec::new();
    for n in 0..LOCAL + CANCELLED {
        let out = s
            .env
            .rover(&["autopilot", "submit", &format!("soak question {n}")]);
        assert!(
            out.status.success(),
            "{}",
            crate::support::env::stderr(&out)
        );
        if n < CANCELLED {
            let text = stdout(&out);
            let id = text
                .split_whitespace()
                .nth(2)
                .expect("a trace id")
                .to_owned();
            let out = s.env.rover(&[
                "autopilot",
                "cancel",
                &id,
                "--reason",
                "soak",
                "--by",
                "soaker",
            ]);
            assert!(
                out.status.success(),
                "{}",
                crate::support::env::stderr(&out)
            );
            cancelled.push(id);
        }
    }
    let submitted = clock.elapsed();

    s.run_until_settled(40).await;
    let settled = clock.elapsed();
    let store = s.store();
    let traces = store.recent_traces(1000).expect("traces");
    assert_eq!(traces.len(), 200, "200 traces");
    let mut by_end: std::collections::BTreeMap<String, usize> = std::collections::BTreeMap::new();
    for t in &traces {
        let view = store.load_trace(t.trace_id).expect("trace");
        let last = chain(&view).last().cloned().unwrap_or_default();
        *by_end.entry(last).or_default() += 1;
    }
    let root = store.root().to_owned();
    let worktrees = root.join("worktrees");
    let before = (
        du(&root),
        entries(&worktrees),
        store.read_state().expect("state").task_mappings.len(),
        s.containers().len(),
    );

    // Everything ended: with retainDays 0 the next start reclaims all of it.
    merge(
        &mut s.extra_config,
        &json!({"autopilot": {"pipeline": {"retainDays": 0}}}),
    );
    s.run_until_settled(10).await;
    let out = {
        let _sweep = crate::support::docker::ENGINE_SWEEP.lock().await;
        let _across = crate::support::docker::engine_sweep_across_processes(true).await;
        s.env
            .rover(&["autopilot", "gc", "--retain-days", "0", "--json"])
    };
    let plan: serde_json::Value = serde_json::from_str(&stdout(&out)).expect("gc json");
    let state = store.read_state().expect("state");
    let after = (
        du(&root),
        entries(&worktrees),
        state.task_mappings.len(),
        s.containers().len(),
    );
    let state_bytes =
        std::fs::metadata(root.join("autopilot").join("state.json")).map_or(0, |m| m.len());
    eprintln!(
        "soak: 200 traces ({ISSUES} issues with workflows in containers, {CI_RED} red CI, {REVIEWS} change requests, {LOCAL} local, {CANCELLED} cancelled) in {:.1}s (submitted in {:.1}s, settled at {:.1}s); ends {by_end:?}; before gc: store {} KB, {} worktrees, {} mappings, {} containers; after gc: store {} KB ({} B/trace), {} worktrees, {} mappings, {} containers, state.json {} B",
        clock.elapsed().as_secs_f64(),
        submitted.as_secs_f64(),
        settled.as_secs_f64(),
        before.0 / 1024,
        before.1,
        before.2,
        before.3,
        after.0 / 1024,
        after.0 / 200,
        after.1,
        after.2,
        after.3,
        state_bytes
    );
    // Every trace ended: answered, or answered with a failure or cancellation notice.
    assert_eq!(
        by_end.get("notify:completed").copied().unwrap_or(0)
            + by_end.get("cleanup:completed").copied().unwrap_or(0),
        200,
        "{by_end:?}"
    );
    assert_eq!(before.1 as u64, ISSUES, "one worktree per issue's task");
    assert_eq!(before.2 as u64, ISSUES, "one mapping per issue's task");
    assert_eq!(before.3, 0, "containers go once collected");
    assert_eq!(after.1, 0, "no worktree left");
    assert_eq!(after.2, 0, "no task mapping left");
    assert_eq!(after.3, 0, "no container left");
    assert!(
        plan["plan"]["due"].as_array().is_some_and(Vec::is_empty),
        "nothing more to reclaim: {plan}"
    );
    assert!(
        after.0 / 200 < 64 * 1024,
        "under 64 KB of store per ended trace: {}",
        after.0 / 200
    );
    assert!(
        state_bytes < 16 * 1024,
        "state.json holds only live work: {state_bytes} B"
    );
}
