//! The swarm backend with a registry (`autopilot.sandbox.registry`): rover pushes a task's image
//! from its own engine and the node that runs the task pulls it by the digest pushed. The
//! registry is `tests/setup-registry.sh`'s, with a login, reachable at one name from rover's
//! engine and from both nodes' network namespaces.

use std::time::Duration;

use rover::sandbox::swarm::images::image_id;
use rover::sandbox::swarm::Registry;
use rover::sandbox::{ContainerStatus, DockerSandbox, Sandbox, SandboxError, WorkspaceMode};

use crate::support::docker::{test_image, TestContainers};
use crate::support::gitrepo::TestRepo;
use crate::support::swarm::{
    ensure_registry, remove_from_nodes, swarm, Services, MANAGER, ON_WORKER, REGISTRY,
    REGISTRY_LOGIN,
};

const LOG_LIMIT: u64 = 64 << 20;

/// A new image on rover's engine (the test image with a label of its own): no node has it.
fn unique_image(base: &str, id: &str) -> String {
    let name = format!("rover-registry-test:{id}");
    let mut build = std::process::Command::new("docker")
        .args(["build", "-q", "-t", &name, "-"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("docker build");
    {
        use std::io::Write;
        let mut stdin = build.stdin.take().expect("stdin");
        writeln!(stdin, "FROM {base}\nLABEL rover.test.unique={id}").expect("Dockerfile");
    }
    let out = build.wait_with_output().expect("docker build");
    assert!(
        out.status.success(),
        "docker build: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    name
}

/// Removes every tag of image `id` from rover's engine when the test ends.
struct LocalImage(String);

impl Drop for LocalImage {
    fn drop(&mut self) {
        let _ = std::process::Command::new("docker")
            .args(["rmi", "-f", &self.0])
            .output();
    }
}

fn registry(password: Option<&str>) -> Registry {
    Registry::new(
        &format!("{REGISTRY}/rover-tests"),
        password.map(|p| (REGISTRY_LOGIN.0.to_owned(), p.to_owned())),
    )
    .expect("a valid prefix")
}

async fn service_image(swarm: &rover::sandbox::SwarmSandbox, id: &str) -> (String, String) {
    let service = swarm
        .manager()
        .client()
        .inspect_service(id, None)
        .await
        .expect("inspect the service");
    let image = service
        .spec
        .as_ref()
        .and_then(|s| s.task_template.as_ref())
        .and_then(|t| t.container_spec.as_ref())
        .and_then(|c| c.image.clone())
        .expect("the service names an image");
    (image, serde_json::to_string(&service).expect("json"))
}

#[tokio::test]
async fn a_task_on_the_worker_pulls_the_image_rover_pushed_to_the_registry_by_its_digest() {
    let local = crate::support::docker::sandbox().await;
    let base = test_image(&local).await;
    let (_guard, swarm, worker) = swarm(&[ON_WORKER], &[]).await;
    ensure_registry().await;
    let tc = TestContainers::new();
    let image = unique_image(&base, &tc.id);
    let id = image_id(&local, &image)
        .await
        .expect("inspect")
        .expect("the new image");
    let _local = LocalImage(id.clone());
    let manager = DockerSandbox::connect_to(MANAGER, local.env_allow().to_vec())
        .await
        .expect("the manager's engine");
    assert!(image_id(&worker, &id).await.expect("inspect").is_none());

    let _services = Services(&tc);
    let repo = TestRepo::new();
    let dir = repo.data.join("work");
    std::fs::create_dir_all(&dir).expect("mkdir");

    // A wrong password: the push fails, saying so, and no service is made.
    let refused = swarm
        .clone()
        .with_registry(registry(Some("not-the-password")));
    let mut spec = tc.spec(&image, &dir, "refused", "echo never");
    spec.workspace = WorkspaceMode::Mounted;
    let err = refused.run(&spec).await.expect_err("the push is refused");
    let said = err.to_string();
    assert!(matches!(err, SandboxError::Registry { .. }), "{said}");
    assert!(
        said.contains(&format!("{REGISTRY}/rover-tests")) && said.contains("unauthorized"),
        "{said}"
    );
    assert!(!said.contains("not-the-password"), "{said}");
    assert!(
        refused
            .list_by_labels(&[("rover.test".to_owned(), tc.id.clone())])
            .await
            .expect("list")
            .is_empty(),
        "nothing runs when the image cannot be published"
    );

    // With the login: pushed before each run (the second push finds every layer there), pulled
    // by the worker by its digest, the same image both times.
    let swarm = swarm.with_registry(registry(Some(REGISTRY_LOGIN.1)));
    let mut runs = Vec::new();
    for action in ["pulled", "again"] {
        let mut spec = tc.spec(&image, &dir, action, "echo ran-from-the-registry");
        spec.workspace = WorkspaceMode::Mounted;
        let run = swarm.run(&spec).await.expect("a service is made");
        let (named, inspected) = service_image(&swarm, &run).await;
        assert!(
            named.starts_with(&format!(
                "{REGISTRY}/rover-tests/rover-registry-test@sha256:"
            )),
            "the service names the image by the digest pushed: {named}"
        );
        assert!(
            !inspected.contains(REGISTRY_LOGIN.1)
                && !inspected.to_ascii_lowercase().contains("registryauth"),
            "the registry's login is not in the service's spec: {inspected}"
        );
        let log = repo.data.join(format!("{action}.log"));
        let (logs, status) =
            tokio::join!(swarm.logs_to_file(&run, &log, LOG_LIMIT), swarm.wait(&run));
        logs.expect("logs");
        assert_eq!(
            status.expect("wait"),
            ContainerStatus::Exited {
                code: 0,
                oom_killed: false
            },
            "{named}"
        );
        assert_eq!(
            std::fs::read_to_string(&log).expect("log"),
            "ran-from-the-registry\n"
        );
        runs.push((run, named));
    }
    assert_eq!(runs[0].1, runs[1].1, "one image, one reference");
    let pulled = worker
        .client()
        .inspect_image(&id)
        .await
        .expect("the worker pulled the image rover built, under its id");
    assert!(
        pulled.repo_digests.unwrap_or_default().contains(&runs[0].1),
        "the worker has it from the registry"
    );
    assert!(
        image_id(&manager, &id).await.expect("inspect").is_none(),
        "nothing was loaded onto a node that ran nothing"
    );
    for (run, _) in &runs {
        assert!(swarm.remove(run).await.expect("remove"));
    }
    remove_from_nodes(&id).await;
}

#[tokio::test]
async fn a_trace_on_the_swarm_with_a_registry_goes_issue_to_pr_with_the_image_the_worker_pulled() {
    use serde_json::json;

    use crate::support::scenario::{
        chain, merge, one_task_issue, scenario_image, Scenario, NOTIFY,
    };

    let local = crate::support::docker::sandbox().await;
    let image = scenario_image().await;
    let (_guard, _swarm, worker) = swarm(&[], &[]).await;
    ensure_registry().await;
    let id = image_id(&local, &image)
        .await
        .expect("inspect")
        .expect("the scenario image");
    // No node has it: the worker must pull it.
    remove_from_nodes(&id).await;

    let mut s = Scenario::new().await;
    s.with_sandbox().await;
    s.env_vars.push(("ROVER_SWARM_HOST".into(), MANAGER.into()));
    s.env_vars
        .push(("ROVER_REGISTRY_USERNAME".into(), REGISTRY_LOGIN.0.into()));
    s.env_vars
        .push(("ROVER_REGISTRY_PASSWORD".into(), REGISTRY_LOGIN.1.into()));
    merge(
        &mut s.extra_config,
        &json!({"autopilot": {"sandbox": {"backend": "swarm", "egress": "model-only", "timeoutSecs": 120,
            "registry": format!("{REGISTRY}/rover-tests"),
            "swarm": {"constraints": [ON_WORKER]}}}}),
    );
    one_task_issue(
        &mut s,
        8,
        "Add a flag",
        "Please add it.",
        "Add the flag",
        "flag.txt",
    );
    s.answer(NOTIFY, json!({"message": "Done."}));
    let mut settled = false;
    for _ in 0..120 {
        s.run_once().await;
        if s.settled() {
            settled = true;
            break;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    let trace = s.the_trace();
    let steps = chain(&trace);
    assert!(settled, "{steps:?}");
    assert_eq!(
        steps.last().map(String::as_str),
        Some("notify:completed"),
        "{steps:?}"
    );
    assert_eq!(s.github.pulls().len(), 1, "{steps:?}");
    let pulled = worker
        .client()
        .inspect_image(&id)
        .await
        .expect("the worker has the image rover built, under its id");
    let from_registry = pulled.repo_digests.unwrap_or_default();
    assert!(
        from_registry
            .iter()
            .any(|d| d.starts_with(&format!("{REGISTRY}/rover-tests/"))),
        "pulled from the registry: {from_registry:?}"
    );
    // The login stayed in rover's environment: nothing rover wrote holds it, no comment does.
    let mut files = vec![s.env.path().to_owned()];
    while let Some(path) = files.pop() {
        let meta = std::fs::symlink_metadata(&path).expect("stat");
        if meta.is_dir() {
            files.extend(
                std::fs::read_dir(&path)
                    .expect("read dir")
                    .map(|e| e.expect("entry").path()),
            );
        } else if meta.is_file() {
            let bytes = std::fs::read(&path).unwrap_or_default();
            assert!(
                !String::from_utf8_lossy(&bytes).contains(REGISTRY_LOGIN.1),
                "{} holds the registry's password",
                path.display()
            );
        }
    }
    let pulls = s.github.pulls().into_iter().map(|p| p.0);
    for number in std::iter::once(8).chain(pulls) {
        for (_, _, body) in s.github.comments_of(number) {
            assert!(!body.contains(REGISTRY_LOGIN.1), "{body}");
        }
    }
}
