//! Live updates without polling: a thread blocks on inotify over each store's `spans/` and
//! `autopilot/` directories and counts the changes that matter (a span written, the queue
//! written); each server-sent-events stream renders the Now page's live part again when the
//! count moves, and sends it. An idle store costs nothing: no timer, no read.

use std::convert::Infallible;
use std::path::PathBuf;
use std::time::Duration;

use axum::extract::State;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures_util::stream::{self, Stream};
use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify, InotifyEvent};
use tokio::sync::watch;

use super::Shared;

/// How long a burst of writes (a span and the queue in one step) is gathered into one update.
const SETTLE: Duration = Duration::from_millis(60);

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

/// Watches `stores` (their roots) and counts the changes; a store that cannot be watched is
/// said on stderr and its page is then only as fresh as a reload.
pub fn watch(stores: &[PathBuf]) -> watch::Receiver<u64> {
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
    let flags = AddWatchFlags::IN_CLOSE_WRITE
        | AddWatchFlags::IN_MOVED_TO
        | AddWatchFlags::IN_MODIFY
        | AddWatchFlags::IN_DELETE;
    for root in stores {
        for dir in [root.join("spans"), root.join("autopilot")] {
            if let Err(e) = inotify.add_watch(&dir, flags) {
                eprintln!("dashboard: cannot watch {} ({e})", dir.display());
            }
        }
    }
    std::thread::Builder::new()
        .name("rover-dashboard-watch".into())
        .spawn(move || loop {
            match inotify.read_events() {
                Ok(events) => {
                    if events.iter().any(matters) {
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
    stream::unfold(
        (shared, changes, true),
        |(shared, mut changes, first)| async move {
            if !first {
                changes.changed().await.ok()?;
                tokio::time::sleep(SETTLE).await;
                changes.borrow_and_update();
            }
            let render = shared.clone();
            let html = tokio::task::spawn_blocking(move || super::now::live_part(&render))
                .await
                .ok()?;
            let event = Event::default().event("now").data(html);
            Some((Ok(event), (shared, changes, false)))
        },
    )
}
