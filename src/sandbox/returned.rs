//! Taking a shipped workspace back: the tar of a container's `/workspace` is untrusted. Every
//! entry is checked and written into a staging directory next to the worktree; only when all
//! of them pass does the staging directory replace the worktree (rover's `.git` file kept), so
//! a refused archive changes nothing.
//!
//! Refused, naming the entry: a path that is absolute or climbs out (`..`); a path an earlier
//! entry made (an archive names each path once: no entry replaces what an earlier one made, so
//! no directory becomes a link once files are under it; a directory an earlier entry made as
//! the parent of its path may be named once more, by a directory entry, and by nothing else);
//! a path under a link or a file an earlier entry made; a hard link to anything but a regular
//! file the archive made earlier under directories it made (not a link, a directory, a later
//! name, nor a path under a link); a device, a fifo, a sparse file or any other entry type; a
//! file larger than a sandbox may write (`autopilot.sandbox.fileSizeLimitMb`); more than
//! [`MAX_ENTRIES`] entries; and the worktree's `.git` replaced or changed (or anything under
//! it): the worktree's git metadata is never taken from a sandbox (rover's own git file,
//! shipped in, may come back unchanged and is skipped). A repository nested deeper
//! (`sub/.git`) comes back as files, as it would on a mount, and the commit step leaves it
//! out. The archive's size is capped while it is fetched (`autopilot.sandbox.workspaceLimitMb`).
//!
//! What each entry may be is decided from what the archive made so far, kept in memory (a
//! directory, a file or a link at each path), never from the disk. The disk is the second
//! wall: every entry is written through directory fds, each component of its path opened from
//! its parent's fd with `O_NOFOLLOW | O_DIRECTORY` (`openat`), so no path string is ever
//! resolved through what an entry made; a file is created with `O_CREAT | O_EXCL |
//! O_NOFOLLOW`, a directory with `mkdirat`, a link with `symlinkat`, and a hard link is a copy
//! read from its source opened with `O_NOFOLLOW` from its own directory's fd. Modes (only
//! permission bits are kept) and ownership (the worktree owner's) are set on the open fd
//! (`fchmod`, `fchown`; a link's owner with `AT_SYMLINK_NOFOLLOW`). Anything on the disk that
//! is not what the archive made there (a link, a name already taken) stops the apply with the
//! entry named. Symbolic links are created as links, whatever they point at (as on a mount:
//! git records a link's target as text), and never followed; no filter or hook runs.

use std::collections::HashMap;
use std::ffi::OsStr;
use std::io::{self, Read as _};
use std::os::fd::{AsFd as _, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt as _;
use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};

use rustix::fs::{AtFlags, FileType, Gid, Mode, OFlags, Uid};

use super::error::SandboxError;
use super::spec::{SandboxSpec, WORKSPACE_MOUNT};
use super::Sandbox;

/// Most entries a returned workspace may hold.
pub const MAX_ENTRIES: u64 = 1_000_000;

/// What a returned archive must keep to.
#[derive(Debug, Clone)]
pub struct Rules {
    /// The largest file, in bytes.
    pub file_bytes: u64,
    /// Most entries.
    pub max_entries: u64,
    /// The `.git` rover shipped (its git file): the one `.git` that may come back, unchanged.
    pub gitfile: Option<Vec<u8>>,
}

/// What was applied.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Applied {
    /// Entries written (directories, files, links).
    pub entries: u64,
    /// File bytes written.
    pub bytes: u64,
    /// Bytes of the archive as the engine sent it.
    pub archive_bytes: u64,
}

fn refuse(entry: &str, reason: impl Into<String>) -> SandboxError {
    SandboxError::Returned {
        entry: entry.to_owned(),
        reason: reason.into(),
    }
}

fn io_err(path: &Path) -> impl FnOnce(io::Error) -> SandboxError + '_ {
    move |source| SandboxError::File {
        path: path.to_path_buf(),
        source,
    }
}

/// A path next to `worktree` (same directory, so a rename works): `.<name>.<what>`.
pub fn sibling(worktree: &Path, what: &str) -> PathBuf {
    let name = worktree
        .file_name()
        .map_or_else(|| "worktree".into(), |n| n.to_string_lossy().into_owned());
    worktree.with_file_name(format!(".{name}.{what}"))
}

/// Takes `/workspace` back from the exited container `id` of the shipped `spec` and applies it
/// to `spec.worktree` (see the module doc); `None` for a mounted spec (nothing to take back).
pub async fn take_back(
    sandbox: &dyn Sandbox,
    id: &str,
    spec: &SandboxSpec,
) -> Result<Option<Applied>, SandboxError> {
    if !spec.shipped() {
        return Ok(None);
    }
    // The git file first: a failure here leaves nothing behind (no archive beside the worktree).
    let gitfile_target = format!("{WORKSPACE_MOUNT}/.git");
    let gitfile = match spec
        .extra_mounts
        .iter()
        .find(|m| m.target == gitfile_target)
    {
        Some(m) => Some(tokio::fs::read(&m.host).await.map_err(io_err(&m.host))?),
        None => None,
    };
    let archive = sibling(&spec.worktree, "rover-returned.tar");
    let fetched = sandbox
        .fetch_workspace(id, &archive, spec.workspace_limit)
        .await;
    let archive_bytes = match fetched {
        Ok(n) => n,
        Err(SandboxError::Returned { entry, reason }) => {
            // Past the limit: the entry that was coming when it was passed, from what came.
            let path = archive.clone();
            let last = tokio::task::spawn_blocking(move || last_entry(&path))
                .await
                .ok()
                .flatten();
            let _ = tokio::fs::remove_file(&archive).await;
            return Err(SandboxError::Returned {
                entry: last.unwrap_or(entry),
                reason,
            });
        }
        Err(e) => {
            let _ = tokio::fs::remove_file(&archive).await;
            return Err(e);
        }
    };
    let rules = Rules {
        file_bytes: u64::try_from(spec.limits.file_bytes).unwrap_or(u64::MAX),
        max_entries: MAX_ENTRIES,
        gitfile,
    };
    let worktree = spec.worktree.clone();
    let path = archive.clone();
    let applied = tokio::task::spawn_blocking(move || apply(&path, &worktree, &rules))
        .await
        .map_err(|e| SandboxError::File {
            path: archive.clone(),
            source: io::Error::other(e),
        });
    let _ = tokio::fs::remove_file(&archive).await;
    let mut applied = applied??;
    applied.archive_bytes = archive_bytes;
    Ok(Some(applied))
}

/// The name of the last entry whose header a (cut) archive holds.
fn last_entry(archive: &Path) -> Option<String> {
    let file = std::fs::File::open(archive).ok()?;
    let mut tar = tar::Archive::new(io::BufReader::new(file));
    let mut last = None;
    for entry in tar.entries().ok()? {
        let Ok(entry) = entry else { break };
        last = Some(String::from_utf8_lossy(&entry.path_bytes()).into_owned());
    }
    last
}

/// Checks the tar at `archive` (entries `workspace/...`) and makes `worktree` hold exactly its
/// content, `worktree/.git` kept (blocking). On any refusal the worktree is left as it was.
pub fn apply(archive: &Path, worktree: &Path, rules: &Rules) -> Result<Applied, SandboxError> {
    let staging = sibling(worktree, "rover-returned");
    let old = sibling(worktree, "rover-old");
    // A crash between the two renames of an earlier apply: the worktree is the old one.
    if std::fs::symlink_metadata(worktree).is_err() && std::fs::symlink_metadata(&old).is_ok() {
        std::fs::rename(&old, worktree).map_err(io_err(worktree))?;
    }
    let meta = std::fs::symlink_metadata(worktree).map_err(io_err(worktree))?;
    if std::fs::symlink_metadata(&staging).is_ok() {
        std::fs::remove_dir_all(&staging).map_err(io_err(&staging))?;
    }
    std::fs::create_dir(&staging).map_err(io_err(&staging))?;
    // Whatever runs rover, the files are the worktree owner's (see `crate::git::owner`).
    let owner = (meta.uid(), meta.gid());
    let applied = Tree::open(&staging, owner)
        .and_then(|mut tree| {
            let applied = extract(archive, &mut tree, rules)?;
            tree.finish(worktree, meta.mode())?;
            Ok(applied)
        })
        .inspect_err(|_| {
            let _ = std::fs::remove_dir_all(&staging);
        })?;
    if std::fs::symlink_metadata(&old).is_ok() {
        std::fs::remove_dir_all(&old).map_err(io_err(&old))?;
    }
    std::fs::rename(worktree, &old).map_err(io_err(worktree))?;
    if let Err(e) = std::fs::rename(&staging, worktree) {
        let _ = std::fs::rename(&old, worktree);
        return Err(io_err(worktree)(e));
    }
    std::fs::remove_dir_all(&old).map_err(io_err(&old))?;
    Ok(applied)
}

/// The path inside the workspace of an archive entry (`workspace/a/b` → `a/b`; the root →
/// empty), or the refusal.
fn relative(raw: &[u8], name: &str) -> Result<Vec<Vec<u8>>, SandboxError> {
    if raw.first() == Some(&b'/') {
        return Err(refuse(name, "is an absolute path"));
    }
    let mut parts: Vec<Vec<u8>> = Vec::new();
    for part in raw.split(|b| *b == b'/') {
        match part {
            b"" | b"." => {}
            b".." => return Err(refuse(name, "climbs out of the workspace (`..`)")),
            other => parts.push(other.to_vec()),
        }
    }
    if parts.first().map(Vec::as_slice) != Some(b"workspace") {
        return Err(refuse(name, "is not under workspace/"));
    }
    parts.remove(0);
    Ok(parts)
}

/// `a/b/c` of `parts`, as a refusal shows a path.
fn shown(parts: &[Vec<u8>]) -> String {
    String::from_utf8_lossy(&parts.join(&b'/')).into_owned()
}

/// Flags of every directory opened on the way to an entry: never through a link.
const DIR: OFlags = OFlags::RDONLY
    .union(OFlags::DIRECTORY)
    .union(OFlags::NOFOLLOW)
    .union(OFlags::CLOEXEC);

/// Flags of a file written for an entry: a new name, never a link's target.
const NEW_FILE: OFlags = OFlags::WRONLY
    .union(OFlags::CREATE)
    .union(OFlags::EXCL)
    .union(OFlags::NOFOLLOW)
    .union(OFlags::CLOEXEC);

/// Flags of a hard link's source, read for its copy: never through a link at its name.
/// (`O_NONBLOCK`: were it a fifo, opening it does not wait.)
const SOURCE: OFlags = OFlags::RDONLY
    .union(OFlags::NOFOLLOW)
    .union(OFlags::NONBLOCK)
    .union(OFlags::CLOEXEC);

/// The staging directory, reached only through directory fds (see the module doc).
struct Tree {
    staging: PathBuf,
    root: OwnedFd,
    /// The directory walked to last, and its fd: an archive lists a directory's entries
    /// together, so most entries start from here rather than from the root.
    cursor: Option<(Vec<Vec<u8>>, OwnedFd)>,
    owner: (Uid, Gid),
}

impl Tree {
    /// Opens the (new, empty) staging directory `staging`; what is made in it is `owner`'s.
    fn open(staging: &Path, owner: (u32, u32)) -> Result<Self, SandboxError> {
        let root =
            rustix::fs::open(staging, DIR, Mode::empty()).map_err(|e| io_err(staging)(e.into()))?;
        Ok(Self {
            staging: staging.to_path_buf(),
            root,
            cursor: None,
            owner: (Uid::from_raw(owner.0), Gid::from_raw(owner.1)),
        })
    }

    /// The error of an operation at `parts` for the entry `name`: a refusal when the disk is
    /// not what the archive made there (a link where a directory was made, a name already
    /// taken), else the I/O error with its path.
    fn failed(&self, name: &str, parts: &[Vec<u8>], e: rustix::io::Errno) -> SandboxError {
        use rustix::io::Errno;
        if [Errno::LOOP, Errno::NOTDIR, Errno::EXIST, Errno::MLINK].contains(&e) {
            return refuse(
                name,
                format!(
                    "finds `{}` in the staging directory is not what the archive made there ({e}): nothing is followed or replaced",
                    shown(parts)
                ),
            );
        }
        SandboxError::File {
            path: self.path(parts),
            source: e.into(),
        }
    }

    /// The path of `parts` in the staging directory, for an error to show (never opened).
    fn path(&self, parts: &[Vec<u8>]) -> PathBuf {
        parts.iter().fold(self.staging.clone(), |p, part| {
            p.join(OsStr::from_bytes(part))
        })
    }

    /// Makes the directory or file at `fd` the worktree owner's. Not permitted unless rover is
    /// root; then the files are rover's, the owner's already.
    fn own(&self, fd: BorrowedFd<'_>) {
        let _ = rustix::fs::fchown(fd, Some(self.owner.0), Some(self.owner.1));
    }

    /// The fd of the directory at `parts`, opened component by component from the root (or
    /// from the cursor, when it is on the way), each with `O_NOFOLLOW | O_DIRECTORY`. The
    /// components from `fresh` on are new to the archive and made here (`mkdirat`, the owner's);
    /// the ones before must be there already.
    fn dir(
        &mut self,
        parts: &[Vec<u8>],
        fresh: usize,
        name: &str,
    ) -> Result<BorrowedFd<'_>, SandboxError> {
        let (mut depth, mut fd) = match self.cursor.take() {
            Some((at, fd)) if parts.starts_with(&at) && at.len() <= fresh => (at.len(), Some(fd)),
            _ => (0, None),
        };
        while depth < parts.len() {
            let part = OsStr::from_bytes(&parts[depth]);
            let at = fd.as_ref().map_or(self.root.as_fd(), OwnedFd::as_fd);
            if depth >= fresh {
                rustix::fs::mkdirat(at, part, Mode::from_raw_mode(0o777))
                    .map_err(|e| self.failed(name, &parts[..=depth], e))?;
            }
            let next = rustix::fs::openat(at, part, DIR, Mode::empty())
                .map_err(|e| self.failed(name, &parts[..=depth], e))?;
            if depth >= fresh {
                self.own(next.as_fd());
            }
            fd = Some(next);
            depth += 1;
        }
        Ok(match fd {
            None => self.root.as_fd(),
            Some(fd) => self.cursor.insert((parts.to_vec(), fd)).1.as_fd(),
        })
    }

    /// Creates the regular file at `parts` (its parents new from `fresh`), empty and only
    /// rover's for now: a new name, never a link's target.
    fn create(
        &mut self,
        parts: &[Vec<u8>],
        fresh: usize,
        name: &str,
    ) -> Result<std::fs::File, SandboxError> {
        let (leaf, parent) = parts.split_last().expect("an entry names a path");
        let dir = self.dir(parent, fresh, name)?;
        let created = rustix::fs::openat(
            dir,
            OsStr::from_bytes(leaf),
            NEW_FILE,
            Mode::from_raw_mode(0o600),
        );
        let fd = created.map_err(|e| self.failed(name, parts, e))?;
        self.own(fd.as_fd());
        Ok(fd.into())
    }

    /// Opens the regular file at `parts` (every directory on the way there already) to read
    /// it, the file itself with `O_NOFOLLOW`.
    fn source(&mut self, parts: &[Vec<u8>], name: &str) -> Result<std::fs::File, SandboxError> {
        let (leaf, parent) = parts.split_last().expect("an entry names a path");
        let dir = self.dir(parent, parent.len(), name)?;
        let opened = rustix::fs::openat(dir, OsStr::from_bytes(leaf), SOURCE, Mode::empty());
        let fd = opened.map_err(|e| self.failed(name, parts, e))?;
        let stat = rustix::fs::fstat(&fd).map_err(|e| self.failed(name, parts, e))?;
        if FileType::from_raw_mode(stat.st_mode) != FileType::RegularFile {
            return Err(refuse(
                name,
                format!("is a hard link to `{}`, which is not a file", shown(parts)),
            ));
        }
        Ok(fd.into())
    }

    /// Makes the symbolic link at `parts` (its parents new from `fresh`) to `target`, the
    /// owner's, never following it.
    fn symlink(
        &mut self,
        parts: &[Vec<u8>],
        fresh: usize,
        target: &[u8],
        name: &str,
    ) -> Result<(), SandboxError> {
        let (leaf, parent) = parts.split_last().expect("an entry names a path");
        let (uid, gid) = self.owner;
        let dir = self.dir(parent, fresh, name)?;
        let leaf = OsStr::from_bytes(leaf);
        let made = rustix::fs::symlinkat(OsStr::from_bytes(target), dir, leaf);
        if made.is_ok() {
            let _ = rustix::fs::chownat(dir, leaf, Some(uid), Some(gid), AtFlags::SYMLINK_NOFOLLOW);
        }
        made.map_err(|e| self.failed(name, parts, e))
    }

    /// rover's `.git` file of `worktree` and the worktree's own mode go over to the staging
    /// directory (and the owner, the worktree's already).
    fn finish(&self, worktree: &Path, mode: u32) -> Result<(), SandboxError> {
        let gitfile = worktree.join(".git");
        // None, or one that is a link, a directory or a socket: not rover's git file, which
        // is a regular file; it stays behind.
        let opened = match rustix::fs::open(&gitfile, SOURCE, Mode::empty()) {
            Ok(fd) => Some(fd),
            Err(rustix::io::Errno::NOENT | rustix::io::Errno::LOOP | rustix::io::Errno::NXIO) => {
                None
            }
            Err(e) => return Err(io_err(&gitfile)(e.into())),
        };
        if let Some(fd) = opened {
            let stat = rustix::fs::fstat(&fd).map_err(|e| io_err(&gitfile)(e.into()))?;
            if FileType::from_raw_mode(stat.st_mode) == FileType::RegularFile {
                let copy = self.staging.join(".git");
                let created =
                    rustix::fs::openat(&self.root, ".git", NEW_FILE, Mode::from_raw_mode(0o600));
                let mut out = std::fs::File::from(created.map_err(|e| io_err(&copy)(e.into()))?);
                io::copy(&mut std::fs::File::from(fd), &mut out).map_err(io_err(&copy))?;
                rustix::fs::fchmod(&out, Mode::from_raw_mode(stat.st_mode))
                    .map_err(|e| io_err(&copy)(e.into()))?;
                let _ = rustix::fs::fchown(
                    &out,
                    Some(Uid::from_raw(stat.st_uid)),
                    Some(Gid::from_raw(stat.st_gid)),
                );
            }
        }
        self.own(self.root.as_fd());
        rustix::fs::fchmod(&self.root, Mode::from_raw_mode(mode))
            .map_err(|e| io_err(&self.staging)(e.into()))
    }
}

/// What an earlier entry of the archive made at a path (the archive, not the disk, decides).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Made {
    /// A directory: named by an entry, or made as the parent of one.
    Dir {
        named: bool,
    },
    File,
    Link,
}

/// What [`claim`] found of an entry's path in the archive so far.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Claim {
    /// The depth from which the entry's parents are new: made for it, as directories.
    fresh: usize,
    /// The path is a directory an earlier entry made as its parent (a directory entry only).
    there: bool,
}

/// Refuses an entry at `parts` that passes through something an earlier entry made other than
/// a directory, or that names a path an earlier entry made (a directory made as a parent may
/// be named once, by a directory entry); records the parents it makes.
fn claim(
    made: &mut HashMap<Vec<Vec<u8>>, Made>,
    parts: &[Vec<u8>],
    is_dir: bool,
    name: &str,
) -> Result<Claim, SandboxError> {
    let mut fresh = None;
    for depth in 1..parts.len() {
        let prefix = &parts[..depth];
        match made.get(prefix) {
            Some(Made::Dir { .. }) => {}
            Some(Made::Link) => {
                return Err(refuse(
                    name,
                    format!(
                    "passes through the link `{}` an earlier entry made (links are never followed)",
                    shown(prefix)
                ),
                ))
            }
            Some(Made::File) => {
                return Err(refuse(
                    name,
                    format!("is inside `{}`, which is not a directory", shown(prefix)),
                ))
            }
            None => {
                fresh.get_or_insert(depth - 1);
                made.insert(prefix.to_vec(), Made::Dir { named: false });
            }
        }
    }
    let fresh = fresh.unwrap_or(parts.len().saturating_sub(1));
    match made.get(parts) {
        None => Ok(Claim {
            fresh,
            there: false,
        }),
        Some(Made::Dir { named: false }) if is_dir => Ok(Claim { fresh, there: true }),
        Some(_) => Err(refuse(
            name,
            "names a path an earlier entry of the archive made: an archive names each path once",
        )),
    }
}

fn is_git(part: &[u8]) -> bool {
    part.eq_ignore_ascii_case(b".git")
}

#[allow(
    clippy::too_many_lines,
    reason = "one entry type per arm, each with its refusal"
)]
fn extract(archive: &Path, tree: &mut Tree, rules: &Rules) -> Result<Applied, SandboxError> {
    let file = std::fs::File::open(archive).map_err(io_err(archive))?;
    let mut tar = tar::Archive::new(io::BufReader::new(file));
    let mut applied = Applied::default();
    let mut made: HashMap<Vec<Vec<u8>>, Made> = HashMap::new();
    let mut count: u64 = 0;
    let entries = tar
        .entries()
        .map_err(|e| refuse("(archive)", format!("is not a readable tar: {e}")))?;
    for entry in entries {
        let mut entry =
            entry.map_err(|e| refuse("(archive)", format!("is not a readable tar: {e}")))?;
        let raw = entry.path_bytes().into_owned();
        let name = String::from_utf8_lossy(&raw).into_owned();
        let kind = entry.header().entry_type();
        if matches!(kind, tar::EntryType::XGlobalHeader) {
            continue;
        }
        count += 1;
        if count > rules.max_entries {
            return Err(refuse(
                &name,
                format!(
                    "is past the most entries a workspace may return ({}), which looks like a tar bomb",
                    rules.max_entries
                ),
            ));
        }
        let parts = relative(&raw, &name)?;
        if parts.is_empty() {
            if kind.is_dir() {
                continue;
            }
            return Err(refuse(&name, "replaces the workspace's root"));
        }
        if is_git(&parts[0]) {
            // rover's own git file, as shipped, is the one `.git` allowed back (and skipped).
            if parts.len() == 1 && kind.is_file() {
                if let Some(shipped) = &rules.gitfile {
                    let size = entry.header().size().unwrap_or(u64::MAX);
                    if size == shipped.len() as u64 {
                        let mut data = Vec::new();
                        (&mut entry)
                            .take(size)
                            .read_to_end(&mut data)
                            .map_err(|e| refuse(&name, format!("cannot be read: {e}")))?;
                        if data == *shipped {
                            continue;
                        }
                    }
                }
            }
            return Err(refuse(
                &name,
                "replaces or changes the worktree's `.git`: its git metadata is never taken from a sandbox",
            ));
        }
        let Claim { fresh, there } = claim(&mut made, &parts, kind.is_dir(), &name)?;
        let mode = entry.header().mode().unwrap_or(0o644) & 0o777;
        match kind {
            tar::EntryType::Regular | tar::EntryType::Continuous => {
                let size = entry
                    .header()
                    .size()
                    .map_err(|e| refuse(&name, format!("has no readable size: {e}")))?;
                if size > rules.file_bytes {
                    return Err(refuse(
                        &name,
                        format!(
                            "is {size} bytes, more than the largest file a sandbox may write ({} MiB, autopilot.sandbox.fileSizeLimitMb)",
                            rules.file_bytes / (1024 * 1024)
                        ),
                    ));
                }
                let mut out = tree.create(&parts, fresh, &name)?;
                let copied = io::copy(&mut (&mut entry).take(size), &mut out)
                    .map_err(|e| refuse(&name, format!("cannot be read: {e}")))?;
                if copied != size {
                    return Err(refuse(&name, "ends before its size"));
                }
                rustix::fs::fchmod(&out, Mode::from_raw_mode(mode | 0o600))
                    .map_err(|e| tree.failed(&name, &parts, e))?;
                applied.bytes += size;
                made.insert(parts, Made::File);
            }
            tar::EntryType::Directory => {
                // The directory itself is new unless an earlier entry made it as a parent.
                let fresh = if there { parts.len() } else { fresh };
                let dir = tree.dir(&parts, fresh, &name)?;
                let chmod = rustix::fs::fchmod(dir, Mode::from_raw_mode(mode | 0o700));
                chmod.map_err(|e| tree.failed(&name, &parts, e))?;
                made.insert(parts, Made::Dir { named: true });
            }
            tar::EntryType::Symlink => {
                let target = entry
                    .link_name_bytes()
                    .map(std::borrow::Cow::into_owned)
                    .unwrap_or_default();
                tree.symlink(&parts, fresh, &target, &name)?;
                made.insert(parts, Made::Link);
            }
            tar::EntryType::Link => {
                let target = entry
                    .link_name_bytes()
                    .map(std::borrow::Cow::into_owned)
                    .unwrap_or_default();
                let shown = String::from_utf8_lossy(&target).into_owned();
                // Only a file this archive made, under directories it made (so no link on the
                // way, by `claim`, and none made since, since no path is named twice), read
                // through the same walk as any entry.
                let inside = relative(&target, &name)
                    .ok()
                    .filter(|t| made.get(t) == Some(&Made::File));
                let Some(source) = inside else {
                    return Err(refuse(
                        &name,
                        format!(
                            "is a hard link to `{shown}`, which is not a file of the workspace"
                        ),
                    ));
                };
                let mut input = tree.source(&source, &name)?;
                let mut out = tree.create(&parts, fresh, &name)?;
                applied.bytes +=
                    io::copy(&mut input, &mut out).map_err(|e| SandboxError::File {
                        path: tree.path(&parts),
                        source: e,
                    })?;
                rustix::fs::fchmod(&out, Mode::from_raw_mode(mode | 0o600))
                    .map_err(|e| tree.failed(&name, &parts, e))?;
                made.insert(parts, Made::File);
            }
            tar::EntryType::GNUSparse => return Err(refuse(&name, "is a sparse file")),
            tar::EntryType::Char | tar::EntryType::Block => {
                return Err(refuse(&name, "is a device file"))
            }
            tar::EntryType::Fifo => return Err(refuse(&name, "is a fifo")),
            other => {
                return Err(refuse(
                    &name,
                    format!("is an entry of type {other:?}, which a workspace does not hold"),
                ))
            }
        }
        applied.entries += 1;
    }
    Ok(applied)
}

#[cfg(test)]
#[path = "returned_tests.rs"]
mod tests;
