//! The scenario harness: the real `rover` binary (`autopilot start --once`, as cron runs it)
//! against the fake GitHub, the fake agent scripted per step, a real git remote and, for
//! workflows, a real Docker engine. Use it for end-to-end tests of what a user sees; the step
//! tests drive the in-process orchestrator through `super::pipeline` instead, and the local
//! (`--local`, no GitHub) proof suites use `super::local::LocalWorld`.

use std::path::{Path, PathBuf};
use std::process::Output;

use rover::store::{AutopilotStore, TraceOutcome, TraceView};
use serde_json::{json, Value};

use super::chain::assert_chain;
pub use super::chain::chain;
use super::docker::{fake_agent_image, remove_containers, remove_proxy, sandbox};
use super::env::{stderr, stdout, TestEnv};
use super::fake_github::{FakeGitHub, BOT, REPO, TOKEN};
use super::gitrepo::git;

/// Phrases that tell the steps' prompts apart (their user-part headings).
pub const COORDINATE: &str = "## Event";
pub const PLAN: &str = "## Directive";
pub const NOTIFY: &str = "## What to communicate";
pub const SUMMARIZE: &str = "## Reason recorded";
pub const RESOLVE: &str = "## Error output of failed steps";
pub const COMMIT: &str = "## Change summary";

/// One scenario's world.
pub struct Scenario {
    pub env: TestEnv,
    pub github: FakeGitHub,
    pub checkout: PathBuf,
    pub origin: PathBuf,
    pub rules: Vec<Value>,
    pub extra_config: Value,
    /// Extra environment for the rover process (e.g. a model key).
    pub env_vars: Vec<(String, String)>,
    /// Run as a GitHub App: its id and private key file (no `GITHUB_TOKEN`, no `botLogin`).
    pub app: Option<(u64, PathBuf)>,
    /// Replay the traces at the end (on by default; off only where a test makes its store
    /// unreplayable on purpose, saying why).
    pub replay_check: bool,
}

impl Scenario {
    pub async fn new() -> Scenario {
        let env = TestEnv::new();
        env.repo(); // the fake agent as `claude`
        let root = env.path().to_owned();
        let origin = root.join("origin.git");
        let checkout = root.join("checkout");
        git(&root, &["init", "-q", "--bare", "-b", "main", "origin.git"]);
        git(
            &root,
            &["clone", "-q", origin.to_str().unwrap(), "checkout"],
        );
        git(&checkout, &["config", "user.name", "Rover Test"]);
        git(
            &checkout,
            &["config", "user.email", "rover-test@example.com"],
        );
        std::fs::write(checkout.join("README.md"), "# widgets\n").unwrap();
        git(&checkout, &["add", "-A"]);
        git(&checkout, &["commit", "-q", "-m", "Initial commit"]);
        git(&checkout, &["push", "-q", "origin", "main"]);
        let github = FakeGitHub::start().await;
        github.check_branches_in(&origin);
        github.set_poll_interval(1);
        for login in ["alice", "bob"] {
            github.set_permission(login, "write");
        }
        github.set_permission("mallory", "read");
        Scenario {
            env,
            github,
            checkout,
            origin,
            rules: Vec::new(),
            extra_config: json!({}),
            env_vars: Vec::new(),
            app: None,
            replay_check: true,
        }
    }

    /// Run rover as the GitHub App `app_id` with the private key in `key` (the fake must know
    /// the app: `FakeGitHub::use_app`).
    pub fn as_app(&mut self, app_id: u64, key: PathBuf) {
        self.app = Some((app_id, key));
    }

    /// Serve `origin.git` over HTTP, asking for a token the fake GitHub accepts now, and make
    /// it the checkout's `origin` (so rover fetches and pushes through it).
    pub async fn serve_origin_over_http(&self) -> super::git_http::GitHttp {
        let server = super::git_http::GitHttp::start(
            self.env.path().to_owned(),
            self.github.token_checker(),
        )
        .await;
        git(
            &self.checkout,
            &[
                "remote",
                "set-url",
                "origin",
                &format!("{}/origin.git", server.url),
            ],
        );
        server
    }

    /// What the fake agent answers: a structured answer for the step whose prompt has `phrase`.
    pub fn answer(&mut self, phrase: &str, structured: Value) {
        self.rules
            .push(json!({"prompt_contains": phrase, "structured": structured}));
    }

    fn write_config(&self) {
        let mut config = json!({
            "autopilot": {
                "agent": {"extraEnv": ["ROVER_FAKE_AGENT_SCRIPT", "ROVER_FAKE_AGENT_LOG"]},
                // No reconcile: the scenarios seed feed events without the matching list records
                // (tests/it/intake.rs covers reconcile against a consistent fake).
                "github": {"botLogin": BOT, "poll": {"minIntervalSecs": 0, "skipBacklog": false, "reconcileIntervalSecs": 0}},
                "pipeline": {"fallbackIntervalSecs": 1, "followCi": false, "selfReview": false}
            }
        });
        if let Some((app_id, _)) = &self.app {
            config["autopilot"]["github"]
                .as_object_mut()
                .unwrap()
                .remove("botLogin");
            config["autopilot"]["github"]["appId"] = json!(app_id);
        }
        merge(&mut config, &self.extra_config);
        std::fs::write(
            self.checkout.join("rover.json"),
            serde_json::to_string_pretty(&config).unwrap(),
        )
        .unwrap();
    }

    pub fn agent_log(&self) -> PathBuf {
        self.env.path().join("agent-log")
    }

    /// How many times the fake agent was run (on the host).
    pub fn agent_calls(&self) -> usize {
        std::fs::read_dir(self.agent_log()).map_or(0, |d| {
            d.filter(|e| {
                e.as_ref()
                    .unwrap()
                    .file_name()
                    .to_string_lossy()
                    .ends_with(".json")
            })
            .count()
        })
    }

    /// `rover autopilot start --once` in the checkout, as cron would run it (must exit 0).
    pub async fn run_once(&self) -> Output {
        let out = self.run_once_raw().await;
        assert_eq!(
            out.status.code(),
            Some(0),
            "rover failed:\n{}\n{}",
            stdout(&out),
            stderr(&out)
        );
        out
    }

    /// `rover autopilot start --once`, whatever its exit code.
    pub async fn run_once_raw(&self) -> Output {
        let mut cmd = self.once_command();
        tokio::task::spawn_blocking(move || cmd.output().unwrap())
            .await
            .unwrap()
    }

    /// The `rover autopilot start --once` command (config written), to run or spawn.
    pub fn once_command(&self) -> std::process::Command {
        self.start_command(&["--once"])
    }

    /// `rover autopilot start <args>` in the checkout (config written), to run or spawn.
    pub fn start_command(&self, args: &[&str]) -> std::process::Command {
        self.write_config();
        std::fs::create_dir_all(self.agent_log()).unwrap();
        let mut all = vec!["autopilot", "start"];
        all.extend_from_slice(args);
        all.extend_from_slice(&["--repo", REPO]);
        let mut cmd = self.env.command(&all);
        cmd.current_dir(&self.checkout)
            .env("ROVER_GITHUB_API_URL", &self.github.url)
            .env(
                "ROVER_FAKE_AGENT_SCRIPT",
                json!({"rules": self.rules}).to_string(),
            )
            .env("ROVER_FAKE_AGENT_LOG", self.agent_log())
            .envs(self.env_vars.iter().map(|(k, v)| (k, v)));
        match &self.app {
            Some((_, key)) => cmd.env("ROVER_GITHUB_APP_KEY_FILE", key),
            None => cmd.env("GITHUB_TOKEN", TOKEN),
        };
        cmd
    }

    /// `rover autopilot start` as a daemon, its output thrown away.
    pub fn spawn_quiet(&self) -> std::process::Child {
        self.start_command(&[])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("start rover")
    }

    pub fn store(&self) -> AutopilotStore {
        self.env.store()
    }

    /// A clone of the origin in `<env>/<dir>`, committing as `name` (someone other than rover).
    pub fn clone_as(&self, dir: &str, name: &str, email: &str) -> PathBuf {
        let path = self.env.path().join(dir);
        git(
            self.env.path(),
            &["clone", "-q", self.origin.to_str().unwrap(), dir],
        );
        git(&path, &["config", "user.name", name]);
        git(&path, &["config", "user.email", email]);
        path
    }

    /// Workflows in real containers: the fake agent as `claude` in a locally built image; the
    /// script reaches it through the sandbox's env allow-list.
    pub async fn with_sandbox(&mut self) {
        merge(&mut self.extra_config, &sandbox_json().await);
    }

    /// Run `--once` again and again (as cron does) until every trace has ended, or `max` runs.
    pub async fn run_until_settled(&self, max: usize) {
        for _ in 0..max {
            self.run_once().await;
            if self.settled() {
                return;
            }
            tokio::time::sleep(std::time::Duration::from_millis(300)).await;
        }
        panic!("not settled after {max} runs: {:#?}", self.summary());
    }

    /// Runs `--once` until settled (`max` runs at most) and checks the one trace's chain of
    /// steps (`short`: see `chain::steps`); returns the trace.
    pub async fn settle_as(&self, max: usize, short: &str) -> TraceView {
        self.run_until_settled(max).await;
        let trace = self.the_trace();
        assert_chain(&trace, short);
        trace
    }

    /// Runs `--once` a single time and checks the one trace's chain of steps; returns the
    /// trace.
    pub async fn once_as(&self, short: &str) -> TraceView {
        self.run_once().await;
        let trace = self.the_trace();
        assert_chain(&trace, short);
        trace
    }

    /// Each trace's event, chain of steps and outcome: what a test that did not settle shows.
    fn summary(&self) -> Vec<(String, Vec<String>, TraceOutcome)> {
        self.traces()
            .iter()
            .map(|t| {
                (
                    t.index.event.clone(),
                    chain(t),
                    rover::steps::kinds::trace_outcome(t),
                )
            })
            .collect()
    }

    /// Whether every trace has ended and nothing is queued.
    pub fn settled(&self) -> bool {
        self.traces().iter().all(|t| {
            matches!(
                rover::steps::kinds::trace_outcome(t),
                TraceOutcome::Finished { .. }
            )
        }) && self.store().read_state().unwrap().pending.is_empty()
    }

    /// `rover autopilot start` as a daemon (not `--once`) until every trace has ended, then
    /// SIGTERM. Meanwhile the rover process's peak resident memory (`VmHWM`) is sampled every
    /// 20 ms and `probe` is called about every 250 ms (to look at files while they are written).
    /// Returns that peak in KiB; panics past `limit`.
    pub async fn run_daemon_until_settled(
        &self,
        limit: std::time::Duration,
        mut probe: impl FnMut() + Send,
    ) -> u64 {
        use std::time::{Duration, Instant};
        let log = std::fs::File::create(self.env.path().join("daemon.out")).unwrap();
        let mut child = self
            .start_command(&[])
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("start rover");
        let pid = child.id();
        let start = Instant::now();
        let mut peak = 0;
        let mut looked = Instant::now();
        let mut stopping = false;
        loop {
            peak = peak.max(vm_hwm_kib(pid).unwrap_or(0));
            if let Some(status) = child.try_wait().unwrap() {
                let out =
                    std::fs::read_to_string(self.env.path().join("daemon.out")).unwrap_or_default();
                assert!(stopping, "rover exited by itself ({status}):\n{out}");
                assert!(status.success(), "rover failed ({status}):\n{out}");
                return peak;
            }
            if looked.elapsed() >= Duration::from_millis(250) {
                looked = Instant::now();
                probe();
                // Settled once there is a trace: before the daemon has taken the event, no
                // trace is vacuously "all ended".
                if !stopping && !self.traces().is_empty() && self.settled() {
                    stopping = true;
                    nix::sys::signal::kill(
                        nix::unistd::Pid::from_raw(i32::try_from(pid).unwrap()),
                        nix::sys::signal::Signal::SIGTERM,
                    )
                    .unwrap();
                }
            }
            if start.elapsed() > limit {
                let _ = child.kill();
                let _ = child.wait();
                panic!("not settled within {limit:?}: {:#?}", self.summary());
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Every rover container of this scenario's project, by label.
    pub fn containers(&self) -> Vec<String> {
        let out = std::process::Command::new("docker")
            .args([
                "ps",
                "-aq",
                "--filter",
                &format!("label=rover.project={}", self.env.project_id),
            ])
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(str::to_owned)
            .collect()
    }

    /// Every trace, oldest first.
    pub fn traces(&self) -> Vec<TraceView> {
        let store = self.store();
        let mut all: Vec<TraceView> = store
            .recent_traces(100)
            .unwrap()
            .into_iter()
            .map(|e| store.load_trace(e.trace_id).unwrap())
            .collect();
        all.reverse();
        all
    }

    /// The only trace (asserting there is exactly one).
    pub fn the_trace(&self) -> TraceView {
        let mut all = self.traces();
        assert_eq!(
            all.len(),
            1,
            "exactly one trace: {:?}",
            all.iter()
                .map(|t| t.index.event.clone())
                .collect::<Vec<_>>()
        );
        all.remove(0)
    }
}

impl Drop for Scenario {
    /// Containers a test leaves (a run cut off before collecting): remove this test's; then
    /// replay its traces (`replay_check`).
    fn drop(&mut self) {
        remove_containers(&format!("rover.project={}", self.env.project_id));
        remove_proxy(&self.env.project_id);
        // Every scenario ends with its traces replayed on this build (docs/observability.md).
        if self.replay_check && !std::thread::panicking() {
            super::replay::check_scenario_replays(self);
        }
    }
}

/// The sandbox image with the fake agent as `claude` and as `codex`.
pub async fn scenario_image() -> String {
    fake_agent_image(&sandbox().await).await
}

/// `rover.json` for workflows in real containers: the scenario image, offline, small limits,
/// the fake agent's script let through.
pub async fn sandbox_json() -> Value {
    let image = scenario_image().await;
    json!({"autopilot": {"sandbox": {"image": image, "egress": "none", "memoryMb": 256, "cpus": 1.0,
        "timeoutSecs": 60, "envAllow": ["ROVER_FAKE_AGENT_SCRIPT"]}}})
}

/// The peak resident memory of process `pid` so far (`VmHWM`), in KiB; `None` once it is gone.
pub fn vm_hwm_kib(pid: u32) -> Option<u64> {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()
}

/// `step:status` of every span but the collections of detached runs (`collect` spans, checked
/// where collection is tested), in creation order.
/// The `step:status` of the spans after a trace's first workflow span, without the spans of a
/// person's command (`cancel:`): after a cancelled run, only the answer.
pub fn after_the_workflow(view: &TraceView) -> Vec<String> {
    chain(view)
        .iter()
        .skip_while(|c| !c.starts_with("workflow:"))
        .skip(1)
        .filter(|c| !c.starts_with("cancel:"))
        .cloned()
        .collect()
}

pub fn merge(base: &mut Value, extra: &Value) {
    match (base, extra) {
        (Value::Object(b), Value::Object(e)) => {
            for (k, v) in e {
                merge(b.entry(k.clone()).or_insert(Value::Null), v);
            }
        }
        (b, e) => *b = e.clone(),
    }
}

pub fn head_sha(repo: &Path) -> String {
    git(repo, &["rev-parse", "HEAD"])
}

/// A task spec as the planner returns it.
pub fn task(id: &str, title: &str, depends_on: &[&str], kind: &str) -> Value {
    json!({"id": id, "title": title, "description": format!("{title}, as the issue asks."), "acceptance_criteria": [format!("{title} is done")], "workflow_type": kind, "depends_on": depends_on})
}

pub fn coordinate(decision: &str, extra: Value) -> Value {
    let mut v = json!({"decision": decision, "confidence": 0.9, "reasoning": format!("decided {decision}"), "directive": null, "task": null, "message": null, "condition": null, "task_id": null});
    merge(&mut v, &extra);
    v
}

/// The workflow agent's rule: for the task whose prompt mentions `title`, write `files` and report.
pub fn workflow_rule(title: &str, files: Value, status: &str) -> Value {
    json!({"prompt_contains": format!("## Task: {title}"), "write": files,
           "structured": {"status": status, "summary": format!("{title}: {status}"), "files_changed": []}})
}

pub fn resolve(decision: &str, extra: Value) -> Value {
    let mut v = json!({"decision": decision, "reasoning": format!("decided {decision}"), "instructions": null, "retry_step": null, "message": null, "corrective_commands": []});
    merge(&mut v, &extra);
    v
}

/// Rules common to the code-changing scenarios: the resolver pushes once a commit succeeded.
pub fn push_once_committed(s: &mut Scenario) {
    s.rules.push(json!({"prompt_contains": "[completed] committed", "structured": resolve("push", json!({}))}));
}

pub fn pr_payload(number: u64, head: &str, sha: &str) -> Value {
    json!({"url": format!("https://api.github.com/repos/{REPO}/pulls/{number}"), "id": number, "number": number,
           "head": {"ref": head, "sha": sha, "repo": {"id": 1, "url": "u", "name": "widgets"}},
           "base": {"ref": "main", "sha": sha, "repo": {"id": 1, "url": "u", "name": "widgets"}}})
}

/// An issue that is planned into one task writing `file`, committed and pushed as a PR: the fake
/// agent's script for that path, but for the answer (callers script the notify they test).
pub fn one_task_issue(
    s: &mut Scenario,
    number: u64,
    title: &str,
    body: &str,
    task_title: &str,
    file: &str,
) {
    s.issue_with_one_task(number, (title, body), ("t1", task_title));
    s.task_does(
        task_title,
        json!({file: format!("{task_title}\n")}),
        "completed",
    );
    s.commit_then_push(title);
}

/// A reviewer requests changes on rover PR `number` at `sha`: the script that plans one task
/// (quoting CSV fields) on the existing branch, commits it and pushes once committed.
pub fn changes_requested(s: &mut Scenario, number: u64, branch: &str, sha: &str, review_id: u64) {
    let body = "Please also handle quoting in CSV fields.";
    s.rules.clear();
    s.github
        .add_review(number, "bob", "CHANGES_REQUESTED", body);
    s.github.seed_event("PullRequestReviewEvent", "bob", json!({"action": "created", "pull_request": pr_payload(number, branch, sha),
        "review": {"id": review_id, "body": body, "state": "changes_requested", "commit_id": sha, "html_url": "h"}}));
    s.plan(
        "Handle quoting in CSV fields, as the review asks",
        "Follow the review.",
        vec![task("quote", "Quote CSV fields", &[], "swe")],
    );
    s.task_does(
        "Quote CSV fields",
        json!({"csv.txt": "export --csv with quoting\n"}),
        "completed",
    );
    s.commit_then_push("Quote CSV fields");
}

/// Issue `number`, "Add a --csv flag": one task that writes `csv.txt`, committed and pushed
/// (`one_task_issue`).
pub fn csv_issue(s: &mut Scenario, number: u64) {
    one_task_issue(
        s,
        number,
        "Add a --csv flag",
        "Please add --csv.",
        "Add the csv flag",
        "csv.txt",
    );
}

/// Issue 23, "Port to Windows", sandboxed, with `pipeline.maxRetries` = `max_retries`: its one
/// task fails every time, the resolver answers `iterate` and the answer at the end is
/// `message`.
pub async fn failing_port(max_retries: u32, message: &str) -> Scenario {
    let mut s = Scenario::new().await;
    s.with_sandbox().await;
    merge(
        &mut s.extra_config,
        &json!({"autopilot": {"pipeline": {"maxRetries": max_retries}}}),
    );
    s.issue_with_one_task(
        23,
        ("Port to Windows", "Please."),
        ("port", "Port to Windows"),
    );
    s.rules.push(json!({"prompt_contains": "## Task: Port to Windows", "structured": {"status": "failed", "summary": "cannot build without a Windows toolchain", "files_changed": []}}));
    s.answer_resolve("iterate", json!({"instructions": "Try cross-compiling."}));
    s.answer_notify(message);
    s
}

/// Runs the issue scenario to a rover PR, then returns its number and branch.
pub async fn rover_pr(s: &mut Scenario) -> (u64, String) {
    csv_issue(s, 30);
    s.answer(NOTIFY, json!({"message": "Opened a PR for --csv."}));
    s.run_until_settled(12).await;
    let pulls = s.github.pulls();
    assert_eq!(pulls.len(), 1);
    (pulls[0].0, pulls[0].1.clone())
}

/// Every host-side prompt of a full run, as the agent received it.
pub fn prompts(s: &Scenario) -> Vec<(String, Value)> {
    let mut calls: Vec<(u64, Value)> = std::fs::read_dir(s.agent_log())
        .unwrap()
        .filter_map(|e| {
            let path = e.ok()?.path();
            let name = path.file_name()?.to_string_lossy().into_owned();
            let n = name
                .strip_prefix("call-")?
                .strip_suffix(".json")?
                .parse()
                .ok()?;
            Some((
                n,
                serde_json::from_str(&std::fs::read_to_string(&path).ok()?).ok()?,
            ))
        })
        .collect();
    calls.sort_by_key(|(n, _)| *n);
    calls
        .into_iter()
        .map(|(_, v)| (v["prompt"].as_str().unwrap_or_default().to_owned(), v))
        .collect()
}

/// Issue `number` ("Add a slow feature") planned into one task whose agent runs `sleep <secs>`
/// before it answers: a workflow run that is still running when a test acts on it.
pub fn slow_task_issue(s: &mut Scenario, number: u64, secs: u64) {
    let title = "Add a slow feature";
    s.issue_with_one_task(number, (title, "Please."), ("t1", "Add the slow feature"));
    s.rules.push(
        json!({"prompt_contains": "## Task: Add the slow feature", "run": [format!("sleep {secs}")],
        "structured": {"status": "completed", "summary": "done", "files_changed": []}}),
    );
    s.answer_notify("Stopped.");
}

/// The trace's workflow span, checked to be an `error` closed by hand whose summary says so
/// with `why` (`cancelled by alice: not needed`).
pub fn closed_by_hand<'a>(view: &'a TraceView, why: &str) -> &'a rover::store::Span {
    let workflow = super::pipeline::first_span(view, "workflow");
    assert_eq!(
        workflow.status,
        rover::store::SpanStatus::Error,
        "{:?}",
        workflow.summary
    );
    assert_eq!(
        workflow.meta["closedByHand"],
        json!(true),
        "{:?}",
        workflow.meta
    );
    let summary = workflow.summary.clone().unwrap_or_default();
    assert!(
        summary.contains("stopped by hand") && summary.contains(why),
        "{summary}"
    );
    workflow
}
