//! `Workspace`: one repository, its default branch, task branches and their worktrees.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use git2::{BranchType, Repository, WorktreeAddOptions};

use super::error::GitError;
use super::hooks::HookMode;

/// Where a task branch starts when it does not exist yet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BranchBase {
    /// Fork from the repository's default branch (the remote's copy when there is one).
    DefaultBranch,
    /// Fork from another branch, e.g. the branch of the task this one depends on.
    Branch(String),
    /// The branch must already exist (iterating on a rover pull request); it is reused as is.
    Existing,
    /// Fork from this commit (a pushed sha, a pull request's head), fetched beforehand.
    Commit(String),
}

/// A worktree ready for an agent: where it is, which branch, and the commit changes are measured from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PreparedWorktree {
    /// The worktree directory.
    pub path: PathBuf,
    /// The branch checked out there (short name, e.g. `rover/3f2a91bc-add-login`).
    pub branch: String,
    /// The commit the branch forked from; diff summaries are taken against it.
    pub fork_point: String,
    /// Whether this call created the branch (false: it existed and was reused).
    pub created_branch: bool,
    /// Whether this call created the worktree (false: it existed and was reused).
    pub created_worktree: bool,
}

/// A git repository (the user's checkout) in which rover makes branches and worktrees.
///
/// All methods are async: git2 work runs on the blocking pool, the `git` CLI as a child process.
#[derive(Debug, Clone)]
pub struct Workspace {
    repo: PathBuf,
    remote: String,
    envs: Vec<(OsString, OsString)>,
    hook_mode: HookMode,
    commit_limits: super::limits::CommitLimits,
}

impl Workspace {
    /// A workspace over the repository at `repo` (its working directory or `.git`); checks it opens.
    pub async fn open(repo: impl Into<PathBuf>) -> Result<Self, GitError> {
        let repo = repo.into();
        let path = repo.clone();
        blocking(move || {
            Repository::open(&path)
                .map_err(GitError::git2("open", &path))
                .map(drop)
        })
        .await??;
        Ok(Self {
            repo,
            remote: "origin".to_string(),
            envs: Vec::new(),
            hook_mode: HookMode::Sandbox,
            commit_limits: super::limits::CommitLimits::default(),
        })
    }

    /// Uses `remote` instead of `origin` for the default branch, pushes and rebases.
    #[must_use]
    pub fn with_remote(mut self, remote: impl Into<String>) -> Self {
        self.remote = remote.into();
        self
    }

    /// Adds an environment variable to every `git` command this workspace runs (tests use it for
    /// a hermetic config: `GIT_CONFIG_GLOBAL=/dev/null`, `GIT_CONFIG_NOSYSTEM=1`).
    #[must_use]
    pub fn with_env(mut self, key: impl Into<OsString>, value: impl Into<OsString>) -> Self {
        self.envs.push((key.into(), value.into()));
        self
    }

    /// Which hooks may run on the host (default [`HookMode::Sandbox`]).
    #[must_use]
    pub fn with_hook_mode(mut self, mode: HookMode) -> Self {
        self.hook_mode = mode;
        self
    }

    /// Which hooks may run on the host.
    pub fn hook_mode(&self) -> HookMode {
        self.hook_mode
    }

    /// What a task may commit (default [`super::CommitLimits::default`]), checked by
    /// [`Workspace::stage_all`] before anything is staged.
    #[must_use]
    pub fn with_commit_limits(mut self, limits: super::limits::CommitLimits) -> Self {
        self.commit_limits = limits;
        self
    }

    /// What a task may commit.
    pub fn commit_limits(&self) -> super::limits::CommitLimits {
        self.commit_limits
    }

    /// The repository path this workspace was opened on.
    pub fn repo_path(&self) -> &Path {
        &self.repo
    }

    /// The remote name used for pushes (default `origin`).
    pub fn remote(&self) -> &str {
        &self.remote
    }

    pub(crate) fn envs(&self) -> &[(OsString, OsString)] {
        &self.envs
    }

    /// The default branch: `<remote>/HEAD`'s target, else a local `main` or `master`, else the
    /// branch checked out in the repository.
    pub async fn default_branch(&self) -> Result<String, GitError> {
        let path = self.repo.clone();
        let remote = self.remote.clone();
        blocking(move || {
            let repo = Repository::open(&path).map_err(GitError::git2("open", &path))?;
            default_branch_of(&repo, &remote, &path)
        })
        .await?
    }

    /// Whether a local branch `name` exists.
    pub async fn branch_exists(&self, name: &str) -> Result<bool, GitError> {
        let path = self.repo.clone();
        let name = name.to_string();
        blocking(move || {
            let repo = Repository::open(&path).map_err(GitError::git2("open", &path))?;
            let exists = repo.find_branch(&name, BranchType::Local).is_ok();
            Ok(exists)
        })
        .await?
    }

    /// The commit a local branch `name` points at (its full sha).
    pub async fn branch_head(&self, name: &str) -> Result<String, GitError> {
        let path = self.repo.clone();
        let name = name.to_string();
        blocking(move || {
            let repo = Repository::open(&path).map_err(GitError::git2("open", &path))?;
            let commit = repo
                .find_branch(&name, BranchType::Local)
                .and_then(|b| b.get().peel_to_commit())
                .map_err(GitError::git2("read the head of a branch", &path))?;
            Ok(commit.id().to_string())
        })
        .await?
    }

    /// Makes sure `branch` exists (created from `base` when missing) and is checked out in a
    /// worktree at `path` (created when missing, reused when it is already that branch's worktree).
    ///
    /// `path` should lie under rover's data dir, outside the user's checkout. Calling this twice
    /// with the same arguments is safe (restart): the second call reuses both.
    pub async fn prepare_worktree(
        &self,
        branch: &str,
        base: BranchBase,
        path: &Path,
    ) -> Result<PreparedWorktree, GitError> {
        let repo_path = self.repo.clone();
        let remote = self.remote.clone();
        let branch = branch.to_string();
        let path = path.to_path_buf();
        blocking(move || {
            let _guard = worktree_lock();
            prepare(&repo_path, &remote, &branch, &base, &path)
        })
        .await?
    }
}

/// libgit2's worktree bookkeeping is not safe against itself: concurrent adds on one repository
/// fail ("directory exists", "already checked out"). Adds and removals in this process take turns;
/// one daemon per project (the store lock) covers other processes.
pub(crate) fn worktree_lock() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    // A panic while holding it leaves nothing half-done that the next caller cannot handle.
    LOCK.lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Runs blocking git2 work off the async runtime.
pub(crate) async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> T + Send + 'static,
) -> Result<T, GitError> {
    tokio::task::spawn_blocking(work)
        .await
        .map_err(GitError::Join)
}

pub(crate) fn default_branch_of(
    repo: &Repository,
    remote: &str,
    path: &Path,
) -> Result<String, GitError> {
    let head_ref = format!("refs/remotes/{remote}/HEAD");
    if let Ok(reference) = repo.find_reference(&head_ref) {
        if let Ok(Some(target)) = reference.symbolic_target() {
            let prefix = format!("refs/remotes/{remote}/");
            if let Some(name) = target.strip_prefix(&prefix) {
                return Ok(name.to_string());
            }
        }
    }
    for name in ["main", "master"] {
        if repo.find_branch(name, BranchType::Local).is_ok() {
            return Ok(name.to_string());
        }
    }
    if let Ok(head) = repo.head() {
        if head.is_branch() {
            if let Ok(name) = head.shorthand() {
                return Ok(name.to_string());
            }
        }
    }
    Err(GitError::NoDefaultBranch {
        path: path.to_path_buf(),
    })
}

/// The commit a branch name points at: the local branch, else `<remote>/<name>`; for the
/// default branch the remote's copy is preferred (the user's local one may be stale).
pub(crate) fn resolve_branch<'r>(
    repo: &'r Repository,
    remote: &str,
    name: &str,
    prefer_remote: bool,
) -> Option<git2::Commit<'r>> {
    let local = format!("refs/heads/{name}");
    let tracking = format!("refs/remotes/{remote}/{name}");
    let order = if prefer_remote {
        [tracking, local]
    } else {
        [local, tracking]
    };
    order
        .iter()
        .find_map(|r| repo.find_reference(r).ok()?.peel_to_commit().ok())
}

fn prepare(
    repo_path: &Path,
    remote: &str,
    branch: &str,
    base: &BranchBase,
    path: &Path,
) -> Result<PreparedWorktree, GitError> {
    let repo = Repository::open(repo_path).map_err(GitError::git2("open", repo_path))?;
    if let Some(checkout) = repo.workdir().and_then(|w| w.canonicalize().ok()) {
        if canonical_target(path).starts_with(&checkout) {
            return Err(GitError::WorktreeInsideCheckout {
                path: path.to_path_buf(),
                checkout,
            });
        }
    }
    let existing = repo.find_branch(branch, BranchType::Local).ok();
    let created_branch = existing.is_none();
    let (local_branch, fork_point) = if let Some(existing) = existing {
        let fork = reused_fork_point(&repo, repo_path, remote, base, &existing)?;
        (existing, fork)
    } else {
        create_branch(&repo, repo_path, remote, branch, base)?
    };

    // A worktree a container had when rover stopped is its owner's again before git opens it
    // (git and libgit2 refuse a repository another user owns).
    super::owner::take_back_worktree(path).map_err(|source| GitError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    match find_worktree_at(&repo, path, branch)? {
        Registered::Complete => {
            return Ok(PreparedWorktree {
                path: path.to_path_buf(),
                branch: branch.to_string(),
                fork_point,
                created_branch,
                created_worktree: false,
            });
        }
        Registered::CheckoutCutOff { registration } => {
            // Nothing ran in it: it is handed out only once its checkout completed.
            tracing::warn!(path = %path.display(), "a worktree whose checkout was cut off is made again");
            for dir in [path, registration.as_path()] {
                std::fs::remove_dir_all(dir).map_err(|source| GitError::Io {
                    path: dir.to_path_buf(),
                    source,
                })?;
            }
        }
        Registered::No => {}
    }
    let name = worktree_name(branch);
    clear_path(&repo, path, &name)?;
    clear_registration(&repo, repo_path, &name)?;
    let mut opts = WorktreeAddOptions::new();
    opts.reference(Some(local_branch.get()));
    repo.worktree(&name, path, Some(&opts))
        .map_err(GitError::git2("add worktree", repo_path))?;
    Ok(PreparedWorktree {
        path: path.to_path_buf(),
        branch: branch.to_string(),
        fork_point,
        created_branch,
        created_worktree: true,
    })
}

/// The fork point of a reused branch: where it left its base (or the default branch).
fn reused_fork_point(
    repo: &Repository,
    repo_path: &Path,
    remote: &str,
    base: &BranchBase,
    existing: &git2::Branch<'_>,
) -> Result<String, GitError> {
    let tip = existing
        .get()
        .peel_to_commit()
        .map_err(GitError::git2("read branch", repo_path))?;
    let base_name = match base {
        BranchBase::Branch(name) => name.clone(),
        _ => default_branch_of(repo, remote, repo_path)?,
    };
    let fork = resolve_branch(
        repo,
        remote,
        &base_name,
        matches!(base, BranchBase::DefaultBranch | BranchBase::Existing),
    )
    .and_then(|b| repo.merge_base(tip.id(), b.id()).ok())
    .unwrap_or_else(|| tip.id());
    Ok(fork.to_string())
}

/// `branch`, created from `base`, and its fork point.
fn create_branch<'r>(
    repo: &'r Repository,
    repo_path: &Path,
    remote: &str,
    branch: &str,
    base: &BranchBase,
) -> Result<(git2::Branch<'r>, String), GitError> {
    let start = match base {
        BranchBase::Existing => {
            // Not local: a remote branch of that name (e.g. a PR branch) is checked out locally.
            resolve_branch(repo, remote, branch, true).ok_or_else(|| GitError::BranchMissing {
                branch: branch.to_string(),
                path: repo_path.to_path_buf(),
            })?
        }
        BranchBase::DefaultBranch => {
            let name = default_branch_of(repo, remote, repo_path)?;
            resolve_branch(repo, remote, &name, true).ok_or(GitError::BranchMissing {
                branch: name,
                path: repo_path.to_path_buf(),
            })?
        }
        BranchBase::Branch(name) => {
            resolve_branch(repo, remote, name, false).ok_or_else(|| GitError::BranchMissing {
                branch: name.clone(),
                path: repo_path.to_path_buf(),
            })?
        }
        BranchBase::Commit(sha) => git2::Oid::from_str(sha)
            .and_then(|oid| repo.find_commit(oid))
            .map_err(|_| GitError::BranchMissing {
                branch: sha.clone(),
                path: repo_path.to_path_buf(),
            })?,
    };
    let created = repo
        .branch(branch, &start, false)
        .map_err(GitError::git2("create branch", repo_path))?;
    let fork = if *base == BranchBase::Existing {
        // A PR branch made elsewhere: measure from where it left the default branch.
        let default = default_branch_of(repo, remote, repo_path)?;
        resolve_branch(repo, remote, &default, true)
            .and_then(|d| repo.merge_base(start.id(), d.id()).ok())
            .unwrap_or_else(|| start.id())
    } else {
        start.id()
    };
    Ok((created, fork.to_string()))
}

/// Make `path` free for the worktree `name`: the debris of a cut-off add of it is removed,
/// anything else there is refused; its parent is made.
fn clear_path(repo: &Repository, path: &Path, name: &str) -> Result<(), GitError> {
    if path.exists() && std::fs::read_dir(path).map_or(true, |mut d| d.next().is_some()) {
        // The debris of an add of this very worktree cut off by a crash (its gitfile names
        // this repository's registration of it, which does not validate): made again.
        if !interrupted_add(repo, path, name) {
            return Err(GitError::WorktreePathInUse {
                path: path.to_path_buf(),
            });
        }
        std::fs::remove_dir_all(path).map_err(|source| GitError::Io {
            path: path.to_path_buf(),
            source,
        })?;
    }
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).map_err(|source| GitError::Io {
            path: parent.to_path_buf(),
            source,
        })?;
    }
    // An empty directory left behind would make libgit2 refuse; it holds nothing.
    if path.exists() {
        let _ = std::fs::remove_dir(path);
    }
    Ok(())
}

/// Make way for the registration of the worktree `name`: a stale one is pruned, debris of a
/// cut-off add removed, a live one refused.
fn clear_registration(repo: &Repository, repo_path: &Path, name: &str) -> Result<(), GitError> {
    // libgit2 races on creating `.git/worktrees` when tasks start together; make it first.
    let registry = repo.commondir().join("worktrees");
    // A stale registration under the same name (directory deleted by hand) is pruned first.
    if let Ok(stale) = repo.find_worktree(name) {
        let mut opts = git2::WorktreePruneOptions::new();
        if stale.validate().is_err() {
            stale
                .prune(Some(&mut opts))
                .map_err(GitError::git2("prune worktree", repo_path))?;
        } else {
            return Err(GitError::WorktreePathInUse {
                path: stale.path().to_path_buf(),
            });
        }
    } else {
        // A registration directory git does not recognise (an add cut off before it wrote its
        // files) would make the add fail with "directory exists".
        let debris = registry.join(name);
        if debris.is_dir() {
            std::fs::remove_dir_all(&debris).map_err(|source| GitError::Io {
                path: debris.clone(),
                source,
            })?;
        }
    }
    std::fs::create_dir_all(&registry).map_err(|source| GitError::Io {
        path: registry,
        source,
    })?;
    Ok(())
}

/// Whether `path` holds a worktree add of `name` that a crash cut off: its `.git` file points
/// at this repository's registration `worktrees/<name>`, and that registration is missing or
/// does not validate (an add that completed would have been found by `find_worktree_at`).
fn interrupted_add(repo: &Repository, path: &Path, name: &str) -> bool {
    let Ok(gitfile) = std::fs::read_to_string(path.join(".git")) else {
        return false;
    };
    let Some(target) = gitfile.trim().strip_prefix("gitdir:").map(str::trim) else {
        return false;
    };
    let registration = repo.commondir().join("worktrees").join(name);
    let same = Path::new(target) == registration
        || matches!(
            (Path::new(target).canonicalize(), registration.canonicalize()),
            (Ok(a), Ok(b)) if a == b
        );
    same && repo
        .find_worktree(name)
        .map_or(true, |w| w.validate().is_err())
}

/// `path` made absolute through its nearest existing ancestor (it may not exist yet).
fn canonical_target(path: &Path) -> PathBuf {
    let mut missing = Vec::new();
    let mut current = path.to_path_buf();
    loop {
        if let Ok(found) = current.canonicalize() {
            return missing.iter().rev().fold(found, |acc, part| acc.join(part));
        }
        match (
            current.file_name().map(std::ffi::OsStr::to_os_string),
            current.parent(),
        ) {
            (Some(name), Some(parent)) => {
                missing.push(name);
                current = parent.to_path_buf();
            }
            _ => return path.to_path_buf(),
        }
    }
}

/// The registered worktree name for a branch: one path component.
fn worktree_name(branch: &str) -> String {
    branch.replace('/', "-")
}

/// The path of an existing, valid worktree at `path` that has `branch` checked out.
/// What is registered at a worktree path.
enum Registered {
    No,
    /// A worktree of the branch, checked out: reused as it is.
    Complete,
    /// A worktree of the branch whose checkout a crash cut off (libgit2 writes the worktree's
    /// index last, once every file is out): its files may be missing, so it is made again.
    CheckoutCutOff {
        registration: PathBuf,
    },
}

fn find_worktree_at(repo: &Repository, path: &Path, branch: &str) -> Result<Registered, GitError> {
    let Ok(wanted) = path.canonicalize() else {
        return Ok(Registered::No);
    };
    let names = repo
        .worktrees()
        .map_err(GitError::git2("list worktrees", path))?;
    for name in names.iter().flatten().flatten() {
        let Ok(wt) = repo.find_worktree(name) else {
            continue;
        };
        if wt.validate().is_err()
            || wt.path().canonicalize().ok().as_deref() != Some(wanted.as_path())
        {
            continue;
        }
        let Ok(wt_repo) = Repository::open_from_worktree(&wt) else {
            continue;
        };
        let on_branch = wt_repo
            .head()
            .ok()
            .and_then(|h| h.shorthand().ok().map(ToString::to_string))
            .is_some_and(|h| h == branch);
        if !on_branch {
            return Err(GitError::WorktreePathInUse {
                path: path.to_path_buf(),
            });
        }
        if wt_repo.path().join("index").is_file() {
            return Ok(Registered::Complete);
        }
        return Ok(Registered::CheckoutCutOff {
            registration: wt_repo.path().to_path_buf(),
        });
    }
    Ok(Registered::No)
}
