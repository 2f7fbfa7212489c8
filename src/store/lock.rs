//! Locks: the store lock that serializes read-modify-write of the shared files across threads and
//! processes, and the daemon lock that allows one `rover autopilot start` per project.
//!
//! Both are `flock(2)` locks (fs2) on dedicated files that are never renamed over. std's `File`
//! has inherent lock methods since Rust 1.89 that shadow fs2's, so fs2 is called by full path.

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use std::time::Instant;

use super::error::{Result, StoreError};
use super::stats;

/// An exclusive hold on `autopilot/lock`, released on drop (or when the process dies).
#[derive(Debug)]
pub struct StoreLock {
    file: File,
    /// When the lock was taken (for the hold-time counter).
    since: Instant,
}

impl StoreLock {
    /// Block until the lock is held. Each call opens its own file description, so two threads of
    /// one process exclude each other as two processes do.
    pub fn acquire(path: &Path) -> Result<StoreLock> {
        let file = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(path)
            .map_err(StoreError::io("open the lock file", path))?;
        let asked = Instant::now();
        fs2::FileExt::lock_exclusive(&file).map_err(StoreError::io("lock", path))?;
        let since = Instant::now();
        stats::lock_waited(since - asked);
        Ok(StoreLock { file, since })
    }
}

impl Drop for StoreLock {
    fn drop(&mut self) {
        let _ = fs2::FileExt::unlock(&self.file);
        stats::lock_held(self.since.elapsed());
    }
}

/// The daemon's hold on `autopilot/daemon.lock`, whose content is the holder's pid.
#[derive(Debug)]
pub struct DaemonLock {
    file: File,
    path: PathBuf,
}

impl DaemonLock {
    /// Take the lock without waiting on a daemon; if another one holds it, name its pid. A
    /// lock held while the pid in it is no live process is a `gc` sweeping this store's
    /// leftovers (it holds the lock shared for a moment, never writing it): waited for, a
    /// few seconds at most.
    pub fn try_acquire(path: &Path) -> Result<DaemonLock> {
        let mut file = OpenOptions::new()
            .create(true)
            .truncate(false)
            .read(true)
            .write(true)
            .open(path)
            .map_err(StoreError::io("open the daemon lock", path))?;
        let deadline = Instant::now() + std::time::Duration::from_secs(5);
        while fs2::FileExt::try_lock_exclusive(&file).is_err() {
            let pid = read_pid(&mut file);
            if pid.as_deref().is_some_and(alive) || Instant::now() > deadline {
                return Err(StoreError::DaemonRunning {
                    pid: pid.unwrap_or_else(|| "unknown".into()),
                });
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        file.set_len(0).map_err(StoreError::io("truncate", path))?;
        file.seek(SeekFrom::Start(0))
            .map_err(StoreError::io("seek", path))?;
        writeln!(file, "{}", std::process::id()).map_err(StoreError::io("write", path))?;
        file.sync_data().map_err(StoreError::io("fsync", path))?;
        Ok(DaemonLock {
            file,
            path: path.to_owned(),
        })
    }

    /// The pid of a running daemon, if one holds the lock at `path`.
    pub fn holder(path: &Path) -> Option<String> {
        let mut file = OpenOptions::new().read(true).write(true).open(path).ok()?;
        if fs2::FileExt::try_lock_shared(&file).is_ok() {
            let _ = fs2::FileExt::unlock(&file);
            return None;
        }
        read_pid(&mut file)
    }
}

/// Whether `pid` names a live process (one of another user's counts).
fn alive(pid: &str) -> bool {
    pid.parse::<i32>().is_ok_and(|pid| {
        pid > 0
            && !matches!(
                nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None),
                Err(nix::errno::Errno::ESRCH)
            )
    })
}

/// The pid in a held daemon lock. The holder writes it just after taking the lock, so an empty
/// file is read again for a moment (a second `start` racing the first one sees its pid).
fn read_pid(file: &mut File) -> Option<String> {
    for _ in 0..50 {
        let mut pid = String::new();
        if file.seek(SeekFrom::Start(0)).is_ok() && file.read_to_string(&mut pid).is_ok() {
            let pid = pid.trim();
            if !pid.is_empty() {
                return Some(pid.to_owned());
            }
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    None
}

impl Drop for DaemonLock {
    fn drop(&mut self) {
        let _ = self.file.set_len(0);
        let _ = fs2::FileExt::unlock(&self.file);
        let _ = &self.path;
    }
}
