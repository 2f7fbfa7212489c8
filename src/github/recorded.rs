//! The GitHub client as the daemon's steps use it: every read a step run makes is noted for
//! replay (`store::replay_record`) with its answer, and so is GitHub's answer to the writes a
//! step decides by (a merge, an update of a branch, a release); outside a step run, and for the
//! other writes, it only passes the call on. [`error_of_record`] turns a recorded failure back into the error.

use std::sync::Arc;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use serde::Serialize;

use super::api::{
    CiStatus, Comment, EventsFetch, GitHub, Issue, ListedComment, ListedIssue, ListedReviewComment,
    MergeRequest, Merged, NewPullRequest, Permission, Posted, PullRequest, RepoRef, Review,
    ReviewComment, ReviewEvent,
};
use super::error::GitHubError;
use super::reactions::{ReactionTarget, ReactionsFetch};
use super::redact::Redactor;
use crate::store::replay_record::{is_recording, note_read, RecordedError};

/// Wraps a client; reads made inside a recording are noted, with the secrets rover holds taken
/// out (an issue can quote one; the record is kept on disk and exported).
pub struct RecordingGitHub {
    inner: Arc<dyn GitHub>,
    redactor: Redactor,
}

impl RecordingGitHub {
    pub fn wrap(inner: Arc<dyn GitHub>, redactor: Redactor) -> Arc<dyn GitHub> {
        Arc::new(RecordingGitHub { inner, redactor })
    }

    fn note<T: Serialize>(&self, call: &str, key: &str, result: &Result<T, GitHubError>) {
        note_with(Some(&self.redactor), call, key, result);
    }
}

/// The key a deciding write's answer is recorded under: the pull request and the head it was
/// asked for, so a replay that would merge another head is not served the recorded answer.
pub fn write_key(number: u64, sha: &str) -> String {
    format!("{number}@{sha}")
}

/// A failed read as the record keeps it.
pub fn record_of_error(e: &GitHubError) -> RecordedError {
    let (status, said) = match e {
        GitHubError::Status {
            status, message, ..
        } => (Some(*status), vec![message.clone()]),
        GitHubError::Validation {
            message, errors, ..
        } => (
            Some(422),
            std::iter::once(message.clone())
                .chain(errors.iter().cloned())
                .collect(),
        ),
        _ => (None, Vec::new()),
    };
    RecordedError {
        message: e.to_string(),
        not_found: matches!(e, GitHubError::NotFound { .. }),
        retryable: e.is_retryable(),
        retry_at: e.retry_at(),
        status,
        said,
    }
}

/// A recorded failure as the error a step sees (its class kept: 404, retryable or not).
pub fn error_of_record(call: &str, e: &RecordedError) -> GitHubError {
    if let Some(until) = e.retry_at {
        GitHubError::RateLimited {
            what: format!("{call} (recorded: {})", e.message),
            until,
        }
    } else if e.not_found {
        GitHubError::NotFound {
            what: format!("{call} (recorded: {})", e.message),
        }
    } else if let (Some(422), Some((message, errors))) = (e.status, e.said.split_first()) {
        GitHubError::Validation {
            what: format!("{call} (recorded)"),
            message: message.clone(),
            errors: errors.to_vec(),
        }
    } else if let (Some(status), false) = (e.status, e.retryable) {
        GitHubError::Status {
            what: format!("{call} (recorded)"),
            status,
            message: e.said.first().cloned().unwrap_or_else(|| e.message.clone()),
        }
    } else if e.retryable {
        GitHubError::Server {
            what: format!("{call} (recorded: {})", e.message),
            status: 503,
        }
    } else {
        GitHubError::Status {
            what: call.to_owned(),
            status: 0,
            message: format!("recorded: {}", e.message),
        }
    }
}

/// Note `result` of `call(key)` when a recording is on (a value without text that could hold a
/// secret: a permission).
pub fn note<T: Serialize>(call: &str, key: &str, result: &Result<T, GitHubError>) {
    note_with(None, call, key, result);
}

/// [`note`], the held secrets masked in the answer's text first.
fn note_with<T: Serialize>(
    redactor: Option<&Redactor>,
    call: &str,
    key: &str,
    result: &Result<T, GitHubError>,
) {
    if !is_recording() {
        return;
    }
    let redact = |text: String| match redactor {
        Some(r) => r.redact_held(&text),
        None => text,
    };
    let answer = match result {
        Ok(value) => serde_json::to_string(value)
            .ok()
            .and_then(|json| serde_json::from_str(&redact(json)).ok())
            .ok_or_else(|| RecordedError {
                message: "the answer could not be recorded".to_owned(),
                not_found: false,
                ..RecordedError::default()
            }),
        Err(e) => {
            let mut error = record_of_error(e);
            error.message = redact(error.message);
            error.said = error.said.into_iter().map(&redact).collect();
            Err(error)
        }
    };
    note_read(call, &redact(key.to_owned()), answer);
}

#[async_trait]
impl GitHub for RecordingGitHub {
    fn repo(&self) -> &RepoRef {
        self.inner.repo()
    }
    async fn list_events(&self, etag: Option<&str>) -> Result<EventsFetch, GitHubError> {
        self.inner.list_events(etag).await
    }
    async fn list_events_page(&self, next: &str) -> Result<EventsFetch, GitHubError> {
        self.inner.list_events_page(next).await
    }
    async fn list_issues_since(
        &self,
        since: DateTime<Utc>,
    ) -> Result<Vec<ListedIssue>, GitHubError> {
        self.inner.list_issues_since(since).await
    }
    async fn list_issue_comments_since(
        &self,
        since: DateTime<Utc>,
    ) -> Result<Vec<ListedComment>, GitHubError> {
        self.inner.list_issue_comments_since(since).await
    }
    async fn list_review_comments_since(
        &self,
        since: DateTime<Utc>,
    ) -> Result<Vec<ListedReviewComment>, GitHubError> {
        self.inner.list_review_comments_since(since).await
    }
    async fn get_issue(&self, number: u64) -> Result<Issue, GitHubError> {
        let r = self.inner.get_issue(number).await;
        self.note("get_issue", &number.to_string(), &r);
        r
    }
    async fn get_pull_request(&self, number: u64) -> Result<PullRequest, GitHubError> {
        let r = self.inner.get_pull_request(number).await;
        self.note("get_pull_request", &number.to_string(), &r);
        r
    }
    async fn list_comments(&self, number: u64, last: usize) -> Result<Vec<Comment>, GitHubError> {
        let r = self.inner.list_comments(number, last).await;
        self.note("list_comments", &format!("{number}/{last}"), &r);
        r
    }
    async fn list_reviews(&self, number: u64) -> Result<Vec<Review>, GitHubError> {
        let r = self.inner.list_reviews(number).await;
        self.note("list_reviews", &number.to_string(), &r);
        r
    }
    async fn list_review_comments(&self, number: u64) -> Result<Vec<ReviewComment>, GitHubError> {
        let r = self.inner.list_review_comments(number).await;
        self.note("list_review_comments", &number.to_string(), &r);
        r
    }
    async fn list_commit_comments(&self, sha: &str) -> Result<Vec<Comment>, GitHubError> {
        let r = self.inner.list_commit_comments(sha).await;
        self.note("list_commit_comments", sha, &r);
        r
    }
    async fn pull_request_files(&self, number: u64) -> Result<Vec<String>, GitHubError> {
        let r = self.inner.pull_request_files(number).await;
        self.note("pull_request_files", &number.to_string(), &r);
        r
    }
    async fn merge_pull_request(
        &self,
        number: u64,
        merge: &MergeRequest,
    ) -> Result<Merged, GitHubError> {
        let r = self.inner.merge_pull_request(number, merge).await;
        self.note("merge_pull_request", &write_key(number, &merge.sha), &r);
        r
    }
    async fn update_pull_request_branch(
        &self,
        number: u64,
        expected_head_sha: &str,
    ) -> Result<String, GitHubError> {
        let r = self
            .inner
            .update_pull_request_branch(number, expected_head_sha)
            .await;
        self.note(
            "update_pull_request_branch",
            &write_key(number, expected_head_sha),
            &r,
        );
        r
    }
    async fn list_releases(&self) -> Result<Vec<crate::github::Release>, GitHubError> {
        let r = self.inner.list_releases().await;
        self.note("list_releases", "", &r);
        r
    }
    async fn create_release(
        &self,
        new: &crate::github::NewRelease,
    ) -> Result<crate::github::Release, GitHubError> {
        let r = self.inner.create_release(new).await;
        self.note("create_release", &new.tag_name, &r);
        r
    }
    async fn merged_pull_requests(
        &self,
        base: &str,
    ) -> Result<Vec<crate::github::MergedPull>, GitHubError> {
        let r = self.inner.merged_pull_requests(base).await;
        self.note("merged_pull_requests", base, &r);
        r
    }
    async fn permission(&self, login: &str) -> Result<Permission, GitHubError> {
        let r = self.inner.permission(login).await;
        self.note("permission", login, &r);
        r
    }
    async fn ci_status(&self, git_ref: &str) -> Result<CiStatus, GitHubError> {
        let r = self.inner.ci_status(git_ref).await;
        self.note("ci_status", git_ref, &r);
        r
    }
    async fn post_comment(&self, number: u64, body: &str) -> Result<Posted, GitHubError> {
        self.inner.post_comment(number, body).await
    }
    async fn post_review(
        &self,
        number: u64,
        event: ReviewEvent,
        body: &str,
    ) -> Result<Posted, GitHubError> {
        self.inner.post_review(number, event, body).await
    }
    async fn reply_to_review_comment(
        &self,
        number: u64,
        comment_id: u64,
        body: &str,
    ) -> Result<Posted, GitHubError> {
        self.inner
            .reply_to_review_comment(number, comment_id, body)
            .await
    }
    async fn post_commit_comment(&self, sha: &str, body: &str) -> Result<Posted, GitHubError> {
        self.inner.post_commit_comment(sha, body).await
    }
    async fn find_pull_request_for_branch(
        &self,
        branch: &str,
    ) -> Result<Option<PullRequest>, GitHubError> {
        let r = self.inner.find_pull_request_for_branch(branch).await;
        self.note("find_pull_request_for_branch", branch, &r);
        r
    }
    async fn open_pull_request(&self, new: &NewPullRequest) -> Result<PullRequest, GitHubError> {
        self.inner.open_pull_request(new).await
    }
    async fn react(&self, target: ReactionTarget, content: &str) -> Result<(), GitHubError> {
        self.inner.react(target, content).await
    }
    async fn reactions(
        &self,
        target: ReactionTarget,
        content: &str,
        etag: Option<&str>,
    ) -> Result<ReactionsFetch, GitHubError> {
        self.inner.reactions(target, content, etag).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn githubs_words_in_a_recorded_refusal_are_masked_like_its_message() {
        let dir = tempfile::tempdir().unwrap();
        let store = crate::store::AutopilotStore::open(dir.path(), "p").unwrap();
        let span = uuid::Uuid::new_v4();
        let redactor = Redactor::new(vec!["ghp_held_secret_value".to_owned()]);
        crate::store::replay_record::recording(&store, span, false, async {
            let refused: Result<Merged, GitHubError> = Err(GitHubError::Validation {
                what: "merge".into(),
                message: "ghp_held_secret_value is not allowed".into(),
                errors: vec!["again ghp_held_secret_value".into()],
            });
            note_with(Some(&redactor), "merge_pull_request", "7@abc", &refused);
        })
        .await;
        let record = crate::store::replay_record::read_record(&store, span)
            .unwrap()
            .unwrap();
        let error = record.github_reads[0].error.clone().unwrap();
        assert_eq!(error.status, Some(422));
        assert_eq!(error.said.len(), 2);
        let all = format!("{} {:?}", error.message, error.said);
        assert!(!all.contains("ghp_held_secret_value"), "{all}");
    }

    #[test]
    fn a_recorded_refusal_comes_back_with_its_status_and_githubs_words() {
        let refusals = [
            GitHubError::Status {
                what: "merge".into(),
                status: 405,
                message: "Head branch is out of date".into(),
            },
            GitHubError::Status {
                what: "merge".into(),
                status: 409,
                message: "Head branch was modified".into(),
            },
            GitHubError::Validation {
                what: "update-branch".into(),
                message: "merge conflict between base and head".into(),
                errors: vec!["one more".into()],
            },
        ];
        for refusal in refusals {
            let back = error_of_record("merge_pull_request", &record_of_error(&refusal));
            match (&refusal, &back) {
                (
                    GitHubError::Status {
                        status: a,
                        message: m,
                        ..
                    },
                    GitHubError::Status {
                        status: b,
                        message: n,
                        ..
                    },
                ) => assert_eq!((a, m), (b, n)),
                (
                    GitHubError::Validation {
                        message: m,
                        errors: e,
                        ..
                    },
                    GitHubError::Validation {
                        message: n,
                        errors: f,
                        ..
                    },
                ) => assert_eq!((m, e), (n, f)),
                _ => panic!("{refusal:?} came back as {back:?}"),
            }
        }
        // A record of an older rover (no status): a plain non-retryable error, as before.
        let old = RecordedError {
            message: "gone".into(),
            ..RecordedError::default()
        };
        assert!(matches!(
            error_of_record("x", &old),
            GitHubError::Status { status: 0, .. }
        ));
    }
}
