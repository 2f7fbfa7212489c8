//! The local world: the real `rover` binary in local mode (`autopilot submit`, `autopilot start
//! --local`, no GitHub) over a project with a bare `origin` and real containers, the fake agent's
//! script for the local request kinds, and whole-store checks. Use it for daemons that run for a
//! while and are killed or raced (the proof suites); use `super::scenario::Scenario` for
//! `--once` runs against the fake GitHub, and `super::pipeline` for the in-process orchestrator.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use rover::store::{AutopilotStore, SpanStatus, TraceOutcome, TraceView};
use serde_json::{json, Value};
use uuid::Uuid;

use super::env::{stderr, stdout, TestEnv};
use super::gitrepo::git;
use super::scenario::{
    coordinate, merge, resolve, sandbox_json, task, COMMIT, NOTIFY, PLAN, SUMMARIZE,
};

/// The coordinator's prompt quotes a local request right after this.
pub const LOCAL_REQUEST: &str = "submitted with `rover autopilot submit`:\n\n";

/// The kinds of local request the script knows: each ends differently.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// coordinate → noop.
    Noop,
    /// coordinate → notify.
    Ask,
    /// coordinate → plan → workflow (container) → commit → resolve → push → notify.
    Change,
}

impl Kind {
    pub fn word(self) -> &'static str {
        match self {
            Kind::Noop => "noop",
            Kind::Ask => "ask",
            Kind::Change => "change",
        }
    }
}

/// A local project: `repo` (with a bare `origin`), the fake agent as `claude` on the host and in
/// the sandbox image, and a `rover.json` that lets the fake's script through.
pub struct LocalWorld {
    pub env: TestEnv,
    /// The `rover.json` written (see `configure`).
    pub config: Value,
    pub origin: PathBuf,
    pub script: Value,
    pub started: chrono::DateTime<chrono::Utc>,
    /// `docker events` streaming into a file, when recording.
    events: Option<Child>,
}

impl LocalWorld {
    pub async fn new(sandbox: bool) -> LocalWorld {
        let env = TestEnv::new();
        let repo = env.repo();
        let origin = env.path().join("origin.git");
        git(
            env.path(),
            &["init", "-q", "--bare", "-b", "main", "origin.git"],
        );
        git(&repo, &["config", "user.name", "Rover Test"]);
        git(&repo, &["config", "user.email", "rover-test@example.com"]);
        git(
            &repo,
            &["remote", "add", "origin", origin.to_str().unwrap()],
        );
        git(&repo, &["push", "-q", "origin", "main"]);
        let mut config = json!({"autopilot": {
            "agent": {"extraEnv": ["ROVER_FAKE_AGENT_SCRIPT", "ROVER_FAKE_AGENT_LOG"]},
            "pipeline": {"fallbackIntervalSecs": 1, "selfReview": false}
        }});
        if sandbox {
            merge(&mut config, &sandbox_json().await);
        }
        std::fs::write(
            repo.join("rover.json"),
            serde_json::to_string_pretty(&config).unwrap(),
        )
        .unwrap();
        std::fs::create_dir_all(env.path().join("agent-log")).unwrap();
        LocalWorld {
            env,
            config,
            origin,
            script: json!({"rules": script_rules()}),
            started: chrono::Utc::now(),
            events: None,
        }
    }

    /// Merges `extra` into `rover.json`.
    pub fn configure(&mut self, extra: &Value) {
        merge(&mut self.config, extra);
        std::fs::write(
            self.env.repo().join("rover.json"),
            serde_json::to_string_pretty(&self.config).unwrap(),
        )
        .unwrap();
    }

    pub fn agent_log(&self) -> PathBuf {
        self.env.path().join("agent-log")
    }

    /// `rover <args>` with the fake agent's script and record dir.
    pub fn command(&self, args: &[&str]) -> Command {
        let mut cmd = self.env.command(args);
        cmd.env("ROVER_FAKE_AGENT_SCRIPT", self.script.to_string())
            .env("ROVER_FAKE_AGENT_LOG", self.agent_log());
        cmd
    }

    /// `rover autopilot submit "<kind> request <n>"`; returns the trace id.
    pub fn submit(&self, kind: Kind, n: usize) -> Uuid {
        let out = self
            .command(&[
                "autopilot",
                "submit",
                &format!("chaos {} request {n}", kind.word()),
            ])
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", stderr(&out));
        let text = stdout(&out);
        text.split_whitespace()
            .nth(2)
            .and_then(|id| id.parse().ok())
            .unwrap_or_else(|| panic!("a trace id in: {text}"))
    }

    /// `rover autopilot start --local` in the background.
    pub fn spawn_daemon(&self) -> Child {
        self.spawn_with_stderr(Stdio::null())
    }

    /// `rover autopilot start --local` in the background, its stderr piped.
    pub fn spawn_daemon_piped(&self) -> Child {
        self.spawn_with_stderr(Stdio::piped())
    }

    fn spawn_with_stderr(&self, stderr: Stdio) -> Child {
        self.command(&["autopilot", "start", "--local"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(stderr)
            .spawn()
            .expect("start rover")
    }

    pub fn store(&self) -> AutopilotStore {
        self.env.store()
    }

    /// Waits (bounded, for not hanging) until every trace ended and the queue is empty.
    pub fn wait_settled(&self, traces: &[Uuid], limit: Duration) {
        let store = self.store();
        let start = Instant::now();
        loop {
            let done = traces.iter().all(|t| {
                matches!(
                    store
                        .load_trace(*t)
                        .map(|v| rover::steps::kinds::trace_outcome(&v)),
                    Ok(TraceOutcome::Finished { .. })
                )
            }) && store.read_state().is_ok_and(|s| s.pending.is_empty());
            if done {
                return;
            }
            if start.elapsed() > limit {
                let summary: Vec<_> = traces
                    .iter()
                    .map(|t| {
                        let v = store.load_trace(*t).unwrap();
                        (
                            super::scenario::chain(&v),
                            rover::steps::kinds::trace_outcome(&v),
                        )
                    })
                    .collect();
                // What the unfinished ones are waiting on: their queue entries and the last
                // error of each, so a failure here says why.
                let stuck: Vec<String> = traces
                    .iter()
                    .filter_map(|t| store.load_trace(*t).ok())
                    .filter(|v| {
                        !matches!(
                            rover::steps::kinds::trace_outcome(v),
                            TraceOutcome::Finished { .. }
                        )
                    })
                    .map(|v| {
                        let last_error = v
                            .spans
                            .iter()
                            .rev()
                            .find(|s| s.status.to_string() == "error")
                            .map(|s| {
                                format!(
                                    "{} {:?} {}",
                                    s.step.as_str(),
                                    s.summary,
                                    serde_json::Value::Object(s.meta.clone())
                                )
                            });
                        format!("pending {:?}; last error: {last_error:?}", v.pending)
                    })
                    .collect();
                panic!("not settled in {limit:?}: {summary:#?}\n{stuck:#?}");
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// Containers of this project that exist now: `(name, rover.action label)`.
    pub fn containers(&self) -> Vec<(String, String)> {
        let out = Command::new("docker")
            .args([
                "ps",
                "-a",
                "--filter",
                &format!("label=rover.project={}", self.env.project_id),
                "--format",
                "{{.Names}} {{.Label \"rover.action\"}}",
            ])
            .output()
            .unwrap();
        stdout(&out)
            .lines()
            .filter_map(|l| l.split_once(' '))
            .map(|(a, b)| (a.to_owned(), b.to_owned()))
            .collect()
    }

    /// Streams the engine's container events of this project into a file from now on (the
    /// engine keeps only its last 256 events, shared with every other test: a query after the
    /// fact can miss some). Stop it with [`LocalWorld::container_events`].
    pub fn record_container_events(&mut self) {
        let file = std::fs::File::create(self.env.path().join("docker-events.log")).unwrap();
        let child = Command::new("docker")
            .args([
                "events",
                "--since",
                &self.started.timestamp().to_string(),
                "--filter",
                "type=container",
                "--filter",
                &format!("label=rover.project={}", self.env.project_id),
                "--format",
                "{{.Action}} {{index .Actor.Attributes \"rover.action\"}}",
            ])
            .stdin(Stdio::null())
            .stdout(file)
            .stderr(Stdio::null())
            .spawn()
            .expect("docker events");
        self.events = Some(child);
    }

    /// Stops the recorder (first call) and counts the recorded container `event`s (`create`,
    /// `start`) per `rover.action` label.
    pub fn container_events(&mut self, event: &str) -> BTreeMap<String, usize> {
        if let Some(mut child) = self.events.take() {
            // Let the engine deliver what it has (slow on a loaded engine: wait until the log
            // has been quiet for half a second, at most 5 s), then stop our own recorder.
            let log = self.env.path().join("docker-events.log");
            let size = || std::fs::metadata(&log).map_or(0, |m| m.len());
            let deadline = std::time::Instant::now() + Duration::from_secs(5);
            let mut last = size();
            loop {
                std::thread::sleep(Duration::from_millis(500));
                let now = size();
                if now == last || std::time::Instant::now() > deadline {
                    break;
                }
                last = now;
            }
            let _ = child.kill();
            let _ = child.wait();
        }
        let text =
            std::fs::read_to_string(self.env.path().join("docker-events.log")).unwrap_or_default();
        let mut counts = BTreeMap::new();
        for line in text.lines() {
            if let Some((action, label)) = line.split_once(' ') {
                if action == event && !label.is_empty() {
                    *counts.entry(label.to_owned()).or_insert(0) += 1;
                }
            }
        }
        counts
    }
}

impl Drop for LocalWorld {
    fn drop(&mut self) {
        if let Some(mut child) = self.events.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        let names: Vec<String> = self.containers().into_iter().map(|(n, _)| n).collect();
        if !names.is_empty() {
            let _ = Command::new("docker")
                .args(["rm", "-f", "-v"])
                .args(&names)
                .output();
        }
    }
}

/// The fake agent's rules for the three request kinds (first match wins).
pub fn script_rules() -> Vec<Value> {
    vec![
        json!({"prompt_contains": format!("{LOCAL_REQUEST}chaos noop"), "structured": coordinate("noop", json!({}))}),
        json!({"prompt_contains": format!("{LOCAL_REQUEST}chaos ask"), "structured": coordinate("notify", json!({"message": "Here is the answer."}))}),
        json!({"prompt_contains": format!("{LOCAL_REQUEST}chaos change"), "structured": coordinate("plan", json!({"directive": "Make the chaos change"}))}),
        json!({"prompt_contains": PLAN, "delay_ms": 400, "structured": {"analysis": "One task.", "clarification": null,
            "tasks": [task("chaos", "Make the chaos change", &[], "swe")]}}),
        json!({"prompt_contains": "## Task: Make the chaos change", "delay_ms": 300, "write": {"chaos.txt": "changed\n"},
            "structured": {"status": "completed", "summary": "made the change", "files_changed": ["chaos.txt"]}}),
        json!({"prompt_contains": COMMIT, "delay_ms": 400, "structured": {"subject": "Make the chaos change", "body": null}}),
        json!({"prompt_contains": "## Error output of failed steps", "delay_ms": 400, "structured": resolve("push", json!({}))}),
        json!({"prompt_contains": NOTIFY, "delay_ms": 400, "structured": {"message": "Done: the change is pushed."}}),
        json!({"prompt_contains": SUMMARIZE, "delay_ms": 400, "structured": {"summary": "Nothing to do."}}),
    ]
}

/// Every `.json` file under `root` parses as JSON and every `.jsonl` line does; returns how many
/// files were checked.
pub fn every_file_parses(root: &Path) -> usize {
    let mut checked = 0;
    let mut stack = vec![root.to_owned()];
    while let Some(dir) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            let ty = entry.file_type().unwrap();
            if ty.is_dir() {
                // Worktrees are git checkouts, not store files.
                if path.file_name().is_some_and(|n| n == "worktrees") {
                    continue;
                }
                stack.push(path);
                continue;
            }
            let ext = path
                .extension()
                .map(|e| e.to_string_lossy().to_ascii_lowercase());
            if ext.as_deref() == Some("json") {
                let bytes = std::fs::read(&path).unwrap();
                serde_json::from_slice::<Value>(&bytes)
                    .unwrap_or_else(|e| panic!("{} does not parse: {e}", path.display()));
                checked += 1;
            } else if ext.as_deref() == Some("jsonl") {
                let text = std::fs::read_to_string(&path).unwrap();
                for (i, line) in text.lines().enumerate() {
                    serde_json::from_str::<Value>(line).unwrap_or_else(|e| {
                        panic!("{} line {} does not parse: {e}", path.display(), i + 1)
                    });
                }
                checked += 1;
            }
        }
    }
    checked
}

/// Per trace: exactly one completed terminal span, nothing running, every action taken and no
/// action with two final (completed or failed) runs; `exactly_once`: every action has exactly one
/// (no step may end in an error but an interrupted one). Returns the number of actions checked.
pub fn assert_trace_sound(view: &TraceView, exactly_once: bool) -> usize {
    let id = view.trace_id();
    let chain = super::scenario::chain(view);
    assert!(
        matches!(
            rover::steps::kinds::trace_outcome(view),
            TraceOutcome::Finished { .. }
        ),
        "trace {id} ended: {chain:?}"
    );
    let terminal = view
        .spans
        .iter()
        .filter(|s| rover::steps::kinds::ends_trace(&s.step) && s.status == SpanStatus::Completed)
        .count();
    assert_eq!(
        terminal, 1,
        "trace {id}: one completed terminal step: {chain:?}"
    );
    assert!(
        view.missing.is_empty(),
        "trace {id}: files missing {:?}",
        view.missing
    );
    assert!(view.pending.is_empty(), "trace {id}: nothing queued");
    for action in &view.actions {
        let runs: Vec<_> = view
            .spans
            .iter()
            .filter(|s| s.action_id == Some(action.id))
            .collect();
        assert!(
            runs.iter().any(|s| s.status.is_final()),
            "trace {id}: action {} ({}) was never taken: {chain:?}",
            action.id,
            action.action
        );
        let outcomes = runs
            .iter()
            .filter(|s| matches!(s.status, SpanStatus::Completed | SpanStatus::Failed))
            .count();
        assert!(
            outcomes <= 1 && (!exactly_once || outcomes == 1),
            "trace {id}: action {} ({}) ran to an outcome {outcomes} times: {chain:?}\nits runs: {:#?}",
            action.id,
            action.action,
            runs.iter()
                .map(|s| (s.status, s.summary.clone(), s.meta.get("error").cloned()))
                .collect::<Vec<_>>()
        );
    }
    view.actions.len()
}
