//! One GitHub API in front of several fake repositories, as a GitHub App installed on them sees
//! it: the app's routes and its installations here, each repository's routes forwarded to that
//! repository's own [`FakeGitHub`].
//!
//! - `GET /app`, `GET /app/installations` (paged) and `POST /app/installations/{id}/access_tokens`
//!   take only the app's JWT, checked as GitHub checks it (`FakeApp::check_jwt`: RS256 signed by
//!   the app's key, `iss`, `iat`, `exp`). A token request's `repositories` (names) must all be
//!   covered by the installation (422 otherwise, as GitHub answers); each request and the scope it
//!   asked for is recorded. A suspended installation's tokens are refused (403).
//! - `GET /installation/repositories` (paged: `per_page`, `page`, a `Link` header, `total_count`)
//!   takes only an installation token that has not expired, and lists what that token may see.
//! - `/repos/{owner}/{name}/...` takes only an unexpired installation token whose installation
//!   covers the repository and whose scope (if any) names it; anything else is 404, as GitHub
//!   hides what a token cannot see. Accepted requests are forwarded to the repository's fake with
//!   its own token, and recorded per repository.
//!
//! Every other route is 404 and recorded as unknown.

#![allow(dead_code, reason = "each test uses a different part of the fake")]

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime};

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, Method, Response, StatusCode, Uri};
use axum::Router;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use serde_json::{json, Value};

use super::fake_github::{FakeApp, TOKEN};
use super::fake_server::{serve, Served};

/// One installation of the app.
#[derive(Debug, Clone)]
struct Installation {
    id: u64,
    account: String,
    /// `owner/name` of each repository it covers, in the order they were added.
    repos: Vec<String>,
    suspended: bool,
}

/// One repository behind the front.
#[derive(Debug, Clone)]
struct Backend {
    url: String,
    id: u64,
    archived: bool,
    /// Its `clone_url` (default: its github.com URL).
    clone_url: Option<String>,
}

/// One installation token minted.
#[derive(Debug, Clone)]
pub struct Minted {
    pub token: String,
    pub installation: u64,
    /// The `repositories` asked for (`None`: the whole installation).
    pub scope: Option<Vec<String>>,
    until: SystemTime,
}

/// One request for a repository, as accepted or refused.
#[derive(Debug, Clone)]
pub struct RepoRequest {
    pub repo: String,
    pub method: Method,
    pub path: String,
    pub status: u16,
    pub at: Instant,
}

struct FrontState {
    app: FakeApp,
    installations: Vec<Installation>,
    backends: HashMap<String, Backend>,
    minted: Vec<Minted>,
    repo_requests: Vec<RepoRequest>,
    /// `(path, query)` of the listing requests, in order.
    listings: Vec<(String, String)>,
    unknown: Vec<String>,
    /// The next listings of the installations answered 500.
    failing_listings: usize,
}

/// The running front; dropped at the end of the test.
pub struct FakeAppFront {
    pub url: String,
    state: Arc<Mutex<FrontState>>,
    _served: Served,
}

type Shared = Arc<Mutex<FrontState>>;

impl FakeAppFront {
    /// The app `id` (`slug`, verified with `public_pem`), its tokens living `ttl`.
    pub async fn start(id: u64, slug: &str, public_pem: &str, ttl: Duration) -> Self {
        let state = Arc::new(Mutex::new(FrontState {
            app: FakeApp::new(id, slug, 0, public_pem, ttl),
            installations: Vec::new(),
            backends: HashMap::new(),
            minted: Vec::new(),
            repo_requests: Vec::new(),
            listings: Vec::new(),
            unknown: Vec::new(),
            failing_listings: 0,
        }));
        let router = Router::new().fallback(handle).with_state(state.clone());
        let served = serve(router, "the fake GitHub App front").await;
        FakeAppFront {
            url: format!("http://{}", served.addr),
            state,
            _served: served,
        }
    }

    fn st(&self) -> MutexGuard<'_, FrontState> {
        self.state.lock().expect("front state lock")
    }

    /// The app installed on `account` (none of its repositories yet).
    pub fn add_installation(&self, id: u64, account: &str) {
        self.st().installations.push(Installation {
            id,
            account: account.into(),
            repos: Vec::new(),
            suspended: false,
        });
    }

    /// Installation `id` covers `repo` (`owner/name`), served by the fake at `url`.
    pub fn install(&self, id: u64, repo: &str, url: &str) {
        let mut st = self.st();
        let next_id = 500_000 + st.backends.len() as u64;
        st.backends
            .entry(repo.to_ascii_lowercase())
            .or_insert(Backend {
                url: url.into(),
                id: next_id,
                archived: false,
                clone_url: None,
            });
        let inst = st
            .installations
            .iter_mut()
            .find(|i| i.id == id)
            .expect("an installation");
        if !inst.repos.iter().any(|r| r.eq_ignore_ascii_case(repo)) {
            inst.repos.push(repo.into());
        }
    }

    /// Installation `id` no longer covers `repo`.
    pub fn uninstall(&self, id: u64, repo: &str) {
        let mut st = self.st();
        let inst = st
            .installations
            .iter_mut()
            .find(|i| i.id == id)
            .expect("an installation");
        inst.repos.retain(|r| !r.eq_ignore_ascii_case(repo));
    }

    /// `repo` is archived on GitHub.
    pub fn archive(&self, repo: &str) {
        if let Some(b) = self.st().backends.get_mut(&repo.to_ascii_lowercase()) {
            b.archived = true;
        }
    }

    /// The next `n` listings of the installations fail with a 500.
    pub fn fail_listings(&self, n: usize) {
        self.st().failing_listings = n;
    }

    /// `repo` is cloned from `url` (as listed: its `clone_url`).
    pub fn clone_from(&self, repo: &str, url: &str) {
        if let Some(b) = self.st().backends.get_mut(&repo.to_ascii_lowercase()) {
            b.clone_url = Some(url.into());
        }
    }

    /// Whether a token is accepted for `repo` now, as GitHub's git server asks: an unexpired
    /// installation token minted for it (scoped to it, or to its whole installation).
    pub fn token_checker(&self, repo: &str) -> super::git_http::Accepts {
        let state = self.state.clone();
        let repo = repo.to_owned();
        std::sync::Arc::new(move |token: &str| {
            let st = state.lock().expect("fake state lock");
            live_token(&st, token).is_some_and(|m| {
                visible(&st, &m)
                    .iter()
                    .any(|r| r.eq_ignore_ascii_case(&repo))
            })
        })
    }

    /// Every installation token minted, in order.
    pub fn minted(&self) -> Vec<Minted> {
        self.st().minted.clone()
    }

    /// Every request for a repository's routes.
    pub fn repo_requests(&self) -> Vec<RepoRequest> {
        self.st().repo_requests.clone()
    }

    /// How many requests for `repo`'s routes came so far.
    pub fn requests_for(&self, repo: &str) -> usize {
        self.st()
            .repo_requests
            .iter()
            .filter(|r| r.repo.eq_ignore_ascii_case(repo))
            .count()
    }

    /// The listing requests (`/app/installations`, `/installation/repositories`) with their
    /// queries.
    pub fn listings(&self) -> Vec<(String, String)> {
        self.st().listings.clone()
    }

    /// Requests to routes the front does not know.
    pub fn unknown(&self) -> Vec<String> {
        self.st().unknown.clone()
    }

    /// JWTs refused, with why.
    pub fn jwts_refused(&self) -> Vec<String> {
        self.st().app.jwts_refused.clone()
    }
}

fn json_reply(status: u16, body: &Value, link: Option<String>) -> Response<Body> {
    let mut b = Response::builder()
        .status(StatusCode::from_u16(status).expect("status"))
        .header("content-type", "application/json; charset=utf-8")
        .header("x-github-api-version-selected", "2022-11-28");
    if let Some(link) = link {
        b = b.header("link", link);
    }
    b.body(Body::from(body.to_string())).expect("response")
}

fn error(status: u16, message: &str) -> Response<Body> {
    json_reply(
        status,
        &json!({"message": message, "documentation_url": "https://docs.github.com/rest", "status": status.to_string()}),
        None,
    )
}

fn query_param(query: &str, name: &str) -> Option<usize> {
    query
        .split('&')
        .find_map(|kv| kv.strip_prefix(&format!("{name}=")))
        .and_then(|v| v.parse().ok())
}

/// Page `page` of `items` at `per_page` (GitHub's default 30, at most 100) and GitHub's `Link`
/// header for it (`prev`, `next`, `last`, `first`; absolute URLs keeping the other parameters).
fn page_of(items: Vec<Value>, path: &str, query: &str) -> (Vec<Value>, Option<String>) {
    let per_page = query_param(query, "per_page").unwrap_or(30).clamp(1, 100);
    let page = query_param(query, "page").unwrap_or(1).max(1);
    let last = items.len().div_ceil(per_page).max(1);
    let slice = items
        .into_iter()
        .skip((page - 1) * per_page)
        .take(per_page)
        .collect();
    if last <= 1 {
        return (slice, None);
    }
    let url = |p: usize| format!("<https://api.github.com{path}?per_page={per_page}&page={p}>");
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
    (slice, Some(links.join(", ")))
}

fn bearer(headers: &HeaderMap) -> String {
    let auth = headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    auth.strip_prefix("Bearer ")
        .or_else(|| auth.strip_prefix("token "))
        .unwrap_or_default()
        .to_owned()
}

fn installation_json(i: &Installation, app: &FakeApp) -> Value {
    json!({"id": i.id, "account": {"login": i.account, "id": i.id + 9000, "type": "Organization"},
        "repository_selection": "selected",
        "access_tokens_url": format!("https://api.github.com/app/installations/{}/access_tokens", i.id),
        "repositories_url": "https://api.github.com/installation/repositories",
        "app_id": app.id, "app_slug": app.slug, "target_id": i.id + 9000, "target_type": "Organization",
        "permissions": {"contents": "write", "issues": "write", "pull_requests": "write", "metadata": "read"},
        "events": ["issues", "issue_comment", "pull_request"],
        "created_at": "2026-01-02T03:04:05Z", "updated_at": "2026-01-02T03:04:05Z",
        "suspended_by": null,
        "suspended_at": if i.suspended { json!("2026-02-03T04:05:06Z") } else { Value::Null }})
}

fn repo_json(name: &str, b: &Backend) -> Value {
    let (owner, short) = name.split_once('/').expect("owner/name");
    json!({"id": b.id, "node_id": format!("R_{}", b.id), "name": short, "full_name": name,
        "owner": {"login": owner, "id": 9001, "type": "Organization"}, "private": true,
        "html_url": format!("https://github.com/{name}"), "clone_url": b.clone_url.clone().unwrap_or_else(|| format!("https://github.com/{name}.git")),
        "default_branch": "main", "archived": b.archived, "disabled": false, "fork": false})
}

/// The app's own routes (JWT).
fn app_route(
    st: &mut FrontState,
    method: &Method,
    path: &str,
    query: &str,
    jwt: &str,
    body: &Value,
) -> Response<Body> {
    if let Err(why) = st.app.check_jwt(jwt) {
        st.app.jwts_refused.push(why);
        return error(401, "A JSON web token could not be decoded");
    }
    st.app.jwts_accepted += 1;
    if *method == Method::GET && path == "/app" {
        return json_reply(
            200,
            &json!({"id": st.app.id, "slug": st.app.slug, "name": "Rover App",
            "owner": {"login": "octo-org"}, "html_url": format!("https://github.com/apps/{}", st.app.slug)}),
            None,
        );
    }
    if *method == Method::GET && path == "/app/installations" {
        st.listings.push((path.into(), query.into()));
        if st.failing_listings > 0 {
            st.failing_listings -= 1;
            return error(500, "Server Error");
        }
        let all = st
            .installations
            .iter()
            .map(|i| installation_json(i, &st.app))
            .collect();
        let (page, link) = page_of(all, path, query);
        return json_reply(200, &Value::Array(page), link);
    }
    let id = path
        .strip_prefix("/app/installations/")
        .and_then(|r| r.strip_suffix("/access_tokens"))
        .and_then(|id| id.parse::<u64>().ok());
    let (Some(id), true) = (id, *method == Method::POST) else {
        st.unknown.push(format!("{method} {path}"));
        return error(404, "Not Found");
    };
    let Some(inst) = st.installations.iter().find(|i| i.id == id).cloned() else {
        return error(404, "Not Found");
    };
    if inst.suspended {
        return error(403, "This installation has been suspended");
    }
    let scope: Option<Vec<String>> = body.get("repositories").map(|r| {
        r.as_array()
            .map(|a| {
                a.iter()
                    .map(|n| n.as_str().unwrap_or("?").to_owned())
                    .collect()
            })
            .unwrap_or_default()
    });
    let covers = |name: &str| {
        inst.repos.iter().any(|r| {
            r.split_once('/')
                .is_some_and(|(_, n)| n.eq_ignore_ascii_case(name))
        })
    };
    if let Some(names) = &scope {
        if names.is_empty() || !names.iter().all(|n| covers(n)) {
            return json_reply(
                422,
                &json!({"message": "There is at least one repository that does not exist or is not accessible to the parent installation.", "documentation_url": "https://docs.github.com/rest/apps/apps#create-an-installation-access-token-for-an-app", "status": "422"}),
                None,
            );
        }
    }
    let token = format!("ghs_{}", uuid::Uuid::new_v4().simple());
    let until = SystemTime::now() + st.app.ttl;
    st.minted.push(Minted {
        token: token.clone(),
        installation: id,
        scope: scope.clone(),
        until,
    });
    let expires_at = chrono::DateTime::<chrono::Utc>::from(until)
        .format("%Y-%m-%dT%H:%M:%SZ")
        .to_string();
    let mut reply = json!({"token": token, "expires_at": expires_at,
        "permissions": {"contents": "write", "issues": "write", "pull_requests": "write", "metadata": "read"},
        "repository_selection": "selected"});
    if let Some(names) = scope {
        let repos: Vec<Value> = inst
            .repos
            .iter()
            .filter(|r| {
                names.iter().any(|n| {
                    r.split_once('/')
                        .is_some_and(|(_, s)| s.eq_ignore_ascii_case(n))
                })
            })
            .map(|r| repo_json(r, &st.backends[&r.to_ascii_lowercase()]))
            .collect();
        reply["repositories"] = Value::Array(repos);
    }
    json_reply(201, &reply, None)
}

/// The token, when it is an installation token that has not expired.
fn live_token(st: &FrontState, token: &str) -> Option<Minted> {
    st.minted
        .iter()
        .find(|m| m.token == token && SystemTime::now() < m.until)
        .cloned()
}

/// What `token` may see: the repositories of its installation, narrowed to its scope.
fn visible(st: &FrontState, token: &Minted) -> Vec<String> {
    let Some(inst) = st.installations.iter().find(|i| i.id == token.installation) else {
        return Vec::new();
    };
    inst.repos
        .iter()
        .filter(|r| {
            token.scope.as_ref().is_none_or(|names| {
                names.iter().any(|n| {
                    r.split_once('/')
                        .is_some_and(|(_, s)| s.eq_ignore_ascii_case(n))
                })
            })
        })
        .cloned()
        .collect()
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
    let token = bearer(&headers);
    let forward = {
        let mut st = state.lock().expect("front state lock");
        if path == "/app" || path.starts_with("/app/") {
            let payload: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
            return app_route(&mut st, &method, &path, &query, &token, &payload);
        }
        let Some(minted) = live_token(&st, &token) else {
            if !path.starts_with("/repos/") && path != "/installation/repositories" {
                st.unknown.push(format!("{method} {path}"));
            }
            return error(401, "Bad credentials");
        };
        if path == "/installation/repositories" && method == Method::GET {
            st.listings.push((path.clone(), query.clone()));
            let all: Vec<Value> = visible(&st, &minted)
                .iter()
                .map(|r| repo_json(r, &st.backends[&r.to_ascii_lowercase()]))
                .collect();
            let total = all.len();
            let (page, link) = page_of(all, &path, &query);
            return json_reply(
                200,
                &json!({"total_count": total, "repository_selection": "selected", "repositories": page}),
                link,
            );
        }
        let mut parts = path.splitn(5, '/');
        let (Some(""), Some("repos"), Some(owner), Some(name)) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            st.unknown.push(format!("{method} {path}"));
            return error(404, "Not Found");
        };
        let repo = format!("{owner}/{name}");
        let allowed = visible(&st, &minted)
            .iter()
            .any(|r| r.eq_ignore_ascii_case(&repo));
        let status = if allowed { 0 } else { 404 };
        st.repo_requests.push(RepoRequest {
            repo: repo.clone(),
            method: method.clone(),
            path: path.clone(),
            status,
            at: Instant::now(),
        });
        if !allowed {
            return error(404, "Not Found");
        }
        st.backends[&repo.to_ascii_lowercase()].url.clone()
    };
    forward_to(&forward, method, &uri, &headers, body).await
}

/// The request as the repository's own fake gets it: with its token.
async fn forward_to(
    base: &str,
    method: Method,
    uri: &Uri,
    headers: &HeaderMap,
    body: Bytes,
) -> Response<Body> {
    let client: Client<HttpConnector, Full<Bytes>> =
        Client::builder(hyper_util::rt::TokioExecutor::new()).build_http();
    let target = format!("{base}{}", uri.path_and_query().map_or("/", |p| p.as_str()));
    let mut request = http::Request::builder().method(method).uri(target);
    for (k, v) in headers {
        if k != "authorization" && k != "host" {
            request = request.header(k, v);
        }
    }
    let request = request
        .header("authorization", format!("token {TOKEN}"))
        .body(Full::new(body))
        .expect("forwarded request");
    let response = client
        .request(request)
        .await
        .expect("the repository's fake answers");
    let (parts, incoming) = response.into_parts();
    let bytes = incoming.collect().await.expect("its body").to_bytes();
    Response::from_parts(parts, Body::from(bytes))
}
