//! The telemetry outbox: `autopilot/telemetry/outbox`, one line per span that was closed while
//! OpenTelemetry export is on (`<span id>\n`), appended by whichever process closes the span
//! (the daemon, a `--once` run, `submit`, an intervention), and read by the exporter of the
//! daemon from the offset it has exported up to (`telemetry::export`).
//!
//! Export is armed per store: a daemon started with export on writes `telemetry/armed`, one
//! started with it off removes it and the outbox. A process closing a span looks at that file
//! (one `stat`), so with export off a span close costs nothing more.
//!
//! Appends are single `write`s of 37 bytes with `O_APPEND` under an exclusive `flock` of the
//! outbox, which the exporter also takes to cut the consumed part off and shares to read: a
//! line is never read torn, and never lost between a read and a truncation. The outbox is not `fsync`ed: a machine crash
//! may lose the export of the spans closed in its last moments, never a span.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::LazyLock;

use uuid::Uuid;

use super::error::{Result, StoreError};
use super::AutopilotStore;

/// The length of one line: a hyphenated UUID and a newline.
pub const LINE: u64 = 37;
const LINE_BYTES: usize = 37;

/// Woken when this process appends, so its exporter sends at once instead of at its next look.
pub static APPENDED: LazyLock<tokio::sync::Notify> = LazyLock::new(tokio::sync::Notify::new);

/// The telemetry directory of a store.
pub fn dir(store: &AutopilotStore) -> PathBuf {
    store.autopilot_dir().join("telemetry")
}

/// The outbox file.
pub fn path(store: &AutopilotStore) -> PathBuf {
    dir(store).join("outbox")
}

fn armed_path(store: &AutopilotStore) -> PathBuf {
    dir(store).join("armed")
}

/// Whether spans closed in this store are recorded for export.
pub fn is_armed(store: &AutopilotStore) -> bool {
    armed_path(store).is_file()
}

/// Record closed spans for export from now on (the daemon, when export is on).
pub fn arm(store: &AutopilotStore) -> Result<()> {
    super::fsio::ensure_dir(&dir(store))?;
    super::fsio::write_atomic(&armed_path(store), b"armed\n")
}

/// Stop recording closed spans, and drop those not yet exported (the daemon, when export is
/// off: turning it on later exports what closes from then on, not a backlog).
pub fn disarm(store: &AutopilotStore) -> Result<()> {
    for p in [armed_path(store), path(store)] {
        match fs::remove_file(&p) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(StoreError::io("remove", &p)(e)),
        }
    }
    Ok(())
}

fn open_locked(path: &Path, append: bool) -> Result<File> {
    let file = OpenOptions::new()
        .create(true)
        .append(append)
        .read(true)
        .write(true)
        .open(path)
        .map_err(StoreError::io("open", path))?;
    fs2::FileExt::lock_exclusive(&file).map_err(StoreError::io("lock", path))?;
    Ok(file)
}

/// Record that span `id` was closed, if export is armed (called by `write_span`).
pub fn record_closed(store: &AutopilotStore, id: Uuid) -> Result<()> {
    if !is_armed(store) {
        return Ok(());
    }
    let path = path(store);
    let mut file = open_locked(&path, true)?;
    let line = format!("{id}\n");
    file.write_all(line.as_bytes())
        .map_err(StoreError::io("append to", &path))?;
    APPENDED.notify_one();
    Ok(())
}

/// The outbox's length in bytes (0 when there is none).
pub fn len(store: &AutopilotStore) -> u64 {
    fs::metadata(path(store)).map_or(0, |m| m.len())
}

/// The span ids recorded after byte `offset`, at most `max`, and the offset just past them. A
/// line that is not a span id (a damaged file) is skipped and counted.
pub fn read_from(store: &AutopilotStore, offset: u64, max: usize) -> Result<Batch> {
    let path = path(store);
    let mut file = match File::open(&path) {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            return Ok(Batch {
                ids: Vec::new(),
                end: 0,
                damaged: 0,
                reset: offset > 0,
            })
        }
        Err(e) => return Err(StoreError::io("open", &path)(e)),
    };
    // Shared with other readers, never with an append half done.
    fs2::FileExt::lock_shared(&file).map_err(StoreError::io("lock", &path))?;
    let len = file
        .metadata()
        .map_err(StoreError::io("stat", &path))?
        .len();
    // Cut off (or replaced) since the offset was kept: start again from the beginning.
    let (offset, reset) = if len < offset {
        (0, true)
    } else {
        (offset, false)
    };
    let whole = ((len - offset) / LINE).min(max as u64);
    let mut bytes = vec![0u8; usize::try_from(whole * LINE).expect("bounded by max")];
    file.seek(SeekFrom::Start(offset))
        .map_err(StoreError::io("seek", &path))?;
    file.read_exact(&mut bytes)
        .map_err(StoreError::io("read", &path))?;
    let mut ids = Vec::new();
    let mut damaged = 0;
    for line in bytes.chunks(LINE_BYTES) {
        match std::str::from_utf8(&line[..36])
            .ok()
            .and_then(|s| Uuid::parse_str(s).ok())
        {
            Some(id) if line[36] == b'\n' => ids.push(id),
            _ => damaged += 1,
        }
    }
    Ok(Batch {
        ids,
        end: offset + whole * LINE,
        damaged,
        reset,
    })
}

/// What [`read_from`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Batch {
    pub ids: Vec<Uuid>,
    /// The offset just past the lines read.
    pub end: u64,
    /// Lines that were not span ids.
    pub damaged: u64,
    /// The outbox was shorter than the offset asked for (cut off by hand): read from 0.
    pub reset: bool,
}

/// Empty the outbox if everything in it has been consumed (`offset` is its length), so that it
/// never grows with the history. Returns whether it was emptied (the offset is then 0).
pub fn truncate_consumed(store: &AutopilotStore, offset: u64) -> Result<bool> {
    let path = path(store);
    if !path.is_file() {
        return Ok(false);
    }
    let file = open_locked(&path, false)?;
    let len = file
        .metadata()
        .map_err(StoreError::io("stat", &path))?
        .len();
    if len != offset || len == 0 {
        return Ok(false);
    }
    file.set_len(0).map_err(StoreError::io("truncate", &path))?;
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn closed_spans_are_recorded_only_while_armed_and_read_back_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let store = AutopilotStore::open(dir.path(), "p").unwrap();
        let (a, b) = (Uuid::new_v4(), Uuid::new_v4());
        record_closed(&store, a).unwrap();
        assert_eq!(len(&store), 0, "not armed: nothing recorded");
        arm(&store).unwrap();
        record_closed(&store, a).unwrap();
        record_closed(&store, b).unwrap();
        let first = read_from(&store, 0, 1).unwrap();
        assert_eq!(first.ids, vec![a]);
        let rest = read_from(&store, first.end, 10).unwrap();
        assert_eq!(rest.ids, vec![b]);
        assert!(!truncate_consumed(&store, first.end).unwrap(), "b unread");
        assert!(truncate_consumed(&store, rest.end).unwrap());
        assert_eq!(len(&store), 0);
        disarm(&store).unwrap();
        assert!(!is_armed(&store));
    }

    #[test]
    fn a_damaged_line_is_counted_and_skipped() {
        let dir = tempfile::tempdir().unwrap();
        let store = AutopilotStore::open(dir.path(), "p").unwrap();
        arm(&store).unwrap();
        let id = Uuid::new_v4();
        let mut text = "x".repeat(36);
        text.push('\n');
        text.push_str(&id.to_string());
        text.push('\n');
        fs::write(path(&store), text).unwrap();
        let batch = read_from(&store, 0, 10).unwrap();
        assert_eq!((batch.ids, batch.damaged), (vec![id], 1));
    }
}
