//! The git subsystem's error type.

use std::path::PathBuf;

use super::command::CommandFailure;

/// Everything that can go wrong in a git workspace operation.
#[derive(Debug, thiserror::Error)]
pub enum GitError {
    /// libgit2 refused an operation on a repository.
    #[error("git operation `{operation}` failed in {}", path.display())]
    Git2 {
        operation: &'static str,
        path: PathBuf,
        #[source]
        source: git2::Error,
    },
    /// The `git` executable could not be started at all.
    #[error("could not run `git` (is git installed and on PATH?) in {}", path.display())]
    Spawn {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// A file system operation around a worktree failed.
    #[error("cannot prepare {}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// A `git` command ran and failed; the failure keeps argv, exit code, stdout and stderr.
    #[error("{0}")]
    Command(Box<CommandFailure>),
    /// No default branch could be found (no `origin/HEAD`, no `main`/`master`, detached HEAD).
    #[error("cannot tell the default branch of {}; set `origin/HEAD` (git remote set-head origin -a)", path.display())]
    NoDefaultBranch { path: PathBuf },
    /// The branch to fork from or to reuse does not exist locally nor on `origin`.
    #[error("branch `{branch}` does not exist in {}; fetch it or fork from the default branch", path.display())]
    BranchMissing { branch: String, path: PathBuf },
    /// The worktree path is already used by something that is not this branch's worktree.
    #[error("worktree path {} is already in use; remove it or pick another path", path.display())]
    WorktreePathInUse { path: PathBuf },
    /// Worktrees live under rover's data dir, never inside the user's checkout.
    #[error("worktree path {} is inside the checkout {}; put worktrees under rover's data dir", path.display(), checkout.display())]
    WorktreeInsideCheckout { path: PathBuf, checkout: PathBuf },
    /// A merge stopped on conflicts; the merge was aborted and the worktree is clean again.
    #[error("merging `{source_branch}` conflicts in {} file(s): {}; resolve them by hand or re-run the task on top of the other branch", files.len(), files.join(", "))]
    MergeConflict {
        source_branch: String,
        files: Vec<String>,
    },
    /// Reverting a commit conflicts with what the branch holds now; nothing was changed.
    #[error("reverting {sha} conflicts with what the branch holds now in {} file(s): {}; a person must take it back by hand", files.len(), files.join(", "))]
    RevertConflict { sha: String, files: Vec<String> },
    /// `git pull --rebase` after a rejected push stopped on conflicts (the rebase was aborted).
    #[error("push of `{branch}` was rejected and rebasing onto the remote conflicts; the branch diverged, resolve by hand")]
    RebaseConflict {
        branch: String,
        #[source]
        failure: Box<CommandFailure>,
    },
    /// The directory is not a worktree registered in the repository.
    #[error("{} is not a worktree of the repository {}; was it removed or moved by hand?", path.display(), repo.display())]
    NotAWorktree { path: PathBuf, repo: PathBuf },
    /// The task's change goes over a commit limit: nothing was staged.
    #[error("{} is over the commit limit: `{path}` {}; delete it or add it to .gitignore, or raise autopilot.sandbox.commitLimits.{kind} in rover.json", match kind { super::limits::LimitKind::FileCount => "the number of changed files", super::limits::LimitKind::TotalSize => "the change's size", super::limits::LimitKind::FileSize => "a file" }, describe(*kind, *size, *limit))]
    CommitLimit {
        kind: super::limits::LimitKind,
        /// The file that went over (for a total or a count, the one that tipped it).
        path: String,
        size: u64,
        limit: u64,
    },
    /// A `.gitignore` or `.gitattributes` of the worktree that git must not read: nothing staged.
    #[error("`{path}` {why}: git reads it as rules while staging, so rover stages nothing; make it a plain, small file or delete it")]
    RulesFile { path: String, why: String },
    /// A sandbox replaced or rewrote the worktree's `.git`: its work is not trusted any more.
    #[error("tampered: the sandbox changed the worktree's git metadata in {}: {what}; nothing of it is committed", worktree.display())]
    Tampered { worktree: PathBuf, what: String },
    /// The worktree's hooks must run in a sandbox container, which this caller cannot start.
    #[error(
        "the worktree's hooks must run in a sandbox ({reason}); commit through the commit step"
    )]
    HooksNeedSandbox { reason: String },
    /// What the push would send holds a secret rover holds or a key-shaped string; nothing was
    /// pushed. The findings name where, never the value (`branch` is masked the same way).
    #[error("refused to push `{branch}`: it would send {}; nothing was pushed", super::scan::describe_findings(findings, *more))]
    SecretsInPush {
        branch: String,
        findings: Vec<super::scan::SecretFinding>,
        more: usize,
    },
    /// What the push would send is more than the secret scan reads; nothing was pushed.
    #[error("refused to push `{branch}`: {what} is more than rover scans for secrets before a push ({limit}); nothing was pushed, push it by hand")]
    ScanTooLarge {
        branch: String,
        what: String,
        limit: String,
    },
    /// A blocking task was cancelled or panicked.
    #[error("a blocking git task did not finish")]
    Join(#[source] tokio::task::JoinError),
}

impl GitError {
    /// Whether trying the same operation again later may succeed without a human changing anything.
    pub fn is_retryable(&self) -> bool {
        match self {
            // A push or fetch may fail on the network; hooks and signing fail the same way again.
            Self::Command(failure) => failure.looks_transient(),
            Self::Join(_) => true,
            Self::Git2 { source, .. } => matches!(source.code(), git2::ErrorCode::Locked),
            _ => false,
        }
    }

    /// The failed command, if this error is one.
    pub fn command_failure(&self) -> Option<&CommandFailure> {
        match self {
            Self::Command(failure) | Self::RebaseConflict { failure, .. } => Some(failure),
            _ => None,
        }
    }

    pub(crate) fn git2(
        operation: &'static str,
        path: &std::path::Path,
    ) -> impl FnOnce(git2::Error) -> Self {
        let path = path.to_path_buf();
        move |source| Self::Git2 {
            operation,
            path,
            source,
        }
    }
}

impl From<CommandFailure> for GitError {
    fn from(failure: CommandFailure) -> Self {
        Self::Command(Box::new(failure))
    }
}

/// `is N MiB (limit M MiB)` for sizes, `made N (limit M)` for counts.
fn describe(kind: super::limits::LimitKind, size: u64, limit: u64) -> String {
    const MIB: f64 = 1024.0 * 1024.0;
    #[allow(clippy::cast_precision_loss, reason = "sizes shown to one decimal")]
    match kind {
        super::limits::LimitKind::FileCount => {
            format!("made the count {size} (limit {limit} files)")
        }
        super::limits::LimitKind::TotalSize => format!(
            "brought it to {:.1} MiB (limit {:.1} MiB)",
            size as f64 / MIB,
            limit as f64 / MIB
        ),
        super::limits::LimitKind::FileSize => format!(
            "is {:.1} MiB (limit {:.1} MiB)",
            size as f64 / MIB,
            limit as f64 / MIB
        ),
    }
}
