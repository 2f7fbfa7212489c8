//! rover's memory end to end (docs/memory.md): the real binary, the fake GitHub, the fake agent
//! and a real Docker engine, on a repository whose tests need a generation step first (its
//! `make` is a shell script: the sandbox image carries no make). The first issue's workflow
//! fails its gate, the resolver iterates with the generation step and the gate passes: a lesson
//! is filed with that evidence. The second, similar issue's workflow prompt carries it inside
//! an untrusted block and its gate passes on the first try; with memory off it fails again.

use serde_json::{json, Value};

use crate::support::env::stdout;
use crate::support::lessons::{fix, generated_tests, widget_issue, workflow_statuses};
use crate::support::scenario::Scenario;

/// The prompt the first workflow run of `trace` was given (its agent wrote it into the
/// worktree, committed on the task's branch).
fn workflow_prompt(trace: &rover::store::TraceView) -> String {
    let workflow = trace
        .spans
        .iter()
        .find(|sp| sp.step.as_str() == "workflow" && sp.action_id.is_some())
        .unwrap();
    let worktree = workflow.meta["worktreePath"].as_str().unwrap();
    std::fs::read_to_string(std::path::Path::new(worktree).join("prompt.txt"))
        .unwrap_or_else(|e| panic!("the prompt in {worktree}: {e}"))
}

fn memory_json(s: &Scenario, args: &[&str]) -> Value {
    let mut all = vec!["autopilot", "memory"];
    all.extend_from_slice(args);
    all.push("--json");
    let out = s.env.command(&all).output().unwrap();
    assert!(out.status.success(), "{out:?}");
    serde_json::from_str(&stdout(&out)).unwrap()
}

#[tokio::test]
async fn a_gate_fixed_by_the_resolver_is_learned_and_the_next_similar_issue_passes_first_try() {
    let marker = tempfile::tempdir().unwrap().path().join("pwned");
    let mut s = generated_tests(json!({}), &fix(&marker)).await;
    let first = widget_issue(&mut s, 41, "a").await;
    assert_eq!(
        workflow_statuses(&first),
        ["failed", "completed"],
        "{:?}",
        crate::support::scenario::chain(&first)
    );

    // One lesson, with the trace's evidence: the failed run, the iterate, the passing run.
    let lessons = memory_json(&s, &["list"]);
    let lessons = lessons.as_array().unwrap();
    assert_eq!(lessons.len(), 1, "{lessons:#?}");
    let lesson = &lessons[0];
    assert_eq!(lesson["kind"], "gate");
    assert_eq!(lesson["concerns"], json!(["/bin/sh make test"]));
    let evidence = &lesson["evidence"][0];
    assert_eq!(evidence["traceId"], first.trace_id().to_string());
    assert_eq!(evidence["command"], json!(["/bin/sh", "make", "test"]));
    assert_eq!(evidence["exitCodes"], json!([2, 0]));
    let spans: Vec<String> = first
        .spans
        .iter()
        .filter(|sp| matches!(sp.step.as_str(), "workflow" | "resolve") && sp.action_id.is_some())
        .map(|sp| sp.id.to_string())
        .collect();
    for id in evidence["spanIds"].as_array().unwrap() {
        assert!(
            spans.contains(&id.as_str().unwrap().to_owned()),
            "{id} in {spans:?}"
        );
    }
    let id = lesson["id"].as_str().unwrap().to_owned();

    // The second issue: its workflow prompt holds the lesson inside an untrusted block, and its
    // gate passes on the first try.
    let second = widget_issue(&mut s, 42, "b").await;
    assert_eq!(
        workflow_statuses(&second),
        ["completed"],
        "{:?}",
        crate::support::scenario::chain(&second)
    );
    let prompt = workflow_prompt(&second);
    assert!(prompt.contains("## Task: Add widget b"), "{prompt}");
    let open = prompt
        .find("<untrusted-data id=\"")
        .and_then(|_| prompt.find("rover's memory of earlier traces"))
        .expect("a memory block");
    let lesson_at = prompt.find("sh make gen").unwrap();
    let curl_at = prompt.find(&marker.display().to_string()).unwrap();
    let close = prompt[open..].find("</untrusted-data id=").unwrap() + open;
    assert!(open < lesson_at && lesson_at < close, "{prompt}");
    assert!(open < curl_at && curl_at < close, "{prompt}");
    // The span records the lesson it was given, and `trace` shows it.
    let workflow = second
        .spans
        .iter()
        .find(|sp| sp.step.as_str() == "workflow" && sp.action_id.is_some())
        .unwrap();
    assert_eq!(workflow.meta["lessons"], json!([id]));
    let out = s
        .env
        .command(&["autopilot", "trace", &second.trace_id().to_string()])
        .output()
        .unwrap();
    assert!(
        stdout(&out).contains(&format!("lessons given: {id}")),
        "{}",
        stdout(&out)
    );
    // The planner was given it too, and a replay of the trace gives the replayed plan and
    // coordinate the same lessons (recorded as a world read): nothing diverges.
    let plan = second
        .spans
        .iter()
        .find(|sp| sp.step.as_str() == "plan")
        .unwrap();
    assert_eq!(plan.meta["lessons"], json!([id]));
    let replay = s
        .env
        .command(&["autopilot", "replay", &second.trace_id().to_string()])
        .current_dir(&s.checkout)
        .output()
        .unwrap();
    assert_eq!(replay.status.code(), Some(0), "{}", stdout(&replay));
    // Nothing ran the attacker's line on the host.
    assert!(!marker.exists());

    // A person forgets it: gone from the book.
    let forgotten = memory_json(&s, &["forget", &id[..6]]);
    assert_eq!(forgotten["forgotten"]["id"], id);
    assert_eq!(memory_json(&s, &["list"]), json!([]));
}

#[tokio::test]
async fn with_memory_off_the_second_similar_issue_fails_its_first_gate_again() {
    let marker = tempfile::tempdir().unwrap().path().join("pwned");
    let mut s = generated_tests(json!({"enabled": false}), &fix(&marker)).await;
    let first = widget_issue(&mut s, 41, "a").await;
    assert_eq!(workflow_statuses(&first), ["failed", "completed"]);
    let second = widget_issue(&mut s, 42, "b").await;
    assert_eq!(workflow_statuses(&second), ["failed", "completed"]);
    assert_eq!(memory_json(&s, &["list"]), json!([]));
    assert!(!workflow_prompt(&second).contains("rover's memory of earlier traces"));
}

#[tokio::test]
async fn a_ci_check_fixed_by_the_resolvers_iterate_is_learned_with_its_evidence() {
    // CI fails on rover's first commit and passes on the fix the resolver's iterate made (the
    // follow-through scenario of a red pull request).
    use crate::follow_through::{csv_settled, following_ci, iterate_on_red_ci};
    let mut s = following_ci(&["failure", "success"], None).await;
    iterate_on_red_ci(&mut s, "1 of at most 3 iterate/retry decisions used");
    let trace = csv_settled(&mut s, 30, "The pull request is up.", 16).await;
    let lessons = memory_json(&s, &["list"]);
    let ci: Vec<&Value> = lessons
        .as_array()
        .unwrap()
        .iter()
        .filter(|l| l["kind"] == "ci")
        .collect();
    assert_eq!(ci.len(), 1, "{lessons:#?}");
    let lesson = ci[0];
    assert_eq!(lesson["concerns"], json!(["ci / test"]));
    assert_eq!(
        lesson["statement"],
        "The CI check `ci / test` failed on the pull request; it passed after this fix: ci / test fails: quote the csv fields."
    );
    let evidence = &lesson["evidence"][0];
    assert_eq!(evidence["traceId"], trace.trace_id().to_string());
    assert_eq!(evidence["check"], "ci / test");
    assert_eq!(evidence["conclusions"], json!(["failure", "success"]));
    // The spans: the red look, the iterate, the green look at the new head, in that order.
    let span = |id: &Value| {
        trace
            .spans
            .iter()
            .find(|sp| sp.id.to_string() == id.as_str().unwrap())
            .unwrap()
    };
    let spans: Vec<_> = evidence["spanIds"]
        .as_array()
        .unwrap()
        .iter()
        .map(span)
        .collect();
    assert_eq!(spans.len(), 3);
    assert_eq!(spans[0].meta["ciStatus"]["state"], "failure");
    assert_eq!(spans[1].meta["decision"], "iterate");
    assert_eq!(spans[2].meta["ciStatus"]["state"], "success");
    assert_ne!(spans[0].meta["ci"]["sha"], spans[2].meta["ci"]["sha"]);
    // `memory show` prints the check and its conclusions.
    let out = s
        .env
        .command(&[
            "autopilot",
            "memory",
            "show",
            lesson["id"].as_str().unwrap(),
        ])
        .output()
        .unwrap();
    assert!(
        stdout(&out).contains("check ci / test (failure then success)"),
        "{}",
        stdout(&out)
    );
}

#[tokio::test]
async fn a_persons_review_that_asked_for_changes_is_learned_once_a_later_review_approves() {
    use crate::support::gitrepo::git;
    use crate::support::scenario::{
        changes_requested, coordinate, pr_payload, rover_pr, COORDINATE,
    };
    let mut s = crate::support::scenario::Scenario::new().await;
    s.with_sandbox().await;
    let (number, branch) = rover_pr(&mut s).await;
    let before = git(&s.origin, &["rev-parse", &branch]);
    // bob asks for changes; rover iterates on the pull request's task and pushes.
    changes_requested(&mut s, number, &branch, &before, 901);
    s.answer_notify("I handled quoting in CSV fields.");
    s.run_until_settled(12).await;
    let feedback = s.traces().pop().unwrap();
    let reviews = |s: &Scenario| -> Vec<Value> {
        memory_json(s, &["list"])
            .as_array()
            .unwrap()
            .iter()
            .filter(|l| l["kind"] == "review")
            .cloned()
            .collect()
    };
    assert!(reviews(&s).is_empty(), "not approved yet");
    // bob approves the new head: that trace, ending, confirms the review's lesson.
    let after = git(&s.origin, &["rev-parse", &branch]);
    s.github.add_review_on(number, "bob", "APPROVED", &after);
    s.github.seed_event("PullRequestReviewEvent", "bob", json!({"action": "submitted",
        "pull_request": pr_payload(number, &branch, &after),
        "review": {"id": 902, "body": "Thanks, LGTM.", "state": "approved", "commit_id": after, "html_url": "h"}}));
    s.rules.clear();
    s.answer(COORDINATE, coordinate("noop", json!({})));
    s.run_until_settled(6).await;
    let lessons = reviews(&s);
    assert_eq!(lessons.len(), 1, "{lessons:#?}");
    let lesson = &lessons[0];
    assert_eq!(
        lesson["statement"],
        "A reviewer (@bob) asked for changes on the pull request and approved once they were made: Please also handle quoting in CSV fields."
    );
    let evidence = &lesson["evidence"][0];
    assert_eq!(evidence["traceId"], feedback.trace_id().to_string());
    assert_eq!(
        evidence["conclusions"],
        json!(["changes_requested", "approved"])
    );
    assert_eq!(evidence["spanIds"][0], feedback.trace_id().to_string());
    let out = s
        .env
        .command(&[
            "autopilot",
            "memory",
            "show",
            lesson["id"].as_str().unwrap(),
        ])
        .output()
        .unwrap();
    assert!(
        stdout(&out).contains("outcome changes_requested then approved"),
        "{}",
        stdout(&out)
    );
}

#[tokio::test]
async fn the_answer_that_let_the_planner_plan_is_learned_with_its_question() {
    use crate::support::scenario::{coordinate, task, COORDINATE, PLAN};
    let mut s = Scenario::new().await;
    s.with_sandbox().await;
    s.open_issue(15, "Make it faster", "The thing is slow.");
    s.rules.push(json!({"prompt_contains": "the export is the slow one", "structured": coordinate("plan", json!({"directive": "Speed up the export"}))}));
    s.answer(
        COORDINATE,
        coordinate("plan", json!({"directive": "Make the slow thing faster"})),
    );
    s.rules.push(json!({"prompt_contains": "Speed up the export", "structured": {"analysis": "Now clear.", "clarification": null, "tasks": [task("export", "Stream the export", &[], "swe")]}}));
    s.answer(PLAN, json!({"analysis": "Unclear.", "tasks": [], "clarification": "Which operation is slow: the export or the import?"}));
    s.task_does(
        "Stream the export",
        json!({"export.txt": "streamed\n"}),
        "completed",
    );
    s.commit_then_push("Stream the export");
    s.answer_notify("Which operation is slow: the export or the import?");
    s.run_until_settled(6).await;
    assert_eq!(memory_json(&s, &["list"]), json!([]), "asked, not answered");
    // alice answers on the issue: a new trace, whose plan plans.
    s.github
        .add_comment(15, "alice", "Sorry: the export is the slow one.");
    s.seed_comment(15, 151, "Sorry: the export is the slow one.", "h");
    s.run_until_settled(12).await;
    let answering = s.traces().pop().unwrap();
    let lessons = memory_json(&s, &["list"]);
    let found: Vec<&Value> = lessons
        .as_array()
        .unwrap()
        .iter()
        .filter(|l| l["kind"] == "clarification")
        .collect();
    assert_eq!(found.len(), 1, "{lessons:#?}");
    assert_eq!(
        found[0]["statement"],
        "The planner had to ask \"Which operation is slow: the export or the import?\"; the answer that let it plan: Sorry: the export is the slow one."
    );
    let evidence = &found[0]["evidence"][0];
    assert_eq!(evidence["traceId"], answering.trace_id().to_string());
    assert_eq!(evidence["conclusions"], json!(["clarify", "tasks"]));
}

/// A book of two lessons written as rover writes it, in `env`'s store, each learned on a fix
/// the resolver described as `fix`, with its evidence in trace `trace`.
pub fn seeded_book(
    env: &crate::support::env::TestEnv,
    fix: &str,
    trace: uuid::Uuid,
) -> (String, String) {
    use rover::memory::{Evidence, LessonBook, LessonKind, NewLesson};
    let store = env.store();
    let lesson = |command: &str| NewLesson {
        kind: LessonKind::Gate,
        statement: format!("The required gate `{command}` failed; it passed after this fix: {fix}"),
        concerns: vec![command.to_owned()],
        topic: "Add widget".into(),
        evidence: Evidence {
            command: command.split(' ').map(str::to_owned).collect(),
            exit_codes: vec![2, 0],
            ..Evidence::new(trace, vec![uuid::Uuid::new_v4()], chrono::Utc::now())
        },
    };
    LessonBook::update(&store, |b| {
        b.learn(lesson("make test"), 200);
        b.learn(lesson("make lint"), 200);
    })
    .unwrap();
    let book = LessonBook::load(&store).unwrap();
    (book.lessons[0].id.clone(), book.lessons[1].id.clone())
}

#[test]
fn memory_lists_shows_pins_and_forgets_and_names_a_torn_file() {
    let env = crate::support::env::TestEnv::new();
    let (test, lint) = seeded_book(&env, "x", uuid::Uuid::new_v4());
    let run = |args: &[&str]| {
        let mut all = vec!["autopilot", "memory"];
        all.extend_from_slice(args);
        env.command(&all).output().unwrap()
    };
    let list = stdout(&run(&[]));
    assert!(list.contains(&test) && list.contains(&lint), "{list}");
    assert!(list.contains("make test"), "{list}");
    let shown = stdout(&run(&["show", &test]));
    assert!(
        shown.contains("command make test (exit codes 2 then 0)"),
        "{shown}"
    );
    let pinned: Value = serde_json::from_str(&stdout(&run(&["pin", &lint, "--json"]))).unwrap();
    assert_eq!(pinned, json!({"id": lint, "pinned": true}));
    let forgotten = run(&["forget", &test]);
    assert!(forgotten.status.success());
    let left: Value = serde_json::from_str(&stdout(&run(&["list", "--json"]))).unwrap();
    assert_eq!(left.as_array().unwrap().len(), 1);
    assert_eq!(left[0]["id"], lint);
    assert_eq!(left[0]["pinned"], true);
    // An id that matches nothing: not found.
    assert_eq!(run(&["show", "l-zzzz"]).status.code(), Some(66));
    // A torn file: named, kept aside, exit 65, nothing overwritten.
    let path = rover::memory::LessonBook::path(&env.store());
    let text = std::fs::read_to_string(&path).unwrap();
    std::fs::write(&path, &text[..text.len() / 2]).unwrap();
    let out = run(&["forget", &lint]);
    assert_eq!(out.status.code(), Some(65));
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(
        err.contains("lessons.json") && err.contains("moved aside"),
        "{err}"
    );
    assert_eq!(
        std::fs::read_to_string(&path).unwrap(),
        text[..text.len() / 2]
    );
}

/// `rover autopilot gc` expires the lessons unused for `memory.ttlDays` (a dry run only names
/// them) and keeps a pinned one and a recent one. The engine it would sweep is out of reach
/// here (a Docker host that does not answer): the store's part does not depend on it.
#[test]
fn gc_expires_lessons_unused_past_their_ttl_and_keeps_pinned_and_recent_ones() {
    let env = crate::support::env::TestEnv::new();
    let (test, lint) = seeded_book(&env, "x", uuid::Uuid::new_v4());
    let recent = seeded_recent_lesson(&env);
    // `test` and `lint` learned and last used 200 days ago (the default ttl is 90); `lint`
    // pinned.
    let path = rover::memory::LessonBook::path(&env.store());
    let mut book: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let long_ago = (chrono::Utc::now() - chrono::Duration::days(200)).to_rfc3339();
    for lesson in book["lessons"].as_array_mut().unwrap() {
        if lesson["id"] == json!(recent) {
            continue;
        }
        lesson["created"] = json!(long_ago);
        lesson["lastUsed"] = json!(long_ago);
        for evidence in lesson["evidence"].as_array_mut().unwrap() {
            evidence["at"] = json!(long_ago);
        }
        if lesson["id"] == json!(lint) {
            lesson["pinned"] = json!(true);
        }
    }
    std::fs::write(&path, serde_json::to_string(&book).unwrap()).unwrap();
    let gc = |args: &[&str]| {
        let mut all = vec!["autopilot", "gc", "--json"];
        all.extend_from_slice(args);
        let out = env
            .command(&all)
            .env("DOCKER_HOST", "unix:///nonexistent/rover-test-docker.sock")
            .output()
            .unwrap();
        let text = stdout(&out);
        (out.status.code(), text)
    };
    let (_, dry) = gc(&["--dry-run"]);
    let dry: Value = serde_json::from_str(&dry).unwrap_or_else(|e| panic!("{e}: {dry}"));
    assert_eq!(dry["lessonsExpired"], json!([test]), "{dry}");
    let ids = |path: &std::path::Path| -> Vec<String> {
        let book: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
        book["lessons"]
            .as_array()
            .unwrap()
            .iter()
            .map(|l| l["id"].as_str().unwrap().to_owned())
            .collect()
    };
    assert_eq!(ids(&path).len(), 3, "a dry run removes nothing");
    let (_, real) = gc(&[]);
    let real: Value = serde_json::from_str(&real).unwrap_or_else(|e| panic!("{e}: {real}"));
    assert_eq!(real["lessonsExpired"], json!([test]), "{real}");
    let left = ids(&path);
    assert!(
        left.len() == 2 && left.contains(&lint) && left.contains(&recent),
        "the pinned and the recent one stay: {left:?}"
    );
    let listed = stdout(
        &env.command(&["autopilot", "memory", "list"])
            .output()
            .unwrap(),
    );
    assert!(
        !listed.contains(&test) && listed.contains(&lint),
        "{listed}"
    );
}

/// A third lesson, learned now, in `env`'s store; its id.
fn seeded_recent_lesson(env: &crate::support::env::TestEnv) -> String {
    use rover::memory::{Evidence, LessonBook, LessonKind, NewLesson};
    let store = env.store();
    LessonBook::update(&store, |b| {
        b.learn(
            NewLesson {
                kind: LessonKind::Gate,
                statement: "The required gate `make fmt` failed; it passed after this fix: z"
                    .into(),
                concerns: vec!["make fmt".into()],
                topic: "Format".into(),
                evidence: Evidence {
                    command: vec!["make".into(), "fmt".into()],
                    exit_codes: vec![2, 0],
                    ..Evidence::new(
                        uuid::Uuid::new_v4(),
                        vec![uuid::Uuid::new_v4()],
                        chrono::Utc::now(),
                    )
                },
            },
            200,
        );
    })
    .unwrap();
    let book = LessonBook::load(&store).unwrap();
    book.lessons
        .iter()
        .find(|l| l.statement.contains("make fmt"))
        .unwrap()
        .id
        .clone()
}
