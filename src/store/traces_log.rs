//! `autopilot/traces.jsonl`: the traces started since `traces.json` was last written, one
//! [`TraceEntry`] a line, so that starting a trace appends a line instead of rewriting the
//! recent-traces list (a cost that grew with the list, paid by every `submit` and every event).
//!
//! Once the log holds [`COMPACT_LINES`] lines, the next new trace folds it into `traces.json`
//! (written atomically) and removes it: the list on disk is `traces.json` plus this log, and
//! readers merge the two (an entry in both, after a crash between the two writes, counts once).
//! Both are caches, rebuilt from the span files when unreadable, as `traces.json` always was.
//!
//! Appends happen under the store lock. A last line without its newline is a write that never
//! returned: readers leave it out and the next writer cuts it off before appending.

use std::fs;
use std::io::{self, Read};
use std::path::{Path, PathBuf};

use super::error::{Result, StoreError};
use super::fsio::{append_lines, sync_dir, whole_lines};
use super::records::TraceEntry;
use super::AutopilotStore;

/// Lines the log holds before the next new trace folds it into `traces.json`.
pub const COMPACT_LINES: usize = 100;

impl AutopilotStore {
    /// The traces started since `traces.json` was last written (see `traces_log`).
    pub fn traces_log_path(&self) -> PathBuf {
        self.autopilot_dir().join("traces.jsonl")
    }
}

/// The log's entries, oldest first (a torn last line left out); a whole line that does not parse is an error naming the file and the line (the
/// caller treats the list as a cache and rebuilds it).
pub(super) fn read(path: &Path) -> Result<Vec<TraceEntry>> {
    let bytes = match fs::read(path) {
        Ok(b) => b,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(StoreError::io("read", path)(e)),
    };
    let valid = whole_lines(&bytes);
    let mut entries = Vec::new();
    for (n, line) in bytes[..valid].split(|b| *b == b'\n').enumerate() {
        if line.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        let entry = serde_json::from_slice(line).map_err(|e| StoreError::Unreadable {
            path: path.to_owned(),
            reason: format!("line {}: {e}", n + 1),
        })?;
        entries.push(entry);
    }
    Ok(entries)
}

/// Append entries (the caller holds the store lock): a torn last line is cut off first, and the
/// lines are on disk (`fdatasync`) when this returns.
pub(super) fn append(path: &Path, valid: u64, entries: &[TraceEntry]) -> Result<()> {
    let mut text = Vec::new();
    for entry in entries {
        serde_json::to_writer(&mut text, entry).expect("trace entries serialize");
        text.push(b'\n');
    }
    append_lines(path, valid, &text)
}

/// Remove the log once `traces.json` holds its entries.
pub(super) fn remove(path: &Path) -> Result<()> {
    match fs::remove_file(path) {
        Ok(()) => path.parent().map_or(Ok(()), sync_dir),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(StoreError::io("remove", path)(e)),
    }
}

/// How many whole lines the log has, without parsing them (the append path's only read).
pub(super) fn count(path: &Path) -> Result<(usize, u64)> {
    let mut bytes = Vec::new();
    match fs::File::open(path) {
        Ok(mut f) => f
            .read_to_end(&mut bytes)
            .map_err(StoreError::io("read", path))?,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok((0, 0)),
        Err(e) => return Err(StoreError::io("open", path)(e)),
    };
    let valid = whole_lines(&bytes);
    #[allow(clippy::naive_bytecount)] // at most 100 short lines
    let lines = bytes[..valid].iter().filter(|b| **b == b'\n').count();
    Ok((lines, valid as u64))
}
