//! Diff summaries of a worktree against its fork point, for spans and prompts.

use std::path::Path;

use git2::{DiffOptions, Oid, Repository};
use serde::Serialize;

use super::error::GitError;
use super::workspace::{blocking, Workspace};

/// What changed in a worktree since a commit: committed, staged, unstaged and untracked alike.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
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
        let worktree = worktree.to_path_buf();
        let since = since.to_string();
        blocking(move || summarize(&worktree, &since)).await?
    }

    /// What is not committed yet in `worktree` (staged, unstaged and untracked, against `HEAD`).
    pub async fn uncommitted_summary(&self, worktree: &Path) -> Result<DiffSummary, GitError> {
        let worktree = worktree.to_path_buf();
        blocking(move || {
            let repo =
                Repository::open(&worktree).map_err(GitError::git2("open worktree", &worktree))?;
            let head = repo
                .head()
                .and_then(|h| h.peel_to_commit())
                .map_err(GitError::git2("read HEAD", &worktree))?
                .id()
                .to_string();
            summarize(&worktree, &head)
        })
        .await?
    }
}

fn summarize(worktree: &Path, since: &str) -> Result<DiffSummary, GitError> {
    let repo = Repository::open(worktree).map_err(GitError::git2("open worktree", worktree))?;
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
