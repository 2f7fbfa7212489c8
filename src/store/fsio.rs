//! Durable file primitives: atomic JSON writes (temp file in the same directory, fsync, rename,
//! fsync of the directory) and reads whose errors name the file.

use std::collections::HashMap;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex, OnceLock, PoisonError};

use serde::de::DeserializeOwned;
use serde::Serialize;

use super::error::{Result, StoreError};
use super::stats;

/// Write `value` as pretty JSON to `path` so that readers see the old or the new content, never a
/// torn file, and the new content survives a power cut once this returns.
pub fn write_json_atomic<T: Serialize + ?Sized>(path: &Path, value: &T) -> Result<()> {
    let mut bytes = serde_json::to_vec_pretty(value).expect("store records always serialize");
    bytes.push(b'\n');
    write_atomic(path, &bytes)
}

/// Write `bytes` to `path` atomically and durably.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    let dir = path.parent().expect("store paths have a parent directory");
    let mut tmp = tempfile::Builder::new()
        .prefix(".tmp-")
        .tempfile_in(dir)
        .map_err(StoreError::io("create a temporary file in", dir))?;
    tmp.write_all(bytes)
        .map_err(StoreError::io("write", tmp.path().to_owned()))?;
    tmp.as_file()
        .sync_data()
        .map_err(StoreError::io("fsync", tmp.path().to_owned()))?;
    stats::fsync();
    set_readable(tmp.as_file(), tmp.path())?;
    tmp.persist(path).map_err(|e| StoreError::Io {
        op: "rename over",
        path: path.to_owned(),
        source: e.error,
    })?;
    sync_dir(dir)?;
    stats::durable_write();
    Ok(())
}

/// Make the file readable by the group and others like any other file (tempfiles are 0600).
fn set_readable(file: &File, path: &Path) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    file.set_permissions(fs::Permissions::from_mode(0o644))
        .map_err(StoreError::io("set permissions of", path))
}

/// Make a rename or a new file in `dir` durable: when this returns, an fsync of `dir` that
/// started after the call has completed.
///
/// Group commit: concurrent callers for one directory share fsyncs. A caller that finds an fsync
/// of `dir` in progress (which may have started before its rename) waits for the next one, which
/// the first waiter starts once the current one is done, for every caller waiting by then. So a
/// burst of renames in one directory (step runs finishing together) costs two fsyncs, not one
/// each, and none returns before a sync that covers it.
pub fn sync_dir(dir: &Path) -> Result<()> {
    let group = dir_group(dir);
    let mut state = group.state.lock().unwrap_or_else(PoisonError::into_inner);
    // The first fsync that starts from now on covers this caller's changes.
    let needed = state.started + 1;
    loop {
        if state.completed >= needed {
            return state.outcome(needed, dir);
        }
        if !state.running {
            break;
        }
        state = group
            .done
            .wait(state)
            .unwrap_or_else(PoisonError::into_inner);
    }
    state.running = true;
    state.started += 1;
    let ticket = state.started;
    drop(state);
    let result = File::open(dir).and_then(|d| d.sync_all());
    stats::fsync();
    let mut state = group.state.lock().unwrap_or_else(PoisonError::into_inner);
    state.running = false;
    state.completed = ticket;
    state.failed = result
        .as_ref()
        .err()
        .map(|e| (ticket, e.kind(), e.to_string()));
    group.done.notify_all();
    drop(state);
    result.map_err(StoreError::io("fsync directory", dir))
}

/// The fsyncs of one directory (see [`sync_dir`]).
#[derive(Default)]
struct DirGroup {
    state: Mutex<DirSyncs>,
    done: Condvar,
}

#[derive(Default)]
struct DirSyncs {
    /// Fsyncs started and completed (each numbered by the order it started in).
    started: u64,
    completed: u64,
    running: bool,
    /// The last fsync, if it failed: its number and error (waiters it covered fail too).
    failed: Option<(u64, io::ErrorKind, String)>,
}

impl DirSyncs {
    fn outcome(&self, needed: u64, dir: &Path) -> Result<()> {
        match &self.failed {
            Some((ticket, kind, text)) if *ticket >= needed => {
                Err(StoreError::io("fsync directory", dir)(io::Error::new(
                    *kind,
                    text.clone(),
                )))
            }
            _ => Ok(()),
        }
    }
}

fn dir_group(dir: &Path) -> Arc<DirGroup> {
    static GROUPS: OnceLock<Mutex<HashMap<PathBuf, Arc<DirGroup>>>> = OnceLock::new();
    let mut groups = GROUPS
        .get_or_init(Mutex::default)
        .lock()
        .unwrap_or_else(PoisonError::into_inner);
    // A daemon writes into a new directory per trace for weeks: groups no caller holds are
    // dropped now and then, so the map stays as small as the directories in use.
    if groups.len() >= 256 {
        groups.retain(|_, group| Arc::strong_count(group) > 1);
    }
    groups.entry(dir.to_owned()).or_default().clone()
}

/// Read a JSON file. `Ok(None)` when it does not exist; a parse failure names the file.
pub fn read_json<T: DeserializeOwned>(path: &Path) -> Result<Option<T>> {
    let bytes = match fs::read(path) {
        Ok(b) => b,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(StoreError::io("read", path)(e)),
    };
    serde_json::from_slice(&bytes)
        .map(Some)
        .map_err(|e| StoreError::Unreadable {
            path: path.to_owned(),
            reason: e.to_string(),
        })
}

/// Keep a copy of a corrupt file as `<name>.corrupt-<time>` beside it and return the error that
/// says so. The original stays where it is, so every later access fails loudly too until a person
/// repairs or removes it: a corrupt queue is never silently replaced by an empty one.
pub fn quarantine(path: &Path, reason: String) -> StoreError {
    let stamp = chrono::Utc::now().format("%Y%m%dT%H%M%S%.3fZ");
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let kept: PathBuf = path.with_file_name(format!("{name}.corrupt-{stamp}"));
    match fs::copy(path, &kept) {
        Ok(_) => StoreError::Corrupt {
            path: path.to_owned(),
            reason,
            kept,
        },
        Err(_) => StoreError::Unreadable {
            path: path.to_owned(),
            reason,
        },
    }
}

/// Create a directory and its parents, durably.
pub fn ensure_dir(dir: &Path) -> Result<()> {
    if dir.is_dir() {
        return Ok(());
    }
    fs::create_dir_all(dir).map_err(StoreError::io("create directory", dir))?;
    if let Some(parent) = dir.parent() {
        sync_dir(parent)?;
    }
    Ok(())
}

/// The length of `bytes` up to its last newline: what follows is a line a crash cut off.
pub fn whole_lines(bytes: &[u8]) -> usize {
    bytes
        .iter()
        .rposition(|b| *b == b'\n')
        .map_or(0, |at| at + 1)
}

/// Append `bytes` to a line file at `valid` (its whole lines' length, read under the same lock),
/// cutting off a torn tail first; the bytes are on disk when this returns (and a new file's
/// directory entry too). The caller holds the store lock.
pub fn append_lines(path: &Path, valid: u64, bytes: &[u8]) -> Result<()> {
    let mut file = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(false)
        .open(path)
        .map_err(StoreError::io("open", path))?;
    let len = file.metadata().map_err(StoreError::io("stat", path))?.len();
    if len != valid {
        file.set_len(valid)
            .map_err(StoreError::io("truncate", path))?;
    }
    file.seek(SeekFrom::Start(valid))
        .map_err(StoreError::io("seek", path))?;
    file.write_all(bytes)
        .map_err(StoreError::io("append to", path))?;
    file.sync_data().map_err(StoreError::io("fsync", path))?;
    if len == 0 {
        if let Some(dir) = path.parent() {
            sync_dir(dir)?;
        }
    }
    Ok(())
}
