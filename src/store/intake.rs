//! `autopilot/intake.jsonl`: what became of every GitHub event rover was told about, one
//! [`IntakeRecord`] a line: a trace started, a duplicate, or skipped and why (plus notices: a
//! possible gap in the feed, the backlog skipped on first start). `rover autopilot events`
//! reads it.
//!
//! Bounded: once the file holds [`FILE_RECORDS`] records it becomes `intake.jsonl.1` (the older
//! one dropped), so at most twice that many are kept. Records are appended under the store lock
//! (a line each, on disk when the append returns), so an event costs the same whatever the file
//! holds. A last line without its newline is a write a crash cut off: readers leave it out and
//! the next append cuts it off. A whole line that does not parse is corruption: an error naming
//! the file and the line, never skipped or reset; the file is not rotated away while it has one.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use super::error::{Result, StoreError};
use super::fsio::{append_lines, ensure_dir, sync_dir, whole_lines};
use super::lock::StoreLock;
use super::AutopilotStore;

/// Records per file before it is rotated.
pub const FILE_RECORDS: usize = 500;

/// What became of an event.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum IntakeOutcome {
    /// A new trace started.
    Ingested,
    /// The event had already started a trace (same id again, or the same event by the other
    /// path).
    Duplicate,
    /// Not acted on, for `reason`.
    Skipped,
    /// Not about one event: a possible gap, the backlog skipped, a reconcile.
    Notice,
    /// A `/rover` command on the thread, and what became of it (`reason`).
    Command,
}

impl IntakeOutcome {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Ingested => "ingested",
            Self::Duplicate => "duplicate",
            Self::Skipped => "skipped",
            Self::Notice => "notice",
            Self::Command => "command",
        }
    }
}

/// One line of `intake.jsonl`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct IntakeRecord {
    #[serde(with = "super::records::iso")]
    pub at: DateTime<Utc>,
    /// `poll`, `webhook`, `reconcile`, or `local` (a `submit`).
    pub via: String,
    pub outcome: IntakeOutcome,
    /// Why (skips, duplicates and notices).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// The GitHub event id (the delivery id for a webhook).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub event_id: Option<String>,
    /// The feed's event type (`IssuesEvent`) or the webhook's event (`issues`).
    #[serde(default, rename = "type", skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub action: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub number: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub actor: Option<String>,
    /// The trace the event started or was folded into.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trace_id: Option<Uuid>,
}

impl IntakeRecord {
    /// A record with only the time, the path and the outcome set.
    pub fn new(via: &str, outcome: IntakeOutcome, at: DateTime<Utc>) -> Self {
        Self {
            at,
            via: via.to_owned(),
            outcome,
            reason: None,
            event_id: None,
            kind: None,
            action: None,
            number: None,
            actor: None,
            trace_id: None,
        }
    }

    #[must_use]
    pub fn reason(mut self, reason: impl Into<String>) -> Self {
        self.reason = Some(reason.into());
        self
    }
}

impl AutopilotStore {
    pub fn intake_path(&self) -> PathBuf {
        self.autopilot_dir().join("intake.jsonl")
    }

    fn intake_backup_path(&self) -> PathBuf {
        self.autopilot_dir().join("intake.jsonl.1")
    }

    /// Append records to `intake.jsonl` under the store lock (rotated at [`FILE_RECORDS`]). Must not be called inside [`AutopilotStore::transact`].
    pub fn append_intake(&self, records: &[IntakeRecord]) -> Result<()> {
        if records.is_empty() {
            return Ok(());
        }
        ensure_dir(&self.autopilot_dir())?;
        let _lock = StoreLock::acquire(&self.lock_path())?;
        self.append_intake_locked(records)
    }

    /// [`AutopilotStore::append_intake`] for a caller that holds the store lock (a transaction
    /// recording an event's arrival with the trace it started).
    pub(super) fn append_intake_locked(&self, records: &[IntakeRecord]) -> Result<()> {
        if records.is_empty() {
            return Ok(());
        }
        let path = self.intake_path();
        let existing = read_bytes(&path)?;
        let valid = whole_lines(&existing);
        #[allow(clippy::naive_bytecount)] // at most FILE_RECORDS lines
        let count = existing[..valid].iter().filter(|b| **b == b'\n').count();
        let valid = if count >= FILE_RECORDS {
            // A live file that does not parse is not rotated away: the error names it until a
            // person looks.
            parse_lines(&path, &String::from_utf8_lossy(&existing[..valid]))?;
            fs::rename(&path, self.intake_backup_path())
                .map_err(StoreError::io("rotate", path.clone()))?;
            sync_dir(&self.autopilot_dir())?;
            0
        } else {
            valid
        };
        let mut text = Vec::new();
        for record in records {
            serde_json::to_writer(&mut text, record).expect("intake records serialize");
            text.push(b'\n');
        }
        append_lines(&path, valid as u64, &text)
    }

    /// The records kept, oldest first (the rotated file, then the live one).
    pub fn read_intake(&self) -> Result<Vec<IntakeRecord>> {
        let mut out = Vec::new();
        for path in [self.intake_backup_path(), self.intake_path()] {
            let bytes = read_bytes(&path)?;
            let text = String::from_utf8_lossy(&bytes[..whole_lines(&bytes)]);
            out.extend(parse_lines(&path, &text)?);
        }
        Ok(out)
    }
}

fn read_bytes(path: &Path) -> Result<Vec<u8>> {
    match fs::read(path) {
        Ok(b) => Ok(b),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(Vec::new()),
        Err(e) => Err(StoreError::io("read", path)(e)),
    }
}

fn parse_lines(path: &Path, text: &str) -> Result<Vec<IntakeRecord>> {
    text.lines()
        .enumerate()
        .filter(|(_, line)| !line.trim().is_empty())
        .map(|(n, line)| {
            serde_json::from_str(line).map_err(|e| StoreError::Unreadable {
                path: path.to_owned(),
                reason: format!("line {}: {e}", n + 1),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(n: u64) -> IntakeRecord {
        let mut r = IntakeRecord::new("poll", IntakeOutcome::Skipped, Utc::now()).reason("own");
        r.number = Some(n);
        r
    }

    #[test]
    fn appends_rotate_and_keep_at_most_two_files() {
        let dir = tempfile::tempdir().unwrap();
        let store = AutopilotStore::open(dir.path(), "p").unwrap();
        for n in 0..(FILE_RECORDS as u64 * 2 + 10) {
            store.append_intake(&[record(n)]).unwrap();
        }
        let all = store.read_intake().unwrap();
        // The first 500 were dropped with the second rotation; the order is kept.
        assert_eq!(all.len(), FILE_RECORDS + 10);
        assert_eq!(all[0].number, Some(FILE_RECORDS as u64));
        assert_eq!(
            all.last().unwrap().number,
            Some(FILE_RECORDS as u64 * 2 + 9)
        );
        assert!(all.windows(2).all(|w| w[0].number < w[1].number));
    }

    #[test]
    fn a_corrupt_line_is_an_error_naming_the_file_and_line_and_is_never_rotated_away() {
        let dir = tempfile::tempdir().unwrap();
        let store = AutopilotStore::open(dir.path(), "p").unwrap();
        store.append_intake(&[record(1)]).unwrap();
        let path = store.intake_path();
        let mut text = fs::read_to_string(&path).unwrap();
        text.push_str("{not json\n");
        fs::write(&path, text).unwrap();
        let err = store.read_intake().unwrap_err().to_string();
        assert!(
            err.contains("intake.jsonl") && err.contains("line 2"),
            "{err}"
        );
        // Later events are still recorded after it, and the damaged line stays for a person.
        store.append_intake(&[record(2)]).unwrap();
        let text = fs::read_to_string(&path).unwrap();
        assert!(text.contains("{not json") && text.ends_with('\n'), "{text}");
        // A full file with a damaged line is not rotated away.
        for n in 3..FILE_RECORDS as u64 {
            store.append_intake(&[record(n)]).unwrap();
        }
        let err = store.append_intake(&[record(999)]).unwrap_err().to_string();
        assert!(
            err.contains("intake.jsonl") && err.contains("line 2"),
            "{err}"
        );
        assert!(fs::read_to_string(&path).unwrap().contains("{not json"));
        assert!(!store.intake_backup_path().exists());
    }

    #[test]
    fn an_append_adds_lines_and_cuts_off_a_torn_last_line() {
        let dir = tempfile::tempdir().unwrap();
        let store = AutopilotStore::open(dir.path(), "p").unwrap();
        store.append_intake(&[record(1)]).unwrap();
        let path = store.intake_path();
        let first = fs::read(&path).unwrap();
        store.append_intake(&[record(2)]).unwrap();
        let both = fs::read(&path).unwrap();
        assert!(both.starts_with(&first), "appended, not rewritten");
        let mut torn = both.clone();
        torn.extend_from_slice(b"{\"at\":\"2026");
        fs::write(&path, &torn).unwrap();
        let numbers = |store: &AutopilotStore| -> Vec<Option<u64>> {
            store
                .read_intake()
                .unwrap()
                .iter()
                .map(|r| r.number)
                .collect()
        };
        assert_eq!(
            numbers(&store),
            [Some(1), Some(2)],
            "the torn line is left out"
        );
        store.append_intake(&[record(3)]).unwrap();
        assert_eq!(numbers(&store), [Some(1), Some(2), Some(3)]);
        assert!(fs::read(&path).unwrap().starts_with(&both));
    }
}
