//! End-to-end throughput: traces per minute from event to terminal step through the real daemon
//! (`rover autopilot start --local`), with instant fake agents: the noop path
//! (event → coordinate → noop) and the full workflow path with real containers
//! (event → coordinate → plan → workflow → commit → resolve → review → push → notify).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use rover::store::{AutopilotStore, TraceOutcome};
use serde_json::json;

pub fn run() {
    println!("\n== end to end (the real daemon, instant fake agents)");
    let noop = json!({"rules": [
        {"prompt_contains": "## Event", "structured": {"decision": "noop", "confidence": 1.0, "reasoning": "nothing to do", "directive": null, "task": null, "message": null, "condition": null, "task_id": null}},
        {"prompt_contains": "## Reason recorded", "structured": {"summary": "nothing to do"}}
    ]});
    measure(
        "noop path (3 spans, 2 agent calls)",
        &noop,
        40,
        false,
        "noop",
    );
    let full = json!({"rules": [
        {"prompt_contains": "## Event", "structured": {"decision": "plan", "confidence": 1.0, "reasoning": "work", "directive": "do it", "task": null, "message": null, "condition": null, "task_id": null}},
        {"prompt_contains": "## Directive", "structured": {"analysis": "one task", "clarification": null, "tasks": [{"id": "t", "title": "Write the file", "description": "d", "acceptance_criteria": ["done"], "workflow_type": "swe", "depends_on": []}]}},
        {"prompt_contains": "## Task: Write the file", "write": {"out.txt": "done\n"}, "structured": {"status": "completed", "summary": "wrote it", "files_changed": ["out.txt"]}},
        {"prompt_contains": "## Change summary", "structured": {"subject": "Write the file", "body": null}},
        {"prompt_contains": "## Error output of failed steps", "structured": {"decision": "push", "reasoning": "done", "instructions": null, "retry_step": null, "message": null, "corrective_commands": []}},
        {"prompt_contains": "## Change under review", "structured": {"verdict": "approve", "summary": "done", "findings": []}},
        {"prompt_contains": "## What to communicate", "structured": {"message": "done"}}
    ]});
    measure(
        "full workflow path (9 spans, the self-review's container beside the workflow's)",
        &full,
        10,
        true,
        "notify",
    );
}

fn git(dir: &Path, args: &[&str]) {
    let ok = Command::new("git")
        .args(args)
        .current_dir(dir)
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .status()
        .unwrap();
    assert!(ok.success(), "git {args:?}");
}

fn measure(label: &str, script: &serde_json::Value, traces: usize, sandbox: bool, terminal: &str) {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    git(root, &["init", "-q", "--bare", "-b", "main", "origin.git"]);
    let repo = root.join("repo");
    std::fs::create_dir_all(&repo).unwrap();
    git(&repo, &["init", "-q", "-b", "main"]);
    git(
        &repo,
        &[
            "-c",
            "user.name=b",
            "-c",
            "user.email=b@b",
            "commit",
            "-q",
            "--allow-empty",
            "-m",
            "init",
        ],
    );
    git(
        &repo,
        &[
            "remote",
            "add",
            "origin",
            root.join("origin.git").to_str().unwrap(),
        ],
    );
    git(&repo, &["push", "-q", "origin", "main"]);
    git(&repo, &["config", "user.name", "b"]);
    git(&repo, &["config", "user.email", "b@b"]);
    let bin_dir = root.join("bin");
    std::fs::create_dir_all(&bin_dir).unwrap();
    let fake = PathBuf::from(env!("CARGO_BIN_EXE_rover-fake-agent"));
    std::os::unix::fs::symlink(&fake, bin_dir.join("claude")).unwrap();
    let mut config = json!({"autopilot": {"agent": {"extraEnv": ["ROVER_FAKE_AGENT_SCRIPT"]}, "pipeline": {"fallbackIntervalSecs": 1}}});
    if sandbox {
        let image = build_image(root, &fake);
        config["autopilot"]["sandbox"] = json!({"image": image, "network": "none", "memoryMb": 256, "envAllow": ["ROVER_FAKE_AGENT_SCRIPT"]});
    }
    std::fs::write(repo.join("rover.json"), config.to_string()).unwrap();
    let data = root.join("data");
    let rover = |args: &[&str]| {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_rover"));
        cmd.args(args)
            .arg("--project-id")
            .arg("bench-e2e")
            .current_dir(&repo)
            .env("ROVER_DATA_DIR", &data)
            .env("ROVER_CLAUDE_BIN", bin_dir.join("claude"))
            .env("ROVER_FAKE_AGENT_SCRIPT", script.to_string())
            .env("GIT_CONFIG_GLOBAL", "/dev/null")
            .env("GIT_CONFIG_NOSYSTEM", "1");
        cmd
    };
    for i in 0..traces {
        assert!(rover(&["autopilot", "submit", &format!("request {i}")])
            .stdout(Stdio::null())
            .status()
            .unwrap()
            .success());
    }
    let store = AutopilotStore::open(&data, "bench-e2e").unwrap();
    let start = Instant::now();
    let mut daemon = rover(&["autopilot", "start", "--local"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Duration::from_secs(600);
    loop {
        let done = store
            .recent_traces(traces)
            .unwrap()
            .iter()
            .filter(|e| {
                matches!(
                    store
                        .load_trace(e.trace_id)
                        .map(|v| rover::steps::kinds::trace_outcome(&v)),
                    Ok(TraceOutcome::Finished { .. })
                )
            })
            .count();
        if done == traces {
            break;
        }
        assert!(
            start.elapsed() < deadline,
            "{label}: only {done} of {traces} traces finished"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let elapsed = start.elapsed().as_secs_f64();
    // Every trace took the whole path (a failure also ends a trace, and would flatter the figure).
    for e in store.recent_traces(traces).unwrap() {
        let view = store.load_trace(e.trace_id).unwrap();
        let spans: Vec<String> = view
            .spans
            .iter()
            .map(|s| format!("{}:{}", s.step, s.status))
            .collect();
        assert_eq!(
            rover::steps::kinds::trace_outcome(&view),
            TraceOutcome::Finished {
                step: terminal.parse().unwrap(),
                status: rover::store::SpanStatus::Completed
            },
            "{label}: {spans:?}"
        );
        assert!(
            spans.iter().all(|s| s.ends_with(":completed")),
            "{label}: {spans:?}"
        );
    }
    let _ = daemon.kill();
    let _ = daemon.wait();
    if sandbox {
        let _ = Command::new("sh")
            .arg("-c")
            .arg("docker ps -aq --filter label=rover.project=bench-e2e | xargs -r docker rm -f")
            .output();
    }
    println!(
        "{label:<50} {traces} traces in {elapsed:>5.1}s = {:>6.0} traces/min",
        traces as f64 / elapsed * 60.0
    );
}

/// busybox + the fake agent as `claude`, imported as an image (no registry).
fn build_image(root: &Path, fake: &Path) -> String {
    let script = format!(
        r#"set -e; r={root}/rootfs; mkdir -p $r/bin $r/usr/local/bin $r/tmp $r/workspace
cp "$(command -v busybox)" $r/bin/busybox; ln -sf busybox $r/bin/sh
cp {fake} $r/usr/local/bin/claude
for lib in $(ldd {fake} | grep -o '/[^ ]*'); do mkdir -p $r$(dirname $lib); cp -L $lib $r$lib; done
tag=rover-bench:$(tar -C $r -c . | sha256sum | cut -c1-12)
docker image inspect $tag >/dev/null 2>&1 || tar -C $r -c . | docker import - $tag >/dev/null
echo $tag"#,
        root = root.display(),
        fake = fake.display()
    );
    let out = Command::new("bash").arg("-c").arg(script).output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}
