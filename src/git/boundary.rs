//! The host side of the trust boundary for git: every host git call on a task worktree uses the
//! git dir rover registered for it (never the worktree's own `.git`, which the sandbox could
//! have replaced), and switches off what a repository could make git execute.
//!
//! A worktree's `.git` is a file naming `<repo>/.git/worktrees/<name>`. rover finds that
//! directory through the user's repository (its worktree registry), not through the file, and
//! after every container it checks the file still names it ([`Workspace::verify_worktree`]).

use std::path::{Path, PathBuf};

use git2::Repository;

use super::error::GitError;
use super::workspace::{blocking, Workspace};

/// Where hooks are looked up when none may run: git finds no executable under it.
pub const NO_HOOKS: &str = "/dev/null";

/// A task worktree and the git metadata rover owns for it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorktreeGit {
    /// The worktree directory (canonical).
    pub work_tree: PathBuf,
    /// Its registered git dir, `<common>/worktrees/<name>` (canonical).
    pub git_dir: PathBuf,
    /// The repository's git dir (`<repo>/.git`, canonical).
    pub common_dir: PathBuf,
    /// `-c` pairs switching off the filter, diff and merge drivers the user's configuration
    /// defines: git would run them on worktree content (an index refresh re-cleans files), and
    /// the worktree picks which applies (`.gitattributes`) and may hold the scripts they call.
    pub drivers_off: Vec<String>,
}

impl WorktreeGit {
    /// The exact content rover expects in `<work_tree>/.git`.
    pub fn gitfile_line(&self) -> String {
        format!("gitdir: {}", self.git_dir.display())
    }
}

/// `-c` settings every host git call carries: nothing configured for the repository can make
/// git run a program (fsmonitor, hooks outside `hooks`, submodule recursion into directories a
/// sandbox wrote, pagers, editors, ext:: transports, automatic gc and its hook).
pub fn hardening(hooks: &Path) -> Vec<String> {
    let mut args = Vec::new();
    for (key, value) in [
        ("core.fsmonitor", "false"),
        ("core.hooksPath", &*hooks.to_string_lossy()),
        ("core.pager", "cat"),
        ("core.editor", "true"),
        ("sequence.editor", "true"),
        ("submodule.recurse", "false"),
        ("diff.ignoreSubmodules", "all"),
        ("status.submoduleSummary", "false"),
        ("fetch.recurseSubmodules", "false"),
        ("push.recurseSubmodules", "no"),
        ("protocol.ext.allow", "never"),
        ("gc.auto", "0"),
        ("maintenance.auto", "false"),
    ] {
        args.push("-c".to_owned());
        args.push(format!("{key}={value}"));
    }
    args
}

/// `-c` pairs that switch off every configured filter (`clean`, `smudge`, `process`), diff
/// (`textconv`, `command`) and merge (`driver`) driver: empty commands are no commands to git;
/// a merge driver becomes `false`, so a file it would merge is a conflict rover reports.
pub(crate) fn drivers_off(config: &git2::Config) -> Vec<String> {
    let mut args = Vec::new();
    let Ok(mut entries) = config.entries(Some(
        r"^(filter|diff|merge)\..+\.(clean|smudge|process|required|textconv|command|driver)$",
    )) else {
        return args;
    };
    let mut keys = Vec::new();
    while let Some(Ok(entry)) = entries.next() {
        if let Ok(name) = entry.name() {
            keys.push(name.to_owned());
        }
    }
    keys.sort();
    keys.dedup();
    for key in keys {
        let value = if key.ends_with(".driver") || key.ends_with(".required") {
            "false"
        } else {
            ""
        };
        args.push("-c".to_owned());
        args.push(format!("{key}={value}"));
    }
    args
}

/// `path` as a plain string without a trailing slash (libgit2 reports dirs with one).
fn trimmed(path: &Path) -> PathBuf {
    let text = path.to_string_lossy();
    let text = text.trim_end_matches('/');
    PathBuf::from(if text.is_empty() { "/" } else { text })
}

/// Finds the registered worktree at `worktree` in the repository at `repo_path`.
pub(crate) fn locate(repo_path: &Path, worktree: &Path) -> Result<WorktreeGit, GitError> {
    let repo = Repository::open(repo_path).map_err(GitError::git2("open", repo_path))?;
    let wanted = worktree.canonicalize().map_err(|source| GitError::Io {
        path: worktree.to_path_buf(),
        source,
    })?;
    let common_dir = trimmed(repo.commondir());
    let common_dir = common_dir.canonicalize().unwrap_or(common_dir);
    let names = repo
        .worktrees()
        .map_err(GitError::git2("list worktrees", repo_path))?;
    for name in names.iter().flatten().flatten() {
        let Ok(wt) = repo.find_worktree(name) else {
            continue;
        };
        if wt.path().canonicalize().ok().as_deref() != Some(wanted.as_path()) {
            continue;
        }
        let git_dir = common_dir.join("worktrees").join(name);
        let Ok(registered) = std::fs::metadata(&git_dir) else {
            continue;
        };
        if !registered.is_dir() {
            continue;
        }
        // A container may have had the worktree (see `owner`): it is the owner's again before
        // any host git reads it.
        {
            use std::os::unix::fs::MetadataExt as _;
            super::owner::take_back(&wanted, (registered.uid(), registered.gid())).map_err(
                |source| GitError::Io {
                    path: wanted.clone(),
                    source,
                },
            )?;
        }
        let drivers_off = repo.config().map(|c| drivers_off(&c)).unwrap_or_default();
        return Ok(WorktreeGit {
            work_tree: wanted,
            git_dir,
            common_dir,
            drivers_off,
        });
    }
    Err(GitError::NotAWorktree {
        path: worktree.to_path_buf(),
        repo: repo_path.to_path_buf(),
    })
}

/// Checks that `<work_tree>/.git` is still the plain file rover's git made, naming the
/// registered git dir. Reads at most a few hundred bytes and follows no link.
pub(crate) fn verify(wg: &WorktreeGit) -> Result<(), GitError> {
    let gitfile = wg.work_tree.join(".git");
    let tampered = |what: String| GitError::Tampered {
        worktree: wg.work_tree.clone(),
        what,
    };
    let meta = std::fs::symlink_metadata(&gitfile)
        .map_err(|e| tampered(format!("`.git` cannot be read any more ({e})")))?;
    if meta.file_type().is_symlink() {
        return Err(tampered(
            "`.git` was replaced by a symbolic link".to_owned(),
        ));
    }
    if meta.is_dir() {
        return Err(tampered(
            "`.git` was replaced by a directory (a repository of the sandbox's own)".to_owned(),
        ));
    }
    if !meta.is_file() || meta.len() > 4096 {
        return Err(tampered("`.git` is no longer rover's git file".to_owned()));
    }
    let text = std::fs::read_to_string(&gitfile)
        .map_err(|e| tampered(format!("`.git` cannot be read any more ({e})")))?;
    let named = text
        .trim_end_matches(['\n', '\r'])
        .strip_prefix("gitdir: ")
        .map(|p| trimmed(Path::new(p)));
    let expected = trimmed(&wg.git_dir);
    let same = named.as_ref().is_some_and(|p| {
        *p == expected || p.canonicalize().ok().as_deref() == Some(expected.as_path())
    });
    if !same {
        return Err(tampered(format!(
            "`.git` now says `{}` instead of naming rover's git dir {}",
            text.lines().next().unwrap_or_default(),
            expected.display()
        )));
    }
    Ok(())
}

/// The repository of a task worktree, opened through its registered git dir with the worktree
/// as working directory (never through the worktree's `.git`).
pub(crate) fn open(wg: &WorktreeGit) -> Result<Repository, GitError> {
    let repo = Repository::open(&wg.git_dir).map_err(GitError::git2("open", &wg.git_dir))?;
    repo.set_workdir(&wg.work_tree, false)
        .map_err(GitError::git2("set the worktree", &wg.work_tree))?;
    Ok(repo)
}

impl Workspace {
    /// The registered git metadata of the task worktree at `worktree`.
    pub async fn worktree_git(&self, worktree: &Path) -> Result<WorktreeGit, GitError> {
        let repo = self.repo_path().to_path_buf();
        let worktree = worktree.to_path_buf();
        blocking(move || locate(&repo, &worktree)).await?
    }

    /// Checks the worktree's `.git` is still rover's: [`GitError::Tampered`] when a sandbox
    /// replaced or rewrote it (nothing of such a worktree may be committed).
    pub async fn verify_worktree(&self, worktree: &Path) -> Result<WorktreeGit, GitError> {
        let wg = self.worktree_git(worktree).await?;
        let checked = wg.clone();
        blocking(move || verify(&checked)).await??;
        Ok(wg)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hardening_names_the_hooks_dir_and_turns_off_fsmonitor() {
        let args = hardening(Path::new(NO_HOOKS));
        assert!(args.contains(&"core.hooksPath=/dev/null".to_owned()));
        assert!(args.contains(&"core.fsmonitor=false".to_owned()));
        assert_eq!(args.len() % 2, 0);
        assert!(args.chunks(2).all(|pair| pair[0] == "-c"));
    }

    #[test]
    fn trailing_slashes_are_trimmed() {
        assert_eq!(trimmed(Path::new("/a/b/")), PathBuf::from("/a/b"));
        assert_eq!(trimmed(Path::new("/")), PathBuf::from("/"));
    }
}
