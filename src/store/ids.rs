//! The id-prefix index: `autopilot/ids/<xx>.txt` lists the ids of spans and actions whose id
//! starts with the two hex characters `xx`, one `<kind> <id>` line each, appended when a record
//! is created. It turns a prefix lookup into one small read instead of listing directories of
//! 100,000 files.
//!
//! A cache: appends are not fsynced, a torn last line is ignored, and a lookup that finds nothing
//! falls back to scanning the record directories, so an id lost in a crash is still found.

use std::fs::{self, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use uuid::Uuid;

/// What kind of record an id names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum IdKind {
    Span,
    Action,
}

impl IdKind {
    fn letter(self) -> char {
        match self {
            IdKind::Span => 's',
            IdKind::Action => 'a',
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            IdKind::Span => "span",
            IdKind::Action => "action",
        }
    }
}

pub fn shard_path(dir: &Path, prefix: &str) -> PathBuf {
    dir.join(format!("{}.txt", &prefix[..2]))
}

/// Record a new id (one `write` of one line, so concurrent appenders never interleave).
pub fn append(dir: &Path, kind: IdKind, id: Uuid) -> io::Result<()> {
    fs::create_dir_all(dir)?;
    let text = id.to_string();
    let mut file = OpenOptions::new()
        .create(true)
        .append(true)
        .open(shard_path(dir, &text))?;
    file.write_all(format!("{} {text}\n", kind.letter()).as_bytes())
}

/// The ids of the shard of `prefix` that start with it; `None` if the shard does not exist.
pub fn lookup(dir: &Path, prefix: &str) -> io::Result<Option<Vec<(IdKind, Uuid)>>> {
    let text = match fs::read_to_string(shard_path(dir, prefix)) {
        Ok(t) => t,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    let mut out = Vec::new();
    for line in text.lines() {
        let Some((kind, id)) = line.split_once(' ') else {
            continue;
        };
        let kind = match kind {
            "s" => IdKind::Span,
            "a" => IdKind::Action,
            _ => continue,
        };
        if id.starts_with(prefix) {
            if let Ok(id) = Uuid::parse_str(id) {
                if !out.contains(&(kind, id)) {
                    out.push((kind, id));
                }
            }
        }
    }
    Ok(Some(out))
}
