//! Steering rover from the thread: `/rover` commands in comments and reactions, with the real
//! binary against the fake GitHub (and, where a container must be stopped, the real Docker
//! engine with the fake agent in it).

use std::time::{Duration, Instant};

use rover::store::SpanStatus;
use serde_json::{json, Value};

use crate::support::env::stdout;
use crate::support::fake_github::BOT;
use crate::support::scenario::{
    chain, coordinate, csv_issue, task, Scenario, COORDINATE, NOTIFY, PLAN,
};

/// `author` comments `body` on #`number`, and the feed says so; returns the comment's id.
fn comment(s: &Scenario, number: u64, author: &str, body: &str) -> u64 {
    let id = s.github.add_comment(number, author, body);
    s.github.seed_event(
        "IssueCommentEvent",
        author,
        json!({"action": "created", "issue": {"number": number},
            "comment": {"id": id, "body": body, "user": {"login": author},
                "html_url": format!("https://github.com/octo-org/widgets/issues/{number}#issuecomment-{id}")}}),
    );
    id
}

/// rover's comments on #`number`.
fn rovers(s: &Scenario, number: u64) -> Vec<String> {
    s.github
        .comments_of(number)
        .into_iter()
        .filter(|(_, author, _)| author == BOT)
        .map(|(_, _, body)| body)
        .collect()
}

fn wait_for(what: &str, limit: Duration, done: &dyn Fn() -> bool) {
    let start = Instant::now();
    while !done() {
        assert!(start.elapsed() < limit, "waited for {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn span<'a>(view: &'a rover::store::TraceView, step: &str) -> &'a rover::store::Span {
    view.spans
        .iter()
        .find(|s| s.step.as_str() == step)
        .unwrap_or_else(|| panic!("no {step} span: {:?}", chain(view)))
}

/// Asserts that the trace's `cancel` span is alice's and its reason names `why`.
fn cancelled_by_alice(view: &rover::store::TraceView, why: &str) {
    let cancel = span(view, "cancel");
    assert_eq!(cancel.meta["by"], json!("alice"));
    assert!(
        cancel.meta["reason"].as_str().unwrap().contains(why),
        "{:?}",
        cancel.meta
    );
}

/// The `command` lines of `rover autopilot events --json`.
fn command_events(s: &Scenario) -> Vec<Value> {
    let out = s
        .env
        .rover(&["autopilot", "events", "--json", "--limit", "200"]);
    let all: Vec<Value> = serde_json::from_str(&stdout(&out)).expect("events json");
    all.into_iter()
        .filter(|e| e["outcome"] == json!("command"))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn trusted_commands_report_status_list_help_and_stop_the_running_container() {
    let mut s = Scenario::new().await;
    s.with_sandbox().await;
    s.github
        .add_issue(80, "Add a slow feature", "Please.", "alice", &[]);
    s.github.seed_event("IssuesEvent", "alice", json!({"action": "opened", "issue": {"number": 80, "title": "Add a slow feature", "body": "Please.", "user": {"login": "alice"}}}));
    s.answer(
        COORDINATE,
        coordinate("plan", json!({"directive": "Add a slow feature"})),
    );
    s.answer(PLAN, json!({"analysis": "One task.", "clarification": null, "tasks": [task("t1", "Add the slow feature", &[], "swe")]}));
    s.rules.push(
        json!({"prompt_contains": "## Task: Add the slow feature", "run": ["sleep 120"],
        "structured": {"status": "completed", "summary": "done", "files_changed": []}}),
    );
    s.answer(NOTIFY, json!({"message": "Stopped."}));
    let mut daemon = s.spawn_quiet();
    let limit = Duration::from_secs(90);
    tokio::task::block_in_place(|| {
        wait_for("the workflow container", limit, &|| {
            !s.containers().is_empty()
        });
    });
    let work = s.the_trace().index.trace_id;
    let short = &work.to_string()[..8];
    // Picked up: 👀 on the issue.
    assert!(
        s.github
            .reactions()
            .contains(&("issue:80".into(), BOT.into(), "eyes".into())),
        "{:?}",
        s.github.reactions()
    );

    let status = comment(&s, 80, "alice", "/rover status");
    tokio::task::block_in_place(|| {
        wait_for("the status answer", limit, &|| {
            rovers(&s, 80)
                .iter()
                .any(|b| b.contains("rover autopilot trace"))
        });
    });
    let answer = rovers(&s, 80)
        .into_iter()
        .find(|b| b.contains("rover autopilot trace"))
        .unwrap();
    assert!(
        answer.contains(&format!("Trace `{short}`"))
            && answer.contains("running")
            && answer.contains("workflow (running)")
            && answer.contains("Spent $")
            && answer.contains(&format!("`rover autopilot trace {short}`")),
        "{answer}"
    );

    let help = comment(&s, 80, "bob", "/rover help");
    tokio::task::block_in_place(|| {
        wait_for("the help answer", limit, &|| {
            rovers(&s, 80).iter().any(|b| b.contains("`/rover retry`"))
        });
    });
    assert!(!s.containers().is_empty(), "status and help stop nothing");

    let stop = comment(&s, 80, "alice", "/rover stop");
    tokio::task::block_in_place(|| {
        wait_for("the stopped trace to answer", limit, &|| {
            s.store()
                .load_trace(work)
                .is_ok_and(|v| chain(&v).last().is_some_and(|c| c == "notify:completed"))
        });
        wait_for("the container to go", limit, &|| s.containers().is_empty());
    });
    let _ = daemon.kill();
    let _ = daemon.wait();

    let view = s.store().load_trace(work).unwrap();
    let workflow = span(&view, "workflow");
    assert_eq!(workflow.status, SpanStatus::Error);
    assert_eq!(workflow.meta["closedByHand"], json!(true));
    cancelled_by_alice(&view, "/rover stop on #80");
    // Each command was acknowledged with 👀, and none reached the coordinating agent.
    for id in [status, help, stop] {
        assert!(
            s.github
                .reactions()
                .contains(&(format!("comment:{id}"), BOT.into(), "eyes".into())),
            "comment {id}: {:?}",
            s.github.reactions()
        );
    }
    let commands = command_events(&s);
    let reasons: Vec<&str> = commands
        .iter()
        .map(|e| e["reason"].as_str().unwrap())
        .collect();
    assert_eq!(commands.len(), 3, "{reasons:?}");
    assert!(
        reasons[0].starts_with("/rover status by alice: done"),
        "{reasons:?}"
    );
    assert!(
        reasons[1].starts_with("/rover help by bob: done"),
        "{reasons:?}"
    );
    assert!(
        reasons[2].starts_with("/rover stop by alice: done"),
        "{reasons:?}"
    );
    assert_eq!(commands[2]["traceId"], json!(work.to_string()));
    // The commands were decided by rule: no agent ever saw one.
    for (prompt, _) in crate::support::scenario::prompts(&s) {
        assert!(
            !prompt.contains("/rover status") && !prompt.contains("/rover help"),
            "{prompt}"
        );
    }
}

#[tokio::test]
async fn an_untrusted_author_gets_one_short_answer_and_nothing_else() {
    let s = Scenario::new().await;
    s.github
        .add_issue(81, "Something", "A thing.", "alice", &[]);
    // mallory (read access) tries twice; the second is recorded and not answered.
    comment(&s, 81, "mallory", "/rover stop");
    s.run_once().await;
    comment(&s, 81, "mallory", "/rover retry");
    // rover's own comment, even if it started with the prefix, is never a command.
    s.github.seed_event(
        "IssueCommentEvent",
        BOT,
        json!({"action": "created", "issue": {"number": 81},
        "comment": {"id": 5, "body": "/rover stop", "user": {"login": BOT}, "html_url": "h"}}),
    );
    s.run_once().await;
    assert_eq!(s.agent_calls(), 0, "no agent for an untrusted command");
    let answers = rovers(&s, 81);
    assert_eq!(answers.len(), 1, "{answers:?}");
    assert!(
        answers[0].contains("@mallory rover takes commands only from people with write access"),
        "{}",
        answers[0]
    );
    assert!(s.store().read_state().unwrap().closed.is_empty());
    assert!(
        s.github.reactions().is_empty(),
        "no acknowledgement of an untrusted author: {:?}",
        s.github.reactions()
    );
    let commands = command_events(&s);
    assert_eq!(commands.len(), 2);
    for c in &commands {
        assert!(
            c["reason"]
                .as_str()
                .unwrap()
                .contains("refused (untrusted author"),
            "{c}"
        );
    }
    assert_eq!(s.traces().len(), 2, "rover's own comment started nothing");

    // An unknown command from a trusted author: the short answer, with the commands.
    comment(&s, 81, "alice", "/rover frobnicate now");
    s.run_once().await;
    let answers = rovers(&s, 81);
    assert_eq!(answers.len(), 2, "{answers:?}");
    assert!(
        answers[1].contains("rover does not know `/rover frobnicate`")
            && answers[1].contains("`/rover stop`"),
        "{}",
        answers[1]
    );
    assert_eq!(s.agent_calls(), 0);
}

#[tokio::test]
async fn rover_retry_runs_the_last_failed_step_again() {
    let mut s = Scenario::new().await;
    s.extra_config = json!({"autopilot": {"pipeline": {"maxAttempts": 1, "retryBackoffSecs": 0}}});
    s.github
        .add_issue(82, "Explain the flag", "What does --csv do?", "alice", &[]);
    s.github.seed_event("IssuesEvent", "alice", json!({"action": "opened", "issue": {"number": 82, "title": "Explain the flag", "body": "What does --csv do?", "user": {"login": "alice"}}}));
    // The coordinator crashes the first time; once retried (the trace says so) it decides.
    s.rules.push(
        json!({"prompt_contains": "retried by alice", "structured": coordinate("noop", json!({}))}),
    );
    s.rules
        .push(json!({"prompt_contains": COORDINATE, "mode": "exit_137"}));
    // (A crashed agent is an internal error: the cron run says so with exit 1.)
    for _ in 0..4 {
        s.run_once_raw().await;
        if s.settled() {
            break;
        }
    }
    let work = s.the_trace();
    let failed = span(&work, "coordinate");
    assert_eq!(failed.status, SpanStatus::Error, "{:?}", chain(&work));

    comment(&s, 82, "alice", "/rover retry");
    s.run_until_settled(4).await;
    let view = s.store().load_trace(work.index.trace_id).unwrap();
    let retry = span(&view, "retry");
    assert_eq!(retry.meta["by"], json!("alice"));
    let coordinates: Vec<_> = view
        .spans
        .iter()
        .filter(|sp| sp.step.as_str() == "coordinate")
        .collect();
    assert_eq!(coordinates.len(), 2, "{:?}", chain(&view));
    assert_eq!(coordinates[1].status, SpanStatus::Completed);
    assert_eq!(coordinates[1].meta["decision"], json!("noop"));
    let answers = rovers(&s, 82);
    assert!(
        answers.iter().any(|a| a.contains("Retrying: coordinate")),
        "{answers:?}"
    );
}

/// Where the 👎 goes: rover's pull request, or the comment rover posted on the issue.
#[derive(Clone, Copy, PartialEq)]
enum OnWhat {
    PullRequest,
    Comment,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_trusted_thumbs_down_on_rovers_pull_request_stops_its_trace() {
    thumbs_down_stops(OnWhat::PullRequest).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_trusted_thumbs_down_on_rovers_comment_on_the_thread_stops_the_trace() {
    thumbs_down_stops(OnWhat::Comment).await;
}

async fn thumbs_down_stops(on: OnWhat) {
    let mut s = Scenario::new().await;
    s.with_sandbox().await;
    crate::support::scenario::merge(
        &mut s.extra_config,
        &json!({"autopilot": {"pipeline": {"followCi": true, "ciPollSecs": 300},
            "github": {"reactions": {"pollSecs": 1}}}}),
    );
    csv_issue(&mut s, 30);
    s.answer(NOTIFY, json!({"message": "Stopped."}));
    let mut daemon = s.spawn_quiet();
    let limit = Duration::from_secs(120);
    tokio::task::block_in_place(|| {
        wait_for("rover's pull request", limit, &|| {
            !s.github.pulls().is_empty()
        });
    });
    let pr = s.github.pulls()[0].0;
    let work = s.the_trace().index.trace_id;
    // Still running: the CI of the pull request is followed.
    tokio::task::block_in_place(|| {
        wait_for("the CI watch", limit, &|| {
            s.store()
                .read_state()
                .unwrap()
                .pending
                .iter()
                .any(|p| p.trace_id == work)
        });
    });
    let (target, path, described) = match on {
        OnWhat::PullRequest => (
            format!("issue:{pr}"),
            format!("/issues/{pr}/reactions"),
            format!("#{pr}"),
        ),
        OnWhat::Comment => {
            tokio::task::block_in_place(|| {
                wait_for("rover's comment on the issue", limit, &|| {
                    !rovers(&s, 30).is_empty()
                });
            });
            let id = s
                .github
                .comments_of(30)
                .into_iter()
                .find(|(_, author, _)| author == BOT)
                .unwrap()
                .0;
            (
                format!("comment:{id}"),
                format!("/issues/comments/{id}/reactions"),
                format!("comment {id}"),
            )
        }
    };
    // An untrusted 👎 does nothing...
    s.github.add_reaction(&target, "mallory", "-1");
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(s.store().read_state().unwrap().closed.is_empty());
    // ...a trusted one stops the trace.
    s.github.add_reaction(&target, "alice", "-1");
    tokio::task::block_in_place(|| {
        wait_for("the trace to be stopped", Duration::from_secs(30), &|| {
            s.store().read_state().unwrap().closed.contains_key(&work)
        });
        wait_for("its answer", limit, &|| {
            s.store()
                .load_trace(work)
                .is_ok_and(|v| chain(&v).last().is_some_and(|c| c == "notify:completed"))
        });
    });
    let polls = s
        .github
        .requests()
        .into_iter()
        .filter(|r| r.path.ends_with(&path))
        .collect::<Vec<_>>();
    let _ = daemon.kill();
    let _ = daemon.wait();
    let view = s.store().load_trace(work).unwrap();
    cancelled_by_alice(&view, &format!("alice reacted -1 on {described}"));
    // Polled with the stop reaction only, and with the last ETag: unchanged lists were 304s.
    assert!(polls.iter().all(|r| r.query.contains("content=-1")));
    assert!(
        polls.iter().any(|r| r.status == 304),
        "{:?}",
        polls.iter().map(|r| r.status).collect::<Vec<_>>()
    );
    let commands = command_events(&s);
    assert!(
        commands
            .iter()
            .any(|c| c["via"] == json!("reaction")
                && c["reason"].as_str().unwrap().contains("stopped")),
        "{commands:?}"
    );
}
