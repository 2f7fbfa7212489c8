//! The git a sandbox sees: a scratch repository of its own, never the user's git metadata, and
//! only the objects its task needs.
//!
//! Inside a container `/workspace/.git` is a read-only file naming [`SANDBOX_GIT_DIR`], a
//! scratch repository rover builds for that container: the task branch (and the remote-tracking
//! branches its history contains), packed; a copy of the worktree's index; a sanitized config;
//! and objects borrowed read-only through `objects/info/alternates` from a pack of exactly what
//! the task's `HEAD` reaches (its base, the commits of the tasks it depends on, its own), plus
//! the blobs the index holds beyond it. Objects the task cannot reach (a `git stash`, unpushed
//! branches, other tasks' commits, dangling objects) are not there to be read. `git status`,
//! `diff`, `log`, `add`, even `commit` work inside, and change only the scratch repository.
//! The worktree's own git dir, the repository's config, refs and hooks are never mounted, so
//! nothing the sandbox does can reach a later host git command (`boundary` checks the
//! worktree's `.git` after every container). The scratch repository is thrown away after the
//! container.
//!
//! The packs are cached per `HEAD` under a directory of rover's (`objects_cache`), and a new
//! entry is built on top of the newest entry of an ancestor (its packs hard-linked, only the new
//! objects packed), so a chain of tasks on a growing main packs each object once.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use git2::Repository;

use super::boundary::{open, WorktreeGit};
use super::command::{run_git_input, Target};
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
    /// The objects `HEAD` reaches (a cache entry of packs), mounted read-only at
    /// [`SANDBOX_OBJECTS_DIR`].
    pub objects_dir: PathBuf,
    /// A git file naming [`SANDBOX_GIT_DIR`], mounted read-only over `/workspace/.git`.
    pub gitfile: PathBuf,
}

impl SandboxGit {
    /// Removes the scratch repository and git file (best effort; links are not followed). The
    /// shared object cache stays.
    pub fn discard(&self) {
        let _ = std::fs::remove_dir_all(&self.repo_dir);
        let _ = std::fs::remove_file(&self.gitfile);
    }
}

impl Workspace {
    /// Builds the scratch git of `worktree` for a container under `scratch_dir` (made if
    /// missing; an earlier scratch repository there is replaced), its objects from the pack
    /// cache in `objects_cache` (made if missing).
    pub async fn sandbox_git(
        &self,
        worktree: &Path,
        scratch_dir: &Path,
        objects_cache: &Path,
    ) -> Result<SandboxGit, GitError> {
        let wg = self.verify_worktree(worktree).await?;
        let head = {
            let wg = wg.clone();
            blocking(move || head_commit(&wg)).await??
        };
        let objects_dir = self.objects_for(&wg, head, objects_cache).await?;
        let scratch = scratch_dir.to_path_buf();
        blocking(move || build(&wg, &scratch, head, objects_dir)).await?
    }

    /// The cache entry holding every object `head` reaches: found, or packed now.
    async fn objects_for(
        &self,
        wg: &WorktreeGit,
        head: git2::Oid,
        cache: &Path,
    ) -> Result<PathBuf, GitError> {
        let entry = cache.join(head.to_string());
        if entry.join("pack").is_dir() {
            touch(&entry);
            return Ok(entry);
        }
        std::fs::create_dir_all(cache).map_err(io(cache))?;
        let base = {
            let wg = wg.clone();
            let cache = cache.to_path_buf();
            blocking(move || ancestor_entry(&wg, head, &cache)).await??
        };
        let tmp = cache.join(format!(
            ".building-{head}-{}",
            uuid::Uuid::new_v4().simple()
        ));
        let pack_dir = tmp.join("pack");
        std::fs::create_dir_all(&pack_dir).map_err(io(&pack_dir))?;
        let built = async {
            let mut revs = format!("{head}\n");
            if let Some((oid, dir)) = &base {
                link_packs(&dir.join("pack"), &pack_dir)?;
                let _ = writeln!(revs, "^{oid}");
            }
            let prefix = pack_dir.join("pack");
            let target = Target::Worktree {
                wg,
                hooks: Path::new(super::NO_HOOKS),
            };
            let prefix = prefix.display().to_string();
            run_git_input(
                target,
                &[
                    "pack-objects",
                    "--revs",
                    "--delta-base-offset",
                    "-q",
                    &prefix,
                ],
                self.envs(),
                revs.as_bytes(),
            )
            .await?;
            Ok::<(), GitError>(())
        }
        .await;
        if let Err(e) = built {
            let _ = std::fs::remove_dir_all(&tmp);
            return Err(e);
        }
        match std::fs::rename(&tmp, &entry) {
            Ok(()) => {}
            // Another container packed the same head meanwhile: theirs serves.
            Err(_) if entry.join("pack").is_dir() => {
                let _ = std::fs::remove_dir_all(&tmp);
            }
            Err(e) => {
                let _ = std::fs::remove_dir_all(&tmp);
                return Err(io(&entry)(e));
            }
        }
        prune(cache, &entry);
        Ok(entry)
    }
}

/// How long a cache entry nobody used is kept.
const CACHE_KEEP: std::time::Duration = std::time::Duration::from_secs(3 * 24 * 3600);
/// How many entries are looked at for an ancestor to build on.
const ANCESTOR_CANDIDATES: usize = 16;

fn head_commit(wg: &WorktreeGit) -> Result<git2::Oid, GitError> {
    let repo = open(wg)?;
    let head = repo
        .head()
        .and_then(|h| h.peel_to_commit())
        .map_err(GitError::git2("read HEAD", &wg.work_tree))?;
    Ok(head.id())
}

/// Marks a cache entry used now (its modification time), so pruning keeps it.
fn touch(entry: &Path) {
    let _ = std::fs::File::open(entry).and_then(|f| f.set_modified(std::time::SystemTime::now()));
}

/// The cache entries, newest first: `(commit, dir)`.
fn entries(cache: &Path) -> Vec<(git2::Oid, PathBuf, std::time::SystemTime)> {
    let Ok(read) = std::fs::read_dir(cache) else {
        return Vec::new();
    };
    let mut found: Vec<_> = read
        .flatten()
        .filter_map(|e| {
            let oid = git2::Oid::from_str(e.file_name().to_str()?).ok()?;
            let modified = e.metadata().ok()?.modified().ok()?;
            Some((oid, e.path(), modified))
        })
        .collect();
    found.sort_by_key(|e| std::cmp::Reverse(e.2));
    found
}

/// The newest cache entry whose commit `head` descends from.
fn ancestor_entry(
    wg: &WorktreeGit,
    head: git2::Oid,
    cache: &Path,
) -> Result<Option<(git2::Oid, PathBuf)>, GitError> {
    let repo = open(wg)?;
    Ok(entries(cache)
        .into_iter()
        .take(ANCESTOR_CANDIDATES)
        .find(|(oid, _, _)| repo.graph_descendant_of(head, *oid).unwrap_or(false))
        .map(|(oid, dir, _)| (oid, dir)))
}

/// Hard-links (or copies, across file systems) the pack files of `from` into `to`.
fn link_packs(from: &Path, to: &Path) -> Result<(), GitError> {
    for file in std::fs::read_dir(from).map_err(io(from))?.flatten() {
        let target = to.join(file.file_name());
        if std::fs::hard_link(file.path(), &target).is_err() {
            std::fs::copy(file.path(), &target).map_err(io(&target))?;
        }
    }
    Ok(())
}

/// Removes the entries no container used for [`CACHE_KEEP`], and unfinished builds as old,
/// never `keep`.
fn prune(cache: &Path, keep: &Path) {
    let Ok(read) = std::fs::read_dir(cache) else {
        return;
    };
    let now = std::time::SystemTime::now();
    for entry in read.flatten() {
        let path = entry.path();
        let old = entry
            .metadata()
            .and_then(|m| m.modified())
            .is_ok_and(|t| now.duration_since(t).unwrap_or_default() > CACHE_KEEP);
        if old && path != keep {
            let _ = std::fs::remove_dir_all(&path);
        }
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

fn build(
    wg: &WorktreeGit,
    scratch: &Path,
    head_oid: git2::Oid,
    objects_dir: PathBuf,
) -> Result<SandboxGit, GitError> {
    let repo = open(wg)?;
    let repo_dir = scratch.join("repo");
    if std::fs::symlink_metadata(&repo_dir).is_ok() {
        std::fs::remove_dir_all(&repo_dir).map_err(io(&repo_dir))?;
    }
    for dir in ["refs/heads", "refs/tags", "objects/info", "objects/pack"] {
        let path = repo_dir.join(dir);
        std::fs::create_dir_all(&path).map_err(io(&path))?;
    }
    write(&repo_dir.join("config"), &safe_config(&wg.common_dir)?)?;

    let head = repo
        .head()
        .map_err(GitError::git2("read HEAD", &wg.work_tree))?;
    let branch = head.name().ok().filter(|n| n.starts_with("refs/heads/"));
    match branch {
        Some(name) => write(&repo_dir.join("HEAD"), &format!("ref: {name}\n"))?,
        None => write(&repo_dir.join("HEAD"), &format!("{head_oid}\n"))?,
    }
    write(
        &repo_dir.join("packed-refs"),
        &packed_refs(&repo, branch, head_oid),
    )?;

    // The index as the host left it, so unchanged files are not shown as changed; the blobs it
    // stages beyond `HEAD` (the host staged the worktree before the hooks) go in as loose
    // objects of the scratch repository: they are the worktree's own files.
    let index = wg.git_dir.join("index");
    if index.is_file() {
        let target = repo_dir.join("index");
        std::fs::copy(&index, &target).map_err(io(&target))?;
        copy_staged_blobs(&repo, head_oid, &repo_dir)?;
    }
    write(
        &repo_dir.join("objects/info/alternates"),
        &format!("{SANDBOX_OBJECTS_DIR}\n"),
    )?;
    let shallow = wg.common_dir.join("shallow");
    if shallow.is_file() {
        let target = repo_dir.join("shallow");
        std::fs::copy(&shallow, &target).map_err(io(&target))?;
    }
    let gitfile = scratch.join("gitfile");
    write(&gitfile, &format!("gitdir: {SANDBOX_GIT_DIR}\n"))?;
    Ok(SandboxGit {
        repo_dir,
        objects_dir,
        gitfile,
    })
}

/// Writes into the scratch repository's own object store every blob the worktree's index names
/// that `HEAD`'s tree does not hold at the same path.
fn copy_staged_blobs(repo: &Repository, head: git2::Oid, repo_dir: &Path) -> Result<(), GitError> {
    let index = repo
        .index()
        .map_err(GitError::git2("read the index", repo_dir))?;
    let tree = repo
        .find_commit(head)
        .and_then(|c| c.tree())
        .map_err(GitError::git2("read HEAD's tree", repo_dir))?;
    let staged: Vec<git2::Oid> = index
        .iter()
        .filter(|e| e.mode != 0o160_000)
        .filter(|e| {
            let path = Path::new(std::str::from_utf8(&e.path).unwrap_or_default());
            tree.get_path(path).map_or(true, |t| t.id() != e.id)
        })
        .map(|e| e.id)
        .collect();
    if staged.is_empty() {
        return Ok(());
    }
    let source = repo
        .odb()
        .map_err(GitError::git2("open the object store", repo_dir))?;
    let scratch = Repository::open(repo_dir).map_err(GitError::git2(
        "open the sandbox's scratch repository",
        repo_dir,
    ))?;
    let target = scratch
        .odb()
        .map_err(GitError::git2("open the sandbox's object store", repo_dir))?;
    for oid in staged {
        // A blob the index names but the store lacks: git inside shows it as missing.
        let Ok(object) = source.read(oid) else {
            continue;
        };
        target
            .write(object.kind(), object.data())
            .map_err(GitError::git2("copy a staged blob", repo_dir))?;
    }
    Ok(())
}

/// The task branch at the worktree's `HEAD`, and the remote-tracking branches `HEAD`'s history
/// contains (their objects are in the pack), in `packed-refs` form (sorted by name). Other
/// branches and tags are left out: their objects are not there.
fn packed_refs(repo: &Repository, branch: Option<&str>, head: git2::Oid) -> String {
    let mut refs: Vec<(String, git2::Oid)> = Vec::new();
    if let Ok(all) = repo.references_glob("refs/remotes/*") {
        for reference in all.flatten().take(64) {
            let (Ok(name), Some(oid)) = (reference.name(), reference.target()) else {
                continue;
            };
            if oid == head || repo.graph_descendant_of(head, oid).unwrap_or(false) {
                refs.push((name.to_owned(), oid));
            }
        }
    }
    if let Some(name) = branch {
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
