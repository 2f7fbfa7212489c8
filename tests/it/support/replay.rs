//! Replay as a maintainer runs it in CI: `rover autopilot replay --export <folder> --last N`,
//! then `rover autopilot replay --dir <folder> --json`, with GitHub and the model APIs pointed at
//! closed ports, no GitHub token and no agent binary, so that any call out would fail.

use std::path::{Path, PathBuf};
use std::process::Output;

use serde_json::Value;

use super::env::{stderr, stdout};
use super::scenario::Scenario;

/// A local port nothing listens on (bound, then released).
pub fn closed_port_url() -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    drop(listener);
    format!("http://127.0.0.1:{port}")
}

/// `rover autopilot replay <args>` in the scenario's checkout, with no way out.
pub async fn replay_cmd(s: &Scenario, args: &[&str]) -> Output {
    let mut cmd = command(s, args);
    tokio::task::spawn_blocking(move || cmd.output().unwrap())
        .await
        .unwrap()
}

fn command(s: &Scenario, args: &[&str]) -> std::process::Command {
    let mut all = vec!["autopilot", "replay"];
    all.extend_from_slice(args);
    let mut cmd = s.env.command(&all);
    let closed = closed_port_url();
    cmd.current_dir(&s.checkout)
        .env("ROVER_GITHUB_API_URL", &closed)
        .env("ANTHROPIC_BASE_URL", &closed)
        .env("OPENAI_BASE_URL", &closed)
        .env("ROVER_CLAUDE_BIN", s.env.path().join("no-such-agent"))
        .env("ROVER_CODEX_BIN", s.env.path().join("no-such-agent"));
    cmd
}

/// The check every scenario ends with (`Scenario`'s drop): its traces, exported and replayed
/// as CI replays them, decide the same on this build, without a request to GitHub. Blocking
/// (the replay needs none of the test's servers); nothing to check when rover never ran.
pub fn check_scenario_replays(s: &Scenario) {
    if !s
        .env
        .data_dir
        .join("projects")
        .join(&s.env.project_id)
        .is_dir()
    {
        return;
    }
    let started = std::time::Instant::now();
    let folder = s.env.path().join("replay-check");
    let out = command(s, &["--export", folder.to_str().unwrap(), "--last", "1000"])
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "the replay check's export failed:\n{}\n{}",
        stdout(&out),
        stderr(&out)
    );
    if std::fs::read_dir(&folder).map_or(true, |mut d| d.next().is_none()) {
        return;
    }
    let before = s.github.requests().len();
    let out = command(s, &["--dir", folder.to_str().unwrap()])
        .output()
        .unwrap();
    if out.status.code() != Some(0) {
        // The steps that differ, as `--json` has them, for the failure message.
        let json = command(s, &["--dir", folder.to_str().unwrap(), "--json"])
            .output()
            .unwrap();
        let report: Value = serde_json::from_slice(&json.stdout).unwrap_or(Value::Null);
        let differing: Vec<&Value> = report["traces"]
            .as_array()
            .into_iter()
            .flatten()
            .flat_map(|t| t["replay"]["steps"].as_array().into_iter().flatten())
            .filter(|st| !st["differences"].is_null() || st["how"] == "notReplayable")
            .collect();
        panic!(
            "the scenario's traces do not replay the same on this build:\n{}\n{}\n{differing:#?}",
            stdout(&out),
            stderr(&out)
        );
    }
    assert_eq!(
        s.github.requests().len(),
        before,
        "replay made no request to GitHub"
    );
    let elapsed = started.elapsed().as_millis();
    // Not vacuous: a deciding step that finished is replayed, unless it stands in (a command)
    // or never reached its code, and then it says why.
    let json = command(s, &["--dir", folder.to_str().unwrap(), "--json"])
        .output()
        .unwrap();
    let report: Value = serde_json::from_slice(&json.stdout).unwrap();
    for t in report["traces"].as_array().unwrap() {
        for st in t["replay"]["steps"].as_array().unwrap() {
            let deciding =
                ["coordinate", "plan", "resolve"].contains(&st["step"].as_str().unwrap());
            let finished =
                ["completed", "failed"].contains(&st["recorded"]["status"].as_str().unwrap());
            if deciding && finished && st["how"] != "replayed" {
                assert_eq!(st["how"], "skipped", "{st:#}");
                assert!(st["reason"].as_str().unwrap().contains("command"), "{st:#}");
            }
        }
    }
    eprintln!(
        "replay check: {} trace(s) in {elapsed} ms",
        std::fs::read_dir(&folder).map_or(0, Iterator::count),
    );
}

/// Export every trace of the scenario's store into `folder` (made if missing).
pub async fn export_all(s: &Scenario, folder: &Path) {
    let out = replay_cmd(s, &["--export", folder.to_str().unwrap(), "--last", "1000"]).await;
    assert_eq!(
        out.status.code(),
        Some(0),
        "export failed:\n{}\n{}",
        stdout(&out),
        stderr(&out)
    );
}

/// `replay --dir folder --json`: the exit code and the report.
pub async fn replay_dir(s: &Scenario, folder: &Path, extra: &[&str]) -> (i32, Value) {
    let mut args = vec!["--dir", folder.to_str().unwrap(), "--json"];
    args.extend_from_slice(extra);
    let out = replay_cmd(s, &args).await;
    let report: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "replay --json printed no JSON ({e}):\n{}\n{}",
            stdout(&out),
            stderr(&out)
        )
    });
    (out.status.code().unwrap_or(-1), report)
}

/// Every trace of the scenario replays on this build with no divergence and without a single
/// request to the fake GitHub; returns the folder of exports and the report.
pub async fn assert_replays_clean(s: &Scenario) -> (PathBuf, Value) {
    let folder = s.env.path().join("replay-export");
    export_all(s, &folder).await;
    let before = s.github.requests().len();
    let (code, report) = replay_dir(s, &folder, &[]).await;
    assert_eq!(
        s.github.requests().len(),
        before,
        "replay made no request to GitHub"
    );
    assert_eq!(code, 0, "a replay diverged or could not run: {report:#}");
    for t in report["traces"].as_array().unwrap() {
        assert_eq!(t["replay"]["verdict"], "same", "{t:#}");
    }
    (folder, report)
}
