//! Per-repository environments through the real binary: the image is built from what the
//! default branch declares (a dev container, `.rover/setup.sh`, or nothing), cached by a hash of
//! what defines it, used by the agent and the gates, and a failed build ends the trace with the
//! build's error and the command that reproduces it, before any agent runs.

use std::path::{Path, PathBuf};

use rover::store::{Span, TraceView};
use serde_json::{json, Value};

use crate::support::gitrepo::git;
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
    let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
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
    trace
        .spans
        .iter()
        .find(|sp| sp.step.as_str() == "workflow")
        .expect("a workflow span")
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
}

/// No dev container and no setup: `autopilot.sandbox.image` as it is, nothing built.
#[tokio::test]
async fn a_repository_that_declares_nothing_runs_in_the_configured_image() {
    let mut s = Scenario::new().await;
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
    let resolve = trace
        .spans
        .iter()
        .find(|sp| sp.step.as_str() == "resolve")
        .unwrap();
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
    let agent_log = std::fs::read_dir(s.agent_log())
        .map(|d| d.count())
        .unwrap_or(0);
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
