//! The git a sandbox sees: a scratch repository of its own, never the user's git metadata.
//!
//! Inside a container `/workspace/.git` is a read-only file naming [`SANDBOX_GIT_DIR`], a
//! scratch repository rover builds for that container: the task branch and the repository's
//! refs (packed), a copy of the worktree's index, a sanitized config, and the repository's
//! objects borrowed read-only through `objects/info/alternates`. `git status`, `diff`, `log`,
//! `add`, even `commit` work inside, and change only the scratch repository. The worktree's own
//! git dir, the repository's config, refs and hooks are never mounted, so nothing the sandbox
//! does can reach a later host git command (`boundary` checks the worktree's `.git` after every
//! container). The scratch repository is thrown away after the container.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use git2::Repository;

use super::boundary::{locate, open, WorktreeGit};
use super::error::GitError;
use super::workspace::{blocking, Workspace};

/// Where the scratch repository appears inside the container (read-write).
pub const SANDBOX_GIT_DIR: &str = "/rover-git";
/// Where the repository's object store appears inside the container (read-only).
pub const SANDBOX_OBJECTS_DIR: &str = "/rover-git-objects";

/// Host paths to mount into one container (see the module doc).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SandboxGit {
    /// The scratch repository, mounted read-write at [`SANDBOX_GIT_DIR`].
    pub repo_dir: PathBuf,
    /// The repository's object store, mounted read-only at [`SANDBOX_OBJECTS_DIR`].
    pub objects_dir: PathBuf,
    /// A git file naming [`SANDBOX_GIT_DIR`], mounted read-only over `/workspace/.git`.
    pub gitfile: PathBuf,
}

impl SandboxGit {
    /// Removes the scratch repository and git file (best effort; links are not followed).
    pub fn discard(&self) {
        let _ = std::fs::remove_dir_all(&self.repo_dir);
        let _ = std::fs::remove_file(&self.gitfile);
    }
}

impl Workspace {
    /// Builds the scratch git of `worktree` for a container under `scratch_dir` (made if
    /// missing; an earlier scratch repository there is replaced).
    pub async fn sandbox_git(
        &self,
        worktree: &Path,
        scratch_dir: &Path,
    ) -> Result<SandboxGit, GitError> {
        let repo = self.repo_path().to_path_buf();
        let worktree = worktree.to_path_buf();
        let scratch = scratch_dir.to_path_buf();
        blocking(move || {
            let wg = locate(&repo, &worktree)?;
            build(&wg, &scratch)
        })
        .await?
    }
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> GitError + '_ {
    move |source| GitError::Io {
        path: path.to_path_buf(),
        source,
    }
}

fn write(path: &Path, text: &str) -> Result<(), GitError> {
    std::fs::write(path, text).map_err(io(path))
}

fn build(wg: &WorktreeGit, scratch: &Path) -> Result<SandboxGit, GitError> {
    let repo = open(wg)?;
    let repo_dir = scratch.join("repo");
    if std::fs::symlink_metadata(&repo_dir).is_ok() {
        std::fs::remove_dir_all(&repo_dir).map_err(io(&repo_dir))?;
    }
    for dir in ["refs/heads", "refs/tags", "objects/info", "objects/pack"] {
        let path = repo_dir.join(dir);
        std::fs::create_dir_all(&path).map_err(io(&path))?;
    }
    write(
        &repo_dir.join("objects/info/alternates"),
        &format!("{SANDBOX_OBJECTS_DIR}\n"),
    )?;
    write(&repo_dir.join("config"), &safe_config(&wg.common_dir)?)?;

    let head = repo
        .head()
        .map_err(GitError::git2("read HEAD", &wg.work_tree))?;
    let head_oid = head
        .peel_to_commit()
        .map_err(GitError::git2("read HEAD", &wg.work_tree))?
        .id();
    let branch = head.name().ok().filter(|n| n.starts_with("refs/heads/"));
    match branch {
        Some(name) => write(&repo_dir.join("HEAD"), &format!("ref: {name}\n"))?,
        None => write(&repo_dir.join("HEAD"), &format!("{head_oid}\n"))?,
    }
    write(
        &repo_dir.join("packed-refs"),
        &packed_refs(&repo, branch, head_oid),
    )?;

    // The index as the host left it, so unchanged files are not shown as changed.
    let index = wg.git_dir.join("index");
    if index.is_file() {
        let target = repo_dir.join("index");
        std::fs::copy(&index, &target).map_err(io(&target))?;
    }
    let shallow = wg.common_dir.join("shallow");
    if shallow.is_file() {
        let target = repo_dir.join("shallow");
        std::fs::copy(&shallow, &target).map_err(io(&target))?;
    }
    let gitfile = scratch.join("gitfile");
    write(&gitfile, &format!("gitdir: {SANDBOX_GIT_DIR}\n"))?;
    Ok(SandboxGit {
        repo_dir,
        objects_dir: wg.common_dir.join("objects"),
        gitfile,
    })
}

/// Every branch, remote-tracking branch and tag of the repository, with the task branch at
/// the worktree's HEAD, in `packed-refs` form (sorted by name).
fn packed_refs(repo: &Repository, branch: Option<&str>, head: git2::Oid) -> String {
    let mut refs: Vec<(String, git2::Oid)> = Vec::new();
    if let Ok(all) = repo.references() {
        for reference in all.flatten() {
            let Ok(name) = reference.name() else {
                continue;
            };
            if reference.kind() != Some(git2::ReferenceType::Direct)
                || !(name.starts_with("refs/heads/")
                    || name.starts_with("refs/remotes/")
                    || name.starts_with("refs/tags/"))
            {
                continue;
            }
            if let Some(oid) = reference.target() {
                refs.push((name.to_owned(), oid));
            }
        }
    }
    if let Some(name) = branch {
        refs.retain(|(n, _)| n != name);
        refs.push((name.to_owned(), head));
    }
    refs.sort();
    refs.dedup_by(|a, b| a.0 == b.0);
    let mut text = String::from("# pack-refs with: sorted \n");
    for (name, oid) in refs {
        let _ = writeln!(text, "{oid} {name}");
    }
    text
}

/// Only what git needs to read the repository: format version and extensions (the user's
/// config may hold remote URLs with credentials, hooks paths, fsmonitor commands).
fn safe_config(common_dir: &Path) -> Result<String, GitError> {
    let config = git2::Config::open(&common_dir.join("config"))
        .map_err(GitError::git2("read config", common_dir))?;
    let version = config.get_i32("core.repositoryformatversion").unwrap_or(0);
    let mut text = format!("[core]\n\trepositoryformatversion = {version}\n\tbare = false\n");
    let mut extensions = String::new();
    if let Ok(mut entries) = config.entries(Some("extensions\\..*")) {
        while let Some(Ok(entry)) = entries.next() {
            if let (Ok(name), Ok(value)) = (entry.name(), entry.value()) {
                if let Some(key) = name.strip_prefix("extensions.") {
                    // Per-worktree config would be read from the scratch dir: not carried.
                    if !key.eq_ignore_ascii_case("worktreeconfig") {
                        let _ = writeln!(extensions, "\t{key} = {value}");
                    }
                }
            }
        }
    }
    if !extensions.is_empty() {
        text.push_str("[extensions]\n");
        text.push_str(&extensions);
    }
    Ok(text)
}
