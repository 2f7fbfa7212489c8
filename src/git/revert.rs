//! Taking a commit back in a task's worktree (rover's revert of its own merge that left the
//! base branch red): libgit2's revert, so no filter driver, hook or configuration of the
//! repository runs, and nothing is committed here (the commit step commits it as any change).

use std::path::Path;

use git2::{Oid, RevertOptions};

use super::boundary::{locate, open, verify};
use super::error::GitError;
use super::workspace::{blocking, Workspace};

impl Workspace {
    /// Reverts commit `sha` in `worktree`, its files and index, the first parent taken as the
    /// mainline of a merge commit: the paths it changes, in order. A revert that conflicts
    /// with what the branch holds now leaves the worktree as it was
    /// ([`GitError::RevertConflict`] names the files).
    pub async fn revert_into(&self, worktree: &Path, sha: &str) -> Result<Vec<String>, GitError> {
        let repo_path = self.repo_path().to_path_buf();
        let worktree = worktree.to_path_buf();
        let sha = sha.to_owned();
        blocking(move || {
            let wg = locate(&repo_path, &worktree)?;
            verify(&wg)?;
            let repo = open(&wg)?;
            let failed = |what: &'static str| GitError::git2(what, &worktree);
            let oid = Oid::from_str(&sha).map_err(failed("parse the commit id to revert"))?;
            let commit = repo
                .find_commit(oid)
                .map_err(failed("find the commit to revert"))?;
            let head = repo
                .head()
                .and_then(|h| h.peel_to_commit())
                .map_err(failed("read the worktree's head"))?;
            let mainline = u32::from(commit.parent_count() > 1);
            // In memory first: a conflict touches nothing.
            let preview = repo
                .revert_commit(&commit, &head, mainline, None)
                .map_err(failed("revert the commit"))?;
            let files = super::read::conflicted_paths(&preview)
                .map_err(failed("list the revert's conflicts"))?;
            if !files.is_empty() {
                return Err(GitError::RevertConflict { sha, files });
            }
            let mut opts = RevertOptions::new();
            if mainline > 0 {
                opts.mainline(mainline);
            }
            repo.revert(&commit, Some(&mut opts))
                .map_err(failed("revert the commit"))?;
            // A plain change for the commit step, not a revert in progress.
            repo.cleanup_state()
                .map_err(failed("end the revert's state"))?;
            let tree = head.tree().map_err(failed("read the worktree's head"))?;
            let diff = repo
                .diff_tree_to_index(Some(&tree), None, None)
                .map_err(failed("list what the revert changed"))?;
            Ok(diff
                .deltas()
                .filter_map(|d| d.new_file().path().or_else(|| d.old_file().path()))
                .map(|p| p.to_string_lossy().into_owned())
                .collect())
        })
        .await?
    }
}
