//! From pull request to merged (issue 37), through the real binary against the fake GitHub,
//! which merges as GitHub does (`PUT /pulls/{n}/merge` with the head's `sha`, 405/409 when it
//! may not) into the scenario's real git: `dev` merges rover's green pull request at the head
//! that passed; `prod` waits for a trusted person's approval of the current head (a reader's, or
//! one of an older head, does not count); a pull request that changes what steers rover waits
//! for that approval in any mode; a head that moved is followed again before it is merged; a
//! refusal of GitHub's is said in GitHub's words and waited on, never retried blindly.

use serde_json::{json, Value};

use crate::support::fake_github::BOT;
use crate::support::gitrepo::git;
use crate::support::pipeline::first_span;
use crate::support::scenario::{chain, csv_issue, merge, one_task_issue, Scenario, NOTIFY};
use rover::store::TraceView;

/// rover merges in `mode`, follows CI at once, and CI passes on every commit.
fn lifecycle(s: &mut Scenario, mode: &str) {
    merge(
        &mut s.extra_config,
        &json!({"autopilot": {"lifecycle": {"mode": mode},
                              "pipeline": {"followCi": false, "ciPollSecs": 0},
                              "github": {"botLogin": BOT}}}),
    );
    s.github.ci_on_new_commits(&["success"]);
    s.answer(NOTIFY, json!({"message": "Done."}));
}

/// A sandboxed scenario where rover merges in `mode` (`lifecycle`), with `extra` merged into
/// `autopilot.lifecycle`.
async fn in_mode(mode: &str, extra: Value) -> Scenario {
    let mut s = Scenario::new().await;
    s.with_sandbox().await;
    lifecycle(&mut s, mode);
    merge(
        &mut s.extra_config,
        &json!({"autopilot": {"lifecycle": extra}}),
    );
    s
}

/// Issue 30 (`csv_issue`) run until settled (`max` runs at most): its trace.
async fn settled_csv(s: &mut Scenario, max: usize) -> TraceView {
    csv_issue(s, 30);
    s.run_until_settled(max).await;
    s.the_trace()
}

/// The number and branch of the first pull request.
fn first_pull(s: &Scenario) -> (u64, String) {
    let pulls = s.github.pulls();
    (pulls[0].0, pulls[0].1.clone())
}

fn merge_spans(trace: &TraceView) -> Vec<Value> {
    trace
        .spans
        .iter()
        .filter(|sp| sp.step.as_str() == "merge")
        .map(|sp| Value::Object(sp.meta.clone().into_iter().collect()))
        .collect()
}

fn purposes(trace: &TraceView) -> Vec<String> {
    let mut all: Vec<String> = trace
        .spans
        .iter()
        .filter(|sp| sp.step.as_str() == "notify")
        .map(|sp| sp.meta["purpose"].as_str().unwrap_or_default().to_owned())
        .collect();
    all.sort();
    all
}

/// `--once` until the trace's last merge span says `outcome` (at most `max` runs).
async fn until_merge(s: &Scenario, outcome: &str, max: usize) -> TraceView {
    for _ in 0..max {
        s.run_once().await;
        let trace = s.the_trace();
        if merge_spans(&trace)
            .last()
            .is_some_and(|m| m["mergeOutcome"] == outcome)
        {
            return trace;
        }
    }
    let trace = s.the_trace();
    panic!(
        "no merge span `{outcome}` after {max} runs: {:?} {:#?}",
        chain(&trace),
        merge_spans(&trace)
    );
}

/// What each merge span of `trace` decided, in order.
fn merge_outcomes(trace: &TraceView) -> Vec<Value> {
    merge_spans(trace)
        .iter()
        .map(|m| m["mergeOutcome"].clone())
        .collect()
}

/// A person's commit of `file` with `content` lands on `branch` of the origin (on `main`: the
/// base moves on).
fn persons_commit(s: &Scenario, branch: &str, file: &str, content: &str) {
    let clone = s.clone_as("person", "Pat", "pat@example.com");
    if branch != "main" {
        git(&clone, &["fetch", "origin", branch]);
        git(&clone, &["checkout", "-B", branch, "FETCH_HEAD"]);
    }
    std::fs::write(clone.join(file), content).unwrap();
    git(&clone, &["add", file]);
    git(&clone, &["commit", "-m", "theirs"]);
    git(&clone, &["push", "origin", &format!("HEAD:{branch}")]);
}

/// The scheduled merge look of the trace made due now (the time it waits for has passed).
fn look_now(s: &Scenario) {
    let store = s.store();
    let pending: Vec<_> = store
        .read_state()
        .unwrap()
        .pending
        .into_iter()
        .filter(|p| p.action.as_str() == "merge")
        .collect();
    assert_eq!(pending.len(), 1, "one merge waits: {pending:?}");
    assert!(store.wake_pending(pending[0].action_id).unwrap());
}

fn main_has(s: &Scenario, file: &str) -> bool {
    std::process::Command::new("git")
        .args(["cat-file", "-e", &format!("main:{file}")])
        .current_dir(&s.origin)
        .status()
        .unwrap()
        .success()
}

#[tokio::test]
async fn dev_merges_rovers_green_pull_request_at_the_head_that_passed() {
    let mut s = in_mode("dev", json!({})).await;
    let trace = settled_csv(&mut s, 12).await;
    let steps = chain(&trace);
    let push = first_span(&trace, "push");
    let merges = s.github.merges();
    assert_eq!(merges.len(), 1, "{steps:?}");
    let (number, method, head, commit) = &merges[0];
    assert_eq!(method, "squash");
    assert_eq!(
        head,
        push.meta["headSha"].as_str().unwrap(),
        "merged the head whose checks passed"
    );
    let spans = merge_spans(&trace);
    assert_eq!(spans.len(), 1, "{spans:#?}");
    assert_eq!(spans[0]["mergeOutcome"], "merged");
    assert_eq!(spans[0]["mode"], "dev");
    assert_eq!(spans[0]["mergeSha"], commit.as_str());
    assert_eq!(spans[0]["prNumber"], *number);
    let ci = trace
        .spans
        .iter()
        .find(|sp| sp.meta.get("decision").and_then(Value::as_str) == Some("merge"))
        .expect("the CI look decided to merge");
    assert_eq!(ci.meta["ci"]["sha"], push.meta["headSha"]);
    assert_eq!(purposes(&trace), ["merged", "pushed"]);
    assert!(main_has(&s, "csv.txt"), "the work is on main");
    let pulls = s.github.pulls();
    assert_eq!(pulls[0].4, "closed");
    // The answer on the issue says it was merged and is green on main, once main's checks
    // for the merge commit passed.
    assert!(
        s.github.comment_bodies(30).iter().any(|b| b.contains(&format!(
            "Merged pull request #{number} (merge commit {} on `main`); its checks passed on `main`",
            &commit[..12]
        ))),
        "{:?}",
        s.github.comment_bodies(30)
    );
    let after = trace
        .spans
        .iter()
        .find(|sp| sp.meta.get("ci").is_some_and(|c| c["afterMerge"] == true))
        .expect("a look at main after the merge");
    assert_eq!(after.meta["ci"]["sha"], commit.as_str());
    // `trace` shows the merge.
    let shown = s
        .env
        .rover(&["autopilot", "trace", &trace.trace_id().to_string()]);
    let text = crate::support::env::stdout(&shown);
    assert!(
        text.contains("merge ") && text.contains("merged pull request #"),
        "{text}"
    );
}

#[tokio::test]
async fn pr_mode_leaves_the_merge_to_a_person() {
    let mut s = in_mode("pr", json!({})).await;
    merge(
        &mut s.extra_config,
        &json!({"autopilot": {"pipeline": {"followCi": true}}}),
    );
    let trace = settled_csv(&mut s, 12).await;
    assert!(s.github.merges().is_empty());
    assert!(merge_spans(&trace).is_empty());
    assert_eq!(purposes(&trace), ["pushed", "ready"]);
}

#[tokio::test]
async fn prod_merges_only_on_a_trusted_approval_of_the_current_head() {
    // Said on the thread at the first look that waits (and only then).
    let mut s = in_mode("prod", json!({"approvalTimeoutMins": 0})).await;
    csv_issue(&mut s, 30);
    let trace = until_merge(&s, "waiting", 12).await;
    let number = s.github.pulls()[0].0;
    let waiting = merge_spans(&trace);
    assert!(
        waiting[0]["reason"]
            .as_str()
            .unwrap()
            .contains("a trusted person's approval"),
        "{waiting:#?}"
    );
    assert!(s.github.merges().is_empty(), "never on its own");
    let head = s.github.head_of(number);
    // `status` lists the pull request waiting, and for what.
    let shown = crate::support::env::stdout(&s.env.rover(&["autopilot", "status"]));
    assert!(
        shown.lines().any(|l| l.starts_with("later    merge")
            && l.contains(&format!("merge pull request #{number} (look 2)"))
            && l.contains("a trusted person's approval")),
        "{shown}"
    );
    let id = trace.trace_id().to_string();
    assert!(
        shown
            .lines()
            .any(|l| l.starts_with(&format!("waiting  trace {}", &id[..8]))
                && l.contains("waiting to merge:")
                && l.contains("a trusted person's approval")),
        "{shown}"
    );
    let json: Value = serde_json::from_str(&crate::support::env::stdout(&s.env.rover(&[
        "autopilot",
        "status",
        "--json",
    ])))
    .unwrap();
    assert_eq!(json["waiting"][0]["traceId"], id.as_str(), "{json:#}");
    // So does `events`, beside the issue that started it.
    let events = crate::support::env::stdout(&s.env.rover(&["autopilot", "events"]));
    assert!(
        events.lines().any(|l| l.contains("IssuesEvent opened #30")
            && l.contains("waiting to merge")
            && l.contains("a trusted person's approval")),
        "{events}"
    );

    // A reader's approval of the head, and a writer's of an older head, do not count.
    s.github.set_permission("eve", "read");
    s.github.add_review_on(number, "eve", "APPROVED", &head);
    s.github
        .add_review_on(number, "alice", "APPROVED", &"0".repeat(40));
    look_now(&s);
    let trace = until_merge(&s, "waiting", 3).await;
    assert!(s.github.merges().is_empty());
    assert_eq!(merge_spans(&trace).len(), 2);
    assert!(merge_spans(&trace)[1]["approvedBy"].is_null());

    // A writer's approval of the current head does.
    s.github.add_review_on(number, "alice", "APPROVED", &head);
    look_now(&s);
    let trace = until_merge(&s, "merged", 3).await;
    let merges = s.github.merges();
    assert_eq!(merges.len(), 1);
    assert_eq!(merges[0].2, head);
    let last = merge_spans(&trace).pop().unwrap();
    assert_eq!(last["approvedBy"], json!(["alice"]));
    assert_eq!(purposes(&trace), ["flag", "merged", "pushed"], "told once");
    let told: Vec<String> = s
        .github
        .comment_bodies(30)
        .into_iter()
        .filter(|b| b.contains("waits for a merge"))
        .collect();
    assert_eq!(told.len(), 1, "{told:?}");
    assert!(told[0].contains("approval"), "{}", told[0]);
}

#[tokio::test]
async fn a_change_to_what_steers_rover_waits_for_a_trusted_approval_in_dev_too() {
    let mut s = in_mode("dev", json!({})).await;
    one_task_issue(
        &mut s,
        31,
        "Run the tests on push",
        "Please add CI.",
        "Add a CI workflow",
        ".github/workflows/ci.yml",
    );
    let trace = until_merge(&s, "waiting", 12).await;
    let span = merge_spans(&trace).pop().unwrap();
    assert_eq!(span["steeringFiles"], json!([".github/workflows/ci.yml"]));
    assert!(
        span["reason"]
            .as_str()
            .unwrap()
            .contains("changes what steers rover"),
        "{span:#?}"
    );
    assert!(s.github.merges().is_empty());
    let number = s.github.pulls()[0].0;
    let head = s.github.head_of(number);
    s.github.add_review_on(number, "alice", "APPROVED", &head);
    look_now(&s);
    until_merge(&s, "merged", 3).await;
    assert!(main_has(&s, ".github/workflows/ci.yml"));
}

#[tokio::test]
async fn a_head_that_moved_after_its_checks_is_followed_again_before_the_merge() {
    let mut s = in_mode("prod", json!({})).await;
    csv_issue(&mut s, 30);
    until_merge(&s, "waiting", 12).await;
    let (number, branch) = first_pull(&s);
    let passed = s.github.head_of(number);
    // Someone pushes to the branch after its checks passed, and approves the new head.
    persons_commit(&s, &branch, "more.txt", "more\n");
    let moved = s.github.head_of(number);
    assert_ne!(moved, passed);
    s.github.add_review_on(number, "alice", "APPROVED", &moved);
    look_now(&s);
    let trace = until_merge(&s, "merged", 6).await;
    let outcomes = merge_outcomes(&trace);
    assert_eq!(
        outcomes,
        [json!("waiting"), json!("head-moved"), json!("merged")],
        "{:?}",
        chain(&trace)
    );
    let merges = s.github.merges();
    assert_eq!(merges.len(), 1);
    assert_eq!(merges[0].2, moved, "the new head, after its own checks");
}

#[tokio::test]
async fn a_merge_github_refuses_is_said_in_its_words_and_waited_on() {
    let mut s = in_mode("stage", json!({})).await;
    s.github.refuse_next_merge(
        "At least 1 approving review is required by reviewers with write access.",
    );
    csv_issue(&mut s, 30);
    let trace = until_merge(&s, "waiting", 12).await;
    let span = merge_spans(&trace).pop().unwrap();
    assert!(
        span["reason"]
            .as_str()
            .unwrap()
            .contains("GitHub refused the merge (405: At least 1 approving review is required"),
        "{span:#?}"
    );
    assert!(s.github.merges().is_empty());
    // Once the protection is satisfied, the next look merges.
    look_now(&s);
    until_merge(&s, "merged", 3).await;
    assert_eq!(s.github.merges().len(), 1);
}

#[tokio::test]
async fn a_trusted_comment_on_the_pull_request_makes_a_waiting_merge_look_at_once() {
    let mut s = in_mode("prod", json!({})).await;
    csv_issue(&mut s, 30);
    until_merge(&s, "waiting", 12).await;
    let (number, branch) = first_pull(&s);
    let head = s.github.head_of(number);
    s.github.add_review_on(number, "alice", "APPROVED", &head);
    // The merge's next look is a minute away; alice's comment makes it look now.
    let body = "LGTM, approved: merge it";
    comment_on_pull(&mut s, number, "alice", 9001, body);
    s.rules.insert(
        0,
        json!({"prompt_contains": body, "structured": crate::support::scenario::coordinate("noop", json!({}))}),
    );
    s.run_once().await;
    let merges = s.github.merges();
    assert_eq!(merges.len(), 1, "merged in the same run, branch {branch}");
    assert_eq!(merges[0].2, head);
}

#[tokio::test]
async fn the_hourly_merge_cap_holds_across_pull_requests() {
    let mut s = in_mode("dev", json!({"maxMergesPerHour": 1})).await;
    csv_issue(&mut s, 30);
    one_task_issue(
        &mut s,
        31,
        "Add a --tsv flag",
        "Please add --tsv.",
        "Add the tsv flag",
        "tsv.txt",
    );
    let mut capped = None;
    for _ in 0..14 {
        s.run_once().await;
        capped = s.traces().into_iter().find_map(|t| {
            merge_spans(&t)
                .into_iter()
                .find(|m| m["mergeOutcome"] == "waiting")
        });
        if capped.is_some() && s.github.merges().len() == 1 {
            break;
        }
    }
    let capped = capped.expect("the second merge waits");
    assert_eq!(s.github.merges().len(), 1, "one merge in the hour");
    assert!(
        capped["reason"]
            .as_str()
            .unwrap()
            .contains("`lifecycle.maxMergesPerHour`"),
        "{capped:#?}"
    );
}

/// `/rover merge` by `who` on pull request `number`, as a feed event.
fn rover_merge(s: &mut Scenario, number: u64, who: &str, id: u64) {
    comment_on_pull(s, number, who, id, "/rover merge");
}

/// `who`'s comment `id` saying `body` on rover's pull request `number`, as a feed event.
fn comment_on_pull(s: &mut Scenario, number: u64, who: &str, id: u64, body: &str) {
    s.github.add_comment(number, who, body);
    s.github.seed_event("IssueCommentEvent", who, json!({"action": "created",
        "issue": {"number": number, "pull_request": {"url": "u"}, "title": "t", "user": {"login": BOT}},
        "comment": {"id": id, "body": body, "html_url": "h", "user": {"login": who}}}));
}

#[tokio::test]
async fn rover_merge_by_a_trusted_person_approves_the_head_and_a_strangers_is_refused() {
    let mut s = in_mode("prod", json!({})).await;
    csv_issue(&mut s, 30);
    until_merge(&s, "waiting", 12).await;
    let number = s.github.pulls()[0].0;
    let head = s.github.head_of(number);

    // mallory is no collaborator: refused with the reason, nothing approved.
    rover_merge(&mut s, number, "mallory", 9101);
    s.run_once().await;
    assert!(s.github.merges().is_empty());
    assert!(
        s.github.comment_bodies(number).iter().any(|b| b
            .contains("@mallory rover takes commands only from people with write access")),
        "{:?}",
        s.github.comment_bodies(number)
    );

    // alice has write access: an `approve` span in the waiting trace, and the merge is made.
    rover_merge(&mut s, number, "alice", 9102);
    s.run_once().await;
    let merges = s.github.merges();
    assert_eq!(merges.len(), 1);
    assert_eq!(merges[0].2, head);
    let work = s
        .traces()
        .into_iter()
        .find(|t| !merge_spans(t).is_empty())
        .unwrap();
    let approve = first_span(&work, "approve");
    assert_eq!(approve.meta["by"], "alice");
    assert_eq!(approve.meta["headSha"], head.as_str());
    assert_eq!(
        merge_spans(&work).pop().unwrap()["approvedBy"],
        json!(["alice"])
    );
    assert!(
        s.github
            .comment_bodies(number)
            .iter()
            .any(|b| b.contains("Approved by @alice")),
        "{:?}",
        s.github.comment_bodies(number)
    );
}

#[tokio::test]
async fn a_red_main_after_rovers_merge_is_said_on_the_thread_with_the_failing_checks() {
    let mut s = in_mode("dev", json!({})).await;
    // Green on the pull request's head, red on the merge commit on main.
    s.github.ci_on_new_commits(&["success", "failure"]);
    let trace = settled_csv(&mut s, 12).await;
    assert_eq!(s.github.merges().len(), 1);
    let merge_commit = s.github.merges()[0].3.clone();
    let look = after_merge_look(&trace);
    assert_eq!(look.meta["ci"]["sha"], merge_commit.as_str());
    assert_eq!(look.meta["ci"]["branch"], "main");
    assert_eq!(look.meta["decision"], "flag");
    assert_eq!(purposes(&trace), ["flag", "pushed"]);
    let said = s.github.comment_bodies(30);
    assert!(
        said.iter()
            .any(|b| b.contains("but its checks failed on `main`: ci / test")),
        "{said:?}"
    );
    // And on the merged pull request, once.
    let number = s.github.merges()[0].0;
    let on_pull: Vec<String> = s
        .github
        .comment_bodies(number)
        .into_iter()
        .filter(|b| b.contains("but its checks failed on `main`: ci / test"))
        .collect();
    assert_eq!(on_pull.len(), 1, "{:?}", s.github.comment_bodies(number));
    let notify = trace
        .spans
        .iter()
        .rfind(|sp| sp.step.as_str() == "notify")
        .unwrap();
    assert!(
        notify.meta["alsoDelivered"]["url"].as_str().is_some(),
        "{:?}",
        notify.meta
    );
}

#[tokio::test]
async fn without_the_post_merge_watch_the_merge_is_answered_at_once() {
    let mut s = in_mode("dev", json!({"postMergeCi": false})).await;
    let trace = settled_csv(&mut s, 12).await;
    assert_eq!(s.github.merges().len(), 1);
    assert!(!trace
        .spans
        .iter()
        .any(|sp| sp.meta.get("ci").is_some_and(|c| c["afterMerge"] == true)));
    assert_eq!(purposes(&trace), ["merged", "pushed"]);
}

fn release_spans(trace: &TraceView) -> Vec<Value> {
    trace
        .spans
        .iter()
        .filter(|sp| sp.step.as_str() == "release")
        .map(|sp| Value::Object(sp.meta.clone().into_iter().collect()))
        .collect()
}

fn tag_commit(s: &Scenario, tag: &str) -> Option<String> {
    let out = std::process::Command::new("git")
        .args([
            "rev-parse",
            "--verify",
            "--quiet",
            &format!("refs/tags/{tag}^{{commit}}"),
        ])
        .current_dir(&s.origin)
        .output()
        .unwrap();
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

#[tokio::test]
async fn a_green_main_after_rovers_merge_is_released_with_the_next_version_and_its_notes() {
    let mut s = in_mode("dev", json!({"release": {"bump": "minor"}})).await;
    // Releases made by people before: the highest version the template makes counts, not the
    // newest release, nor a tag of another shape.
    s.github
        .add_release("v1.4.2", "main", "2020-01-01T00:00:00Z");
    s.github
        .add_release("v1.3.9", "main", "2019-06-01T00:00:00Z");
    s.github
        .add_release("nightly-2020", "main", "2020-02-01T00:00:00Z");
    let trace = settled_csv(&mut s, 14).await;
    let merges = s.github.merges();
    assert_eq!(merges.len(), 1, "{:?}", chain(&trace));
    let (number, _, _, merge_commit) = &merges[0];
    let releases = s.github.releases();
    assert_eq!(releases.len(), 4, "{releases:?}");
    let (tag, target, notes) = &releases[3];
    assert_eq!(tag, "v1.5.0", "a minor bump of v1.4.2");
    assert_eq!(target, merge_commit, "the merge commit is what is released");
    assert_eq!(
        tag_commit(&s, "v1.5.0").as_deref(),
        Some(merge_commit.as_str()),
        "the tag is on the merge commit"
    );
    let title = &s.github.pulls()[0].2;
    assert!(
        notes.contains("## Pull requests merged since v1.4.2"),
        "{notes}"
    );
    assert!(
        notes.contains(&format!(
            "- {title} (#{number}) https://github.com/octo-org/widgets/pull/{number}"
        )),
        "{notes}"
    );
    let spans = release_spans(&trace);
    assert_eq!(spans.len(), 1, "{spans:#?}");
    assert_eq!(spans[0]["releaseOutcome"], "released");
    assert_eq!(spans[0]["tag"], "v1.5.0");
    assert_eq!(spans[0]["previousTag"], "v1.4.2");
    assert_eq!(spans[0]["sha"], merge_commit.as_str());
    assert_eq!(spans[0]["pulls"], json!([number]));
    let look = after_merge_look(&trace);
    assert_eq!(look.meta["decision"], "release");
    assert_eq!(purposes(&trace), ["merged", "pushed"]);
    let said = s.github.comment_bodies(30);
    assert!(
        said.iter()
            .any(|b| b.contains("its checks passed on `main`")
                && b.contains(
                    "Released as v1.5.0 (https://github.com/octo-org/widgets/releases/tag/v1.5.0)"
                )),
        "{said:?}"
    );
    let id = trace.trace_id().to_string();
    let shown = crate::support::env::stdout(&s.env.rover(&["autopilot", "trace", &id]));
    assert!(
        shown.contains("release") && shown.contains("v1.5.0"),
        "{shown}"
    );
}

/// The merge and the release replay like the deciding steps: GitHub's answers (the merge
/// call's and the release's included), the clock, the store's recent merges and the repository
/// come from the record, nothing is sent; a maintainer who switches the mode to `prod` sees the
/// merge diverge (it would wait for an approval) and nothing after it replayed as if merged.
#[tokio::test]
async fn the_merge_and_the_release_replay_the_same_and_a_changed_mode_diverges_at_the_merge() {
    let mut s = in_mode(
        "dev",
        json!({"release": {"tag": "v{major}.{minor}.{patch}"}}),
    )
    .await;
    csv_issue(&mut s, 30);
    s.run_until_settled(14).await;
    assert_eq!(s.github.merges().len(), 1);
    assert_eq!(s.github.releases().len(), 1);
    let trace = s.the_trace();
    let merge_span = trace
        .spans
        .iter()
        .find(|sp| sp.step.as_str() == "merge")
        .unwrap()
        .id
        .to_string();

    let (folder, report) = crate::support::replay::assert_replays_clean(&s).await;
    let steps = report["traces"][0]["replay"]["steps"].as_array().unwrap();
    let replayed = |step: &str| {
        steps
            .iter()
            .find(|st| st["step"] == step)
            .unwrap_or_else(|| panic!("no {step} in {steps:#?}"))
            .clone()
    };
    let merged = replayed("merge");
    assert_eq!(merged["how"], "replayed", "{merged:#}");
    assert_eq!(merged["replayed"]["outcome"], "merged", "{merged:#}");
    let released = replayed("release");
    assert_eq!(released["how"], "replayed", "{released:#}");
    assert_eq!(
        released["replayed"]["outcome"], "released v0.0.1",
        "{released:#}"
    );

    let path = s.checkout.join("rover.json");
    let mut config: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    config["autopilot"]["lifecycle"]["mode"] = json!("prod");
    std::fs::write(&path, serde_json::to_string_pretty(&config).unwrap()).unwrap();
    let before = s.github.requests().len();
    let (code, report) = crate::support::replay::replay_dir(&s, &folder, &[]).await;
    assert_eq!(s.github.requests().len(), before, "nothing sent");
    assert_eq!(code, 1, "{report:#}");
    let t = &report["traces"][0]["replay"];
    assert_eq!(t["firstDivergence"], merge_span.as_str(), "{t:#}");
    let diverged = t["steps"]
        .as_array()
        .unwrap()
        .iter()
        .find(|st| st["spanId"] == merge_span.as_str())
        .unwrap();
    assert_eq!(diverged["recorded"]["outcome"], "merged", "{diverged:#}");
    assert_eq!(diverged["replayed"]["outcome"], "waiting", "{diverged:#}");
    // Put back, so the scenario's own replay check at the end holds.
    config["autopilot"]["lifecycle"]["mode"] = json!("dev");
    std::fs::write(&path, serde_json::to_string_pretty(&config).unwrap()).unwrap();
}

#[tokio::test]
async fn a_red_main_is_never_released() {
    let mut s = in_mode("dev", json!({"release": {}})).await;
    s.github.ci_on_new_commits(&["success", "failure"]);
    let trace = settled_csv(&mut s, 12).await;
    assert_eq!(s.github.merges().len(), 1);
    assert!(s.github.releases().is_empty(), "{:?}", s.github.releases());
    assert!(release_spans(&trace).is_empty());
    assert_eq!(purposes(&trace), ["flag", "pushed"]);
}

#[tokio::test]
async fn a_release_github_refuses_is_said_and_the_merge_still_answered() {
    let mut s = in_mode(
        "dev",
        json!({"release": {"tag": "rel-{major}.{minor}.{patch}"}}),
    )
    .await;
    // A tag of the next version exists in the repository without a release.
    let tagged = std::process::Command::new("git")
        .args(["tag", "rel-0.0.1", "main"])
        .current_dir(&s.origin)
        .status()
        .unwrap();
    assert!(tagged.success());
    let trace = settled_csv(&mut s, 14).await;
    assert_eq!(s.github.merges().len(), 1);
    assert!(s.github.releases().is_empty());
    let spans = release_spans(&trace);
    assert_eq!(spans.len(), 1, "{spans:#?}");
    assert_eq!(spans[0]["releaseOutcome"], "refused");
    assert!(
        spans[0]["reason"]
            .as_str()
            .unwrap()
            .contains("GitHub refused the release rel-0.0.1"),
        "{spans:#?}"
    );
    assert_eq!(purposes(&trace), ["flag", "pushed"]);
    let said = s.github.comment_bodies(30);
    assert!(
        said.iter()
            .any(|b| b.contains("its checks passed on `main`")
                && b.contains("It was not released: GitHub refused the release rel-0.0.1")),
        "{said:?}"
    );
}

/// The scripted fix of a red main: the coordinator of rover's own fix trace hands one task to a
/// workflow that writes `main-fixed.txt` (ahead of the issue's rules: the first match answers).
fn script_the_fix(s: &mut Scenario) {
    use crate::support::scenario::{coordinate, task, workflow_rule};
    s.rules.insert(
        0,
        json!({"prompt_contains": "after rover's merge the checks",
               "structured": coordinate("workflow", json!({"task": task("fix", "Restore the main checks", &[], "swe")}))}),
    );
    s.rules.insert(
        0,
        workflow_rule(
            "Restore the main checks",
            json!({"main-fixed.txt": "fixed\n"}),
            "completed",
        ),
    );
}

/// Issue 30 in `dev` with `onRedMain` = `how` (`fix`: rover's fix scripted), CI answering `ci`
/// on the new commits in turn, run until settled: the scenario and its two traces (the
/// issue's, rover's fix or revert).
async fn red_main(how: &str, ci: &[&str]) -> (Scenario, Vec<TraceView>) {
    let mut s = in_mode("dev", json!({"onRedMain": how})).await;
    s.github.ci_on_new_commits(ci);
    csv_issue(&mut s, 30);
    if how == "fix" {
        script_the_fix(&mut s);
    }
    s.run_until_settled(24).await;
    let traces = s.traces();
    assert_eq!(
        traces.len(),
        2,
        "the issue's and rover's {how}: {:?}",
        traces.iter().map(chain).collect::<Vec<_>>()
    );
    (s, traces)
}

/// The trace's last look at main after a merge.
fn after_merge_look(trace: &TraceView) -> &rover::store::Span {
    trace
        .spans
        .iter()
        .rfind(|sp| sp.meta.get("ci").is_some_and(|c| c["afterMerge"] == true))
        .expect("a look at main after the merge")
}

/// Checks that `origin`'s look at main after its merge flagged main red and started
/// `follow_up`, whose root is of `kind` and follows `origin`; returns that root's meta.
fn assert_started<'a>(
    origin: &TraceView,
    follow_up: &'a TraceView,
    kind: &str,
) -> &'a rover::store::Meta {
    let look = after_merge_look(origin);
    assert_eq!(look.meta["decision"], "flag");
    assert_eq!(
        look.meta["startedTrace"],
        follow_up.trace_id().to_string(),
        "the red look links the {kind}"
    );
    let root = &follow_up.root().expect("the follow-up's root").meta;
    assert_eq!(root["type"], kind);
    assert_eq!(root["follows"], origin.trace_id().to_string());
    root
}

/// Checks that the pull request whose branch has `branch_part` in its name says `body`.
fn assert_pull_body(s: &Scenario, branch_part: &str, body: &str) {
    let pulls = s.github.pulls();
    let pull = pulls
        .iter()
        .find(|p| p.1.contains(branch_part))
        .unwrap_or_else(|| panic!("the pull request of `{branch_part}`"));
    assert!(pull.3.contains(body), "{}", pull.3);
}

/// Checks that `follow_up`'s look at main after its merge found main green again, and that
/// issue 30 was told main's checks failed and that rover started `follow_up` to `what`.
fn assert_green_again(s: &Scenario, follow_up: &TraceView, what: &str) {
    assert_eq!(
        after_merge_look(follow_up).meta["decision"],
        "notify",
        "main is green again"
    );
    let said = s.github.comment_bodies(30);
    assert!(
        said.iter()
            .any(|b| b.contains("but its checks failed on `main`: ci / test")
                && b.contains(&format!(
                    "rover started trace {} to {what}",
                    &follow_up.trace_id().to_string()[..8]
                ))),
        "{said:?}"
    );
}

/// Checks that `follow_up`'s look at main after its merge, red again, flagged it saying
/// `not_again` and started nothing, with two merges in all.
fn assert_not_again(s: &Scenario, follow_up: &TraceView, not_again: &str) {
    let look = after_merge_look(follow_up);
    assert_eq!(look.meta["decision"], "flag");
    assert!(look.meta.get("startedTrace").is_none());
    assert!(
        look.summary.as_deref().unwrap().contains(not_again),
        "{:?}",
        look.summary
    );
    assert_eq!(s.github.merges().len(), 2);
}

#[tokio::test]
async fn a_red_main_after_rovers_merge_starts_rovers_own_fix_which_is_merged_in_turn() {
    // The issue's pull request green, its merge red on main; the fix green, its merge green.
    let (s, traces) = red_main("fix", &["success", "failure", "success", "success"]).await;
    let (origin, fix) = (&traces[0], &traces[1]);
    let root = assert_started(origin, fix, "RedMainFix");
    assert!(
        root["request"].as_str().unwrap().contains("ci / test"),
        "{root:?}"
    );
    let merges = s.github.merges();
    assert_eq!(
        merges.len(),
        2,
        "the fix went through the same mode: {merges:?} {:#?}",
        fix.spans
            .iter()
            .map(|s| (s.step.to_string(), s.summary.clone()))
            .collect::<Vec<_>>()
    );
    assert!(main_has(&s, "main-fixed.txt"), "the fix is on main");
    assert_pull_body(
        &s,
        "restore-the-main-checks",
        "rover's own fix of a red base branch. Fix `main`: rover merged pull request #31",
    );
    let steps = chain(fix);
    for step in ["workflow", "push", "merge"] {
        assert!(steps.iter().any(|s| s.starts_with(step)), "{steps:?}");
    }
    assert_green_again(&s, fix, "fix `main`");
}

#[tokio::test]
async fn a_fix_that_leaves_main_red_again_is_answered_not_fixed_again() {
    // The fix's merge leaves main red again: no fix of the fix.
    let (s, traces) = red_main("fix", &["success", "failure", "success", "failure"]).await;
    let fix = &traces[1];
    assert_not_again(&s, fix, "it is not fixed again; a person should look");
    // The fix's trace is local, its merged pull request is not: the answer goes there too.
    let fix_pull = s.github.merges()[1].0;
    let said = s.github.comment_bodies(fix_pull);
    assert!(
        said.iter()
            .any(|b| b.contains("it is not fixed again; a person should look")),
        "{said:?}"
    );
}

#[tokio::test]
async fn a_red_main_after_rovers_merge_is_reverted_in_a_pull_request_merged_in_turn() {
    // The issue's pull request green, its merge red on main; the revert green, its merge green.
    let (s, traces) = red_main("revert", &["success", "failure", "success", "success"]).await;
    let (origin, revert) = (&traces[0], &traces[1]);
    let root = assert_started(origin, revert, "RedMainRevert");
    let merged_first = s.github.merges()[0].clone();
    assert_eq!(root["reverts"]["prNumber"], merged_first.0);
    // Decided by rule and reverted by git: no agent wrote the change.
    let coordinate = first_span(revert, "coordinate");
    assert_eq!(coordinate.meta["decision"], "workflow");
    assert_eq!(coordinate.meta["decidedBy"], "rule");
    let workflow = first_span(revert, "workflow");
    assert!(
        workflow
            .summary
            .as_deref()
            .unwrap()
            .contains("no agent ran"),
        "{:?}",
        workflow.summary
    );
    assert!(workflow.meta.get("launched").is_none(), "no container");
    let commit = first_span(revert, "commit");
    assert_eq!(commit.meta["messageSource"], "rule");
    assert_eq!(
        s.github.merges().len(),
        2,
        "the revert went through the same mode"
    );
    assert!(
        !main_has(&s, "csv.txt"),
        "the merge's change is taken back on main"
    );
    let subjects = crate::support::gitrepo::git(&s.origin, &["log", "--format=%s", "main"]);
    assert!(
        subjects.contains(&format!("Revert pull request #{}", merged_first.0)),
        "{subjects}"
    );
    assert_pull_body(
        &s,
        "revert-pull-request",
        "rover's own revert of a red base branch. Revert pull request #",
    );
    assert_green_again(&s, revert, "revert merge commit");
}

#[tokio::test]
async fn a_revert_that_leaves_main_red_again_is_answered_not_reverted_again() {
    let (s, traces) = red_main("revert", &["success", "failure", "success", "failure"]).await;
    let revert = &traces[1];
    assert_not_again(&s, revert, "it is not reverted again; a person should look");
}

#[tokio::test]
async fn a_branch_behind_its_base_is_brought_up_to_date_and_merged_after_its_new_checks() {
    let mut s = in_mode("stage", json!({})).await;
    s.github.require_up_to_date();
    // Held once by the protection, while a person's commit lands on main.
    s.github.refuse_next_merge("Waiting on code owner review");
    csv_issue(&mut s, 30);
    until_merge(&s, "waiting", 12).await;
    let number = s.github.pulls()[0].0;
    let passed = s.github.head_of(number);
    persons_commit(&s, "main", "theirs.txt", "theirs\n");

    // The next look: GitHub refuses a branch that is behind; rover brings it up to date.
    look_now(&s);
    let trace = until_merge(&s, "updated", 3).await;
    let updated = merge_spans(&trace).pop().unwrap();
    assert!(
        updated["reason"]
            .as_str()
            .unwrap()
            .contains("(405: Head branch is out of date): the branch is behind `main`; rover brought it up to date"),
        "{updated:#?}"
    );
    let new_head = s.github.head_of(number);
    assert_ne!(new_head, passed, "GitHub merged main into the branch");
    assert!(s.github.merges().is_empty());

    // Its new head's checks first, then the merge of that head.
    look_now(&s);
    let trace = until_merge(&s, "merged", 6).await;
    let outcomes = merge_outcomes(&trace);
    assert_eq!(
        outcomes,
        [
            json!("waiting"),
            json!("updated"),
            json!("head-moved"),
            json!("merged")
        ],
        "{:?}",
        chain(&trace)
    );
    let merges = s.github.merges();
    assert_eq!(merges.len(), 1);
    assert_eq!(merges[0].2, new_head, "the updated head, after its checks");
    assert!(main_has(&s, "csv.txt") && main_has(&s, "theirs.txt"));
    let looks: Vec<&str> = trace
        .spans
        .iter()
        .filter_map(|sp| sp.meta.get("ci").and_then(|c| c["sha"].as_str()))
        .collect();
    assert!(
        looks.contains(&new_head.as_str()),
        "the new head's checks were looked at: {looks:?}"
    );
}

/// A branch behind its base that conflicts with it: GitHub cannot bring it up to date, so the
/// merge hands the conflict (the files named by rover's own in-memory merge) to the resolver,
/// which iterates on the task: rover merges the base into its worktree, the agent resolves the
/// markers, the commit records the merge, the push goes on top (never forced), and the new
/// head is merged after its checks.
#[tokio::test]
async fn a_branch_that_conflicts_with_its_moved_base_goes_to_the_resolver_and_is_merged_once_resolved(
) {
    let mut s = in_mode("stage", json!({})).await;
    s.github.require_up_to_date();
    s.github.refuse_next_merge("Waiting on code owner review");
    csv_issue(&mut s, 30);
    // Ahead of the issue's own script (first match wins): the resolver iterates on the
    // conflict, the iteration keeps both sides, and the resolver pushes what it committed.
    for rule in [
        json!({"prompt_contains": "Resolve every conflict marker", "write": {"csv.txt": "Add the csv flag\ntheirs --csv\n"},
            "structured": {"status": "completed", "summary": "kept both sides of csv.txt", "files_changed": ["csv.txt"]}}),
        json!({"prompt_contains": "kept both sides", "structured": crate::support::scenario::resolve("push", json!({}))}),
        json!({"prompt_contains": "merge conflict", "structured": crate::support::scenario::resolve("iterate", json!({"instructions": "Keep both."}))}),
    ]
    .into_iter()
    .rev()
    {
        s.rules.insert(0, rule);
    }
    until_merge(&s, "waiting", 12).await;
    let number = s.github.pulls()[0].0;
    let passed = s.github.head_of(number);
    persons_commit(&s, "main", "csv.txt", "theirs --csv\n");

    look_now(&s);
    let trace = until_merge(&s, "merged", 12).await;
    let outcomes = merge_outcomes(&trace);
    assert_eq!(
        outcomes,
        [json!("waiting"), json!("conflict"), json!("merged")],
        "{:?}",
        chain(&trace)
    );
    let conflict = merge_spans(&trace)[1].clone();
    assert_eq!(
        conflict["conflict"],
        json!({"sourceBranch": conflict["conflict"]["sourceBranch"], "target": "origin/main", "files": ["csv.txt"], "base": true}),
        "{conflict:#?}"
    );
    assert!(
        conflict["reason"].as_str().unwrap().contains(
            "conflicts with it (GitHub's update-branch: merge conflict between base and head)"
        ),
        "{conflict:#?}"
    );
    let resolve = trace
        .spans
        .iter()
        .find(|sp| sp.step.as_str() == "resolve" && sp.meta.get("conflict").is_some())
        .expect("the resolver decided on the conflict");
    assert_eq!(resolve.meta["decision"], "iterate", "{:?}", resolve.meta);
    let iteration = trace
        .actions
        .iter()
        .find(|a| a.action.as_str() == "workflow" && a.meta.get("mergeFrom").is_some())
        .expect("an iteration that merges the base in");
    assert_eq!(iteration.meta["mergeFrom"], "refs/remotes/origin/main");
    let instructions = iteration.meta["instructions"].as_str().unwrap();
    assert!(
        instructions
            .contains("conflicts with `origin/main`, the base branch its pull request merges into")
            && instructions.contains("the conflicting files are: \"csv.txt\""),
        "{instructions}"
    );
    let merges = s.github.merges();
    assert_eq!(merges.len(), 1, "{merges:?}");
    let merged_head = &merges[0].2;
    assert_ne!(merged_head, &passed);
    // The old head is in the new one's history: pushed on top, never forced.
    git(
        &s.origin,
        &["merge-base", "--is-ancestor", &passed, merged_head],
    );
    let parents = git(&s.origin, &["log", "-1", "--format=%P", merged_head]);
    assert_eq!(parents.split(' ').count(), 2, "a merge commit: {parents}");
    let shipped = git(&s.origin, &["show", "main:csv.txt"]);
    assert_eq!(shipped, "Add the csv flag\ntheirs --csv");
    assert!(!shipped.contains("<<<<<<<"));
}

/// The whole lifecycle as a service runs it: `rover autopilot start` (not `--once`) takes the
/// issue to a plan, a workflow in a container, a commit, a push, a green pull request, the merge,
/// a green look at main and the release, each a span of the one trace, each answer on the thread.
#[tokio::test]
async fn through_the_daemon_an_issue_is_merged_green_on_main_and_released() {
    let mut s = in_mode("dev", json!({})).await;
    merge(
        &mut s.extra_config,
        &json!({"autopilot": {
            "lifecycle": {"release": {"tag": "v{major}.{minor}.{patch}"}},
            "pipeline": {"selfReview": true}
        }}),
    );
    // The reviewer approves in its container, before the push.
    s.rules.push(
        json!({"prompt_contains": "## Change under review: Add the csv flag",
        "structured": {"verdict": "approve", "summary": "The flag is there.", "findings": []}}),
    );
    csv_issue(&mut s, 30);
    s.run_daemon_until_settled(std::time::Duration::from_secs(240), || {})
        .await;

    let trace = s.the_trace();
    let steps: Vec<String> = trace.spans.iter().map(|sp| sp.step.to_string()).collect();
    let mut order = steps.iter().filter(|st| *st != "collect");
    for want in [
        "event",
        "coordinate",
        "plan",
        "workflow",
        "commit",
        "resolve",
        "review",
        "push",
        "coordinate",
        "merge",
        "coordinate",
        "release",
        "notify",
    ] {
        assert!(order.any(|st| st == want), "`{want}` in order in {steps:?}");
    }
    let review = trace
        .spans
        .iter()
        .find(|sp| sp.step.as_str() == "review")
        .expect("a review span");
    assert_eq!(
        review.meta["reviews"][0]["verdict"], "approve",
        "{:?}",
        review.meta
    );
    let (number, _, _, merge_commit) = s.github.merges()[0].clone();
    let pulls = s.github.pulls();
    let pr_body = &pulls
        .iter()
        .find(|p| p.0 == number)
        .expect("the merged pull")
        .3;
    assert!(pr_body.contains("## Self-review"), "{pr_body}");
    let releases = s.github.releases();
    assert_eq!(releases.len(), 1, "{releases:?}");
    assert_eq!(releases[0].0, "v0.0.1");
    assert_eq!(releases[0].1, merge_commit);
    let said = s.github.comment_bodies(30);
    assert!(
        said.iter().any(|b| b.contains(&format!("pull/{number}"))),
        "the pull request was announced: {said:?}"
    );
    assert!(
        said.iter()
            .any(|b| b.contains("its checks passed on `main`") && b.contains("Released as v0.0.1")),
        "{said:?}"
    );
}

#[tokio::test]
async fn checks_that_do_not_finish_within_the_ci_timeout_are_said_and_not_merged() {
    let mut s = in_mode("dev", json!({"ciTimeoutMins": 0})).await;
    s.github.ci_on_new_commits(&["in_progress"]);
    let trace = settled_csv(&mut s, 12).await;
    assert!(s.github.merges().is_empty(), "{:?}", chain(&trace));
    assert!(merge_spans(&trace).is_empty());
    let look = trace
        .spans
        .iter()
        .rfind(|sp| sp.meta.get("ci").is_some())
        .expect("a look at the pull request's checks");
    assert_eq!(look.meta["decision"], "notify");
    assert_eq!(purposes(&trace), ["flag", "pushed"]);
    let said = s.github.comment_bodies(30);
    assert!(
        said.iter().any(|b| b.contains("were not done at rover's first look (`lifecycle.ciTimeoutMins`): rover does not merge it")
            && b.contains("a person can merge it once it is green")),
        "{said:?}"
    );
}
