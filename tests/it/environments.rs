//! Per-repository environments through the real binary: the image is built from what the
//! default branch declares (a dev container, `.rover/setup.sh`, or nothing), cached by a hash of
//! what defines it, used by the agent and the gates, and a failed build ends the trace with the
//! build's error and the command that reproduces it, before any agent runs.

use std::path::{Path, PathBuf};

use rover::store::{Span, TraceView};
use serde_json::{json, Value};

use crate::support::fake_anthropic::{FakeAnthropic, Reply};
use crate::support::gitrepo::git;
use crate::support::pipeline::first_span;
use crate::support::scenario::{merge, one_task_issue, Scenario, NOTIFY};

/// The dev container CLI (pinned), installed by `tests/setup-clis.sh devcontainer`.
pub fn devcontainer_cli() -> PathBuf {
    if let Some(path) = std::env::var_os("ROVER_TEST_DEVCONTAINER_BIN").filter(|p| !p.is_empty()) {
        return path.into();
    }
    let home = std::env::var_os("HOME").map_or_else(|| "/root".into(), PathBuf::from);
    let cached =
        home.join(".cache/rover-test-clis/devcontainer-0.89.0/node_modules/.bin/devcontainer");
    assert!(
        cached.exists(),
        "the dev container CLI is missing: run `bash tests/setup-clis.sh devcontainer` (tests/run.sh does it)"
    );
    cached
}

/// The Debian base `tests/setup-sandbox-image.sh` made (debootstrap + `docker import`), which
/// test repositories' Dockerfiles start from: no registry is reachable.
pub fn debian_base() -> String {
    use sha2::Digest;
    let digest = sha2::Sha256::digest(b"bookworm minbase git,ca-certificates\n");
    let hex = digest.iter().fold(String::new(), |mut hex, b| {
        use std::fmt::Write as _;
        let _ = write!(hex, "{b:02x}");
        hex
    });
    format!("local/bookworm-minbase:{}", &hex[..12])
}

/// Commits `files` on the default branch of the scenario's origin (through its checkout).
pub fn commit_on_main(s: &Scenario, files: &[(&str, &[u8])], message: &str) {
    for (path, bytes) in files {
        let path = s.checkout.join(path);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, bytes).unwrap();
    }
    git(&s.checkout, &["add", "-A"]);
    git(&s.checkout, &["commit", "-q", "-m", message]);
    git(&s.checkout, &["push", "-q", "origin", "main"]);
}

/// The environment record of the trace's workflow span.
pub fn environment(trace: &TraceView) -> Value {
    workflow_span(trace).meta["environment"].clone()
}

pub fn workflow_span(trace: &TraceView) -> &Span {
    first_span(trace, "workflow")
}

/// Removes the environment images a test's project built, when the test ends (each scenario is
/// a project of its own, and its images are of no use to another run).
struct DropImages(String);

impl Drop for DropImages {
    fn drop(&mut self) {
        crate::support::docker::remove_containers(&format!("rover.project={}", self.0));
        if let Ok(images) = rover::environment::gc::list(&self.0) {
            for image in images {
                let _ = rover::environment::gc::remove(&image.image);
            }
        }
    }
}

fn drop_images(s: &Scenario) -> DropImages {
    DropImages(s.env.project_id.clone())
}

fn with_cli(s: &mut Scenario, extra: Value) {
    let cli = devcontainer_cli();
    merge(
        &mut s.extra_config,
        &json!({"autopilot": {"sandbox": {"environment": {"devcontainerCli": cli}}}}),
    );
    merge(&mut s.extra_config, &extra);
}

fn image_exists(image: &str) -> bool {
    std::process::Command::new("docker")
        .args(["image", "inspect", image])
        .output()
        .is_ok_and(|o| o.status.success())
}

/// `.rover/setup.sh` and no dev container: the script runs over `autopilot.sandbox.image`
/// (network allowed) and what it installed is there for the gates, run offline.
#[tokio::test]
async fn a_setup_script_builds_the_image_the_agent_and_gates_run_in() {
    let mut s = Scenario::new().await;
    let _images = drop_images(&s);
    s.with_sandbox().await;
    commit_on_main(
        &s,
        &[(
            ".rover/setup.sh",
            b"set -e\nmkdir -p /opt/env\necho ready > /opt/env/marker\n",
        )],
        "Add a setup script",
    );
    with_cli(
        &mut s,
        json!({"autopilot": {"sandbox": {"gates": [{"command": ["grep", "-q", "ready", "/opt/env/marker"]}]}}}),
    );
    one_task_issue(
        &mut s,
        61,
        "Add a note",
        "Please add a note.",
        "Write the note",
        "note.txt",
    );
    s.answer(NOTIFY, json!({"message": "Opened a PR with the note."}));
    // The console says how the build goes while it runs.
    let first = s.run_once().await;
    let console = String::from_utf8_lossy(&first.stdout);
    assert!(
        console.contains("environment build: building rover-env:")
            && console.contains("environment build: built rover-env:"),
        "{console}"
    );
    s.run_until_settled(12).await;
    let trace = s.the_trace();
    let env = environment(&trace);
    assert_eq!(env["source"], "setupScript", "{env:#}");
    assert_eq!(env["built"], true, "{env:#}");
    assert!(env["inputs"]
        .as_array()
        .unwrap()
        .contains(&json!(".rover/setup.sh")));
    let image = env["image"].as_str().unwrap();
    assert!(image.starts_with("rover-env:"), "{image}");
    assert!(image_exists(image));
    let log = std::fs::read_to_string(env["log"].as_str().unwrap()).unwrap();
    assert!(log.contains("rover: built rover-env:"), "{log}");
    let tree = crate::support::env::stdout(&s.env.rover(&[
        "autopilot",
        "trace",
        &trace.trace_id().to_string(),
    ]));
    assert!(
        tree.contains(&format!("environment: {image} (setupScript), built in ")),
        "{tree}"
    );
    let workflow = workflow_span(&trace);
    assert_eq!(
        workflow.status.to_string(),
        "completed",
        "{:#?}",
        workflow.meta
    );
    assert_eq!(
        workflow.meta["image"].as_str(),
        Some(image),
        "the agent ran in it"
    );
    assert_eq!(s.github.pulls().len(), 1, "the change shipped");
    // `gc` keeps the newest environment image of the project.
    let out = s
        .env
        .command(&["autopilot", "gc", "--dry-run", "--json"])
        .current_dir(&s.checkout)
        .output()
        .unwrap();
    let gc: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stderr)));
    assert_eq!(gc["environmentImages"]["kept"], json!([image]), "{gc:#}");
    assert_eq!(gc["environmentImages"]["removed"], json!([]), "{gc:#}");
}

/// No dev container and no setup: `autopilot.sandbox.image` as it is, nothing built.
#[tokio::test]
async fn a_repository_that_declares_nothing_runs_in_the_configured_image() {
    let mut s = Scenario::new().await;
    let _images = drop_images(&s);
    s.with_sandbox().await;
    with_cli(&mut s, json!({}));
    one_task_issue(
        &mut s,
        62,
        "Add a note",
        "Please add a note.",
        "Write the note",
        "note.txt",
    );
    s.answer(NOTIFY, json!({"message": "Opened a PR with the note."}));
    s.run_until_settled(12).await;
    let trace = s.the_trace();
    let env = environment(&trace);
    let configured = s.extra_config["autopilot"]["sandbox"]["image"].clone();
    assert_eq!(env["source"], "image", "{env:#}");
    assert_eq!(env["built"], false);
    assert_eq!(env["image"], configured);
    assert!(env.get("hash").is_none());
    assert_eq!(s.github.pulls().len(), 1);
}

/// A dev container whose setup fails: the workflow fails with the build's error and the
/// command that reproduces it, the resolver ends the trace without an agent, and no workflow
/// agent ever ran.
#[tokio::test]
async fn a_failed_build_ends_the_trace_with_its_error_and_the_reproduce_command() {
    let mut s = Scenario::new().await;
    let _images = drop_images(&s);
    s.with_sandbox().await;
    let image = s.extra_config["autopilot"]["sandbox"]["image"]
        .as_str()
        .unwrap()
        .to_owned();
    let config =
        json!({"image": image, "postCreateCommand": "echo the setup breaks here >&2; exit 3"});
    commit_on_main(
        &s,
        &[(
            ".devcontainer/devcontainer.json",
            config.to_string().as_bytes(),
        )],
        "Add a dev container",
    );
    with_cli(&mut s, json!({}));
    one_task_issue(
        &mut s,
        63,
        "Add a note",
        "Please add a note.",
        "Write the note",
        "note.txt",
    );
    s.answer(NOTIFY, json!({"message": "The environment did not build."}));
    s.run_until_settled(12).await;
    let trace = s.the_trace();
    let workflow = workflow_span(&trace);
    assert_eq!(workflow.status.to_string(), "failed");
    let env = &workflow.meta["environment"];
    let error = env["error"].as_str().unwrap();
    assert!(error.contains("postCreateCommand"), "{error}");
    assert!(error.contains("the setup breaks here"), "{error}");
    let reproduce = env["reproduce"].as_str().unwrap();
    assert!(reproduce.contains(" up --workspace-folder "), "{reproduce}");
    assert!(
        workflow.meta.get("containerId").is_none(),
        "no agent container"
    );
    let resolve = first_span(&trace, "resolve");
    assert_eq!(resolve.meta["quickExit"], "environmentBuild");
    let summary = trace
        .spans
        .last()
        .unwrap()
        .summary
        .clone()
        .unwrap_or_default();
    assert!(
        trace.spans.iter().any(|sp| sp
            .summary
            .as_deref()
            .unwrap_or_default()
            .contains("to run it again")),
        "the trace says how to reproduce it; last: {summary}"
    );
    let agent_log = std::fs::read_dir(s.agent_log()).map_or(0, Iterator::count);
    let workflow_calls = crate::support::scenario::prompts(&s)
        .iter()
        .filter(|(p, _)| p.contains("## Task: "))
        .count();
    assert_eq!(
        workflow_calls, 0,
        "no workflow agent ran ({agent_log} agent log entries)"
    );
    assert!(s.github.pulls().is_empty());
}

/// Removes a test's own image when the test ends.
struct RemoveImage(String);

impl Drop for RemoveImage {
    fn drop(&mut self) {
        let _ = std::process::Command::new("docker")
            .args(["image", "rm", "-f", &self.0])
            .output();
    }
}

/// The `devcontainer.local_folder` label of every container created between `since` and now
/// (unix seconds): the dev container CLI labels each container it starts with its workspace.
fn cli_containers_since(since: u64) -> Vec<String> {
    let until = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
        + 1;
    let out = std::process::Command::new("docker")
        .args([
            "events",
            "--since",
            &since.to_string(),
            "--until",
            &until.to_string(),
            "--filter",
            "type=container",
            "--filter",
            "event=create",
            "--format",
            "{{index .Actor.Attributes \"devcontainer.local_folder\"}}",
        ])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| !l.trim().is_empty() && *l != "<no value>")
        .map(str::to_owned)
        .collect()
}

/// A definition merged to the default branch that asks for the engine's host: a `docker run`
/// flag (`runArgs: ["--privileged"]`), the host's home as the build context
/// (`"context": "${localEnv:HOME}"`), an image whose `devcontainer.metadata` label asks for a
/// privileged container. Each is refused with the key's name in the workflow span and the
/// trace, before any container starts (the first two before anything is exported or logged;
/// the third by the CLI's `read-configuration`, never `up`), and no agent runs.
#[tokio::test]
async fn a_definition_that_asks_for_the_host_is_refused_before_any_container_starts() {
    let mut s = Scenario::new().await;
    let _images = drop_images(&s);
    s.with_sandbox().await;
    let image = s.extra_config["autopilot"]["sandbox"]["image"]
        .as_str()
        .unwrap()
        .to_owned();
    with_cli(&mut s, json!({}));
    s.answer(NOTIFY, json!({"message": "The environment was refused."}));
    // An image (from the sandbox image, nothing pulled) whose metadata asks for the host.
    let asking = format!("rover-test-asks-for-host:{}", s.env.project_id);
    let _asking = RemoveImage(asking.clone());
    let mut build = std::process::Command::new("docker")
        .args(["build", "-q", "-t", &asking, "--label"])
        .arg(r#"devcontainer.metadata=[{"privileged": true, "mounts": ["type=bind,source=/,target=/host"]}]"#)
        .arg("-")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    {
        use std::io::Write as _;
        let mut stdin = build.stdin.take().unwrap();
        writeln!(stdin, "FROM {image}").unwrap();
    }
    assert!(build.wait().unwrap().success(), "docker build {asking}");

    let cases = [
        (
            71,
            vec![(
                ".devcontainer/devcontainer.json",
                json!({"image": image, "runArgs": ["--privileged"]}).to_string(),
            )],
            "`runArgs` is not allowed: it reaches the engine's host configuration of the setup container",
        ),
        (
            72,
            vec![
                (
                    ".devcontainer/devcontainer.json",
                    json!({"build": {"context": "${localEnv:HOME}", "dockerfile": "Dockerfile"}})
                        .to_string(),
                ),
                (".devcontainer/Dockerfile", format!("FROM {image}\n")),
            ],
            "`build.context` reads `${localEnv:HOME}`, a variable of rover's environment definitions may not read; to let them, add `HOME` to `autopilot.sandbox.environment.localEnv`",
        ),
        (
            73,
            vec![(
                ".devcontainer/devcontainer.json",
                json!({"image": asking, "postCreateCommand": "touch /host/tmp/rover-escaped"})
                    .to_string(),
            )],
            "`privileged`, `mounts` is not allowed: it reaches the engine's host configuration of the setup container",
        ),
    ];
    for (number, files, refusal) in cases {
        let files: Vec<(&str, &[u8])> = files.iter().map(|(p, t)| (*p, t.as_bytes())).collect();
        commit_on_main(&s, &files, &format!("A definition for #{number}"));
        let since = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs();
        let before: Vec<_> = s.traces().iter().map(|t| t.index.trace_id).collect();
        one_task_issue(
            &mut s,
            number,
            "Add a note",
            "Please add a note.",
            "Write the note",
            "note.txt",
        );
        s.run_until_settled(12).await;
        let trace = s
            .traces()
            .into_iter()
            .find(|t| !before.contains(&t.index.trace_id))
            .unwrap_or_else(|| panic!("no trace for #{number}"));
        let workflow = workflow_span(&trace);
        assert_eq!(workflow.status.to_string(), "failed", "#{number}");
        let error = workflow.meta["environment"]["error"]
            .as_str()
            .unwrap_or_default();
        assert!(
            error.starts_with(
                ".devcontainer/devcontainer.json on the default branch cannot be used: "
            ) && error.contains(refusal),
            "#{number}: {error}"
        );
        assert!(
            workflow.meta.get("containerId").is_none(),
            "no agent container"
        );
        let tree = crate::support::env::stdout(&s.env.rover(&[
            "autopilot",
            "trace",
            &trace.trace_id().to_string(),
        ]));
        // The tree cuts long lines; the key's name comes first.
        let named = &refusal[..refusal
            .find(" is not allowed")
            .or(refusal.find(" reads "))
            .unwrap()];
        assert!(
            tree.contains(&format!("cannot be used: {named}")),
            "#{number}: the trace shows {named}: {tree}"
        );
        // No container of the dev container CLI was created for this build.
        let started: Vec<String> = cli_containers_since(since)
            .into_iter()
            .filter(|folder| folder.starts_with(&s.env.data_dir.display().to_string()))
            .collect();
        assert_eq!(started, Vec::<String>::new(), "#{number}");
        let dir = s.store().artifacts_dir(workflow.id).join("environment");
        let log = dir.join("environment.log");
        if number == 73 {
            // Refused by what the CLI reads of the image, before `devcontainer up`.
            let log = std::fs::read_to_string(&log).unwrap();
            assert!(log.contains(" read-configuration "), "{log}");
            assert!(log.contains("rover: refused: "), "{log}");
            assert!(!log.contains(" up --workspace-folder"), "{log}");
        } else {
            // Refused while reading the definition: nothing was exported or run.
            assert!(
                !log.exists() && !dir.join("workspace").exists(),
                "#{number}"
            );
        }
    }
    assert!(!Path::new("/tmp/rover-escaped").exists());
    let workflow_calls = crate::support::scenario::prompts(&s)
        .iter()
        .filter(|(p, _)| p.contains("## Task: "))
        .count();
    assert_eq!(workflow_calls, 0, "no workflow agent ran");
    assert!(s.github.pulls().is_empty());
}

/// The dev container CLI mounts the git repository around its workspace folder, found with
/// `git rev-parse` there: a default branch that commits `HEAD`, `objects/`, `refs/` and a
/// `config` naming `core.worktree` (a bare repository, to git) made that any directory of the
/// host. The setup container mounts rover's export and nothing else.
#[tokio::test]
async fn a_committed_bare_repository_does_not_choose_the_setups_workspace_mount() {
    let mut s = Scenario::new().await;
    let _images = drop_images(&s);
    s.with_sandbox().await;
    let image = s.extra_config["autopilot"]["sandbox"]["image"]
        .as_str()
        .unwrap()
        .to_owned();
    let host = s.env.path().join("host-dir");
    std::fs::create_dir_all(&host).unwrap();
    std::fs::write(host.join("host-marker"), "a file of the host\n").unwrap();
    let config = json!({"image": image,
        "postCreateCommand": "ls -a /workspaces/*; echo listed; exit 3"});
    let git_config = format!(
        "[core]\n\trepositoryformatversion = 0\n\tbare = false\n\tworktree = {}\n",
        host.display()
    );
    commit_on_main(
        &s,
        &[
            (
                ".devcontainer/devcontainer.json",
                config.to_string().as_bytes(),
            ),
            ("HEAD", b"ref: refs/heads/main\n"),
            ("objects/keep", b""),
            ("refs/keep", b""),
            ("config", git_config.as_bytes()),
        ],
        "A dev container beside a bare repository's files",
    );
    with_cli(&mut s, json!({}));
    s.answer(NOTIFY, json!({"message": "The environment did not build."}));
    one_task_issue(
        &mut s,
        64,
        "Add a note",
        "Please add a note.",
        "Write the note",
        "note.txt",
    );
    s.run_until_settled(12).await;
    let trace = s.the_trace();
    let workflow = workflow_span(&trace);
    let env = &workflow.meta["environment"];
    let error = env["error"].as_str().unwrap();
    assert!(error.contains("postCreateCommand"), "{error}");
    let log = std::fs::read_to_string(env["log"].as_str().unwrap()).unwrap();
    assert!(log.contains("listed"), "the setup ran: {log}");
    let export = s
        .store()
        .artifacts_dir(workflow.id)
        .join("environment/workspace");
    let run = log
        .lines()
        .find(|l| l.contains("docker run "))
        .unwrap_or_else(|| panic!("no docker run in {log}"));
    assert!(
        run.contains(&format!(
            "--mount type=bind,source={},target=/workspaces/workspace ",
            export.display()
        )),
        "{run}"
    );
    assert!(!run.contains(&host.display().to_string()), "{run}");
    assert!(!log.contains("host-marker"), "{log}");
}

/// The Debian base exists (tests/setup-sandbox-image.sh made it).
pub fn require_debian_base() -> String {
    let base = debian_base();
    assert!(
        image_exists(&base),
        "{base} is missing: run `bash tests/setup-sandbox-image.sh` (tests/run.sh does it)"
    );
    base
}

/// The host's CA bundle, for a test Dockerfile whose build reaches PyPI or crates.io through
/// this machine's TLS-inspecting proxy.
pub fn host_ca() -> Vec<u8> {
    std::fs::read(Path::new("/etc/ssl/certs/ca-certificates.crt")).unwrap()
}

/// The agent ran with the default egress: its own network, the model API through rover's
/// proxy (which saw its requests) and nothing else; the gates ran with no network at all.
fn assert_closed_network(workflow: &rover::store::Span) {
    assert_eq!(workflow.meta["egress"], "model-only", "{:?}", workflow.meta);
    assert!(
        workflow.meta["network"]["requests"].as_u64().unwrap_or(0) >= 2,
        "{:?}",
        workflow.meta["network"]
    );
}

/// A scenario whose model is the fake Anthropic API and whose agent is the real claude, on the
/// host and in the sandbox (on its closed network: it reaches the fake API through rover's
/// proxy); the workflow agent runs `tools` (e.g. the project's tests) and then writes NOTES.md.
async fn real_claude_scenario(tools: Vec<Value>, gate: &[&str]) -> (Scenario, FakeAnthropic) {
    use crate::real_cli::{cli_env, json_flag_answers, real_sandbox_image};
    let mut tools = tools;
    tools.push(json!({"name": "Write", "input": {"file_path": "/workspace/NOTES.md", "content": "The tests pass in the repository's own image.\n"}}));
    let workflow = json!({"__tools": tools,
        "answer": {"status": "completed", "summary": "Ran the tests; added NOTES.md.", "files_changed": ["NOTES.md"]}});
    let api =
        FakeAnthropic::scripted(vec![Reply::BySystem(json_flag_answers(Some(workflow)))]).await;
    let mut s = Scenario::new().await;
    let home = s.env.path().join("home");
    std::fs::create_dir_all(&home).unwrap();
    let names = [
        "CLAUDE_CODE_MAX_RETRIES",
        "DISABLE_AUTOUPDATER",
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC",
        "IS_SANDBOX",
    ];
    merge(
        &mut s.extra_config,
        &json!({"autopilot": {
            "agent": {"extraEnv": ["CLAUDE_CODE_MAX_RETRIES", "DISABLE_AUTOUPDATER", "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC"]},
            "sandbox": {"image": real_sandbox_image(), "egress": "model-only", "memoryMb": 2048, "cpus": 1.0, "timeoutSecs": 300,
                "envAllow": names, "gates": [{"command": gate, "timeoutSecs": 300}]}}}),
    );
    with_cli(&mut s, json!({}));
    s.env_vars.extend(cli_env(&api, &home));
    s.env_vars.push((
        "ROVER_CLAUDE_BIN".into(),
        crate::proof::escape::real_claude().display().to_string(),
    ));
    (s, api)
}

/// Opens issue `number` and runs rover until its trace ends; returns that trace.
async fn issue_ships(s: &Scenario, number: u64) -> TraceView {
    let title = format!("Add notes {number}");
    let before: Vec<_> = s.traces().iter().map(|t| t.index.trace_id).collect();
    s.github
        .add_issue(number, &title, "Please add notes.", "alice", &[]);
    s.github.seed_event("IssuesEvent", "alice", json!({"action": "opened", "issue": {"number": number, "title": title, "body": "Please add notes.", "user": {"login": "alice"}}}));
    s.run_until_settled(20).await;
    let trace = s
        .traces()
        .into_iter()
        .find(|t| !before.contains(&t.index.trace_id))
        .unwrap_or_else(|| panic!("no trace for issue #{number}"));
    assert_eq!(
        crate::support::scenario::chain(&trace),
        [
            "event:completed",
            "coordinate:completed",
            "plan:completed",
            "workflow:completed",
            "commit:completed",
            "resolve:completed",
            "push:completed",
            "notify:completed",
        ],
        "issue #{number}: {:#?}",
        workflow_span(&trace).meta
    );
    trace
}

/// The first trace's agent ran the project's tests in its built image (what they `printed`
/// reached the model), the gate passed, the network was closed, and `cmd` passes in that image
/// offline, as rover's sandboxes run.
fn assert_tests_ran_in_image(
    s: &Scenario,
    api: &FakeAnthropic,
    first: &TraceView,
    printed: &str,
    cmd: &[&str],
) {
    let image = environment(first)["image"].as_str().unwrap().to_owned();
    assert!(
        model_saw(api, printed),
        "the agent ran the project's tests in the image"
    );
    let gates = &workflow_span(first).meta["gates"]["results"][0];
    assert_eq!(gates["outcome"], "passed", "{gates:#}");
    assert_closed_network(workflow_span(first));
    let offline = run_offline(s, &image, cmd);
    assert!(
        offline.status.success(),
        "offline ({}): {}{}",
        offline.status,
        String::from_utf8_lossy(&offline.stdout),
        String::from_utf8_lossy(&offline.stderr)
    );
}

/// Issue `number` ships with the environment's `image` found cached: nothing was built.
async fn assert_cached(s: &Scenario, number: u64, image: &str) {
    let second = issue_ships(s, number).await;
    let cached = environment(&second);
    assert_eq!(cached["built"], false, "{cached:#}");
    assert_eq!(cached["image"].as_str(), Some(image));
    assert!(cached.get("log").is_none(), "nothing was built: {cached:#}");
}

/// A tool result the workflow agent sent back to the model holds `text` (what it ran printed).
fn model_saw(api: &FakeAnthropic, text: &str) -> bool {
    api.requests()
        .iter()
        .any(|r| r.body["messages"].to_string().contains(text))
}

/// `cmd` in `image` over a fresh clone of the origin's main, as rover's sandboxes run: no
/// network, read-only root, a tmpfs HOME, an unprivileged uid.
fn run_offline(s: &Scenario, image: &str, cmd: &[&str]) -> std::process::Output {
    let dir = s
        .env
        .path()
        .join(format!("offline-{}", image.replace(':', "-")));
    git(
        s.env.path(),
        &[
            "clone",
            "-q",
            s.origin.to_str().unwrap(),
            dir.to_str().unwrap(),
        ],
    );
    let chown = std::process::Command::new("chown")
        .args(["-R", "10001:10001", dir.to_str().unwrap()])
        .status()
        .unwrap();
    assert!(chown.success());
    std::process::Command::new("docker")
        .args([
            "run",
            "--rm",
            "--network",
            "none",
            "--read-only",
            "--tmpfs",
            "/tmp:rw,exec",
            "-u",
            "10001:10001",
        ])
        .args([
            "-v",
            &format!("{}:/workspace", dir.display()),
            "-w",
            "/workspace",
            image,
        ])
        .args(cmd)
        .output()
        .unwrap()
}

const PY_DOCKERFILE: &str = "FROM {base}
# This machine reaches PyPI through a TLS-inspecting proxy: its CA.
COPY ca.crt /etc/ssl/certs/ca-certificates.crt
RUN apt-get update && apt-get install -y --no-install-recommends python3 python3-venv && rm -rf /var/lib/apt/lists/*
RUN python3 -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
";

const PY_TEST: &str = "import unittest

from iniconfig import IniConfig


class ParseTest(unittest.TestCase):
    def test_reads_a_key(self):
        ini = IniConfig(\"x.ini\", data=\"[calc]\\nprecision = 3\\n\")
        self.assertEqual(ini[\"calc\"][\"precision\"], \"3\")


if __name__ == \"__main__\":
    unittest.main()
";

/// A Python repository with a dev container (a Dockerfile on the local Debian base, one pinned
/// PyPI dependency installed by `postCreateCommand`): rover builds the image once, the real
/// claude runs the project's tests in it, the gate passes and the change ships; a second trace
/// finds the image cached; a new pin in `requirements.txt` on the default branch rebuilds it.
#[tokio::test]
async fn a_python_devcontainer_is_built_once_tested_offline_and_rebuilt_when_its_lockfile_changes()
{
    let base = require_debian_base();
    let (s, api) = real_claude_scenario(
        vec![json!({"name": "Bash", "input": {"command": "python -B -m unittest -v 2>&1", "description": "Run the tests"}})],
        &["python", "-B", "-m", "unittest", "-v"],
    )
    .await;
    let _images = drop_images(&s);
    let config = json!({"name": "calc", "build": {"dockerfile": "Dockerfile"},
        "postCreateCommand": "pip install --no-cache-dir -r requirements.txt",
        "postStartCommand": "true"});
    commit_on_main(
        &s,
        &[
            (
                ".devcontainer/devcontainer.json",
                format!("// the calc project\n{config:#}\n").as_bytes(),
            ),
            (
                ".devcontainer/Dockerfile",
                PY_DOCKERFILE.replace("{base}", &base).as_bytes(),
            ),
            (".devcontainer/ca.crt", &host_ca()),
            ("requirements.txt", b"iniconfig==2.0.0\n"),
            ("test_calc.py", PY_TEST.as_bytes()),
            (".gitignore", b"__pycache__/\n"),
        ],
        "A Python project with a dev container",
    );

    let first = issue_ships(&s, 81).await;
    let env = environment(&first);
    assert_eq!(env["source"], "devcontainer", "{env:#}");
    assert_eq!(env["built"], true, "{env:#}");
    assert!(env["durationMs"].as_u64().is_some());
    let inputs: Vec<&str> = env["inputs"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .collect();
    for path in [
        ".devcontainer/devcontainer.json",
        ".devcontainer/Dockerfile",
        "requirements.txt",
    ] {
        assert!(inputs.contains(&path), "{path} in {inputs:?}");
    }
    assert!(!inputs.contains(&"test_calc.py"), "{inputs:?}");
    assert!(
        env["notes"].to_string().contains("postStartCommand"),
        "{env:#}"
    );
    let image = env["image"].as_str().unwrap().to_owned();
    assert_eq!(
        workflow_span(&first).meta["image"].as_str(),
        Some(image.as_str())
    );
    let log = std::fs::read_to_string(env["log"].as_str().unwrap()).unwrap();
    assert!(
        log.contains("Successfully installed iniconfig-2.0.0"),
        "{log}"
    );
    assert_tests_ran_in_image(
        &s,
        &api,
        &first,
        "Ran 1 test",
        &["python", "-B", "-m", "unittest", "-v"],
    );
    assert_cached(&s, 82, &image).await;

    commit_on_main(
        &s,
        &[("requirements.txt", b"iniconfig==1.1.1\n")],
        "Pin iniconfig 1.1.1",
    );
    let third = issue_ships(&s, 83).await;
    let rebuilt = environment(&third);
    assert_eq!(rebuilt["built"], true, "{rebuilt:#}");
    assert_ne!(rebuilt["image"].as_str(), Some(image.as_str()));
    let log = std::fs::read_to_string(rebuilt["log"].as_str().unwrap()).unwrap();
    assert!(
        log.contains("Successfully installed iniconfig-1.1.1"),
        "{log}"
    );
    eprintln!(
        "python environment: built in {} ms, then cached; rebuilt after the lockfile changed in {} ms",
        env["durationMs"], rebuilt["durationMs"]
    );
}

const RS_DOCKERFILE: &str = "FROM {base}
# This machine reaches crates.io through a TLS-inspecting proxy: its CA.
COPY ca.crt /etc/ssl/certs/ca-certificates.crt
RUN echo 'deb http://deb.debian.org/debian-security bookworm-security main' >> /etc/apt/sources.list \\
 && apt-get update && apt-get install -y --no-install-recommends cargo-web gcc libc6-dev \\
 && rm -rf /var/lib/apt/lists/*
# Outside HOME: the sandboxes run with HOME=/tmp, and offline.
ENV CARGO_HOME=/usr/local/cargo
";

const RS_LIB: &str = "/// `n` in decimal.
pub fn render(n: u64) -> String {
    itoa::Buffer::new().format(n).to_owned()
}

#[cfg(test)]
mod tests {
    #[test]
    fn renders() {
        assert_eq!(super::render(4096), \"4096\");
    }
}
";

const RS_LOCK: &str = "# This file is automatically @generated by Cargo.
# It is not intended for manual editing.
version = 3

[[package]]
name = \"digits\"
version = \"0.1.0\"
dependencies = [
 \"itoa\",
]

[[package]]
name = \"itoa\"
version = \"1.0.11\"
source = \"registry+https://github.com/rust-lang/crates.io-index\"
checksum = \"49f1f14873335454500d59611f1cf4a4b0f786f9ac11f4312a78e4cf2566695b\"
";

/// A Rust crate with a dev container (Debian's cargo, one pinned crates.io dependency fetched by
/// `postCreateCommand`): rover builds the image once, the real claude runs `cargo test
/// --offline` in it, the gate does too and the change ships; a second trace finds it cached.
#[tokio::test]
async fn a_rust_devcontainer_is_built_once_and_its_tests_run_offline() {
    let base = require_debian_base();
    let (s, api) = real_claude_scenario(
        vec![json!({"name": "Bash", "input": {"command": "cargo test --offline --locked 2>&1", "description": "Run the tests"}})],
        &["cargo", "test", "--offline", "--locked"],
    )
    .await;
    let _images = drop_images(&s);
    let config = json!({"name": "digits", "build": {"dockerfile": "Dockerfile"},
        "postCreateCommand": "cargo fetch --locked"});
    commit_on_main(
        &s,
        &[
            (".devcontainer/devcontainer.json", config.to_string().as_bytes()),
            (".devcontainer/Dockerfile", RS_DOCKERFILE.replace("{base}", &base).as_bytes()),
            (".devcontainer/ca.crt", &host_ca()),
            ("Cargo.toml", b"[package]\nname = \"digits\"\nversion = \"0.1.0\"\nedition = \"2021\"\n\n[dependencies]\nitoa = \"=1.0.11\"\n"),
            ("Cargo.lock", RS_LOCK.as_bytes()),
            ("src/lib.rs", RS_LIB.as_bytes()),
            (".gitignore", b"/target\n"),
        ],
        "A Rust crate with a dev container",
    );
    let first = issue_ships(&s, 91).await;
    let env = environment(&first);
    assert_eq!(env["built"], true, "{env:#}");
    assert!(env["inputs"].to_string().contains("Cargo.lock"), "{env:#}");
    let image = env["image"].as_str().unwrap().to_owned();
    let log = std::fs::read_to_string(env["log"].as_str().unwrap()).unwrap();
    assert!(
        log.contains("Downloaded") && log.contains("itoa v1.0.11"),
        "{log}"
    );
    assert_tests_ran_in_image(
        &s,
        &api,
        &first,
        "test result: ok. 1 passed",
        &["cargo", "test", "--offline", "--locked"],
    );
    assert_cached(&s, 92, &image).await;
    eprintln!(
        "rust environment: built in {} ms, then cached",
        env["durationMs"]
    );
}
