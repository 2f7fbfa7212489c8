//! Set-up steps rover does itself: its own sandbox image built from the Dockerfile it carries on
//! first use (no `docker build` by hand), and `start` checking at once that a repository
//! declaring its environment has the dev container CLI.

use serde_json::json;

use crate::real_cli::{json_flag_in_a_real_sandbox, real_codex};
use crate::support::chain::assert_chain;
use crate::support::gitrepo::git;
use crate::support::pipeline::first_span;
use crate::support::scenario::{merge, Scenario};

/// The Debian base `tests/setup-sandbox-image.sh --base` made (`tests/run.sh` exports it).
fn sandbox_base() -> String {
    std::env::var("ROVER_TEST_SANDBOX_BASE")
        .ok()
        .filter(|b| !b.is_empty())
        .expect("the Debian base of the sandbox image is missing: export ROVER_TEST_SANDBOX_BASE=\"$(bash tests/setup-sandbox-image.sh --base)\" (tests/run.sh does)")
}

fn docker(args: &[&str]) -> String {
    let out = std::process::Command::new("docker")
        .args(args)
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

/// rover's own images on this engine (`rover-sandbox:<hash>`, labelled with their hash).
fn own_images() -> Vec<String> {
    docker(&[
        "image",
        "ls",
        "--filter",
        &format!("label={}", rover::sandbox::own_image::LABEL_OWN_IMAGE),
        "--format",
        "{{.Repository}}:{{.Tag}}",
    ])
    .lines()
    .filter(|l| l.starts_with("rover-sandbox:"))
    .map(str::to_owned)
    .collect()
}

/// A user who never built an image: `autopilot.sandbox.image` unset, and no rover-sandbox image
/// on the engine. The first trace's workflow makes rover build its own image from the
/// Dockerfile it carries (the steps on its console, the build's log in the store), and the real
/// claude inside it makes the change that ships. The next start finds the image by its hash.
#[tokio::test]
async fn rover_builds_its_own_sandbox_image_on_first_use_and_the_real_claude_ships_from_it() {
    for image in own_images() {
        docker(&["image", "rm", &image]);
    }
    assert_eq!(
        own_images(),
        Vec::<String>::new(),
        "no own image to start with"
    );
    // No `image`: rover's own. Built over the Debian base the suite made, with the host's
    // pinned CLIs copied in (a build here cannot reach the npm registry through the TLS proxy).
    let (mut s, _api) = json_flag_in_a_real_sandbox(json!({
        "build": {"base": sandbox_base(), "claudeCode": "host", "codex": "host"}
    }))
    .await;
    s.env_vars
        .push(("ROVER_CODEX_BIN".into(), real_codex().display().to_string()));
    let mut said = String::new();
    for _ in 0..20 {
        let out = s.run_once().await;
        said.push_str(&String::from_utf8_lossy(&out.stdout));
        if s.settled() {
            break;
        }
    }
    let trace = s.the_trace();
    assert_chain(
        &trace,
        "event coordinate plan workflow commit resolve push notify",
    );
    let built = own_images();
    assert_eq!(built.len(), 1, "one image built: {built:?}");
    let image = &built[0];
    let hash = image.trim_start_matches("rover-sandbox:");
    assert_eq!(hash.len(), 12, "{image}");
    // The console said what it built, step by step, and where its log is.
    assert!(
        said.contains(&format!(
            "building the sandbox image {image} from the Dockerfile rover carries"
        )),
        "{said}"
    );
    assert!(said.contains(&format!("rover: {image}: Step 1/")), "{said}");
    assert!(
        said.contains(&format!("built the sandbox image {image} in")),
        "{said}"
    );
    let log = s
        .store()
        .root()
        .join("images")
        .join(format!("sandbox-image-{hash}.log"));
    let log_text = std::fs::read_to_string(&log).unwrap();
    assert!(
        log_text.contains("--build-arg CLAUDE_CODE_VERSION=vendor"),
        "{log_text}"
    );
    assert!(log_text.contains("Successfully tagged"), "{log_text}");
    // The agent ran in it: the workflow's environment names it, and the change shipped.
    let workflow = first_span(&trace, "workflow");
    assert_eq!(
        workflow.meta["environment"]["image"].as_str(),
        Some(image.as_str()),
        "{:?}",
        workflow.meta
    );
    let push = first_span(&trace, "push");
    let branch = push.meta["branch"].as_str().unwrap();
    let shipped = crate::support::gitrepo::show(&s.origin, branch, "json.txt");
    assert_eq!(shipped, "--json prints JSON");
    // It carries the Dockerfile's label and the CLIs the host runs.
    assert_eq!(
        docker(&[
            "image",
            "inspect",
            "--format",
            "{{index .Config.Labels \"rover.image\"}}",
            image
        ]),
        "agents"
    );
    let version = docker(&["run", "--rm", image, "claude", "--version"]);
    assert!(version.contains("2.1.197"), "{version}");
    // Another start finds it by its hash: nothing is built again.
    let again = s.run_once().await;
    let again = String::from_utf8_lossy(&again.stdout);
    assert!(!again.contains("building the sandbox image"), "{again}");
    assert_eq!(own_images(), built);
}

/// A newcomer whose repository has a `.devcontainer/devcontainer.json` and no dev container
/// CLI learns it from `start` at once, with the one command that installs it, before any event
/// is taken; with the CLI, the same start goes on.
#[tokio::test]
async fn start_refuses_a_devcontainer_repository_without_the_cli_and_says_how_to_install_it() {
    let mut s = Scenario::new().await;
    std::fs::create_dir_all(s.checkout.join(".devcontainer")).unwrap();
    std::fs::write(
        s.checkout.join(".devcontainer/devcontainer.json"),
        r#"{"image": "debian:bookworm", "postCreateCommand": "make deps"}"#,
    )
    .unwrap();
    git(&s.checkout, &["add", "-A"]);
    git(&s.checkout, &["commit", "-q", "-m", "Add a dev container"]);
    git(&s.checkout, &["push", "-q", "origin", "main"]);
    s.github
        .add_issue(71, "Add a --json flag", "Please add --json.", "alice", &[]);
    s.github.seed_event("IssuesEvent", "alice", json!({"action": "opened", "issue": {"number": 71, "title": "Add a --json flag", "body": "Please add --json.", "user": {"login": "alice"}}}));
    let missing = s.env.path().join("no-such-dir/devcontainer");
    merge(
        &mut s.extra_config,
        &json!({"autopilot": {"sandbox": {"environment": {"devcontainerCli": missing}}}}),
    );
    let out = s.run_once_raw().await;
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert_ne!(out.status.code(), Some(0), "{text}");
    assert!(
        text.contains("npm install -g @devcontainers/cli@0.89.0"),
        "{text}"
    );
    assert!(text.contains(".devcontainer/devcontainer.json"), "{text}");
    assert!(s.traces().is_empty(), "no event was taken");
    // A `.rover/setup.sh` needs it just the same; with the CLI, start goes on.
    let cli = std::env::var("ROVER_TEST_DEVCONTAINER_BIN")
        .ok()
        .filter(|c| !c.is_empty())
        .expect("the dev container CLI is missing: ROVER_TEST_DEVCONTAINER_BIN=\"$(bash tests/setup-clis.sh devcontainer)\" (tests/run.sh does)");
    merge(
        &mut s.extra_config,
        &json!({"autopilot": {"sandbox": {"environment": {"devcontainerCli": cli}}}}),
    );
    s.answer(
        crate::support::scenario::COORDINATE,
        crate::support::scenario::coordinate("noop", json!({})),
    );
    s.run_once().await;
    assert_eq!(s.traces().len(), 1);
}
