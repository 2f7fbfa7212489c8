//! An image onto a swarm node through a registry (`autopilot.sandbox.registry`): rover's push of
//! the sandbox image to an empty registry (`Registry::publish`, what a run does before its
//! service is made), the same push again, and the worker's pull by the digest pushed, with none
//! of the image's layers and again. The registry is one of `tests/setup-registry.sh` on a port
//! of its own (5416) over an empty temporary storage, stopped and removed at the end.

use std::process::Command;
use std::time::Instant;

use futures_util::StreamExt;
use rover::sandbox::swarm::registry::repository_name;
use rover::sandbox::swarm::Registry;
use rover::sandbox::DockerSandbox;

const PORT: &str = "5416";
const LOGIN: (&str, &str) = ("rover", "rover-test-registry");
const WORKER: &str = "unix:///run/rover-swarm/wkr/docker.sock";

fn setup(storage: &std::path::Path, stop: bool) -> Result<(), String> {
    let mut cmd = Command::new("bash");
    cmd.arg(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/setup-registry.sh"
    ))
    .env("ROVER_REGISTRY_PORT", PORT)
    .env("ROVER_REGISTRY_STORAGE", storage);
    if stop {
        cmd.arg("stop");
    }
    match cmd.output() {
        Ok(out) if out.status.success() => Ok(()),
        Ok(out) => Err(String::from_utf8_lossy(&out.stderr).trim().to_owned()),
        Err(e) => Err(e.to_string()),
    }
}

/// `cargo bench --bench rover -- registry` (also run by `-- swarm`): the real sandbox image when
/// `ROVER_TEST_SANDBOX_IMAGE` names it, else the busybox test image.
pub fn run() {
    println!("\n== swarm-registry (an image onto the worker through a registry)");
    if !["setup-swarm.sh", "setup-registry.sh"]
        .iter()
        .all(|script| crate::swarm::setup(script))
    {
        return;
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime");
    runtime.block_on(async {
        let local = DockerSandbox::connect(Vec::new(), &rover::host_env::HostEnv::from_process())
            .await
            .expect("the main engine answers");
        let image = match std::env::var("ROVER_TEST_SANDBOX_IMAGE") {
            Ok(image) if !image.is_empty() => image,
            _ => rover::sandbox::image::RootfsImage::new("rover-sandbox-test")
                .binary("/usr/bin/git", "/usr/bin/git")
                .ensure(&local)
                .await
                .expect("build the busybox test image"),
        };
        measure(&local, &image).await;
    });
}

/// Measures `image` (on `local`) pushed and pulled; prints the figures.
async fn measure(local: &DockerSandbox, image: &str) {
    let storage = tempfile::tempdir_in("/var/tmp").expect("a temp dir for the registry");
    if let Err(e) = setup(storage.path(), false) {
        println!("registry: not measured: tests/setup-registry.sh failed: {e}");
        return;
    }
    let info = local.client().inspect_image(image).await.expect("inspect");
    let (id, size) = (
        info.id.unwrap_or_default(),
        info.size.unwrap_or_default() as f64 / 1e6,
    );
    let registry = Registry::new(
        &format!("127.0.0.1:{PORT}/rover-bench"),
        Some((LOGIN.0.to_owned(), LOGIN.1.to_owned())),
    )
    .expect("a valid prefix");
    let t = Instant::now();
    let reference = registry
        .publish(local, image, &id)
        .await
        .expect("the first push");
    let first = t.elapsed();
    let t = Instant::now();
    let again = registry
        .publish(local, image, &id)
        .await
        .expect("the push again");
    let pushed_again = t.elapsed();
    assert_eq!(reference, again, "one image, one digest");
    let stored = dir_bytes(storage.path()) as f64 / 1e6;

    let worker = DockerSandbox::connect_to(WORKER, Vec::new())
        .await
        .expect("the worker answers");
    // The worker has none of its layers (the bench's other figures loaded it there before).
    let _ = worker
        .client()
        .remove_image(
            &id,
            Some(bollard::query_parameters::RemoveImageOptions {
                force: true,
                ..Default::default()
            }),
            None,
        )
        .await;
    let pull = || async {
        let t = Instant::now();
        let mut stream = worker.client().create_image(
            Some(
                bollard::query_parameters::CreateImageOptionsBuilder::default()
                    .from_image(&reference)
                    .build(),
            ),
            None,
            registry.credentials(),
        );
        while let Some(step) = stream.next().await {
            step.expect("the worker pulls the image");
        }
        t.elapsed()
    };
    let pulled = pull().await;
    let pulled_again = pull().await;
    let on_worker = worker
        .client()
        .inspect_image(&id)
        .await
        .ok()
        .and_then(|i| i.id);
    println!(
        "registry: the sandbox image {image} ({size:.0} MB, {stored:.0} MB in the registry) pushed by rover to an empty registry: {:.1} s; the same push again: {:.2} s",
        first.as_secs_f64(),
        pushed_again.as_secs_f64()
    );
    println!(
        "registry: the worker's pull by digest with none of its layers: {:.1} s; again: {:.2} s; the worker has rover's image id: {}",
        pulled.as_secs_f64(),
        pulled_again.as_secs_f64(),
        on_worker.as_deref() == Some(id.as_str())
    );
    // The push's tag on rover's engine, the registry and its storage go.
    let tag = format!(
        "127.0.0.1:{PORT}/rover-bench/{}:{}",
        repository_name(image),
        id.trim_start_matches("sha256:")
            .chars()
            .take(16)
            .collect::<String>()
    );
    let _ = Command::new("docker").args(["rmi", &tag]).output();
    if let Err(e) = setup(storage.path(), true) {
        println!("registry: cannot stop the bench's registry: {e}");
    }
}

fn dir_bytes(dir: &std::path::Path) -> u64 {
    let mut total = 0;
    let mut todo = vec![dir.to_owned()];
    while let Some(path) = todo.pop() {
        let Ok(meta) = std::fs::symlink_metadata(&path) else {
            continue;
        };
        if meta.is_dir() {
            if let Ok(entries) = std::fs::read_dir(&path) {
                todo.extend(entries.flatten().map(|e| e.path()));
            }
        } else {
            total += meta.len();
        }
    }
    total
}
