//! Lenient parsing of the repository events feed into rover's own normalized events.
//!
//! GitHub trims event payloads (since 2025-10) and adds actions without notice, so every field
//! is optional here and one odd event is skipped, never the whole page.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::error::GitHubError;

/// The hidden marker every rover post carries; events whose text contains it are rover's own.
pub const MARKER_PREFIX: &str = "<!-- rover:";

/// Who may read what rover posts on a channel; decides how much detail may be disclosed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Visibility {
    /// Anyone may read it: disclose as little as possible (the default when in doubt).
    #[default]
    Public,
    /// Only trusted people read it: diagnostics allowed, secrets never.
    Private,
}

/// Where an answer to an event goes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(
    tag = "kind",
    rename_all = "camelCase",
    rename_all_fields = "camelCase"
)]
pub enum Channel {
    /// A comment on an issue.
    IssueComment { number: u64 },
    /// A comment on a pull request's conversation.
    PrComment { number: u64 },
    /// A pull request review.
    PrReview { number: u64 },
    /// A reply in a review thread; `comment_id` is the thread's first comment.
    ReviewThreadReply { number: u64, comment_id: u64 },
    /// A comment on a commit (for pushes).
    CommitComment { sha: String },
    /// A local request: the answer goes into the trace only.
    Local,
}

/// The six event types rover reacts to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum EventKind {
    #[serde(rename = "IssuesEvent")]
    Issues,
    #[serde(rename = "PullRequestEvent")]
    PullRequest,
    #[serde(rename = "IssueCommentEvent")]
    IssueComment,
    #[serde(rename = "PullRequestReviewEvent")]
    PullRequestReview,
    #[serde(rename = "PullRequestReviewCommentEvent")]
    PullRequestReviewComment,
    #[serde(rename = "PushEvent")]
    Push,
    /// A local request (not from GitHub).
    #[serde(rename = "LocalEvent")]
    Local,
}

impl EventKind {
    /// The GitHub `type` string.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Issues => "IssuesEvent",
            Self::PullRequest => "PullRequestEvent",
            Self::IssueComment => "IssueCommentEvent",
            Self::PullRequestReview => "PullRequestReviewEvent",
            Self::PullRequestReviewComment => "PullRequestReviewCommentEvent",
            Self::Push => "PushEvent",
            Self::Local => "LocalEvent",
        }
    }

    fn parse(kind: &str) -> Option<Self> {
        Some(match kind {
            "IssuesEvent" => Self::Issues,
            "PullRequestEvent" => Self::PullRequest,
            "IssueCommentEvent" => Self::IssueComment,
            "PullRequestReviewEvent" => Self::PullRequestReview,
            "PullRequestReviewCommentEvent" => Self::PullRequestReviewComment,
            "PushEvent" => Self::Push,
            _ => return None,
        })
    }
}

/// The actions rover reacts to (others are skipped).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EventAction {
    Opened,
    Closed,
    Reopened,
    Labeled,
    ReadyForReview,
    ReviewRequested,
    Created,
    Submitted,
}

impl EventAction {
    /// The name as serialized (GitHub's).
    pub fn as_str(self) -> &'static str {
        match self {
            EventAction::Opened => "opened",
            EventAction::Closed => "closed",
            EventAction::Reopened => "reopened",
            EventAction::Labeled => "labeled",
            EventAction::ReadyForReview => "ready_for_review",
            EventAction::ReviewRequested => "review_requested",
            EventAction::Created => "created",
            EventAction::Submitted => "submitted",
        }
    }
}

/// One relevant event, with everything the later steps need to decide and to answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NormalizedEvent {
    /// GitHub's event id (a string in the feed).
    pub id: String,
    pub kind: EventKind,
    /// `None` for pushes, which have no action.
    pub action: Option<EventAction>,
    /// Login of whoever caused the event.
    pub actor: String,
    /// `owner/name`.
    pub repo: String,
    /// Issue or pull request number.
    pub number: Option<u64>,
    /// Whether `number` is a pull request.
    pub is_pull_request: bool,
    /// Issue comment id (issue comment events).
    pub comment_id: Option<u64>,
    /// Review id (review events, and review comments that belong to a review).
    pub review_id: Option<u64>,
    /// Review comment id (review comment events).
    pub review_comment_id: Option<u64>,
    /// Commit sha: the pushed head, or the commit a review (comment) refers to.
    pub commit_sha: Option<String>,
    /// The pushed ref (`refs/heads/main`).
    pub git_ref: Option<String>,
    /// The sha before a push (all zeros for a new branch).
    pub before_sha: Option<String>,
    /// Head branch of a pull request.
    pub head_branch: Option<String>,
    /// Base branch of a pull request.
    pub base_branch: Option<String>,
    /// For a closed pull request: whether it was merged, when the payload says so.
    pub merged: Option<bool>,
    /// The label added (labeled actions).
    pub label: Option<String>,
    /// The labels the issue or pull request carried when the event was sent (the scheduler's
    /// `critical`, `quick-win`): at most [`MAX_LABELS`], each at most 50 characters as on GitHub.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub labels: Vec<String>,
    /// The text of the comment or review, when the payload carries one.
    pub body: Option<String>,
    /// A review's state, lowercase (`changes_requested`, `approved`, `commented`), when the
    /// payload says it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub review_state: Option<String>,
    /// Where a human sees the thing the event is about.
    pub html_url: Option<String>,
    pub created_at: Option<DateTime<Utc>>,
    /// Where the answer goes.
    pub channel: Channel,
    pub visibility: Visibility,
    /// What identifies the event by its content, the same whether it came from the events feed
    /// or a webhook (whose ids differ); `None` when the payload does not say enough. See
    /// [`dedupe_key`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dedupe_key: Option<String>,
}

impl NormalizedEvent {
    /// A local request (not from GitHub): private, answered in the trace only.
    pub fn local(id: &str, actor: &str, request: &str, created_at: DateTime<Utc>) -> Self {
        Self {
            id: id.to_owned(),
            kind: EventKind::Local,
            action: None,
            actor: actor.to_owned(),
            repo: String::new(),
            number: None,
            is_pull_request: false,
            comment_id: None,
            review_id: None,
            review_comment_id: None,
            commit_sha: None,
            git_ref: None,
            before_sha: None,
            head_branch: None,
            base_branch: None,
            merged: None,
            label: None,
            labels: Vec::new(),
            body: Some(request.to_owned()),
            review_state: None,
            html_url: None,
            created_at: Some(created_at),
            channel: Channel::Local,
            visibility: Visibility::Private,
            dedupe_key: None,
        }
    }
}

/// Why an event of the feed was not kept.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum SkipReason {
    /// An event type rover does not react to.
    UnknownType(String),
    /// A known type with an action rover does not react to.
    IgnoredAction(String),
    /// Rover's own doing: the bot login or a post carrying the rover marker.
    Own,
    /// The payload lacks something rover needs.
    Malformed(String),
}

/// An event of the feed that was skipped, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SkippedEvent {
    /// The event id when there was one.
    pub id: Option<String>,
    pub reason: SkipReason,
    /// The feed's `type`, when there was one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    /// The payload's `action`, when there was one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub action: Option<String>,
    /// The issue or pull request number, when the payload names one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub number: Option<u64>,
    /// The actor's login, when there was one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub actor: Option<String>,
}

impl SkippedEvent {
    /// A skipped feed item, with whatever identifies it (all optional: the item may be junk).
    pub fn of(item: &Value, reason: SkipReason) -> Self {
        let payload = item.get("payload");
        let number = payload.and_then(|p| {
            u64_at(p, &["issue", "number"])
                .or_else(|| u64_at(p, &["number"]))
                .or_else(|| u64_at(p, &["pull_request", "number"]))
        });
        Self {
            id: event_id(item),
            reason,
            kind: owned(str_at(item, &["type"])),
            action: payload.and_then(|p| owned(str_at(p, &["action"]))),
            number,
            actor: owned(str_at(item, &["actor", "login"])),
        }
    }
}

impl std::fmt::Display for SkipReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::UnknownType(t) if t.is_empty() => write!(f, "no event type"),
            Self::UnknownType(t) => write!(f, "event type {t} is not one rover reacts to"),
            Self::IgnoredAction(a) if a.is_empty() => write!(f, "no action"),
            Self::IgnoredAction(a) => write!(f, "action `{a}` is not one rover reacts to"),
            Self::Own => write!(f, "rover's own event (the bot login or a rover marker)"),
            Self::Malformed(why) => write!(f, "malformed payload: {why}"),
        }
    }
}

/// One page of the events feed after normalization, newest first as served.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EventPage {
    pub events: Vec<NormalizedEvent>,
    pub skipped: Vec<SkippedEvent>,
}

/// How to normalize: who the bot is, what visibility to record, where the web UI lives.
#[derive(Debug, Clone)]
pub struct NormalizeOptions {
    /// The bot's login; its events are rover's own.
    pub bot_login: Option<String>,
    pub visibility: Visibility,
    /// Base of human-facing URLs (`https://github.com`), used when the payload has none.
    pub web_url: String,
}

impl Default for NormalizeOptions {
    fn default() -> Self {
        Self {
            bot_login: None,
            visibility: Visibility::Public,
            web_url: "https://github.com".to_owned(),
        }
    }
}

/// Parse a page of `GET /repos/{o}/{r}/events`; only a body that is not a JSON array fails.
pub fn parse_events_page(body: &str, options: &NormalizeOptions) -> Result<EventPage, GitHubError> {
    let items: Vec<Value> = serde_json::from_str(body).map_err(|e| GitHubError::Malformed {
        what: "the events feed".into(),
        detail: format!("not a json array of events: {e}"),
    })?;
    let mut page = EventPage::default();
    for item in &items {
        match normalize_event(item, options) {
            Ok(event) => page.events.push(event),
            Err(reason) => page.skipped.push(SkippedEvent::of(item, reason)),
        }
    }
    Ok(page)
}

fn event_id(item: &Value) -> Option<String> {
    match item.get("id")? {
        Value::String(s) => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        _ => None,
    }
}

fn str_at<'a>(v: &'a Value, path: &[&str]) -> Option<&'a str> {
    path.iter().try_fold(v, |v, k| v.get(k))?.as_str()
}

fn u64_at(v: &Value, path: &[&str]) -> Option<u64> {
    path.iter().try_fold(v, |v, k| v.get(k))?.as_u64()
}

fn bool_at(v: &Value, path: &[&str]) -> Option<bool> {
    path.iter().try_fold(v, |v, k| v.get(k))?.as_bool()
}

/// The most labels an event keeps (GitHub allows 100 per issue; the scheduler reads a few).
pub const MAX_LABELS: usize = 20;

/// The names in `payload[object].labels` (an issue's or a pull request's), bounded: untrusted
/// text that the scheduler matches and `status` prints.
fn labels_at(payload: &Value, object: &str) -> Vec<String> {
    let Some(labels) = payload
        .get(object)
        .and_then(|o| o.get("labels"))
        .and_then(Value::as_array)
    else {
        return Vec::new();
    };
    labels
        .iter()
        .filter_map(|l| l.get("name").and_then(Value::as_str))
        .map(|name| {
            name.chars()
                .filter(|c| !c.is_control())
                .take(50)
                .collect::<String>()
        })
        .filter(|name| !name.is_empty())
        .take(MAX_LABELS)
        .collect()
}

fn owned(s: Option<&str>) -> Option<String> {
    s.map(str::to_owned)
}

/// Whether `login` is the bot (GitHub apps show up as `name[bot]`).
pub fn is_bot_login(login: &str, bot_login: Option<&str>) -> bool {
    let Some(bot) = bot_login else { return false };
    let strip = |s: &str| s.trim_end_matches("[bot]").to_ascii_lowercase();
    !bot.is_empty() && strip(login) == strip(bot)
}

/// Whether a text carries rover's footer marker.
pub fn has_marker(text: &str) -> bool {
    text.contains(MARKER_PREFIX)
}

/// Normalize one event of the feed, or say why it is skipped.
pub fn normalize_event(
    item: &Value,
    options: &NormalizeOptions,
) -> Result<NormalizedEvent, SkipReason> {
    let id = event_id(item).ok_or_else(|| SkipReason::Malformed("no id".into()))?;
    let type_name = str_at(item, &["type"]).unwrap_or("");
    let kind =
        EventKind::parse(type_name).ok_or_else(|| SkipReason::UnknownType(type_name.to_owned()))?;
    let payload = item
        .get("payload")
        .filter(|p| p.is_object())
        .ok_or_else(|| SkipReason::Malformed("no payload".into()))?;
    let actor = str_at(item, &["actor", "login"])
        .ok_or_else(|| SkipReason::Malformed("no actor login".into()))?
        .to_owned();
    let repo = str_at(item, &["repo", "name"])
        .ok_or_else(|| SkipReason::Malformed("no repo name".into()))?
        .to_owned();
    let raw_action = str_at(payload, &["action"]).unwrap_or("");
    let action = match_action(kind, raw_action)?;
    let created_at = str_at(item, &["created_at"])
        .and_then(|s| DateTime::parse_from_rfc3339(s).ok())
        .map(|d| d.with_timezone(&Utc));
    let web = options.web_url.trim_end_matches('/');
    let mut ev = blank_event(id, kind, action, actor, repo, created_at, options);
    match kind {
        EventKind::Issues => issue_fields(&mut ev, payload, web)?,
        EventKind::PullRequest => pull_request_fields(&mut ev, payload, raw_action, web)?,
        EventKind::IssueComment => issue_comment_fields(&mut ev, payload)?,
        EventKind::PullRequestReview => review_fields(&mut ev, payload, web)?,
        EventKind::PullRequestReviewComment => review_comment_fields(&mut ev, payload)?,
        EventKind::Push => push_fields(&mut ev, payload, web)?,
        EventKind::Local => return Err(SkipReason::UnknownType(type_name.to_owned())),
    }
    if is_bot_login(&ev.actor, options.bot_login.as_deref())
        || ev.body.as_deref().is_some_and(has_marker)
    {
        return Err(SkipReason::Own);
    }
    ev.dedupe_key = dedupe_key(&ev, payload);
    Ok(ev)
}

/// An event with what every kind has, the rest empty.
fn blank_event(
    id: String,
    kind: EventKind,
    action: Option<EventAction>,
    actor: String,
    repo: String,
    created_at: Option<DateTime<Utc>>,
    options: &NormalizeOptions,
) -> NormalizedEvent {
    NormalizedEvent {
        id,
        kind,
        action,
        actor,
        repo,
        number: None,
        is_pull_request: false,
        comment_id: None,
        review_id: None,
        review_comment_id: None,
        commit_sha: None,
        git_ref: None,
        before_sha: None,
        head_branch: None,
        base_branch: None,
        merged: None,
        label: None,
        labels: Vec::new(),
        body: None,
        review_state: None,
        html_url: None,
        created_at,
        channel: Channel::Local,
        visibility: options.visibility,
        dedupe_key: None,
    }
}

/// The issue or pull request number an event needs.
fn need_number(n: Option<u64>) -> Result<u64, SkipReason> {
    n.ok_or_else(|| SkipReason::Malformed("no issue or pull request number".into()))
}

/// The fields of an `issues` event.
fn issue_fields(ev: &mut NormalizedEvent, payload: &Value, web: &str) -> Result<(), SkipReason> {
    let number = need_number(u64_at(payload, &["issue", "number"]))?;
    ev.number = Some(number);
    ev.is_pull_request = payload
        .get("issue")
        .and_then(|i| i.get("pull_request"))
        .is_some();
    ev.label = owned(str_at(payload, &["label", "name"]));
    ev.labels = labels_at(payload, "issue");
    ev.body = owned(str_at(payload, &["issue", "body"]));
    ev.html_url = owned(str_at(payload, &["issue", "html_url"]))
        .or_else(|| Some(format!("{web}/{}/issues/{number}", ev.repo)));
    ev.channel = if ev.is_pull_request {
        Channel::PrComment { number }
    } else {
        Channel::IssueComment { number }
    };
    Ok(())
}

/// The fields of a `pull_request` event.
fn pull_request_fields(
    ev: &mut NormalizedEvent,
    payload: &Value,
    raw_action: &str,
    web: &str,
) -> Result<(), SkipReason> {
    let number = need_number(
        u64_at(payload, &["number"]).or_else(|| u64_at(payload, &["pull_request", "number"])),
    )?;
    ev.number = Some(number);
    ev.is_pull_request = true;
    ev.head_branch = owned(str_at(payload, &["pull_request", "head", "ref"]));
    ev.base_branch = owned(str_at(payload, &["pull_request", "base", "ref"]));
    ev.commit_sha = owned(str_at(payload, &["pull_request", "head", "sha"]));
    ev.label = owned(str_at(payload, &["label", "name"]));
    ev.labels = labels_at(payload, "pull_request");
    ev.merged =
        bool_at(payload, &["pull_request", "merged"]).or((raw_action == "merged").then_some(true));
    ev.html_url = owned(str_at(payload, &["pull_request", "html_url"]))
        .or_else(|| Some(format!("{web}/{}/pull/{number}", ev.repo)));
    ev.channel = Channel::PrComment { number };
    Ok(())
}

/// The fields of an `issue_comment` event.
fn issue_comment_fields(ev: &mut NormalizedEvent, payload: &Value) -> Result<(), SkipReason> {
    let number = need_number(u64_at(payload, &["issue", "number"]))?;
    let comment_id = u64_at(payload, &["comment", "id"])
        .ok_or_else(|| SkipReason::Malformed("no comment id".into()))?;
    ev.number = Some(number);
    ev.is_pull_request = payload
        .get("issue")
        .and_then(|i| i.get("pull_request"))
        .is_some();
    ev.comment_id = Some(comment_id);
    ev.labels = labels_at(payload, "issue");
    ev.body = owned(str_at(payload, &["comment", "body"]));
    ev.html_url = owned(str_at(payload, &["comment", "html_url"]));
    ev.channel = if ev.is_pull_request {
        Channel::PrComment { number }
    } else {
        Channel::IssueComment { number }
    };
    Ok(())
}

/// The fields of a `pull_request_review` event.
fn review_fields(ev: &mut NormalizedEvent, payload: &Value, web: &str) -> Result<(), SkipReason> {
    let number = need_number(
        u64_at(payload, &["pull_request", "number"]).or_else(|| u64_at(payload, &["number"])),
    )?;
    ev.number = Some(number);
    ev.is_pull_request = true;
    ev.review_id = u64_at(payload, &["review", "id"]);
    ev.body = owned(str_at(payload, &["review", "body"]));
    ev.review_state = str_at(payload, &["review", "state"]).map(str::to_ascii_lowercase);
    ev.commit_sha = owned(str_at(payload, &["review", "commit_id"]));
    ev.head_branch = owned(str_at(payload, &["pull_request", "head", "ref"]));
    ev.html_url = owned(str_at(payload, &["review", "html_url"]))
        .or_else(|| Some(format!("{web}/{}/pull/{number}", ev.repo)));
    ev.channel = Channel::PrReview { number };
    Ok(())
}

/// The fields of a `pull_request_review_comment` event.
fn review_comment_fields(ev: &mut NormalizedEvent, payload: &Value) -> Result<(), SkipReason> {
    let number = need_number(
        u64_at(payload, &["pull_request", "number"]).or_else(|| u64_at(payload, &["number"])),
    )?;
    let comment_id = u64_at(payload, &["comment", "id"])
        .ok_or_else(|| SkipReason::Malformed("no review comment id".into()))?;
    // Replies to replies are not allowed: answer in the thread of its first comment.
    let thread = u64_at(payload, &["comment", "in_reply_to_id"]).unwrap_or(comment_id);
    ev.number = Some(number);
    ev.is_pull_request = true;
    ev.review_comment_id = Some(comment_id);
    ev.review_id = u64_at(payload, &["comment", "pull_request_review_id"]);
    ev.body = owned(str_at(payload, &["comment", "body"]));
    ev.commit_sha = owned(str_at(payload, &["comment", "commit_id"]));
    ev.head_branch = owned(str_at(payload, &["pull_request", "head", "ref"]));
    ev.html_url = owned(str_at(payload, &["comment", "html_url"]));
    ev.channel = Channel::ReviewThreadReply {
        number,
        comment_id: thread,
    };
    Ok(())
}

/// The fields of a `push` event.
fn push_fields(ev: &mut NormalizedEvent, payload: &Value, web: &str) -> Result<(), SkipReason> {
    let head = str_at(payload, &["head"])
        .ok_or_else(|| SkipReason::Malformed("push without head sha".into()))?;
    ev.commit_sha = Some(head.to_owned());
    ev.git_ref = owned(str_at(payload, &["ref"]));
    ev.before_sha = owned(str_at(payload, &["before"]));
    ev.html_url = Some(format!("{web}/{}/commit/{head}", ev.repo));
    ev.channel = Channel::CommitComment {
        sha: head.to_owned(),
    };
    Ok(())
}

/// The content key of an event: computable from the (trimmed) events feed and from a webhook
/// payload alike, unique to one event wherever the payload allows.
///
/// | event | key |
/// |---|---|
/// | issue comment | `IssueCommentEvent:comment:<comment id>` |
/// | review | `PullRequestReviewEvent:review:<review id>` |
/// | review comment | `PullRequestReviewCommentEvent:comment:<comment id>` |
/// | push | `PushEvent:<ref>:<head sha>` |
/// | issue or PR opened | `IssuesEvent:opened:#<n>`, `PullRequestEvent:opened:#<n>` |
/// | other issue actions | `IssuesEvent:<action>:#<n>:<label>:<issue updated_at>` |
/// | other PR actions | `PullRequestEvent:<action>:#<n>:<label>:<head sha>` (the feed has no PR times) |
///
/// `action` is rover's (a review's `created` and `submitted` are one); `label` is empty unless
/// the action is `labeled`.
pub fn dedupe_key(ev: &NormalizedEvent, payload: &Value) -> Option<String> {
    let kind = ev.kind.as_str();
    let action = ev.action.map(EventAction::as_str).unwrap_or_default();
    let label = ev.label.as_deref().unwrap_or("");
    match ev.kind {
        EventKind::IssueComment => Some(format!("{kind}:comment:{}", ev.comment_id?)),
        EventKind::PullRequestReview => Some(format!("{kind}:review:{}", ev.review_id?)),
        EventKind::PullRequestReviewComment => {
            Some(format!("{kind}:comment:{}", ev.review_comment_id?))
        }
        EventKind::Push => Some(format!(
            "{kind}:{}:{}",
            ev.git_ref.as_deref()?,
            ev.commit_sha.as_deref()?
        )),
        EventKind::Issues | EventKind::PullRequest if ev.action == Some(EventAction::Opened) => {
            Some(format!("{kind}:opened:#{}", ev.number?))
        }
        EventKind::Issues => {
            let updated = str_at(payload, &["issue", "updated_at"])?;
            Some(format!("{kind}:{action}:#{}:{label}:{updated}", ev.number?))
        }
        EventKind::PullRequest => Some(format!(
            "{kind}:{action}:#{}:{label}:{}",
            ev.number?,
            ev.commit_sha.as_deref()?
        )),
        EventKind::Local => None,
    }
}

fn match_action(kind: EventKind, raw: &str) -> Result<Option<EventAction>, SkipReason> {
    use EventAction as A;
    let action = match (kind, raw) {
        (EventKind::Push | EventKind::Local, _) => return Ok(None),
        (EventKind::Issues | EventKind::PullRequest, "opened") => A::Opened,
        (EventKind::Issues | EventKind::PullRequest, "closed")
        | (EventKind::PullRequest, "merged") => A::Closed,
        (EventKind::Issues | EventKind::PullRequest, "reopened") => A::Reopened,
        (EventKind::Issues, "labeled") => A::Labeled,
        (EventKind::PullRequest, "ready_for_review") => A::ReadyForReview,
        (EventKind::PullRequest, "review_requested") => A::ReviewRequested,
        (EventKind::IssueComment | EventKind::PullRequestReviewComment, "created") => A::Created,
        // The events feed says `created`, webhooks say `submitted`.
        (EventKind::PullRequestReview, "created" | "submitted") => A::Submitted,
        _ => return Err(SkipReason::IgnoredAction(raw.to_owned())),
    };
    Ok(Some(action))
}

#[cfg(test)]
#[path = "events_tests.rs"]
mod tests;
