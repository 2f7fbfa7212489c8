//! Taking a shipped workspace back: the tar of a container's `/workspace` is untrusted. Every
//! entry is checked and written into a staging directory next to the worktree; only when all
//! of them pass does the staging directory replace the worktree (rover's `.git` file kept), so
//! a refused archive changes nothing.
//!
//! Refused, naming the entry: a path that is absolute or climbs out (`..`) or passes through a
//! link or a file; a path an earlier entry made (an archive names each path once, so no entry
//! replaces what an earlier one made, and no file ends up under a link made after it); a hard
//! link to anything but a regular file the archive made under directories it made (read with
//! `O_NOFOLLOW`, never through a path an entry could have turned into a link); a device, a fifo, a sparse
//! file or any other entry type; a file larger than a sandbox may write
//! (`autopilot.sandbox.fileSizeLimitMb`); more than [`MAX_ENTRIES`] entries; and the worktree's
//! `.git` replaced or changed (or anything under it): the worktree's git metadata is never taken
//! from a sandbox (rover's own git file, shipped in, may come back unchanged and is skipped). A
//! repository nested deeper (`sub/.git`) comes back as files, as it would on a mount, and the
//! commit step leaves it out. The archive's size is capped while it is fetched
//! (`autopilot.sandbox.workspaceLimitMb`). Symbolic links are created as links, whatever they
//! point at (as on a mount: git records a link's target as text), and never followed; no
//! filter or hook runs; modes keep only permission bits.

use std::collections::HashMap;
use std::io::{self, Read as _};
use std::os::unix::ffi::OsStrExt as _;
use std::os::unix::fs::{MetadataExt as _, OpenOptionsExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};

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
    let applied = match extract(archive, &staging, rules, owner) {
        Ok(applied) => applied,
        Err(e) => {
            let _ = std::fs::remove_dir_all(&staging);
            return Err(e);
        }
    };
    // rover's `.git` file and the worktree's own owner and mode go over.
    let gitfile = worktree.join(".git");
    if let Ok(git_meta) = std::fs::symlink_metadata(&gitfile) {
        if git_meta.is_file() {
            let copy = staging.join(".git");
            std::fs::copy(&gitfile, &copy).map_err(io_err(&copy))?;
            let _ = std::os::unix::fs::lchown(&copy, Some(git_meta.uid()), Some(git_meta.gid()));
        }
    }
    let _ = std::os::unix::fs::lchown(&staging, Some(meta.uid()), Some(meta.gid()));
    std::fs::set_permissions(&staging, meta.permissions()).map_err(io_err(&staging))?;
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

fn join(base: &Path, parts: &[Vec<u8>]) -> PathBuf {
    let mut path = base.to_path_buf();
    for part in parts {
        path.push(std::ffi::OsStr::from_bytes(part));
    }
    path
}

/// Makes the directories above `parts` in `staging`, refusing to pass a link or a file.
fn parents(
    staging: &Path,
    parts: &[Vec<u8>],
    name: &str,
    owner: (u32, u32),
) -> Result<(), SandboxError> {
    for depth in 1..parts.len() {
        let path = join(staging, &parts[..depth]);
        match std::fs::symlink_metadata(&path) {
            Ok(m) if m.is_dir() => {}
            Ok(m) if m.file_type().is_symlink() => {
                return Err(refuse(
                    name,
                    format!(
                        "passes through the link `{}` (links are never followed)",
                        String::from_utf8_lossy(&parts[..depth].join(&b'/'))
                    ),
                ))
            }
            Ok(_) => {
                return Err(refuse(
                    name,
                    format!(
                        "is inside `{}`, which is not a directory",
                        String::from_utf8_lossy(&parts[..depth].join(&b'/'))
                    ),
                ))
            }
            Err(_) => {
                std::fs::create_dir(&path).map_err(io_err(&path))?;
                let _ = std::os::unix::fs::lchown(&path, Some(owner.0), Some(owner.1));
            }
        }
    }
    Ok(())
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

/// Refuses an entry at `parts` that passes through something an earlier entry made other than
/// a directory, or that names a path an earlier entry made (a directory made as a parent may
/// be named once, by a directory entry); records the parents it makes.
fn claim(
    made: &mut HashMap<Vec<Vec<u8>>, Made>,
    parts: &[Vec<u8>],
    is_dir: bool,
    name: &str,
) -> Result<(), SandboxError> {
    for depth in 1..parts.len() {
        let prefix = parts[..depth].to_vec();
        let shown = || String::from_utf8_lossy(&parts[..depth].join(&b'/')).into_owned();
        match made.get(&prefix) {
            Some(Made::Dir { .. }) => {}
            Some(Made::Link) => {
                return Err(refuse(
                    name,
                    format!(
                    "passes through the link `{}` an earlier entry made (links are never followed)",
                    shown()
                ),
                ))
            }
            Some(Made::File) => {
                return Err(refuse(
                    name,
                    format!("is inside `{}`, which is not a directory", shown()),
                ))
            }
            None => {
                made.insert(prefix, Made::Dir { named: false });
            }
        }
    }
    match made.get(parts) {
        None => Ok(()),
        Some(Made::Dir { named: false }) if is_dir => Ok(()),
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
fn extract(
    archive: &Path,
    staging: &Path,
    rules: &Rules,
    owner: (u32, u32),
) -> Result<Applied, SandboxError> {
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
        claim(&mut made, &parts, kind.is_dir(), &name)?;
        let path = join(staging, &parts);
        parents(staging, &parts, &name, owner)?;
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
                let mut out = std::fs::OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .custom_flags(nix::fcntl::OFlag::O_NOFOLLOW.bits())
                    .open(&path)
                    .map_err(io_err(&path))?;
                let copied = io::copy(&mut (&mut entry).take(size), &mut out)
                    .map_err(|e| refuse(&name, format!("cannot be read: {e}")))?;
                if copied != size {
                    return Err(refuse(&name, "ends before its size"));
                }
                out.set_permissions(std::fs::Permissions::from_mode(mode | 0o600))
                    .map_err(io_err(&path))?;
                applied.bytes += size;
                made.insert(parts, Made::File);
            }
            tar::EntryType::Directory => {
                if std::fs::symlink_metadata(&path).is_err() {
                    std::fs::create_dir(&path).map_err(io_err(&path))?;
                }
                std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode | 0o700))
                    .map_err(io_err(&path))?;
                made.insert(parts, Made::Dir { named: true });
            }
            tar::EntryType::Symlink => {
                let target = entry
                    .link_name_bytes()
                    .map(std::borrow::Cow::into_owned)
                    .unwrap_or_default();
                std::os::unix::fs::symlink(std::ffi::OsStr::from_bytes(&target), &path)
                    .map_err(io_err(&path))?;
                made.insert(parts, Made::Link);
            }
            tar::EntryType::Link => {
                let target = entry
                    .link_name_bytes()
                    .map(std::borrow::Cow::into_owned)
                    .unwrap_or_default();
                let shown = String::from_utf8_lossy(&target).into_owned();
                // Only a file this archive made, under directories it made (so no link on
                // the way, by `claim`), read without following a link at its own name.
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
                let from = join(staging, &source);
                let mut input = std::fs::OpenOptions::new()
                    .read(true)
                    .custom_flags(nix::fcntl::OFlag::O_NOFOLLOW.bits())
                    .open(&from)
                    .map_err(|e| refuse(&name, format!("is a hard link to `{shown}`, which cannot be read without following a link: {e}")))?;
                if !input.metadata().is_ok_and(|m| m.is_file()) {
                    return Err(refuse(
                        &name,
                        format!("is a hard link to `{shown}`, which is not a file"),
                    ));
                }
                let mut out = std::fs::OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .custom_flags(nix::fcntl::OFlag::O_NOFOLLOW.bits())
                    .open(&path)
                    .map_err(io_err(&path))?;
                applied.bytes += io::copy(&mut input, &mut out).map_err(io_err(&path))?;
                out.set_permissions(std::fs::Permissions::from_mode(mode | 0o600))
                    .map_err(io_err(&path))?;
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
        // Not permitted unless rover is root; then the files are rover's, the owner's already.
        let _ = std::os::unix::fs::lchown(&path, Some(owner.0), Some(owner.1));
        applied.entries += 1;
    }
    Ok(applied)
}

#[cfg(test)]
#[path = "returned_tests.rs"]
mod tests;
