//! Cleanup helpers: remove a worktree, delete a local branch; each tolerant of being already gone.

use std::path::{Path, PathBuf};

use git2::{BranchType, Repository, WorktreePruneOptions};
use serde::Serialize;

use super::error::GitError;
use super::workspace::{blocking, worktree_lock, Workspace};

/// Whether a cleanup removed something or found it already gone.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum Removal {
    /// It existed and was removed now.
    Removed,
    /// It did not exist (already cleaned up, or never created).
    Absent,
}

/// What a combined cleanup of a worktree and its branch did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CleanupReport {
    pub worktree: Removal,
    pub branch: Removal,
}

/// A linked worktree of the repository (for finding orphans at startup).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct WorktreeInfo {
    /// The registered name (one path component).
    pub name: String,
    pub path: PathBuf,
    /// The branch checked out there, if it could be read.
    pub branch: Option<String>,
    /// Whether its directory still exists.
    pub present: bool,
}

impl Workspace {
    /// Every linked worktree of the repository (not the main checkout), sorted by name.
    pub async fn list_worktrees(&self) -> Result<Vec<WorktreeInfo>, GitError> {
        let repo_path = self.repo_path().to_path_buf();
        blocking(move || {
            let repo = Repository::open(&repo_path).map_err(GitError::git2("open", &repo_path))?;
            let names = repo
                .worktrees()
                .map_err(GitError::git2("list worktrees", &repo_path))?;
            let mut found = Vec::new();
            for name in names.iter().flatten().flatten() {
                let Ok(wt) = repo.find_worktree(name) else {
                    continue;
                };
                let present = wt.validate().is_ok();
                let branch = if present {
                    Repository::open_from_worktree(&wt).ok().and_then(|r| {
                        r.head()
                            .ok()
                            .and_then(|h| h.shorthand().ok().map(ToString::to_string))
                    })
                } else {
                    None
                };
                found.push(WorktreeInfo {
                    name: name.to_string(),
                    path: wt.path().to_path_buf(),
                    branch,
                    present,
                });
            }
            found.sort_by(|a, b| a.name.cmp(&b.name));
            Ok(found)
        })
        .await?
    }

    /// Removes the worktree at `path` (its directory and its registration), even with uncommitted
    /// changes in it; `Absent` when neither exists any more.
    pub async fn remove_worktree(&self, path: &Path) -> Result<Removal, GitError> {
        let repo_path = self.repo_path().to_path_buf();
        let path = path.to_path_buf();
        blocking(move || {
            let _guard = worktree_lock();
            remove_worktree(&repo_path, &path)
        })
        .await?
    }

    /// Deletes local branch `name`; `Absent` when it does not exist. Fails while a worktree still
    /// has it checked out: remove the worktree first.
    pub async fn delete_branch(&self, name: &str) -> Result<Removal, GitError> {
        let repo_path = self.repo_path().to_path_buf();
        let name = name.to_string();
        blocking(move || {
            let repo = Repository::open(&repo_path).map_err(GitError::git2("open", &repo_path))?;
            let Ok(mut branch) = repo.find_branch(&name, BranchType::Local) else {
                return Ok(Removal::Absent);
            };
            branch
                .delete()
                .map_err(GitError::git2("delete branch", &repo_path))?;
            Ok(Removal::Removed)
        })
        .await?
    }

    /// Removes the worktree at `path`, then deletes `branch`; reports each piece.
    pub async fn cleanup(&self, path: &Path, branch: &str) -> Result<CleanupReport, GitError> {
        let worktree = self.remove_worktree(path).await?;
        let branch = self.delete_branch(branch).await?;
        Ok(CleanupReport { worktree, branch })
    }
}

fn remove_worktree(repo_path: &Path, path: &Path) -> Result<Removal, GitError> {
    let repo = Repository::open(repo_path).map_err(GitError::git2("open", repo_path))?;
    let wanted = canonical_or_self(path);
    let mut removed = false;
    // The directory first, with std's removal (links the agent made are removed, never
    // followed); then the registration, whose directory is gone.
    if std::fs::symlink_metadata(path).is_ok() {
        std::fs::remove_dir_all(path).map_err(|source| GitError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        removed = true;
    }
    let names = repo
        .worktrees()
        .map_err(GitError::git2("list worktrees", repo_path))?;
    for name in names.iter().flatten().flatten() {
        let Ok(wt) = repo.find_worktree(name) else {
            continue;
        };
        if canonical_or_self(wt.path()) != wanted {
            continue;
        }
        let mut opts = WorktreePruneOptions::new();
        opts.valid(true).working_tree(false).locked(true);
        wt.prune(Some(&mut opts))
            .map_err(GitError::git2("prune worktree", repo_path))?;
        removed = true;
    }
    Ok(if removed {
        Removal::Removed
    } else {
        Removal::Absent
    })
}

/// Canonical form when the path still exists; otherwise its parent's canonical form plus the name.
fn canonical_or_self(path: &Path) -> PathBuf {
    if let Ok(c) = path.canonicalize() {
        return c;
    }
    match (
        path.parent().and_then(|p| p.canonicalize().ok()),
        path.file_name(),
    ) {
        (Some(parent), Some(name)) => parent.join(name),
        _ => path.to_path_buf(),
    }
}
