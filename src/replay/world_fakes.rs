//! The world a replayed step sees: a GitHub client that serves the reads the original run
//! recorded, and GitHub's recorded answers to the writes a step decides by (a merge, an update
//! of a branch, a release) without sending them, and refuses everything else, and an agent that serves the
//! original run's answer without a model call, noting whether the prompt it is given is the
//! one that answer was for.

use std::sync::Mutex;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use serde::de::DeserializeOwned;

use crate::agents::{Agent, AgentError, AgentKind, AgentRequest, AgentResponse};
use crate::github::api::{ListedComment, ListedIssue, ListedReviewComment};
use crate::github::recorded::{error_of_record, write_key};
use crate::github::{
    CiStatus, Comment, EventsFetch, GitHub, GitHubError, Issue, NewPullRequest, Permission, Posted,
    PullRequest, ReactionTarget, ReactionsFetch, RepoRef, Review, ReviewComment, ReviewEvent,
};
use crate::store::replay_record::{next_read, prompt_sha256, Asked, RecordedAnswer, RecordedRead};

/// Serves recorded reads, in order per call and argument (the last answer again when a
/// replay asks more often); anything not recorded is refused, so nothing reaches GitHub.
pub struct ReplayGitHub {
    repo: RepoRef,
    reads: Vec<RecordedRead>,
    served: Asked,
    /// What the replayed run asked that was not recorded (or was a write), for the report.
    refused: Mutex<Vec<String>>,
}

impl ReplayGitHub {
    pub fn new(repo: RepoRef, reads: Vec<RecordedRead>) -> ReplayGitHub {
        ReplayGitHub {
            repo,
            reads,
            served: Asked::default(),
            refused: Mutex::new(Vec::new()),
        }
    }

    /// The calls refused so far.
    pub fn refused(&self) -> Vec<String> {
        self.refused
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    fn refuse<T>(&self, what: &str) -> Result<T, GitHubError> {
        self.refused
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push(what.to_owned());
        Err(GitHubError::Config {
            what: "replay".to_owned(),
            detail: format!("{what}: not in the trace's record, and a replay never calls GitHub"),
        })
    }

    /// GitHub's recorded answer to a write a step decides by (a merge, an update of a branch,
    /// a release), asked with the same key: nothing is sent. Not recorded (another head,
    /// another tag): refused.
    fn serve_write<T: DeserializeOwned>(&self, call: &str, key: &str) -> Result<T, GitHubError> {
        self.answer("write", call, key)
    }

    fn serve<T: DeserializeOwned>(&self, call: &str, key: &str) -> Result<T, GitHubError> {
        self.answer("read", call, key)
    }

    /// The recorded answer of `call(key)` (a `kind`, read or write), in order per call and key;
    /// refused when none was recorded.
    fn answer<T: DeserializeOwned>(
        &self,
        kind: &str,
        call: &str,
        key: &str,
    ) -> Result<T, GitHubError> {
        let Some(read) = next_read(&self.reads, &self.served, call, key) else {
            return self.refuse(&format!("the {kind} {call}({key})"));
        };
        match (&read.ok, &read.error) {
            (_, Some(error)) => Err(error_of_record(call, error)),
            (Some(value), None) => {
                serde_json::from_value(value.clone()).map_err(|e| GitHubError::Malformed {
                    what: format!("the recorded answer of {call}({key})"),
                    detail: e.to_string(),
                })
            }
            (None, None) => Err(GitHubError::Malformed {
                what: format!("the recorded answer of {call}({key})"),
                detail: "neither an answer nor an error".to_owned(),
            }),
        }
    }
}

#[async_trait]
impl GitHub for ReplayGitHub {
    fn repo(&self) -> &RepoRef {
        &self.repo
    }
    async fn list_events(&self, _etag: Option<&str>) -> Result<EventsFetch, GitHubError> {
        self.refuse("the events feed")
    }
    async fn list_events_page(&self, _next: &str) -> Result<EventsFetch, GitHubError> {
        self.refuse("the events feed")
    }
    async fn list_issues_since(&self, _: DateTime<Utc>) -> Result<Vec<ListedIssue>, GitHubError> {
        self.refuse("the issues list")
    }
    async fn list_issue_comments_since(
        &self,
        _: DateTime<Utc>,
    ) -> Result<Vec<ListedComment>, GitHubError> {
        self.refuse("the comments list")
    }
    async fn list_review_comments_since(
        &self,
        _: DateTime<Utc>,
    ) -> Result<Vec<ListedReviewComment>, GitHubError> {
        self.refuse("the review comments list")
    }
    async fn get_issue(&self, number: u64) -> Result<Issue, GitHubError> {
        self.serve("get_issue", &number.to_string())
    }
    async fn get_pull_request(&self, number: u64) -> Result<PullRequest, GitHubError> {
        self.serve("get_pull_request", &number.to_string())
    }
    async fn list_comments(&self, number: u64, last: usize) -> Result<Vec<Comment>, GitHubError> {
        self.serve("list_comments", &format!("{number}/{last}"))
    }
    async fn list_reviews(&self, number: u64) -> Result<Vec<Review>, GitHubError> {
        self.serve("list_reviews", &number.to_string())
    }
    async fn list_review_comments(&self, number: u64) -> Result<Vec<ReviewComment>, GitHubError> {
        self.serve("list_review_comments", &number.to_string())
    }
    async fn list_commit_comments(&self, sha: &str) -> Result<Vec<Comment>, GitHubError> {
        self.serve("list_commit_comments", sha)
    }
    async fn pull_request_files(&self, number: u64) -> Result<Vec<String>, GitHubError> {
        self.serve("pull_request_files", &number.to_string())
    }
    async fn merge_pull_request(
        &self,
        number: u64,
        request: &crate::github::MergeRequest,
    ) -> Result<crate::github::Merged, GitHubError> {
        self.serve_write("merge_pull_request", &write_key(number, &request.sha))
    }
    async fn update_pull_request_branch(
        &self,
        number: u64,
        expected_head_sha: &str,
    ) -> Result<String, GitHubError> {
        self.serve_write(
            "update_pull_request_branch",
            &write_key(number, expected_head_sha),
        )
    }
    async fn list_releases(&self) -> Result<Vec<crate::github::Release>, GitHubError> {
        self.serve("list_releases", "")
    }
    async fn create_release(
        &self,
        new: &crate::github::NewRelease,
    ) -> Result<crate::github::Release, GitHubError> {
        self.serve_write("create_release", &new.tag_name)
    }
    async fn merged_pull_requests(
        &self,
        base: &str,
    ) -> Result<Vec<crate::github::MergedPull>, GitHubError> {
        self.serve("merged_pull_requests", base)
    }
    async fn permission(&self, login: &str) -> Result<Permission, GitHubError> {
        self.serve("permission", login)
    }
    async fn ci_status(&self, git_ref: &str) -> Result<CiStatus, GitHubError> {
        self.serve("ci_status", git_ref)
    }
    async fn post_comment(&self, number: u64, _: &str) -> Result<Posted, GitHubError> {
        self.refuse(&format!("the write post_comment({number})"))
    }
    async fn post_review(
        &self,
        number: u64,
        _: ReviewEvent,
        _: &str,
    ) -> Result<Posted, GitHubError> {
        self.refuse(&format!("the write post_review({number})"))
    }
    async fn reply_to_review_comment(
        &self,
        number: u64,
        comment_id: u64,
        _: &str,
    ) -> Result<Posted, GitHubError> {
        self.refuse(&format!(
            "the write reply_to_review_comment({number}, {comment_id})"
        ))
    }
    async fn post_commit_comment(&self, sha: &str, _: &str) -> Result<Posted, GitHubError> {
        self.refuse(&format!("the write post_commit_comment({sha})"))
    }
    async fn find_pull_request_for_branch(
        &self,
        branch: &str,
    ) -> Result<Option<PullRequest>, GitHubError> {
        self.serve("find_pull_request_for_branch", branch)
    }
    async fn open_pull_request(&self, new: &NewPullRequest) -> Result<PullRequest, GitHubError> {
        self.refuse(&format!("the write open_pull_request({})", new.head))
    }
    async fn react(&self, _: ReactionTarget, content: &str) -> Result<(), GitHubError> {
        // The acknowledgement a trusted event gets: a write, refused (it does not decide).
        self.refuse(&format!("the write react({content})"))
    }
    async fn reactions(
        &self,
        _: ReactionTarget,
        content: &str,
        _: Option<&str>,
    ) -> Result<ReactionsFetch, GitHubError> {
        self.refuse(&format!("the reactions list ({content})"))
    }
}

/// How a replayed prompt compares with the recorded one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PromptCheck {
    pub step: String,
    /// The prompt this build rendered is byte for byte the one the answer was given for.
    pub same: bool,
}

/// Serves the recorded answers, in order; no model is called.
pub struct ReplayAgent {
    kind: AgentKind,
    answers: Vec<RecordedAnswer>,
    next: Mutex<usize>,
    checks: Mutex<Vec<PromptCheck>>,
}

/// What a replayed run asked of the agent beyond the recorded answers.
pub const NO_ANSWER: &str = "this build asks the agent where the recorded run did not (or more often): the trace holds no answer to replay";

impl ReplayAgent {
    pub fn new(kind: AgentKind, answers: Vec<RecordedAnswer>) -> ReplayAgent {
        ReplayAgent {
            kind,
            answers,
            next: Mutex::new(0),
            checks: Mutex::new(Vec::new()),
        }
    }

    /// Whether the replayed run asked for more answers than were recorded.
    pub fn ran_out(&self) -> bool {
        *self
            .next
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            > self.answers.len()
    }

    /// One check per answer served.
    pub fn checks(&self) -> Vec<PromptCheck> {
        self.checks
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }
}

#[async_trait]
impl Agent for ReplayAgent {
    fn kind(&self) -> AgentKind {
        self.kind
    }

    async fn run(&self, req: AgentRequest) -> Result<AgentResponse, AgentError> {
        let index = {
            let mut next = self
                .next
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            let index = *next;
            *next += 1;
            index
        };
        let Some(recorded) = self.answers.get(index) else {
            return Err(AgentError::Prompt {
                step: "replay".to_owned(),
                reason: NO_ANSWER.to_owned(),
            });
        };
        self.checks
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push(PromptCheck {
                step: recorded.step.clone(),
                same: prompt_sha256(&req.system_prompt, &req.prompt) == recorded.prompt_sha256,
            });
        if let Some(error) = &recorded.error {
            // The recorded call failed: the same failure, as retryable as it was.
            return Err(if error.retryable {
                AgentError::Failed {
                    exit: None,
                    message: format!("recorded: {}", error.message),
                    stderr: String::new(),
                }
            } else {
                AgentError::Prompt {
                    step: recorded.step.clone(),
                    reason: format!("recorded: {}", error.message),
                }
            });
        }
        Ok(AgentResponse {
            text: recorded.answer.to_string(),
            structured: Some(recorded.answer.clone()),
            ..AgentResponse::default()
        })
    }

    async fn check(&self) -> Result<String, AgentError> {
        Ok("replay (recorded answers)".to_owned())
    }
}
