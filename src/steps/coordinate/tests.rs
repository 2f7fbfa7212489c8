use super::gather::event_json;
use super::*;
use crate::agents::CoordinateDecision;
use crate::github::Channel;
use crate::github::{CiState, CiStatus, NormalizedEvent};
use crate::steps::agent_call::MappedTask;
use crate::steps::meta::subject_key;
use crate::store::TaskMapping;
use uuid::Uuid;

fn mapping(task: &str, branch: &str) -> TaskMapping {
    TaskMapping::new(task, branch, Uuid::new_v4(), Uuid::new_v4())
}

fn answer(decision: CoordinateDecision) -> CoordinateResult {
    CoordinateResult {
        decision,
        confidence: 0.5,
        reasoning: "why".into(),
        directive: Some("do it".into()),
        task: None,
        message: None,
        condition: Some("CI to finish".into()),
        task_id: Some("t-9".into()),
    }
}

fn gathered(rover_pr: Option<RoverPr>) -> Gathered {
    Gathered {
        event: String::new(),
        context: String::new(),
        subject: Some("refs/heads/main".into()),
        rover_pr,
        merged: false,
        open_waits: Vec::new(),
        trust: None,
        wait_round: 0,
        head_sha: Some("abc123".into()),
    }
}

fn policy() -> WaitPolicy {
    WaitPolicy {
        secs: 1800,
        max: 2,
        now: DateTime::parse_from_rfc3339("2026-01-02T03:04:05Z")
            .unwrap()
            .with_timezone(&Utc),
    }
}

fn ci(state: CiState, failing: &[&str], total: usize) -> CiStatus {
    CiStatus {
        sha: "abc".into(),
        state,
        failing: failing.iter().map(|s| (*s).to_owned()).collect(),
        pending: Vec::new(),
        total,
    }
}

#[test]
fn ci_red_goes_to_the_resolver_green_notifies_pending_looks_again() {
    assert_eq!(
        ci_verdict(&ci(CiState::Failure, &["ci / test"], 2), 1, 5),
        CiVerdict::Red(vec!["ci / test".into()])
    );
    assert_eq!(
        ci_verdict(&ci(CiState::Success, &[], 2), 1, 5),
        CiVerdict::Green
    );
    assert_eq!(
        ci_verdict(&ci(CiState::Pending, &[], 2), 1, 5),
        CiVerdict::Again
    );
    assert_eq!(
        ci_verdict(&ci(CiState::Pending, &[], 2), 5, 5),
        CiVerdict::GiveUp
    );
    // Nothing reported: looked at a few times, then no CI is concluded.
    assert_eq!(
        ci_verdict(&ci(CiState::Pending, &[], 0), 2, 36),
        CiVerdict::Again
    );
    assert_eq!(
        ci_verdict(&ci(CiState::Pending, &[], 0), 3, 36),
        CiVerdict::NoCi
    );
    // "success" with nothing behind it is no green light.
    assert_eq!(
        ci_verdict(&ci(CiState::Success, &[], 0), 1, 36),
        CiVerdict::Again
    );
}

#[test]
fn subjects_are_issue_numbers_or_refs() {
    let mut e = NormalizedEvent::local("1", "a", "", Utc::now());
    assert_eq!(subject_key(&e), None);
    e.git_ref = Some("refs/heads/main".into());
    assert_eq!(subject_key(&e).as_deref(), Some("refs/heads/main"));
    e.number = Some(4);
    e.channel = Channel::IssueComment { number: 4 };
    assert_eq!(subject_key(&e).as_deref(), Some("#4"));
}

#[test]
fn the_prompt_shows_the_event_without_its_body_as_before() {
    // How the prompt rendered the event before it was typed: through a JSON value.
    let before = |e: &NormalizedEvent| {
        let mut value = serde_json::to_value(e).expect("serializes");
        value.as_object_mut().expect("an object").remove("body");
        value
    };
    let mut e = NormalizedEvent::local("1", "alice", "the body", Utc::now());
    e.kind = EventKind::PullRequest;
    e.action = Some(EventAction::Closed);
    e.repo = "o/r".into();
    e.number = Some(4);
    e.is_pull_request = true;
    e.comment_id = Some(5);
    e.review_id = Some(6);
    e.review_comment_id = Some(7);
    e.commit_sha = Some("abc".into());
    e.git_ref = Some("refs/heads/x".into());
    e.before_sha = Some("000".into());
    e.head_branch = Some("rover/x".into());
    e.base_branch = Some("main".into());
    e.merged = Some(true);
    e.label = Some("bug".into());
    e.body = Some("the body".into());
    e.html_url = Some("https://example.invalid/4".into());
    e.channel = Channel::PrComment { number: 4 };
    e.visibility = Visibility::Public;
    e.dedupe_key = Some("k".into());
    let shown = event_json(&e);
    assert!(!shown.contains("body"), "{shown}");
    // The same text, key for key.
    assert_eq!(
        shown,
        serde_json::to_string_pretty(&before(&e)).expect("renders")
    );
    // Without a dedupe key, and a channel of two fields (whose keys may come in another
    // order): the same content.
    e.dedupe_key = None;
    e.channel = Channel::ReviewThreadReply {
        number: 4,
        comment_id: 9,
    };
    let shown: serde_json::Value = serde_json::from_str(&event_json(&e)).expect("json");
    assert_eq!(shown, before(&e));
    assert!(shown.get("dedupeKey").is_none(), "{shown}");
}

#[test]
fn a_rover_pr_is_found_by_its_head_branch() {
    let key = Uuid::new_v4().to_string();
    let mappings = vec![
        MappedTask::new(key.clone(), mapping("t-1", "rover/a")),
        MappedTask::new(Uuid::new_v4().to_string(), mapping("t-2", "rover/b")),
    ];
    let pr = RoverPr::find(Some("rover/a"), &mappings).expect("rover pr");
    assert_eq!(pr.tasks, vec![(key.clone(), "t-1".to_owned())]);
    assert_eq!(pr.existing_task().map(|u| u.to_string()), Some(key));
    assert!(RoverPr::find(Some("feature/x"), &mappings).is_none());
    assert!(RoverPr::find(Some(""), &mappings).is_none());
    assert!(RoverPr::find(None, &mappings).is_none());
}

#[test]
fn a_consolidated_rover_pr_carries_every_task_of_its_trace() {
    let trace = Uuid::new_v4();
    let same = |task: &str, branch: &str| TaskMapping::new(task, branch, trace, Uuid::new_v4());
    let (head, other, stranger) = (Uuid::new_v4(), Uuid::new_v4(), Uuid::new_v4());
    let mappings = vec![
        MappedTask::new(other.to_string(), same("t-2", "rover/t2")),
        MappedTask::new(stranger.to_string(), mapping("t-3", "rover/t3")),
        MappedTask::new(head.to_string(), same("t-1", "rover/t1")),
    ];
    let pr = RoverPr::find(Some("rover/t1"), &mappings).expect("rover pr");
    assert_eq!(pr.workflow_action_ids, vec![head, other]);
    assert_eq!(
        pr.existing_task(),
        Some(head),
        "an iteration reuses the head's task"
    );
    assert_eq!(pr.cleanup().tasks, vec![head, other]);
}

#[test]
fn every_decision_routes_to_one_action_and_only_a_wait_to_coordinate() {
    let mappings = vec![MappedTask::new(
        Uuid::new_v4().to_string(),
        mapping("t-9", "rover/t9"),
    )];
    for (decision, kind) in [
        (CoordinateDecision::Noop, StepKind::Noop),
        (CoordinateDecision::Plan, StepKind::Plan),
        (CoordinateDecision::Notify, StepKind::Notify),
        (CoordinateDecision::Flag, StepKind::Notify),
        (CoordinateDecision::Wait, StepKind::Coordinate),
        (CoordinateDecision::Cleanup, StepKind::Cleanup),
        // Without a task the workflow decision cannot be followed.
        (CoordinateDecision::Workflow, StepKind::Noop),
    ] {
        let action = route(&answer(decision), &gathered(None), &mappings, policy());
        assert_eq!(action.kind, kind, "{decision:?}");
    }
    let wait = route(
        &answer(CoordinateDecision::Wait),
        &gathered(None),
        &mappings,
        policy(),
    );
    assert_eq!(
        wait.reason,
        "waiting: CI to finish (re-evaluated at 2026-01-02 03:34:05 UTC, or sooner by the next event about refs/heads/main)"
    );
    assert_eq!(wait.meta["notBefore"], "2026-01-02T03:34:05Z");
    assert_eq!(wait.meta["wait"]["subject"], "refs/heads/main");
    assert_eq!(wait.meta["wait"]["condition"], "CI to finish");
    assert_eq!(wait.meta["wait"]["round"], 1);
    assert_eq!(wait.meta["wait"]["headSha"], "abc123");
    // The scheduled action is queued not before its deadline.
    let span = crate::store::Span::root(Uuid::new_v4(), Utc::now(), crate::store::Meta::new());
    let action =
        crate::store::Action::new(wait.kind.clone(), &span, wait.reason, wait.meta, Utc::now());
    assert_eq!(
        action.pending(span.id, Utc::now()).not_before,
        Some(policy().now + chrono::Duration::seconds(1800))
    );
    // Past `maxWaits` a wait ends the trace, still recording what it waited for.
    let mut waited = gathered(None);
    waited.wait_round = 2;
    let last = route(
        &answer(CoordinateDecision::Wait),
        &waited,
        &mappings,
        policy(),
    );
    assert_eq!(last.kind, StepKind::Noop);
    assert_eq!(last.meta["waitingFor"], "CI to finish");
    assert!(
        last.reason.contains("already waited 2 time(s)"),
        "{}",
        last.reason
    );
    let cleanup = route(
        &answer(CoordinateDecision::Cleanup),
        &gathered(None),
        &mappings,
        policy(),
    );
    assert_eq!(cleanup.meta["branch"], "rover/t9");
    // Cleanup of a task rover does not know ends in noop.
    let unknown = route(
        &answer(CoordinateDecision::Cleanup),
        &gathered(None),
        &[],
        policy(),
    );
    assert_eq!(unknown.kind, StepKind::Noop);
    assert!(
        unknown.reason.contains("does not know"),
        "{}",
        unknown.reason
    );
}
