//! A stateful fake of the GitHub REST API on 127.0.0.1 for driving the real octocrab client.
//!
//! It keeps issues, PRs, comments, reviews, review comments, commit comments, statuses, check
//! runs and permissions; writes show up in later reads and in the events feed (newest first,
//! string ids, payloads trimmed as since 2025-10). It serves ETag/304 and `X-Poll-Interval`,
//! rate-limit headers, requires a token, plays scripted faults and records every request.
//! Unknown routes answer 404 and are recorded so tests can assert none happened.

#![allow(dead_code, reason = "each test uses a different part of the fake")]

use std::collections::hash_map::DefaultHasher;
use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, Method, Response, StatusCode, Uri};
use axum::Router;
use rover::github::{GitHubSettings, OctoGitHub, RepoRef};
use serde_json::{json, Value};

use super::fake_server::{serve, Served};

#[path = "fake_github_app.rs"]
mod app;
#[path = "fake_github_merge.rs"]
mod merge;
#[path = "fake_github_release.rs"]
mod release;
pub use app::{FakeApp, ReactionRec};

/// The token the fake accepts.
pub const TOKEN: &str = "ghp_faketoken0123456789abcdefghijklmn";
/// The repository the fake hosts.
pub const REPO: &str = "octo-org/widgets";
/// The login the token belongs to (what rover posts as).
pub const BOT: &str = "rover-bot";
/// The repository's numeric id (what the feed's `Link` header names).
pub const REPO_ID: u64 = 316_335_970;
const RATE_LIMIT: u64 = 5000;
const RESET_EPOCH: i64 = 1_900_000_000;

/// A scripted misbehaviour.
#[derive(Debug, Clone)]
pub enum FaultKind {
    /// 401 Bad credentials.
    Unauthorized,
    /// Primary limit exhausted: `status` (403 or 429), remaining 0, reset at `reset` (epoch).
    RateLimited { status: u16, reset: i64 },
    /// Secondary limit: `status` with `retry-after`.
    SecondaryLimit { status: u16, retry_after: u64 },
    /// 404 Not Found.
    NotFound,
    /// 422 Validation Failed with these `errors[].message`.
    Validation(Vec<String>),
    /// A 5xx.
    Server(u16),
    /// Answer normally but only after this long.
    Slow(Duration),
    /// 200 with a body that is not valid JSON.
    Malformed,
}

/// A fault applied to the next `times` requests matching method and path fragment.
#[derive(Debug, Clone)]
pub struct Fault {
    pub method: Option<Method>,
    pub path_contains: String,
    pub times: usize,
    pub kind: FaultKind,
}

/// One request as the fake saw it.
#[derive(Debug, Clone)]
pub struct Recorded {
    pub method: Method,
    pub path: String,
    pub query: String,
    pub headers: HashMap<String, String>,
    pub status: u16,
    pub known_route: bool,
    /// When it arrived (the bench's green check → merge call figure reads it).
    pub at: std::time::Instant,
}

#[derive(Debug, Clone)]
struct PrInfo {
    head: String,
    head_sha: String,
    /// The repository of the head branch: this one ([`REPO`]) unless from a fork; `None` for
    /// a deleted fork.
    head_repo: Option<String>,
    maintainer_can_modify: bool,
    base: String,
    merged: bool,
    /// When it was merged (GitHub's `merged_at`).
    merged_at: Option<String>,
    draft: bool,
}

#[derive(Debug, Clone)]
struct IssueRec {
    number: u64,
    title: String,
    body: String,
    state: String,
    author: String,
    labels: Vec<String>,
    pr: Option<PrInfo>,
    created_at: String,
    /// Bumped by every comment and review, as GitHub does.
    updated_at: String,
}

#[derive(Debug, Clone)]
struct CommentRec {
    id: u64,
    number: u64,
    author: String,
    body: String,
    created_at: String,
}

#[derive(Debug, Clone)]
struct ReviewRec {
    id: u64,
    number: u64,
    author: String,
    body: String,
    state: String,
    submitted_at: String,
    /// The head the review was left on.
    commit_id: Option<String>,
}

#[derive(Debug, Clone)]
struct ReviewCommentRec {
    id: u64,
    number: u64,
    review_id: Option<u64>,
    in_reply_to: Option<u64>,
    author: String,
    body: String,
    path: String,
    created_at: String,
}

#[derive(Debug, Clone)]
struct CommitCommentRec {
    id: u64,
    sha: String,
    author: String,
    body: String,
}

#[derive(Debug, Default)]
struct FakeState {
    /// The repository served, when not [`REPO`].
    repo: Option<String>,
    issues: HashMap<u64, IssueRec>,
    comments: Vec<CommentRec>,
    reviews: Vec<ReviewRec>,
    review_comments: Vec<ReviewCommentRec>,
    commit_comments: Vec<CommitCommentRec>,
    statuses: HashMap<String, Vec<(String, String)>>,
    check_runs: HashMap<String, Vec<(String, String, Option<String>)>>,
    permissions: HashMap<String, String>,
    /// When set, the token is a GitHub App installation token of this app: `GET /user` is
    /// refused (403) and rover's posts are authored by `<slug>[bot]`.
    app_slug: Option<String>,
    /// A CI that runs on every commit without scripted checks: the n-th such commit asked
    /// about gets the n-th conclusion (the last repeats) as one completed check run.
    ci_program: Vec<String>,
    ci_assigned: Vec<String>,
    events: Vec<Value>,
    next_id: u64,
    next_event_id: u64,
    poll_interval: u64,
    rate_remaining: u64,
    faults: Vec<Fault>,
    log: Vec<Recorded>,
    /// When set, rover must come as this GitHub App (see `fake_github_app`).
    app: Option<FakeApp>,
    reactions: Vec<ReactionRec>,
    /// When set, the repository's git: a pull request is opened only from and into branches
    /// it has, as GitHub checks.
    origin: Option<std::path::PathBuf>,
    /// The merges made (`PUT /pulls/{n}/merge`).
    merges: Vec<merge::MergeRec>,
    /// The next merges refused with 405 and these words (branch protection not satisfied).
    merge_refusals: std::collections::VecDeque<String>,
    /// The releases, oldest first.
    releases: Vec<release::ReleaseRec>,
    /// Branch protection requires a branch to be up to date with its base before a merge.
    require_up_to_date: bool,
}

impl FakeState {
    /// `owner/name` of the repository served.
    fn repo_name(&self) -> String {
        self.repo.clone().unwrap_or_else(|| REPO.to_owned())
    }

    /// Who the token posts as: the machine user [`BOT`], or an app's bot.
    fn poster(&self) -> String {
        self.app_slug
            .as_ref()
            .map_or_else(|| BOT.to_owned(), |slug| format!("{slug}[bot]"))
    }

    fn id(&mut self) -> u64 {
        self.next_id += 1;
        self.next_id
    }
}

type Shared = Arc<Mutex<FakeState>>;

/// The running fake; dropped at the end of the test (the server task is aborted).
pub struct FakeGitHub {
    pub url: String,
    state: Shared,
    _served: Served,
}

fn now() -> String {
    chrono::Utc::now().format("%Y-%m-%dT%H:%M:%SZ").to_string()
}

fn user(login: &str) -> Value {
    let id = login
        .bytes()
        .fold(1000u64, |a, b| a * 31 % 1_000_003 + u64::from(b));
    json!({"login": login, "id": id, "node_id": format!("U_{id}"),
           "avatar_url": format!("https://avatars.githubusercontent.com/u/{id}?v=4"),
           "url": format!("https://api.github.com/users/{login}"),
           "html_url": format!("https://github.com/{login}"), "type": "User", "site_admin": false})
}

fn web(path: &str) -> String {
    format!("https://github.com/{REPO}/{path}")
}

fn api(path: &str) -> String {
    format!("https://api.github.com/repos/{REPO}/{path}")
}

impl FakeGitHub {
    /// The real octocrab client against this fake (with `TOKEN`, on `REPO`), with `settings`.
    pub fn client_with(&self, settings: &GitHubSettings) -> OctoGitHub {
        OctoGitHub::new(
            &self.url,
            TOKEN,
            RepoRef::parse(REPO).expect("repo"),
            settings,
        )
        .expect("client")
    }

    /// The real client as rover's bot (`BOT`), a 5 s request timeout.
    pub fn client(&self) -> OctoGitHub {
        self.client_with(&GitHubSettings {
            bot_login: Some(BOT.into()),
            request_timeout_secs: 5,
            ..GitHubSettings::default()
        })
    }
}

impl FakeGitHub {
    /// Start on 127.0.0.1 with an ephemeral port.
    pub async fn start() -> Self {
        let state: Shared = Arc::new(Mutex::new(FakeState {
            next_id: 1000,
            next_event_id: 40_000_000_000,
            poll_interval: 60,
            rate_remaining: RATE_LIMIT,
            ..FakeState::default()
        }));
        let app = Router::new().fallback(handle).with_state(state.clone());
        let served = serve(app, "the fake GitHub API").await;
        Self {
            url: format!("http://{}", served.addr),
            state,
            _served: served,
        }
    }

    /// A fake serving the repository `repo` (`owner/name`) instead of [`REPO`]: one of the
    /// repositories of a daemon that serves several.
    pub async fn start_for(repo: &str) -> Self {
        let fake = Self::start().await;
        fake.st().repo = Some(repo.to_owned());
        fake
    }

    fn st(&self) -> MutexGuard<'_, FakeState> {
        self.state.lock().expect("fake state lock")
    }

    /// Add an issue; no event is generated (use `seed_event` or writes for that).
    pub fn add_issue(&self, number: u64, title: &str, body: &str, author: &str, labels: &[&str]) {
        self.st().issues.insert(
            number,
            IssueRec {
                number,
                title: title.into(),
                body: body.into(),
                state: "open".into(),
                author: author.into(),
                labels: labels.iter().map(|s| (*s).to_owned()).collect(),
                pr: None,
                created_at: now(),
                updated_at: now(),
            },
        );
    }

    /// Add a pull request from `head` (sha `head_sha`) into `base`.
    pub fn add_pull(
        &self,
        number: u64,
        title: &str,
        author: &str,
        head: &str,
        head_sha: &str,
        base: &str,
    ) {
        self.st().issues.insert(
            number,
            IssueRec {
                number,
                title: title.into(),
                body: format!("Body of {title}"),
                state: "open".into(),
                author: author.into(),
                labels: vec![],
                pr: Some(PrInfo {
                    head: head.into(),
                    head_sha: head_sha.into(),
                    head_repo: Some(REPO.into()),
                    maintainer_can_modify: true,
                    base: base.into(),
                    merged: false,
                    merged_at: None,
                    draft: false,
                }),
                created_at: now(),
                updated_at: now(),
            },
        );
    }

    /// Make pull request `number`'s head a branch of the fork `repo` (`None`: a deleted fork).
    pub fn set_head_repo(&self, number: u64, repo: Option<&str>) {
        let mut st = self.st();
        let pr = st
            .issues
            .get_mut(&number)
            .and_then(|i| i.pr.as_mut())
            .expect("a pull request");
        pr.head_repo = repo.map(str::to_owned);
    }

    /// Open pull requests only from and into branches of the bare repository `origin`.
    pub fn check_branches_in(&self, origin: &std::path::Path) {
        self.st().origin = Some(origin.to_owned());
    }

    /// Each pull request: number, head, base.
    pub fn pull_bases(&self) -> Vec<(u64, String, String)> {
        let st = self.st();
        let mut all: Vec<_> = st
            .issues
            .values()
            .filter_map(|i| {
                i.pr.as_ref()
                    .map(|p| (i.number, p.head.clone(), p.base.clone()))
            })
            .collect();
        all.sort();
        all
    }

    /// Add a comment (no event); returns its id.
    pub fn add_comment(&self, number: u64, author: &str, body: &str) -> u64 {
        let mut st = self.st();
        let id = st.id();
        st.comments.push(CommentRec {
            id,
            number,
            author: author.into(),
            body: body.into(),
            created_at: now(),
        });
        touch(&mut st, number);
        id
    }

    /// Add a review (no event); returns its id.
    pub fn add_review(&self, number: u64, author: &str, state: &str, body: &str) -> u64 {
        self.push_review(number, author, state, body, None)
    }

    /// Add a review of `author` on the head `commit_id` (no event); returns its id.
    pub fn add_review_on(&self, number: u64, author: &str, state: &str, commit_id: &str) -> u64 {
        self.push_review(number, author, state, "", Some(commit_id))
    }

    fn push_review(
        &self,
        number: u64,
        author: &str,
        state: &str,
        body: &str,
        commit_id: Option<&str>,
    ) -> u64 {
        let mut st = self.st();
        let id = st.id();
        st.reviews.push(ReviewRec {
            id,
            number,
            author: author.into(),
            body: body.into(),
            state: state.into(),
            submitted_at: now(),
            commit_id: commit_id.map(String::from),
        });
        touch(&mut st, number);
        id
    }

    /// The merges made: `(number, method, head merged, merge commit)`.
    pub fn merges(&self) -> Vec<merge::MergeRec> {
        self.st().merges.clone()
    }

    /// Require a pull request's branch to be up to date with its base before it is merged
    /// (branch protection's "Require branches to be up to date before merging").
    pub fn require_up_to_date(&self) {
        self.st().require_up_to_date = true;
    }

    /// The releases made or seeded, oldest first: `(tag, target, body)`.
    pub fn releases(&self) -> Vec<(String, String, String)> {
        self.st()
            .releases
            .iter()
            .map(|r| (r.tag.clone(), r.target.clone(), r.body.clone()))
            .collect()
    }

    /// A release made before the test (by a person), of `target` with `created_at`
    /// (`2026-01-02T03:04:05Z`).
    pub fn add_release(&self, tag: &str, target: &str, created_at: &str) {
        let mut st = self.st();
        let id = st.id();
        st.releases.push(release::ReleaseRec {
            id,
            tag: tag.into(),
            target: target.into(),
            name: tag.into(),
            body: String::new(),
            created_at: created_at.into(),
            draft: false,
        });
    }

    /// Refuse the next merge with 405 and `why` (the repository's protection not satisfied).
    pub fn refuse_next_merge(&self, why: &str) {
        self.st().merge_refusals.push_back(why.into());
    }

    /// The current head of pull request `number` (its branch's commit when the fake has the
    /// repository).
    pub fn head_of(&self, number: u64) -> String {
        let mut st = self.st();
        merge::refresh_head(&mut st, number);
        st.issues[&number]
            .pr
            .as_ref()
            .expect("a pull request")
            .head_sha
            .clone()
    }

    /// Add a review comment (no event); returns its id.
    pub fn add_review_comment(
        &self,
        number: u64,
        author: &str,
        body: &str,
        in_reply_to: Option<u64>,
    ) -> u64 {
        let mut st = self.st();
        let id = st.id();
        st.review_comments.push(ReviewCommentRec {
            id,
            number,
            review_id: None,
            in_reply_to,
            author: author.into(),
            body: body.into(),
            path: "src/lib.rs".into(),
            created_at: now(),
        });
        touch(&mut st, number);
        id
    }

    pub fn set_permission(&self, login: &str, permission: &str) {
        self.st()
            .permissions
            .insert(login.into(), permission.into());
    }

    pub fn add_status(&self, sha: &str, state: &str, context: &str) {
        self.st()
            .statuses
            .entry(sha.into())
            .or_default()
            .push((state.into(), context.into()));
    }

    pub fn add_check_run(&self, sha: &str, name: &str, status: &str, conclusion: Option<&str>) {
        self.st().check_runs.entry(sha.into()).or_default().push((
            name.into(),
            status.into(),
            conclusion.map(Into::into),
        ));
    }

    /// A CI for every commit pushed (see `FakeState::ci_program`): `ci / test` concludes
    /// `conclusions[n]` on the n-th commit asked about.
    pub fn ci_on_new_commits(&self, conclusions: &[&str]) {
        self.st().ci_program = conclusions.iter().map(|c| (*c).to_owned()).collect();
    }

    /// Make the token an installation token of the GitHub App `slug` (see `FakeState`).
    pub fn use_installation_token(&self, slug: &str) {
        self.st().app_slug = Some(slug.into());
    }

    /// Make rover come as the GitHub App `app` (its installation tokens only; see
    /// `fake_github_app`); rover's posts are authored by `<slug>[bot]`.
    pub fn use_app(&self, app: FakeApp) {
        let mut st = self.st();
        st.app_slug = Some(app.slug.clone());
        st.app = Some(app);
    }

    /// The app as it stands (tokens minted, JWTs seen).
    pub fn app(&self) -> FakeApp {
        self.st().app.clone().expect("the app is on")
    }

    /// Whether a token is accepted now (an unexpired installation token, or `TOKEN` without
    /// an app): what the git server asks.
    pub fn token_checker(&self) -> super::git_http::Accepts {
        let state = self.state.clone();
        std::sync::Arc::new(move |token: &str| {
            let st = state.lock().expect("fake state lock");
            match &st.app {
                Some(app) => app.token_valid(token),
                None => token == TOKEN,
            }
        })
    }

    /// `login` leaves `content` on `target` (`issue:<n>`, `comment:<id>`, `review-comment:<id>`).
    pub fn add_reaction(&self, target: &str, login: &str, content: &str) {
        let mut st = self.st();
        let id = st.id();
        st.reactions.push(ReactionRec {
            id,
            target: target.to_owned(),
            user: login.to_owned(),
            content: content.to_owned(),
            created_at: now(),
        });
    }

    /// Every reaction: `(target, user, content)`.
    pub fn reactions(&self) -> Vec<(String, String, String)> {
        self.st()
            .reactions
            .iter()
            .map(|r| (r.target.clone(), r.user.clone(), r.content.clone()))
            .collect()
    }

    /// Ids of the comments on issue/PR `number`, with their authors and bodies.
    pub fn comments_of(&self, number: u64) -> Vec<(u64, String, String)> {
        self.st()
            .comments
            .iter()
            .filter(|c| c.number == number)
            .map(|c| (c.id, c.author.clone(), c.body.clone()))
            .collect()
    }

    /// Set how many requests the rate limit has left.
    pub fn set_rate_remaining(&self, remaining: u64) {
        self.st().rate_remaining = remaining;
    }

    /// Make everything the fake holds `secs` older (issues, comments, reviews, events): the
    /// world as it was before the test's story starts.
    pub fn backdate(&self, secs: i64) {
        let back = |t: &mut String| {
            if let Ok(parsed) = chrono::DateTime::parse_from_rfc3339(t) {
                *t = (parsed.with_timezone(&chrono::Utc) - chrono::TimeDelta::seconds(secs))
                    .format("%Y-%m-%dT%H:%M:%SZ")
                    .to_string();
            }
        };
        let mut st = self.st();
        for i in st.issues.values_mut() {
            back(&mut i.created_at);
            back(&mut i.updated_at);
        }
        for c in &mut st.comments {
            back(&mut c.created_at);
        }
        for r in &mut st.reviews {
            back(&mut r.submitted_at);
        }
        for c in &mut st.review_comments {
            back(&mut c.created_at);
        }
        for e in &mut st.events {
            if let Some(Value::String(t)) = e.get_mut("created_at") {
                back(t);
            }
        }
    }

    /// Drop every event from the feed (GitHub drops events older than 30 days, and keeps 300).
    pub fn clear_events(&self) {
        self.st().events.clear();
    }

    pub fn set_poll_interval(&self, secs: u64) {
        self.st().poll_interval = secs;
    }

    /// Append a raw event (type and payload as given) with the standard envelope; returns its id.
    pub fn seed_event(&self, kind: &str, actor: &str, payload: Value) -> String {
        let mut st = self.st();
        push_event(&mut st, kind, actor, payload)
    }

    pub fn clear_faults(&self) {
        self.st().faults.clear();
    }

    pub fn fault(&self, fault: Fault) {
        self.st().faults.push(fault);
    }

    /// Every request so far.
    pub fn requests(&self) -> Vec<Recorded> {
        self.st().log.clone()
    }

    /// Requests to routes the fake does not know.
    pub fn unknown_requests(&self) -> Vec<Recorded> {
        self.st()
            .log
            .iter()
            .filter(|r| !r.known_route)
            .cloned()
            .collect()
    }

    /// How many requests matched `method` and a path containing `fragment`.
    pub fn count(&self, method: &Method, fragment: &str) -> usize {
        self.st()
            .log
            .iter()
            .filter(|r| r.method == *method && r.path.contains(fragment))
            .count()
    }

    /// The pull requests: `(number, head branch, title, body, state)`.
    pub fn pulls(&self) -> Vec<(u64, String, String, String, String)> {
        self.st()
            .issues
            .values()
            .filter_map(|i| {
                i.pr.as_ref().map(|p| {
                    (
                        i.number,
                        p.head.clone(),
                        i.title.clone(),
                        i.body.clone(),
                        i.state.clone(),
                    )
                })
            })
            .collect()
    }

    /// Mark a pull request merged and closed (as the merge button does).
    pub fn merge_pull(&self, number: u64) {
        let mut st = self.st();
        let issue = st.issues.get_mut(&number).expect("a pull request to merge");
        issue.state = "closed".into();
        issue.updated_at = now();
        if let Some(pr) = issue.pr.as_mut() {
            pr.merged = true;
            pr.merged_at = Some(now());
        }
    }

    /// Close a pull request without merging it.
    pub fn close_pull(&self, number: u64) {
        let mut st = self.st();
        let issue = st.issues.get_mut(&number).expect("a pull request to close");
        assert!(issue.pr.is_some(), "#{number} is not a pull request");
        issue.state = "closed".into();
    }

    /// Bodies of the comments on issue/PR `number`.
    pub fn comment_bodies(&self, number: u64) -> Vec<String> {
        bodies(&self.st().comments, |c| c.number == number, |c| &c.body)
    }

    pub fn review_bodies(&self, number: u64) -> Vec<String> {
        bodies(&self.st().reviews, |c| c.number == number, |c| &c.body)
    }

    pub fn review_comment_bodies(&self, number: u64) -> Vec<String> {
        bodies(
            &self.st().review_comments,
            |c| c.number == number,
            |c| &c.body,
        )
    }

    pub fn commit_comment_bodies(&self, sha: &str) -> Vec<String> {
        bodies(&self.st().commit_comments, |c| c.sha == sha, |c| &c.body)
    }

    pub fn rate_remaining(&self) -> u64 {
        self.st().rate_remaining
    }
}

/// The bodies of the records of `list` that `keep` keeps, in order.
fn bodies<T>(list: &[T], keep: impl Fn(&T) -> bool, body: impl Fn(&T) -> &String) -> Vec<String> {
    list.iter()
        .filter(|r| keep(r))
        .map(|r| body(r).clone())
        .collect()
}

/// A comment or review bumps its issue's `updated_at`.
fn touch(st: &mut FakeState, number: u64) {
    if let Some(i) = st.issues.get_mut(&number) {
        i.updated_at = now();
    }
}

#[allow(
    clippy::needless_pass_by_value,
    reason = "call sites build the payload inline"
)]
fn push_event(st: &mut FakeState, kind: &str, actor: &str, payload: Value) -> String {
    // Since 2025-10 the feed carries no author_association anywhere.
    let mut payload = payload;
    if let Some(o) = payload.as_object_mut() {
        for v in o.values_mut() {
            if let Some(inner) = v.as_object_mut() {
                inner.remove("author_association");
            }
        }
    }
    st.next_event_id += 1;
    let id = st.next_event_id.to_string();
    let u = user(actor);
    st.events.push(json!({
        "id": id, "type": kind,
        "actor": {"id": u["id"], "login": actor, "display_login": actor, "gravatar_id": "",
                  "url": u["url"], "avatar_url": u["avatar_url"]},
        "repo": {"id": 316_335_970, "name": st.repo_name(), "url": format!("https://api.github.com/repos/{}", st.repo_name())},
        "payload": payload, "public": true, "created_at": now(),
    }));
    id
}

fn issue_json(i: &IssueRec, comments: usize) -> Value {
    let kind = if i.pr.is_some() { "pull" } else { "issues" };
    let mut v = json!({
        "url": api(&format!("issues/{}", i.number)), "repository_url": api("").trim_end_matches('/'),
        "html_url": web(&format!("{kind}/{}", i.number)), "id": 1_800_000_000 + i.number,
        "node_id": format!("I_{}", i.number), "number": i.number, "title": i.title, "user": user(&i.author),
        "labels": i.labels.iter().map(|l| json!({"id": 1, "node_id": "LA_1", "url": api(&format!("labels/{l}")), "name": l, "color": "f29513", "default": false, "description": null})).collect::<Vec<_>>(),
        "state": i.state, "locked": false, "assignee": null, "assignees": [], "milestone": null,
        "comments": comments, "created_at": i.created_at, "updated_at": i.updated_at, "closed_at": null,
        "body": i.body, "author_association": "MEMBER", "state_reason": null,
    });
    if i.pr.is_some() {
        v["pull_request"] = json!({"url": api(&format!("pulls/{}", i.number)), "html_url": web(&format!("pull/{}", i.number)), "merged_at": null});
    }
    v
}

fn pull_json(i: &IssueRec) -> Value {
    let pr = i.pr.clone().expect("pull_json on a pull request");
    let repo = json!({"id": 316_335_970, "name": "widgets", "full_name": REPO});
    let head_repo = pr.head_repo.as_ref().map_or(
        Value::Null,
        |r| json!({"id": 416_335_970, "name": r.rsplit('/').next(), "full_name": r}),
    );
    let head_owner = pr
        .head_repo
        .as_deref()
        .and_then(|r| r.split('/').next())
        .unwrap_or("octo-org");
    json!({
        "url": api(&format!("pulls/{}", i.number)), "id": 558_121_796 + i.number, "node_id": format!("PR_{}", i.number),
        "html_url": web(&format!("pull/{}", i.number)), "number": i.number, "state": i.state, "locked": false,
        "title": i.title, "user": user(&i.author), "body": i.body,
        "labels": i.labels.iter().map(|l| json!({"name": l})).collect::<Vec<_>>(),
        "created_at": i.created_at, "updated_at": i.updated_at, "closed_at": null,
        "merged_at": pr.merged_at, "merged": pr.merged, "draft": pr.draft,
        "head": {"label": format!("{head_owner}:{}", pr.head), "ref": pr.head, "sha": pr.head_sha, "user": user(head_owner), "repo": head_repo},
        "base": {"label": format!("octo-org:{}", pr.base), "ref": pr.base, "sha": "dfbedd9e1470e53f3a0f2e408e4d6808585b6987", "user": user("octo-org"), "repo": repo},
        "author_association": "MEMBER", "mergeable": null, "mergeable_state": "unknown",
        "maintainer_can_modify": pr.maintainer_can_modify,
    })
}

fn comment_json(c: &CommentRec, is_pr: bool) -> Value {
    let kind = if is_pr { "pull" } else { "issues" };
    json!({"url": api(&format!("issues/comments/{}", c.id)), "html_url": web(&format!("{kind}/{}#issuecomment-{}", c.number, c.id)),
           "issue_url": api(&format!("issues/{}", c.number)), "id": c.id, "node_id": format!("IC_{}", c.id),
           "user": user(&c.author), "created_at": c.created_at, "updated_at": c.created_at, "body": c.body, "author_association": "MEMBER"})
}

fn review_json(r: &ReviewRec) -> Value {
    json!({"id": r.id, "node_id": format!("PRR_{}", r.id), "user": user(&r.author), "body": r.body, "state": r.state,
           "html_url": web(&format!("pull/{}#pullrequestreview-{}", r.number, r.id)),
           "pull_request_url": api(&format!("pulls/{}", r.number)), "commit_id": r.commit_id.as_deref().unwrap_or("184cb4b61e26de7cccc385d37da25cd8bd817d27"),
           "submitted_at": r.submitted_at, "author_association": "MEMBER"})
}

fn review_comment_json(c: &ReviewCommentRec) -> Value {
    let mut v = json!({"url": api(&format!("pulls/comments/{}", c.id)), "pull_request_review_id": c.review_id, "id": c.id,
           "node_id": format!("PRRC_{}", c.id), "diff_hunk": "@@ -1,3 +1,4 @@", "path": c.path, "position": 1,
           "commit_id": "184cb4b61e26de7cccc385d37da25cd8bd817d27", "user": user(&c.author), "body": c.body,
           "created_at": c.created_at, "updated_at": c.created_at, "html_url": web(&format!("pull/{}#discussion_r{}", c.number, c.id)),
           "pull_request_url": api(&format!("pulls/{}", c.number)), "line": 3, "side": "RIGHT", "author_association": "MEMBER"});
    if let Some(r) = c.in_reply_to {
        v["in_reply_to_id"] = json!(r);
    }
    v
}

fn commit_comment_json(c: &CommitCommentRec) -> Value {
    json!({"html_url": web(&format!("commit/{}#commitcomment-{}", c.sha, c.id)), "url": api(&format!("comments/{}", c.id)),
           "id": c.id, "node_id": format!("CC_{}", c.id), "body": c.body, "path": null, "position": null, "line": null,
           "commit_id": c.sha, "user": user(&c.author), "created_at": now(), "updated_at": now(), "author_association": "MEMBER"})
}

fn minimal_pr(i: &IssueRec) -> Value {
    let pr = i.pr.clone().expect("minimal_pr on a pull request");
    let repo = json!({"id": 316_335_970, "url": format!("https://api.github.com/repos/{REPO}"), "name": "widgets"});
    json!({"url": api(&format!("pulls/{}", i.number)), "id": 558_121_796 + i.number, "number": i.number,
           "head": {"ref": pr.head, "sha": pr.head_sha, "repo": repo}, "base": {"ref": pr.base, "sha": "dfbedd9e1470e53f3a0f2e408e4d6808585b6987", "repo": repo}})
}

/// Issue payload as the trimmed feed carries it (no author_association).
fn feed_issue(i: &IssueRec) -> Value {
    let mut v = issue_json(i, 0);
    if let Some(o) = v.as_object_mut() {
        o.remove("author_association");
    }
    v
}

fn query_param(query: &str, name: &str) -> Option<String> {
    query.split('&').find_map(|kv| {
        let (k, v) = kv.split_once('=')?;
        (k == name).then(|| v.replace("%3A", ":").replace("%2F", "/"))
    })
}

struct Reply {
    status: u16,
    body: String,
    headers: Vec<(String, String)>,
    known: bool,
    counts: bool,
}

fn reply(status: u16, body: &Value) -> Reply {
    Reply {
        status,
        body: body.to_string(),
        headers: vec![],
        known: true,
        counts: true,
    }
}

fn error(status: u16, message: &str) -> Reply {
    reply(
        status,
        &json!({"message": message, "documentation_url": "https://docs.github.com/rest", "status": status.to_string()}),
    )
}

/// GitHub's `Link` header for page `page` of `last`: absolute URLs that keep the request's other
/// query parameters and put `page` last, in the order `prev`, `next`, `last`, `first`.
fn link_header(path: &str, query: &str, page: usize, last: usize) -> Option<String> {
    if last <= 1 {
        return None;
    }
    let others: Vec<&str> = query
        .split('&')
        .filter(|kv| !kv.is_empty() && !kv.starts_with("page="))
        .collect();
    let url = |p: usize| {
        let mut q = others.clone();
        let page = format!("page={p}");
        q.push(&page);
        format!("<https://api.github.com{path}?{}>", q.join("&"))
    };
    let mut links = Vec::new();
    if page > 1 {
        links.push(format!("{}; rel=\"prev\"", url(page - 1)));
    }
    if page < last {
        links.push(format!("{}; rel=\"next\"", url(page + 1)));
        links.push(format!("{}; rel=\"last\"", url(last)));
    }
    if page > 1 {
        links.push(format!("{}; rel=\"first\"", url(1)));
    }
    Some(links.join(", "))
}

fn paginate(items: Vec<Value>, query: &str, path: &str) -> Reply {
    let per_page = query_param(query, "per_page")
        .and_then(|p| p.parse().ok())
        .unwrap_or(30usize)
        .clamp(1, 100);
    let page = query_param(query, "page")
        .and_then(|p| p.parse().ok())
        .unwrap_or(1usize)
        .max(1);
    let last = items.len().div_ceil(per_page).max(1);
    let slice: Vec<Value> = items
        .into_iter()
        .skip((page - 1) * per_page)
        .take(per_page)
        .collect();
    let mut r = reply(200, &Value::Array(slice));
    if let Some(link) = link_header(path, query, page, last) {
        r.headers.push(("link".into(), link));
    }
    r
}

async fn handle(
    State(state): State<Shared>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response<Body> {
    let path = uri.path().to_owned();
    let query = uri.query().unwrap_or("").to_owned();
    let header_map: HashMap<String, String> = headers
        .iter()
        .map(|(k, v)| {
            (
                k.as_str().to_ascii_lowercase(),
                v.to_str().unwrap_or("").to_owned(),
            )
        })
        .collect();

    // Record on arrival so a request the client gave up on is still counted.
    let index = {
        let mut st = state.lock().expect("fake state lock");
        st.log.push(Recorded {
            method: method.clone(),
            path: path.clone(),
            query: query.clone(),
            headers: header_map.clone(),
            status: 0,
            known_route: true,
            at: std::time::Instant::now(),
        });
        st.log.len() - 1
    };
    // Faults first (a slow fault delays, then the request proceeds).
    let fault = {
        let mut st = state.lock().expect("fake state lock");
        let found = st.faults.iter_mut().find(|f| {
            f.times > 0
                && f.method.as_ref().is_none_or(|m| *m == method)
                && path.contains(&f.path_contains)
        });
        found.map(|f| {
            f.times -= 1;
            f.kind.clone()
        })
    };
    let mut out = match fault {
        Some(FaultKind::Slow(d)) => {
            tokio::time::sleep(d).await;
            None
        }
        Some(kind) => Some(fault_reply(&kind)),
        None => None,
    };

    if out.is_none() {
        let mut st = state.lock().expect("fake state lock");
        let payload: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
        out = app::app_route(
            &mut st,
            &method,
            &path,
            header_map.get("authorization"),
            &payload,
        );
        let authorized = if st.app.is_some() {
            app::app_authorized(&mut st, header_map.get("authorization"))
        } else {
            header_map
                .get("authorization")
                .is_some_and(|a| a == &format!("Bearer {TOKEN}") || a == &format!("token {TOKEN}"))
        };
        if out.is_none() && !authorized {
            out = Some(error(401, "Bad credentials"));
        }
    }
    let reply = if let Some(r) = out {
        r
    } else {
        let mut st = state.lock().expect("fake state lock");
        let payload: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
        route(&mut st, &method, &path, &query, &header_map, &payload)
    };

    let mut st = state.lock().expect("fake state lock");
    if reply.counts && reply.status != 304 && st.rate_remaining > 0 {
        st.rate_remaining -= 1;
    }
    st.log[index].status = reply.status;
    st.log[index].known_route = reply.known;
    let mut builder = Response::builder()
        .status(StatusCode::from_u16(reply.status).expect("valid status"))
        .header("content-type", "application/json; charset=utf-8")
        .header("x-ratelimit-limit", RATE_LIMIT.to_string())
        .header(
            "x-ratelimit-used",
            (RATE_LIMIT - st.rate_remaining).to_string(),
        )
        .header("x-ratelimit-resource", "core")
        .header("x-github-api-version-selected", "2022-11-28");
    let has = |n: &str| reply.headers.iter().any(|(k, _)| k == n);
    if !has("x-ratelimit-remaining") {
        builder = builder.header("x-ratelimit-remaining", st.rate_remaining.to_string());
    }
    if !has("x-ratelimit-reset") {
        builder = builder.header("x-ratelimit-reset", RESET_EPOCH.to_string());
    }
    for (k, v) in &reply.headers {
        builder = builder.header(k.as_str(), v.as_str());
    }
    builder
        .body(Body::from(reply.body))
        .expect("valid response")
}

fn fault_reply(kind: &FaultKind) -> Reply {
    match kind {
        FaultKind::Unauthorized => error(401, "Bad credentials"),
        FaultKind::RateLimited { status, reset } => {
            let mut r = error(*status, "API rate limit exceeded for user ID 1.");
            r.headers.push(("x-ratelimit-remaining".into(), "0".into()));
            r.headers
                .push(("x-ratelimit-reset".into(), reset.to_string()));
            r
        }
        FaultKind::SecondaryLimit {
            status,
            retry_after,
        } => {
            let mut r = error(*status, "You have exceeded a secondary rate limit. Please wait a few minutes before you try again.");
            r.headers
                .push(("retry-after".into(), retry_after.to_string()));
            r
        }
        FaultKind::NotFound => error(404, "Not Found"),
        FaultKind::Validation(msgs) => reply(
            422,
            &json!({
            "message": "Validation Failed",
            "errors": msgs.iter().map(|m| json!({"resource": "PullRequest", "code": "custom", "message": m})).collect::<Vec<_>>(),
            "documentation_url": "https://docs.github.com/rest/pulls/pulls#create-a-pull-request", "status": "422"}),
        ),
        FaultKind::Server(s) => error(*s, "Server Error"),
        FaultKind::Malformed => Reply {
            status: 200,
            body: "[{\"id\": \"4000, \"type\":".into(),
            headers: vec![],
            known: true,
            counts: true,
        },
        FaultKind::Slow(_) => unreachable!("slow faults delay, they do not reply"),
    }
}

fn route(
    st: &mut FakeState,
    method: &Method,
    path: &str,
    query: &str,
    headers: &HashMap<String, String>,
    payload: &Value,
) -> Reply {
    if (method.as_str(), path) == ("GET", "/user") {
        return authenticated_user(st);
    }
    // The feed's `Link` header names the repository by id, as GitHub's does.
    if method == Method::GET && path == format!("/repositories/{REPO_ID}/events") {
        return events(st, query, headers, path);
    }
    // Who rover's writes are authored by (the token's user or app).
    let me = st.poster();
    let prefix = format!("/repos/{}", st.repo_name());
    let Some(rest) = path.strip_prefix(&prefix) else {
        return unknown();
    };
    let seg: Vec<&str> = rest.trim_start_matches('/').split('/').collect();
    if let Some(r) = app::reactions_route(st, method, &seg, query, headers, payload, &me) {
        return r;
    }
    if let Some(r) = merge::merge_route(st, method, &seg, query, path, payload, &me) {
        return r;
    }
    if let Some(r) = release::release_route(st, method, &seg, query, path, payload) {
        return r;
    }
    let num = |s: &str| s.parse::<u64>().ok();
    match (method.as_str(), seg.as_slice()) {
        ("GET", ["events"]) => events(
            st,
            query,
            headers,
            &format!("/repositories/{REPO_ID}/events"),
        ),
        ("GET", ["issues"]) => {
            // Pull requests are issues too; `since` filters by `updated_at`.
            let since = query_param(query, "since").unwrap_or_default();
            let state = query_param(query, "state").unwrap_or_else(|| "open".into());
            let mut items: Vec<&IssueRec> = st
                .issues
                .values()
                .filter(|i| i.updated_at >= since && (state == "all" || i.state == state))
                .collect();
            items.sort_by(|a, b| (&a.updated_at, a.number).cmp(&(&b.updated_at, b.number)));
            if query_param(query, "direction").as_deref() != Some("asc") {
                items.reverse();
            }
            let list = items
                .into_iter()
                .map(|i| {
                    let count = st.comments.iter().filter(|c| c.number == i.number).count();
                    issue_json(i, count)
                })
                .collect();
            paginate(list, query, path)
        }
        ("GET", ["issues", "comments"]) => {
            let since = query_param(query, "since").unwrap_or_default();
            let mut items: Vec<&CommentRec> = st
                .comments
                .iter()
                .filter(|c| c.created_at >= since)
                .collect();
            items.sort_by(|a, b| (&a.created_at, a.id).cmp(&(&b.created_at, b.id)));
            if query_param(query, "direction").as_deref() == Some("desc") {
                items.reverse();
            }
            let list = items
                .into_iter()
                .map(|c| {
                    let is_pr = st.issues.get(&c.number).is_some_and(|i| i.pr.is_some());
                    comment_json(c, is_pr)
                })
                .collect();
            paginate(list, query, path)
        }
        ("GET", ["issues", n]) => match num(n).and_then(|n| st.issues.get(&n)) {
            Some(i) => {
                let count = st.comments.iter().filter(|c| c.number == i.number).count();
                reply(200, &issue_json(i, count))
            }
            None => error(404, "Not Found"),
        },
        ("GET", ["issues", n, "comments"]) => {
            let Some(i) = num(n).and_then(|n| st.issues.get(&n)) else {
                return error(404, "Not Found");
            };
            let is_pr = i.pr.is_some();
            let items = st
                .comments
                .iter()
                .filter(|c| Some(c.number) == num(n))
                .map(|c| comment_json(c, is_pr))
                .collect();
            paginate(items, query, path)
        }
        ("POST", ["issues", n, "comments"]) => {
            let Some(i) = num(n).and_then(|n| st.issues.get(&n)).cloned() else {
                return error(404, "Not Found");
            };
            let Some(body) = payload.get("body").and_then(Value::as_str) else {
                return reply(
                    422,
                    &json!({"message": "Invalid request.\n\n\"body\" wasn't supplied.", "status": "422"}),
                );
            };
            let id = st.id();
            let c = CommentRec {
                id,
                number: i.number,
                author: me.clone(),
                body: body.into(),
                created_at: now(),
            };
            let v = comment_json(&c, i.pr.is_some());
            st.comments.push(c);
            touch(st, i.number);
            push_event(
                st,
                "IssueCommentEvent",
                &me,
                json!({"action": "created", "issue": feed_issue(&i), "comment": v}),
            );
            reply(201, &v)
        }
        ("GET", ["pulls"]) => {
            let open: Vec<u64> = st.issues.keys().copied().collect();
            for n in open {
                merge::refresh_head(st, n);
            }
            let head = query_param(query, "head");
            let base = query_param(query, "base");
            let state = query_param(query, "state").unwrap_or_else(|| "open".into());
            let mut items: Vec<&IssueRec> = st
                .issues
                .values()
                .filter(|i| {
                    i.pr.as_ref().is_some_and(|p| {
                        head.as_ref()
                            .is_none_or(|h| *h == format!("octo-org:{}", p.head))
                            && base.as_ref().is_none_or(|b| *b == p.base)
                    }) && (state == "all" || i.state == state)
                })
                .collect();
            // GitHub's `sort` (created, updated, ...) and `direction` (desc by default when a
            // sort is given); without them, oldest first.
            match query_param(query, "sort").as_deref() {
                Some("updated") => {
                    items.sort_by_key(|i| (i.updated_at.clone(), i.number));
                }
                _ => items.sort_by_key(|i| i.number),
            }
            let desc = query_param(query, "direction")
                .map_or_else(|| query_param(query, "sort").is_some(), |d| d == "desc");
            if desc {
                items.reverse();
            }
            paginate(items.into_iter().map(pull_json).collect(), query, path)
        }
        ("POST", ["pulls"]) => {
            let s = |k: &str| {
                payload
                    .get(k)
                    .and_then(Value::as_str)
                    .unwrap_or("")
                    .to_owned()
            };
            let (head, base, title) = (s("head"), s("base"), s("title"));
            // As GitHub: both ends must be branches of the repository.
            if let Some(origin) = &st.origin {
                let repo = git2::Repository::open_bare(origin).expect("the origin");
                for (field, branch) in [("head", &head), ("base", &base)] {
                    if repo
                        .find_reference(&format!("refs/heads/{branch}"))
                        .is_err()
                    {
                        return reply(
                            422,
                            &json!({"message": "Validation Failed",
                                "errors": [{"resource": "PullRequest", "field": field, "code": "invalid"}],
                                "documentation_url": "https://docs.github.com/rest/pulls/pulls#create-a-pull-request", "status": "422"}),
                        );
                    }
                }
            }
            if st
                .issues
                .values()
                .any(|i| i.state == "open" && i.pr.as_ref().is_some_and(|p| p.head == head))
            {
                return fault_reply(&FaultKind::Validation(vec![format!(
                    "A pull request already exists for octo-org:{head}."
                )]));
            }
            let number = st.issues.keys().max().copied().unwrap_or(0) + 1;
            let head_sha = merge::branch_sha(st, &head)
                .unwrap_or_else(|| "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa".into());
            let rec = IssueRec {
                number,
                title,
                body: s("body"),
                state: "open".into(),
                author: me.clone(),
                labels: vec![],
                pr: Some(PrInfo {
                    head,
                    head_sha,
                    head_repo: Some(REPO.into()),
                    maintainer_can_modify: false,
                    base,
                    merged: false,
                    merged_at: None,
                    draft: payload
                        .get("draft")
                        .and_then(Value::as_bool)
                        .unwrap_or(false),
                }),
                created_at: now(),
                updated_at: now(),
            };
            let v = pull_json(&rec);
            push_event(
                st,
                "PullRequestEvent",
                &me,
                json!({"action": "opened", "number": number, "pull_request": minimal_pr(&rec)}),
            );
            st.issues.insert(number, rec);
            reply(201, &v)
        }
        ("GET", ["pulls", "comments"]) => {
            let since = query_param(query, "since").unwrap_or_default();
            let mut items: Vec<&ReviewCommentRec> = st
                .review_comments
                .iter()
                .filter(|c| c.created_at >= since)
                .collect();
            items.sort_by(|a, b| (&a.created_at, a.id).cmp(&(&b.created_at, b.id)));
            if query_param(query, "direction").as_deref() == Some("desc") {
                items.reverse();
            }
            paginate(
                items.into_iter().map(review_comment_json).collect(),
                query,
                path,
            )
        }
        ("GET", ["pulls", n]) => match num(n)
            .inspect(|n| merge::refresh_head(st, *n))
            .and_then(|n| st.issues.get(&n))
            .filter(|i| i.pr.is_some())
        {
            Some(i) => {
                let mut v = pull_json(i);
                if let Some(state) = i.pr.as_ref().and_then(|p| merge::mergeable_state(st, p)) {
                    v["mergeable_state"] = json!(state);
                }
                reply(200, &v)
            }
            None => error(404, "Not Found"),
        },
        ("GET", ["pulls", n, "reviews"]) => {
            let items = st
                .reviews
                .iter()
                .filter(|r| Some(r.number) == num(n))
                .map(review_json)
                .collect();
            paginate(items, query, path)
        }
        ("POST", ["pulls", n, "reviews"]) => {
            let Some(i) = num(n)
                .and_then(|n| st.issues.get(&n))
                .filter(|i| i.pr.is_some())
                .cloned()
            else {
                return error(404, "Not Found");
            };
            let event = payload.get("event").and_then(Value::as_str).unwrap_or("");
            let state = match event {
                "APPROVE" => "APPROVED",
                "REQUEST_CHANGES" => "CHANGES_REQUESTED",
                "COMMENT" => "COMMENTED",
                _ => "PENDING",
            };
            if i.author == me && matches!(event, "APPROVE" | "REQUEST_CHANGES") {
                return fault_reply(&FaultKind::Validation(vec![
                    "Can not request changes on your own pull request".into(),
                ]));
            }
            let id = st.id();
            let r = ReviewRec {
                id,
                number: i.number,
                author: me.clone(),
                body: payload
                    .get("body")
                    .and_then(Value::as_str)
                    .unwrap_or("")
                    .into(),
                state: state.into(),
                submitted_at: now(),
                commit_id: i.pr.as_ref().map(|p| p.head_sha.clone()),
            };
            let v = review_json(&r);
            st.reviews.push(r);
            touch(st, i.number);
            let mut feed_review = v.clone();
            feed_review["state"] = json!(state.to_ascii_lowercase());
            push_event(
                st,
                "PullRequestReviewEvent",
                &me,
                json!({"action": "created", "pull_request": minimal_pr(&i), "review": feed_review}),
            );
            reply(200, &v)
        }
        ("GET", ["pulls", n, "comments"]) => {
            let items = st
                .review_comments
                .iter()
                .filter(|c| Some(c.number) == num(n))
                .map(review_comment_json)
                .collect();
            paginate(items, query, path)
        }
        ("POST", ["pulls", n, "comments", cid, "replies"]) => {
            let Some(i) = num(n).and_then(|n| st.issues.get(&n)).cloned() else {
                return error(404, "Not Found");
            };
            let Some(target) = st
                .review_comments
                .iter()
                .find(|c| Some(c.id) == num(cid))
                .cloned()
            else {
                return error(404, "Not Found");
            };
            if target.in_reply_to.is_some() {
                return reply(
                    422,
                    &json!({"message": "Validation Failed", "errors": [{"resource": "PullRequestReviewComment", "code": "invalid", "field": "in_reply_to", "message": "in_reply_to cannot be a reply"}], "status": "422"}),
                );
            }
            let id = st.id();
            let c = ReviewCommentRec {
                id,
                number: i.number,
                review_id: target.review_id,
                in_reply_to: Some(target.id),
                author: me.clone(),
                body: payload
                    .get("body")
                    .and_then(Value::as_str)
                    .unwrap_or("")
                    .into(),
                path: target.path.clone(),
                created_at: now(),
            };
            let v = review_comment_json(&c);
            st.review_comments.push(c);
            touch(st, i.number);
            push_event(
                st,
                "PullRequestReviewCommentEvent",
                &me,
                json!({"action": "created", "pull_request": minimal_pr(&i), "comment": v}),
            );
            reply(201, &v)
        }
        ("GET", ["commits", sha, "comments"]) => {
            let items = st
                .commit_comments
                .iter()
                .filter(|c| c.sha == *sha)
                .map(commit_comment_json)
                .collect();
            paginate(items, query, path)
        }
        ("POST", ["commits", sha, "comments"]) => {
            let id = st.id();
            let c = CommitCommentRec {
                id,
                sha: (*sha).to_owned(),
                author: me.clone(),
                body: payload
                    .get("body")
                    .and_then(Value::as_str)
                    .unwrap_or("")
                    .into(),
            };
            let v = commit_comment_json(&c);
            st.commit_comments.push(c);
            push_event(
                st,
                "CommitCommentEvent",
                &me,
                json!({"action": "created", "comment": v}),
            );
            reply(201, &v)
        }
        ("GET", ["commits", git_ref, "status"]) => {
            let statuses = st.statuses.get(*git_ref).cloned().unwrap_or_default();
            let state = if statuses.is_empty()
                || statuses.iter().any(|(s, _)| s == "pending")
                    && !statuses.iter().any(|(s, _)| s == "failure" || s == "error")
            {
                "pending"
            } else if statuses.iter().any(|(s, _)| s == "failure" || s == "error") {
                "failure"
            } else {
                "success"
            };
            reply(
                200,
                &json!({"state": state, "sha": git_ref, "total_count": statuses.len(),
                "statuses": statuses.iter().map(|(s, c)| json!({"state": s, "context": c, "description": null, "target_url": null})).collect::<Vec<_>>()}),
            )
        }
        ("GET", ["commits", git_ref, "check-runs"]) => {
            if !st.check_runs.contains_key(*git_ref) && !st.ci_program.is_empty() {
                let n = st.ci_assigned.len().min(st.ci_program.len() - 1);
                let conclusion = st.ci_program[n].clone();
                st.ci_assigned.push((*git_ref).to_owned());
                // `in_progress` in the program: a check that never finishes.
                let run = if conclusion == "in_progress" {
                    ("ci / test".into(), "in_progress".into(), None)
                } else {
                    ("ci / test".into(), "completed".into(), Some(conclusion))
                };
                st.check_runs.insert((*git_ref).to_owned(), vec![run]);
            }
            let runs = st.check_runs.get(*git_ref).cloned().unwrap_or_default();
            reply(
                200,
                &json!({"total_count": runs.len(), "check_runs": runs.iter().enumerate().map(|(i, (n, s, c))| json!({
                "id": i + 1, "name": n, "head_sha": git_ref, "status": s, "conclusion": c,
                "html_url": web("actions"), "details_url": web("actions"), "output": {"title": null, "summary": null}})).collect::<Vec<_>>()}),
            )
        }
        ("GET", ["collaborators", login, "permission"]) => {
            let perm = st
                .permissions
                .get(*login)
                .cloned()
                .unwrap_or_else(|| "read".into());
            let legacy = match perm.as_str() {
                "maintain" => "write",
                "triage" => "read",
                p => p,
            }
            .to_owned();
            reply(
                200,
                &json!({"permission": legacy, "role_name": perm, "user": user(login)}),
            )
        }
        _ => unknown(),
    }
}

/// `GET /user`: the token's own user, with the private fields a user token sees; an
/// installation token has no user and is refused as GitHub refuses it.
fn authenticated_user(st: &FakeState) -> Reply {
    if st.app_slug.is_some() {
        return reply(
            403,
            &json!({"message": "Resource not accessible by integration",
                    "documentation_url": "https://docs.github.com/rest/users/users#get-the-authenticated-user",
                    "status": "403"}),
        );
    }
    let mut me = user(BOT);
    let extra = json!({"name": "Rover Bot", "company": null, "blog": "", "location": null,
        "email": null, "hireable": null, "bio": null, "twitter_username": null,
        "public_repos": 0, "public_gists": 0, "followers": 0, "following": 0,
        "created_at": "2025-01-02T03:04:05Z", "updated_at": "2025-06-07T08:09:10Z",
        "private_gists": 0, "total_private_repos": 0, "owned_private_repos": 0,
        "disk_usage": 0, "collaborators": 0, "two_factor_authentication": true,
        "plan": {"name": "free", "space": 976_562_499, "collaborators": 0, "private_repos": 10000}});
    if let (Some(me), Some(extra)) = (me.as_object_mut(), extra.as_object()) {
        me.extend(extra.clone());
    }
    reply(200, &me)
}

/// A strong ETag of an answer (its query and body).
fn etag_of(query: &str, body: &str) -> String {
    let mut h = DefaultHasher::new();
    query.hash(&mut h);
    body.hash(&mut h);
    format!("\"{:016x}\"", h.finish())
}

fn unknown() -> Reply {
    let mut r = error(404, "Not Found");
    r.known = false;
    r
}

/// GitHub serves at most this many events.
const EVENT_CAP: usize = 300;

fn events(st: &FakeState, query: &str, headers: &HashMap<String, String>, path: &str) -> Reply {
    let per_page = query_param(query, "per_page")
        .and_then(|p| p.parse().ok())
        .unwrap_or(30usize)
        .clamp(1, 100);
    let page = query_param(query, "page")
        .and_then(|p| p.parse().ok())
        .unwrap_or(1usize)
        .max(1);
    if (page - 1) * per_page >= EVENT_CAP {
        return reply(
            422,
            &json!({"message": "In order to keep the API fast for everyone, pagination is limited for this resource.",
            "documentation_url": "https://docs.github.com/v3/#pagination", "status": "422"}),
        );
    }
    let newest_first: Vec<Value> = st.events.iter().rev().take(EVENT_CAP).cloned().collect();
    let mut r = paginate(newest_first, query, path);
    let etag = etag_of(query, &r.body);
    r.headers
        .push(("x-poll-interval".into(), st.poll_interval.to_string()));
    r.headers.push(("etag".into(), etag.clone()));
    if headers.get("if-none-match").is_some_and(|v| *v == etag) {
        r.status = 304;
        r.body = String::new();
        r.counts = false;
    }
    r
}
