//! Reactions: rover's 👀 on what it picks up, and the reactions people leave on rover's own
//! posts (a trusted 👎 stops the trace working on it).
//!
//! `POST .../reactions` answers 201 for a new reaction and 200 when the same one was already
//! there, so reacting twice is harmless. A pull request review has no reactions endpoint: a
//! review is acknowledged on its pull request. Listing asks for one `content` only, with the
//! previous answer's ETag, so an unchanged list is a 304 that costs no rate limit.

use chrono::Utc;
use http::{HeaderMap, HeaderValue, Method};
use serde::{Deserialize, Serialize};

use super::error::GitHubError;
use super::events::{EventKind, NormalizedEvent};
use super::octo::{check_status, OctoGitHub};

/// The reactions GitHub knows (`content`).
pub const CONTENTS: [&str; 8] = [
    "+1", "-1", "laugh", "confused", "heart", "hooray", "rocket", "eyes",
];

/// What a reaction is on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(
    tag = "kind",
    rename_all = "camelCase",
    rename_all_fields = "camelCase"
)]
pub enum ReactionTarget {
    /// An issue or a pull request (its conversation).
    Issue { number: u64 },
    /// A comment on an issue or pull request conversation.
    IssueComment { id: u64 },
    /// A comment on a pull request's diff.
    ReviewComment { id: u64 },
}

impl ReactionTarget {
    fn rest(self) -> String {
        match self {
            Self::Issue { number } => format!("/issues/{number}/reactions"),
            Self::IssueComment { id } => format!("/issues/comments/{id}/reactions"),
            Self::ReviewComment { id } => format!("/pulls/comments/{id}/reactions"),
        }
    }

    /// What to react on to acknowledge `event`: its comment or review comment, or its issue or
    /// pull request (an issue or pull request event, a review: reviews have no reactions).
    /// `None` for a push.
    pub fn of_event(event: &NormalizedEvent) -> Option<ReactionTarget> {
        match event.kind {
            EventKind::IssueComment => event.comment_id.map(|id| Self::IssueComment { id }),
            EventKind::PullRequestReviewComment => {
                event.review_comment_id.map(|id| Self::ReviewComment { id })
            }
            EventKind::Issues | EventKind::PullRequest | EventKind::PullRequestReview => {
                event.number.map(|number| Self::Issue { number })
            }
            EventKind::Push | EventKind::Local => None,
        }
    }

    /// `issue #12`, `comment 345`, `review comment 678`.
    pub fn describe(self) -> String {
        match self {
            Self::Issue { number } => format!("#{number}"),
            Self::IssueComment { id } => format!("comment {id}"),
            Self::ReviewComment { id } => format!("review comment {id}"),
        }
    }
}

/// The answer to a reactions list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReactionsFetch {
    /// 304: the same as the ETag's answer.
    NotModified,
    /// Who reacted and when, and the ETag to send next time.
    Logins {
        reactions: Vec<Reaction>,
        etag: Option<String>,
    },
}

/// One reaction: who left it, and when.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reaction {
    pub login: String,
    pub created_at: Option<chrono::DateTime<Utc>>,
}

#[derive(Deserialize)]
struct RawReaction {
    #[serde(default)]
    user: Option<RawUser>,
    #[serde(default)]
    created_at: Option<chrono::DateTime<Utc>>,
}

#[derive(Deserialize)]
struct RawUser {
    #[serde(default)]
    login: String,
}

impl OctoGitHub {
    pub(super) async fn post_reaction(
        &self,
        target: ReactionTarget,
        content: &str,
    ) -> Result<(), GitHubError> {
        let what = format!("a reaction on {}", target.describe());
        let body = serde_json::json!({"content": content});
        let (meta, text) = self
            .send(
                &what,
                Method::POST,
                &self.path(&target.rest()),
                Some(&body),
                None,
            )
            .await?;
        check_status(&what, &meta, &text, Utc::now())
    }

    pub(super) async fn list_reactions(
        &self,
        target: ReactionTarget,
        content: &str,
        etag: Option<&str>,
    ) -> Result<ReactionsFetch, GitHubError> {
        let what = format!("the reactions on {}", target.describe());
        let mut headers = HeaderMap::new();
        if let Some(tag) = etag.and_then(|t| HeaderValue::from_str(t).ok()) {
            headers.insert(http::header::IF_NONE_MATCH, tag);
        }
        let path = self.path(&format!(
            "{}?content={}&per_page=100",
            target.rest(),
            super::octo::encode(content, false)
        ));
        let (meta, text) = self
            .send(&what, Method::GET, &path, None, Some(headers))
            .await?;
        if meta.status == 304 {
            return Ok(ReactionsFetch::NotModified);
        }
        check_status(&what, &meta, &text, Utc::now())?;
        let raw: Vec<RawReaction> =
            serde_json::from_str(&text).map_err(|e| GitHubError::Malformed {
                what: what.clone(),
                detail: e.to_string(),
            })?;
        Ok(ReactionsFetch::Logins {
            reactions: raw
                .into_iter()
                .filter_map(|r| {
                    let login = r.user.map(|u| u.login).filter(|l| !l.is_empty())?;
                    Some(Reaction {
                        login,
                        created_at: r.created_at,
                    })
                })
                .collect(),
            etag: meta.etag,
        })
    }
}
