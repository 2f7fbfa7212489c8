//! Committing what an agent wrote, with the `git` CLI so hooks and signing run; commit messages.

use std::path::Path;

use super::command::run_git;
use super::error::GitError;
use super::workspace::Workspace;

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

impl Workspace {
    /// Stages everything in `worktree` (`git add -A`) and commits it with `git commit`, so the
    /// user's pre-commit/commit-msg hooks and `commit.gpgsign` apply (never `--no-verify`).
    ///
    /// A failing hook or signing error comes back as [`GitError::Command`] with argv, exit code,
    /// stdout and stderr. The message is used as given: pass it through [`commit_message`] first.
    pub async fn commit_all(
        &self,
        worktree: &Path,
        message: &str,
    ) -> Result<CommitOutcome, GitError> {
        run_git(worktree, &["add", "-A"], self.envs()).await?;
        let status = run_git(worktree, &["status", "--porcelain"], self.envs()).await?;
        if status.stdout.trim().is_empty() {
            return Ok(CommitOutcome::NoChanges);
        }
        run_git(worktree, &["commit", "--quiet", "-m", message], self.envs()).await?;
        let head = run_git(worktree, &["rev-parse", "HEAD"], self.envs()).await?;
        Ok(CommitOutcome::Committed {
            sha: head.stdout.trim().to_string(),
        })
    }
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
