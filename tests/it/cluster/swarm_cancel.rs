//! `rover autopilot cancel` as a person runs it, while the workflow agent runs as a swarm task on
//! the worker: the daemon stops the task on the worker, closes the run by hand and answers.

use std::time::{Duration, Instant};

use rover::sandbox::Sandbox;
use serde_json::json;

use crate::support::env::stderr;
use crate::support::scenario::{
    chain, closed_by_hand, merge, scenario_image, slow_task_issue, Scenario,
};
use crate::support::swarm::{running_on, swarm, MANAGER, ON_WORKER, WORKER_NODE};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_stops_a_workflow_task_running_on_the_worker_and_closes_the_run_by_hand() {
    let image = scenario_image().await;
    let (_guard, swarm, worker) = swarm(&[ON_WORKER], &[&image]).await;
    let mut s = Scenario::new().await;
    s.with_sandbox().await;
    s.env_vars.push(("ROVER_SWARM_HOST".into(), MANAGER.into()));
    merge(
        &mut s.extra_config,
        &json!({"autopilot": {"sandbox": {"backend": "swarm", "egress": "model-only", "timeoutSecs": 300,
            "swarm": {"constraints": [ON_WORKER]}}}}),
    );
    slow_task_issue(&mut s, 81, 240);
    let mut daemon = s
        .start_command(&[])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("start rover");
    let project = s.env.project_id.clone();

    // The workflow's task runs on the worker.
    let deadline = Instant::now() + Duration::from_secs(120);
    let service = loop {
        let placed = swarm.placements(&project).await.unwrap_or_default();
        if let Some(p) = placed
            .iter()
            .find(|p| p.task_state == "running" && p.node.as_deref() == Some(WORKER_NODE))
        {
            break p.service.clone();
        }
        assert!(
            Instant::now() < deadline,
            "no task ran on the worker: {placed:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!(running_on(&worker, &service).await, 1, "{service}");

    let trace = s.the_trace().index.trace_id;
    let cancelled = Instant::now();
    let out = s.env.rover(&[
        "autopilot",
        "cancel",
        &trace.to_string(),
        "--reason",
        "not needed",
        "--by",
        "alice",
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    // The task is stopped on the worker, then its service goes, and the trace ends.
    let deadline = Instant::now() + Duration::from_secs(90);
    while running_on(&worker, &service).await > 0 {
        assert!(
            Instant::now() < deadline,
            "the task still runs on the worker"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let stopped = cancelled.elapsed();
    loop {
        // The answer went out and nothing of the trace is left to run (the commit action the
        // run's collection hands on is closed with the cancel's reason, not run).
        let view = s.the_trace();
        let ended = view.pending.is_empty() && chain(&view).iter().any(|c| c == "notify:completed");
        let left = swarm
            .list_by_labels(&[("rover.project".to_owned(), project.clone())])
            .await
            .unwrap_or_default();
        if ended && left.is_empty() {
            break;
        }
        if Instant::now() > deadline {
            let shown = s.env.rover(&["autopilot", "trace", &trace.to_string()]);
            panic!(
                "ended: {ended}, left: {left:?}\n{}",
                String::from_utf8_lossy(&shown.stdout)
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    eprintln!("the task on the worker stopped {stopped:?} after `cancel`");
    let _ = daemon.kill();
    let _ = daemon.wait();

    let view = s.the_trace();
    let workflow = closed_by_hand(&view, "cancelled by alice: not needed");
    let summary = workflow.summary.clone().unwrap_or_default();
    assert!(!summary.contains("node lost"), "{summary}");
    // The task was stopped before it sent its workspace back: a note, not a second failure.
    let notes = workflow.meta["notes"].to_string();
    assert!(
        notes.contains("the workspace was not taken back"),
        "{notes}"
    );
    // Nothing but the answer follows the cancelled run: no commit, resolve or push span.
    assert_eq!(
        crate::support::scenario::after_the_workflow(&view),
        ["notify:completed"],
        "{:?}",
        chain(&view)
    );
    assert!(s.github.pulls().is_empty(), "nothing was pushed");
    let log = s.store().artifacts_dir(workflow.id).join("agent.log");
    assert!(log.is_file(), "{}", log.display());
}
