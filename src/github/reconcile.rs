//! Reconcile: the list APIs swept for what the events feed may have missed (rover was down
//! longer than the feed reaches back, paging stopped early, GitHub dropped an event).
//!
//! Issues and pull requests opened, issue comments, PR reviews and review comments since a time
//! are turned into
//! the feed's envelope and normalized by the same `normalize_event` as a polled or webhook
//! event: the same bot and marker filters, the same content keys (`dedupe_key`), so an event
//! seen both ways is one trace. Other actions (closed, reopened, labeled) and pushes are left to
//! the feed and webhooks: their content keys cannot be rebuilt from the lists.

use std::collections::HashMap;

use chrono::{DateTime, SecondsFormat, Utc};
use serde_json::{json, Value};

use super::api::{Comment, GitHub, Issue, PullRequest, Review, ReviewComment};
use super::error::GitHubError;
use super::events::{normalize_event, NormalizeOptions, NormalizedEvent, SkippedEvent};

/// The prefix of a reconciled event's id (`reconcile:<content key>`).
pub const ID_PREFIX: &str = "reconcile:";

/// What one sweep found, oldest first.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Sweep {
    pub events: Vec<NormalizedEvent>,
    /// Found but not for rover (its own posts, say), with the reason.
    pub skipped: Vec<SkippedEvent>,
}

fn time(t: DateTime<Utc>) -> String {
    t.to_rfc3339_opts(SecondsFormat::Secs, true)
}

fn envelope(kind: &str, actor: &str, repo: &str, at: DateTime<Utc>, payload: &Value) -> Value {
    json!({"id": "reconcile", "type": kind, "actor": {"login": actor}, "repo": {"name": repo},
           "payload": payload, "created_at": time(at)})
}

/// The `IssuesEvent opened` an issue of the list stands for.
pub fn issue_opened(repo: &str, issue: &Issue, at: DateTime<Utc>) -> Value {
    let labels: Vec<Value> = issue.labels.iter().map(|l| json!({"name": l})).collect();
    envelope(
        "IssuesEvent",
        &issue.author,
        repo,
        at,
        &json!({"action": "opened", "issue": {"number": issue.number, "title": issue.title,
                "body": issue.body, "html_url": issue.html_url, "labels": labels,
                "user": {"login": issue.author}}}),
    )
}

fn pr_payload(pr: &PullRequest) -> Value {
    json!({"number": pr.number, "html_url": pr.html_url, "merged": pr.merged,
           "head": {"ref": pr.head_branch, "sha": pr.head_sha}, "base": {"ref": pr.base_branch}})
}

/// The `PullRequestEvent opened` a pull request of the list stands for.
pub fn pull_opened(repo: &str, pr: &PullRequest, at: DateTime<Utc>) -> Value {
    envelope(
        "PullRequestEvent",
        &pr.author,
        repo,
        at,
        &json!({"action": "opened", "number": pr.number, "pull_request": pr_payload(pr)}),
    )
}

/// The `IssueCommentEvent created` of a comment on issue or PR `number`.
pub fn comment_created(
    repo: &str,
    number: u64,
    is_pull_request: bool,
    comment: &Comment,
    at: DateTime<Utc>,
) -> Value {
    let mut issue = json!({"number": number});
    if is_pull_request {
        issue["pull_request"] = json!({});
    }
    envelope(
        "IssueCommentEvent",
        &comment.author,
        repo,
        at,
        &json!({"action": "created", "issue": issue, "comment": {"id": comment.id,
                "body": comment.body, "html_url": comment.html_url,
                "user": {"login": comment.author}}}),
    )
}

/// The `PullRequestReviewEvent created` of a review of `pr`.
pub fn review_submitted(repo: &str, pr: &PullRequest, review: &Review, at: DateTime<Utc>) -> Value {
    envelope(
        "PullRequestReviewEvent",
        &review.author,
        repo,
        at,
        &json!({"action": "created", "pull_request": pr_payload(pr), "review": {"id": review.id,
                "body": review.body, "state": review.state.to_ascii_lowercase(),
                "commit_id": review.commit_id, "html_url": review.html_url}}),
    )
}

/// The `PullRequestReviewCommentEvent created` of a review comment on `pr`.
pub fn review_comment_created(
    repo: &str,
    pr: &PullRequest,
    comment: &ReviewComment,
    commit_id: Option<&str>,
    at: DateTime<Utc>,
) -> Value {
    envelope(
        "PullRequestReviewCommentEvent",
        &comment.author,
        repo,
        at,
        &json!({"action": "created", "pull_request": pr_payload(pr), "comment": {"id": comment.id,
                "in_reply_to_id": comment.in_reply_to_id,
                "pull_request_review_id": comment.review_id, "body": comment.body,
                "path": comment.path, "commit_id": commit_id, "html_url": comment.html_url}}),
    )
}

/// Normalize envelopes (oldest first) as the poller would; a kept event's id becomes
/// `reconcile:<content key>`, so the same thing found again is recognised by its id.
pub fn normalize_all(items: &[Value], options: &NormalizeOptions) -> Sweep {
    let mut sweep = Sweep::default();
    for item in items {
        match normalize_event(item, options) {
            Ok(mut event) => {
                let Some(key) = event.dedupe_key.clone() else {
                    continue;
                };
                event.id = format!("{ID_PREFIX}{key}");
                sweep.events.push(event);
            }
            Err(reason) => {
                let mut skipped = SkippedEvent::of(item, reason);
                skipped.id = None;
                sweep.skipped.push(skipped);
            }
        }
    }
    sweep
}

/// Sweep the list APIs for what happened since `since`: issues and pull requests opened, issue
/// comments, and reviews of pull requests updated since.
pub async fn sweep(
    github: &dyn GitHub,
    since: DateTime<Utc>,
    options: &NormalizeOptions,
) -> Result<Sweep, GitHubError> {
    let repo = github.repo().to_string();
    let issues = github.list_issues_since(since).await?;
    let comments = github.list_issue_comments_since(since).await?;
    let review_comments = github.list_review_comments_since(since).await?;
    let mut pulls: HashMap<u64, PullRequest> = HashMap::new();
    let mut items: Vec<(DateTime<Utc>, Value)> = Vec::new();
    let kinds: HashMap<u64, bool> = issues
        .iter()
        .map(|l| (l.issue.number, l.issue.is_pull_request))
        .collect();
    for listed in &issues {
        let number = listed.issue.number;
        if !listed.issue.is_pull_request {
            if let Some(at) = listed.created_at.filter(|t| *t >= since) {
                items.push((at, issue_opened(&repo, &listed.issue, at)));
            }
            continue;
        }
        let pr = github.get_pull_request(number).await?;
        if let Some(at) = listed.created_at.filter(|t| *t >= since) {
            items.push((at, pull_opened(&repo, &pr, at)));
        }
        for review in github.list_reviews(number).await? {
            if review.state.eq_ignore_ascii_case("PENDING") {
                continue;
            }
            if let Some(at) = review.submitted_at.filter(|t| *t >= since) {
                items.push((at, review_submitted(&repo, &pr, &review, at)));
            }
        }
        pulls.insert(number, pr);
    }
    for listed in &comments {
        let Some(at) = listed.comment.created_at.filter(|t| *t >= since) else {
            continue;
        };
        // A new comment updates its issue, so the issue is in the list; if not, ask.
        let is_pr = match kinds.get(&listed.number) {
            Some(is_pr) => *is_pr,
            None => github.get_issue(listed.number).await?.is_pull_request,
        };
        items.push((
            at,
            comment_created(&repo, listed.number, is_pr, &listed.comment, at),
        ));
    }
    for listed in &review_comments {
        let Some(at) = listed.comment.created_at.filter(|t| *t >= since) else {
            continue;
        };
        let pr = if let Some(pr) = pulls.get(&listed.number) {
            pr.clone()
        } else {
            let pr = github.get_pull_request(listed.number).await?;
            pulls.insert(listed.number, pr.clone());
            pr
        };
        items.push((
            at,
            review_comment_created(&repo, &pr, &listed.comment, listed.commit_id.as_deref(), at),
        ));
    }
    items.sort_by_key(|(at, _)| *at);
    let items: Vec<Value> = items.into_iter().map(|(_, v)| v).collect();
    Ok(normalize_all(&items, options))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::github::api::IssueState;
    use crate::github::events::{Channel, EventKind, SkipReason};

    fn at() -> DateTime<Utc> {
        DateTime::from_timestamp(1_800_000_000, 0).expect("valid")
    }

    fn comment(id: u64, author: &str, body: &str) -> Comment {
        Comment {
            id,
            author: author.into(),
            body: body.into(),
            html_url: "h".into(),
            created_at: Some(at()),
        }
    }

    fn pr() -> PullRequest {
        PullRequest {
            number: 8,
            title: "t".into(),
            body: "b".into(),
            state: IssueState::Open,
            draft: false,
            merged: false,
            labels: vec![],
            author: "alice".into(),
            head_branch: "feat".into(),
            head_sha: "abc".into(),
            head_repo: Some("o/r".into()),
            maintainer_can_modify: false,
            base_branch: "main".into(),
            html_url: "h".into(),
            mergeable_state: None,
        }
    }

    #[test]
    fn list_items_get_the_feeds_content_keys_and_filters() {
        let opts = NormalizeOptions {
            bot_login: Some("rover-bot".into()),
            ..NormalizeOptions::default()
        };
        let issue = Issue {
            number: 7,
            title: "Crash".into(),
            body: "boom".into(),
            state: IssueState::Open,
            labels: vec!["bug".into()],
            author: "alice".into(),
            is_pull_request: false,
            html_url: "h".into(),
            comments: 0,
        };
        let review = Review {
            id: 41,
            author: "bob".into(),
            body: "needs work".into(),
            state: "CHANGES_REQUESTED".into(),
            commit_id: Some("abc".into()),
            html_url: "h".into(),
            submitted_at: Some(at()),
        };
        let items = [
            issue_opened("o/r", &issue, at()),
            pull_opened("o/r", &pr(), at()),
            comment_created("o/r", 8, true, &comment(31, "alice", "@rover rebase"), at()),
            review_submitted("o/r", &pr(), &review, at()),
            comment_created("o/r", 7, false, &comment(32, "rover-bot", "on it"), at()),
            review_comment_created(
                "o/r",
                &pr(),
                &ReviewComment {
                    id: 52,
                    review_id: Some(41),
                    in_reply_to_id: Some(51),
                    author: "bob".into(),
                    body: "why?".into(),
                    path: "src/lib.rs".into(),
                    line: Some(3),
                    html_url: "h".into(),
                    created_at: Some(at()),
                },
                Some("abc"),
                at(),
            ),
        ];
        let sweep = normalize_all(&items, &opts);
        let got: Vec<(&str, EventKind, Channel)> = sweep
            .events
            .iter()
            .map(|e| (e.id.as_str(), e.kind, e.channel.clone()))
            .collect();
        assert_eq!(
            got,
            vec![
                (
                    "reconcile:IssuesEvent:opened:#7",
                    EventKind::Issues,
                    Channel::IssueComment { number: 7 }
                ),
                (
                    "reconcile:PullRequestEvent:opened:#8",
                    EventKind::PullRequest,
                    Channel::PrComment { number: 8 }
                ),
                (
                    "reconcile:IssueCommentEvent:comment:31",
                    EventKind::IssueComment,
                    Channel::PrComment { number: 8 }
                ),
                (
                    "reconcile:PullRequestReviewEvent:review:41",
                    EventKind::PullRequestReview,
                    Channel::PrReview { number: 8 }
                ),
                (
                    "reconcile:PullRequestReviewCommentEvent:comment:52",
                    EventKind::PullRequestReviewComment,
                    Channel::ReviewThreadReply {
                        number: 8,
                        comment_id: 51
                    }
                ),
            ]
        );
        assert_eq!(sweep.events[4].commit_sha.as_deref(), Some("abc"));
        assert_eq!(sweep.events[1].head_branch.as_deref(), Some("feat"));
        assert_eq!(sweep.events[0].label, None, "opened carries no label");
        assert_eq!(sweep.skipped.len(), 1);
        assert_eq!(sweep.skipped[0].reason, SkipReason::Own);
    }
}
