//! Process-wide counters of the store's durable I/O: atomic writes, fsyncs, journal appends, and
//! the time spent waiting for and holding the store lock. Relaxed atomic adds, cheap enough to
//! stay on in production; the bench reads them around a workload to say where its time goes.
//!
//! Counters only, never a decision: nothing in the store reads them back.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

static DURABLE_WRITES: AtomicU64 = AtomicU64::new(0);
static FSYNCS: AtomicU64 = AtomicU64::new(0);
static JOURNAL_APPENDS: AtomicU64 = AtomicU64::new(0);
static LOCKS: AtomicU64 = AtomicU64::new(0);
static LOCK_WAIT_NS: AtomicU64 = AtomicU64::new(0);
static LOCK_HOLD_NS: AtomicU64 = AtomicU64::new(0);

/// A snapshot of the counters since the process started; subtract two to get a window.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct IoStats {
    /// Writes that are durable when they return: atomic file replacements and journal appends.
    pub durable_writes: u64,
    /// `fsync`/`fdatasync` calls, on files and directories.
    pub fsyncs: u64,
    /// Of the durable writes, appends to `state.journal`.
    pub journal_appends: u64,
    /// Store-lock acquisitions.
    pub locks: u64,
    /// Total time spent blocked on the store lock.
    pub lock_wait: Duration,
    /// Total time the store lock was held.
    pub lock_hold: Duration,
}

impl std::ops::Sub for IoStats {
    type Output = IoStats;
    fn sub(self, earlier: IoStats) -> IoStats {
        IoStats {
            durable_writes: self.durable_writes - earlier.durable_writes,
            fsyncs: self.fsyncs - earlier.fsyncs,
            journal_appends: self.journal_appends - earlier.journal_appends,
            locks: self.locks - earlier.locks,
            lock_wait: self.lock_wait.saturating_sub(earlier.lock_wait),
            lock_hold: self.lock_hold.saturating_sub(earlier.lock_hold),
        }
    }
}

/// The counters as they are now.
pub fn io_stats() -> IoStats {
    IoStats {
        durable_writes: DURABLE_WRITES.load(Ordering::Relaxed),
        fsyncs: FSYNCS.load(Ordering::Relaxed),
        journal_appends: JOURNAL_APPENDS.load(Ordering::Relaxed),
        locks: LOCKS.load(Ordering::Relaxed),
        lock_wait: Duration::from_nanos(LOCK_WAIT_NS.load(Ordering::Relaxed)),
        lock_hold: Duration::from_nanos(LOCK_HOLD_NS.load(Ordering::Relaxed)),
    }
}

pub(super) fn durable_write() {
    DURABLE_WRITES.fetch_add(1, Ordering::Relaxed);
}

pub(super) fn journal_append() {
    JOURNAL_APPENDS.fetch_add(1, Ordering::Relaxed);
    DURABLE_WRITES.fetch_add(1, Ordering::Relaxed);
}

pub(super) fn fsync() {
    FSYNCS.fetch_add(1, Ordering::Relaxed);
}

pub(super) fn lock_waited(wait: Duration) {
    LOCKS.fetch_add(1, Ordering::Relaxed);
    LOCK_WAIT_NS.fetch_add(nanos(wait), Ordering::Relaxed);
}

pub(super) fn lock_held(hold: Duration) {
    LOCK_HOLD_NS.fetch_add(nanos(hold), Ordering::Relaxed);
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}
