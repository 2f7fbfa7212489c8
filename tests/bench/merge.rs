//! The lifecycle's own share of a merge: from the moment GitHub answers that a pull request's
//! checks are green to the moment rover asks GitHub to merge it. The real daemon
//! (`rover autopilot start`, `lifecycle.mode: "dev"`) takes issues to pull requests in real
//! containers against the stateful fake GitHub of the integration tests, which stamps every
//! request on arrival; per pull request the figure is the merge call's arrival minus the arrival
//! of the last read of its head's checks before it. In between are rover's decision and store
//! writes, the merge action's dispatch, and the merge rules' reads (the pull request, its files,
//! its reviews), each a round trip to a local fake: GitHub's own latency is not in it.

use std::time::Duration;

use axum::http::Method;
use serde_json::json;

use crate::percentiles;
use crate::support::fake_github::BOT;
use crate::support::scenario::{csv_issue, merge, Scenario, NOTIFY};

/// Issues taken to merged pull requests.
const PULLS: u64 = 6;

pub fn run() {
    println!("\n== merge (the real daemon, dev mode, the fake GitHub stamping each request)");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(measure());
}

async fn measure() {
    let mut s = Scenario::new().await;
    s.with_sandbox().await;
    merge(
        &mut s.extra_config,
        &json!({"autopilot": {
            "lifecycle": {"mode": "dev", "maxMergesPerHour": 100, "postMergeCi": false},
            "pipeline": {"followCi": false, "ciPollSecs": 0},
            "github": {"botLogin": BOT}
        }}),
    );
    s.github.ci_on_new_commits(&["success"]);
    s.answer(NOTIFY, json!({"message": "Done."}));
    for n in 0..PULLS {
        csv_issue(&mut s, 30 + n);
    }
    s.run_daemon_until_settled(Duration::from_secs(600), || {})
        .await;

    let requests = s.github.requests();
    let merges = s.github.merges();
    let mut samples = Vec::new();
    let mut between = Vec::new();
    for (number, _, head, _) in &merges {
        let merge_path = format!("/pulls/{number}/merge");
        let Some(call) = requests
            .iter()
            .position(|r| r.method == Method::PUT && r.path.ends_with(&merge_path))
        else {
            continue;
        };
        let checks = format!("/commits/{head}/");
        let Some(green) = requests[..call]
            .iter()
            .rposition(|r| r.method == Method::GET && r.path.contains(&checks) && r.status == 200)
        else {
            continue;
        };
        samples.push(
            requests[call]
                .at
                .duration_since(requests[green].at)
                .as_secs_f64()
                * 1e6,
        );
        between.push(
            requests[green + 1..call]
                .iter()
                .filter(|r| r.path.contains(&format!("/pulls/{number}")))
                .count(),
        );
    }
    assert_eq!(
        samples.len(),
        usize::try_from(PULLS).unwrap(),
        "every pull request merged after a green read of its head: {merges:?}"
    );
    let requests_between = between.iter().sum::<usize>() as f64 / between.len() as f64;
    let (p50, _) = percentiles(samples.clone());
    let max = samples.iter().copied().fold(0.0, f64::max);
    println!(
        "green check read → merge call, {PULLS} pull requests  p50 {:>7.1} ms  max {:>7.1} ms  ({requests_between:.1} requests about the pull request in between, each to a local fake)",
        p50 / 1e3,
        max / 1e3
    );
}
