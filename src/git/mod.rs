//! Git workspaces: branches and worktrees (git2), commit, push and merge (the `git` CLI), the
//! secret scan of what a push would send (`scan`), and the clone of a served repository that has
//! no checkout (`clone`).
//!
//! git2 handles repository state (default branch, branches, worktrees, diffs) because it needs no
//! process; the `git` CLI handles everything where the user's hooks, signing and credentials must
//! apply exactly as they do for the user (`commit`, `push`, `pull --rebase`, `merge`). Arguments are
//! always passed as argv, never through a shell.

mod boundary;
mod branch;
mod cleanup;
mod clone;
mod command;
mod commit;
mod container;
mod diff;
mod error;
mod fetch;
mod hooks;
mod limits;
mod merge;
pub mod owner;
mod push;
mod read;
mod revert;
mod scan;
mod snapshot;
mod workspace;

pub use boundary::{WorktreeGit, NO_HOOKS};
pub use branch::{branch_name, is_branch_name, slugify, BRANCH_PREFIX};
pub use cleanup::{CleanupReport, Removal, WorktreeInfo};
pub use clone::{clone_checkout, shown_url};
pub use command::{bounded_text as bounded_output, CommandFailure, OUTPUT_LIMIT_BYTES};
pub use commit::{commit_message, CommitOutcome, Staged, ROVER_TRAILER};
pub use container::{SandboxGit, SANDBOX_GIT_DIR, SANDBOX_OBJECTS_DIR};
pub use diff::DiffSummary;
pub use error::GitError;
pub use hooks::{HookLocation, HookMode, HookPlan, PrePushInput, HOOK_NAMES};
pub use limits::{ChangeSize, CommitLimits, LimitKind};
pub use merge::MergeReport;
pub use push::{PushReport, GIT_TOKEN_ENV};

/// A commit id as rover writes it in words: its first 12 characters.
pub fn short_sha(sha: &str) -> &str {
    &sha[..sha.len().min(12)]
}
pub use scan::{
    describe_findings, ScanLimits, ScanReport, SecretFinding, SecretPlace, SecretScan, SecretWhat,
};
pub use snapshot::{DefaultBranchSnapshot, SnapshotEntry};
pub use workspace::{BranchBase, PreparedWorktree, Workspace};
