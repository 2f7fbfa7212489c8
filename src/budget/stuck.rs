//! Stuck detection: a workflow agent is stuck when its container's log does not grow and no file
//! of its worktree changes for a configured time. [`StuckWatch`] remembers the last activity
//! seen per run; [`newest_change`] finds the newest modification in a worktree.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime};

use uuid::Uuid;

/// The newest modification time of a file under `dir` (`.git` skipped), walking at most
/// `limit` entries. Blocking: call off the async runtime.
pub fn newest_change(dir: &Path, limit: usize) -> Option<SystemTime> {
    let mut newest: Option<SystemTime> = None;
    let mut stack = vec![dir.to_path_buf()];
    let mut seen = 0usize;
    while let Some(d) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for entry in entries.flatten() {
            seen += 1;
            if seen > limit {
                return newest;
            }
            if entry.file_name() == ".git" {
                continue;
            }
            // `DirEntry::metadata` does not follow links: a link the agent made to a host dir
            // is never walked.
            let Ok(meta) = entry.metadata() else {
                continue;
            };
            if let Ok(m) = meta.modified() {
                newest = Some(newest.map_or(m, |n| n.max(m)));
            }
            if meta.is_dir() {
                stack.push(entry.path());
            }
        }
    }
    newest
}

#[derive(Debug, Clone, Copy)]
struct Seen {
    log_bytes: u64,
    newest: Option<SystemTime>,
    since: Instant,
}

/// See the module documentation.
#[derive(Debug, Default)]
pub struct StuckWatch {
    seen: Mutex<HashMap<Uuid, Seen>>,
    /// Background tasks that copy a running container's log to a file (one per run).
    followers: Mutex<HashMap<Uuid, tokio::task::AbortHandle>>,
}

impl StuckWatch {
    /// Run `follow` (a log follower that ends when the container does) for run `id`, unless
    /// one already runs.
    pub fn follow<F>(&self, id: Uuid, follow: F)
    where
        F: std::future::Future<Output = ()> + Send + 'static,
    {
        let mut followers = self
            .followers
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if followers.get(&id).is_some_and(|h| !h.is_finished()) {
            return;
        }
        followers.insert(id, tokio::spawn(follow).abort_handle());
    }

    /// Record what run `id` shows now; returns how long it has shown nothing new.
    pub fn observe(&self, id: Uuid, log_bytes: u64, newest: Option<SystemTime>) -> Duration {
        let now = Instant::now();
        let mut seen = self
            .seen
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let entry = seen.entry(id).or_insert(Seen {
            log_bytes,
            newest,
            since: now,
        });
        if entry.log_bytes != log_bytes || entry.newest != newest {
            *entry = Seen {
                log_bytes,
                newest,
                since: now,
            };
        }
        now.duration_since(entry.since)
    }

    /// Forget a run (it ended).
    pub fn forget(&self, id: Uuid) {
        self.seen
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .remove(&id);
        if let Some(h) = self
            .followers
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .remove(&id)
        {
            h.abort();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn activity_resets_the_idle_time() {
        let w = StuckWatch::default();
        let id = Uuid::new_v4();
        assert_eq!(w.observe(id, 0, None), Duration::ZERO);
        std::thread::sleep(Duration::from_millis(20));
        assert!(w.observe(id, 0, None) >= Duration::from_millis(20));
        assert_eq!(w.observe(id, 5, None), Duration::ZERO);
        let dir = tempfile::tempdir().unwrap();
        assert!(newest_change(dir.path(), 100).is_none());
        std::fs::write(dir.path().join("a"), "x").unwrap();
        assert!(newest_change(dir.path(), 100).is_some());
    }
}
