//! The default branch's tree as rover's environment builds read it: its tip commit, every
//! entry's path, mode and blob id (a content hash), a blob's bytes, and a checkout of the tree
//! into a directory of rover's. Never read from a worktree: an agent may have rewritten it.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use git2::{Oid, Repository, TreeWalkMode, TreeWalkResult};

use super::error::GitError;
use super::workspace::{blocking, default_branch_of, resolve_branch, Workspace};

/// One entry of a tree: a file (`0o100644`/`0o100755`) or a link (`0o120000`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SnapshotEntry {
    pub mode: u32,
    /// The blob's id: the hash of its content.
    pub blob: String,
}

/// The default branch's tip and its files.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DefaultBranchSnapshot {
    /// The branch's name.
    pub branch: String,
    /// The tip commit's id.
    pub commit: String,
    /// Every file and link of the tree by path (`/`-separated), submodules left out.
    pub entries: BTreeMap<String, SnapshotEntry>,
}

impl Workspace {
    /// The default branch's tip (the remote's copy when there is one) and its tree's entries;
    /// `None` when the branch has no commit yet.
    pub async fn default_branch_snapshot(&self) -> Result<Option<DefaultBranchSnapshot>, GitError> {
        let repo_path = self.repo_path().to_path_buf();
        let remote = self.remote().to_owned();
        blocking(move || {
            let repo = Repository::open(&repo_path).map_err(GitError::git2("open", &repo_path))?;
            let branch = default_branch_of(&repo, &remote, &repo_path)?;
            let Some(tip) = resolve_branch(&repo, &remote, &branch, true) else {
                return Ok(None);
            };
            let tree = tip
                .tree()
                .map_err(GitError::git2("read the default branch", &repo_path))?;
            let mut entries = BTreeMap::new();
            tree.walk(TreeWalkMode::PreOrder, |dir, entry| {
                let mode = u32::try_from(entry.filemode()).unwrap_or(0);
                if matches!(mode & 0o170_000, 0o100_000 | 0o120_000) {
                    if let Ok(name) = entry.name() {
                        entries.insert(
                            format!("{dir}{name}"),
                            SnapshotEntry {
                                mode,
                                blob: entry.id().to_string(),
                            },
                        );
                    }
                }
                TreeWalkResult::Ok
            })
            .map_err(GitError::git2("walk the default branch", &repo_path))?;
            Ok(Some(DefaultBranchSnapshot {
                branch,
                commit: tip.id().to_string(),
                entries,
            }))
        })
        .await?
    }

    /// The bytes of blob `id`, at most `limit` of them; `None` when there is no such blob.
    pub async fn read_blob(&self, id: &str, limit: usize) -> Result<Option<Vec<u8>>, GitError> {
        let repo_path = self.repo_path().to_path_buf();
        let id = id.to_owned();
        blocking(move || {
            let repo = Repository::open(&repo_path).map_err(GitError::git2("open", &repo_path))?;
            let Ok(oid) = Oid::from_str(&id) else {
                return Ok(None);
            };
            Ok(repo.find_blob(oid).ok().map(|blob| {
                let content = blob.content();
                content[..content.len().min(limit)].to_vec()
            }))
        })
        .await?
    }

    /// Writes the tree of `commit` into `dir` (created; links written as links, never followed),
    /// the way a checkout would, without touching the repository's index or worktrees.
    pub async fn export_commit(&self, commit: &str, dir: &Path) -> Result<(), GitError> {
        let repo_path = self.repo_path().to_path_buf();
        let commit = commit.to_owned();
        let dir: PathBuf = dir.to_path_buf();
        blocking(move || {
            let repo = Repository::open(&repo_path).map_err(GitError::git2("open", &repo_path))?;
            let oid =
                Oid::from_str(&commit).map_err(GitError::git2("parse a commit id", &repo_path))?;
            let tree = repo
                .find_commit(oid)
                .and_then(|c| c.tree())
                .map_err(GitError::git2("read the commit to export", &repo_path))?;
            std::fs::create_dir_all(&dir).map_err(|source| GitError::Io {
                path: dir.clone(),
                source,
            })?;
            let mut checkout = git2::build::CheckoutBuilder::new();
            checkout
                .target_dir(&dir)
                .force()
                .recreate_missing(true)
                .update_index(false);
            repo.checkout_tree(tree.as_object(), Some(&mut checkout))
                .map_err(GitError::git2("export the default branch", &dir))
        })
        .await?
    }
}
