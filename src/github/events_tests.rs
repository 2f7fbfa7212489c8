//! Tests of normalizing GitHub's events and webhook payloads.

use super::*;
use serde_json::json;

#[allow(
    clippy::needless_pass_by_value,
    reason = "call sites build the payload inline"
)]
fn envelope(kind: &str, payload: Value) -> Value {
    json!({"id": "1001", "type": kind, "actor": {"id": 1, "login": "alice"},
           "repo": {"id": 2, "name": "o/r"}, "payload": payload, "public": true,
           "created_at": "2026-01-02T03:04:05Z"})
}

#[test]
fn unknown_type_and_action_are_skipped_not_the_page() {
    let page = json!([
        envelope("WatchEvent", json!({"action": "started"})),
        envelope(
            "PullRequestEvent",
            json!({"action": "synchronize", "number": 3, "pull_request": {"number": 3}})
        ),
        envelope(
            "IssuesEvent",
            json!({"action": "opened", "issue": {"number": 7, "body": "hi"}})
        ),
        json!(42),
    ]);
    let page = parse_events_page(&page.to_string(), &NormalizeOptions::default()).expect("page");
    assert_eq!(page.events.len(), 1);
    assert_eq!(page.events[0].channel, Channel::IssueComment { number: 7 });
    assert_eq!(page.skipped.len(), 3);
    assert_eq!(
        page.skipped[0].reason,
        SkipReason::UnknownType("WatchEvent".into())
    );
    assert_eq!(
        page.skipped[1].reason,
        SkipReason::IgnoredAction("synchronize".into())
    );
}

#[test]
fn merged_action_is_closed_and_merged() {
    let item = envelope(
        "PullRequestEvent",
        json!({"action": "merged", "number": 3, "pull_request": {"number": 3, "head": {"ref": "feat"}}}),
    );
    let ev = normalize_event(&item, &NormalizeOptions::default()).expect("kept");
    assert_eq!(ev.action, Some(EventAction::Closed));
    assert_eq!(ev.merged, Some(true));
    assert_eq!(ev.head_branch.as_deref(), Some("feat"));
    assert_eq!(
        ev.html_url.as_deref(),
        Some("https://github.com/o/r/pull/3")
    );
}

#[test]
fn own_events_are_skipped_by_login_and_marker() {
    let opts = NormalizeOptions {
        bot_login: Some("rover-bot".into()),
        ..NormalizeOptions::default()
    };
    let mut item = envelope(
        "IssueCommentEvent",
        json!({"action": "created", "issue": {"number": 1}, "comment": {"id": 9, "body": "x"}}),
    );
    item["actor"]["login"] = json!("rover-bot[bot]");
    assert_eq!(normalize_event(&item, &opts), Err(SkipReason::Own));
    item["actor"]["login"] = json!("alice");
    item["payload"]["comment"]["body"] = json!("done\n<!-- rover:trace=t action=a -->");
    assert_eq!(normalize_event(&item, &opts), Err(SkipReason::Own));
}

#[test]
fn channel_serializes_camel_case() {
    let c = Channel::ReviewThreadReply {
        number: 2,
        comment_id: 5,
    };
    assert_eq!(
        serde_json::to_value(&c).expect("json"),
        json!({"kind": "reviewThreadReply", "number": 2, "commentId": 5})
    );
}

#[test]
fn fixture_page_keeps_the_six_types_and_skips_the_rest() {
    let body = include_str!("../../tests/fixtures/github/events_page.json");
    let opts = NormalizeOptions {
        bot_login: Some("rover-bot".into()),
        ..NormalizeOptions::default()
    };
    let page = parse_events_page(body, &opts).expect("fixture parses");
    let kinds: Vec<_> = page
        .events
        .iter()
        .map(|e| (e.id.as_str(), e.kind, e.channel.clone()))
        .collect();
    assert_eq!(
        kinds,
        vec![
            (
                "50000000010",
                EventKind::Push,
                Channel::CommitComment {
                    sha: "eb1a60c03544dcea290f2d57bb66ae188ce25778".into()
                }
            ),
            (
                "50000000008",
                EventKind::PullRequestReviewComment,
                Channel::ReviewThreadReply {
                    number: 8,
                    comment_id: 1000
                }
            ),
            (
                "50000000007",
                EventKind::PullRequestReview,
                Channel::PrReview { number: 8 }
            ),
            (
                "50000000005",
                EventKind::PullRequest,
                Channel::PrComment { number: 8 }
            ),
            (
                "50000000004",
                EventKind::IssueComment,
                Channel::PrComment { number: 8 }
            ),
            (
                "50000000002",
                EventKind::Issues,
                Channel::IssueComment { number: 7 }
            ),
            (
                "50000000001",
                EventKind::Issues,
                Channel::IssueComment { number: 7 }
            ),
        ]
    );
    let reasons: Vec<_> = page.skipped.iter().map(|s| s.reason.clone()).collect();
    assert_eq!(
        reasons,
        vec![
            SkipReason::UnknownType("DiscussionEvent".into()),
            SkipReason::IgnoredAction("synchronize".into()),
            SkipReason::Own,
        ]
    );
    assert!(page
        .events
        .iter()
        .all(|e| e.visibility == Visibility::Public));
    assert_eq!(page.events[1].review_comment_id, Some(1001));
    assert_eq!(page.events[5].label.as_deref(), Some("bug"));
}

#[test]
fn not_an_array_is_malformed() {
    let err = parse_events_page("{\"message\":\"x\"}", &NormalizeOptions::default())
        .expect_err("must fail");
    assert!(matches!(err, GitHubError::Malformed { .. }));
}

#[test]
fn an_issues_labels_are_kept_bounded_and_without_control_characters() {
    let long = "x".repeat(80);
    let mut labels: Vec<Value> = vec![
        json!({"name": "critical"}),
        json!({"name": "quick\u{1b}[31m-win"}),
        json!({"name": long}),
        json!({"name": ""}),
        json!({"id": 7}),
    ];
    labels.extend((0..30).map(|i| json!({"name": format!("l{i}")})));
    let payload = json!({"action": "opened", "issue": {"number": 4, "labels": labels}});
    let page = parse_events_page(
        &json!([envelope("IssuesEvent", payload)]).to_string(),
        &NormalizeOptions::default(),
    )
    .expect("page");
    let got = &page.events[0].labels;
    assert_eq!(got.len(), MAX_LABELS);
    assert_eq!(got[0], "critical");
    assert_eq!(got[1], "quick[31m-win");
    assert_eq!(got[2].chars().count(), 50);
    assert_eq!(got[3], "l0");
}
