//! What a store's directory says of its daemon: gone, never started, running (it holds the
//! daemon lock) or dead. A dead store's lock is held (shared, without writing it) while its
//! resources are removed, so no daemon starts on it meanwhile: one that tries waits a moment
//! (see [`crate::store::DaemonLock::try_acquire`]).

use std::collections::BTreeSet;
use std::fs::{File, OpenOptions};
use std::io::ErrorKind;
use std::os::unix::fs::OpenOptionsExt as _;
use std::path::Path;

/// A store's state, as its directory and daemon lock say.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum StoreState {
    /// No such directory.
    Gone,
    /// A directory without a daemon lock: no daemon ever ran on it.
    NeverStarted,
    /// A daemon holds its lock.
    DaemonRuns,
    /// Its lock is free: no daemon runs on it. `queued`: the container names of the runs its
    /// queue still holds (`rover-<action id>`), which its next start takes up.
    DaemonDead { queued: BTreeSet<String> },
    /// Why it cannot be told.
    Unreadable(String),
}

/// The daemon lock of the store at `root` (as [`crate::store::AutopilotStore::daemon_lock_path`]),
/// or of the daemon dir at `root` of a daemon serving a daemon file (`<data dir>/daemon`, the
/// owner of the proxy server its repositories share, and of that server's relays and networks).
fn lock_path(root: &Path) -> std::path::PathBuf {
    if is_daemon_dir(root) {
        return root.join(DAEMON_LOCK);
    }
    root.join("autopilot").join("daemon.lock")
}

/// The lock of a daemon serving a daemon file, in its dir.
const DAEMON_LOCK: &str = "daemon.lock";

/// Whether `root` is the dir of a daemon serving a daemon file: `<data dir>/daemon`, with its
/// lock in it (a store keeps its lock in `autopilot/`).
fn is_daemon_dir(root: &Path) -> bool {
    root.file_name().is_some_and(|n| n == "daemon")
        && std::fs::symlink_metadata(root.join(DAEMON_LOCK)).is_ok()
        && std::fs::symlink_metadata(root.join("autopilot")).is_err()
}

/// The state of the store at `root`; for a dead one, its lock, held shared until dropped.
/// Only looks: nothing is created or written.
pub(crate) fn inspect(root: &Path) -> (StoreState, Option<File>) {
    match std::fs::symlink_metadata(root) {
        Err(e) if e.kind() == ErrorKind::NotFound => return (StoreState::Gone, None),
        Err(e) => {
            return (
                StoreState::Unreadable(format!("{}: {e}", root.display())),
                None,
            )
        }
        Ok(m) if !m.is_dir() => {
            return (
                StoreState::Unreadable(format!("{} is not a directory", root.display())),
                None,
            )
        }
        Ok(_) => {}
    }
    let lock = lock_path(root);
    match std::fs::symlink_metadata(&lock) {
        Err(e) if e.kind() == ErrorKind::NotFound => return (StoreState::NeverStarted, None),
        Err(e) => {
            return (
                StoreState::Unreadable(format!("{}: {e}", lock.display())),
                None,
            )
        }
        Ok(m) if !m.file_type().is_file() => {
            return (
                StoreState::Unreadable(format!("{} is not a file", lock.display())),
                None,
            )
        }
        Ok(_) => {}
    }
    let file = match OpenOptions::new()
        .read(true)
        .custom_flags(nix::libc::O_NOFOLLOW)
        .open(&lock)
    {
        Ok(file) => file,
        Err(e) => {
            return (
                StoreState::Unreadable(format!("{}: {e}", lock.display())),
                None,
            )
        }
    };
    match fs2::FileExt::try_lock_shared(&file) {
        Ok(()) => match queued(root) {
            Ok(queued) => (StoreState::DaemonDead { queued }, Some(file)),
            Err(why) => (StoreState::Unreadable(why), None),
        },
        Err(e) if e.kind() == fs2::lock_contended_error().kind() => (StoreState::DaemonRuns, None),
        Err(e) => (
            StoreState::Unreadable(format!("lock {}: {e}", lock.display())),
            None,
        ),
    }
}

/// The container names of the runs the queue of the store at `root` holds (read under its
/// daemon lock, held shared: no daemon writes it meanwhile).
fn queued(root: &Path) -> Result<BTreeSet<String>, String> {
    if is_daemon_dir(root) {
        return queued_of_daemon(root);
    }
    let (Some(project), Some(data_dir)) = (root.file_name(), root.parent().and_then(Path::parent))
    else {
        return Err(format!("{} is no store's directory", root.display()));
    };
    let state = crate::store::AutopilotStore::open_existing(data_dir, &project.to_string_lossy())
        .and_then(|store| store.read_state())
        .map_err(|e| {
            format!(
                "the queue of {}: {}",
                root.display(),
                crate::error::error_chain(&e)
            )
        })?;
    Ok(state
        .pending
        .iter()
        .map(|p| format!("rover-{}", p.action_id))
        .collect())
}

/// The runs the queues of the repositories a daemon file's daemon (dir `root`) served through
/// its shared proxy server hold: those with a store dir under its `proxy/`.
fn queued_of_daemon(root: &Path) -> Result<BTreeSet<String>, String> {
    let Some(data_dir) = root.parent() else {
        return Err(format!("{} is no daemon's directory", root.display()));
    };
    let shared = root.join("proxy");
    let keys = match std::fs::read_dir(&shared) {
        Ok(entries) => entries
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|key| crate::proxy::is_valid_key(key))
            .collect::<Vec<_>>(),
        Err(e) if e.kind() == ErrorKind::NotFound => Vec::new(),
        Err(e) => return Err(format!("{}: {e}", shared.display())),
    };
    let mut all = BTreeSet::new();
    for key in keys {
        let store = data_dir.join("projects").join(&key);
        if std::fs::symlink_metadata(&store).is_ok() {
            all.extend(queued(&store)?);
        }
    }
    Ok(all)
}

/// The stores met in one sweep: each inspected once, the dead ones' locks held while `hold`.
#[derive(Debug, Default)]
pub(crate) struct Stores {
    hold: bool,
    held: Vec<File>,
}

impl Stores {
    pub fn new(hold: bool) -> Stores {
        Stores {
            hold,
            held: Vec::new(),
        }
    }

    /// The state of the store at `root` (its lock kept when dead and holding).
    pub fn state(&mut self, root: &Path) -> StoreState {
        let (state, lock) = inspect(root);
        if let (true, Some(lock)) = (self.hold, lock) {
            self.held.push(lock);
        }
        state
    }
}

impl Drop for Stores {
    fn drop(&mut self) {
        for file in &self.held {
            let _ = fs2::FileExt::unlock(file);
        }
    }
}
