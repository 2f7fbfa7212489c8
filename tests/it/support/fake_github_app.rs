//! The fake GitHub as a GitHub App sees it, and reactions.
//!
//! App: `GET /app`, `GET /repos/{o}/{r}/installation` and `POST /app/installations/{id}/access_tokens`
//! take only the app's JWT, checked as GitHub checks it: RS256 signed by the app's key (verified
//! with its public key), `iss` the app id, `iat` not in the future (60 s of drift allowed), `exp`
//! in the future and at most 10 minutes after `iat`. Installation tokens (`ghs_…`) expire after a
//! configurable time; once the app is on, every other route takes only an installation token
//! that has not expired (a personal token or a JWT is refused with 401, as GitHub refuses them).
//!
//! Reactions: create (201, or 200 when the same user already left the same reaction) and list
//! (by `content`, with an ETag and a free 304) on issues, issue comments and review comments.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::http::Method;
use octocrab::jsonwebtoken::{decode, decode_header, Algorithm, DecodingKey, Validation};
use serde_json::{json, Value};

use super::{error, now, reply, user, FakeState, Reply, REPO, REPO_ID};

/// A GitHub App registered on the fake.
#[derive(Clone)]
pub struct FakeApp {
    pub id: u64,
    pub slug: String,
    pub installation: u64,
    key: DecodingKey,
    /// How long an installation token lives.
    pub ttl: Duration,
    /// Every token minted, with when it expires.
    pub tokens: Vec<(String, SystemTime)>,
    /// JWTs accepted, and refused (with why).
    pub jwts_accepted: usize,
    pub jwts_refused: Vec<String>,
    /// Requests refused because their installation token had expired.
    pub expired_uses: usize,
}

impl std::fmt::Debug for FakeApp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FakeApp")
            .field("id", &self.id)
            .field("slug", &self.slug)
            .field("tokens", &self.tokens.len())
            .finish_non_exhaustive()
    }
}

impl FakeApp {
    pub fn new(id: u64, slug: &str, installation: u64, public_pem: &str, ttl: Duration) -> Self {
        FakeApp {
            id,
            slug: slug.to_owned(),
            installation,
            key: DecodingKey::from_rsa_pem(public_pem.as_bytes()).expect("a public RSA key"),
            ttl,
            tokens: Vec::new(),
            jwts_accepted: 0,
            jwts_refused: Vec::new(),
            expired_uses: 0,
        }
    }

    /// Whether `token` is an installation token that has not expired.
    pub fn token_valid(&self, token: &str) -> bool {
        self.tokens
            .iter()
            .any(|(t, until)| t == token && SystemTime::now() < *until)
    }

    pub fn check_jwt(&self, jwt: &str) -> Result<(), String> {
        let header = decode_header(jwt).map_err(|e| format!("not a JWT: {e}"))?;
        if header.alg != Algorithm::RS256 {
            return Err(format!("alg {:?}, not RS256", header.alg));
        }
        let mut validation = Validation::new(Algorithm::RS256);
        validation.leeway = 0;
        // `iss` is checked below: octocrab (like GitHub's own examples) sends the app id as a number,
        // which jsonwebtoken's string-typed `iss` check would not see.
        validation.set_required_spec_claims(&["exp", "iat"]);
        let data = decode::<Value>(jwt, &self.key, &validation)
            .map_err(|e| format!("signature or claims refused: {e}"))?;
        let claims = data.claims;
        let iss = match &claims["iss"] {
            Value::Number(n) => n.as_u64(),
            Value::String(s) => s.parse().ok(),
            _ => None,
        };
        if iss != Some(self.id) {
            return Err(format!("iss {} is not app {}", claims["iss"], self.id));
        }
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .expect("clock")
            .as_secs();
        let now = i64::try_from(now).expect("time");
        let iat = claims["iat"].as_i64().ok_or("iat not a number")?;
        let exp = claims["exp"].as_i64().ok_or("exp not a number")?;
        if iat > now + 60 {
            return Err("iat is in the future".into());
        }
        if exp <= now {
            return Err("exp is in the past".into());
        }
        if exp - iat > 600 + 60 {
            return Err("exp is more than 10 minutes after iat".into());
        }
        Ok(())
    }
}

fn bearer(authorization: Option<&String>) -> Option<&str> {
    authorization?.strip_prefix("Bearer ")
}

/// The app's routes, when the app is on and the request is one of them: answered here with the
/// JWT checked. `None` for every other route.
pub(super) fn app_route(
    st: &mut FakeState,
    method: &Method,
    path: &str,
    authorization: Option<&String>,
    payload: &Value,
) -> Option<Reply> {
    let app = st.app.as_mut()?;
    let installation_path = format!("/repos/{REPO}/installation");
    let tokens_path = format!("/app/installations/{}/access_tokens", app.installation);
    let known = (method == Method::GET && (path == "/app" || path == installation_path))
        || (method == Method::POST
            && path.starts_with("/app/installations/")
            && path.ends_with("/access_tokens"));
    if !known {
        return None;
    }
    let jwt = bearer(authorization).unwrap_or_default();
    if let Err(why) = app.check_jwt(jwt) {
        app.jwts_refused.push(why);
        return Some(error(401, "A JSON web token could not be decoded"));
    }
    app.jwts_accepted += 1;
    let owner = user("octo-org");
    let permissions = json!({"contents": "write", "issues": "write", "pull_requests": "write", "metadata": "read", "statuses": "read", "checks": "read"});
    let events = json!([
        "issues",
        "issue_comment",
        "pull_request",
        "pull_request_review",
        "pull_request_review_comment",
        "push"
    ]);
    if path == "/app" {
        return Some(reply(
            200,
            &json!({"id": app.id, "slug": app.slug, "node_id": format!("A_{}", app.id),
                "client_id": format!("Iv1.{:016x}", app.id), "owner": owner, "name": "Rover App",
                "description": "", "external_url": "https://example.com", "html_url": format!("https://github.com/apps/{}", app.slug),
                "created_at": "2026-01-02T03:04:05Z", "updated_at": "2026-01-02T03:04:05Z",
                "permissions": permissions, "events": events, "installations_count": 1}),
        ));
    }
    if path == installation_path {
        return Some(reply(
            200,
            &json!({"id": app.installation, "account": owner, "repository_selection": "selected",
                "access_tokens_url": format!("https://api.github.com/app/installations/{}/access_tokens", app.installation),
                "repositories_url": "https://api.github.com/installation/repositories",
                "html_url": format!("https://github.com/organizations/octo-org/settings/installations/{}", app.installation),
                "app_id": app.id, "app_slug": app.slug, "target_id": 1, "target_type": "Organization",
                "permissions": permissions, "events": events, "created_at": "2026-01-02T03:04:05Z",
                "updated_at": "2026-01-02T03:04:05Z", "single_file_name": null, "has_multiple_single_files": false,
                "single_file_paths": [], "suspended_by": null, "suspended_at": null}),
        ));
    }
    if path != tokens_path {
        return Some(error(404, "Not Found"));
    }
    // Scoping to repositories the installation cannot see is refused, as GitHub does.
    if let Some(repos) = payload.get("repositories") {
        let ok = repos
            .as_array()
            .is_some_and(|r| r.iter().all(|n| n.as_str() == Some("widgets")));
        if !ok {
            return Some(reply(
                422,
                &json!({"message": "There is at least one repository that does not exist or is not accessible to the parent installation.", "documentation_url": "https://docs.github.com/rest/apps/apps#create-an-installation-access-token-for-an-app", "status": "422"}),
            ));
        }
    }
    let token = format!(
        "ghs_{}{:04}",
        uuid::Uuid::new_v4().simple(),
        app.tokens.len() % 10_000
    );
    let until = SystemTime::now() + app.ttl;
    app.tokens.push((token.clone(), until));
    let expires_at = chrono::DateTime::<chrono::Utc>::from(until)
        .format("%Y-%m-%dT%H:%M:%SZ")
        .to_string();
    Some(reply(
        201,
        &json!({"token": token, "expires_at": expires_at, "permissions": permissions,
            "repository_selection": "selected",
            "repositories": [{"id": REPO_ID, "node_id": "R_1", "name": "widgets", "full_name": REPO, "private": false}]}),
    ))
}

/// Whether a request to any other route is authorized: with the app on, only an installation
/// token that has not expired (an expired one is counted).
pub(super) fn app_authorized(st: &mut FakeState, authorization: Option<&String>) -> bool {
    let Some(app) = st.app.as_mut() else {
        return false;
    };
    let token = bearer(authorization)
        .or_else(|| authorization.and_then(|a| a.strip_prefix("token ")))
        .unwrap_or_default();
    if app.token_valid(token) {
        return true;
    }
    if app.tokens.iter().any(|(t, _)| t == token) {
        app.expired_uses += 1;
    }
    false
}

/// One reaction left on something.
#[derive(Debug, Clone)]
pub struct ReactionRec {
    pub id: u64,
    /// `issue:<n>`, `comment:<id>` or `review-comment:<id>`.
    pub target: String,
    pub user: String,
    pub content: String,
    pub created_at: String,
}

const CONTENTS: [&str; 8] = [
    "+1", "-1", "laugh", "confused", "heart", "hooray", "rocket", "eyes",
];

fn reaction_json(r: &ReactionRec) -> Value {
    json!({"id": r.id, "node_id": format!("REA_{}", r.id), "user": user(&r.user), "content": r.content, "created_at": r.created_at})
}

/// The target key of a reactions route (`issues/12/reactions`, `issues/comments/5/reactions`,
/// `pulls/comments/7/reactions`), if it is one and the thing exists.
fn target_of(st: &FakeState, seg: &[&str]) -> Option<Result<String, ()>> {
    let num = |s: &str| s.parse::<u64>().ok();
    match seg {
        ["issues", "comments", id, "reactions"] => Some(
            num(id)
                .filter(|id| st.comments.iter().any(|c| c.id == *id))
                .map(|id| format!("comment:{id}"))
                .ok_or(()),
        ),
        ["pulls", "comments", id, "reactions"] => Some(
            num(id)
                .filter(|id| st.review_comments.iter().any(|c| c.id == *id))
                .map(|id| format!("review-comment:{id}"))
                .ok_or(()),
        ),
        ["issues", n, "reactions"] => Some(
            num(n)
                .filter(|n| st.issues.contains_key(n))
                .map(|n| format!("issue:{n}"))
                .ok_or(()),
        ),
        _ => None,
    }
}

/// The reactions routes; `None` for any other.
pub(super) fn reactions_route(
    st: &mut FakeState,
    method: &Method,
    seg: &[&str],
    query: &str,
    headers: &std::collections::HashMap<String, String>,
    payload: &Value,
    me: &str,
) -> Option<Reply> {
    let Ok(target) = target_of(st, seg)? else {
        return Some(error(404, "Not Found"));
    };
    if *method == Method::POST {
        let Some(content) = payload
            .get("content")
            .and_then(Value::as_str)
            .filter(|c| CONTENTS.contains(c))
        else {
            return Some(reply(
                422,
                &json!({"message": "Validation Failed", "errors": [{"resource": "Reaction", "code": "custom", "field": "content", "message": "content is not included in the list"}], "documentation_url": "https://docs.github.com/rest/reactions/reactions", "status": "422"}),
            ));
        };
        if let Some(existing) = st
            .reactions
            .iter()
            .find(|r| r.target == target && r.user == me && r.content == content)
        {
            return Some(reply(200, &reaction_json(existing)));
        }
        let id = st.id();
        let rec = ReactionRec {
            id,
            target,
            user: me.to_owned(),
            content: content.to_owned(),
            created_at: now(),
        };
        let v = reaction_json(&rec);
        st.reactions.push(rec);
        return Some(reply(201, &v));
    }
    if *method != Method::GET {
        return None;
    }
    let content = super::query_param(query, "content");
    if let Some(c) = &content {
        if !CONTENTS.contains(&c.as_str()) {
            return Some(error(422, "Validation Failed"));
        }
    }
    let items: Vec<Value> = st
        .reactions
        .iter()
        .filter(|r| r.target == target && content.as_ref().is_none_or(|c| *c == r.content))
        .map(reaction_json)
        .collect();
    let path = format!("/repos/{REPO}/{}", seg.join("/"));
    let mut r = super::paginate(items, query, &path);
    let etag = super::etag_of(query, &r.body);
    r.headers.push(("etag".into(), etag.clone()));
    if headers.get("if-none-match").is_some_and(|v| *v == etag) {
        r.status = 304;
        r.body = String::new();
        r.counts = false;
    }
    Some(r)
}
