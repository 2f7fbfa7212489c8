//! `autopilot/log.jsonl`: the structured log, one [`LogEntry`] a line, rotated by size
//! (`log.jsonl` → `log.jsonl.1` → … → `log.jsonl.3`, the oldest dropped).

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};

/// Rotate once the file reaches this size.
pub const MAX_BYTES: u64 = 5 * 1024 * 1024;
/// How many rotated files are kept.
pub const BACKUPS: usize = 3;

/// An append-only writer of whole lines that rotates by size. Each `write` call must carry whole
/// lines (the tracing layer writes one entry per call), so a rotation never splits an entry.
#[derive(Debug)]
pub struct RotatingLog {
    path: PathBuf,
    file: File,
    len: u64,
    max_bytes: u64,
    backups: usize,
}

impl RotatingLog {
    pub fn open(path: &Path) -> io::Result<RotatingLog> {
        RotatingLog::with_limits(path, MAX_BYTES, BACKUPS)
    }

    pub fn with_limits(path: &Path, max_bytes: u64, backups: usize) -> io::Result<RotatingLog> {
        if let Some(dir) = path.parent() {
            fs::create_dir_all(dir)?;
        }
        let file = OpenOptions::new().create(true).append(true).open(path)?;
        let len = file.metadata()?.len();
        Ok(RotatingLog {
            path: path.to_owned(),
            file,
            len,
            max_bytes,
            backups,
        })
    }

    fn backup(&self, n: usize) -> PathBuf {
        let mut name = self.path.as_os_str().to_owned();
        name.push(format!(".{n}"));
        PathBuf::from(name)
    }

    fn rotate(&mut self) -> io::Result<()> {
        self.file.flush()?;
        if self.backups == 0 {
            self.file.set_len(0)?;
        } else {
            let _ = fs::remove_file(self.backup(self.backups));
            for n in (1..self.backups).rev() {
                let from = self.backup(n);
                if from.exists() {
                    fs::rename(&from, self.backup(n + 1))?;
                }
            }
            fs::rename(&self.path, self.backup(1))?;
        }
        self.file = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.path)?;
        self.len = 0;
        Ok(())
    }
}

impl Write for RotatingLog {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if self.len > 0 && self.len + buf.len() as u64 > self.max_bytes {
            self.rotate()?;
        }
        self.file.write_all(buf)?;
        self.len += buf.len() as u64;
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        self.file.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rotates_at_the_size_limit_and_keeps_three_backups() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("log.jsonl");
        let mut log = RotatingLog::with_limits(&path, 100, 3).unwrap();
        for i in 0..20 {
            log.write_all(
                format!("{{\"n\":\"{i:03}\",\"pad\":\"{}\"}}\n", "x".repeat(30)).as_bytes(),
            )
            .unwrap();
        }
        log.flush().unwrap();
        let mut names: Vec<_> = fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        names.sort();
        assert_eq!(
            names,
            ["log.jsonl", "log.jsonl.1", "log.jsonl.2", "log.jsonl.3"]
        );
        let current = fs::read_to_string(&path).unwrap();
        assert!(
            current.contains("\"n\":\"019\""),
            "newest entry in the live file: {current}"
        );
        for name in &names {
            for line in fs::read_to_string(dir.path().join(name)).unwrap().lines() {
                serde_json::from_str::<serde_json::Value>(line).expect("whole lines only");
            }
        }
    }
}
