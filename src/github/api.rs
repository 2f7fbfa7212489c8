//! The narrow `GitHub` trait the steps call, and the plain records it returns.

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use super::error::GitHubError;
use super::events::EventPage;
use super::poll::ResponseMeta;
use super::reactions::{ReactionTarget, ReactionsFetch};

/// `owner/name` of a repository.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct RepoRef {
    pub owner: String,
    pub name: String,
}

impl RepoRef {
    /// Parse `owner/name`.
    pub fn parse(full: &str) -> Result<Self, GitHubError> {
        let bad = || GitHubError::Config {
            what: "repository".into(),
            detail: format!("{full:?} is not of the form owner/name"),
        };
        let (owner, name) = full.split_once('/').ok_or_else(bad)?;
        let ok = |s: &str| {
            !s.is_empty()
                && s.chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
                && s != "."
                && s != ".."
        };
        if !ok(owner) || !ok(name) {
            return Err(bad());
        }
        Ok(Self {
            owner: owner.to_owned(),
            name: name.to_owned(),
        })
    }
}

impl std::fmt::Display for RepoRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.owner, self.name)
    }
}

/// The answer to an events poll.
#[derive(Debug, Clone)]
pub enum EventsFetch {
    /// 304: nothing new since the ETag.
    NotModified { meta: ResponseMeta },
    /// A page, normalized.
    Page { page: EventPage, meta: ResponseMeta },
}

/// Open or closed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum IssueState {
    Open,
    Closed,
}

/// An issue as the coordinator needs it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Issue {
    pub number: u64,
    pub title: String,
    pub body: String,
    pub state: IssueState,
    pub labels: Vec<String>,
    pub author: String,
    pub is_pull_request: bool,
    pub html_url: String,
    pub comments: u64,
}

/// A pull request as the coordinator and the pusher need it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PullRequest {
    pub number: u64,
    pub title: String,
    pub body: String,
    pub state: IssueState,
    pub draft: bool,
    pub merged: bool,
    pub labels: Vec<String>,
    pub author: String,
    pub head_branch: String,
    pub head_sha: String,
    /// The repository the head branch lives in (`owner/name`): this repository's for a branch
    /// of it, a fork's otherwise; `None` when the fork was deleted.
    pub head_repo: Option<String>,
    /// Whether the author lets maintainers push to the head branch ("Allow edits by
    /// maintainers"; GitHub's `maintainer_can_modify`).
    pub maintainer_can_modify: bool,
    pub base_branch: String,
    pub html_url: String,
    /// GitHub's `mergeable_state` (`clean`, `behind`: the base moved past the head, `dirty`:
    /// a conflict, `blocked`, `unstable`, `unknown` while GitHub computes it); `None` when
    /// the answer had none.
    #[serde(default)]
    pub mergeable_state: Option<String>,
}

impl PullRequest {
    /// Whether the head branch is a branch of `repo` (`owner/name`, compared as GitHub does,
    /// without regard to case), not of a fork.
    pub fn head_in(&self, repo: &str) -> bool {
        self.head_repo
            .as_deref()
            .is_some_and(|r| r.eq_ignore_ascii_case(repo))
    }
}

/// A comment on an issue or PR conversation, or on a commit.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Comment {
    pub id: u64,
    pub author: String,
    pub body: String,
    pub html_url: String,
    pub created_at: Option<DateTime<Utc>>,
}

/// An issue or pull request from the repository's list, with its times (for reconcile).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ListedIssue {
    pub issue: Issue,
    pub created_at: Option<DateTime<Utc>>,
    pub updated_at: Option<DateTime<Utc>>,
}

/// A comment from the repository-wide list of issue comments, with its issue's number.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ListedComment {
    pub number: u64,
    pub comment: Comment,
}

/// A review comment from the repository-wide list, with its pull request's number.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ListedReviewComment {
    pub number: u64,
    /// The commit the comment is on.
    pub commit_id: Option<String>,
    pub comment: ReviewComment,
}

/// A PR review.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Review {
    pub id: u64,
    pub author: String,
    pub body: String,
    /// `APPROVED`, `CHANGES_REQUESTED`, `COMMENTED`, `DISMISSED`, `PENDING`.
    pub state: String,
    pub commit_id: Option<String>,
    pub html_url: String,
    pub submitted_at: Option<DateTime<Utc>>,
}

/// A merge rover asks GitHub for (`PUT /pulls/{n}/merge`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MergeRequest {
    /// The head whose checks passed: GitHub merges only this commit.
    pub sha: String,
    /// `squash`, `merge` or `rebase`.
    pub method: String,
    pub title: String,
    pub message: String,
}

/// A merge GitHub made.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Merged {
    /// The commit the merge made on the base branch.
    pub sha: String,
    /// GitHub's words (`Pull Request successfully merged`).
    pub message: String,
}

/// A GitHub release.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Release {
    pub id: u64,
    pub tag_name: String,
    /// The commit (or branch) the tag was made from.
    pub target_commitish: String,
    pub html_url: String,
    pub created_at: Option<DateTime<Utc>>,
    #[serde(default)]
    pub draft: bool,
    #[serde(default)]
    pub prerelease: bool,
}

/// A release rover asks GitHub for (`POST /releases`): GitHub makes the tag at the target.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NewRelease {
    pub tag_name: String,
    /// The commit to tag (a sha).
    pub target_commitish: String,
    pub name: String,
    pub body: String,
}

/// A merged pull request, as release notes list it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MergedPull {
    pub number: u64,
    pub title: String,
    pub html_url: String,
    pub merged_at: DateTime<Utc>,
}

/// A comment in a PR review thread (on a diff line).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ReviewComment {
    pub id: u64,
    pub review_id: Option<u64>,
    pub in_reply_to_id: Option<u64>,
    pub author: String,
    pub body: String,
    pub path: String,
    pub line: Option<u64>,
    pub html_url: String,
    pub created_at: Option<DateTime<Utc>>,
}

/// A user's permission on the repository.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Permission {
    Admin,
    Maintain,
    Write,
    Triage,
    Read,
    None,
}

impl Permission {
    /// Parse GitHub's `permission` / `role_name` strings; unknown means none.
    pub fn parse(s: &str) -> Self {
        match s {
            "admin" => Self::Admin,
            "maintain" => Self::Maintain,
            "write" | "push" => Self::Write,
            "triage" => Self::Triage,
            "read" | "pull" => Self::Read,
            _ => Self::None,
        }
    }

    /// GitHub's name for it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Admin => "admin",
            Self::Maintain => "maintain",
            Self::Write => "write",
            Self::Triage => "triage",
            Self::Read => "read",
            Self::None => "no",
        }
    }

    /// Whether this permission allows pushing (admin, maintain, write).
    pub fn can_write(self) -> bool {
        matches!(self, Self::Admin | Self::Maintain | Self::Write)
    }
}

/// Overall CI outcome for a ref.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum CiState {
    Success,
    Failure,
    Pending,
}

/// Combined statuses and check runs for a ref, in one summary.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CiStatus {
    pub sha: String,
    pub state: CiState,
    /// Names of failing statuses and check runs.
    pub failing: Vec<String>,
    /// Names still running or queued.
    pub pending: Vec<String>,
    /// How many statuses and check runs there were.
    pub total: usize,
}

/// What kind of PR review to post.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum ReviewEvent {
    Comment,
    RequestChanges,
    Approve,
}

/// Something rover posted (or found it had posted).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Posted {
    pub id: u64,
    pub html_url: String,
}

/// A pull request to open.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NewPullRequest {
    pub title: String,
    pub head: String,
    pub base: String,
    pub body: String,
    pub draft: bool,
}

/// What the steps need from GitHub, for the one repository rover watches.
#[async_trait]
pub trait GitHub: Send + Sync {
    /// The repository this client talks about.
    fn repo(&self) -> &RepoRef;
    /// Poll the events feed; `etag` from the previous page makes an unchanged feed a free 304.
    async fn list_events(&self, etag: Option<&str>) -> Result<EventsFetch, GitHubError>;
    /// A further page of the events feed: `next` is the previous page's `Link: rel="next"` URL
    /// (no ETag: it is page 1's).
    async fn list_events_page(&self, next: &str) -> Result<EventsFetch, GitHubError>;
    /// Issues and pull requests updated since `since`, least recently updated first.
    async fn list_issues_since(
        &self,
        since: DateTime<Utc>,
    ) -> Result<Vec<ListedIssue>, GitHubError>;
    /// Comments on issues and pull request conversations updated since `since`, oldest first.
    async fn list_issue_comments_since(
        &self,
        since: DateTime<Utc>,
    ) -> Result<Vec<ListedComment>, GitHubError>;
    /// Review (diff) comments on pull requests updated since `since`, oldest first.
    async fn list_review_comments_since(
        &self,
        since: DateTime<Utc>,
    ) -> Result<Vec<ListedReviewComment>, GitHubError>;
    /// An issue (pull requests are issues too).
    async fn get_issue(&self, number: u64) -> Result<Issue, GitHubError>;
    /// A pull request.
    async fn get_pull_request(&self, number: u64) -> Result<PullRequest, GitHubError>;
    /// The last `last` comments of an issue or PR conversation, oldest first.
    async fn list_comments(&self, number: u64, last: usize) -> Result<Vec<Comment>, GitHubError>;
    /// Reviews of a PR, oldest first.
    async fn list_reviews(&self, number: u64) -> Result<Vec<Review>, GitHubError>;
    /// Review (diff) comments of a PR, oldest first.
    async fn list_review_comments(&self, number: u64) -> Result<Vec<ReviewComment>, GitHubError>;
    /// Comments on a commit.
    async fn list_commit_comments(&self, sha: &str) -> Result<Vec<Comment>, GitHubError>;
    /// A user's permission on the repository.
    async fn permission(&self, login: &str) -> Result<Permission, GitHubError>;
    /// Combined statuses and check runs for a ref or sha.
    async fn ci_status(&self, git_ref: &str) -> Result<CiStatus, GitHubError>;
    /// Comment on an issue or PR conversation.
    async fn post_comment(&self, number: u64, body: &str) -> Result<Posted, GitHubError>;
    /// Post a PR review.
    async fn post_review(
        &self,
        number: u64,
        event: ReviewEvent,
        body: &str,
    ) -> Result<Posted, GitHubError>;
    /// Reply in the review thread started by `comment_id`.
    async fn reply_to_review_comment(
        &self,
        number: u64,
        comment_id: u64,
        body: &str,
    ) -> Result<Posted, GitHubError>;
    /// Comment on a commit.
    async fn post_commit_comment(&self, sha: &str, body: &str) -> Result<Posted, GitHubError>;
    /// The open PR whose head is `branch` (in this repository), if any.
    async fn find_pull_request_for_branch(
        &self,
        branch: &str,
    ) -> Result<Option<PullRequest>, GitHubError>;
    /// Open a PR.
    async fn open_pull_request(&self, new: &NewPullRequest) -> Result<PullRequest, GitHubError>;
    /// The paths a pull request changes (a renamed file counts under both names).
    async fn pull_request_files(&self, number: u64) -> Result<Vec<String>, GitHubError>;
    /// Merge a pull request at exactly `merge.sha` (GitHub refuses with 409 when the head moved,
    /// 405 when it is not mergeable: protection, required checks or reviews).
    async fn merge_pull_request(
        &self,
        number: u64,
        merge: &MergeRequest,
    ) -> Result<Merged, GitHubError>;
    /// Bring pull request `number`'s branch up to date with its base (GitHub merges the base
    /// into it later: 202), only while its head is `expected_head_sha` (422 otherwise, and
    /// when there is nothing to bring or a conflict); returns GitHub's words.
    async fn update_pull_request_branch(
        &self,
        number: u64,
        expected_head_sha: &str,
    ) -> Result<String, GitHubError>;
    /// The repository's releases, newest first (the first page: up to 100).
    async fn list_releases(&self) -> Result<Vec<Release>, GitHubError>;
    /// Make a release (and its tag at `new.target_commitish`); 422 when the tag exists.
    async fn create_release(&self, new: &NewRelease) -> Result<Release, GitHubError>;
    /// The pull requests merged into `base`, most recently updated first (the first page of
    /// closed ones: up to 100).
    async fn merged_pull_requests(&self, base: &str) -> Result<Vec<MergedPull>, GitHubError>;
    /// React with `content` (`eyes`, `-1`, ...) on `target`; the same reaction twice is one.
    async fn react(&self, target: ReactionTarget, content: &str) -> Result<(), GitHubError>;
    /// Who reacted with `content` on `target`; with the last answer's `etag`, an unchanged list
    /// is `NotModified` (free).
    async fn reactions(
        &self,
        target: ReactionTarget,
        content: &str,
        etag: Option<&str>,
    ) -> Result<ReactionsFetch, GitHubError>;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repo_ref_parses_and_rejects() {
        let r = RepoRef::parse("octo-org/widgets.rs").expect("valid");
        assert_eq!(r.to_string(), "octo-org/widgets.rs");
        for bad in ["", "a", "a/", "/b", "a/b/c", "a/..", "a b/c"] {
            assert!(RepoRef::parse(bad).is_err(), "{bad} accepted");
        }
    }

    #[test]
    fn permissions_that_write() {
        assert!(Permission::parse("admin").can_write());
        assert!(Permission::parse("maintain").can_write());
        assert!(Permission::parse("write").can_write());
        assert!(!Permission::parse("triage").can_write());
        assert!(!Permission::parse("read").can_write());
        assert!(!Permission::parse("bogus").can_write());
    }
}
