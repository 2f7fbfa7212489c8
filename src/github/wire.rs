//! Lenient wire shapes of GitHub's REST answers: only what rover reads, everything defaulted,
//! converted into the records of `api`.

use chrono::{DateTime, Utc};
use serde::Deserialize;
use serde_json::Value;

use super::api::{
    CiState, CiStatus, Comment, Issue, IssueState, ListedComment, ListedIssue, ListedReviewComment,
    Permission, Posted, PullRequest, Review, ReviewComment,
};

#[derive(Deserialize, Default)]
struct RawUser {
    #[serde(default)]
    login: String,
}

#[derive(Deserialize)]
struct RawLabel {
    #[serde(default)]
    name: String,
}

fn login(u: Option<RawUser>) -> String {
    u.unwrap_or_default().login
}

fn state(s: &str) -> IssueState {
    if s.eq_ignore_ascii_case("closed") {
        IssueState::Closed
    } else {
        IssueState::Open
    }
}

#[derive(Deserialize)]
pub(super) struct RawIssue {
    number: u64,
    #[serde(default)]
    title: String,
    body: Option<String>,
    #[serde(default)]
    state: String,
    #[serde(default)]
    labels: Vec<RawLabel>,
    user: Option<RawUser>,
    pull_request: Option<Value>,
    #[serde(default)]
    html_url: String,
    #[serde(default)]
    comments: u64,
    created_at: Option<DateTime<Utc>>,
    updated_at: Option<DateTime<Utc>>,
}

impl From<RawIssue> for ListedIssue {
    fn from(r: RawIssue) -> Self {
        let (created_at, updated_at) = (r.created_at, r.updated_at);
        Self {
            issue: r.into(),
            created_at,
            updated_at,
        }
    }
}

impl From<RawIssue> for Issue {
    fn from(r: RawIssue) -> Self {
        Self {
            number: r.number,
            title: r.title,
            body: r.body.unwrap_or_default(),
            state: state(&r.state),
            labels: r.labels.into_iter().map(|l| l.name).collect(),
            author: login(r.user),
            is_pull_request: r.pull_request.is_some(),
            html_url: r.html_url,
            comments: r.comments,
        }
    }
}

#[derive(Deserialize, Default)]
struct RawBranch {
    #[serde(default, rename = "ref")]
    git_ref: String,
    #[serde(default)]
    sha: String,
    /// `null` for the head of a pull request whose fork was deleted.
    #[serde(default)]
    repo: Option<RawRepo>,
}

#[derive(Deserialize)]
struct RawRepo {
    full_name: String,
}

#[derive(Deserialize)]
pub(super) struct RawPull {
    number: u64,
    #[serde(default)]
    title: String,
    body: Option<String>,
    #[serde(default)]
    state: String,
    #[serde(default)]
    draft: bool,
    merged: Option<bool>,
    merged_at: Option<String>,
    #[serde(default)]
    labels: Vec<RawLabel>,
    user: Option<RawUser>,
    #[serde(default)]
    head: RawBranch,
    #[serde(default)]
    base: RawBranch,
    #[serde(default)]
    html_url: String,
    #[serde(default)]
    maintainer_can_modify: bool,
    #[serde(default)]
    mergeable_state: Option<String>,
}

impl From<RawPull> for PullRequest {
    fn from(r: RawPull) -> Self {
        Self {
            number: r.number,
            title: r.title,
            body: r.body.unwrap_or_default(),
            state: state(&r.state),
            draft: r.draft,
            merged: r.merged.unwrap_or(r.merged_at.is_some()),
            labels: r.labels.into_iter().map(|l| l.name).collect(),
            author: login(r.user),
            head_repo: r.head.repo.map(|repo| repo.full_name),
            head_branch: r.head.git_ref,
            head_sha: r.head.sha,
            maintainer_can_modify: r.maintainer_can_modify,
            base_branch: r.base.git_ref,
            html_url: r.html_url,
            mergeable_state: r.mergeable_state,
        }
    }
}

#[derive(Deserialize)]
pub(super) struct RawComment {
    id: u64,
    user: Option<RawUser>,
    body: Option<String>,
    #[serde(default)]
    html_url: String,
    created_at: Option<DateTime<Utc>>,
    #[serde(default)]
    issue_url: Option<String>,
}

impl RawComment {
    /// A comment of the repository-wide list, with its issue's number (the end of
    /// `issue_url`); `None` without one.
    pub(super) fn listed(self) -> Option<ListedComment> {
        let number = self
            .issue_url
            .as_deref()?
            .rsplit('/')
            .next()?
            .parse()
            .ok()?;
        Some(ListedComment {
            number,
            comment: self.into(),
        })
    }
}

impl From<RawComment> for Comment {
    fn from(r: RawComment) -> Self {
        Self {
            id: r.id,
            author: login(r.user),
            body: r.body.unwrap_or_default(),
            html_url: r.html_url,
            created_at: r.created_at,
        }
    }
}

#[derive(Deserialize)]
pub(super) struct RawReview {
    id: u64,
    user: Option<RawUser>,
    body: Option<String>,
    #[serde(default)]
    state: String,
    commit_id: Option<String>,
    #[serde(default)]
    html_url: String,
    submitted_at: Option<DateTime<Utc>>,
}

impl From<RawReview> for Review {
    fn from(r: RawReview) -> Self {
        Self {
            id: r.id,
            author: login(r.user),
            body: r.body.unwrap_or_default(),
            state: r.state.to_ascii_uppercase(),
            commit_id: r.commit_id,
            html_url: r.html_url,
            submitted_at: r.submitted_at,
        }
    }
}

#[derive(Deserialize)]
pub(super) struct RawReviewComment {
    id: u64,
    pull_request_review_id: Option<u64>,
    in_reply_to_id: Option<u64>,
    user: Option<RawUser>,
    body: Option<String>,
    #[serde(default)]
    path: String,
    line: Option<u64>,
    #[serde(default)]
    html_url: String,
    created_at: Option<DateTime<Utc>>,
    #[serde(default)]
    pull_request_url: Option<String>,
    #[serde(default)]
    commit_id: Option<String>,
}

impl RawReviewComment {
    /// A review comment of the repository-wide list, with its pull request's number (the end
    /// of `pull_request_url`); `None` without one.
    pub(super) fn listed(mut self) -> Option<ListedReviewComment> {
        let number = self
            .pull_request_url
            .as_deref()?
            .rsplit('/')
            .next()?
            .parse()
            .ok()?;
        let commit_id = self.commit_id.take();
        Some(ListedReviewComment {
            number,
            commit_id,
            comment: self.into(),
        })
    }
}

impl From<RawReviewComment> for ReviewComment {
    fn from(r: RawReviewComment) -> Self {
        Self {
            id: r.id,
            review_id: r.pull_request_review_id,
            in_reply_to_id: r.in_reply_to_id,
            author: login(r.user),
            body: r.body.unwrap_or_default(),
            path: r.path,
            line: r.line,
            html_url: r.html_url,
            created_at: r.created_at,
        }
    }
}

#[derive(Deserialize)]
pub(super) struct RawPosted {
    id: u64,
    #[serde(default)]
    html_url: String,
}

impl From<RawPosted> for Posted {
    fn from(r: RawPosted) -> Self {
        Self {
            id: r.id,
            html_url: r.html_url,
        }
    }
}

#[derive(Deserialize)]
pub(super) struct RawPermission {
    #[serde(default)]
    permission: String,
    role_name: Option<String>,
}

impl From<RawPermission> for Permission {
    fn from(r: RawPermission) -> Self {
        // `role_name` distinguishes maintain/triage, which `permission` folds into write/read.
        match r.role_name.as_deref().map(Permission::parse) {
            Some(p) if p != Permission::None => p,
            _ => Permission::parse(&r.permission),
        }
    }
}

#[derive(Deserialize)]
struct RawStatus {
    #[serde(default)]
    state: String,
    #[serde(default)]
    context: String,
}

#[derive(Deserialize)]
pub(super) struct RawCombined {
    #[serde(default)]
    sha: String,
    #[serde(default)]
    statuses: Vec<RawStatus>,
}

#[derive(Deserialize)]
struct RawCheckRun {
    #[serde(default)]
    name: String,
    #[serde(default)]
    status: String,
    conclusion: Option<String>,
}

#[derive(Deserialize)]
pub(super) struct RawCheckRuns {
    #[serde(default)]
    check_runs: Vec<RawCheckRun>,
}

/// Pure: fold combined statuses and check runs into one summary.
pub(super) fn summarize_ci(sha: String, combined: RawCombined, checks: &RawCheckRuns) -> CiStatus {
    let mut failing = Vec::new();
    let mut pending = Vec::new();
    for s in &combined.statuses {
        match s.state.as_str() {
            "success" => {}
            "pending" => pending.push(s.context.clone()),
            _ => failing.push(s.context.clone()),
        }
    }
    for c in &checks.check_runs {
        if c.status != "completed" {
            pending.push(c.name.clone());
            continue;
        }
        match c.conclusion.as_deref() {
            Some("success" | "neutral" | "skipped") => {}
            _ => failing.push(c.name.clone()),
        }
    }
    let total = combined.statuses.len() + checks.check_runs.len();
    let state = if !failing.is_empty() {
        CiState::Failure
    } else if !pending.is_empty() || total == 0 {
        CiState::Pending
    } else {
        CiState::Success
    };
    CiStatus {
        sha: if combined.sha.is_empty() {
            sha
        } else {
            combined.sha
        },
        state,
        failing,
        pending,
        total,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_pull_request_says_where_its_head_lives_and_whether_maintainers_may_push() {
        // As `GET /repos/{owner}/{repo}/pulls/{n}` answers for a fork's pull request (trimmed).
        let fork: RawPull = serde_json::from_value(json!({"number": 7, "state": "open",
            "user": {"login": "bob"}, "maintainer_can_modify": true,
            "head": {"label": "bob:fix", "ref": "fix", "sha": "abc",
                     "repo": {"id": 2, "name": "widgets", "full_name": "bob/widgets"}},
            "base": {"label": "octo-org:main", "ref": "main", "sha": "def",
                     "repo": {"id": 1, "name": "widgets", "full_name": "octo-org/widgets"}}}))
        .expect("json");
        let fork = PullRequest::from(fork);
        assert_eq!(fork.head_repo.as_deref(), Some("bob/widgets"));
        assert!(fork.maintainer_can_modify);
        assert!(!fork.head_in("octo-org/widgets"));
        assert!(fork.head_in("Bob/Widgets"));
        // A deleted fork: `repo` is null; the flag is absent from older payloads.
        let gone: RawPull = serde_json::from_value(json!({"number": 8, "state": "open",
            "head": {"ref": "fix", "sha": "abc", "repo": null}, "base": {"ref": "main"}}))
        .expect("json");
        let gone = PullRequest::from(gone);
        assert_eq!(gone.head_repo, None);
        assert!(!gone.maintainer_can_modify);
        assert!(!gone.head_in("octo-org/widgets"));
    }

    #[test]
    fn ci_summary_folds_statuses_and_checks() {
        let combined: RawCombined = serde_json::from_value(json!({"sha": "abc", "statuses": [
            {"state": "success", "context": "lint"}, {"state": "error", "context": "deploy"}]}))
        .expect("json");
        let checks: RawCheckRuns = serde_json::from_value(json!({"check_runs": [
            {"name": "test", "status": "completed", "conclusion": "failure"},
            {"name": "build", "status": "in_progress", "conclusion": null},
            {"name": "docs", "status": "completed", "conclusion": "skipped"}]}))
        .expect("json");
        let s = summarize_ci("abc".into(), combined, &checks);
        assert_eq!(s.state, CiState::Failure);
        assert_eq!(s.failing, vec!["deploy".to_owned(), "test".to_owned()]);
        assert_eq!(s.pending, vec!["build".to_owned()]);
        let empty = summarize_ci(
            "abc".into(),
            RawCombined {
                sha: String::new(),
                statuses: vec![],
            },
            &RawCheckRuns { check_runs: vec![] },
        );
        assert_eq!((empty.state, empty.total), (CiState::Pending, 0));
    }
}
