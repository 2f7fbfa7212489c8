//! Who a container runs as: never root. The owner of the worktree when that is an ordinary
//! user; when rover (and so the worktree) is root, a fixed unprivileged uid ([`SANDBOX_UID`]), to
//! which rover hands the worktree for the container's run and from which it takes the files
//! back afterwards, so they are the user's again when the host commits them.
//!
//! The hand-over walks the tree without following links (`lchown`), and skips the worktree's
//! `.git` file, which stays rover's (containers get it read-only). The way back is taken by every
//! host git access to a task worktree ([`super::boundary::locate`]): the owner is the owner of
//! the git dir rover registered for the worktree (no container ever sees it), and the worktree's
//! root directory is given back last, so a root directory owned by the owner means the whole
//! tree is back (a container cannot give anything to root).

use std::io;
use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};

/// The uid a container runs as when the worktree is root's.
pub const SANDBOX_UID: u32 = 10_001;
/// Its gid.
pub const SANDBOX_GID: u32 = 10_001;

/// Who a container over a worktree runs as.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RunAs {
    pub uid: u32,
    pub gid: u32,
    /// The worktree is root's: it is handed to [`SANDBOX_UID`] for the run and back after.
    pub hand_over: bool,
}

impl RunAs {
    /// `uid:gid`, as the engine takes it.
    pub fn user(&self) -> String {
        format!("{}:{}", self.uid, self.gid)
    }
}

/// The file whose owner is the worktree's owner: its `.git` file when it has one (a task
/// worktree), else the directory itself.
fn reference(worktree: &Path) -> PathBuf {
    let gitfile = worktree.join(".git");
    match std::fs::symlink_metadata(&gitfile) {
        Ok(meta) if meta.is_file() => gitfile,
        _ => worktree.to_path_buf(),
    }
}

/// The owner of `worktree` (see [`reference`]).
pub fn owner(worktree: &Path) -> io::Result<(u32, u32)> {
    let meta = std::fs::symlink_metadata(reference(worktree))?;
    Ok((meta.uid(), meta.gid()))
}

/// Who a container over `worktree` runs as (see the module doc).
pub fn run_as(worktree: &Path) -> io::Result<RunAs> {
    let (uid, gid) = owner(worktree)?;
    Ok(if uid == 0 {
        RunAs {
            uid: SANDBOX_UID,
            gid: SANDBOX_GID,
            hand_over: true,
        }
    } else {
        RunAs {
            uid,
            gid,
            hand_over: false,
        }
    })
}

/// Gives every entry under `dir` (itself included, links not followed, `skip` left alone) to
/// `uid:gid`; returns how many entries changed owner.
pub fn chown_tree(dir: &Path, uid: u32, gid: u32, skip: &[PathBuf]) -> io::Result<u64> {
    let mut changed = 0;
    let mut stack = vec![dir.to_path_buf()];
    while let Some(path) = stack.pop() {
        if skip.contains(&path) {
            continue;
        }
        let meta = match std::fs::symlink_metadata(&path) {
            Ok(meta) => meta,
            // Gone meanwhile: nothing to give.
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
            Err(e) => return Err(e),
        };
        if meta.uid() != uid || meta.gid() != gid {
            std::os::unix::fs::lchown(&path, Some(uid), Some(gid))?;
            changed += 1;
        }
        if meta.is_dir() {
            for entry in std::fs::read_dir(&path)? {
                stack.push(entry?.path());
            }
        }
    }
    Ok(changed)
}

/// Hands `worktree` to the container's user before its run, when it is root's: the tree but
/// its `.git` file.
pub fn hand_over(worktree: &Path, run_as: RunAs) -> io::Result<u64> {
    if !run_as.hand_over {
        return Ok(0);
    }
    chown_tree(worktree, run_as.uid, run_as.gid, &[worktree.join(".git")])
}

/// [`take_back`] for the owner of the worktree's `.git` file (rover's: never handed over); nothing
/// to do when `worktree` has no such file (not a worktree, or not made yet).
pub(crate) fn take_back_worktree(worktree: &Path) -> io::Result<u64> {
    match std::fs::symlink_metadata(worktree.join(".git")) {
        Ok(meta) if meta.is_file() => take_back(worktree, (meta.uid(), meta.gid())),
        _ => Ok(0),
    }
}

/// Takes `worktree` back for `owner` (`uid`, `gid`) after a container's run: every entry is
/// given back, files the container made included, the root directory last. Nothing to do when
/// the root directory is the owner's already.
pub(crate) fn take_back(worktree: &Path, owner: (u32, u32)) -> io::Result<u64> {
    let meta = std::fs::symlink_metadata(worktree)?;
    if (meta.uid(), meta.gid()) == owner {
        return Ok(0);
    }
    let mut changed = 0;
    for entry in std::fs::read_dir(worktree)? {
        changed += chown_tree(&entry?.path(), owner.0, owner.1, &[])?;
    }
    std::os::unix::fs::lchown(worktree, Some(owner.0), Some(owner.1))?;
    tracing::debug!(worktree = %worktree.display(), changed, "took the worktree back from the sandbox user");
    Ok(changed + 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_ordinary_owner_runs_as_itself_and_root_hands_over_to_the_sandbox_user() {
        let dir = tempfile::tempdir().expect("tempdir");
        let as_is = run_as(dir.path()).expect("run as");
        let me = nix::unistd::geteuid().as_raw();
        if me == 0 {
            assert_eq!(
                as_is,
                RunAs {
                    uid: SANDBOX_UID,
                    gid: SANDBOX_GID,
                    hand_over: true
                }
            );
            assert_eq!(as_is.user(), "10001:10001");
        } else {
            assert!(!as_is.hand_over);
            assert_eq!(as_is.uid, me);
        }
    }

    #[test]
    fn the_tree_goes_over_and_comes_back_without_following_links() {
        if !nix::unistd::geteuid().is_root() {
            return;
        }
        let dir = tempfile::tempdir().expect("tempdir");
        let worktree = dir.path().join("wt");
        std::fs::create_dir_all(worktree.join("src")).expect("mkdir");
        std::fs::write(worktree.join(".git"), "gitdir: x\n").expect("gitfile");
        std::fs::write(worktree.join("src/a.rs"), "a").expect("write");
        let outside = dir.path().join("outside.txt");
        std::fs::write(&outside, "host").expect("write");
        std::os::unix::fs::symlink(&outside, worktree.join("link")).expect("symlink");
        let run_as = run_as(&worktree).expect("run as");
        assert!(hand_over(&worktree, run_as).expect("over") >= 4);
        let uid = |p: &Path| std::fs::symlink_metadata(p).expect("stat").uid();
        assert_eq!(uid(&worktree.join("src/a.rs")), SANDBOX_UID);
        assert_eq!(uid(&worktree.join("link")), SANDBOX_UID);
        assert_eq!(
            uid(&worktree.join(".git")),
            0,
            "the .git file stays rover's"
        );
        assert_eq!(uid(&outside), 0, "a link's target is never touched");
        // A file the container made comes back too.
        std::fs::write(worktree.join("src/made.rs"), "b").expect("write");
        std::os::unix::fs::lchown(
            worktree.join("src/made.rs"),
            Some(SANDBOX_UID),
            Some(SANDBOX_GID),
        )
        .expect("chown");
        take_back(&worktree, (0, 0)).expect("back");
        for p in ["src/a.rs", "src/made.rs", "link", "src", ""] {
            assert_eq!(uid(&worktree.join(p)), 0, "{p}");
        }
    }
}
