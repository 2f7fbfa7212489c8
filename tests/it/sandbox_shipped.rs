//! The shipped workspace on the local engine, through the workflow step: nothing of the host is
//! mounted into an agent's container, its work comes back checked, and a container that leaves
//! hostile entries in `/workspace` fails its run with the entry named and nothing applied.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use rover::sandbox::DockerSandbox;
use rover::store::{SpanStatus, StepKind};
use serde_json::{json, Value};

use crate::steps_workflow::{
    agent_image, chain_of, commit_rule, config, docker, on_docker, settle, task, writes, World,
    COMMITTED,
};
use crate::support::docker::{Around, Wrapped};
use crate::support::gitrepo::git;
use crate::support::pipeline::last_span;

/// One mount of a container as the engine reports it: type, source, destination.
type MountSeen = (Option<String>, Option<String>, Option<String>);

/// Each agent container's mounts as the engine reports them, inspected right after it started,
/// while it runs.
#[derive(Default)]
struct Mounts(Mutex<Vec<(bool, Vec<MountSeen>)>>);

#[async_trait]
impl Around for Mounts {
    async fn started(&self, engine: &DockerSandbox, id: &str) {
        let inspect = engine
            .client()
            .inspect_container(id, None)
            .await
            .expect("inspect a started container");
        let running = inspect
            .state
            .and_then(|s| s.running)
            .expect("a state with `running`");
        let mounts = inspect
            .mounts
            .unwrap_or_default()
            .into_iter()
            .map(|m| (m.typ, m.source, m.destination))
            .collect();
        self.0.lock().expect("seen").push((running, mounts));
    }
}

/// A rule for the task titled `title` that writes `hello.txt`, runs `commands` in its
/// `/workspace` and reports `completed`, answering only after `delay_ms`.
fn runs(title: &str, commands: &[&str], delay_ms: u64) -> Value {
    let mut rule = writes(title, &[("hello.txt", "hello from the sandbox\n")]);
    rule["run"] = json!(commands);
    rule["delay_ms"] = json!(delay_ms);
    rule
}

#[tokio::test]
async fn a_shipped_agent_run_mounts_nothing_of_the_host_and_its_work_comes_back() {
    let w = World::new();
    let docker = docker().await;
    let image = agent_image(&docker).await;
    let watching = Arc::new(Wrapped {
        inner: docker.clone(),
        around: Mounts::default(),
    });
    let cfg = config(&image, 300, Vec::new());
    assert!(cfg.autopilot.sandbox.workspace.is_none(), "the default");
    let services = w.services(&commit_rule(), cfg, Some(watching.clone()));
    // The agent answers after 3 s, so the container still runs when it is inspected.
    let script = json!([runs(
        "Shipped",
        &[
            "ln -s hello.txt link.txt",
            "mkdir -p docs && echo doc > docs/a.md"
        ],
        3000
    )]);
    let (trace, _wf, _orch) = w.run_task(&services, &script, "Shipped").await;

    assert_eq!(chain_of(&w.p, trace), COMMITTED);
    let view = w.p.trace(trace);
    let span = last_span(&view, "workflow");
    let worktree = PathBuf::from(span.meta["worktreePath"].as_str().expect("worktree"));
    let store = w.p.store.root().to_path_buf();

    let seen = watching.around.0.lock().expect("seen").clone();
    assert_eq!(seen.len(), 1, "one agent container: {seen:?}");
    let (running, mounts) = &seen[0];
    assert!(*running, "inspected while it ran");
    let destinations: Vec<&str> = mounts.iter().filter_map(|m| m.2.as_deref()).collect();
    for wanted in ["/workspace", "/rover-git", "/rover-git-objects"] {
        assert!(destinations.contains(&wanted), "{wanted} in {mounts:?}");
    }
    for (typ, source, destination) in mounts {
        assert_eq!(
            typ.as_deref(),
            Some("volume"),
            "{destination:?} is a volume filled through the engine, not a bind mount: {mounts:?}"
        );
        let source = source.as_deref().unwrap_or_default();
        assert!(
            !source.starts_with(worktree.to_str().expect("utf-8"))
                && !source.starts_with(store.to_str().expect("utf-8")),
            "no host path of the task is mounted: {mounts:?}"
        );
    }

    // What the agent made came back and was committed: a file, a directory, a link as a link.
    let branch = span.meta["branchName"].as_str().expect("branch").to_owned();
    assert_eq!(
        crate::support::gitrepo::show(&w.p.repo.checkout, &branch, "hello.txt"),
        "hello from the sandbox"
    );
    assert_eq!(
        crate::support::gitrepo::show(&w.p.repo.checkout, &branch, "docs/a.md"),
        "doc"
    );
    let link = git(&w.p.repo.checkout, &["ls-tree", &branch, "link.txt"]);
    assert!(link.starts_with("120000 "), "a link stays a link: {link}");
    let returned = &span.meta["workspace"];
    assert!(
        returned["entries"].as_u64().expect("entries") >= 4,
        "{returned}"
    );
    assert!(
        returned["archiveBytes"].as_u64().expect("bytes") > 0,
        "{returned}"
    );
}

/// One attack of the hostile-archive test: the task's title, the commands its agent runs, and
/// the entry and words its refusal must show.
struct Attack {
    title: &'static str,
    commands: &'static [&'static str],
    entry: &'static str,
    says: &'static str,
}

const ATTACKS: &[Attack] = &[
    Attack {
        title: "Fifo",
        commands: &["mkfifo pipe"],
        entry: "workspace/pipe",
        says: "is a fifo",
    },
    Attack {
        title: "Git file",
        commands: &["rm -f .git && printf 'gitdir: /tmp/evil\\n' > .git"],
        entry: "workspace/.git",
        says: "git metadata",
    },
    Attack {
        title: "Sparse",
        commands: &["truncate -s 40M holes.bin"],
        entry: "workspace/holes.bin",
        says: "more than 16 MiB (autopilot.sandbox.workspaceLimitMb)",
    },
];

#[tokio::test]
async fn hostile_entries_in_a_returned_workspace_fail_the_run_naming_each_and_change_nothing() {
    let w = World::new();
    let docker = docker().await;
    let image = agent_image(&docker).await;
    let mut cfg = config(&image, 300, Vec::new());
    cfg.autopilot.sandbox.workspace_limit_mb = 16;
    let services = w.services(&commit_rule(), cfg, Some(docker.clone()));
    let script = Value::Array(
        ATTACKS
            .iter()
            .map(|a| runs(a.title, a.commands, 0))
            .collect(),
    );
    let orch = w.p.orchestrator(World::steps(&services, &script));
    let traces: Vec<_> = ATTACKS
        .iter()
        .map(|a| w.trace_with(StepKind::Workflow, &task(a.title, &[])).0)
        .collect();
    settle(&w.p, &orch).await;

    for (attack, trace) in ATTACKS.iter().zip(traces) {
        let view = w.p.trace(trace);
        let span = last_span(&view, "workflow");
        assert_eq!(
            span.status,
            SpanStatus::Failed,
            "{}: {:?}",
            attack.title,
            span
        );
        let error = span.meta["error"]["message"].as_str().unwrap_or_default();
        assert!(
            error.contains(&format!("entry `{}`", attack.entry)) && error.contains(attack.says),
            "{}: {error}",
            attack.title
        );
        assert!(error.contains("nothing of it was applied"), "{error}");
        // Nothing of the run reached the worktree (its other file neither), and nothing was
        // left next to it.
        let worktree = PathBuf::from(span.meta["worktreePath"].as_str().expect("worktree"));
        assert!(!worktree.join("hello.txt").exists(), "{}", attack.title);
        let gitfile = std::fs::read_to_string(worktree.join(".git")).expect("rover's git file");
        assert!(!gitfile.contains("/tmp/evil"), "{gitfile}");
        let leftovers: Vec<String> = std::fs::read_dir(worktree.parent().expect("tasks dir"))
            .expect("tasks dir")
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with('.'))
            .collect();
        assert!(leftovers.is_empty(), "{leftovers:?}");
        // Nothing was committed on the task's branch.
        let branch = span.meta["branchName"].as_str().expect("branch");
        let fork = git(&w.p.repo.checkout, &["merge-base", branch, "HEAD"]);
        assert_eq!(git(&w.p.repo.checkout, &["rev-parse", branch]), fork);
    }
}

/// The escape of a hard link copied through a parent an archive replaced by a link (refused by
/// `sandbox::returned`, unit-tested on hand-made archives) needs a path named twice, which the
/// engine's archive of a real container never holds. What a container can leave is its parts:
/// links to the host's `/etc` and its files, hard links, a file in a directory beside those
/// links. They come back as the container made them: a link stays a link (committed as its
/// target's text), a hard link is a copy of the container's file, nothing of the host's is read.
#[tokio::test]
async fn links_to_host_paths_beside_hard_links_come_back_as_the_container_made_them() {
    let (w, _docker, services) = on_docker(300).await;
    let script = json!([runs(
        "Links",
        &[
            "mkdir d && printf 'inside\\n' > d/hostname",
            "ln d/hostname leak && ln d/hostname d/again",
            "ln -s /etc etc && ln -s /etc/hostname hn && ln -s ../etc d/up",
        ],
        0
    )]);
    let (trace, _wf, _orch) = w.run_task(&services, &script, "Links").await;

    assert_eq!(chain_of(&w.p, trace), COMMITTED);
    let view = w.p.trace(trace);
    let span = last_span(&view, "workflow");
    let branch = span.meta["branchName"].as_str().expect("branch").to_owned();
    let show = |path: &str| crate::support::gitrepo::show(&w.p.repo.checkout, &branch, path);
    for path in ["leak", "d/hostname", "d/again"] {
        assert_eq!(show(path), "inside", "{path} is the container's file");
    }
    for (path, target) in [("etc", "/etc"), ("hn", "/etc/hostname"), ("d/up", "../etc")] {
        let entry = git(&w.p.repo.checkout, &["ls-tree", &branch, path]);
        assert!(entry.starts_with("120000 "), "{path} stays a link: {entry}");
        assert_eq!(show(path), target, "{path} is committed as its target");
    }
    let worktree = PathBuf::from(span.meta["worktreePath"].as_str().expect("worktree"));
    assert_eq!(
        std::fs::read_to_string(worktree.join("leak")).expect("leak"),
        "inside\n"
    );
    assert!(
        std::fs::symlink_metadata(worktree.join("etc"))
            .expect("etc")
            .file_type()
            .is_symlink(),
        "a link on the host too"
    );
    let returned = &span.meta["workspace"];
    assert!(
        returned["entries"].as_u64().expect("entries") >= 7,
        "{returned}"
    );
}

/// A collection cut off before its hand-over (a daemon killed between reading the run and
/// recording it) is done again at the next start: the second collection takes the shipped
/// workspace back as the first did, so the agent's work is kept, and nothing is left beside the
/// worktree.
#[tokio::test]
async fn a_shipped_run_collected_again_after_a_cut_off_collection_keeps_its_work() {
    use rover::orchestrator::{Step, StepContext};

    let (w, docker, services) = on_docker(300).await;
    let script = json!([writes(
        "Again",
        &[("hello.txt", "hello from the sandbox\n")]
    )]);
    let workflow = Arc::new(
        rover::steps::workflow::WorkflowStep::new(services.clone())
            .with_sandbox_env(crate::support::pipeline::SCRIPT_ENV, script.to_string()),
    );
    let orch = w.p.orchestrator(vec![workflow.clone() as Arc<dyn Step>]);
    let (_trace, wf) = w.trace_with(StepKind::Workflow, &task("Again", &[]));
    // Launch (the drain's monitor finds nothing yet), then wait for the agent's container to end.
    orch.drain().await.expect("drain");
    tokio::time::timeout(std::time::Duration::from_secs(60), async {
        loop {
            let exited = w
                .containers(&docker, wf.id)
                .await
                .iter()
                .any(|c| c.state == "exited");
            if exited && orch.in_flight() == 0 {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
    })
    .await
    .expect("the agent's container ends");

    let store = w.p.store.clone();
    let ctx = StepContext::standalone(store.clone());
    let ended = workflow.monitor(&ctx).await.expect("monitor");
    assert_eq!(ended.len(), 1, "{ended:?}");
    let pending = store
        .read_state()
        .unwrap()
        .pending_for(wf.id)
        .cloned()
        .expect("claimed");
    let run = rover::store::StepRun {
        span: store.read_span(pending.running_span_id.unwrap()).unwrap(),
        action: store.read_action(wf.id).unwrap(),
        pending,
    };
    // The first collection's result is never recorded (the cut-off); the second is.
    for attempt in 1..=2 {
        let collected = workflow
            .collect(&ctx, &run, &ended[0])
            .await
            .expect("collected");
        assert_eq!(
            collected.run.status,
            SpanStatus::Completed,
            "collection {attempt}: {}",
            collected.run.summary
        );
        assert_eq!(
            collected.collection.status,
            SpanStatus::Completed,
            "collection {attempt}: {}",
            collected.collection.summary
        );
    }
    let worktree = rover::steps::tasks::load_task(&store, wf.id)
        .await
        .unwrap()
        .expect("task")
        .mapping
        .worktree_path
        .expect("worktree");
    assert_eq!(
        std::fs::read_to_string(worktree.join("hello.txt")).expect("the agent's work"),
        "hello from the sandbox\n"
    );
    let parent = worktree.parent().unwrap();
    let beside: Vec<String> = std::fs::read_dir(parent)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with('.'))
        .collect();
    assert!(beside.is_empty(), "left beside the worktree: {beside:?}");
}
