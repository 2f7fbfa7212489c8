//! The fake GitHub's releases, answering as GitHub does
//! (<https://docs.github.com/rest/releases/releases>):
//!
//! - `GET /releases`: newest first, paginated.
//! - `POST /releases` with `tag_name`, `target_commitish`, `name`, `body`: 422 `Validation
//!   Failed` (`already_exists`) when the tag exists (a release's or a tag in the repository's
//!   git), 422 when the target is no commit or branch of the repository; otherwise 201 with the
//!   release, and the tag made in the repository's git. Its `created_at` is the date of the
//!   tagged commit, as GitHub's is.

use axum::http::Method;
use serde_json::{json, Value};

use super::{now, reply, FakeState, Reply, REPO};

/// A release the fake holds.
#[derive(Debug, Clone)]
pub struct ReleaseRec {
    pub id: u64,
    pub tag: String,
    pub target: String,
    pub name: String,
    pub body: String,
    pub created_at: String,
    pub draft: bool,
}

pub(super) fn release_json(r: &ReleaseRec) -> Value {
    let api = format!("https://api.github.com/repos/{REPO}/releases/{}", r.id);
    json!({"url": api, "id": r.id, "node_id": format!("RE_{}", r.id),
           "html_url": format!("https://github.com/{REPO}/releases/tag/{}", r.tag),
           "tag_name": r.tag, "target_commitish": r.target, "name": r.name, "body": r.body,
           "draft": r.draft, "prerelease": false, "created_at": r.created_at,
           "published_at": if r.draft { Value::Null } else { json!(now()) },
           "author": {"login": "rover-bot", "id": 4242, "type": "User"},
           "assets": [], "tarball_url": null, "zipball_url": null})
}

/// The routes of this module, `None` for any other.
pub(super) fn release_route(
    st: &mut FakeState,
    method: &Method,
    seg: &[&str],
    query: &str,
    path: &str,
    payload: &Value,
) -> Option<Reply> {
    match (method.as_str(), seg) {
        ("GET", ["releases"]) => {
            let items: Vec<Value> = st.releases.iter().rev().map(release_json).collect();
            Some(super::paginate(items, query, path))
        }
        ("POST", ["releases"]) => Some(create(st, payload)),
        _ => None,
    }
}

fn invalid(field: &str, code: &str) -> Reply {
    reply(
        422,
        &json!({"message": "Validation Failed",
                "errors": [{"resource": "Release", "code": code, "field": field}],
                "documentation_url": "https://docs.github.com/rest/releases/releases#create-a-release",
                "status": "422"}),
    )
}

fn create(st: &mut FakeState, payload: &Value) -> Reply {
    let s = |k: &str| payload.get(k).and_then(Value::as_str).map(str::to_owned);
    let Some(tag) = s("tag_name").filter(|t| !t.is_empty()) else {
        return invalid("tag_name", "missing_field");
    };
    let target = s("target_commitish").unwrap_or_else(|| "main".into());
    if st.releases.iter().any(|r| r.tag == tag) {
        return invalid("tag_name", "already_exists");
    }
    let mut created_at = now();
    if let Some(origin) = &st.origin {
        let repo = git2::Repository::open_bare(origin).expect("the origin");
        if repo.find_reference(&format!("refs/tags/{tag}")).is_ok() {
            return invalid("tag_name", "already_exists");
        }
        let commit = repo
            .find_reference(&format!("refs/heads/{target}"))
            .and_then(|r| r.peel_to_commit())
            .or_else(|_| git2::Oid::from_str(&target).and_then(|oid| repo.find_commit(oid)));
        let Ok(commit) = commit else {
            return invalid("target_commitish", "invalid");
        };
        created_at = chrono::DateTime::from_timestamp(commit.time().seconds(), 0)
            .expect("a commit time")
            .format("%Y-%m-%dT%H:%M:%SZ")
            .to_string();
        repo.reference(&format!("refs/tags/{tag}"), commit.id(), false, "release")
            .expect("the tag");
    }
    let id = st.id();
    let rec = ReleaseRec {
        id,
        tag: tag.clone(),
        target,
        name: s("name").unwrap_or_else(|| tag.clone()),
        body: s("body").unwrap_or_default(),
        created_at,
        draft: payload
            .get("draft")
            .and_then(Value::as_bool)
            .unwrap_or(false),
    };
    let body = release_json(&rec);
    st.releases.push(rec);
    reply(201, &body)
}
