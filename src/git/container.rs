//! The git metadata a sandbox needs so `git status`/`git diff` work inside it, minus secrets.
//!
//! A worktree's `.git` is a file pointing at `<repo>/.git/worktrees/<name>`, which lives in the
//! user's repository. Mounting that repository's git dir read-only (at the same path) and the
//! worktree's own git dir read-write lets an agent read history and refresh its index, while
//! objects and refs stay unwritable (the host commits). The repository's `config` may hold remote
//! URLs with credentials, so it is masked by a sanitized copy that keeps only what git needs to
//! read the repository (format version and extensions).

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use git2::Repository;

use super::error::GitError;
use super::workspace::{blocking, Workspace};

/// Host paths to mount into a sandbox, each at the same path inside the container.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SandboxGitDirs {
    /// The repository's git dir (`<repo>/.git`): read-only.
    pub common_dir: PathBuf,
    /// The worktree's own git dir (`<repo>/.git/worktrees/<name>`): read-write (index, HEAD).
    pub worktree_git_dir: PathBuf,
    /// A sanitized config file, to be mounted read-only over `<common_dir>/config`.
    pub safe_config: PathBuf,
}

impl Workspace {
    /// The git dirs of `worktree` for a sandbox, writing the sanitized config into `scratch_dir`.
    pub async fn sandbox_git_dirs(
        &self,
        worktree: &Path,
        scratch_dir: &Path,
    ) -> Result<SandboxGitDirs, GitError> {
        let worktree = worktree.to_path_buf();
        let scratch = scratch_dir.to_path_buf();
        blocking(move || git_dirs(&worktree, &scratch)).await?
    }
}

fn git_dirs(worktree: &Path, scratch: &Path) -> Result<SandboxGitDirs, GitError> {
    let repo = Repository::open(worktree).map_err(GitError::git2("open worktree", worktree))?;
    let worktree_git_dir = repo.path().to_path_buf();
    let common_dir = repo.commondir().to_path_buf();
    let config = git2::Config::open(&common_dir.join("config"))
        .map_err(GitError::git2("read config", &common_dir))?;
    let version = config.get_i32("core.repositoryformatversion").unwrap_or(0);
    let mut text = format!("[core]\n\trepositoryformatversion = {version}\n\tbare = false\n");
    let mut extensions = String::new();
    if let Ok(mut entries) = config.entries(Some("extensions\\..*")) {
        while let Some(Ok(entry)) = entries.next() {
            if let (Ok(name), Ok(value)) = (entry.name(), entry.value()) {
                if let Some(key) = name.strip_prefix("extensions.") {
                    let _ = writeln!(extensions, "\t{key} = {value}");
                }
            }
        }
    }
    if !extensions.is_empty() {
        text.push_str("[extensions]\n");
        text.push_str(&extensions);
    }
    std::fs::create_dir_all(scratch).map_err(|source| GitError::Io {
        path: scratch.to_path_buf(),
        source,
    })?;
    let safe_config = scratch.join("git-config");
    std::fs::write(&safe_config, text).map_err(|source| GitError::Io {
        path: safe_config.clone(),
        source,
    })?;
    Ok(SandboxGitDirs {
        common_dir: trim_slash(&common_dir),
        worktree_git_dir: trim_slash(&worktree_git_dir),
        safe_config,
    })
}

/// libgit2 reports git dirs with a trailing slash; Docker bind targets are cleaner without.
fn trim_slash(path: &Path) -> PathBuf {
    let text = path.to_string_lossy();
    PathBuf::from(text.trim_end_matches('/'))
}
