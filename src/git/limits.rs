//! What a task may commit: limits on the largest file, the total size and the number of files
//! it adds or changes, checked on the file system before anything is staged.
//!
//! Staging reads every changed file whole and writes it into the user's object store. A file the
//! agent made huge (a 48 GiB sparse file costs it nothing) would keep the commit step busy for
//! minutes and leave a partial object in `.git/objects`. So before staging, rover walks the
//! worktree the way `git add -A` sees it (ignored paths and nested repositories skipped), takes
//! each file that is new or whose size or modification time differs from the index, and checks
//! the limits; a file over them is a [`GitError::CommitLimit`] naming it, and nothing is staged.

use std::collections::HashMap;
use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::error::GitError;

const MIB: u64 = 1024 * 1024;

/// Limits on what one task may commit (`rover.json`: `autopilot.sandbox.commitLimits`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct CommitLimits {
    /// The largest file a task may add or change, in MiB (GitHub warns above 50 MB and refuses
    /// files above 100 MB).
    pub max_file_mb: u64,
    /// The total size of the files a task adds or changes, in MiB.
    pub max_total_mb: u64,
    /// How many files a task may add or change.
    pub max_files: u64,
}

impl Default for CommitLimits {
    fn default() -> Self {
        Self {
            max_file_mb: 50,
            max_total_mb: 200,
            max_files: 5000,
        }
    }
}

/// Which limit a change went over.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum LimitKind {
    /// One file is larger than `maxFileMb`.
    FileSize,
    /// The changed files together are larger than `maxTotalMb`.
    TotalSize,
    /// More files changed than `maxFiles`.
    FileCount,
}

impl std::fmt::Display for LimitKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::FileSize => "maxFileMb",
            Self::TotalSize => "maxTotalMb",
            Self::FileCount => "maxFiles",
        })
    }
}

/// What the walk found of a change (within the limits).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ChangeSize {
    pub files: u64,
    pub bytes: u64,
}

/// An index entry's stat data: what git compares to tell a file unchanged (the size as the
/// index keeps it, in 32 bits, and the modification time to the second: an index written
/// without nanoseconds must not make every file look changed).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Stat {
    size: u64,
    mtime: i64,
}

/// Checks the files of `work_tree` that differ from `index` against `limits` (see the module
/// doc). `ignored` tells whether a path (relative, a directory with a trailing `/`) is ignored.
pub(crate) fn check(
    work_tree: &Path,
    index: &git2::Index,
    limits: &CommitLimits,
    ignored: &dyn Fn(&Path) -> bool,
) -> Result<ChangeSize, GitError> {
    let known: HashMap<PathBuf, Stat> = index
        .iter()
        .filter_map(|e| {
            let path = PathBuf::from(std::str::from_utf8(&e.path).ok()?);
            let stat = Stat {
                size: u64::from(e.file_size),
                mtime: i64::from(e.mtime.seconds()),
            };
            Some((path, stat))
        })
        .collect();
    let mut seen = ChangeSize::default();
    let mut stack = vec![PathBuf::new()];
    while let Some(dir) = stack.pop() {
        let full = work_tree.join(&dir);
        // Before git reads this directory's rules (the ignore query below, and staging).
        check_rules_files(&full, &dir)?;
        let entries = std::fs::read_dir(&full).map_err(|source| GitError::Io {
            path: full.clone(),
            source,
        })?;
        for entry in entries.flatten() {
            let relative = dir.join(entry.file_name());
            if dir.as_os_str().is_empty() && entry.file_name() == ".git" {
                continue;
            }
            let Ok(meta) = std::fs::symlink_metadata(entry.path()) else {
                continue;
            };
            if meta.is_dir() {
                // A nested repository is left out of the commit; an ignored dir is not walked.
                if std::fs::symlink_metadata(entry.path().join(".git")).is_err()
                    && !ignored(&relative.join(""))
                {
                    stack.push(relative);
                }
                continue;
            }
            // Only files and links are staged (git refuses fifos, sockets and devices).
            if !(meta.is_file() || meta.is_symlink()) || ignored(&relative) {
                continue;
            }
            let stat = Stat {
                size: meta.len() & u64::from(u32::MAX),
                mtime: meta.mtime(),
            };
            if known.get(&relative) == Some(&stat) {
                continue;
            }
            seen.files += 1;
            seen.bytes = seen.bytes.saturating_add(meta.len());
            let over = |kind: LimitKind, size: u64, limit: u64| GitError::CommitLimit {
                kind,
                path: relative.display().to_string(),
                size,
                limit,
            };
            if meta.len() > limits.max_file_mb.saturating_mul(MIB) {
                return Err(over(
                    LimitKind::FileSize,
                    meta.len(),
                    limits.max_file_mb.saturating_mul(MIB),
                ));
            }
            if seen.bytes > limits.max_total_mb.saturating_mul(MIB) {
                return Err(over(
                    LimitKind::TotalSize,
                    seen.bytes,
                    limits.max_total_mb.saturating_mul(MIB),
                ));
            }
            if seen.files > limits.max_files {
                return Err(over(LimitKind::FileCount, seen.files, limits.max_files));
            }
        }
    }
    Ok(seen)
}

/// The largest `.gitignore` or `.gitattributes` rover lets git read from a worktree.
pub const MAX_RULES_FILE_BYTES: u64 = 1024 * 1024;

/// A directory's `.gitignore` and `.gitattributes` are rules git reads on the host while it
/// stages: each must be a plain file of at most [`MAX_RULES_FILE_BYTES`]. A link (to a huge or
/// endless host file) or a huge file the agent made is refused before git reads it.
fn check_rules_files(dir: &Path, relative: &Path) -> Result<(), GitError> {
    for name in [".gitignore", ".gitattributes"] {
        let Ok(meta) = std::fs::symlink_metadata(dir.join(name)) else {
            continue;
        };
        let why = if !meta.is_file() {
            Some("is not a plain file (a link, a directory or a device)".to_owned())
        } else if meta.len() > MAX_RULES_FILE_BYTES {
            Some(format!(
                "is {} bytes, over the {MAX_RULES_FILE_BYTES} bytes rover lets git read",
                meta.len()
            ))
        } else {
            None
        };
        if let Some(why) = why {
            return Err(GitError::RulesFile {
                path: relative.join(name).display().to_string(),
                why,
            });
        }
    }
    Ok(())
}

/// Removes temporary object files libgit2 left in `objects_dir` when a write was cut off (a
/// crash or a kill while staging), once they are older than an hour: a younger one may be a
/// write in progress for another task.
pub(crate) fn sweep_temporary_objects(objects_dir: &Path) {
    let Ok(entries) = std::fs::read_dir(objects_dir) else {
        return;
    };
    let now = std::time::SystemTime::now();
    for entry in entries.flatten() {
        let name = entry.file_name();
        let is_temporary = name.to_str().is_some_and(|n| n.starts_with("tmp_object"));
        let old = entry
            .metadata()
            .and_then(|m| m.modified())
            .is_ok_and(|t| now.duration_since(t).unwrap_or_default().as_secs() > 3600);
        if is_temporary && old {
            match std::fs::remove_file(entry.path()) {
                Ok(()) => {
                    tracing::info!(path = %entry.path().display(), "removed a temporary object left by an interrupted staging");
                }
                Err(e) => {
                    tracing::warn!(path = %entry.path().display(), error = %e, "cannot remove a temporary object");
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_parse_with_defaults_and_refuse_unknown_keys() {
        let limits: CommitLimits = serde_json::from_str(r#"{"maxFileMb": 1}"#).expect("valid");
        assert_eq!(limits.max_file_mb, 1);
        assert_eq!(limits.max_total_mb, 200);
        assert!(serde_json::from_str::<CommitLimits>(r#"{"maxFile": 1}"#).is_err());
    }

    #[test]
    fn a_sparse_file_is_over_the_file_limit_without_being_read() {
        let dir = tempfile::tempdir().expect("tempdir");
        let repo = git2::Repository::init(dir.path()).expect("init");
        std::fs::write(dir.path().join("small.txt"), "x").expect("write");
        let big = std::fs::File::create(dir.path().join("big.bin")).expect("create");
        big.set_len(48 * 1024 * MIB).expect("a sparse file");
        let index = repo.index().expect("index");
        let limits = CommitLimits::default();
        let err = check(dir.path(), &index, &limits, &|_| false).expect_err("over");
        match err {
            GitError::CommitLimit {
                kind, path, size, ..
            } => {
                assert_eq!(kind, LimitKind::FileSize);
                assert_eq!(path, "big.bin");
                assert_eq!(size, 48 * 1024 * MIB);
            }
            other => panic!("{other}"),
        }
        // Ignored, it does not count.
        let fine =
            check(dir.path(), &index, &limits, &|p| p == Path::new("big.bin")).expect("within");
        assert_eq!(fine, ChangeSize { files: 1, bytes: 1 });
    }

    #[test]
    fn temporary_objects_of_a_cut_off_staging_are_swept_once_old() {
        let dir = tempfile::tempdir().expect("tempdir");
        let old = dir.path().join("tmp_object_git2_a1b2c3");
        let fresh = dir.path().join("tmp_object_git2_d4e5f6");
        let object = dir.path().join("pack");
        for path in [&old, &fresh] {
            std::fs::write(path, vec![0u8; 1024]).expect("write");
        }
        std::fs::create_dir(&object).expect("mkdir");
        let two_hours_ago = std::time::SystemTime::now() - std::time::Duration::from_secs(7200);
        std::fs::File::options()
            .write(true)
            .open(&old)
            .and_then(|f| f.set_modified(two_hours_ago))
            .expect("age it");
        sweep_temporary_objects(dir.path());
        assert!(!old.exists(), "an old leftover is swept");
        assert!(fresh.exists(), "a write in progress is left alone");
        assert!(object.exists());
    }

    #[test]
    fn a_linked_or_huge_rules_file_is_refused_before_git_reads_it() {
        let dir = tempfile::tempdir().expect("tempdir");
        let repo = git2::Repository::init(dir.path()).expect("init");
        let index = repo.index().expect("index");
        let limits = CommitLimits::default();
        std::fs::create_dir_all(dir.path().join("sub")).expect("mkdir");
        std::os::unix::fs::symlink("/dev/zero", dir.path().join("sub/.gitignore")).expect("link");
        let err = check(dir.path(), &index, &limits, &|_| false).expect_err("a link");
        assert!(
            matches!(&err, GitError::RulesFile { path, .. } if path == "sub/.gitignore"),
            "{err}"
        );
        std::fs::remove_file(dir.path().join("sub/.gitignore")).expect("rm");
        let big = std::fs::File::create(dir.path().join(".gitattributes")).expect("create");
        big.set_len(MAX_RULES_FILE_BYTES + 1).expect("sparse");
        assert!(matches!(
            check(dir.path(), &index, &limits, &|_| false),
            Err(GitError::RulesFile { .. })
        ));
        big.set_len(10).expect("small");
        check(dir.path(), &index, &limits, &|_| false).expect("a small rules file is fine");
    }

    #[test]
    fn counts_and_totals_are_limited_too() {
        let dir = tempfile::tempdir().expect("tempdir");
        let repo = git2::Repository::init(dir.path()).expect("init");
        std::fs::create_dir_all(dir.path().join("many")).expect("mkdir");
        for i in 0..5 {
            std::fs::write(dir.path().join(format!("many/{i}")), vec![b'x'; 1024]).expect("write");
        }
        let index = repo.index().expect("index");
        let few = CommitLimits {
            max_files: 4,
            ..CommitLimits::default()
        };
        assert!(matches!(
            check(dir.path(), &index, &few, &|_| false),
            Err(GitError::CommitLimit {
                kind: LimitKind::FileCount,
                ..
            })
        ));
        let small = CommitLimits {
            max_total_mb: 0,
            ..CommitLimits::default()
        };
        assert!(matches!(
            check(dir.path(), &index, &small, &|_| false),
            Err(GitError::CommitLimit {
                kind: LimitKind::TotalSize,
                ..
            })
        ));
    }
}
