//! Chaos: the real daemon (`start --local`) SIGKILLed at random moments, many times, while many
//! traces run (workflows in real containers, pushes to a bare remote), restarted each time.

use std::collections::BTreeSet;
use std::process::Stdio;
use std::time::Duration;

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use rover::store::StepKind;
use serde_json::json;

use crate::support::child::Rng;
use crate::support::gitrepo::git;
use crate::support::local::{assert_trace_sound, every_file_parses, Kind, LocalWorld};
use crate::support::scenario::{coordinate, Scenario, COORDINATE, NOTIFY};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_chaos_with_workflows_in_containers_loses_nothing_and_runs_nothing_twice() {
    let mut world = LocalWorld::new(true).await;
    // Interrupted runs count as attempts, bounded by `maxAttempts` (3 by default): with 24 kills
    // one action can be cut off three times and be given up, an explicit error end by design
    // (seen once in CI). This suite proves crash recovery itself, so it lifts the bound.
    world.configure(&serde_json::json!({"autopilot": {"pipeline": {"maxAttempts": 100}}}));
    world.record_container_events();
    let kinds = [Kind::Change, Kind::Noop, Kind::Ask];
    let mut traces = Vec::new();
    let seed = u64::from(std::process::id()) ^ 0x5eed;
    let mut rng = Rng::new(seed);
    let mut kills = 0;
    let mut mid_work = 0;
    for round in 0..24 {
        // Work keeps arriving during the chaos: three new requests every other round.
        if round % 2 == 0 && traces.len() < 30 {
            for _ in 0..3 {
                let n = traces.len();
                traces.push((kinds[n % 3], world.submit(kinds[n % 3], n)));
            }
        }
        let mut daemon = world.spawn_daemon();
        tokio::time::sleep(Duration::from_millis(300 + rng.below(1700))).await;
        let in_flight = world
            .store()
            .read_state()
            .is_ok_and(|s| !s.pending.is_empty());
        if daemon.try_wait().unwrap().is_none() {
            kills += 1;
            if in_flight {
                mid_work += 1;
            }
        }
        kill(
            Pid::from_raw(i32::try_from(daemon.id()).unwrap()),
            Signal::SIGKILL,
        )
        .ok();
        let _ = daemon.wait();
    }
    let ids: Vec<_> = traces.iter().map(|(_, id)| *id).collect();
    // A last daemon runs everything to the end, then stops gracefully.
    let mut daemon = world.spawn_daemon();
    let pid = daemon.id().to_string();
    let settle = {
        let ids = ids.clone();
        let store_world = &world;
        tokio::task::block_in_place(|| {
            store_world.wait_settled(&ids, Duration::from_secs(150));
            // SIGTERM is graceful once the lock names the daemon.
            let store = store_world.store();
            let start = std::time::Instant::now();
            while store.daemon_pid().as_deref() != Some(pid.as_str()) {
                assert!(
                    start.elapsed() < Duration::from_secs(30),
                    "the last daemon took the lock"
                );
                std::thread::sleep(Duration::from_millis(50));
            }
        });
        ids
    };
    kill(
        Pid::from_raw(i32::try_from(daemon.id()).unwrap()),
        Signal::SIGTERM,
    )
    .unwrap();
    let status = daemon.wait().unwrap();
    assert_eq!(status.code(), Some(0), "the last daemon stops cleanly");
    assert!(
        kills >= 16,
        "the daemon was cut off mid-run ({kills} kills, seed {seed})"
    );
    assert!(
        mid_work >= 10,
        "kills with work in flight: {mid_work} of {kills} (seed {seed})"
    );

    // Every trace ended exactly once, every action was taken once.
    let store = world.store();
    let mut actions = 0;
    let mut interrupted = 0;
    let mut workflow_actions = BTreeSet::new();
    for (kind, id) in &traces {
        let view = store.load_trace(*id).unwrap();
        actions += assert_trace_sound(&view, true);
        interrupted += view
            .spans
            .iter()
            .filter(|s| s.meta.get("interrupted").is_some())
            .count();
        let last = view
            .spans
            .iter()
            .filter(|s| rover::steps::kinds::ends_trace(&s.step))
            .map(|s| s.step.clone())
            .next_back()
            .unwrap();
        let expected = match kind {
            Kind::Noop => StepKind::Noop,
            Kind::Ask | Kind::Change => StepKind::Notify,
        };
        assert_eq!(last, expected, "trace {id} ({kind:?})");
        for a in view
            .actions
            .iter()
            .filter(|a| a.action == StepKind::Workflow)
        {
            workflow_actions.insert(a.id.to_string());
        }
        if *kind == Kind::Change {
            assert!(
                view.spans
                    .iter()
                    .any(|s| s.step == StepKind::Push
                        && s.status == rover::store::SpanStatus::Completed),
                "trace {id} pushed: {:?}",
                crate::support::scenario::chain(&view)
            );
        }
    }
    let state = store.read_state().unwrap();
    assert!(
        state.pending.is_empty(),
        "no queued action left: {:?}",
        state.pending
    );

    // Exactly one container was ever started per workflow action (the engine's event log).
    let starts = world.container_events("start");
    let created = world.container_events("create");
    let creates: usize = created.values().sum();
    // A container created but never started (SIGKILL between the two) is replaced by design:
    // only then may an action see more than one create, and still only one start. The record of
    // the replacement is lost when the kill comes before its span is written, so the engine's
    // start count (checked below) is what proves nothing ran twice.
    for (action, n) in &created {
        let replaced = traces.iter().any(|(_, t)| {
            store.load_trace(*t).unwrap().spans.iter().any(|sp| {
                sp.action_id.is_some_and(|a| a.to_string() == *action)
                    && sp
                        .meta
                        .get("started")
                        .is_some_and(|st| st["replacedUnstarted"] == true)
            })
        });
        let started = starts.get(action).copied().unwrap_or(0);
        // Each kill between a create and its start leaves one more unstarted container to
        // replace (two kills in a row there make three creates): still exactly one start.
        assert!(
            *n == 1 || replaced || started == 1,
            "action {action}: {n} containers created, {started} started (replaced unstarted: {replaced})"
        );
    }
    let changes = traces.iter().filter(|(k, _)| *k == Kind::Change).count();
    assert_eq!(
        workflow_actions.len(),
        changes,
        "one workflow per change request"
    );
    for action in &workflow_actions {
        let runs: Vec<String> = traces
            .iter()
            .flat_map(|(_, t)| store.load_trace(*t).unwrap().spans)
            .filter(|sp| sp.action_id.is_some_and(|a| a.to_string() == *action))
            .map(|sp| {
                format!(
                    "{}:{} {}",
                    sp.step,
                    sp.status,
                    serde_json::to_string(&sp.meta).unwrap()
                )
            })
            .collect();
        assert_eq!(
            starts.get(action).copied().unwrap_or(0),
            1,
            "one container started for workflow action {action}: {starts:?}\nits runs: {runs:#?}\ncreated: {:?}",
            world.container_events("create")
        );
    }
    assert_eq!(
        starts.keys().cloned().collect::<BTreeSet<_>>(),
        workflow_actions,
        "no container for anything but a workflow action"
    );

    // Nothing orphaned: every container and worktree left belongs to a task mapping.
    let mapped: BTreeSet<String> = state.task_mappings.keys().cloned().collect();
    for (name, action) in world.containers() {
        assert!(
            mapped.contains(&action),
            "container {name} (action {action}) has a mapping"
        );
    }
    let worktrees_dir = store.root().join("worktrees");
    let named: BTreeSet<String> = state
        .task_mappings
        .values()
        .filter_map(|m| {
            m.worktree_path
                .as_ref()
                .map(|p| p.to_string_lossy().into_owned())
        })
        .collect();
    let mut worktrees = 0;
    if let Ok(entries) = std::fs::read_dir(&worktrees_dir) {
        for e in entries.flatten() {
            worktrees += 1;
            let path = e.path().display().to_string();
            assert!(
                named.contains(&path),
                "worktree {path} belongs to a mapping: {named:?}"
            );
        }
    }

    // Git's own worktree list agrees: every registered worktree under the store is mapped.
    let listed = git(&world.env.repo(), &["worktree", "list", "--porcelain"]);
    for path in listed.lines().filter_map(|l| l.strip_prefix("worktree ")) {
        if path.starts_with(worktrees_dir.to_str().unwrap()) {
            assert!(
                named.contains(path),
                "git worktree {path} belongs to a mapping"
            );
        }
    }

    // Every pushed branch is on the remote with the change.
    let branches: BTreeSet<String> = state
        .task_mappings
        .values()
        .map(|m| m.branch_name.clone())
        .collect();
    assert_eq!(
        branches.len(),
        changes,
        "one branch per change: {branches:?}"
    );
    for b in &branches {
        assert_eq!(
            git(&world.origin, &["show", &format!("{b}:chaos.txt")]),
            "changed"
        );
    }

    let files = every_file_parses(store.root());
    eprintln!(
        "proof chaos: {kills} kills survived ({mid_work} with work in flight, seed {seed}), {} traces ({changes} with workflows in containers), {actions} actions ({interrupted} step runs interrupted and re-run), {} containers started ({creates} created), {worktrees} worktrees, {files} store files parsed, 0 lost, 0 run twice",
        settle.len(),
        starts.values().sum::<usize>()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_chaos_of_cron_runs_against_github_ingests_and_answers_each_event_once() {
    let mut s = Scenario::new().await;
    // As above: interrupted runs must not exhaust the attempt bound in a recovery test.
    s.extra_config = serde_json::json!({"autopilot": {"pipeline": {"maxAttempts": 100}}});
    let issues: Vec<u64> = (101..113).collect();
    for n in &issues {
        s.github.add_issue(
            *n,
            &format!("Question {n}"),
            "How do I export?",
            "alice",
            &[],
        );
        s.github.add_comment(*n, "alice", "How do I export?");
        s.seed_comment(*n, 1000 + n, "How do I export?", "h");
    }
    s.rules
        .push(json!({"prompt_contains": COORDINATE, "delay_ms": 200,
        "structured": coordinate("notify", json!({"message": "Use export."}))}));
    s.rules
        .push(json!({"prompt_contains": NOTIFY, "delay_ms": 200,
        "structured": {"message": "Use `widgets export --json`."}}));
    let seed = u64::from(std::process::id()) ^ 0xc405;
    let mut rng = Rng::new(seed);
    let mut kills = 0;
    // 16 rounds, and more (up to 40) until 5 have landed mid-run: how many do depends on how
    // fast a run is on the machine at the moment.
    for round in 0..40 {
        if round >= 16 && kills >= 5 {
            break;
        }
        let mut run = s
            .once_command()
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        // Within a run's work: an idle `--once` ends at once (it used to wait out a 1 s console
        // timeout, which these kills mostly landed in).
        tokio::time::sleep(Duration::from_millis(30 + rng.below(400))).await;
        if run.try_wait().unwrap().is_none() {
            kills += 1;
        }
        let _ = run.kill(); // SIGKILL
        let _ = run.wait();
    }
    s.run_until_settled(12).await;
    assert!(
        kills >= 5,
        "cron runs cut off mid-run ({kills} kills, seed {seed})"
    );
    let traces = s.traces();
    assert_eq!(
        traces.len(),
        issues.len(),
        "each event ingested exactly once (seed {seed})"
    );
    let mut actions = 0;
    for t in &traces {
        actions += assert_trace_sound(t, true);
    }
    for n in &issues {
        let ours = s.rover_comments(*n).len();
        assert_eq!(ours, 1, "issue {n} answered exactly once (seed {seed})");
    }
    eprintln!(
        "proof chaos (cron, GitHub): {kills} kills of `start --once` survived (seed {seed}), {} events → {} traces, {actions} actions, {} answers posted, 0 lost, 0 duplicated",
        issues.len(),
        traces.len(),
        issues.len()
    );
}
