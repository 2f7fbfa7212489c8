//! The daemon-wide budget of one daemon serving several repositories: the real `rover` binary
//! outside any checkout, a daemon file serving two repositories of the fake GitHub with a daily
//! `stop` limit across both, the real claude as the workflow agent in the real sandbox image
//! behind each repository's proxy, against the fake model API.

use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::fleet::{
    alpha_beta_broken, good_config, open_issue, output, rover, standing, Daemon, Repo,
};
use crate::real_cli::{cli_env, json_flag_answers, real_sandbox_image};
use crate::support::env::{stdout, TestEnv};
use crate::support::fake_anthropic::{FakeAnthropic, Reply};
use crate::support::gitrepo::git;
use crate::support::pipeline::first_span;
use crate::support::scenario::merge;
use rover::store::{AutopilotStore, TraceView};

const ROLE: &str = "Role: rover workflow agent";

/// `rover autopilot start` for the daemon file under `home`, its agents the real claude against
/// `api`, what it prints in `daemon.out` of `env` (read by [`daemon_said`]).
pub(crate) fn real_claude_daemon(
    env: &TestEnv,
    home: &Path,
    api: &FakeAnthropic,
) -> std::process::Command {
    let log = std::fs::File::create(env.path().join("daemon.out")).unwrap();
    let mut cmd = rover(env, home, &["start"], &json!({}));
    cmd.envs(cli_env(api, home))
        .env(
            "ROVER_CLAUDE_BIN",
            crate::proof::escape::real_claude().display().to_string(),
        )
        .stdout(log.try_clone().unwrap())
        .stderr(log);
    cmd
}

/// What the daemon of [`real_claude_daemon`] printed so far.
pub(crate) fn daemon_said(env: &TestEnv) -> String {
    std::fs::read_to_string(env.path().join("daemon.out")).unwrap_or_default()
}

/// Waits up to `secs` for `done`.
pub(crate) fn wait_long(what: &str, secs: u64, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(secs);
    while !done() {
        assert!(Instant::now() < deadline, "waited for {what}");
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// The store of `name` as the daemon recorded it.
pub(crate) fn store_of(env: &TestEnv, home: &Path, name: &str) -> Option<AutopilotStore> {
    let id = standing(env, home)[name]["projectId"].as_str()?.to_owned();
    AutopilotStore::open(&env.path().join("data"), &id).ok()
}

/// Removes what the daemon's sandbox proxy left (the server its repositories share, each
/// repository's relays and run networks) when dropped: the test's daemon is killed, and a
/// killed daemon's proxy outlives it by design until a `gc` finds it dead.
pub(crate) struct Proxies<'a> {
    pub env: &'a TestEnv,
    pub home: &'a Path,
}

impl Drop for Proxies<'_> {
    fn drop(&mut self) {
        let now = standing(self.env, self.home);
        for repo in now.as_object().into_iter().flat_map(|m| m.values()) {
            if let Some(project) = repo["projectId"].as_str() {
                crate::support::docker::remove_proxy(project);
            }
        }
        crate::support::docker::remove_shared_proxy(&self.env.path().join("data"));
    }
}

pub(crate) fn traces(store: &AutopilotStore) -> Vec<TraceView> {
    store
        .recent_traces(100)
        .unwrap_or_default()
        .into_iter()
        .filter_map(|e| store.load_trace(e.trace_id).ok())
        .collect()
}

/// `config` as the repository's `rover.json`, committed and pushed.
pub(crate) fn configure(repo: &Repo, config: &Value) {
    std::fs::write(
        repo.checkout.join("rover.json"),
        serde_json::to_string_pretty(config).unwrap(),
    )
    .unwrap();
    git(&repo.checkout, &["commit", "-qam", "Sandboxed workflows"]);
    git(&repo.checkout, &["push", "-q", "origin", "main"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_daemon_wide_stop_crossed_by_one_repositorys_agent_refuses_its_next_request_and_pauses_every_repository(
) {
    let env = TestEnv::new();
    let (home, alpha, beta, _broken) = alpha_beta_broken(&env).await;
    // The workflow agent's first answer reports 10,000 input tokens: past the daemon's $0.005 a
    // day at any current price, which the host steps before it (a few dozen tokens each) stay
    // under; its second request must not reach the API.
    let answer = json!({"status": "completed", "summary": "Ran the commands.", "files_changed": ["probe.txt"]});
    let tools: Vec<Value> = ["echo one > probe.txt", "echo two >> probe.txt"]
        .iter()
        .map(|c| json!({"name": "Bash", "input": {"command": c, "description": "run it", "timeout": 120_000}}))
        .collect();
    let workflow = json!({"__input_tokens": 10_000, "__tools": tools, "answer": answer});
    let api =
        FakeAnthropic::scripted(vec![Reply::BySystem(json_flag_answers(Some(workflow)))]).await;
    let mut config = good_config();
    merge(
        &mut config,
        &json!({"autopilot": {
            "agent": {"extraEnv": ["CLAUDE_CODE_MAX_RETRIES"]},
            "sandbox": {"image": real_sandbox_image(), "memoryMb": 2048, "cpus": 1.0, "timeoutSecs": 300,
                "envAllow": ["CLAUDE_CODE_MAX_RETRIES", "IS_SANDBOX"]}}}),
    );
    configure(&alpha, &config);
    configure(&beta, &config);
    let list: Vec<Value> = [&alpha, &beta]
        .iter()
        .map(|r| json!({"repo": r.name, "checkout": r.checkout, "apiUrl": r.github.url}))
        .collect();
    std::fs::write(
        home.join(".config/rover/daemon.json"),
        serde_json::to_string_pretty(&json!({
            "repositories": list,
            "daemon": {"budget": {"day": {"usd": 0.005, "action": "stop"}}}
        }))
        .unwrap(),
    )
    .unwrap();
    open_issue(&alpha, 81, "Add a --json flag");

    let mut cmd = real_claude_daemon(&env, &home, &api);
    // Declared before the daemon: dropped after it is killed.
    let _proxies = Proxies {
        env: &env,
        home: &home,
    };
    let _daemon = Daemon(cmd.spawn().expect("start the daemon"));
    let said = || daemon_said(&env);

    // Alpha's workflow crosses the daemon's limit: its next request is refused at the wire.
    let mut alpha_trace = None;
    wait_long("alpha's workflow stopped", 300, || {
        alpha_trace = store_of(&env, &home, "octo-org/alpha")
            .and_then(|s| traces(&s).into_iter().next())
            .filter(|t| {
                t.spans
                    .iter()
                    .any(|s| s.step.as_str() == "workflow" && s.completed.is_some())
            });
        alpha_trace.is_some()
    });
    let trace = alpha_trace.unwrap();
    let workflow = first_span(&trace, "workflow");
    let wire = &workflow.meta["network"];
    assert_eq!(
        wire["stopped"]["limit"],
        "daemon.budget.day.usd",
        "{wire}\n{}",
        said()
    );
    assert!(
        wire["stopped"]["spendUsd"]
            .as_f64()
            .is_some_and(|v| v >= 0.005),
        "{wire}"
    );
    assert_eq!(workflow.meta["budgetStopped"], true, "{:?}", workflow.meta);
    assert!(
        wire["refusals"]
            .to_string()
            .contains("the daemon's daily budget stop limit is reached"),
        "{wire}"
    );
    let from_container = api
        .requests()
        .iter()
        .filter(|r| r.path == "/v1/messages" && r.body["system"].to_string().contains(ROLE))
        .count();
    assert_eq!(
        from_container, 1,
        "the refused request never reached the API: {wire}"
    );

    // New runs are paused in every repository: status says why, and beta's new issue waits.
    wait_long("the daemon paused", 60, || {
        let all: Value = serde_json::from_str(&stdout(&output(rover(
            &env,
            &home,
            &["status", "--json"],
            &json!({}),
        ))))
        .unwrap_or_default();
        all["paused"]
            .as_str()
            .is_some_and(|p| p.contains("the daemon's daily budget is spent"))
    });
    let text = stdout(&output(rover(&env, &home, &["status"], &json!({}))));
    assert!(
        text.contains(
            "paused   new agent runs in every repository: the daemon's daily budget is spent"
        ),
        "{text}"
    );
    open_issue(&beta, 82, "Add a --json flag");
    let beta_store = store_of(&env, &home, "octo-org/beta").expect("beta's store");
    wait_long("beta's new work waits", 60, || {
        beta_store
            .read_waiting()
            .unwrap_or_default()
            .values()
            .any(|why| {
                why.contains("paused in every repository: the daemon's daily budget is spent")
            })
    });
    assert!(
        traces(&beta_store)
            .iter()
            .all(|t| !t.spans.iter().any(|s| s.step.as_str() == "workflow")),
        "nothing ran in beta"
    );
    assert!(
        said().contains("new agent runs are paused in every repository"),
        "{}",
        said()
    );
}

/// `repo`'s store, opened where the daemon keeps it (its project id from its checkout).
fn store_at(env: &TestEnv, repo: &Repo) -> AutopilotStore {
    let project = rover::project::Project::discover(&repo.checkout).expect("a checkout");
    AutopilotStore::open(&env.path().join("data"), &project.id).expect("open the store")
}

/// Why `store`'s queued actions wait.
fn waiting(store: &AutopilotStore) -> Vec<String> {
    store
        .read_waiting()
        .unwrap_or_default()
        .into_values()
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_repositorys_breaker_holds_that_repository_only_and_the_daemons_breaker_holds_them_all() {
    let env = TestEnv::new();
    let (home, alpha, beta, _broken) = alpha_beta_broken(&env).await;
    let script = crate::fleet::script(&["alpha", "beta"]);
    let file = home.join(".config/rover/daemon.json");
    let served = |daemon: Value| {
        let list: Vec<Value> = [&alpha, &beta]
            .iter()
            .map(|r| json!({"repo": r.name, "checkout": r.checkout, "apiUrl": r.github.url}))
            .collect();
        std::fs::write(
            &file,
            serde_json::to_string_pretty(&json!({"repositories": list, "daemon": daemon})).unwrap(),
        )
        .unwrap();
    };
    served(json!({}));
    // Alpha's own breaker is open: three failed traces in a row (the default).
    let alpha_store = store_at(&env, &alpha);
    rover::budget::Ledger::update(&alpha_store, |l| {
        for _ in 0..3 {
            l.trace_ended(uuid::Uuid::new_v4(), true, 3, chrono::Utc::now());
        }
    })
    .unwrap();
    open_issue(&alpha, 1, "Question for alpha");
    open_issue(&beta, 1, "Question for beta");
    let once = || {
        let out = output(rover(&env, &home, &["start", "--once"], &script));
        assert_eq!(out.status.code(), Some(0), "{}", stdout(&out));
        stdout(&out)
    };
    once();
    // Beta goes on; alpha holds its new work, saying why.
    assert_eq!(
        crate::fleet::answers(&beta, 1),
        ["Here is the answer for beta."]
    );
    assert!(crate::fleet::answers(&alpha, 1).is_empty());
    assert!(
        waiting(&alpha_store)
            .iter()
            .any(|w| w.contains("the circuit breaker is open")),
        "{:?}",
        waiting(&alpha_store)
    );

    // The daemon's breaker, at one repository tripped: every repository holds its new work.
    served(json!({"budget": {"circuitBreaker": {"maxTrippedRepositories": 1}}}));
    open_issue(&beta, 2, "Question for beta");
    let said = once();
    assert!(
        said.contains("new agent runs are paused in every repository: the daemon's circuit breaker is open: 1 repositories have their own breaker open (octo-org/alpha"),
        "{said}"
    );
    assert!(crate::fleet::answers(&beta, 2).is_empty());
    let beta_store = store_at(&env, &beta);
    assert!(
        waiting(&beta_store)
            .iter()
            .any(|w| w.contains("paused in every repository: the daemon's circuit breaker is open")),
        "{:?}",
        waiting(&beta_store)
    );

    // Alpha resumed: both go on.
    let resumed = output({
        let mut cmd = rover(&env, &home, &["resume"], &script);
        cmd.current_dir(&alpha.checkout);
        cmd
    });
    assert!(
        stdout(&resumed).contains("circuit breaker closed"),
        "{}",
        stdout(&resumed)
    );
    once();
    assert_eq!(
        crate::fleet::answers(&beta, 2),
        ["Here is the answer for beta."]
    );
    assert_eq!(
        crate::fleet::answers(&alpha, 1),
        ["Here is the answer for alpha."]
    );
}
