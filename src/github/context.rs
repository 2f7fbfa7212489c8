//! Context for the coordinator: the current issue/PR, the recent conversation, reviews and CI,
//! fetched fresh (event payloads are trimmed) and bounded so a huge thread cannot blow a prompt.

use std::fmt::Write as _;

use serde::{Deserialize, Serialize};

use super::api::{CiStatus, GitHub, IssueState, PullRequest, Review, ReviewComment};
use super::error::GitHubError;
use super::events::{has_marker, is_bot_login, EventKind, NormalizedEvent};

/// Size bounds, part of the GitHub settings in `rover.json`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "camelCase")]
pub struct ContextSettings {
    /// How many of the latest comments to include.
    pub max_comments: usize,
    /// How many of the latest reviews and review comments to include (each).
    pub max_reviews: usize,
    /// Longest issue/PR body kept (characters).
    pub max_body_chars: usize,
    /// Longest single comment or review kept (characters).
    pub max_comment_chars: usize,
    /// Longest rendered context (characters).
    pub max_total_chars: usize,
}

impl Default for ContextSettings {
    fn default() -> Self {
        Self {
            max_comments: 20,
            max_reviews: 10,
            max_body_chars: 8_000,
            max_comment_chars: 2_000,
            max_total_chars: 40_000,
        }
    }
}

/// Cut `text` to at most `max` characters, saying how much was cut.
pub fn truncate(text: &str, max: usize) -> String {
    let count = text.chars().count();
    if count <= max {
        return text.to_owned();
    }
    let note = format!("\n[… truncated {} of {count} characters]", count - max);
    let keep: String = text.chars().take(max).collect();
    format!("{keep}{note}")
}

/// The issue or PR an event is about, as it is now.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Subject {
    pub number: u64,
    pub is_pull_request: bool,
    pub title: String,
    pub body: String,
    pub state: IssueState,
    pub labels: Vec<String>,
    pub author: String,
    pub html_url: String,
    /// Set for pull requests.
    pub pull: Option<PullRequest>,
}

/// One comment of the conversation, with rover's own marked.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ContextComment {
    pub id: u64,
    pub author: String,
    pub body: String,
    /// Posted by rover (the bot login or the footer marker): its own earlier questions.
    pub by_rover: bool,
}

/// Everything the coordinator should know about an event.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EventContext {
    pub event: NormalizedEvent,
    pub subject: Option<Subject>,
    /// The latest comments, oldest first.
    pub comments: Vec<ContextComment>,
    /// Comments left out because of `max_comments`.
    pub omitted_comments: usize,
    pub reviews: Vec<Review>,
    pub review_comments: Vec<ReviewComment>,
    pub ci: Option<CiStatus>,
    /// What could not be fetched (not found, forbidden), so the coordinator knows.
    pub gaps: Vec<String>,
    #[serde(skip)]
    limits: ContextSettings,
}

/// Keep going on errors a retry will not fix; give up on ones it may.
fn soft<T>(
    result: Result<T, GitHubError>,
    gaps: &mut Vec<String>,
) -> Result<Option<T>, GitHubError> {
    match result {
        Ok(v) => Ok(Some(v)),
        Err(e) if e.is_retryable() => Err(e),
        Err(e) => {
            gaps.push(e.to_string());
            Ok(None)
        }
    }
}

/// Fetch the context of `event`. Retryable failures (rate limit, 5xx, network) are returned;
/// others become `gaps`.
pub async fn build_context(
    github: &dyn GitHub,
    event: &NormalizedEvent,
    settings: &ContextSettings,
    bot_login: Option<&str>,
) -> Result<EventContext, GitHubError> {
    let mut gaps = Vec::new();
    let mut ctx = EventContext {
        event: event.clone(),
        subject: None,
        comments: Vec::new(),
        omitted_comments: 0,
        reviews: Vec::new(),
        review_comments: Vec::new(),
        ci: None,
        gaps: Vec::new(),
        limits: settings.clone(),
    };
    if let Some(number) = event.number {
        if let Some(issue) = soft(github.get_issue(number).await, &mut gaps)? {
            let is_pr = issue.is_pull_request || event.is_pull_request;
            let pull = if is_pr {
                soft(github.get_pull_request(number).await, &mut gaps)?
            } else {
                None
            };
            let total_comments = usize::try_from(issue.comments).unwrap_or(usize::MAX);
            ctx.subject = Some(Subject {
                number,
                is_pull_request: is_pr,
                title: truncate(&issue.title, 500),
                body: truncate(&issue.body, settings.max_body_chars),
                state: issue.state,
                labels: issue.labels,
                author: issue.author,
                html_url: issue.html_url,
                pull: pull.map(|mut p| {
                    p.body = truncate(&p.body, settings.max_body_chars);
                    p
                }),
            });
            if let Some(comments) = soft(
                github.list_comments(number, settings.max_comments).await,
                &mut gaps,
            )? {
                ctx.omitted_comments = total_comments.saturating_sub(comments.len());
                ctx.comments = comments
                    .into_iter()
                    .map(|c| ContextComment {
                        by_rover: is_bot_login(&c.author, bot_login) || has_marker(&c.body),
                        id: c.id,
                        author: c.author,
                        body: truncate(&c.body, settings.max_comment_chars),
                    })
                    .collect();
            }
            if is_pr {
                if let Some(mut reviews) = soft(github.list_reviews(number).await, &mut gaps)? {
                    let skip = reviews.len().saturating_sub(settings.max_reviews);
                    reviews.drain(..skip);
                    for r in &mut reviews {
                        r.body = truncate(&r.body, settings.max_comment_chars);
                    }
                    ctx.reviews = reviews;
                }
                if let Some(mut rc) = soft(github.list_review_comments(number).await, &mut gaps)? {
                    let skip = rc.len().saturating_sub(settings.max_reviews);
                    rc.drain(..skip);
                    for c in &mut rc {
                        c.body = truncate(&c.body, settings.max_comment_chars);
                    }
                    ctx.review_comments = rc;
                }
            }
        }
    }
    let ci_ref = match event.kind {
        EventKind::Push => event.commit_sha.clone(),
        _ => ctx
            .subject
            .as_ref()
            .and_then(|s| s.pull.as_ref())
            .map(|p| p.head_sha.clone())
            .filter(|s| !s.is_empty()),
    };
    if let Some(r) = ci_ref {
        ctx.ci = soft(github.ci_status(&r).await, &mut gaps)?;
    }
    ctx.gaps = gaps;
    Ok(ctx)
}

impl EventContext {
    /// Markdown for a prompt, bounded by `max_total_chars` (truncation marked).
    pub fn render(&self) -> String {
        let mut out = String::new();
        let e = &self.event;
        let _ = writeln!(out, "## Event\n");
        let _ = writeln!(
            out,
            "- {} {} by @{} in {}",
            e.kind.as_str(),
            e.action
                .map_or_else(String::new, |a| format!("{a:?}").to_lowercase()),
            e.actor,
            e.repo
        );
        if let Some(url) = &e.html_url {
            let _ = writeln!(out, "- url: {url}");
        }
        if let Some(r) = &e.git_ref {
            let _ = writeln!(out, "- ref: {r}");
        }
        if let Some(body) = &e.body {
            let _ = writeln!(
                out,
                "\n> {}",
                truncate(body, self.limits.max_comment_chars).replace('\n', "\n> ")
            );
        }
        if let Some(s) = &self.subject {
            let kind = if s.is_pull_request {
                "Pull request"
            } else {
                "Issue"
            };
            let _ = writeln!(out, "\n## {kind} #{}: {}\n", s.number, s.title);
            let _ = writeln!(out, "- state: {:?}, author: @{}", s.state, s.author);
            if !s.labels.is_empty() {
                let _ = writeln!(out, "- labels: {}", s.labels.join(", "));
            }
            if let Some(p) = &s.pull {
                let _ = writeln!(
                    out,
                    "- branch: {} → {}{}{}",
                    p.head_branch,
                    p.base_branch,
                    if p.draft { ", draft" } else { "" },
                    if p.merged { ", merged" } else { "" }
                );
            }
            let _ = writeln!(out, "\n{}", s.body);
        }
        if !self.comments.is_empty() {
            let _ = writeln!(out, "\n## Conversation (latest {})\n", self.comments.len());
            if self.omitted_comments > 0 {
                let _ = writeln!(
                    out,
                    "[{} earlier comments omitted]\n",
                    self.omitted_comments
                );
            }
            for c in &self.comments {
                let who = if c.by_rover {
                    format!("@{} (rover, earlier)", c.author)
                } else {
                    format!("@{}", c.author)
                };
                let _ = writeln!(out, "### {who}\n\n{}\n", c.body);
            }
        }
        if !self.reviews.is_empty() {
            let _ = writeln!(out, "\n## Reviews\n");
            for r in &self.reviews {
                let _ = writeln!(
                    out,
                    "- @{} {}: {}",
                    r.author,
                    r.state,
                    r.body.replace('\n', " ")
                );
            }
        }
        if !self.review_comments.is_empty() {
            let _ = writeln!(out, "\n## Review comments\n");
            for c in &self.review_comments {
                let _ = writeln!(
                    out,
                    "- @{} on {}:{}: {}",
                    c.author,
                    c.path,
                    c.line.unwrap_or(0),
                    c.body.replace('\n', " ")
                );
            }
        }
        if let Some(ci) = &self.ci {
            let _ = writeln!(
                out,
                "\n## CI for {}\n\n- {:?} ({} checks)",
                ci.sha, ci.state, ci.total
            );
            if !ci.failing.is_empty() {
                let _ = writeln!(out, "- failing: {}", ci.failing.join(", "));
            }
            if !ci.pending.is_empty() {
                let _ = writeln!(out, "- pending: {}", ci.pending.join(", "));
            }
        }
        if !self.gaps.is_empty() {
            let _ = writeln!(out, "\n## Not available\n");
            for g in &self.gaps {
                let _ = writeln!(out, "- {g}");
            }
        }
        truncate(&out, self.limits.max_total_chars)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn truncation_is_marked_and_char_safe() {
        assert_eq!(truncate("short", 10), "short");
        let t = truncate("ééééé", 2);
        assert!(t.starts_with("éé\n"));
        assert!(t.ends_with("[… truncated 3 of 5 characters]"));
    }
}
