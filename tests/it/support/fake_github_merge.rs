//! The fake GitHub's merge side, answering as GitHub does
//! (<https://docs.github.com/rest/pulls/pulls#merge-a-pull-request>):
//!
//! - `GET /pulls/{n}/files`: the files the pull request changes, from the repository's git when
//!   the fake has it (the diff of the head against its merge base with the base branch).
//! - `PUT /pulls/{n}/merge` with `sha`, `merge_method`, `commit_title`, `commit_message`: 405
//!   `Pull Request is not mergeable` when closed or refused by the scripted protection, 409
//!   `Head branch was modified. Review and try the merge again.` when `sha` is not the head,
//!   422 for an unknown method; otherwise the base branch gets the merge (a squash: one commit
//!   of the head's tree merged onto the base; `merge`: a merge commit), the pull request is
//!   closed and merged, and a `PullRequestEvent` `closed` goes to the feed.
//!
//! A pull request's head is the branch's current commit in the repository's git when the fake
//! has one (rover pushes, the head moves, as on GitHub).

use axum::http::Method;
use serde_json::{json, Value};

use super::{error, now, push_event, reply, FakeState, Reply};

/// A merge the fake made: `(number, method, head sha merged, merge commit)`.
pub type MergeRec = (u64, String, String, String);

/// The current commit of `branch` in the fake's repository, if it has one.
pub(super) fn branch_sha(st: &FakeState, branch: &str) -> Option<String> {
    let origin = st.origin.as_ref()?;
    let repo = git2::Repository::open_bare(origin).ok()?;
    let reference = repo.find_reference(&format!("refs/heads/{branch}")).ok()?;
    reference.target().map(|oid| oid.to_string())
}

/// Bring pull request `number`'s head to its branch's current commit (when the fake has the
/// repository and the pull request is open).
pub(super) fn refresh_head(st: &mut FakeState, number: u64) {
    let Some(head) = st
        .issues
        .get(&number)
        .filter(|i| i.state == "open")
        .and_then(|i| i.pr.as_ref())
        .map(|p| p.head.clone())
    else {
        return;
    };
    if let Some(sha) = branch_sha(st, &head) {
        if let Some(pr) = st.issues.get_mut(&number).and_then(|i| i.pr.as_mut()) {
            pr.head_sha = sha;
        }
    }
}

/// The routes of this module, `None` for any other.
pub(super) fn merge_route(
    st: &mut FakeState,
    method: &Method,
    seg: &[&str],
    query: &str,
    path: &str,
    payload: &Value,
    me: &str,
) -> Option<Reply> {
    let number = match seg {
        ["pulls", n, "files" | "merge" | "update-branch"] => n.parse::<u64>().ok()?,
        _ => return None,
    };
    refresh_head(st, number);
    let Some(issue) = st.issues.get(&number).filter(|i| i.pr.is_some()).cloned() else {
        return Some(error(404, "Not Found"));
    };
    let pr = issue.pr.clone().expect("a pull request");
    match (method.as_str(), seg[2]) {
        ("GET", "files") => Some(super::paginate(files(st, &pr.base, &pr.head), query, path)),
        ("PUT", "merge") => {
            let sha = payload.get("sha").and_then(Value::as_str);
            let merge_method = payload
                .get("merge_method")
                .and_then(Value::as_str)
                .unwrap_or("merge");
            if !["merge", "squash", "rebase"].contains(&merge_method) {
                return Some(reply(
                    422,
                    &json!({"message": "Invalid merge_method", "documentation_url": "https://docs.github.com/rest/pulls/pulls#merge-a-pull-request", "status": "422"}),
                ));
            }
            if issue.state != "open" || pr.merged {
                return Some(error(405, "Pull Request is not mergeable"));
            }
            if let Some(why) = st.merge_refusals.pop_front() {
                return Some(error(405, &why));
            }
            if st.require_up_to_date && mergeable_state(st, &pr) == Some("behind") {
                return Some(error(405, "Head branch is out of date"));
            }
            if sha.is_some_and(|s| s != pr.head_sha) {
                return Some(error(
                    409,
                    "Head branch was modified. Review and try the merge again.",
                ));
            }
            let title = payload
                .get("commit_title")
                .and_then(Value::as_str)
                .unwrap_or(&issue.title)
                .to_owned();
            let merged = match merge_in_git(st, &pr.base, &pr.head, merge_method, &title) {
                Ok(sha) => sha,
                Err(why) => return Some(error(405, &why)),
            };
            let rec = st.issues.get_mut(&number).expect("the pull request");
            rec.state = "closed".into();
            if let Some(p) = rec.pr.as_mut() {
                p.merged = true;
                p.merged_at = Some(now());
            }
            rec.updated_at = now();
            let closed = st.issues[&number].clone();
            st.merges.push((
                number,
                merge_method.to_owned(),
                pr.head_sha.clone(),
                merged.clone(),
            ));
            let mut feed_pr = super::minimal_pr(&closed);
            feed_pr["merged"] = json!(true);
            push_event(
                st,
                "PullRequestEvent",
                me,
                json!({"action": "closed", "number": number, "pull_request": feed_pr}),
            );
            Some(reply(
                200,
                &json!({"sha": merged, "merged": true, "message": "Pull Request successfully merged"}),
            ))
        }
        ("PUT", "update-branch") => Some(update_branch(st, number, &pr, payload)),
        _ => Some(error(404, "Not Found")),
    }
}

/// `behind` when the base branch has commits the head lacks, `clean` otherwise (`None`
/// without the repository's git).
pub(super) fn mergeable_state(st: &FakeState, pr: &super::PrInfo) -> Option<&'static str> {
    let origin = st.origin.as_ref()?;
    let repo = git2::Repository::open_bare(origin).ok()?;
    let tip = |b: &str| {
        repo.find_reference(&format!("refs/heads/{b}"))
            .and_then(|r| r.peel_to_commit())
            .ok()
    };
    let (base, head) = (tip(&pr.base)?, tip(&pr.head)?);
    let contains_base =
        base.id() == head.id() || repo.graph_descendant_of(head.id(), base.id()).ok()?;
    Some(if contains_base { "clean" } else { "behind" })
}

/// `PUT /pulls/{n}/update-branch` with `expected_head_sha`: the base merged into the head
/// branch (202), 422 when the head is not the expected one, when there is nothing to bring,
/// or on a conflict.
fn update_branch(st: &mut FakeState, number: u64, pr: &super::PrInfo, payload: &Value) -> Reply {
    let invalid = |message: &str| {
        reply(
            422,
            &json!({"message": message, "documentation_url": "https://docs.github.com/rest/pulls/pulls#update-a-pull-request-branch", "status": "422"}),
        )
    };
    if let Some(expected) = payload.get("expected_head_sha").and_then(Value::as_str) {
        if expected != pr.head_sha {
            return invalid("expected head sha didn't match current head ref.");
        }
    }
    if mergeable_state(st, pr) != Some("behind") {
        return invalid("There are no new commits on the base branch.");
    }
    let origin = st
        .origin
        .clone()
        .expect("a repository (mergeable_state has one)");
    let repo = git2::Repository::open_bare(&origin).expect("the origin");
    let tip = |b: &str| {
        repo.find_reference(&format!("refs/heads/{b}"))
            .and_then(|r| r.peel_to_commit())
            .expect("the branch")
    };
    let (head, base) = (tip(&pr.head), tip(&pr.base));
    let mut index = repo.merge_commits(&head, &base, None).expect("a merge");
    if index.has_conflicts() {
        return invalid("merge conflict between base and head");
    }
    let tree = repo
        .find_tree(index.write_tree_to(&repo).expect("a tree"))
        .expect("the tree");
    let sig = git2::Signature::now("GitHub", "noreply@github.com").expect("a signature");
    let message = format!("Merge branch '{}' into {}", pr.base, pr.head);
    repo.commit(
        Some(&format!("refs/heads/{}", pr.head)),
        &sig,
        &sig,
        &message,
        &tree,
        &[&head, &base],
    )
    .expect("the merge commit");
    refresh_head(st, number);
    reply(
        202,
        &json!({"message": "Updating pull request branch.", "url": format!("https://github.com/{}/pull/{number}", super::REPO)}),
    )
}

/// The files `head` changes against its merge base with `base` (GitHub's list: `filename`,
/// `status`, and `previous_filename` for a rename).
fn files(st: &FakeState, base: &str, head: &str) -> Vec<Value> {
    let Some(origin) = &st.origin else {
        return Vec::new();
    };
    let repo = git2::Repository::open_bare(origin).expect("the origin");
    let commit = |b: &str| {
        repo.find_reference(&format!("refs/heads/{b}"))
            .and_then(|r| r.peel_to_commit())
            .ok()
    };
    let (Some(base), Some(head)) = (commit(base), commit(head)) else {
        return Vec::new();
    };
    let since = repo
        .merge_base(base.id(), head.id())
        .and_then(|oid| repo.find_commit(oid))
        .unwrap_or(base);
    let mut diff = repo
        .diff_tree_to_tree(
            Some(&since.tree().expect("a tree")),
            Some(&head.tree().expect("a tree")),
            None,
        )
        .expect("a diff");
    diff.find_similar(None).expect("renames");
    diff.deltas()
        .map(|d| {
            let new = d.new_file().path().map(|p| p.display().to_string());
            let old = d.old_file().path().map(|p| p.display().to_string());
            let status = match d.status() {
                git2::Delta::Added => "added",
                git2::Delta::Deleted => "removed",
                git2::Delta::Renamed => "renamed",
                _ => "modified",
            };
            let mut v = json!({"filename": new.clone().or(old.clone()), "status": status});
            if d.status() == git2::Delta::Renamed {
                v["previous_filename"] = json!(old);
            }
            v
        })
        .collect()
}

/// Merge `head` into `base` in the fake's git as `method` says; the new tip of `base`. Without
/// a repository, a made-up commit id.
fn merge_in_git(
    st: &FakeState,
    base: &str,
    head: &str,
    method: &str,
    title: &str,
) -> Result<String, String> {
    let Some(origin) = &st.origin else {
        return Ok(format!("{:040x}", st.merges.len() + 1));
    };
    let repo = git2::Repository::open_bare(origin).expect("the origin");
    let base_ref = format!("refs/heads/{base}");
    let tip = |b: &str| {
        repo.find_reference(&format!("refs/heads/{b}"))
            .and_then(|r| r.peel_to_commit())
            .map_err(|e| e.to_string())
    };
    let (ours, theirs) = (tip(base)?, tip(head)?);
    let mut index = repo
        .merge_commits(&ours, &theirs, None)
        .map_err(|e| e.to_string())?;
    if index.has_conflicts() {
        return Err("Merge conflict".into());
    }
    let tree_id = index.write_tree_to(&repo).map_err(|e| e.to_string())?;
    let tree = repo.find_tree(tree_id).map_err(|e| e.to_string())?;
    let sig = git2::Signature::now("GitHub", "noreply@github.com").expect("a signature");
    let parents: Vec<&git2::Commit<'_>> = match method {
        "merge" => vec![&ours, &theirs],
        _ => vec![&ours],
    };
    let oid = repo
        .commit(Some(&base_ref), &sig, &sig, title, &tree, &parents)
        .map_err(|e| e.to_string())?;
    Ok(oid.to_string())
}
