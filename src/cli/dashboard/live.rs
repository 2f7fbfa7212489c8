//! Live updates without polling: a thread blocks on inotify over each store's `spans/` and
//! `autopilot/` directories and counts the changes that matter (a span written, the queue
//! written); each server-sent-events stream renders the Now page's live part again when the
//! count moves, and sends it. The data dir's `projects/` is watched too, so a store created
//! after the dashboard started is watched from then on. While runs go on, the live part is
//! also sent again every 2 s (the agent's output and the proxy's refusals are in files not
//! watched). An idle store costs nothing: no timer, no read.

use std::collections::HashMap;
use std::convert::Infallible;
use std::path::{Path, PathBuf};
use std::time::Duration;

use axum::extract::State;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures_util::stream::{self, Stream};
use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify, InotifyEvent, WatchDescriptor};
use tokio::sync::watch;

use super::Shared;

/// How long a burst of writes (a span and the queue in one step) is gathered into one update.
const SETTLE: Duration = Duration::from_millis(60);

/// While runs go on, how often the live part is sent again though no span or queue was written:
/// an agent's last output line and the proxy's refusals change in files that are not watched
/// (an agent's log is written on every line it prints). With nothing running, nothing ticks.
const WHILE_RUNNING: Duration = Duration::from_secs(2);

/// Whether a file written in a store changes what the Now page shows: a span (`spans/`), the
/// queue (`state.json`, `state.journal`), the list of traces. The log, the locks and temp files
/// do not.
fn matters(event: &InotifyEvent) -> bool {
    let Some(name) = event.name.as_ref().and_then(|n| n.to_str()) else {
        return false;
    };
    let json = std::path::Path::new(name)
        .extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("json"));
    json && !name.starts_with('.') || name == "state.journal" || name == "traces.jsonl"
}

/// What a watched directory is, and so what its events mean.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Level {
    /// The data dir: `projects/` may appear in it.
    Data,
    /// `<data>/projects`: a store's directory may appear in it.
    Projects,
    /// A store's root: its `spans/` and `autopilot/` may appear in it.
    Store,
    /// A store's `spans/` or `autopilot/`: what is written there matters ([`matters`]).
    Files,
}

/// The inotify watches and what each watches.
struct Watches {
    inotify: Inotify,
    levels: HashMap<WatchDescriptor, (Level, PathBuf)>,
}

impl Watches {
    /// Watches `dir` as `level`, and what already is beneath it; whether anything was added.
    fn add(&mut self, dir: &Path, level: Level) -> bool {
        let flags = match level {
            Level::Files => {
                AddWatchFlags::IN_CLOSE_WRITE
                    | AddWatchFlags::IN_MOVED_TO
                    | AddWatchFlags::IN_MODIFY
                    | AddWatchFlags::IN_DELETE
            }
            _ => AddWatchFlags::IN_CREATE | AddWatchFlags::IN_MOVED_TO | AddWatchFlags::IN_ONLYDIR,
        };
        match self.inotify.add_watch(dir, flags) {
            Ok(wd) => {
                self.levels.insert(wd, (level, dir.to_owned()));
            }
            Err(e) => {
                if level == Level::Files {
                    eprintln!("dashboard: cannot watch {} ({e})", dir.display());
                }
                return false;
            }
        }
        // What was created before the watch was added is watched now.
        if let Ok(entries) = std::fs::read_dir(dir) {
            for entry in entries.flatten() {
                if let Some(below) = below(level, &entry.file_name().to_string_lossy()) {
                    self.add(&entry.path(), below);
                }
            }
        }
        true
    }

    /// Handles `events`; whether the Now page may have changed.
    fn handle(&mut self, events: &[InotifyEvent]) -> bool {
        let mut changed = false;
        for event in events {
            let Some((level, dir)) = self.levels.get(&event.wd).cloned() else {
                continue;
            };
            if level == Level::Files {
                changed |= matters(event);
                continue;
            }
            let Some(name) = event
                .name
                .as_ref()
                .map(|n| n.to_string_lossy().into_owned())
            else {
                continue;
            };
            if let Some(below) = below(level, &name) {
                // A store that appeared is shown at once, as it is.
                changed |= self.add(&dir.join(&name), below) && below == Level::Files;
                changed |= below == Level::Store;
            }
        }
        changed
    }
}

/// What the directory `name` inside one of `level` is, when it is watched.
fn below(level: Level, name: &str) -> Option<Level> {
    match level {
        Level::Data => (name == "projects").then_some(Level::Projects),
        Level::Projects => (!name.starts_with('.')).then_some(Level::Store),
        Level::Store => matches!(name, "spans" | "autopilot").then_some(Level::Files),
        Level::Files => None,
    }
}

/// Watches the stores under each of `data_dirs` (`<data>/projects/<id>/`), those there now and
/// those that appear later, and counts the changes; when they cannot be watched it is said on
/// stderr and the page is then only as fresh as a reload.
pub fn watch(data_dirs: &[PathBuf]) -> watch::Receiver<u64> {
    let (tx, rx) = watch::channel(0u64);
    let inotify = match Inotify::init(InitFlags::IN_CLOEXEC) {
        Ok(i) => i,
        Err(e) => {
            eprintln!(
                "dashboard: cannot watch the stores ({e}): the Now page updates on reload only"
            );
            return rx;
        }
    };
    let mut watches = Watches {
        inotify,
        levels: HashMap::new(),
    };
    for data in data_dirs {
        if !watches.add(data, Level::Data) {
            eprintln!(
                "dashboard: cannot watch {}: the Now page updates on reload only",
                data.display()
            );
        }
    }
    std::thread::Builder::new()
        .name("rover-dashboard-watch".into())
        .spawn(move || loop {
            match watches.inotify.read_events() {
                Ok(events) => {
                    if watches.handle(&events) {
                        tx.send_modify(|n| *n += 1);
                    }
                    if tx.is_closed() {
                        return;
                    }
                }
                Err(nix::errno::Errno::EINTR) => {}
                Err(e) => {
                    eprintln!("dashboard: the watch of the stores stopped ({e})");
                    return;
                }
            }
        })
        .expect("a thread for the store watch");
    rx
}

/// `GET /live`: an `now` event with the Now page's live part at once, then after each change.
pub async fn stream(State(shared): State<Shared>) -> Response {
    let changes = shared.changes.clone();
    Sse::new(updates(shared, changes))
        .keep_alive(KeepAlive::new().interval(Duration::from_secs(15)))
        .into_response()
}

fn updates(
    shared: Shared,
    changes: watch::Receiver<u64>,
) -> impl Stream<Item = Result<Event, Infallible>> {
    // The state: whether this is the first event, and whether runs went on at the last one.
    stream::unfold(
        (shared, changes, true, false),
        |(shared, mut changes, first, running)| async move {
            if !first {
                let tick = async {
                    if running {
                        tokio::time::sleep(WHILE_RUNNING).await;
                    } else {
                        std::future::pending::<()>().await;
                    }
                };
                tokio::select! {
                    changed = changes.changed() => {
                        changed.ok()?;
                        tokio::time::sleep(SETTLE).await;
                    }
                    () = tick => {}
                }
                changes.borrow_and_update();
            }
            let render = shared.clone();
            let (html, runs) =
                tokio::task::spawn_blocking(move || super::now::live_part_and_runs(&render))
                    .await
                    .ok()?;
            let event = Event::default().event("now").data(html);
            Some((Ok(event), (shared, changes, false, runs > 0)))
        },
    )
}
