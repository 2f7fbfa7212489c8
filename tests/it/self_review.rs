//! The self-review before every push (issue 37, item 5), through the real binary: the reviewer
//! runs in a real container over the task's worktree (the fake agent as `claude` in the
//! scenario image), reads the diff against the acceptance criteria, and its verdict decides:
//! `changes` goes back to the task as an iterate with the findings, a second review approves
//! and the work is pushed with what the review checked in the pull request body; `changes`
//! past `maxRetries` ends the trace as given up, the findings in its answer. Nothing the
//! reviewer writes in its container reaches the worktree.

use serde_json::{json, Value};

use crate::support::gitrepo::git;
use crate::support::pipeline::{first_span, last_span};
use crate::support::scenario::{csv_issue, merge, Scenario, NOTIFY};
use crate::support::script::{prompts_with, spans_of, workflow_actions};

/// The reviewer's prompt heading for the csv task.
const REVIEW_CSV: &str = "## Change under review: Add the csv flag";

/// The scenario of issue 30 ("Add a --csv flag", one task writing `csv.txt`) in real
/// containers with the self-review on, `maxRetries` = `max_retries`. The reviewer asks for a
/// test of the flag until the diff has `csv_test.txt`, and writes into its own copy of the
/// worktree each time (nothing of that may come back); an iterate with its findings writes
/// the test. The answer at the end is `answer`.
async fn reviewed_csv(max_retries: u32, approves_a_test: bool, answer: &str) -> Scenario {
    let mut s = Scenario::new().await;
    s.with_sandbox().await;
    merge(
        &mut s.extra_config,
        &json!({"autopilot": {"pipeline": {"selfReview": true, "maxRetries": max_retries}}}),
    );
    if approves_a_test {
        s.rules.push(json!({"prompt_contains": [REVIEW_CSV, "csv_test.txt"],
            "structured": {"verdict": "approve", "summary": "The flag and its test are there.", "findings": []}}));
    }
    s.rules.push(json!({"prompt_contains": REVIEW_CSV,
        "write": {"csv.txt": "written by the reviewer\n", "reviewer.txt": "x\n"},
        "structured": {"verdict": "changes", "summary": "The flag has no test.",
            "findings": [{"file": "csv.txt", "line": 1, "what": "nothing tests --csv", "why": "criterion: Add the csv flag is done, with a test"}]}}));
    // The iterate that carries the findings writes the test.
    s.rules.push(json!({"prompt_contains": "rover's self-review read this change",
        "write": {"csv_test.txt": "test --csv\n"},
        "structured": {"status": "completed", "summary": "Added a test of --csv.", "files_changed": ["csv_test.txt"]}}));
    csv_issue(&mut s, 30);
    s.answer_notify(answer);
    s
}

/// The meta of each of the trace's review spans, in order.
fn reviews(trace: &rover::store::TraceView) -> Vec<Value> {
    spans_of(trace, "review")
        .into_iter()
        .map(|sp| Value::Object(sp.meta.clone().into_iter().collect()))
        .collect()
}

#[tokio::test]
async fn a_change_missing_a_criterion_gets_changes_the_iterate_fixes_it_and_the_second_review_approves(
) {
    let s = reviewed_csv(3, true, "Opened a PR for --csv.").await;
    let trace = s
        .settle_as(
            16,
            "event coordinate plan workflow commit resolve review resolve workflow commit resolve review push notify",
        )
        .await;
    let reviews = reviews(&trace);
    assert_eq!(reviews.len(), 2);
    let first = &reviews[0]["reviews"][0];
    assert_eq!(first["verdict"], "changes", "{first}");
    assert_eq!(first["findings"][0]["file"], "csv.txt");
    assert_eq!(first["criteria"], json!(["Add the csv flag is done"]));
    assert!(first["agent"].is_object(), "the call's figures: {first}");
    let second = &reviews[1]["reviews"][0];
    assert_eq!(second["verdict"], "approve", "{second}");
    assert_ne!(
        first["head"], second["head"],
        "the second review read the new head"
    );
    // The resolver iterated on the findings without asking its agent.
    let resolves = spans_of(&trace, "resolve");
    assert_eq!(resolves[1].meta["quickExit"], "reviewChanges");
    assert_eq!(resolves[1].meta["decision"], "iterate");
    let workflows = workflow_actions(&trace);
    let iterate = workflows.get(1).expect("the iterate");
    let instructions = iterate.meta["instructions"].as_str().unwrap();
    assert!(
        instructions.contains(
            "- csv.txt:1: nothing tests --csv (criterion: Add the csv flag is done, with a test)"
        ),
        "{instructions}"
    );
    // What went out: the change and its test, nothing the reviewer wrote in its container.
    let pulls = s.github.pulls();
    assert_eq!(pulls.len(), 1);
    let branch = &pulls[0].1;
    let shipped = |file: &str| crate::support::gitrepo::show(&s.origin, branch, file);
    assert_eq!(shipped("csv.txt"), "Add the csv flag");
    assert_eq!(shipped("csv_test.txt"), "test --csv");
    let files = git(&s.origin, &["ls-tree", "-r", "--name-only", branch]);
    assert!(!files.contains("reviewer.txt"), "{files}");
    // The pull request says what the self-review checked.
    let body = &pulls[0].3;
    assert!(body.contains("## Self-review"), "{body}");
    assert!(
        body.contains("approved after one round of changes. The flag and its test are there."),
        "{body}"
    );
    assert!(body.contains("  - [x] Add the csv flag is done"), "{body}");
    // `trace` shows the verdicts and the finding.
    let shown = crate::support::env::stdout(
        &s.env
            .command(&["autopilot", "trace", &trace.trace_id().to_string()])
            .current_dir(&s.checkout)
            .output()
            .unwrap(),
    );
    assert!(
        shown.contains("changes: Add the csv flag at ")
            && shown.contains("  - csv.txt:1: nothing tests --csv")
            && shown.contains("approve: Add the csv flag at "),
        "{shown}"
    );
    // The review's cost counts for the budget like any agent call's.
    let review = first_span(&trace, "review");
    assert!(review.meta["agent"].is_object(), "{:?}", review.meta);
}

#[tokio::test]
async fn a_review_that_asks_for_changes_past_max_retries_gives_up_with_the_findings_in_the_answer()
{
    let s = reviewed_csv(1, false, "I could not finish --csv.").await;
    let trace = s
        .settle_as(
            16,
            "event coordinate plan workflow commit resolve review resolve workflow commit resolve review resolve notify",
        )
        .await;
    assert!(s.github.pulls().is_empty(), "nothing was pushed");
    let last_resolve = last_span(&trace, "resolve");
    assert_eq!(last_resolve.meta["decision"], "fail");
    let reasoning = last_resolve.meta["reasoning"].as_str().unwrap();
    assert!(
        reasoning.starts_with("gave up after 1 iterate/retry attempts (the limit is 1)"),
        "{reasoning}"
    );
    // The notifier is told the findings, and the answer is posted.
    let notify_prompt = prompts_with(&s, NOTIFY).pop().unwrap();
    assert!(
        notify_prompt.contains("csv.txt:1: nothing tests --csv"),
        "{notify_prompt}"
    );
    let comments = s.github.comments_of(30);
    assert!(
        comments
            .iter()
            .any(|c| c.2.contains("I could not finish --csv.")),
        "{comments:?}"
    );
}

#[tokio::test]
async fn a_mounted_worktree_is_read_only_to_the_reviewer_and_a_review_without_verdict_lets_the_push_go(
) {
    let mut s = reviewed_csv(3, false, "Opened a PR for --csv.").await;
    merge(
        &mut s.extra_config,
        &json!({"autopilot": {"sandbox": {"workspace": "mounted"}}}),
    );
    let trace = s
        .settle_as(
            12,
            "event coordinate plan workflow commit resolve review:failed resolve push notify",
        )
        .await;
    // The reviewer's write met the read-only mount: the run gave no verdict, and says why.
    let review = first_span(&trace, "review");
    let error = review.meta["error"].to_string();
    assert!(error.contains("Read-only file system"), "{error}");
    assert!(
        review
            .summary
            .as_deref()
            .unwrap_or_default()
            .contains("gave no verdict"),
        "{:?}",
        review.summary
    );
    let pulls = s.github.pulls();
    assert_eq!(pulls.len(), 1);
    let branch = &pulls[0].1;
    assert_eq!(
        crate::support::gitrepo::show(&s.origin, branch, "csv.txt"),
        "Add the csv flag"
    );
    assert!(!pulls[0].3.contains("## Self-review"), "{}", pulls[0].3);
}
