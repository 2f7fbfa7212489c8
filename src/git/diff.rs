//! Diff summaries of a worktree against its fork point, for spans and prompts.

use std::path::Path;

use git2::{DiffOptions, Oid};
use serde::Serialize;

use super::boundary::{open, WorktreeGit};
use super::error::GitError;
use super::workspace::{blocking, Workspace};

/// What changed in a worktree since a commit: committed, staged, unstaged and untracked alike.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DiffSummary {
    /// Number of files added, modified, deleted or renamed.
    pub files_changed: usize,
    /// Lines added.
    pub insertions: usize,
    /// Lines removed.
    pub deletions: usize,
    /// Paths relative to the worktree root, sorted.
    pub files: Vec<String>,
}

impl DiffSummary {
    /// Whether nothing changed.
    pub fn is_empty(&self) -> bool {
        self.files_changed == 0
    }
}

impl Workspace {
    /// What changed in `worktree` since commit `since` (usually the fork point), counting the
    /// working tree as it is now, including untracked files (`.gitignore` honoured).
    pub async fn diff_summary(
        &self,
        worktree: &Path,
        since: &str,
    ) -> Result<DiffSummary, GitError> {
        let wg = self.worktree_git(worktree).await?;
        let since = since.to_string();
        blocking(move || summarize(&wg, &since)).await?
    }

    /// What is not committed yet in `worktree` (staged, unstaged and untracked, against `HEAD`).
    pub async fn uncommitted_summary(&self, worktree: &Path) -> Result<DiffSummary, GitError> {
        let wg = self.worktree_git(worktree).await?;
        blocking(move || {
            let repo = open(&wg)?;
            let head = repo
                .head()
                .and_then(|h| h.peel_to_commit())
                .map_err(GitError::git2("read HEAD", &wg.work_tree))?
                .id()
                .to_string();
            summarize(&wg, &head)
        })
        .await?
    }
}

fn summarize(wg: &WorktreeGit, since: &str) -> Result<DiffSummary, GitError> {
    let worktree = wg.work_tree.as_path();
    let repo = open(wg)?;
    let oid = Oid::from_str(since).map_err(GitError::git2("parse commit id", worktree))?;
    let tree = repo
        .find_commit(oid)
        .and_then(|c| c.tree())
        .map_err(GitError::git2("find fork point", worktree))?;
    let mut opts = DiffOptions::new();
    opts.include_untracked(true)
        .recurse_untracked_dirs(true)
        .show_untracked_content(true);
    let mut diff = repo
        .diff_tree_to_workdir_with_index(Some(&tree), Some(&mut opts))
        .map_err(GitError::git2("diff worktree", worktree))?;
    diff.find_similar(None)
        .map_err(GitError::git2("find renames", worktree))?;
    let stats = diff
        .stats()
        .map_err(GitError::git2("diff stats", worktree))?;
    let mut files: Vec<String> = diff
        .deltas()
        .filter_map(|d| {
            d.new_file()
                .path()
                .or_else(|| d.old_file().path())
                .map(|p| p.to_string_lossy().into_owned())
        })
        .collect();
    files.sort();
    files.dedup();
    Ok(DiffSummary {
        files_changed: stats.files_changed(),
        insertions: stats.insertions(),
        deletions: stats.deletions(),
        files,
    })
}
