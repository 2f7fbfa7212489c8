//! What is watched of detached runs between looks: the task that follows each run's log, and
//! the last activity seen (for stuck detection: a run is stuck when its log does not grow and no
//! file of its worktree changes for a configured time). [`newest_change`] finds the newest
//! modification in a worktree.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime};

use uuid::Uuid;

use crate::sandbox::LogStats;

/// The newest modification time of a file under `dir` (`.git` skipped), walking at most
/// `limit` entries. Blocking: call off the async runtime.
pub(super) fn newest_change(dir: &Path, limit: usize) -> Option<SystemTime> {
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
pub struct RunWatch {
    seen: Mutex<HashMap<Uuid, Seen>>,
    /// Background tasks that copy a running container's log to a file (one per run).
    followers: Mutex<HashMap<Uuid, Follower>>,
}

/// Called when a run's log follower ends (see [`RunWatch::follow`]).
pub type OnEnd = std::sync::Arc<dyn Fn() + Send + Sync>;

/// A log follower's task. It ends with the figures of the whole log when it saw the container
/// to its end, with `None` when its stream broke off earlier.
#[derive(Debug)]
struct Follower {
    task: tokio::task::JoinHandle<Option<LogStats>>,
    whole: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl RunWatch {
    /// Run `follow` (a log follower that ends when the container does, see [`Follower`]) for
    /// run `id`, unless one already runs or one saw the whole log (its file stands).
    /// `on_end` is called when the follower saw the container to its end: whoever looks at
    /// the run next should look now.
    pub fn follow<F>(&self, id: Uuid, follow: F, on_end: Option<OnEnd>)
    where
        F: std::future::Future<Output = Option<LogStats>> + Send + 'static,
    {
        use std::sync::atomic::Ordering;
        let mut followers = self
            .followers
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if followers
            .get(&id)
            .is_some_and(|f| !f.task.is_finished() || f.whole.load(Ordering::Acquire))
        {
            return;
        }
        let whole = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flag = whole.clone();
        let task = tokio::spawn(async move {
            let stats = follow.await;
            flag.store(stats.is_some(), Ordering::Release);
            // Only a follower that saw the container end wakes anyone: one whose stream broke
            // off (an engine that does not answer) would otherwise wake the looks in a loop.
            if let (Some(on_end), true) = (on_end, stats.is_some()) {
                on_end();
            }
            stats
        });
        followers.insert(id, Follower { task, whole });
    }

    /// The figures of run `id`'s whole log when its follower saw the container to its end,
    /// waiting at most `grace` for it to get there (the container has exited: the follower
    /// reads what is left and puts its files together). `None` when there is no follower, or
    /// it broke off or did not finish in time (it is stopped).
    pub async fn finish_following(&self, id: Uuid, grace: Duration) -> Option<LogStats> {
        let follower = self
            .followers
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .remove(&id)?;
        let mut task = follower.task;
        match tokio::time::timeout(grace, &mut task).await {
            Ok(Ok(stats)) => stats,
            Ok(Err(_)) => None,
            Err(_) => {
                task.abort();
                None
            }
        }
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
            h.task.abort();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn activity_resets_the_idle_time() {
        let w = RunWatch::default();
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

    #[tokio::test]
    async fn a_follower_that_saw_the_whole_log_stands_and_hands_over_its_figures() {
        let w = RunWatch::default();
        let id = Uuid::new_v4();
        let stats = LogStats {
            stdout_bytes: 7,
            ..LogStats::default()
        };
        let woken = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let on_end: OnEnd = {
            let woken = woken.clone();
            std::sync::Arc::new(move || {
                woken.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            })
        };
        // Broke off early: replaced by the next one, and wakes no one (an engine that does not
        // answer would otherwise wake the looks in a loop).
        w.follow(id, async { None }, Some(on_end.clone()));
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert_eq!(woken.load(std::sync::atomic::Ordering::SeqCst), 0);
        w.follow(id, async move { Some(stats) }, Some(on_end.clone()));
        tokio::time::sleep(Duration::from_millis(20)).await;
        // Saw the container to its end: whoever looks at the run is woken, once.
        assert_eq!(woken.load(std::sync::atomic::Ordering::SeqCst), 1);
        // Saw it all: no other follower starts over its file.
        w.follow(
            id,
            async { panic!("a second follower over a whole log") },
            Some(on_end),
        );
        let grace = Duration::from_secs(1);
        assert_eq!(w.finish_following(id, grace).await, Some(stats));
        assert_eq!(w.finish_following(id, grace).await, None);
        // Still following past the grace: stopped, no figures.
        w.follow(id, std::future::pending(), None);
        assert_eq!(
            w.finish_following(id, Duration::from_millis(10)).await,
            None
        );
    }
}
