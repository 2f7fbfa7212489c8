//! Workspace figures on the local engine: an agent container over a task's worktree and its
//! scratch git, the worktree mounted (bind mounts) or shipped (volumes filled through the
//! engine's archive API), for a small repository and a ~100 MB one. `start` is create (and
//! ship) and start; `return` is taking `/workspace` back, checking every entry and applying it
//! to the worktree (shipped only: a mounted worktree has nothing to return).

use std::path::Path;
use std::time::{Duration, Instant};

use rover::git::{BranchBase, Workspace};
use rover::sandbox::image::RootfsImage;
use rover::sandbox::returned::take_back;
use rover::sandbox::{
    ContainerStatus, DockerSandbox, Egress, EgressMode, Sandbox, SandboxLabels, SandboxSettings,
    SandboxSpec, WorkspaceMode,
};

use crate::sandbox::{repository, Cleanup};

/// Runs per mode and repository.
const RUNS: usize = 3;

pub fn run() {
    println!(
        "\n== workspace (mounted vs shipped on the local engine; load {})",
        std::fs::read_to_string("/proc/loadavg")
            .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
            .unwrap_or_default()
    );
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime");
    runtime.block_on(async {
        let docker =
            match DockerSandbox::connect(Vec::new(), &rover::host_env::HostEnv::from_process())
                .await
            {
                Ok(docker) => docker,
                Err(e) => {
                    println!(
                        "not measured (no Docker engine: {e}; run `bash tests/setup-docker.sh`)"
                    );
                    return;
                }
            };
        let image = RootfsImage::new("rover-sandbox-test")
            .binary("/usr/bin/git", "/usr/bin/git")
            .ensure(&docker)
            .await
            .expect("build the busybox test image");
        let project = format!(
            "rover-bench-ws-{}",
            &uuid::Uuid::new_v4().simple().to_string()[..8]
        );
        let _cleanup = Cleanup {
            project: project.clone(),
        };
        repo_figures(&docker, &image, &project, "small", &small_files()).await;
        repo_figures(&docker, &image, &project, "~100 MB", &large_files()).await;
    });
}

/// 40 source files of about 2 KB.
fn small_files() -> Vec<(String, Vec<u8>)> {
    (0..40)
        .map(|i| {
            (
                format!("src/m{i}.rs"),
                format!("pub fn f{i}() -> u32 {{ {i} }}\n")
                    .repeat(64)
                    .into_bytes(),
            )
        })
        .collect()
}

/// 400 files of 256 KiB that do not compress (about 100 MiB in the worktree and as much packed).
fn large_files() -> Vec<(String, Vec<u8>)> {
    let mut state: u64 = 0x9E37_79B9_7F4A_7C15;
    (0..400)
        .map(|i| {
            let mut data = vec![0u8; 256 * 1024];
            for chunk in data.chunks_mut(8) {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                chunk.copy_from_slice(&state.to_le_bytes()[..chunk.len()]);
            }
            (format!("data/d{}/blob{i}.bin", i % 20), data)
        })
        .collect()
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

async fn repo_figures(
    docker: &DockerSandbox,
    image: &str,
    project: &str,
    what: &str,
    files: &[(String, Vec<u8>)],
) {
    let root = tempfile::tempdir().expect("a temp dir");
    let borrowed: Vec<(&str, &[u8])> = files
        .iter()
        .map(|(p, d)| (p.as_str(), d.as_slice()))
        .collect();
    let checkout = repository(root.path(), &borrowed);
    let ws = Workspace::open(&checkout)
        .await
        .expect("open the checkout")
        .with_env("GIT_CONFIG_GLOBAL", "/dev/null")
        .with_env("GIT_CONFIG_NOSYSTEM", "1");
    let bytes: usize = files.iter().map(|(_, d)| d.len()).sum();
    let mut start = [Vec::new(), Vec::new()];
    let mut back = Vec::new();
    let mut archive = 0;
    for run in 0..RUNS {
        for (m, mode) in [WorkspaceMode::Mounted, WorkspaceMode::Shipped]
            .into_iter()
            .enumerate()
        {
            let name = format!("{m}-{run}");
            let wt = ws
                .prepare_worktree(
                    &format!("rover/bench-{name}"),
                    BranchBase::DefaultBranch,
                    &root.path().join("tasks").join(&name),
                )
                .await
                .expect("a worktree");
            let git = ws
                .sandbox_git(
                    &wt.path,
                    &root.path().join("scratch").join(&name),
                    &root.path().join("objects"),
                )
                .await
                .expect("a scratch git");
            let settings = SandboxSettings {
                image: image.to_owned(),
                egress: Egress::Mode(EgressMode::None),
                workspace: Some(mode),
                ..SandboxSettings::default()
            };
            let mut spec = SandboxSpec::from_settings(
                &settings,
                vec![
                    "/bin/sh".into(),
                    "-c".into(),
                    "git status --porcelain >/dev/null && echo changed > new.txt".into(),
                ],
                &wt.path,
                SandboxLabels {
                    project: project.to_owned(),
                    trace: "bench".into(),
                    action: format!("ws-{}-{name}", what.len()),
                },
            );
            spec.mount_git(&git);
            let t = Instant::now();
            let id = docker.run(&spec).await.expect("start");
            start[m].push(ms(t.elapsed()));
            let status = docker.wait(&id).await.expect("wait");
            assert!(
                matches!(status, ContainerStatus::Exited { code: 0, .. }),
                "{status:?}"
            );
            if mode == WorkspaceMode::Shipped {
                let t = Instant::now();
                let applied = take_back(docker, &id, &spec)
                    .await
                    .expect("take back")
                    .expect("shipped");
                back.push(ms(t.elapsed()));
                archive = applied.archive_bytes;
            }
            assert_eq!(
                std::fs::read_to_string(wt.path.join("new.txt")).expect("the agent's file"),
                "changed\n"
            );
            docker.remove(&id).await.expect("remove");
            git.discard();
        }
    }
    let (mounted, shipped) = (median(start[0].clone()), median(start[1].clone()));
    println!(
        "{what} repository ({} files, {:.1} MiB in the worktree; median of {RUNS}): start mounted {mounted:.0} ms, shipped {shipped:.0} ms (shipping adds {:.0} ms); return (take back {:.1} MiB, check, apply) {:.0} ms",
        files.len(),
        bytes as f64 / f64::from(1u32 << 20),
        shipped - mounted,
        archive as f64 / f64::from(1u32 << 20),
        median(back),
    );
    let _ = std::fs::remove_dir_all(Path::new(root.path()));
}
