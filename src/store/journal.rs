//! The queue journal: `autopilot/state.journal`, small appends beside `state.json` so that a queue
//! operation costs the same on a queue of 10,000 as on an empty one.
//!
//! One line per record, `<crc32 hex> <json>\n`. The first line is a header `{"after":S}`: the
//! journal continues `state.json` as of sequence number `S`. Each record is
//! `{"seq":N,"at":...,"ops":[{"put":<pending entry>}|{"remove":"<action id>"}]}` with consecutive
//! `seq`s. `state.json` records the last sequence number it includes as `journalSeq`, so a record
//! at or below it is skipped: replay is idempotent, and a crash between writing `state.json` and
//! replacing the journal (compaction) duplicates nothing. A last line that is torn (no newline,
//! bad checksum) is a write that never returned, ignored and cut off by the next writer; a bad
//! line anywhere else is an error naming the file.
//!
//! [`load`] is the one way state is read: `state.json` plus the journal.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use uuid::Uuid;

use super::error::{Result, StoreError};
use super::fsio::{quarantine, write_atomic};
use super::records::{PendingAction, State};
use super::AutopilotStore;

/// The key in `state.json` of the last journal record it includes (rover's addition).
pub const SEQ_KEY: &str = "journalSeq";

/// Compaction happens once the journal outgrows `state.json`, and never below this size.
const MIN_COMPACT_BYTES: u64 = 64 * 1024;

/// One change to the queue.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Op {
    /// Replace the entry of this action id in place, or append it.
    Put(PendingAction),
    /// Take the entry of this action id off the queue (if it is there).
    Remove(Uuid),
}

#[derive(Serialize, Deserialize)]
struct Header {
    after: u64,
}

#[derive(Serialize, Deserialize)]
struct Record {
    seq: u64,
    #[serde(with = "super::records::iso")]
    at: DateTime<Utc>,
    ops: Vec<Op>,
}

/// Which version of a file was read: a changed one has another inode, time or length.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FileId {
    dev: u64,
    ino: u64,
    mtime: i64,
    mtime_nsec: i64,
    len: u64,
}

impl FileId {
    fn of(path: &Path) -> Result<Option<FileId>> {
        match fs::metadata(path) {
            Ok(m) => Ok(Some(FileId {
                dev: m.dev(),
                ino: m.ino(),
                mtime: m.mtime(),
                mtime_nsec: m.mtime_nsec(),
                len: m.len(),
            })),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(StoreError::io("stat", path)(e)),
        }
    }
}

/// Where a loaded state stands on disk, so that the next locked load reads only what was appended
/// since, and the next write knows where to append.
#[derive(Debug, Clone)]
pub struct Position {
    /// `state.json` as read.
    state_file: Option<FileId>,
    /// The journal's inode (`None`: no journal), and how many of its bytes are valid records.
    journal_ino: Option<u64>,
    journal_valid: u64,
    /// The header's `after` (journal lines start after this sequence number).
    journal_after: u64,
    /// The last sequence number applied.
    pub seq: u64,
    /// The journal must be started afresh before an append (missing, or its header is behind).
    reset: bool,
}

/// A state and where it stands on disk; kept by a store handle between transactions.
pub struct Cached {
    pub state: State,
    pub pos: Position,
}

impl std::fmt::Debug for Cached {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Cached {{ pending: {}, seq: {} }}",
            self.state.pending.len(),
            self.pos.seq
        )
    }
}

/// Why a lock-free read must look again.
enum Outcome {
    Loaded(Box<Cached>),
    /// `state.json` was read before a compaction and the journal after it.
    Raced,
}

/// The last journal record `state.json` includes (its `journalSeq`; 0 for a store without one).
pub fn state_seq(state: &State) -> u64 {
    state
        .extra
        .get(SEQ_KEY)
        .and_then(Value::as_u64)
        .unwrap_or(0)
}

/// Read the state as of now: `state.json` plus the journal. Without the lock (`locked` false) a
/// compaction in between is seen and read again; under the lock, `cached` (the state as this
/// handle last wrote it) is reused if the files are the ones it knows, reading only new records.
pub fn load(store: &AutopilotStore, locked: bool, cached: Option<Cached>) -> Result<Cached> {
    if locked {
        if let Some(c) = cached {
            if let Some(c) = refresh(store, c)? {
                return Ok(c);
            }
        }
        return match load_full(store, true)? {
            Outcome::Loaded(c) => Ok(*c),
            Outcome::Raced => unreachable!("no compaction runs while the lock is held"),
        };
    }
    for _ in 0..50 {
        if let Outcome::Loaded(c) = load_full(store, false)? {
            return Ok(*c);
        }
    }
    // Compactions keep overtaking this reader: wait for the writers once.
    let _lock = super::StoreLock::acquire(&store.lock_path())?;
    load(store, true, None)
}

/// Read the state without the store lock, from the handle's cached state when it is free (no
/// transaction of this handle runs) and the files are the ones it knows: then only the records
/// appended since are read, whatever the queue's length. Otherwise a full read, as [`load`].
///
/// A lock-free refresh sees a consistent state: a compaction replaces `state.json` before the
/// journal, and either change sends it to the full read; a record still being appended is left
/// out as a torn line until it is whole.
pub fn read(store: &AutopilotStore, cache: &std::sync::Mutex<Option<Cached>>) -> Result<State> {
    if let Ok(mut guard) = cache.try_lock() {
        if let Some(c) = guard.take() {
            // An error here may be a compaction racing this lock-free read (files replaced
            // between two looks): the full read below decides, and names a file truly corrupt.
            if let Ok(Some(c)) = refresh(store, c) {
                let state = c.state.clone();
                *guard = Some(c);
                return Ok(state);
            }
        }
    }
    // Never while holding the handle's cache: a full read may wait for the store lock, which a
    // transaction takes before the cache.
    Ok(load(store, false, None)?.state)
}

/// Bring a cached state up to date by reading only the records appended since; `None` when the
/// files changed otherwise (another process compacted) and a full load is needed.
fn refresh(store: &AutopilotStore, mut c: Cached) -> Result<Option<Cached>> {
    if FileId::of(&store.state_path())? != c.pos.state_file {
        return Ok(None);
    }
    let path = store.journal_path();
    let mut file = match File::open(&path) {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            return Ok(c.pos.journal_ino.is_none().then_some(c));
        }
        Err(e) => return Err(StoreError::io("open", &path)(e)),
    };
    let meta = file.metadata().map_err(StoreError::io("stat", &path))?;
    if Some(meta.ino()) != c.pos.journal_ino || meta.len() < c.pos.journal_valid {
        return Ok(None);
    }
    if meta.len() == c.pos.journal_valid {
        return Ok(Some(c));
    }
    file.seek(SeekFrom::Start(c.pos.journal_valid))
        .map_err(StoreError::io("seek", &path))?;
    let mut tail = Vec::new();
    file.read_to_end(&mut tail)
        .map_err(StoreError::io("read", &path))?;
    let lines = split(&path, &tail, c.pos.journal_valid, false)?;
    for (line, _) in &lines.records {
        let record: Record = parse(&path, line)?;
        if record.seq != c.pos.seq + 1 {
            return Ok(None);
        }
        apply(&mut c.state, &record);
        c.pos.seq = record.seq;
    }
    c.pos.journal_valid = lines.valid;
    Ok(Some(c))
}

#[derive(Debug)]
struct Lines<'a> {
    /// Each good line (without checksum and newline) and the byte offset just past it.
    records: Vec<(&'a [u8], u64)>,
    /// Bytes of good lines from the start of the file.
    valid: u64,
}

/// Split journal bytes (starting at file offset `base`) into checked lines; a bad last line is a
/// torn write and left out, a bad line before the last is an error naming the file.
fn split<'a>(path: &Path, bytes: &'a [u8], base: u64, first_is_header: bool) -> Result<Lines<'a>> {
    let mut records = Vec::new();
    let mut at = 0usize;
    let mut n = 0usize;
    while at < bytes.len() {
        n += 1;
        let rest = &bytes[at..];
        let end = rest.iter().position(|b| *b == b'\n');
        let good = end.and_then(|end| check(&rest[..end]));
        match (good, end) {
            (Some(line), Some(end)) => {
                at += end + 1;
                records.push((line, base + at as u64));
            }
            // The last line, torn: its writer never returned.
            (None, None) => break,
            (None, Some(end)) if at + end + 1 == bytes.len() && !(first_is_header && n == 1) => {
                break
            }
            _ => {
                return Err(StoreError::Unreadable {
                    path: path.to_owned(),
                    reason: format!(
                        "record {n} (byte {}) is damaged: its checksum does not match",
                        base + at as u64
                    ),
                })
            }
        }
    }
    let valid = records.last().map_or(base, |(_, end)| *end);
    Ok(Lines { records, valid })
}

/// The JSON of a line whose checksum matches.
fn check(line: &[u8]) -> Option<&[u8]> {
    if line.len() < 10 || line[8] != b' ' {
        return None;
    }
    let want = std::str::from_utf8(&line[..8]).ok()?;
    let want = u32::from_str_radix(want, 16).ok()?;
    (crc32(&line[9..]) == want).then_some(&line[9..])
}

fn parse<'de, T: Deserialize<'de>>(path: &Path, line: &'de [u8]) -> Result<T> {
    serde_json::from_slice(line).map_err(|e| StoreError::Unreadable {
        path: path.to_owned(),
        reason: format!("a record with a good checksum does not parse: {e}"),
    })
}

fn frame<T: Serialize>(value: &T) -> Vec<u8> {
    let json = serde_json::to_vec(value).expect("journal records always serialize");
    let mut line = format!("{:08x} ", crc32(&json)).into_bytes();
    line.extend_from_slice(&json);
    line.push(b'\n');
    line
}

fn load_full(store: &AutopilotStore, locked: bool) -> Result<Outcome> {
    let state_path = store.state_path();
    let state_file = FileId::of(&state_path)?;
    let mut state = match read_state_file(&state_path) {
        Ok(Some(s)) => s,
        Ok(None) => State::new(Utc::now()),
        Err(StoreError::Unreadable { path, reason }) if locked => {
            return Err(quarantine(&path, reason))
        }
        Err(e) => return Err(e),
    };
    let base = state_seq(&state);
    let path = store.journal_path();
    let (bytes, journal_ino) = match File::open(&path) {
        Ok(mut f) => {
            let ino = f.metadata().map_err(StoreError::io("stat", &path))?.ino();
            let mut bytes = Vec::new();
            f.read_to_end(&mut bytes)
                .map_err(StoreError::io("read", &path))?;
            (bytes, Some(ino))
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => (Vec::new(), None),
        Err(e) => return Err(StoreError::io("open", &path)(e)),
    };
    let mut pos = Position {
        state_file,
        journal_ino,
        journal_valid: 0,
        journal_after: base,
        seq: base,
        reset: journal_ino.is_none(),
    };
    if journal_ino.is_none() {
        return Ok(Outcome::Loaded(Box::new(Cached { state, pos })));
    }
    let corrupt = |e: StoreError| match e {
        StoreError::Unreadable { path, reason } if locked => quarantine(&path, reason),
        e => e,
    };
    let lines = split(&path, &bytes, 0, true).map_err(corrupt)?;
    let Some(((header, _), records)) = lines.records.split_first() else {
        return Err(corrupt(StoreError::Unreadable {
            path: path.clone(),
            reason: "the header line is missing".into(),
        }));
    };
    let header: Header = parse(&path, header).map_err(corrupt)?;
    pos.journal_after = header.after;
    pos.journal_valid = lines.valid;
    if header.after > base {
        if !locked {
            return Ok(Outcome::Raced);
        }
        if !records.is_empty() {
            return Err(corrupt(StoreError::Unreadable {
                path: path.clone(),
                reason: format!(
                    "it continues state.json as of record {} but state.json is at record {base}: \
                     state.json was replaced by an older copy; restore it or remove both files",
                    header.after
                ),
            }));
        }
        // state.json was rewritten without the journal (by hand, or another implementation)
        // and the journal holds nothing: start it afresh.
        pos.reset = true;
        return Ok(Outcome::Loaded(Box::new(Cached { state, pos })));
    }
    let mut last = header.after;
    for (expect, (line, _)) in (header.after + 1..).zip(records) {
        let record: Record = parse(&path, line).map_err(corrupt)?;
        if record.seq != expect {
            return Err(corrupt(StoreError::Unreadable {
                path: path.clone(),
                reason: format!("record {} follows record {}", record.seq, expect - 1),
            }));
        }
        last = record.seq;
        if record.seq > base {
            apply(&mut state, &record);
            pos.seq = record.seq;
        }
    }
    // A compaction cut off before it replaced the journal: state.json includes all of it, and
    // the next record starts a fresh journal.
    pos.reset = last < base;
    Ok(Outcome::Loaded(Box::new(Cached { state, pos })))
}

/// `state.json` (`None` when missing); a file that does not parse is an error naming it.
fn read_state_file(path: &Path) -> Result<Option<State>> {
    let bytes = match fs::read(path) {
        Ok(b) => b,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(StoreError::io("read", path)(e)),
    };
    super::records_scan::state_from_slice(&bytes)
        .map(Some)
        .map_err(|e| StoreError::Unreadable {
            path: path.to_owned(),
            reason: e.to_string(),
        })
}

fn apply(state: &mut State, record: &Record) {
    for op in &record.ops {
        match op {
            Op::Put(p) => match state.pending_for_mut(p.action_id) {
                Some(at) => *at = p.clone(),
                None => state.pending.push(p.clone()),
            },
            Op::Remove(id) => state.pending.retain(|p| p.action_id != *id),
        }
    }
    state.updated_at = record.at;
}

/// Durably append `ops`, already applied to `c.state`, as the next record (under the store lock).
/// Returns whether the journal has grown enough to be compacted.
pub fn append(
    store: &AutopilotStore,
    c: &mut Cached,
    ops: Vec<Op>,
    at: DateTime<Utc>,
) -> Result<bool> {
    let path = store.journal_path();
    if c.pos.reset {
        let header = frame(&Header { after: c.pos.seq });
        write_atomic(&path, &header)?;
        c.pos.journal_ino = FileId::of(&path)?.map(|f| f.ino);
        c.pos.journal_valid = header.len() as u64;
        c.pos.journal_after = c.pos.seq;
        c.pos.reset = false;
    }
    let record = Record {
        seq: c.pos.seq + 1,
        at,
        ops,
    };
    let line = frame(&record);
    let mut file = OpenOptions::new()
        .write(true)
        .open(&path)
        .map_err(StoreError::io("open", &path))?;
    // A torn record a crashed writer left is cut off before this one follows it.
    let len = file
        .metadata()
        .map_err(StoreError::io("stat", &path))?
        .len();
    if len != c.pos.journal_valid {
        file.set_len(c.pos.journal_valid)
            .map_err(StoreError::io("truncate", &path))?;
    }
    file.seek(SeekFrom::Start(c.pos.journal_valid))
        .map_err(StoreError::io("seek", &path))?;
    file.write_all(&line)
        .map_err(StoreError::io("append to", &path))?;
    file.sync_data().map_err(StoreError::io("fsync", &path))?;
    super::stats::fsync();
    super::stats::journal_append();
    // The transaction changed `c.state` already: replaying would only scan the queue again.
    c.state.updated_at = record.at;
    c.pos.seq = record.seq;
    c.pos.journal_valid += line.len() as u64;
    let state_len = c.pos.state_file.map_or(0, |f| f.len);
    Ok(c.pos.journal_valid > MIN_COMPACT_BYTES.max(state_len))
}

/// What [`append_new`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Blind {
    /// Appended; `true` when the journal has grown enough to be compacted.
    Appended(bool),
    /// The files are not as a compaction and appends leave them (no journal, a journal that does
    /// not continue `state.json`, a `state.json` rover did not write): nothing was written, the
    /// caller takes the full path, which reads the queue and says what is wrong.
    Unusual,
}

/// Durably append `ops` as the next record without reading the queue in `state.json` (under the
/// store lock, for a cold handle): only the ends of `state.json` (its `version` and its
/// `journalSeq`) and the journal itself are read. Meant for puts of entries nobody else can have
/// queued yet (a new trace's first action): a put replaces an entry of the same id.
///
/// The sequence rules of [`load`] hold: the record follows the journal's last whole record, a
/// torn last line is cut off first, and anything else out of the ordinary (no `state.json` or no
/// journal, a journal header ahead of `state.json`, records out of order, a compaction cut off
/// between its two writes so that `state.json` is ahead of the journal, a damaged line) is
/// [`Blind::Unusual`].
pub fn append_new(store: &AutopilotStore, ops: Vec<Op>, at: DateTime<Utc>) -> Result<Blind> {
    let state_path = store.state_path();
    let Some((base, state_len)) = state_ends(&state_path)? else {
        return Ok(Blind::Unusual);
    };
    let path = store.journal_path();
    let mut file = match OpenOptions::new().read(true).write(true).open(&path) {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Blind::Unusual),
        Err(e) => return Err(StoreError::io("open", &path)(e)),
    };
    let mut bytes = Vec::new();
    file.read_to_end(&mut bytes)
        .map_err(StoreError::io("read", &path))?;
    // A damaged line: the full path names the file and keeps a copy of it.
    let Ok(lines) = split(&path, &bytes, 0, true) else {
        return Ok(Blind::Unusual);
    };
    let Some(((header, _), records)) = lines.records.split_first() else {
        return Ok(Blind::Unusual);
    };
    let Ok(header) = serde_json::from_slice::<Header>(header) else {
        return Ok(Blind::Unusual);
    };
    if header.after > base {
        return Ok(Blind::Unusual);
    }
    let mut last = header.after;
    for (line, _) in records {
        match serde_json::from_slice::<SeqOnly>(line) {
            Ok(r) if r.seq == last + 1 => last = r.seq,
            _ => return Ok(Blind::Unusual),
        }
    }
    if last < base {
        return Ok(Blind::Unusual);
    }
    let line = frame(&Record {
        seq: last + 1,
        at,
        ops,
    });
    if bytes.len() as u64 != lines.valid {
        file.set_len(lines.valid)
            .map_err(StoreError::io("truncate", &path))?;
    }
    file.seek(SeekFrom::Start(lines.valid))
        .map_err(StoreError::io("seek", &path))?;
    file.write_all(&line)
        .map_err(StoreError::io("append to", &path))?;
    file.sync_data().map_err(StoreError::io("fsync", &path))?;
    super::stats::fsync();
    super::stats::journal_append();
    let size = lines.valid + line.len() as u64;
    Ok(Blind::Appended(size > MIN_COMPACT_BYTES.max(state_len)))
}

/// A record's sequence number alone (its operations are skipped, not built).
#[derive(Deserialize)]
struct SeqOnly {
    seq: u64,
}

/// How far the ends of `state.json` are read.
const ENDS: u64 = 64;

/// `state.json`'s `journalSeq` and length, read from its two ends only, when it is as rover
/// writes it (pretty-printed, `"version": "1.` first, `"journalSeq": N` last); `None` otherwise
/// (missing, another writer's layout, no `journalSeq`).
///
/// In a JSON document that ends with `\n  "journalSeq": N\n}\n`, the closing brace is the
/// top-level object's and the line before it its last member: `N` is the value every reader
/// takes (the last of a repeated key wins, as in [`state_seq`]).
fn state_ends(path: &Path) -> Result<Option<(u64, u64)>> {
    let mut file = match File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(StoreError::io("open", path)(e)),
    };
    let len = file.metadata().map_err(StoreError::io("stat", path))?.len();
    let mut head = [0u8; 18];
    if len < head.len() as u64 {
        return Ok(None);
    }
    let mut tail = vec![0u8; usize::try_from(len.min(ENDS)).expect("at most ENDS")];
    file.read_exact(&mut head)
        .and_then(|()| file.seek(SeekFrom::Start(len - tail.len() as u64)))
        .and_then(|_| file.read_exact(&mut tail))
        .map_err(StoreError::io("read", path))?;
    if !head.starts_with(b"{\n  \"version\": \"1.") {
        return Ok(None);
    }
    Ok(seq_at_end(&tail).map(|seq| (seq, len)))
}

/// `N` of a tail `...\n  "journalSeq": N\n}\n` (`N` a JSON number that is a `u64`).
fn seq_at_end(tail: &[u8]) -> Option<u64> {
    let rest = tail.strip_suffix(b"\n}\n")?;
    let digits = rest.len() - rest.iter().rev().take_while(|b| b.is_ascii_digit()).count();
    let (before, n) = rest.split_at(digits);
    before.strip_suffix(b"\n  \"journalSeq\": ")?;
    if n.is_empty() || (n.len() > 1 && n[0] == b'0') {
        return None;
    }
    std::str::from_utf8(n).ok()?.parse().ok()
}

/// Write the whole state to `state.json` as the next sequence number, then start the journal
/// afresh after it (under the store lock). A crash in between leaves records that `state.json`
/// already includes: replay skips them.
pub fn compact(store: &AutopilotStore, c: &mut Cached) -> Result<()> {
    let seq = c.pos.seq + 1;
    c.state.extra.insert(SEQ_KEY.into(), seq.into());
    let mut bytes = super::records_ser::state_to_vec_pretty(&mut c.state);
    bytes.push(b'\n');
    write_atomic(&store.state_path(), &bytes)?;
    let header = frame(&Header { after: seq });
    let path = store.journal_path();
    write_atomic(&path, &header)?;
    c.pos = Position {
        state_file: FileId::of(&store.state_path())?,
        journal_ino: FileId::of(&path)?.map(|f| f.ino),
        journal_valid: header.len() as u64,
        journal_after: seq,
        seq,
        reset: false,
    };
    Ok(())
}

/// CRC-32 (IEEE), table-driven: a cold reader checks every line of the journal.
fn crc32(bytes: &[u8]) -> u32 {
    const TABLE: [u32; 256] = {
        let mut table = [0u32; 256];
        let mut i: u32 = 0;
        while i < 256 {
            let mut crc = i;
            let mut bit = 0;
            while bit < 8 {
                crc = if crc & 1 == 1 {
                    (crc >> 1) ^ 0xEDB8_8320
                } else {
                    crc >> 1
                };
                bit += 1;
            }
            table[i as usize] = crc;
            i += 1;
        }
        table
    };
    let mut crc = !0u32;
    for b in bytes {
        crc = TABLE[((crc ^ u32::from(*b)) & 0xFF) as usize] ^ (crc >> 8);
    }
    !crc
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc32_is_the_ieee_one() {
        assert_eq!(crc32(b"123456789"), 0xCBF4_3926);
    }

    #[test]
    fn a_torn_last_line_is_left_out_and_a_bad_middle_line_is_an_error() {
        let path = Path::new("state.journal");
        let mut bytes = frame(&Header { after: 0 });
        let good = bytes.len() as u64;
        bytes.extend_from_slice(b"0000 {\"seq\":1");
        let lines = split(path, &bytes, 0, true).unwrap();
        assert_eq!(lines.records.len(), 1);
        assert_eq!(lines.valid, good);

        let mut bytes = frame(&Header { after: 0 });
        bytes.extend_from_slice(b"00000000 {\"seq\":1}\n");
        bytes.extend_from_slice(&frame(&Header { after: 0 }));
        let err = split(path, &bytes, 0, true).unwrap_err();
        assert!(err.to_string().contains("state.journal"), "{err}");
        assert!(err.to_string().contains("record 2"), "{err}");
    }
}
