//! Committing what an agent wrote, with the `git` CLI so hooks and signing run; commit messages.

use std::path::{Path, PathBuf};

use git2::IndexAddOption;

use super::boundary::{open, WorktreeGit};
use super::command::{run_git, Target};
use super::error::GitError;
use super::hooks::HookPlan;
use super::workspace::{blocking, Workspace};

/// The trailer added to commits when the project turns `attribution` on.
pub const ROVER_TRAILER: &str = "Co-Authored-By: Rover <noreply@endor.dev>";

/// What `commit_all` did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CommitOutcome {
    /// A commit was made; its full sha.
    Committed { sha: String },
    /// The worktree had nothing to commit.
    NoChanges,
}

/// A clean commit message: AI attribution lines removed (`Co-Authored-By: Claude…`, codex or
/// other AI co-author trailers, "Generated with …"), surrounding blank lines trimmed, and the
/// Rover trailer appended only when `attribution` is on.
pub fn commit_message(raw: &str, attribution: bool) -> String {
    let kept: Vec<&str> = raw
        .lines()
        .filter(|line| !is_ai_attribution(line))
        .collect();
    let mut message = kept.join("\n").trim().to_string();
    // Collapse runs of blank lines left where attribution lines were.
    while message.contains("\n\n\n") {
        message = message.replace("\n\n\n", "\n\n");
    }
    if message.is_empty() {
        message = "Update files".to_string();
    }
    if attribution {
        // Git reads trailers from the last paragraph only: join an existing trailer block.
        let last = message.rsplit("\n\n").next().unwrap_or_default();
        let has_body = message.contains("\n\n");
        if has_body && last.lines().all(is_trailer) {
            message.push('\n');
        } else {
            message.push_str("\n\n");
        }
        message.push_str(ROVER_TRAILER);
    }
    message.push('\n');
    message
}

/// `Token: value` with a token of letters, digits and dashes (git's trailer shape).
fn is_trailer(line: &str) -> bool {
    line.split_once(": ").is_some_and(|(token, value)| {
        !token.is_empty()
            && !value.trim().is_empty()
            && token.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
    })
}

fn is_ai_attribution(line: &str) -> bool {
    let lower = line.trim().to_ascii_lowercase();
    let lower = lower.trim_start_matches(['🤖', ' ']);
    if let Some(rest) = lower.strip_prefix("co-authored-by:") {
        let rest = rest.trim();
        return [
            "claude",
            "anthropic",
            "codex",
            "openai",
            "chatgpt",
            "copilot",
            "rover <",
        ]
        .iter()
        .any(|needle| rest.contains(needle));
    }
    lower.starts_with("generated with") || lower.starts_with("🤖 generated with")
}

/// What [`Workspace::stage_all`] staged.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Staged {
    /// Whether the index now differs from `HEAD`.
    pub changed: bool,
    /// Paths left out: nested repositories (a directory with its own `.git`), which `git add`
    /// would record as submodules whose git metadata the sandbox wrote.
    pub skipped: Vec<String>,
    /// How many files the change adds or changes, and their size, as checked against the
    /// commit limits (files whose size or time differs from the index).
    pub change: super::limits::ChangeSize,
}

impl Workspace {
    /// Stages everything in `worktree` like `git add -A`, with libgit2: no filter driver,
    /// fsmonitor or hook runs, links are recorded as links, and nested repositories are left
    /// out. Checks the worktree's `.git` first ([`GitError::Tampered`]), then the commit limits
    /// ([`GitError::CommitLimit`]: nothing is staged, nothing written into the object store).
    pub async fn stage_all(&self, worktree: &Path) -> Result<Staged, GitError> {
        let wg = self.verify_worktree(worktree).await?;
        let limits = self.commit_limits();
        blocking(move || stage(&wg, &limits)).await?
    }

    /// Commits what is staged in `worktree` with `git commit` (the user's signing applies, and
    /// the hooks in `hooks_dir`, never `--no-verify`): [`super::NO_HOOKS`] when the hooks ran
    /// in a sandbox already. The message is used as given: pass it through [`commit_message`].
    ///
    /// A failing hook or signing error comes back as [`GitError::Command`] with argv, exit code,
    /// stdout and stderr.
    pub async fn commit_staged(
        &self,
        worktree: &Path,
        message: &str,
        hooks_dir: &Path,
    ) -> Result<CommitOutcome, GitError> {
        let wg = self.verify_worktree(worktree).await?;
        let target = Target::Worktree {
            wg: &wg,
            hooks: hooks_dir,
        };
        let status = run_git(
            target,
            &[
                "diff",
                "--cached",
                "--quiet",
                "--no-ext-diff",
                "--no-textconv",
            ],
            self.envs(),
        )
        .await;
        match status {
            Ok(_) => return Ok(CommitOutcome::NoChanges),
            Err(GitError::Command(failure)) if failure.exit_code == Some(1) => {}
            Err(other) => return Err(other),
        }
        run_git(target, &["commit", "--quiet", "-m", message], self.envs()).await?;
        let head = run_git(target, &["rev-parse", "HEAD"], self.envs()).await?;
        Ok(CommitOutcome::Committed {
            sha: head.stdout.trim().to_string(),
        })
    }

    /// Stages everything and commits it with hooks that may run on the host; a worktree whose
    /// hooks must run in a sandbox is [`GitError::HooksNeedSandbox`] (the commit step runs them).
    pub async fn commit_all(
        &self,
        worktree: &Path,
        message: &str,
    ) -> Result<CommitOutcome, GitError> {
        let staged = self.stage_all(worktree).await?;
        if !staged.changed {
            return Ok(CommitOutcome::NoChanges);
        }
        match self.hook_plan(worktree, self.hook_mode()).await? {
            HookPlan::Host { dir, .. } => self.commit_staged(worktree, message, &dir).await,
            HookPlan::None { .. } => {
                self.commit_staged(worktree, message, Path::new(super::NO_HOOKS))
                    .await
            }
            HookPlan::Sandbox { reason, .. } => Err(GitError::HooksNeedSandbox { reason }),
        }
    }
}

/// Whether `relative` (a path in the worktree) is, or is inside, a nested repository.
fn in_nested_repo(work_tree: &Path, relative: &Path) -> bool {
    let mut dir = work_tree.to_path_buf();
    for part in relative.components() {
        dir.push(part);
        if std::fs::symlink_metadata(dir.join(".git")).is_ok() {
            return true;
        }
    }
    false
}

fn stage(wg: &WorktreeGit, limits: &super::limits::CommitLimits) -> Result<Staged, GitError> {
    let repo = open(wg)?;
    let path = &wg.work_tree;
    let mut index = repo
        .index()
        .map_err(GitError::git2("read the index", path))?;
    super::limits::sweep_temporary_objects(&wg.common_dir.join("objects"));
    let ignored = |relative: &Path| repo.is_path_ignored(relative).unwrap_or(false);
    let change = super::limits::check(path, &index, limits, &ignored)?;
    let mut skipped = Vec::new();
    let mut skip = |entry: &Path, _: &[u8]| -> i32 {
        if in_nested_repo(path, entry) {
            skipped.push(entry.display().to_string());
            1
        } else {
            0
        }
    };
    index
        .add_all(["*"], IndexAddOption::DEFAULT, Some(&mut skip))
        .map_err(GitError::git2("stage changes", path))?;
    index
        .update_all(["*"], None)
        .map_err(GitError::git2("stage deletions", path))?;
    // A gitlink the base did not have is a repository the sandbox made: never recorded.
    let head_tree = repo.head().and_then(|h| h.peel_to_tree()).ok();
    let new_links: Vec<PathBuf> = index
        .iter()
        .filter(|e| e.mode == 0o160_000)
        .map(|e| PathBuf::from(String::from_utf8_lossy(&e.path).into_owned()))
        .filter(|p| {
            head_tree
                .as_ref()
                .and_then(|t| t.get_path(p).ok())
                .is_none_or(|entry| entry.filemode() != 0o160_000)
        })
        .collect();
    for link in new_links {
        index
            .remove_path(&link)
            .map_err(GitError::git2("unstage a nested repository", path))?;
        skipped.push(link.display().to_string());
    }
    index
        .write()
        .map_err(GitError::git2("write the index", path))?;
    let tree = index
        .write_tree()
        .map_err(GitError::git2("write the tree", path))?;
    skipped.sort();
    skipped.dedup();
    Ok(Staged {
        changed: head_tree.is_none_or(|t| t.id() != tree),
        skipped,
        change,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strips_ai_attribution_and_adds_the_trailer_only_when_on() {
        let raw = "Add login\n\nBody text.\n\n🤖 Generated with [Claude Code](https://claude.com/claude-code)\n\nCo-Authored-By: Claude <noreply@anthropic.com>\n";
        assert_eq!(commit_message(raw, false), "Add login\n\nBody text.\n");
        assert_eq!(
            commit_message(raw, true),
            format!("Add login\n\nBody text.\n\n{ROVER_TRAILER}\n")
        );
    }

    #[test]
    fn keeps_human_co_authors_and_never_doubles_the_trailer() {
        let raw = format!("Fix\n\nCo-authored-by: Ada <ada@example.com>\n{ROVER_TRAILER}");
        let msg = commit_message(&raw, true);
        assert!(msg.contains("Co-authored-by: Ada <ada@example.com>"));
        assert_eq!(msg.matches(ROVER_TRAILER).count(), 1);
        assert!(!commit_message(&raw, false).contains("Rover"));
        assert!(
            !commit_message("x\nCo-Authored-By: Codex <codex@openai.com>", false).contains("Codex")
        );
    }

    #[test]
    fn trailer_joins_an_existing_trailer_block() {
        let msg = commit_message("Fix\n\nBody.\n\nSigned-off-by: Ada <ada@example.com>", true);
        assert_eq!(
            msg,
            format!("Fix\n\nBody.\n\nSigned-off-by: Ada <ada@example.com>\n{ROVER_TRAILER}\n")
        );
        // A one-line subject is not a trailer block, even when it has a colon.
        assert_eq!(
            commit_message("fix: the login", true),
            format!("fix: the login\n\n{ROVER_TRAILER}\n")
        );
    }

    #[test]
    fn empty_message_gets_a_fallback() {
        assert_eq!(
            commit_message("Generated with Claude Code", false),
            "Update files\n"
        );
    }
}
