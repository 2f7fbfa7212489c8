//! Integration tests for `github`: the real octocrab client against the fake GitHub server.

use std::time::Duration;

use axum::http::Method;
use chrono::{TimeDelta, Utc};
use rover::github::context::build_context;
use rover::github::{
    deliver, poll_once, Channel, CiState, EventKind, EventsFetch, GitHub, GitHubError,
    GitHubSettings, NewPullRequest, OctoGitHub, Outgoing, PollCursor, PollSettings, Poller,
    Redactor, RepoRef, ReviewEvent, SkipReason, TrustPolicy, TrustSettings, Visibility,
};
use serde_json::json;

use crate::support::fake_github::{FakeGitHub, Fault, FaultKind, BOT, REPO, TOKEN};

/// Checks that an error is the expected kind.
type Check = fn(&GitHubError) -> bool;

const SHA: &str = "184cb4b61e26de7cccc385d37da25cd8bd817d27";

fn settings() -> GitHubSettings {
    GitHubSettings {
        bot_login: Some(BOT.into()),
        request_timeout_secs: 2,
        ..GitHubSettings::default()
    }
}

fn client(fake: &FakeGitHub) -> OctoGitHub {
    fake.client_with(&settings())
}

fn poller() -> Poller {
    Poller::new(
        PollSettings {
            min_interval_secs: 1,
            max_backoff_secs: 600,
            skip_backlog: false,
            ..PollSettings::default()
        },
        PollCursor::default(),
    )
}

fn trimmed_pr(number: u64) -> serde_json::Value {
    json!({"url": format!("https://api.github.com/repos/{REPO}/pulls/{number}"), "id": 1, "number": number,
           "head": {"ref": "fix-parser", "sha": SHA, "repo": {"id": 1, "url": "u", "name": "widgets"}},
           "base": {"ref": "main", "sha": SHA, "repo": {"id": 1, "url": "u", "name": "widgets"}}})
}

/// Seed one event of each of the six types plus noise the poller must skip.
fn seed_all_types(fake: &FakeGitHub) {
    fake.seed_event(
        "IssuesEvent",
        "alice",
        json!({"action": "opened", "issue": {"number": 7, "title": "t", "body": "b",
        "html_url": format!("https://github.com/{REPO}/issues/7"), "user": {"login": "alice"}}}),
    );
    fake.seed_event("WatchEvent", "alice", json!({"action": "started"}));
    fake.seed_event(
        "PullRequestEvent",
        "alice",
        json!({"action": "opened", "number": 8, "pull_request": trimmed_pr(8)}),
    );
    fake.seed_event(
        "PullRequestEvent",
        "alice",
        json!({"action": "synchronize", "number": 8, "pull_request": trimmed_pr(8)}),
    );
    fake.seed_event("IssueCommentEvent", "alice", json!({"action": "created",
        "issue": {"number": 8, "pull_request": {"url": "u"}}, "comment": {"id": 31, "body": "@rover rebase", "html_url": "h"}}));
    fake.seed_event("PullRequestReviewEvent", "alice", json!({"action": "created", "pull_request": trimmed_pr(8),
        "review": {"id": 41, "body": "needs work", "state": "changes_requested", "commit_id": SHA, "html_url": "h"}}));
    fake.seed_event("PullRequestReviewCommentEvent", "alice", json!({"action": "created", "pull_request": trimmed_pr(8),
        "comment": {"id": 52, "in_reply_to_id": 51, "body": "why?", "path": "src/lib.rs", "commit_id": SHA, "html_url": "h"}}));
    fake.seed_event(
        "IssuesEvent",
        "alice",
        json!({"action": "milestoned", "issue": {"number": 7}}),
    );
    fake.seed_event(
        "PushEvent",
        "alice",
        json!({"repository_id": 1, "push_id": 2, "ref": "refs/heads/main", "head": SHA,
        "before": "0000000000000000000000000000000000000000"}),
    );
}

#[tokio::test]
async fn each_event_type_is_normalized_with_channel_and_visibility_and_noise_skipped() {
    let fake = FakeGitHub::start().await;
    seed_all_types(&fake);
    let gh = client(&fake);
    let mut p = poller();
    let result = poll_once(&gh, &mut p, Utc::now())
        .await
        .expect("poll")
        .expect("due");
    let got: Vec<(EventKind, Channel)> = result
        .new_events
        .iter()
        .map(|e| (e.kind, e.channel.clone()))
        .collect();
    assert_eq!(
        got,
        vec![
            (EventKind::Issues, Channel::IssueComment { number: 7 }),
            (EventKind::PullRequest, Channel::PrComment { number: 8 }),
            (EventKind::IssueComment, Channel::PrComment { number: 8 }),
            (
                EventKind::PullRequestReview,
                Channel::PrReview { number: 8 }
            ),
            (
                EventKind::PullRequestReviewComment,
                Channel::ReviewThreadReply {
                    number: 8,
                    comment_id: 51
                }
            ),
            (EventKind::Push, Channel::CommitComment { sha: SHA.into() }),
        ],
        "oldest first, six kept"
    );
    assert!(result
        .new_events
        .iter()
        .all(|e| e.visibility == Visibility::Public && e.repo == REPO && e.actor == "alice"));
    assert_eq!(
        result.skipped, 3,
        "WatchEvent, synchronize and milestoned are skipped, the page is not lost"
    );
    let push = &result.new_events[5];
    assert_eq!(push.git_ref.as_deref(), Some("refs/heads/main"));
    assert_eq!(
        push.html_url.as_deref(),
        Some(format!("{}/{REPO}/commit/{SHA}", fake.url).as_str())
    );
    assert_eq!(
        result.new_events[1].head_branch.as_deref(),
        Some("fix-parser")
    );
    let json = serde_json::to_value(&result.new_events[4]).expect("serializes");
    assert_eq!(
        json["channel"],
        json!({"kind": "reviewThreadReply", "number": 8, "commentId": 51})
    );
    assert_eq!(json["visibility"], json!("public"));
    assert!(fake.unknown_requests().is_empty());
}

#[tokio::test]
async fn second_poll_sends_if_none_match_gets_304_and_ingests_nothing() {
    let fake = FakeGitHub::start().await;
    seed_all_types(&fake);
    let gh = client(&fake);
    let mut p = poller();
    let t0 = Utc::now();
    let first = poll_once(&gh, &mut p, t0)
        .await
        .expect("poll")
        .expect("due");
    assert_eq!(first.new_events.len(), 6);
    let remaining = fake.rate_remaining();
    let second = poll_once(&gh, &mut p, t0 + TimeDelta::seconds(61))
        .await
        .expect("poll")
        .expect("due");
    assert!(second.not_modified);
    assert!(second.new_events.is_empty());
    assert_eq!(
        fake.rate_remaining(),
        remaining,
        "a 304 costs no rate limit"
    );
    let reqs = fake.requests();
    let last = reqs.last().expect("requests");
    assert_eq!(last.status, 304);
    assert_eq!(last.headers.get("if-none-match"), p.cursor().etag.as_ref());
    assert!(
        last.headers
            .get("if-none-match")
            .is_some_and(|v| v.starts_with('"')),
        "etag quotes kept"
    );
    for r in &reqs {
        assert_eq!(
            r.headers.get("authorization").map(String::as_str),
            Some(format!("Bearer {TOKEN}").as_str())
        );
        assert_eq!(
            r.headers.get("x-github-api-version").map(String::as_str),
            Some("2022-11-28")
        );
        assert_eq!(
            r.headers.get("accept").map(String::as_str),
            Some("application/vnd.github+json")
        );
    }
}

#[tokio::test]
async fn poll_interval_is_obeyed_and_no_request_is_made_before_it() {
    let fake = FakeGitHub::start().await;
    fake.set_poll_interval(120);
    let gh = client(&fake);
    let mut p = poller();
    let t0 = Utc::now();
    poll_once(&gh, &mut p, t0)
        .await
        .expect("poll")
        .expect("due");
    assert_eq!(p.next_poll_at(), Some(t0 + TimeDelta::seconds(120)));
    assert!(poll_once(&gh, &mut p, t0 + TimeDelta::seconds(60))
        .await
        .expect("not due")
        .is_none());
    assert_eq!(
        fake.count(&Method::GET, "/events"),
        1,
        "no request before X-Poll-Interval elapsed"
    );
}

#[tokio::test]
async fn restart_from_saved_cursor_does_not_reingest_and_new_ids_come_through() {
    let fake = FakeGitHub::start().await;
    seed_all_types(&fake);
    let gh = client(&fake);
    let mut p = poller();
    let t0 = Utc::now();
    assert_eq!(
        poll_once(&gh, &mut p, t0)
            .await
            .expect("poll")
            .expect("due")
            .new_events
            .len(),
        6
    );
    let saved = serde_json::to_string(p.cursor()).expect("cursor serializes");

    fake.seed_event(
        "IssuesEvent",
        "bob",
        json!({"action": "reopened", "issue": {"number": 9}}),
    );
    // A restart loses the ETag's usefulness (the feed changed) but not the seen ids.
    let cursor: PollCursor = serde_json::from_str(&saved).expect("cursor parses");
    let mut restarted = Poller::new(
        PollSettings {
            min_interval_secs: 1,
            max_backoff_secs: 600,
            skip_backlog: false,
            ..PollSettings::default()
        },
        cursor,
    );
    let r = poll_once(&gh, &mut restarted, t0)
        .await
        .expect("poll")
        .expect("due");
    assert_eq!(r.new_events.len(), 1);
    assert_eq!(r.new_events[0].actor, "bob");
    assert_eq!(r.duplicates, 6);
}

#[tokio::test]
async fn fresh_start_skips_the_backlog_by_default() {
    let fake = FakeGitHub::start().await;
    seed_all_types(&fake);
    let gh = client(&fake);
    let mut p = Poller::new(
        PollSettings {
            min_interval_secs: 1,
            ..PollSettings::default()
        },
        PollCursor::default(),
    );
    let t0 = Utc::now();
    assert!(poll_once(&gh, &mut p, t0)
        .await
        .expect("poll")
        .expect("due")
        .new_events
        .is_empty());
    fake.seed_event(
        "IssuesEvent",
        "bob",
        json!({"action": "opened", "issue": {"number": 10}}),
    );
    let r = poll_once(&gh, &mut p, t0 + TimeDelta::seconds(61))
        .await
        .expect("poll")
        .expect("due");
    assert_eq!(
        r.new_events.iter().map(|e| e.number).collect::<Vec<_>>(),
        vec![Some(10)]
    );
}

#[tokio::test]
async fn the_bots_own_comment_and_marked_comments_are_ignored() {
    let fake = FakeGitHub::start().await;
    fake.add_issue(7, "Crash", "boom", "alice", &["bug"]);
    let gh = client(&fake);
    gh.post_comment(7, "I am rover").await.expect("post");
    fake.seed_event(
        "IssueCommentEvent",
        "alice",
        json!({"action": "created", "issue": {"number": 7},
        "comment": {"id": 5, "body": "quoted\n<!-- rover:trace=t action=a -->"}}),
    );
    let fetch = gh.list_events(None).await.expect("events");
    let EventsFetch::Page { page, .. } = fetch else {
        panic!("expected a page")
    };
    assert!(
        page.events.is_empty(),
        "nothing to react to: {:?}",
        page.events
    );
    assert_eq!(
        page.skipped
            .iter()
            .filter(|s| s.reason == SkipReason::Own)
            .count(),
        2
    );
}

#[tokio::test]
async fn trust_allows_writers_denies_readers_and_strangers_and_leaves_failed_lookups_undecided() {
    let fake = FakeGitHub::start().await;
    fake.set_permission("alice", "write");
    fake.set_permission("mallory", "read");
    fake.set_permission("maya", "maintain");
    let gh = client(&fake);
    let policy = TrustPolicy::new(&TrustSettings {
        allow_logins: vec!["friend".into()],
        ..TrustSettings::default()
    });
    let yes = policy.decide(&gh, "alice").await.unwrap();
    assert!(yes.trusted, "{}", yes.reason);
    assert!(policy.decide(&gh, "maya").await.unwrap().trusted);
    let no = policy.decide(&gh, "mallory").await.unwrap();
    assert!(!no.trusted);
    assert!(no.reason.contains("read permission"), "{}", no.reason);
    assert!(policy.decide(&gh, "friend").await.unwrap().trusted);
    assert_eq!(
        fake.count(&Method::GET, "/collaborators/friend/"),
        0,
        "allow-list needs no lookup"
    );

    // Cached: a second decision makes no request.
    policy.decide(&gh, "alice").await.unwrap();
    assert_eq!(
        fake.count(&Method::GET, "/collaborators/alice/permission"),
        1
    );

    // Expired after the TTL: looked up again, and a downgrade takes effect.
    fake.set_permission("alice", "read");
    let later = std::time::Instant::now() + Duration::from_secs(601);
    assert!(!policy.decide_at(&gh, "alice", later).await.unwrap().trusted);
    assert_eq!(
        fake.count(&Method::GET, "/collaborators/alice/permission"),
        2
    );

    fake.fault(Fault {
        method: None,
        path_contains: "/collaborators/".into(),
        times: 1,
        kind: FaultKind::Server(502),
    });
    // A 5xx is no answer: an error the caller may retry, not a denial, and nothing cached.
    let failed = policy.decide(&gh, "carol").await.unwrap_err();
    assert!(failed.is_retryable(), "{failed}");
    fake.set_permission("carol", "write");
    assert!(policy.decide(&gh, "carol").await.unwrap().trusted);

    // 404 is a definite answer: not a collaborator.
    fake.fault(Fault {
        method: None,
        path_contains: "/collaborators/stranger/".into(),
        times: 1,
        kind: FaultKind::NotFound,
    });
    let stranger = policy.decide(&gh, "stranger").await.unwrap();
    assert!(!stranger.trusted);
    assert!(
        stranger.reason.contains("not a collaborator"),
        "{}",
        stranger.reason
    );
}

#[tokio::test]
async fn each_fault_becomes_a_typed_error_and_the_poller_backs_off_and_recovers() {
    let fake = FakeGitHub::start().await;
    seed_all_types(&fake);
    let gh = client(&fake);
    let mut p = poller();
    let mut now = Utc::now();
    let cases: Vec<(FaultKind, Check)> = vec![
        (FaultKind::Unauthorized, |e| {
            matches!(e, GitHubError::BadCredentials { .. })
        }),
        (
            FaultKind::RateLimited {
                status: 403,
                reset: 1_900_000_000,
            },
            |e| matches!(e, GitHubError::RateLimited { until, .. } if until.timestamp() == 1_900_000_000),
        ),
        (
            FaultKind::RateLimited {
                status: 429,
                reset: 1_900_000_000,
            },
            |e| matches!(e, GitHubError::RateLimited { .. }),
        ),
        (
            FaultKind::SecondaryLimit {
                status: 403,
                retry_after: 90,
            },
            |e| matches!(e, GitHubError::RateLimited { .. }),
        ),
        (FaultKind::NotFound, |e| {
            matches!(e, GitHubError::NotFound { .. })
        }),
        (FaultKind::Server(500), |e| {
            matches!(e, GitHubError::Server { status: 500, .. })
        }),
        (FaultKind::Malformed, |e| {
            matches!(e, GitHubError::Malformed { .. })
        }),
        (FaultKind::Slow(Duration::from_secs(4)), |e| {
            matches!(e, GitHubError::Timeout { .. })
        }),
    ];
    for (kind, check) in cases {
        let before = fake.count(&Method::GET, "/events");
        fake.fault(Fault {
            method: Some(Method::GET),
            path_contains: "/events".into(),
            times: 1,
            kind: kind.clone(),
        });
        let err = poll_once(&gh, &mut p, now)
            .await
            .expect_err("fault must surface");
        assert!(check(&err), "{kind:?} gave {err:?}");
        assert_eq!(
            fake.count(&Method::GET, "/events"),
            before + 1,
            "{kind:?}: exactly one request, no silent retries"
        );
        let next = p.next_poll_at().expect("scheduled");
        assert!(next > now, "{kind:?}: backs off");
        if let Some(until) = err.retry_at() {
            assert!(next >= until, "{kind:?}: waits until the limit resets");
        }
        assert!(
            poll_once(&gh, &mut p, now)
                .await
                .expect("not due")
                .is_none(),
            "{kind:?}: no hammering"
        );
        now = next;
    }
    // After all that the poller still works and nothing was lost.
    let ok = poll_once(&gh, &mut p, now)
        .await
        .expect("recovers")
        .expect("due");
    assert_eq!(ok.new_events.len(), 6);
    assert_eq!(p.failures(), 0);
    assert!(fake.unknown_requests().is_empty());
}

#[tokio::test]
async fn validation_errors_carry_github_reasons() {
    let fake = FakeGitHub::start().await;
    let gh = client(&fake);
    let new = NewPullRequest {
        title: "Fix".into(),
        head: "rover/fix".into(),
        base: "main".into(),
        body: "b".into(),
        draft: true,
    };
    let pr = gh.open_pull_request(&new).await.expect("opened");
    assert_eq!(pr.head_branch, "rover/fix");
    assert!(pr.draft);
    let found = gh
        .find_pull_request_for_branch("rover/fix")
        .await
        .expect("lookup")
        .expect("found");
    assert_eq!(found.number, pr.number);
    assert!(gh
        .find_pull_request_for_branch("other")
        .await
        .expect("lookup")
        .is_none());
    let err = gh.open_pull_request(&new).await.expect_err("duplicate");
    match &err {
        GitHubError::Validation { errors, .. } => assert_eq!(
            errors,
            &vec!["A pull request already exists for octo-org:rover/fix.".to_owned()]
        ),
        other => panic!("expected validation, got {other:?}"),
    }
    assert!(!err.is_retryable());
    assert!(err.to_string().contains("already exists"));
}

#[tokio::test]
async fn delivery_is_idempotent_after_a_crash_on_every_channel() {
    let fake = FakeGitHub::start().await;
    fake.add_issue(7, "Crash", "boom", "alice", &[]);
    fake.add_pull(8, "Fix", "alice", "fix-parser", SHA, "main");
    let thread = fake.add_review_comment(8, "alice", "why?", None);
    let gh = client(&fake);
    let redactor = Redactor::new([TOKEN]);
    let channels = [
        Channel::IssueComment { number: 7 },
        Channel::PrComment { number: 8 },
        Channel::PrReview { number: 8 },
        Channel::ReviewThreadReply {
            number: 8,
            comment_id: thread,
        },
        Channel::CommitComment { sha: SHA.into() },
    ];
    for (i, channel) in channels.iter().enumerate() {
        let action = format!("act-{i}");
        let out = Outgoing {
            channel,
            visibility: Visibility::Public,
            message: "Here is the answer.",
            trace_id: "trace-1",
            action_id: &action,
            review: None,
        };
        let first = deliver(&gh, &redactor, &out).await.expect("delivered");
        assert!(!first.already_posted);
        assert!(
            first
                .url
                .as_deref()
                .is_some_and(|u| u.starts_with("https://github.com/")),
            "{first:?}"
        );
        // The notify step crashed before recording the delivery and runs again.
        let again = deliver(&gh, &redactor, &out).await.expect("delivered");
        assert!(again.already_posted, "{channel:?} posted twice");
        assert_eq!(again.url, first.url);
    }
    let bodies = fake.comment_bodies(7);
    assert_eq!(bodies.len(), 1);
    assert!(
        bodies[0].contains("Generated by Rover")
            && bodies[0].contains("<!-- rover:trace=trace-1 action=act-0 -->")
    );
    assert_eq!(fake.comment_bodies(8).len(), 1);
    assert_eq!(fake.review_bodies(8).len(), 1);
    assert_eq!(
        fake.review_comment_bodies(8).len(),
        2,
        "the original and one reply"
    );
    assert_eq!(fake.commit_comment_bodies(SHA).len(), 1);
    assert_eq!(fake.count(&Method::POST, "/"), 5);
    // What rover posted comes back through the feed and is recognized as its own.
    let EventsFetch::Page { page, .. } = gh.list_events(None).await.expect("events") else {
        panic!("page")
    };
    assert!(page.events.is_empty(), "{:?}", page.events);
    assert!(fake.unknown_requests().is_empty());
}

#[tokio::test]
async fn request_changes_review_is_posted_and_listed_back() {
    let fake = FakeGitHub::start().await;
    fake.add_pull(8, "Fix", "alice", "fix-parser", SHA, "main");
    let gh = client(&fake);
    let posted = gh
        .post_review(8, ReviewEvent::RequestChanges, "please fix")
        .await
        .expect("review");
    assert!(posted.html_url.contains("pullrequestreview"));
    let reviews = gh.list_reviews(8).await.expect("reviews");
    assert_eq!(reviews[0].state, "CHANGES_REQUESTED");
}

#[tokio::test]
async fn context_is_fetched_bounded_and_marks_rovers_own_comments() {
    let fake = FakeGitHub::start().await;
    fake.add_pull(8, "Fix parser", "alice", "fix-parser", SHA, "main");
    for i in 0..30 {
        fake.add_comment(8, "alice", &format!("comment {i} {}", "x".repeat(5000)));
    }
    fake.add_comment(
        8,
        BOT,
        "Which input crashes?\n<!-- rover:trace=t0 action=a0 -->",
    );
    fake.add_review(8, "bob", "CHANGES_REQUESTED", "handle empty input");
    fake.add_status(SHA, "success", "lint");
    fake.add_check_run(SHA, "test", "completed", Some("failure"));
    let gh = client(&fake);
    let mut p = poller();
    fake.seed_event(
        "PullRequestEvent",
        "alice",
        json!({"action": "opened", "number": 8, "pull_request": trimmed_pr(8)}),
    );
    let event = poll_once(&gh, &mut p, Utc::now())
        .await
        .expect("poll")
        .expect("due")
        .new_events
        .remove(0);

    let mut limits = settings().context;
    limits.max_comments = 5;
    limits.max_comment_chars = 100;
    limits.max_total_chars = 3000;
    let ctx = build_context(&gh, &event, &limits, Some(BOT))
        .await
        .expect("context");
    let subject = ctx.subject.as_ref().expect("subject");
    assert_eq!(subject.title, "Fix parser");
    assert_eq!(
        subject.pull.as_ref().map(|p| p.head_branch.as_str()),
        Some("fix-parser")
    );
    assert_eq!(ctx.comments.len(), 5);
    assert_eq!(ctx.omitted_comments, 26);
    assert!(ctx.comments.last().is_some_and(|c| c.by_rover));
    assert!(!ctx.comments[0].by_rover);
    assert!(ctx.comments[0].body.contains("[… truncated"));
    assert_eq!(ctx.reviews.len(), 1);
    let ci = ctx.ci.as_ref().expect("ci for the PR head");
    assert_eq!(ci.state, CiState::Failure);
    assert_eq!(ci.failing, vec!["test".to_owned()]);
    let md = ctx.render();
    assert!(
        md.chars().count() <= 3000 + 60,
        "bounded: {}",
        md.chars().count()
    );
    assert!(md.contains("## Pull request #8: Fix parser"));
    assert!(md.contains("(rover, earlier)"));
    assert!(md.contains("[26 earlier comments omitted]"));
}

#[tokio::test]
async fn context_records_gaps_for_missing_things_and_fails_on_retryable_errors() {
    let fake = FakeGitHub::start().await;
    let gh = client(&fake);
    fake.seed_event(
        "IssuesEvent",
        "alice",
        json!({"action": "opened", "issue": {"number": 99}}),
    );
    let mut p = poller();
    let event = poll_once(&gh, &mut p, Utc::now())
        .await
        .expect("poll")
        .expect("due")
        .new_events
        .remove(0);
    let ctx = build_context(&gh, &event, &settings().context, Some(BOT))
        .await
        .expect("context");
    assert!(ctx.subject.is_none());
    assert_eq!(ctx.gaps.len(), 1);
    assert!(ctx.gaps[0].contains("issue #99"), "{:?}", ctx.gaps);
    fake.fault(Fault {
        method: None,
        path_contains: "/issues/99".into(),
        times: 1,
        kind: FaultKind::Server(503),
    });
    let err = build_context(&gh, &event, &settings().context, Some(BOT))
        .await
        .expect_err("retryable");
    assert!(err.is_retryable());
}

#[tokio::test]
async fn missing_token_is_refused_by_the_fake_with_bad_credentials() {
    let fake = FakeGitHub::start().await;
    let gh = OctoGitHub::new(
        &fake.url,
        "wrong",
        RepoRef::parse(REPO).expect("repo"),
        &settings(),
    )
    .expect("client");
    let err = gh.get_issue(1).await.expect_err("401");
    assert!(matches!(err, GitHubError::BadCredentials { .. }));
    assert!(err.to_string().contains("GITHUB_TOKEN"));
    assert!(
        !err.to_string().contains("wrong"),
        "the token never appears in errors"
    );
}

#[tokio::test]
async fn long_threads_yield_the_newest_comments_via_the_last_page() {
    let fake = FakeGitHub::start().await;
    fake.add_issue(7, "Long", "b", "alice", &[]);
    for i in 0..250 {
        fake.add_comment(7, "alice", &format!("c{i}"));
    }
    let gh = client(&fake);
    let last = gh.list_comments(7, 120).await.expect("comments");
    assert_eq!(last.len(), 120);
    assert_eq!(last[0].body, "c130");
    assert_eq!(last[119].body, "c249");
    // page 1, then the last page (3) and page 2: three requests.
    assert_eq!(fake.count(&Method::GET, "/issues/7/comments"), 3);
}

#[tokio::test]
async fn the_feed_is_capped_at_300_events_and_pages_beyond_are_refused() {
    let fake = FakeGitHub::start().await;
    for i in 0..320 {
        fake.seed_event(
            "IssuesEvent",
            "alice",
            json!({"action": "opened", "issue": {"number": i + 1}}),
        );
    }
    let gh = client(&fake);
    let EventsFetch::Page { page, meta } = gh.list_events(None).await.expect("events") else {
        panic!("page")
    };
    assert_eq!(page.events.len(), 100);
    assert_eq!(page.events[0].number, Some(320), "newest first");
    assert_eq!(meta.last_page, Some(3), "300 events in pages of 100");
    assert_eq!(meta.poll_interval, Some(Duration::from_secs(60)));
    assert_eq!(meta.rate.remaining, Some(4999));
}

#[tokio::test]
async fn delivery_redacts_for_the_channel_visibility_before_posting() {
    let fake = FakeGitHub::start().await;
    fake.add_issue(7, "Crash", "boom", "alice", &[]);
    fake.add_issue(9, "Other", "b", "alice", &[]);
    let gh = client(&fake);
    let redactor = Redactor::new([TOKEN]);
    let message =
        format!("push failed: token {TOKEN} rejected reading /work/wt-3/.git/config\nHOME=/root");
    let public = Outgoing {
        channel: &Channel::IssueComment { number: 7 },
        visibility: Visibility::Public,
        message: &message,
        trace_id: "t",
        action_id: "a",
        review: None,
    };
    let delivered = deliver(&gh, &redactor, &public).await.expect("delivered");
    let posted = &fake.comment_bodies(7)[0];
    assert_eq!(posted, &delivered.body);
    assert!(
        !posted.contains(TOKEN) && !posted.contains("/work/wt-3") && !posted.contains("/root"),
        "{posted}"
    );
    assert!(posted.contains("push failed"));

    let private = Outgoing {
        channel: &Channel::IssueComment { number: 9 },
        visibility: Visibility::Private,
        ..public
    };
    deliver(&gh, &redactor, &private).await.expect("delivered");
    let posted = &fake.comment_bodies(9)[0];
    assert!(!posted.contains(TOKEN), "{posted}");
    assert!(
        posted.contains("/work/wt-3/.git/config"),
        "private keeps diagnostics: {posted}"
    );
}

/// The event step over the real client: each of the six types becomes a trace whose root
/// `event` span records the channel and visibility notify needs, with one queued `coordinate`;
/// noise starts nothing; a second poll ingests nothing.
#[tokio::test]
async fn each_event_type_starts_a_trace_with_its_channel_and_a_coordinate_action() {
    use rover::intake::poll::{poll_github, resume_poller};
    use rover::steps::meta::EventMeta;
    let fake = FakeGitHub::start().await;
    seed_all_types(&fake);
    let gh = client(&fake);
    let dir = tempfile::tempdir().unwrap();
    let store = rover::store::AutopilotStore::open(dir.path(), "ingest").unwrap();
    let poll = PollSettings {
        min_interval_secs: 0,
        max_backoff_secs: 60,
        skip_backlog: false,
        ..PollSettings::default()
    };
    let mut poller = resume_poller(&store, poll.clone()).unwrap();
    let report = poll_github(
        &store,
        &rover::intake::Entry::new("ingest", rover::steps::kinds::FIRST_STEP),
        &gh,
        &mut poller,
    )
    .await
    .expect("poll");
    assert_eq!(report.new_traces.len(), 6, "{report:?}");
    let mut seen = Vec::new();
    for trace in &report.new_traces {
        let view = store.load_trace(*trace).unwrap();
        let root = view.root().unwrap();
        assert_eq!(root.step.as_str(), "event");
        assert_eq!(root.status, rover::store::SpanStatus::Completed);
        let meta = EventMeta::of(root).unwrap();
        assert_eq!(
            meta.visibility,
            Visibility::Public,
            "GitHub is public unless configured"
        );
        assert_eq!(view.pending.len(), 1);
        assert_eq!(view.pending[0].action.as_str(), "coordinate");
        seen.push((meta.kind.clone(), meta.channel.clone()));
    }
    let kinds: std::collections::BTreeSet<_> = seen.iter().map(|(k, _)| k.clone()).collect();
    assert_eq!(kinds.len(), 6, "all six types: {seen:?}");
    assert!(
        seen.contains(&(
            "PushEvent".into(),
            Channel::CommitComment { sha: SHA.into() }
        )),
        "{seen:?}"
    );
    assert!(
        seen.contains(&(
            "PullRequestReviewCommentEvent".into(),
            Channel::ReviewThreadReply {
                number: 8,
                comment_id: 51
            }
        )),
        "{seen:?}"
    );

    // The cursor records the ETag: a restarted poller asks with it and starts nothing.
    let mut again = resume_poller(&store, poll).unwrap();
    let report = poll_github(
        &store,
        &rover::intake::Entry::new("ingest", rover::steps::kinds::FIRST_STEP),
        &gh,
        &mut again,
    )
    .await
    .expect("poll");
    assert!(
        report.new_traces.is_empty() && report.not_modified,
        "{report:?}"
    );
    assert_eq!(store.recent_traces(100).unwrap().len(), 6);
}
