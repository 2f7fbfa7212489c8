//! Integration tests for `sandbox`: a real Docker engine, a locally built image, real git.

use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::time::Duration;

use rover::git::{BranchBase, CommitOutcome};
use rover::sandbox::gates::{run_gates, GateOutcome, GatesReport, LABEL_GATE};
use rover::sandbox::returned::take_back;
use rover::sandbox::{
    stderr_path, wait_or_kill, ContainerStatus, DockerSandbox, GateSettings, LogStats, Sandbox,
    SandboxError, SandboxSpec, WorkspaceMode, LABEL_ACTION,
};

use crate::support::docker::{sandbox, test_image, TestContainers};
use crate::support::gitrepo::TestRepo;

/// Far above what these containers print.
const LOG_LIMIT: u64 = 64 << 20;

/// A container run to its end: its id, how it ended, what it printed and the figures of its log.
struct Ran {
    id: String,
    status: ContainerStatus,
    stdout: String,
    stderr: String,
    stats: LogStats,
}

impl Ran {
    /// It exited with `code`, not killed for its memory (its stderr in the failure).
    fn exited(&self, code: i64) {
        assert_eq!(
            self.status,
            ContainerStatus::Exited {
                code,
                oom_killed: false
            },
            "{}",
            self.stderr
        );
    }
}

/// Runs `spec` to its end, its stdout into `log` (stderr beside it).
async fn run_to_end(docker: &DockerSandbox, spec: &SandboxSpec, log: &Path) -> Ran {
    let id = docker.run(spec).await.expect("run");
    let (logs, status) = tokio::join!(docker.logs_to_file(&id, log, LOG_LIMIT), docker.wait(&id));
    Ran {
        stats: logs.expect("logs"),
        status: status.expect("wait"),
        stdout: std::fs::read_to_string(log).expect("stdout log"),
        stderr: std::fs::read_to_string(stderr_path(log)).unwrap_or_default(),
        id,
    }
}

#[tokio::test]
async fn agent_writes_into_the_workspace_and_the_host_commits_it() {
    let docker = sandbox().await;
    let image = test_image(&docker).await;
    let tc = TestContainers::new();
    let repo = TestRepo::new();
    let ws = repo.workspace().await;
    let wt = ws
        .prepare_worktree(
            "rover/sandboxed",
            BranchBase::DefaultBranch,
            &repo.worktree_path("sb"),
        )
        .await
        .expect("worktree");
    let input = repo.data.join("input");
    std::fs::create_dir_all(&input).expect("mkdir input");
    std::fs::write(input.join("prompt.md"), "Write agent.txt\n").expect("write prompt");
    let script = "cat /rover/prompt.md > /workspace/agent.txt && echo agent-was-here >> agent.txt \
                  && mkdir -p src && printf 'a\\nb\\n' > src/new.rs \
                  && (touch /rover/nope 2>/dev/null && echo input-writable || echo input-read-only) \
                  && echo out-line && echo err-line >&2 && id -u";
    let mut spec = tc.spec(&image, &wt.path, "write", script);
    spec.env = vec![("ANTHROPIC_API_KEY".into(), "sk-test".into())];
    spec.input_dir = Some(input.clone());

    docker.ensure_image(&image).await.expect("image present");
    // Never root inside: the worktree's owner, or the sandbox uid for a root-owned one.
    let run_as = rover::git::owner::run_as(&wt.path).expect("owner").uid;
    let log = repo.data.join("write.log");
    let ran = run_to_end(&docker, &spec, &log).await;
    ran.exited(0);
    // Shipped (the default): what the agent wrote comes back, checked; mounted: it is there.
    let applied = take_back(&docker, &ran.id, &spec).await.expect("take back");
    assert_eq!(applied.is_some(), spec.shipped());
    let owner = std::fs::metadata(&wt.path).expect("worktree meta").uid();
    assert_eq!(ran.stdout, format!("input-read-only\nout-line\n{run_as}\n"));
    assert!(!input.join("nope").exists());
    assert_eq!(ran.stderr, "err-line\n");
    assert_eq!(ran.stats.stderr_bytes, 9);

    let written = wt.path.join("agent.txt");
    assert_eq!(
        std::fs::read_to_string(&written).expect("agent file"),
        "Write agent.txt\nagent-was-here\n"
    );
    assert_eq!(std::fs::metadata(&written).expect("meta").uid(), owner);
    let summary = ws
        .diff_summary(&wt.path, &wt.fork_point)
        .await
        .expect("diff");
    assert_eq!(summary.files, ["agent.txt", "src/new.rs"]);
    assert_eq!(summary.insertions, 4);
    let outcome = ws.commit_all(&wt.path, "Agent work").await.expect("commit");
    assert!(
        matches!(outcome, CommitOutcome::Committed { .. }),
        "{outcome:?}"
    );

    assert!(docker.remove(&ran.id).await.expect("remove"));
    assert!(!docker.remove(&ran.id).await.expect("remove again"));
    assert_eq!(
        docker.status(&ran.id).await.expect("status"),
        ContainerStatus::Gone
    );
}

#[tokio::test]
async fn runs_as_the_worktree_owner_and_cannot_write_what_it_does_not_own() {
    let docker = sandbox().await;
    let image = test_image(&docker).await;
    let tc = TestContainers::new();
    let dir = tempfile::tempdir().expect("tempdir");
    let owned = dir.path().join("owned");
    std::fs::create_dir(&owned).expect("mkdir");
    nix::unistd::chown(&owned, Some(1000.into()), Some(1000.into()))
        .expect("chown (tests run as root)");

    let spec = tc.spec(
        &image,
        &owned,
        "owner",
        "id -u && id -g && touch /workspace/made-inside",
    );
    let log = dir.path().join("owner.log");
    let ran = run_to_end(&docker, &spec, &log).await;
    ran.exited(0);
    assert_eq!(ran.stdout, "1000\n1000\n");
    take_back(&docker, &ran.id, &spec).await.expect("take back");
    let made = std::fs::metadata(owned.join("made-inside")).expect("file made inside");
    assert_eq!((made.uid(), made.gid()), (1000, 1000));

    // A root-owned worktree mounted for uid 1000 is not writable: the agent fails, non-zero exit.
    let root_owned = dir.path().join("root-owned");
    std::fs::create_dir(&root_owned).expect("mkdir");
    let mut spec = tc.spec(&image, &root_owned, "denied", "touch /workspace/x; exit 3");
    spec.user = Some("1000:1000".into());
    let log = dir.path().join("denied.log");
    let ran = run_to_end(&docker, &spec, &log).await;
    ran.exited(3);
    assert!(std::fs::read_to_string(stderr_path(&log))
        .expect("stderr")
        .contains("Permission denied"));
    assert!(!root_owned.join("x").exists());
}

#[tokio::test]
async fn timeout_kills_with_137_and_oom_is_reported() {
    let docker = sandbox().await;
    let image = test_image(&docker).await;
    let tc = TestContainers::new();
    let dir = tempfile::tempdir().expect("tempdir");

    let id = docker
        .run(&tc.spec(&image, dir.path(), "slow", "sleep 300"))
        .await
        .expect("run");
    assert_eq!(
        docker.status(&id).await.expect("status"),
        ContainerStatus::Running
    );
    let finished = wait_or_kill(&docker, &id, Duration::from_secs(1))
        .await
        .expect("wait or kill");
    assert!(finished.timed_out);
    assert_eq!(
        finished.status,
        ContainerStatus::Exited {
            code: 137,
            oom_killed: false
        }
    );
    docker
        .kill(&id)
        .await
        .expect("killing an exited container is fine");

    // The engine may record the OOM event after the exit (later still on a busy machine); look
    // again for a while (not a timing assert). On a loaded machine this engine (20.10, cgroup v2)
    // was seen to lose the event of a container killed at once: a second hungry container then.
    let mut status = ContainerStatus::Gone;
    for attempt in ["hungry", "hungry-again"] {
        let mut spec = tc.spec(
            &image,
            dir.path(),
            attempt,
            "x=$(head -c 200000000 /dev/zero | tr '\\0' a); echo ${#x}",
        );
        spec.limits.memory_bytes = 16 << 20;
        let id = docker.run(&spec).await.expect("run");
        let finished = wait_or_kill(&docker, &id, Duration::from_secs(120))
            .await
            .expect("wait");
        assert!(!finished.timed_out);
        status = finished.status;
        for _ in 0..150 {
            if status
                != (ContainerStatus::Exited {
                    code: 137,
                    oom_killed: false,
                })
            {
                break;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
            status = docker.status(&id).await.expect("status");
        }
        if status
            == (ContainerStatus::Exited {
                code: 137,
                oom_killed: true,
            })
        {
            break;
        }
        eprintln!("{attempt}: {status:?}, the engine reported no OOM for it");
    }
    assert_eq!(
        status,
        ContainerStatus::Exited {
            code: 137,
            oom_killed: true
        }
    );
}

#[tokio::test]
async fn missing_image_and_unreachable_daemon_are_typed() {
    let docker = sandbox().await;
    let tc = TestContainers::new();
    let dir = tempfile::tempdir().expect("tempdir");
    let missing = "rover-no-such-image:never-built";
    let err = docker.ensure_image(missing).await.expect_err("missing");
    assert!(
        matches!(err, SandboxError::ImageMissing { ref image } if image == missing),
        "{err}"
    );
    let err = docker
        .run(&tc.spec(missing, dir.path(), "noimage", "true"))
        .await
        .expect_err("missing image");
    assert!(matches!(err, SandboxError::ImageMissing { .. }), "{err}");
    assert!(!err.is_retryable());
    assert!(err.to_string().contains("docs/sandbox.md"));

    let dead = format!("unix://{}/dead.sock", dir.path().display());
    let err = DockerSandbox::connect_to(&dead, Vec::new())
        .await
        .expect_err("nothing listens there");
    assert!(
        matches!(err, SandboxError::DaemonUnreachable { ref host, .. } if *host == dead),
        "{err:?}"
    );
    assert!(err.is_retryable());
    assert!(err.to_string().contains("DOCKER_HOST"), "{err}");
}

#[tokio::test]
async fn reattach_by_labels_finds_exactly_one_container_per_action() {
    let tc = TestContainers::new();
    let dir = tempfile::tempdir().expect("tempdir");
    let (spec, id) = {
        let docker = sandbox().await;
        let image = test_image(&docker).await;
        let spec = tc.spec(&image, dir.path(), "long", "echo started; sleep 300");
        let id = docker.run(&spec).await.expect("run");
        (spec, id)
        // The handle is dropped here, as on a daemon restart.
    };
    let docker = sandbox().await;
    let action = (LABEL_ACTION.to_string(), spec.labels.action.clone());
    let found = docker
        .list_by_labels(std::slice::from_ref(&action))
        .await
        .expect("list");
    assert_eq!(found.len(), 1, "{found:?}");
    assert_eq!(found[0].id, id);
    assert_eq!(found[0].state, "running");
    assert_eq!(found[0].labels["rover.trace"], spec.labels.trace);

    // Starting the same action again is refused by name: never a second container.
    let err = docker
        .run(&spec)
        .await
        .expect_err("second container for the action");
    assert!(matches!(err, SandboxError::Conflict { .. }), "{err}");
    assert_eq!(
        docker
            .list_by_labels(&[action.clone(), tc.label()])
            .await
            .expect("list")
            .len(),
        1
    );

    // Following the logs of the re-attached container gets its output from the start.
    let log = dir.path().join("long.log");
    let follow = docker.logs_to_file(&id, &log, LOG_LIMIT);
    let kill = async {
        // Killed only once it has printed: on a loaded engine the shell can still be starting.
        let deadline = std::time::Instant::now() + Duration::from_secs(120);
        while std::fs::read_to_string(&log).unwrap_or_default() != "started\n" {
            assert!(
                std::time::Instant::now() < deadline,
                "nothing printed in 120 s"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        docker.kill(&id).await.expect("kill");
        docker.wait(&id).await.expect("wait")
    };
    let (stats, status) = tokio::join!(follow, kill);
    assert!(
        matches!(status, ContainerStatus::Exited { code: 137, .. }),
        "{status:?}"
    );
    assert_eq!(stats.expect("logs").stdout_bytes, 8);
    assert_eq!(std::fs::read_to_string(&log).expect("log"), "started\n");
    assert!(docker.remove(&id).await.expect("remove"));
    assert!(docker
        .list_by_labels(&[action])
        .await
        .expect("list")
        .is_empty());
}

#[tokio::test]
async fn no_github_token_ever_enters_the_container() {
    let docker = sandbox().await;
    let image = test_image(&docker).await;
    let tc = TestContainers::new();
    let dir = tempfile::tempdir().expect("tempdir");

    // Refused even though the test allow-list names it: defence in depth.
    let mut spec = tc.spec(&image, dir.path(), "token", "env");
    spec.env = vec![
        ("ANTHROPIC_API_KEY".into(), "sk-test".into()),
        ("GITHUB_TOKEN".into(), "ghp_secret".into()),
    ];
    let err = docker.run(&spec).await.expect_err("token refused");
    assert!(matches!(err, SandboxError::EnvRefused { ref name, .. } if name == "GITHUB_TOKEN"));
    assert!(!err.to_string().contains("ghp_secret"));
    spec.env = vec![("PATH".into(), "/evil".into())];
    assert!(matches!(
        docker.run(&spec).await,
        Err(SandboxError::EnvRefused { .. })
    ));
    assert!(docker
        .list_by_labels(&[tc.label()])
        .await
        .expect("list")
        .is_empty());

    spec.env = vec![("ANTHROPIC_API_KEY".into(), "sk-test".into())];
    let id = docker.run(&spec).await.expect("run");
    let info = docker
        .client()
        .inspect_container(
            &id,
            None::<bollard::query_parameters::InspectContainerOptions>,
        )
        .await
        .expect("inspect");
    let env = info.config.and_then(|c| c.env).unwrap_or_default();
    assert!(
        env.iter()
            .all(|e| !e.starts_with("GITHUB_TOKEN=") && !e.starts_with("GH_TOKEN=")),
        "{env:?}"
    );
    assert!(
        env.contains(&"ANTHROPIC_API_KEY=sk-test".to_string()),
        "{env:?}"
    );
    assert!(env.contains(&"HOME=/tmp".to_string()), "{env:?}");
    let host = info.host_config.expect("host config");
    assert_eq!(host.network_mode.as_deref(), Some("none"));
    assert_eq!(host.readonly_rootfs, Some(true));
    assert_eq!(host.memory, Some(256 << 20));
    assert_eq!(host.pids_limit, Some(128));
    let log = dir.path().join("env.log");
    let (logs, _) = tokio::join!(docker.logs_to_file(&id, &log, LOG_LIMIT), docker.wait(&id));
    logs.expect("logs");
    let printed = std::fs::read_to_string(&log).expect("log");
    assert!(
        !printed.contains("GITHUB_TOKEN") && !printed.contains("GH_TOKEN"),
        "{printed}"
    );
}

#[tokio::test]
async fn image_from_a_rootfs_tar_runs_a_dynamic_host_binary() {
    let docker = sandbox().await;
    let image = test_image(&docker).await;
    assert_eq!(
        test_image(&docker).await,
        image,
        "same content, same tag: built once"
    );
    let tc = TestContainers::new();
    let dir = tempfile::tempdir().expect("tempdir");
    let spec = tc.spec(&image, dir.path(), "git", "git --version");
    let ran = run_to_end(&docker, &spec, &dir.path().join("git.log")).await;
    ran.exited(0);
    assert!(ran.stdout.starts_with("git version "));
}

#[tokio::test]
async fn gates_run_in_containers_and_report_each_outcome() {
    let docker = sandbox().await;
    let image = test_image(&docker).await;
    let tc = TestContainers::new();
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(dir.path().join("README.md"), "hi\n").expect("write");
    let base = tc.spec(&image, dir.path(), "gates", "true");
    let sh = |s: &str| vec!["/bin/sh".to_string(), "-c".to_string(), s.to_string()];
    let gates = vec![
        GateSettings {
            command: sh("test -f README.md && echo readme ok"),
            timeout_secs: 60,
            required: true,
        },
        GateSettings {
            command: sh("echo broken build >&2; exit 2"),
            timeout_secs: 60,
            required: true,
        },
        GateSettings {
            command: sh("sleep 300"),
            timeout_secs: 1,
            required: false,
        },
    ];
    // A leftover gate container from an interrupted run does not block the gates.
    let mut stale = base.clone();
    stale.name = Some(format!("{}-gate-0", base.container_name()));
    stale.cmd = sh("sleep 300");
    docker.run(&stale).await.expect("stale gate container");
    let logs = dir.path().join("gate-logs");
    let report = run_gates(&docker, &base, &gates, &logs)
        .await
        .expect("gates ran");
    let results = report.results();
    assert_eq!(results.len(), 3);
    assert_eq!(results[0].outcome, GateOutcome::Passed);
    assert_eq!(results[0].output, "readme ok\n");
    assert_eq!(results[1].outcome, GateOutcome::Failed { exit_code: 2 });
    assert!(results[1].output.contains("broken build"));
    assert_eq!(results[2].outcome, GateOutcome::TimedOut);
    assert!(report.failed_required());
    assert_eq!(report.warnings().len(), 1);
    let gate_label = (LABEL_GATE.to_string(), "1".to_string());
    assert!(docker
        .list_by_labels(&[tc.label(), gate_label])
        .await
        .expect("list")
        .is_empty());

    let none = run_gates(&docker, &base, &[], &logs)
        .await
        .expect("no gates");
    assert_eq!(none, GatesReport::NoneConfigured);
    assert!(!none.failed_required());
}

/// A container that floods its output is stopped as soon as it passes the log limit; rover's
/// files and the engine's own log stay about the limit, the head and the tail kept, the cut
/// said. A gate that floods fails with its bounded output and a note.
#[tokio::test]
async fn a_container_flooding_its_output_is_stopped_and_its_logs_stay_bounded() {
    let docker = sandbox().await;
    let image = test_image(&docker).await;
    let tc = TestContainers::new();
    let dir = tempfile::tempdir().expect("tempdir");
    let limit: u64 = 1 << 20;
    let mut spec = tc.spec(
        &image,
        dir.path(),
        "flood",
        "echo first-line; echo err-first >&2; yes flood-line-of-text; echo never",
    );
    spec.limits.log_bytes = limit;
    let id = docker.run(&spec).await.expect("run");
    let log = dir.path().join("flood.log");
    let (logs, status) = tokio::join!(
        docker.logs_to_file(&id, &log, limit),
        // `yes` never ends: only rover's kill at the limit stops it. Under a loaded engine
        // (the suite's other containers on 2 cores) reading the first MiB took over a minute.
        tokio::time::timeout(Duration::from_secs(240), docker.wait(&id))
    );
    let stats = logs.expect("logs");
    let status = status
        .expect("stopped by rover at the limit, not left flooding")
        .expect("wait");
    assert!(
        matches!(status, ContainerStatus::Exited { code: 137, .. }),
        "{status:?}"
    );
    assert!(stats.over_limit(), "{stats:?}");
    assert_eq!(stats.limit_bytes, limit);
    assert_eq!(stats.stderr_cut, 0);
    assert!(stats.stdout_bytes > limit, "{stats:?}");
    let kept = std::fs::read(&log).expect("log");
    assert!(
        kept.len() as u64 <= limit + 300,
        "{} bytes kept",
        kept.len()
    );
    let text = String::from_utf8_lossy(&kept);
    assert!(
        text.starts_with("first-line\nflood-line-of-text\n"),
        "{}",
        &text[..40]
    );
    let note = format!("[rover: {} bytes cut here; this stream passed its limit of {limit} bytes (autopilot.sandbox.logLimitMb); rover kept the first {} and the last ", stats.stdout_cut, limit / 2);
    assert!(text.contains(&note), "no cut note in the log");
    assert!(text.trim_end().ends_with("flood-line-of-text"));
    assert_eq!(
        std::fs::read_to_string(stderr_path(&log)).expect("stderr"),
        "err-first\n"
    );
    for tail in rover::sandbox::logcap::tail_paths(&log) {
        assert!(!tail.exists(), "{}", tail.display());
    }
    // The engine's own log: json-file, two files of the limit at most.
    let info = docker
        .client()
        .inspect_container(&id, None)
        .await
        .expect("inspect");
    let config = info
        .host_config
        .and_then(|h| h.log_config)
        .expect("a log config");
    assert_eq!(config.typ.as_deref(), Some("json-file"));
    let options = config.config.expect("options");
    assert_eq!(options["max-size"], limit.to_string());
    assert_eq!(options["max-file"], "2");
    let engine_log = std::path::PathBuf::from(info.log_path.expect("a log path"));
    for file in [engine_log.clone(), engine_log.with_extension("log.1")] {
        if let Ok(meta) = std::fs::metadata(&file) {
            assert!(
                meta.len() <= limit + 64 * 1024,
                "{}: {} bytes",
                file.display(),
                meta.len()
            );
        }
    }
    assert!(docker.remove(&id).await.expect("remove"));

    let sh = |s: &str| vec!["/bin/sh".to_string(), "-c".to_string(), s.to_string()];
    let gates = [GateSettings {
        // A second before the flood: rover follows a gate's output from its start, but on a
        // loaded machine the flood could pass the engine's capped log before that (a known
        // limit, docs/sandbox.md), which is not what this test is about.
        command: sh("echo starting; sleep 1; yes flooding"),
        // Far past what reading the first MiB takes on a loaded engine (over 60 s in CI):
        // the test is about the kill at the output limit, not about the time limit.
        timeout_secs: 240,
        required: true,
    }];
    let report = run_gates(&docker, &spec, &gates, &dir.path().join("gates"))
        .await
        .expect("gates ran");
    let gate = &report.results()[0];
    assert_eq!(gate.outcome, GateOutcome::Failed { exit_code: 137 });
    assert!(gate.output_over_limit);
    assert!(report.failed_required());
    assert!(gate.output.starts_with("starting\nflooding\n"));
    assert!(
        gate.output.len() <= 64 * 1024 + 500,
        "{}",
        gate.output.len()
    );
    let note = gate.output.lines().last().unwrap_or_default();
    assert!(
        note.starts_with("rover: the container printed more than 1 MiB to stdout (limit autopilot.sandbox.logLimitMb = 1); rover kept the first 0.5 MiB and the last ")
            && note.ends_with(" MiB of it in gate-0.log; it was stopped"),
        "{note}"
    );
}

#[tokio::test]
async fn git_metadata_is_readable_inside_without_secrets_or_write_access() {
    let docker = sandbox().await;
    let image = test_image(&docker).await;
    let tc = TestContainers::new();
    let repo = TestRepo::new();
    let ws = repo.workspace().await;
    crate::support::gitrepo::git(
        &repo.checkout,
        &[
            "remote",
            "set-url",
            "origin",
            "https://x-access-token:ghp_in_url@example.invalid/o/r.git",
        ],
    );
    let wt = ws
        .prepare_worktree(
            "rover/git-inside",
            BranchBase::DefaultBranch,
            &repo.worktree_path("gi"),
        )
        .await
        .expect("worktree");
    std::fs::write(wt.path.join("new.txt"), "new\n").expect("write");
    let git = ws
        .sandbox_git(
            &wt.path,
            &repo.data.join("scratch"),
            &repo.data.join("objects-cache"),
        )
        .await
        .expect("scratch git");
    // Read-only git works; writes land in the scratch repository only; the worktree's `.git`
    // can be neither edited nor replaced.
    let script = "git status --porcelain; git log -1 --format=%s; \
                  (git config --get remote.origin.url || echo no-remote-url); \
                  cat \"$(git rev-parse --git-common-dir)/config\" | grep -c ghp_ || true; \
                  (git add -A 2>/dev/null && git -c user.name=a -c user.email=a@b commit -qm inside 2>/dev/null && echo committed-inside) || echo commit-refused; \
                  (echo 'gitdir: /tmp/evil' > .git) 2>/dev/null || echo gitfile-readonly; \
                  rm -f .git 2>/dev/null || echo gitfile-kept; \
                  (mv .git moved 2>/dev/null && echo moved) || echo gitfile-not-moved; \
                  git rev-parse --git-dir";
    let mut spec = tc.spec(&image, &wt.path, "gitinside", script);
    // What a mount protects: the shipped counterpart is
    // `shipped::a_shipped_run_can_replace_its_git_file_inside_but_never_the_hosts`.
    spec.workspace = WorkspaceMode::Mounted;
    spec.mount_git(&git);
    let log = repo.data.join("gitinside.log");
    let ran = run_to_end(&docker, &spec, &log).await;
    ran.exited(0);
    assert_eq!(
        ran.stdout,
        "?? new.txt\nInitial commit\nno-remote-url\n0\ncommitted-inside\ngitfile-readonly\ngitfile-kept\ngitfile-not-moved\n/rover-git\n",
        "{}",
        ran.stderr
    );
    // The commit made inside went to the scratch repository: the real branch did not move.
    assert_eq!(
        crate::support::gitrepo::git(&repo.checkout, &["rev-parse", "rover/git-inside"]),
        wt.fork_point
    );
    ws.verify_worktree(&wt.path)
        .await
        .expect("the worktree's .git is still rover's");
    git.discard();

    // The host still commits normally, and the user's config kept its remote.
    let before = crate::support::gitrepo::git(&wt.path, &["rev-parse", "HEAD"]);
    assert_eq!(before, wt.fork_point);
    let outcome = ws
        .commit_all(&wt.path, "Host commit")
        .await
        .expect("host commit");
    assert!(matches!(outcome, CommitOutcome::Committed { .. }));
    assert!(
        crate::support::gitrepo::git(&repo.checkout, &["remote", "get-url", "origin"])
            .contains("example.invalid")
    );
}

/// With a writable root, the writable layer gets the engine's size limit where the engine can
/// (overlay2 on xfs with pquota, btrfs, zfs); this suite's engine (overlay2 on ext4) cannot, and
/// the container runs anyway, without that limit, the file size limit still holding.
#[tokio::test]
async fn a_writable_root_runs_on_an_engine_that_cannot_size_its_layer() {
    let docker = sandbox().await;
    let image = test_image(&docker).await;
    let tc = TestContainers::new();
    let dir = tempfile::tempdir().expect("tempdir");
    let mut spec = tc.spec(
        &image,
        dir.path(),
        "layer",
        "mkdir -p /tmp && echo x > /tmp/written && cat /tmp/written && (dd if=/dev/zero of=/tmp/big bs=1M count=8 2>/dev/null && echo big-written || echo big-refused)",
    );
    spec.readonly_rootfs = false;
    // The busybox test image's root is root's: the test writes it as root (caps still dropped).
    spec.user = Some("0:0".into());
    spec.limits.writable_mb = 64;
    spec.limits.file_bytes = 4 * 1024 * 1024;
    let log = dir.path().join("layer.log");
    let ran = run_to_end(&docker, &spec, &log).await;
    assert!(matches!(ran.status, ContainerStatus::Exited { .. }));
    let (out, err) = (&ran.stdout, &ran.stderr);
    assert!(out.starts_with("x\n"), "{out}{err}");
    assert!(
        out.contains("big-refused"),
        "the file size limit holds: {out}"
    );
    docker.remove(&ran.id).await.expect("remove");
}
