//! `OctoGitHub`: the `GitHub` trait over octocrab's raw requests and rover's own lenient types.
//!
//! octocrab's typed models fail on trimmed or unexpected payloads and its `Etagged` drops
//! `X-Poll-Interval`, so every call goes through `_get_with_headers`/`_post` and reads status,
//! headers and body itself. Retries are off: a 500 is one request and one typed error.

use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, SecondsFormat, TimeDelta, Utc};
use http::{HeaderMap, HeaderValue, Method};
use octocrab::service::middleware::retry::RetryConfig;
use octocrab::Octocrab;
use serde::de::DeserializeOwned;
use serde::Deserialize;
use serde_json::{json, Value};

use super::api::{
    CiStatus, Comment, EventsFetch, GitHub, Issue, ListedComment, ListedIssue, ListedReviewComment,
    MergeRequest, Merged, MergedPull, NewPullRequest, NewRelease, Permission, Posted, PullRequest,
    Release, RepoRef, Review, ReviewComment, ReviewEvent,
};
use super::auth::GitHubAuth;
pub use super::auth::{held_tokens, seal_token, token_from_env};
use super::error::GitHubError;
use super::events::{parse_events_page, NormalizeOptions};
use super::poll::{link_path, ResponseMeta};
use super::reactions::{ReactionTarget, ReactionsFetch};
use super::settings::{GitHubSettings, API_URL_ENV, DEFAULT_API_URL};
use super::wire::{
    summarize_ci, RawCheckRuns, RawCombined, RawComment, RawIssue, RawPermission, RawPosted,
    RawPull, RawReview, RawReviewComment,
};
use crate::host_env::HostEnv;

/// Most pages fetched for one list call (100 items each).
const MAX_PAGES: u32 = 5;

/// The most items a list this client reads can hold (`MAX_PAGES` pages of 100): a list that
/// long may have been cut.
pub const MAX_LISTED: usize = MAX_PAGES as usize * 100;

/// The API base URL from `ROVER_GITHUB_API_URL` in `host`, else `https://api.github.com`.
pub fn api_url_from_env(host: &HostEnv) -> String {
    host.var(API_URL_ENV)
        .map(|v| v.trim().to_owned())
        .filter(|v| !v.is_empty())
        .unwrap_or_else(|| DEFAULT_API_URL.to_owned())
}

/// Guess the human-facing base URL from the API URL (`api.github.com` → `github.com`,
/// `https://ghe.example/api/v3` → `https://ghe.example`).
pub fn web_url_for(api_url: &str) -> String {
    let api = api_url.trim_end_matches('/');
    if api == DEFAULT_API_URL {
        return "https://github.com".to_owned();
    }
    api.strip_suffix("/api/v3").unwrap_or(api).to_owned()
}

#[path = "octo_merge.rs"]
mod merge;
#[path = "octo_release.rs"]
mod release;

/// The octocrab-backed GitHub client for one repository.
#[derive(Clone)]
pub struct OctoGitHub {
    /// No credential of its own: each request carries `auth`'s token of the moment.
    client: Octocrab,
    auth: GitHubAuth,
    repo: RepoRef,
    normalize: NormalizeOptions,
    timeout: Duration,
}

impl std::fmt::Debug for OctoGitHub {
    // Hand-written so the client (which holds the token) is never printed.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OctoGitHub")
            .field("repo", &self.repo)
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

impl OctoGitHub {
    /// Build from rover's environment, `host` (`ROVER_GITHUB_API_URL`, `GITHUB_TOKEN`/`GH_TOKEN`).
    pub fn from_env(
        settings: &GitHubSettings,
        repo: RepoRef,
        host: &HostEnv,
    ) -> Result<Self, GitHubError> {
        Self::new(
            &api_url_from_env(host),
            &token_from_env(host)?,
            repo,
            settings,
        )
    }

    /// Build against `api_url` with `token`.
    pub fn new(
        api_url: &str,
        token: &str,
        repo: RepoRef,
        settings: &GitHubSettings,
    ) -> Result<Self, GitHubError> {
        Self::with_auth(api_url, GitHubAuth::from(token), repo, settings)
    }

    /// Build against `api_url`, each request authenticated by `auth` (a token, or a GitHub
    /// App's installation tokens).
    pub fn with_auth(
        api_url: &str,
        auth: GitHubAuth,
        repo: RepoRef,
        settings: &GitHubSettings,
    ) -> Result<Self, GitHubError> {
        let config_err = |detail: String| GitHubError::Config {
            what: format!("api url {api_url}"),
            detail,
        };
        let timeout = Duration::from_secs(settings.request_timeout_secs.max(1));
        let client = Octocrab::builder()
            .base_uri(api_url.trim_end_matches('/'))
            .map_err(|e| config_err(format!("not a url: {e}")))?
            .add_retry_config(RetryConfig::None)
            // The whole request is bounded by `timeout` (in `send`); the client's own limits get
            // headroom so that bound is what fires, and says so.
            .set_connect_timeout(Some(timeout * 2))
            .set_read_timeout(Some(timeout * 2))
            .add_header(
                http::header::ACCEPT,
                "application/vnd.github+json".to_owned(),
            )
            .build()
            .map_err(|e| config_err(format!("could not build the http client: {e}")))?;
        let normalize = NormalizeOptions {
            bot_login: settings.bot_login.clone(),
            visibility: settings.visibility,
            web_url: settings
                .web_url
                .clone()
                .unwrap_or_else(|| web_url_for(api_url)),
        };
        Ok(Self {
            client,
            auth,
            repo,
            normalize,
            timeout,
        })
    }

    /// The login the token belongs to (`GET /user`). An installation token of a GitHub App
    /// has no user: GitHub answers 403 (`Forbidden`).
    pub async fn token_login(&self) -> Result<String, GitHubError> {
        #[derive(Deserialize)]
        struct RawUser {
            #[serde(default)]
            login: String,
        }
        let (user, _) = self
            .call::<RawUser>("the token's user", Method::GET, "/user", None)
            .await?;
        Ok(user.login)
    }

    /// Take `login` as rover's own when normalizing events (see `github::identity`).
    pub fn set_bot_login(&mut self, login: Option<String>) {
        self.normalize.bot_login = login;
    }

    /// How this client normalizes events (bot login, visibility, web URL); webhook deliveries
    /// are normalized the same way.
    pub fn normalize_options(&self) -> &NormalizeOptions {
        &self.normalize
    }

    pub(super) fn path(&self, rest: &str) -> String {
        format!("/repos/{}/{}{rest}", self.repo.owner, self.repo.name)
    }

    /// Send one request; returns status meta and body whatever the status.
    ///
    /// A timeout inside the HTTP client is a `Timeout` like the outer bound, not a transport
    /// failure: callers retry and back off the same way. A token GitHub refuses is replaced
    /// once when it is a GitHub App's (a new one is minted).
    pub(super) async fn send(
        &self,
        what: &str,
        method: Method,
        path: &str,
        body: Option<&Value>,
        headers: Option<HeaderMap>,
    ) -> Result<(ResponseMeta, String), GitHubError> {
        let token = self.auth.token().await?;
        let sent = self
            .send_with(what, &method, path, body, headers.clone(), &token)
            .await?;
        // An app's token refused (revoked, or expired early): once more with a new one.
        if sent.0.status == 401 && self.auth.rejected(&token).await {
            let token = self.auth.token().await?;
            return self
                .send_with(what, &method, path, body, headers, &token)
                .await;
        }
        Ok(sent)
    }

    /// [`OctoGitHub::send`] with `token`, once.
    async fn send_with(
        &self,
        what: &str,
        method: &Method,
        path: &str,
        body: Option<&Value>,
        headers: Option<HeaderMap>,
        token: &str,
    ) -> Result<(ResponseMeta, String), GitHubError> {
        let mut bearer =
            HeaderValue::from_str(&format!("Bearer {token}")).map_err(|_| GitHubError::Config {
                what: "the github token".into(),
                detail: "it is not a valid header value".into(),
            })?;
        bearer.set_sensitive(true);
        let request = async {
            let mut builder = http::Request::builder()
                .method(method.clone())
                .uri(path)
                .header(http::header::AUTHORIZATION, bearer);
            for (name, value) in headers.iter().flatten() {
                builder = builder.header(name, value);
            }
            let request = if *method == Method::GET {
                self.client.build_request(builder, None::<&()>)
            } else {
                self.client.build_request(builder, body)
            }?;
            let response = self.client.execute(request).await?;
            let meta = ResponseMeta::from_headers(response.status().as_u16(), response.headers());
            let text = self.client.body_to_string(response).await?;
            Ok::<_, octocrab::Error>((meta, text))
        };
        match tokio::time::timeout(self.timeout, request).await {
            Ok(Ok(pair)) => Ok(pair),
            Ok(Err(source)) if timed_out(&source) => Err(GitHubError::Timeout {
                what: what.to_owned(),
                secs: self.timeout.as_secs(),
            }),
            Ok(Err(source)) => Err(GitHubError::Transport {
                what: what.to_owned(),
                source,
            }),
            Err(_) => Err(GitHubError::Timeout {
                what: what.to_owned(),
                secs: self.timeout.as_secs(),
            }),
        }
    }

    /// Send, fail on a non-success status, parse the body into `T`.
    async fn call<T: DeserializeOwned>(
        &self,
        what: &str,
        method: Method,
        path: &str,
        body: Option<&Value>,
    ) -> Result<(T, ResponseMeta), GitHubError> {
        let (meta, text) = self.send(what, method, path, body, None).await?;
        check_status(what, &meta, &text, Utc::now())?;
        let value = parse_body(what, &text)?;
        Ok((value, meta))
    }

    /// GET a list, following pages up to `MAX_PAGES`.
    async fn list_all<T: DeserializeOwned>(
        &self,
        what: &str,
        path: &str,
    ) -> Result<Vec<T>, GitHubError> {
        let sep = if path.contains('?') { '&' } else { '?' };
        let mut all = Vec::new();
        for page in 1..=MAX_PAGES {
            let url = format!("{path}{sep}per_page=100&page={page}");
            let (meta, text) = self.send(what, Method::GET, &url, None, None).await?;
            check_status(what, &meta, &text, Utc::now())?;
            let items: Vec<T> = parse_body(what, &text)?;
            let full = items.len() >= 100;
            all.extend(items);
            if !full {
                break;
            }
        }
        Ok(all)
    }
}

#[derive(Deserialize, Default)]
struct ErrorBody {
    #[serde(default)]
    message: String,
    #[serde(default)]
    errors: Vec<Value>,
}

/// Map a non-success answer to a typed error.
pub(crate) fn check_status(
    what: &str,
    meta: &ResponseMeta,
    body: &str,
    now: DateTime<Utc>,
) -> Result<(), GitHubError> {
    if (200..300).contains(&meta.status) {
        return Ok(());
    }
    let parsed: ErrorBody = serde_json::from_str(body).unwrap_or_default();
    let message = if parsed.message.is_empty() {
        body.chars().take(200).collect()
    } else {
        parsed.message
    };
    let what = what.to_owned();
    Err(match meta.status {
        401 => GitHubError::BadCredentials { what },
        403 | 429 => {
            let limited = meta.rate_limited_until(now).or_else(|| {
                (meta.status == 429 || message.to_ascii_lowercase().contains("rate limit"))
                    .then(|| now + TimeDelta::seconds(60))
            });
            match limited {
                Some(until) => GitHubError::RateLimited { what, until },
                None => GitHubError::Forbidden { what, message },
            }
        }
        404 => GitHubError::NotFound { what },
        422 => GitHubError::Validation {
            what,
            message,
            errors: parsed
                .errors
                .iter()
                .map(describe_validation_error)
                .collect(),
        },
        500..=599 => GitHubError::Server {
            what,
            status: meta.status,
        },
        status => GitHubError::Status {
            what,
            status,
            message,
        },
    })
}

fn describe_validation_error(e: &Value) -> String {
    if let Some(m) = e.get("message").and_then(Value::as_str) {
        return m.to_owned();
    }
    if let Some(s) = e.as_str() {
        return s.to_owned();
    }
    let field = |k: &str| e.get(k).and_then(Value::as_str).unwrap_or("?").to_owned();
    format!("{} {} {}", field("resource"), field("field"), field("code"))
}

fn parse_body<T: DeserializeOwned>(what: &str, text: &str) -> Result<T, GitHubError> {
    serde_json::from_str(text).map_err(|e| GitHubError::Malformed {
        what: what.to_owned(),
        detail: e.to_string(),
    })
}

/// Percent-encode a value for a URL query or path segment (unreserved characters kept).
pub(crate) fn encode(s: &str, keep_slash: bool) -> String {
    use std::fmt::Write as _;
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric()
            || matches!(b, b'-' | b'_' | b'.' | b'~')
            || (keep_slash && b == b'/')
        {
            out.push(char::from(b));
        } else {
            let _ = write!(out, "%{b:02X}");
        }
    }
    out
}

#[async_trait]
impl GitHub for OctoGitHub {
    fn repo(&self) -> &RepoRef {
        &self.repo
    }

    async fn list_events(&self, etag: Option<&str>) -> Result<EventsFetch, GitHubError> {
        let what = "the events feed";
        let mut headers = HeaderMap::new();
        if let Some(tag) = etag {
            let value = HeaderValue::from_str(tag).map_err(|_| GitHubError::Malformed {
                what: what.into(),
                detail: "stored etag is not a valid header value".into(),
            })?;
            headers.insert(http::header::IF_NONE_MATCH, value);
        }
        let path = self.path("/events?per_page=100");
        let (meta, text) = self
            .send(what, Method::GET, &path, None, Some(headers))
            .await?;
        if meta.status == 304 {
            return Ok(EventsFetch::NotModified { meta });
        }
        check_status(what, &meta, &text, Utc::now())?;
        let page = parse_events_page(&text, &self.normalize)?;
        Ok(EventsFetch::Page { page, meta })
    }

    async fn list_events_page(&self, next: &str) -> Result<EventsFetch, GitHubError> {
        let what = "the events feed";
        let path = link_path(next).ok_or_else(|| GitHubError::Malformed {
            what: what.into(),
            detail: format!("the next page link {next:?} is not a URL"),
        })?;
        let (meta, text) = self.send(what, Method::GET, &path, None, None).await?;
        check_status(what, &meta, &text, Utc::now())?;
        let page = parse_events_page(&text, &self.normalize)?;
        Ok(EventsFetch::Page { page, meta })
    }

    async fn list_issues_since(
        &self,
        since: DateTime<Utc>,
    ) -> Result<Vec<ListedIssue>, GitHubError> {
        let since = encode(&since.to_rfc3339_opts(SecondsFormat::Secs, true), false);
        let raw: Vec<RawIssue> = self
            .list_all(
                "issues updated recently",
                &self.path(&format!(
                    "/issues?state=all&sort=updated&direction=asc&since={since}"
                )),
            )
            .await?;
        Ok(raw.into_iter().map(ListedIssue::from).collect())
    }

    async fn list_issue_comments_since(
        &self,
        since: DateTime<Utc>,
    ) -> Result<Vec<ListedComment>, GitHubError> {
        let since = encode(&since.to_rfc3339_opts(SecondsFormat::Secs, true), false);
        let raw: Vec<RawComment> = self
            .list_all(
                "issue comments updated recently",
                &self.path(&format!(
                    "/issues/comments?sort=updated&direction=asc&since={since}"
                )),
            )
            .await?;
        Ok(raw.into_iter().filter_map(RawComment::listed).collect())
    }

    async fn list_review_comments_since(
        &self,
        since: DateTime<Utc>,
    ) -> Result<Vec<ListedReviewComment>, GitHubError> {
        let since = encode(&since.to_rfc3339_opts(SecondsFormat::Secs, true), false);
        let raw: Vec<RawReviewComment> = self
            .list_all(
                "review comments updated recently",
                &self.path(&format!(
                    "/pulls/comments?sort=updated&direction=asc&since={since}"
                )),
            )
            .await?;
        Ok(raw
            .into_iter()
            .filter_map(RawReviewComment::listed)
            .collect())
    }

    async fn get_issue(&self, number: u64) -> Result<Issue, GitHubError> {
        let what = format!("issue #{number}");
        let (raw, _) = self
            .call::<RawIssue>(
                &what,
                Method::GET,
                &self.path(&format!("/issues/{number}")),
                None,
            )
            .await?;
        Ok(raw.into())
    }

    async fn get_pull_request(&self, number: u64) -> Result<PullRequest, GitHubError> {
        let what = format!("pull request #{number}");
        let (raw, _) = self
            .call::<RawPull>(
                &what,
                Method::GET,
                &self.path(&format!("/pulls/{number}")),
                None,
            )
            .await?;
        Ok(raw.into())
    }

    async fn list_comments(&self, number: u64, last: usize) -> Result<Vec<Comment>, GitHubError> {
        let what = format!("comments of #{number}");
        let base = self.path(&format!("/issues/{number}/comments?per_page=100"));
        let get_page = |page: u32| {
            let url = format!("{base}&page={page}");
            let what = what.clone();
            async move {
                let (meta, text) = self.send(&what, Method::GET, &url, None, None).await?;
                check_status(&what, &meta, &text, Utc::now())?;
                let items: Vec<RawComment> = parse_body(&what, &text)?;
                Ok::<_, GitHubError>((items, meta.last_page))
            }
        };
        // Comments are oldest first: jump to the last page and walk back until `last` are in.
        let (first, last_page) = get_page(1).await?;
        let mut newest: Vec<RawComment> = Vec::new();
        let mut page = last_page.unwrap_or(1);
        while page > 1 && newest.len() < last && last_page.unwrap_or(1) - page < MAX_PAGES {
            let (mut items, _) = get_page(page).await?;
            items.append(&mut newest);
            newest = items;
            page -= 1;
        }
        if page == 1 && newest.len() < last {
            let mut all = first;
            all.append(&mut newest);
            newest = all;
        }
        let skip = newest.len().saturating_sub(last);
        Ok(newest.into_iter().skip(skip).map(Comment::from).collect())
    }

    async fn list_reviews(&self, number: u64) -> Result<Vec<Review>, GitHubError> {
        let what = format!("reviews of #{number}");
        let raw: Vec<RawReview> = self
            .list_all(&what, &self.path(&format!("/pulls/{number}/reviews")))
            .await?;
        Ok(raw.into_iter().map(Review::from).collect())
    }

    async fn list_review_comments(&self, number: u64) -> Result<Vec<ReviewComment>, GitHubError> {
        let what = format!("review comments of #{number}");
        let raw: Vec<RawReviewComment> = self
            .list_all(&what, &self.path(&format!("/pulls/{number}/comments")))
            .await?;
        Ok(raw.into_iter().map(ReviewComment::from).collect())
    }

    async fn list_commit_comments(&self, sha: &str) -> Result<Vec<Comment>, GitHubError> {
        let what = format!("comments of commit {sha}");
        let raw: Vec<RawComment> = self
            .list_all(
                &what,
                &self.path(&format!("/commits/{}/comments", encode(sha, false))),
            )
            .await?;
        Ok(raw.into_iter().map(Comment::from).collect())
    }

    async fn permission(&self, login: &str) -> Result<Permission, GitHubError> {
        let what = format!("permission of {login}");
        let path = self.path(&format!(
            "/collaborators/{}/permission",
            encode(login, false)
        ));
        let (raw, _) = self
            .call::<RawPermission>(&what, Method::GET, &path, None)
            .await?;
        Ok(Permission::from(raw))
    }

    async fn ci_status(&self, git_ref: &str) -> Result<CiStatus, GitHubError> {
        let r = encode(git_ref, true);
        let what = format!("ci status of {git_ref}");
        let (combined, _) = self
            .call::<RawCombined>(
                &what,
                Method::GET,
                &self.path(&format!("/commits/{r}/status")),
                None,
            )
            .await?;
        let (checks, _) = self
            .call::<RawCheckRuns>(
                &what,
                Method::GET,
                &self.path(&format!("/commits/{r}/check-runs?per_page=100")),
                None,
            )
            .await?;
        Ok(summarize_ci(git_ref.to_owned(), combined, &checks))
    }

    async fn post_comment(&self, number: u64, body: &str) -> Result<Posted, GitHubError> {
        let what = format!("comment on #{number}");
        let (raw, _) = self
            .call::<RawPosted>(
                &what,
                Method::POST,
                &self.path(&format!("/issues/{number}/comments")),
                Some(&json!({"body": body})),
            )
            .await?;
        Ok(raw.into())
    }

    async fn post_review(
        &self,
        number: u64,
        event: ReviewEvent,
        body: &str,
    ) -> Result<Posted, GitHubError> {
        let what = format!("review on #{number}");
        let payload = json!({"body": body, "event": event});
        let (raw, _) = self
            .call::<RawPosted>(
                &what,
                Method::POST,
                &self.path(&format!("/pulls/{number}/reviews")),
                Some(&payload),
            )
            .await?;
        Ok(raw.into())
    }

    async fn reply_to_review_comment(
        &self,
        number: u64,
        comment_id: u64,
        body: &str,
    ) -> Result<Posted, GitHubError> {
        let what = format!("reply to review comment {comment_id} on #{number}");
        let path = self.path(&format!("/pulls/{number}/comments/{comment_id}/replies"));
        let (raw, _) = self
            .call::<RawPosted>(&what, Method::POST, &path, Some(&json!({"body": body})))
            .await?;
        Ok(raw.into())
    }

    async fn post_commit_comment(&self, sha: &str, body: &str) -> Result<Posted, GitHubError> {
        let what = format!("comment on commit {sha}");
        let path = self.path(&format!("/commits/{}/comments", encode(sha, false)));
        let (raw, _) = self
            .call::<RawPosted>(&what, Method::POST, &path, Some(&json!({"body": body})))
            .await?;
        Ok(raw.into())
    }

    async fn find_pull_request_for_branch(
        &self,
        branch: &str,
    ) -> Result<Option<PullRequest>, GitHubError> {
        let what = format!("pull request for branch {branch}");
        let head = encode(&format!("{}:{branch}", self.repo.owner), false);
        let path = self.path(&format!("/pulls?state=open&head={head}&per_page=10"));
        let (raw, _) = self
            .call::<Vec<RawPull>>(&what, Method::GET, &path, None)
            .await?;
        Ok(raw
            .into_iter()
            .map(PullRequest::from)
            .find(|p| p.head_branch == branch))
    }

    async fn open_pull_request(&self, new: &NewPullRequest) -> Result<PullRequest, GitHubError> {
        let what = format!("create pull request from {}", new.head);
        let payload = json!({"title": new.title, "head": new.head, "base": new.base, "body": new.body,
                             "draft": new.draft, "maintainer_can_modify": true});
        let (raw, _) = self
            .call::<RawPull>(&what, Method::POST, &self.path("/pulls"), Some(&payload))
            .await?;
        Ok(raw.into())
    }

    async fn pull_request_files(&self, number: u64) -> Result<Vec<String>, GitHubError> {
        self.files_of(number).await
    }

    async fn merge_pull_request(
        &self,
        number: u64,
        merge: &MergeRequest,
    ) -> Result<Merged, GitHubError> {
        self.merge_at(number, merge).await
    }

    async fn update_pull_request_branch(
        &self,
        number: u64,
        expected_head_sha: &str,
    ) -> Result<String, GitHubError> {
        self.update_branch(number, expected_head_sha).await
    }

    async fn list_releases(&self) -> Result<Vec<Release>, GitHubError> {
        self.releases().await
    }

    async fn create_release(&self, new: &NewRelease) -> Result<Release, GitHubError> {
        self.new_release(new).await
    }

    async fn merged_pull_requests(&self, base: &str) -> Result<Vec<MergedPull>, GitHubError> {
        self.merged_into(base).await
    }

    async fn react(&self, target: ReactionTarget, content: &str) -> Result<(), GitHubError> {
        self.post_reaction(target, content).await
    }

    async fn reactions(
        &self,
        target: ReactionTarget,
        content: &str,
        etag: Option<&str>,
    ) -> Result<ReactionsFetch, GitHubError> {
        self.list_reactions(target, content, etag).await
    }
}

/// Whether an HTTP client error was a timeout somewhere down its chain of causes.
fn timed_out(error: &(dyn std::error::Error + 'static)) -> bool {
    let mut current: Option<&(dyn std::error::Error + 'static)> = Some(error);
    while let Some(e) = current {
        if e.downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::TimedOut)
        {
            return true;
        }
        current = e.source();
    }
    false
}

#[cfg(test)]
#[path = "octo_tests.rs"]
mod tests;
