//! Repository content for prompts, read through git objects (never by following a path in a
//! worktree): files as the default branch has them, a task's change as a patch, recent subjects.

use std::path::Path;

use git2::{DiffFormat, DiffOptions, Oid, Repository};

use super::boundary::{locate, open};
use super::error::GitError;
use super::workspace::{blocking, default_branch_of, resolve_branch, Workspace};

impl Workspace {
    /// The blobs at `paths` in the default branch's tip (the remote's copy when there is one),
    /// each at most `limit` bytes; `None` for a path that is missing or not a plain file (a
    /// symbolic link is not followed).
    pub async fn read_default_branch_files(
        &self,
        paths: Vec<String>,
        limit: usize,
    ) -> Result<Vec<Option<Vec<u8>>>, GitError> {
        let repo_path = self.repo_path().to_path_buf();
        let remote = self.remote().to_owned();
        blocking(move || {
            let repo = Repository::open(&repo_path).map_err(GitError::git2("open", &repo_path))?;
            let name = default_branch_of(&repo, &remote, &repo_path)?;
            let Some(tip) = resolve_branch(&repo, &remote, &name, true) else {
                return Ok(vec![None; paths.len()]);
            };
            let tree = tip
                .tree()
                .map_err(GitError::git2("read the default branch", &repo_path))?;
            Ok(paths
                .iter()
                .map(|path| {
                    let entry = tree.get_path(Path::new(path)).ok()?;
                    // 0o100644 / 0o100755 only: a link (0o120000) or a tree is not read.
                    if entry.filemode() & 0o170_000 != 0o100_000 {
                        return None;
                    }
                    let blob = repo.find_blob(entry.id()).ok()?;
                    let content = blob.content();
                    Some(content[..content.len().min(limit)].to_vec())
                })
                .collect())
        })
        .await?
    }

    /// The change in `worktree` since commit `since` (committed, staged, unstaged and untracked)
    /// as a unified diff of at most `limit` bytes, the cut marked. Links show as their target
    /// text, binary files as one line.
    pub async fn diff_patch(
        &self,
        worktree: &Path,
        since: &str,
        limit: usize,
    ) -> Result<String, GitError> {
        let repo_path = self.repo_path().to_path_buf();
        let worktree = worktree.to_path_buf();
        let since = since.to_owned();
        blocking(move || {
            let wg = locate(&repo_path, &worktree)?;
            let repo = open(&wg)?;
            let oid =
                Oid::from_str(&since).map_err(GitError::git2("parse commit id", &worktree))?;
            let tree = repo
                .find_commit(oid)
                .and_then(|c| c.tree())
                .map_err(GitError::git2("find the fork point", &worktree))?;
            let mut opts = DiffOptions::new();
            opts.include_untracked(true)
                .recurse_untracked_dirs(true)
                .show_untracked_content(true);
            let diff = repo
                .diff_tree_to_workdir_with_index(Some(&tree), Some(&mut opts))
                .map_err(GitError::git2("diff the worktree", &worktree))?;
            Ok(patch_text(&diff, limit))
        })
        .await?
    }

    /// The subjects of the last `count` commits before `commit` (newest first).
    pub async fn recent_subjects(
        &self,
        commit: &str,
        count: usize,
    ) -> Result<Vec<String>, GitError> {
        let repo_path = self.repo_path().to_path_buf();
        let commit = commit.to_owned();
        blocking(move || {
            let repo = Repository::open(&repo_path).map_err(GitError::git2("open", &repo_path))?;
            let oid =
                Oid::from_str(&commit).map_err(GitError::git2("parse commit id", &repo_path))?;
            let mut walk = repo
                .revwalk()
                .map_err(GitError::git2("walk history", &repo_path))?;
            walk.push(oid)
                .map_err(GitError::git2("walk history", &repo_path))?;
            Ok(walk
                .flatten()
                .take(count)
                .filter_map(|id| repo.find_commit(id).ok())
                .filter_map(|c| c.summary().ok().flatten().map(str::to_owned))
                .collect())
        })
        .await?
    }
}

impl Workspace {
    /// The change `head` brings over its merge base with `base` (what a pull request shows),
    /// as a unified diff of at most `limit` bytes, the cut marked; `None` when either commit is
    /// missing from the checkout.
    pub async fn diff_commits(
        &self,
        base: &str,
        head: &str,
        limit: usize,
    ) -> Result<Option<String>, GitError> {
        self.over_fork(base, head, move |diff| patch_text(diff, limit))
            .await
    }

    /// The paths `head` changes over its merge base with `base` (added, modified, deleted or
    /// renamed, both names of a rename), sorted; `None` when either commit is missing.
    pub async fn changed_paths(
        &self,
        base: &str,
        head: &str,
    ) -> Result<Option<Vec<String>>, GitError> {
        self.over_fork(base, head, |diff| {
            let mut paths = std::collections::BTreeSet::new();
            for delta in diff.deltas() {
                for file in [delta.old_file(), delta.new_file()] {
                    if let Some(path) = file.path() {
                        paths.insert(path.to_string_lossy().into_owned());
                    }
                }
            }
            paths.into_iter().collect()
        })
        .await
    }

    /// The paths that conflict when `theirs` is merged into `ours` (any revision names),
    /// computed in memory by libgit2: nothing is checked out, no merge driver, filter or hook
    /// runs. Sorted; empty when the merge is clean; `None` when either commit is missing.
    pub async fn conflicting_paths(
        &self,
        ours: &str,
        theirs: &str,
    ) -> Result<Option<Vec<String>>, GitError> {
        self.with_commits(ours, theirs, |repo, repo_path, ours, theirs| {
            let index = repo
                .merge_commits(ours, theirs, None)
                .map_err(GitError::git2("merge the commits in memory", repo_path))?;
            conflicted_paths(&index)
                .map_err(GitError::git2("list the merge's conflicts", repo_path))
        })
        .await
    }

    /// `read` of the tree diff `head` brings over its merge base with `base`; `None` when
    /// either commit is missing from the checkout.
    async fn over_fork<T: Send + 'static>(
        &self,
        base: &str,
        head: &str,
        read: impl FnOnce(&git2::Diff<'_>) -> T + Send + 'static,
    ) -> Result<Option<T>, GitError> {
        self.with_commits(base, head, move |repo, repo_path, base, head| {
            let fork = repo.merge_base(base.id(), head.id()).unwrap_or(base.id());
            let from = repo
                .find_commit(fork)
                .and_then(|c| c.tree())
                .map_err(GitError::git2("read the merge base", repo_path))?;
            let to = head
                .tree()
                .map_err(GitError::git2("read the head", repo_path))?;
            let diff = repo
                .diff_tree_to_tree(Some(&from), Some(&to), None)
                .map_err(GitError::git2("diff the commits", repo_path))?;
            Ok(read(&diff))
        })
        .await
    }

    /// `work` on the commits `a` and `b` name (any revision names) in the checkout, off the
    /// async threads; `None` when either is missing.
    async fn with_commits<T: Send + 'static>(
        &self,
        a: &str,
        b: &str,
        work: impl FnOnce(&Repository, &Path, &git2::Commit<'_>, &git2::Commit<'_>) -> Result<T, GitError>
            + Send
            + 'static,
    ) -> Result<Option<T>, GitError> {
        let repo_path = self.repo_path().to_path_buf();
        let (a, b) = (a.to_owned(), b.to_owned());
        blocking(move || {
            let repo = Repository::open(&repo_path).map_err(GitError::git2("open", &repo_path))?;
            let find = |name: &str| {
                repo.revparse_single(name)
                    .and_then(|o| o.peel_to_commit())
                    .ok()
            };
            let (Some(a), Some(b)) = (find(&a), find(&b)) else {
                return Ok(None);
            };
            work(&repo, &repo_path, &a, &b).map(Some)
        })
        .await?
    }
}

/// The paths an in-memory merge or revert left conflicted, sorted, each once (empty: clean).
pub(super) fn conflicted_paths(index: &git2::Index) -> Result<Vec<String>, git2::Error> {
    if !index.has_conflicts() {
        return Ok(Vec::new());
    }
    let mut files: Vec<String> = index
        .conflicts()?
        .filter_map(Result::ok)
        .filter_map(|c| c.our.or(c.their).or(c.ancestor))
        .map(|e| String::from_utf8_lossy(&e.path).into_owned())
        .collect();
    files.sort();
    files.dedup();
    Ok(files)
}

/// A diff as unified text of at most `limit` bytes, the cut marked.
fn patch_text(diff: &git2::Diff<'_>, limit: usize) -> String {
    let mut text = Vec::new();
    let mut cut = false;
    let _ = diff.print(DiffFormat::Patch, |_, _, line| {
        if text.len() >= limit {
            cut = true;
            return false;
        }
        if matches!(line.origin(), '+' | '-' | ' ') {
            text.push(line.origin() as u8);
        }
        text.extend_from_slice(line.content());
        true
    });
    let mut out = String::from_utf8_lossy(&text[..text.len().min(limit)]).into_owned();
    if cut || text.len() > limit {
        out.push_str("\n[... the rest of the diff was cut by rover ...]\n");
    }
    out
}
