//! Consolidating parallel task branches into one: `git merge`, aborted on conflict; and a merge
//! left open with its conflicts, for an agent to resolve.

use std::path::Path;

use super::command::{run_git, Target};
use super::error::GitError;
use super::workspace::Workspace;

/// What `merge_branches` did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MergeReport {
    /// The branches merged, in order.
    pub merged: Vec<String>,
    /// The commit the target worktree is at afterwards.
    pub head: String,
}

impl Workspace {
    /// Merges each of `sources` (local branches) into the branch checked out in `target_worktree`,
    /// in order, with `git merge --no-ff`. Hooks run when they may run on the host (see
    /// [`super::HookPlan`]); merge hooks that must be sandboxed are not run. On a conflict the
    /// merge is aborted, the worktree is left at the last successful merge, and the conflicting
    /// files are listed in [`GitError::MergeConflict`].
    pub async fn merge_branches(
        &self,
        target_worktree: &Path,
        sources: &[String],
    ) -> Result<MergeReport, GitError> {
        let wg = self.verify_worktree(target_worktree).await?;
        let plan = self.hook_plan(target_worktree, self.hook_mode()).await?;
        let target_worktree = Target::Worktree {
            wg: &wg,
            hooks: plan.host_dir(),
        };
        let mut merged = Vec::new();
        for source in sources {
            let message = format!("Merge branch '{source}'");
            let result = run_git(
                target_worktree,
                &[
                    "merge",
                    "--no-ff",
                    "--no-edit",
                    "-m",
                    &message,
                    "--",
                    source,
                ],
                self.envs(),
            )
            .await;
            if let Err(err) = result {
                let conflicts = run_git(
                    target_worktree,
                    &[
                        "diff",
                        "--no-ext-diff",
                        "--no-textconv",
                        "--name-only",
                        "--diff-filter=U",
                        "-z",
                    ],
                    self.envs(),
                )
                .await
                .map(|out| {
                    out.stdout
                        .split('\0')
                        .filter(|f| !f.is_empty())
                        .map(ToString::to_string)
                        .collect::<Vec<_>>()
                })
                .unwrap_or_default();
                if conflicts.is_empty() {
                    return Err(err);
                }
                run_git(target_worktree, &["merge", "--abort"], self.envs()).await?;
                return Err(GitError::MergeConflict {
                    source_branch: source.clone(),
                    files: conflicts,
                });
            }
            merged.push(source.clone());
        }
        let head = run_git(target_worktree, &["rev-parse", "HEAD"], self.envs()).await?;
        Ok(MergeReport {
            merged,
            head: head.stdout.trim().to_string(),
        })
    }

    /// Starts a merge of `source` into the branch checked out in `worktree` without committing
    /// it (`git merge --no-ff --no-commit`): conflicts are left in the files, with `MERGE_HEAD`
    /// set, so that whoever resolves them and commits records a merge commit. Returns the
    /// conflicting files (none for a clean merge). A merge already in progress (a rerun) is left
    /// as it is.
    pub async fn merge_leaving_conflicts(
        &self,
        worktree: &Path,
        source: &str,
    ) -> Result<Vec<String>, GitError> {
        let wg = self.verify_worktree(worktree).await?;
        let plan = self.hook_plan(worktree, self.hook_mode()).await?;
        let target = Target::Worktree {
            wg: &wg,
            hooks: plan.host_dir(),
        };
        let unmerged = || async {
            run_git(
                target,
                &[
                    "diff",
                    "--no-ext-diff",
                    "--no-textconv",
                    "--name-only",
                    "--diff-filter=U",
                    "-z",
                ],
                self.envs(),
            )
            .await
            .map(|out| {
                out.stdout
                    .split('\0')
                    .filter(|f| !f.is_empty())
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
            })
        };
        let in_progress = run_git(
            target,
            &["rev-parse", "-q", "--verify", "MERGE_HEAD"],
            self.envs(),
        )
        .await
        .is_ok();
        if in_progress {
            return unmerged().await;
        }
        match run_git(
            target,
            &["merge", "--no-ff", "--no-commit", "--", source],
            self.envs(),
        )
        .await
        {
            Ok(_) => Ok(Vec::new()),
            Err(err) => {
                let conflicts = unmerged().await.unwrap_or_default();
                if conflicts.is_empty() {
                    Err(err)
                } else {
                    Ok(conflicts)
                }
            }
        }
    }
}
