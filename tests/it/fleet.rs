//! One daemon for many repositories: the real `rover` binary started outside any checkout with a
//! daemon file naming three repositories, each with its own fake GitHub (`apiUrl`), checkout,
//! `rover.json` and store. Two are served and answered on their own threads; the third, with a
//! broken `rover.json`, is reported in `status` and tried again, and once fixed it is served
//! without a restart.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::support::env::{rover_bin, stderr, stdout, TestEnv};
use crate::support::fake_github::{FakeGitHub, BOT, TOKEN};
use crate::support::gitrepo::git;
use crate::support::scenario::{COORDINATE, NOTIFY};

mod clone;
pub(crate) mod webhook;

/// One served repository: its fake GitHub and its checkout.
pub(crate) struct Repo {
    pub name: &'static str,
    pub github: FakeGitHub,
    pub checkout: PathBuf,
}

/// The `rover.json` of a served repository, as the scenarios write it.
pub(crate) fn good_config() -> Value {
    json!({
        "autopilot": {
            "agent": {"extraEnv": ["ROVER_FAKE_AGENT_SCRIPT", "ROVER_FAKE_AGENT_LOG"]},
            "github": {"botLogin": BOT, "poll": {"minIntervalSecs": 0, "skipBacklog": false, "reconcileIntervalSecs": 0}},
            "pipeline": {"fallbackIntervalSecs": 1, "followCi": false, "selfReview": false}
        }
    })
}

/// A repository `name` (`owner/name`) with a checkout of its own under `root` and `config` as
/// its `rover.json` (written as is: it may be broken on purpose).
pub(crate) async fn repo(root: &Path, name: &'static str, config: &str) -> Repo {
    let short = name.split('/').nth(1).expect("owner/name");
    let origin = root.join(format!("{short}.git"));
    let checkout = root.join(short);
    git(
        root,
        &[
            "init",
            "-q",
            "--bare",
            "-b",
            "main",
            origin.to_str().unwrap(),
        ],
    );
    git(
        root,
        &[
            "clone",
            "-q",
            origin.to_str().unwrap(),
            checkout.to_str().unwrap(),
        ],
    );
    for (k, v) in [
        ("user.name", "Rover Test"),
        ("user.email", "rover-test@example.com"),
    ] {
        git(&checkout, &["config", k, v]);
    }
    std::fs::write(checkout.join("README.md"), format!("# {short}\n")).unwrap();
    std::fs::write(checkout.join("rover.json"), config).unwrap();
    git(&checkout, &["add", "-A"]);
    git(&checkout, &["commit", "-q", "-m", "Initial commit"]);
    git(&checkout, &["push", "-q", "origin", "main"]);
    let github = FakeGitHub::start_for(name).await;
    github.check_branches_in(&origin);
    github.set_poll_interval(1);
    github.set_permission("alice", "write");
    Repo {
        name,
        github,
        checkout,
    }
}

/// What rover said on thread `number` of `repo`, each answer without its trace footer.
pub(crate) fn answers(repo: &Repo, number: u64) -> Vec<String> {
    repo.github
        .comment_bodies(number)
        .iter()
        .map(|b| b.split("\n\n---\n").next().unwrap_or_default().to_owned())
        .collect()
}

/// An issue `number` titled `title` opened by alice, and its event in the feed.
pub(crate) fn open_issue(repo: &Repo, number: u64, title: &str) {
    repo.github
        .add_issue(number, title, "Please answer.", "alice", &[]);
    repo.github.seed_event(
        "IssuesEvent",
        "alice",
        json!({"action": "opened", "issue": {"number": number, "title": title, "body": "Please answer.", "user": {"login": "alice"}}}),
    );
}

/// The fake agent's script: each repository's question answered in its own words.
pub(crate) fn script(repos: &[&str]) -> Value {
    let mut rules = Vec::new();
    for short in repos {
        rules.push(json!({"prompt_contains": [COORDINATE, format!("Question for {short}")],
            "structured": {"decision": "notify", "confidence": 0.9, "reasoning": "A question.", "directive": null, "task": null,
                "message": format!("The answer for {short}."), "condition": null, "task_id": null}}));
        rules.push(
            json!({"prompt_contains": [NOTIFY, format!("The answer for {short}.")],
            "structured": {"message": format!("Here is the answer for {short}.")}}),
        );
    }
    json!({"rules": rules})
}

/// `rover autopilot <args>` outside any checkout, hermetic, with rover's environment for the
/// fake GitHubs and the fake agent.
pub(crate) fn rover(env: &TestEnv, home: &Path, args: &[&str], script: &Value) -> Command {
    let mut cmd = Command::new(rover_bin());
    cmd.arg("autopilot")
        .args(args)
        .current_dir(home)
        .env("HOME", home)
        .env_remove("XDG_CONFIG_HOME")
        .env("ROVER_DATA_DIR", env.path().join("data"))
        .env("NO_COLOR", "1")
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("ROVER_CLAUDE_BIN", env.path().join("bin").join("claude"))
        .env("GITHUB_TOKEN", TOKEN)
        .env("ROVER_FAKE_AGENT_SCRIPT", script.to_string())
        .env("ROVER_FAKE_AGENT_LOG", env.path().join("agent-log"))
        .env_remove("GH_TOKEN")
        .env_remove("ROVER_GITHUB_API_URL")
        .env_remove("OTEL_EXPORTER_OTLP_ENDPOINT")
        .env_remove("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT");
    cmd
}

pub(crate) fn output(mut cmd: Command) -> Output {
    cmd.output().expect("run rover")
}

/// The daemon file listing `repos` with their checkouts and APIs.
fn daemon_file(path: &Path, repos: &[&Repo]) {
    let list: Vec<Value> = repos
        .iter()
        .map(|r| json!({"repo": r.name, "checkout": r.checkout, "apiUrl": r.github.url}))
        .collect();
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(
        path,
        serde_json::to_string_pretty(&json!({"repositories": list})).unwrap(),
    )
    .unwrap();
}

/// `status --json` of the daemon file at the default place: each repository's line by name.
pub(crate) fn standing(env: &TestEnv, home: &Path) -> Value {
    let out = output(rover(env, home, &["status", "--json"], &json!({})));
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let all: Value = serde_json::from_str(&stdout(&out)).expect("status json");
    let mut by_name = serde_json::Map::new();
    for r in all["repositories"].as_array().expect("repositories") {
        by_name.insert(r["repo"].as_str().unwrap().to_owned(), r.clone());
    }
    by_name.insert("daemon".into(), all["daemon"].clone());
    by_name.insert("lastListing".into(), all["lastListing"].clone());
    Value::Object(by_name)
}

pub(crate) fn wait_for(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(90);
    while !done() {
        assert!(Instant::now() < deadline, "waited for {what}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// The daemon, stopped with SIGTERM when the test ends either way.
pub(crate) struct Daemon(pub Child);

impl Drop for Daemon {
    fn drop(&mut self) {
        if self.0.try_wait().ok().flatten().is_none() {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(i32::try_from(self.0.id()).unwrap()),
                nix::sys::signal::Signal::SIGKILL,
            );
            let _ = self.0.wait();
        }
    }
}

/// Two good repositories and one whose `rover.json` is broken, with the fake agent as `claude`,
/// listed in the daemon file at its default place under the returned home (`start` and
/// `status` outside a checkout find it).
pub(crate) async fn alpha_beta_broken(env: &TestEnv) -> (PathBuf, Repo, Repo, Repo) {
    env.repo();
    let home = env.path().join("home");
    std::fs::create_dir_all(&home).unwrap();
    let good = serde_json::to_string_pretty(&good_config()).unwrap();
    let alpha = repo(env.path(), "octo-org/alpha", &good).await;
    let beta = repo(env.path(), "octo-org/beta", &good).await;
    let broken = repo(
        env.path(),
        "octo-org/broken",
        r#"{"autopilot": {"pipline": {}}}"#,
    )
    .await;
    daemon_file(
        &home.join(".config/rover/daemon.json"),
        &[&alpha, &beta, &broken],
    );
    (home, alpha, beta, broken)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_daemon_serves_each_repository_of_its_file_and_a_broken_one_never_stops_the_others() {
    let env = TestEnv::new();
    let (home, alpha, beta, broken) = alpha_beta_broken(&env).await;
    let script = script(&["alpha", "beta", "broken"]);
    open_issue(&alpha, 1, "Question for alpha");
    open_issue(&beta, 1, "Question for beta");

    // Once, as cron runs it: the two good ones answered, each on its own thread; the broken
    // one reported, and the exit code says a repository failed.
    let once = output(rover(&env, &home, &["start", "--once"], &script));
    assert_eq!(
        once.status.code(),
        Some(78),
        "a broken rover.json is a configuration error:\n{}\n{}",
        stdout(&once),
        stderr(&once)
    );
    assert!(
        stdout(&once).contains("octo-org/broken is not served:"),
        "{}",
        stdout(&once)
    );
    assert_eq!(answers(&alpha, 1), ["Here is the answer for alpha."]);
    assert_eq!(answers(&beta, 1), ["Here is the answer for beta."]);
    let now = standing(&env, &home);
    assert_eq!(now["daemon"]["running"], json!(false));
    for name in ["octo-org/alpha", "octo-org/beta"] {
        assert_eq!(now[name]["state"], "stopped", "{now}");
        assert_eq!(now[name]["pending"], json!(0), "{now}");
    }
    assert_eq!(now["octo-org/broken"]["state"], "failing", "{now}");
    assert_eq!(now["octo-org/broken"]["kind"], "config", "{now}");
    let reason = now["octo-org/broken"]["reason"].as_str().unwrap();
    assert!(reason.contains("pipline"), "names the bad key: {reason}");
    // Each store is its own: the one of alpha's checkout holds alpha's trace only.
    assert_ne!(
        now["octo-org/alpha"]["projectId"],
        now["octo-org/beta"]["projectId"]
    );

    // As a service: new questions on both good ones are answered while the broken one is
    // tried again; fixed, it is served without a restart.
    open_issue(&alpha, 2, "Question for alpha");
    open_issue(&beta, 2, "Question for beta");
    let daemon = Daemon(
        rover(&env, &home, &["start"], &script)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start the daemon"),
    );
    wait_for("both good repositories answered again", || {
        alpha.github.comment_bodies(2).len() == 1 && beta.github.comment_bodies(2).len() == 1
    });
    let now = standing(&env, &home);
    assert_eq!(now["daemon"]["running"], json!(true), "{now}");
    assert_eq!(now["octo-org/alpha"]["state"], "serving", "{now}");
    assert_eq!(now["octo-org/broken"]["state"], "failing", "{now}");
    assert!(now["octo-org/broken"]["retryAt"].is_string(), "{now}");
    let text = stdout(&output(rover(&env, &home, &["status"], &json!({}))));
    let line = text
        .lines()
        .find(|l| l.starts_with("octo-org/broken "))
        .unwrap_or_else(|| panic!("a line for the broken repository:\n{text}"));
    assert!(
        line.contains("failing") && line.contains("pipline") && line.contains("(try "),
        "{text}"
    );
    assert!(text.starts_with("daemon   running (pid "), "{text}");
    // A second daemon for the same file is refused while this one runs.
    let second = output(rover(&env, &home, &["start", "--once"], &script));
    assert_ne!(second.status.code(), Some(0), "{}", stdout(&second));
    assert!(
        stderr(&second).contains("already running") || stderr(&second).contains("pid"),
        "{}",
        stderr(&second)
    );

    let good = serde_json::to_string_pretty(&good_config()).unwrap();
    std::fs::write(broken.checkout.join("rover.json"), &good).unwrap();
    open_issue(&broken, 1, "Question for broken");
    wait_for("the fixed repository served and answered", || {
        answers(&broken, 1) == ["Here is the answer for broken."]
    });
    assert_eq!(standing(&env, &home)["octo-org/broken"]["state"], "serving");
    // Each thread has its one answer: nothing crossed between repositories.
    assert_eq!(answers(&alpha, 2), ["Here is the answer for alpha."]);
    assert_eq!(answers(&beta, 2), ["Here is the answer for beta."]);

    // One SIGTERM stops them all, gracefully.
    let mut daemon = daemon;
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(i32::try_from(daemon.0.id()).unwrap()),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let code = daemon.0.wait().expect("the daemon stops");
    assert_eq!(code.code(), Some(0));
    let now = standing(&env, &home);
    for name in ["octo-org/alpha", "octo-org/beta", "octo-org/broken"] {
        assert_eq!(now[name]["state"], "stopped", "{now}");
    }
}

#[test]
fn a_daemon_file_that_does_not_say_what_it_means_is_refused_at_start_naming_the_line() {
    let env = TestEnv::new();
    let home = env.path().join("home");
    std::fs::create_dir_all(&home).unwrap();
    let file = home.join("fleet.json");
    std::fs::write(
        &file,
        "{\"repositories\": [\n  \"octo-org/a\",\n  \"octo-org/a\"\n]}\n",
    )
    .unwrap();
    let out = output(rover(
        &env,
        &home,
        &["start", "--config", file.to_str().unwrap()],
        &json!({}),
    ));
    assert_eq!(out.status.code(), Some(78), "{}", stderr(&out));
    let said = stderr(&out);
    assert!(
        said.contains(&format!("{}:3:", file.display())) && said.contains("listed twice"),
        "{said}"
    );
    // Outside a checkout with no daemon file: what to do, as a usage error.
    let out = output(rover(&env, &home, &["start", "--once"], &json!({})));
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).contains("daemon file"), "{}", stderr(&out));
}

/// One OpenTelemetry resource for every repository of a daemon file: the spans of both
/// repositories' traces reach the one collector under the same resource (the daemon's), and
/// each span names its repository and project.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_repository_of_a_daemon_file_exports_under_one_resource_and_each_span_names_its_repository(
) {
    let receiver = crate::support::otlp::OtlpReceiver::start().await;
    let env = TestEnv::new();
    let (home, alpha, beta, _broken) = alpha_beta_broken(&env).await;
    let script = script(&["alpha", "beta"]);
    open_issue(&alpha, 1, "Question for alpha");
    open_issue(&beta, 1, "Question for beta");
    let mut once = rover(&env, &home, &["start", "--once"], &script);
    once.env("OTEL_EXPORTER_OTLP_ENDPOINT", &receiver.url);
    let once = output(once);
    assert_eq!(
        answers(&alpha, 1),
        ["Here is the answer for alpha."],
        "{}",
        stderr(&once)
    );
    assert_eq!(answers(&beta, 1), ["Here is the answer for beta."]);

    let spans = receiver.spans();
    let now = standing(&env, &home);
    for name in ["octo-org/alpha", "octo-org/beta"] {
        let of: Vec<_> = spans
            .iter()
            .filter(|s| s.attr("rover.repo") == Some(name))
            .collect();
        let steps: Vec<_> = of.iter().filter_map(|s| s.attr("rover.step")).collect();
        for step in ["event", "coordinate", "notify"] {
            assert!(steps.contains(&step), "{name}'s {step} exported: {steps:?}");
        }
        for s in &of {
            assert_eq!(
                s.attr("rover.project_id"),
                now[name]["projectId"].as_str(),
                "{name}: {s:?}"
            );
        }
    }
    assert!(
        spans.iter().all(|s| s.attr("rover.repo").is_some()),
        "every span names its repository"
    );
    let resources: std::collections::BTreeSet<_> =
        spans.iter().map(|s| s.resource.clone()).collect();
    assert_eq!(resources.len(), 1, "one resource: {resources:#?}");
    let resource = resources.first().unwrap();
    assert_eq!(
        resource.get("service.name").map(String::as_str),
        Some("rover")
    );
    assert!(
        !resource.contains_key("rover.repo") && !resource.contains_key("rover.project_id"),
        "the resource is the daemon's, not one repository's: {resource:?}"
    );
}
