//! What keeps one run from taking the proxy down for the others: bounded memory whatever the
//! runs send, and a fair share of it.
//!
//! - **Request bodies** are read whole (the proxy needs the model and the maximum output to
//!   reserve the spend), within a process-wide budget of [`BODY_BUDGET_BYTES`]: a request takes
//!   its declared length (or [`super::MAX_REQUEST_BYTES`] when it declares none, the excess given
//!   back once read) before reading a byte, and gives it back once the body is handed to the
//!   upstream connection. One run holds at most [`RUN_BODY_BYTES`], a third of the budget, so a
//!   run's flood leaves two thirds to the others; a request waits for room at most
//!   [`ROOM_TIMEOUT`], and a body must arrive within [`BODY_TIMEOUT`].
//! - **Concurrency**: a run has at most its grant's `maxRequests` model requests in flight
//!   (default [`super::grant::DEFAULT_MAX_REQUESTS`]), answered `429` past it, and at most
//!   [`MAX_CONNECTIONS_PER_RUN`] connections open.
//! - **Slow clients**: a request's head must come within [`HEADER_TIMEOUT`] (hyper's
//!   header-read timeout), a preamble within 10 s.

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::BytesMut;
use http_body_util::{BodyExt as _, Full};
use hyper::body::{Body, Bytes, Frame, Incoming, SizeHint};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use super::grant::DEFAULT_MAX_REQUESTS;
use super::model::MAX_REQUEST_BYTES;

/// The request body bytes the proxy holds at once, all runs together.
pub const BODY_BUDGET_BYTES: usize = 192 << 20;
/// The request body bytes one run holds at once.
pub const RUN_BODY_BYTES: usize = BODY_BUDGET_BYTES / 3;
/// Connections one run may have open at once.
pub const MAX_CONNECTIONS_PER_RUN: usize = 64;
/// How long a request's head may take to arrive.
pub const HEADER_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a request's body may take to arrive once there is room for it.
pub const BODY_TIMEOUT: Duration = Duration::from_secs(60);
/// How long a request waits for room in the body budget.
pub const ROOM_TIMEOUT: Duration = Duration::from_secs(60);

/// The proxy's shared budgets and each run's slots.
pub(crate) struct Limits {
    body: Arc<Semaphore>,
    runs: Mutex<HashMap<String, Arc<RunSlots>>>,
}

/// One run's share.
pub(crate) struct RunSlots {
    requests: Arc<Semaphore>,
    body: Arc<Semaphore>,
    connections: Arc<Semaphore>,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            body: Arc::new(Semaphore::new(BODY_BUDGET_BYTES)),
            runs: Mutex::new(HashMap::new()),
        }
    }
}

impl Limits {
    /// The slots of `run`, made with `max_requests` request slots on first use.
    pub(crate) fn run(&self, run: &str, max_requests: Option<u32>) -> Arc<RunSlots> {
        let mut runs = self
            .runs
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if runs.len() > 4096 {
            // Runs long gone: nothing of theirs is held.
            runs.retain(|_, slots| Arc::strong_count(slots) > 1);
        }
        runs.entry(run.to_owned())
            .or_insert_with(|| {
                let requests = max_requests.unwrap_or(DEFAULT_MAX_REQUESTS).max(1) as usize;
                Arc::new(RunSlots {
                    requests: Arc::new(Semaphore::new(requests)),
                    body: Arc::new(Semaphore::new(RUN_BODY_BYTES)),
                    connections: Arc::new(Semaphore::new(MAX_CONNECTIONS_PER_RUN)),
                })
            })
            .clone()
    }

    /// Body bytes free in the whole budget.
    #[cfg(test)]
    pub(crate) fn body_free(&self) -> usize {
        self.body.available_permits()
    }
}

impl RunSlots {
    /// A connection slot, or `None` when the run has all its connections open.
    pub(crate) fn connection(&self) -> Option<OwnedSemaphorePermit> {
        self.connections.clone().try_acquire_owned().ok()
    }

    /// A request slot, or `None` when the run has all its requests in flight.
    pub(crate) fn request(&self) -> Option<OwnedSemaphorePermit> {
        self.requests.clone().try_acquire_owned().ok()
    }
}

/// Room for a body in the run's share and in the whole budget; given back when dropped.
pub(crate) struct BodyRoom {
    parts: Vec<(Arc<Semaphore>, usize)>,
}

impl BodyRoom {
    /// Give back all but `keep` bytes.
    fn shrink(&mut self, keep: usize) {
        for (semaphore, held) in &mut self.parts {
            if *held > keep {
                semaphore.add_permits(*held - keep);
                *held = keep;
            }
        }
    }
}

impl Drop for BodyRoom {
    fn drop(&mut self) {
        for (semaphore, held) in self.parts.drain(..) {
            semaphore.add_permits(held);
        }
    }
}

/// Why a body was not read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum BodyRefusal {
    /// Larger than [`MAX_REQUEST_BYTES`].
    TooLarge,
    /// No room in the budget within [`ROOM_TIMEOUT`].
    Busy,
    /// Not all of it within [`BODY_TIMEOUT`].
    Slow,
    /// The connection broke.
    Broken,
}

impl BodyRefusal {
    pub(crate) fn reason(&self) -> String {
        match self {
            BodyRefusal::TooLarge => format!(
                "rover: the request body is larger than the proxy's {} MiB limit",
                MAX_REQUEST_BYTES >> 20
            ),
            BodyRefusal::Busy => format!(
                "rover: the proxy had no room for the request body within {} s (this run's requests hold its share of the proxy's memory); retry",
                ROOM_TIMEOUT.as_secs()
            ),
            BodyRefusal::Slow => format!(
                "rover: the request body did not arrive within {} s",
                BODY_TIMEOUT.as_secs()
            ),
            BodyRefusal::Broken => "rover: the request body could not be read".to_owned(),
        }
    }
}

/// Read a request body of at most [`MAX_REQUEST_BYTES`] within the run's share and the budget.
pub(crate) async fn read_body(
    limits: &Limits,
    slots: &RunSlots,
    body: Incoming,
    declared: Option<u64>,
) -> Result<(Bytes, BodyRoom), BodyRefusal> {
    let want = match declared {
        Some(n) if n > MAX_REQUEST_BYTES as u64 => return Err(BodyRefusal::TooLarge),
        Some(n) => usize::try_from(n).unwrap_or(MAX_REQUEST_BYTES),
        None => MAX_REQUEST_BYTES,
    };
    let mut room = BodyRoom { parts: Vec::new() };
    let take = async {
        // The run's share first: a run waits behind its own requests, not in the shared queue.
        for semaphore in [&slots.body, &limits.body] {
            if want > 0 {
                let permits = u32::try_from(want).unwrap_or(u32::MAX);
                let permit = semaphore
                    .clone()
                    .acquire_many_owned(permits)
                    .await
                    .map_err(|_| BodyRefusal::Busy)?;
                permit.forget();
                room.parts.push((semaphore.clone(), want));
            }
        }
        Ok::<(), BodyRefusal>(())
    };
    match tokio::time::timeout(ROOM_TIMEOUT, take).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => return Err(e),
        Err(_) => return Err(BodyRefusal::Busy),
    }
    // Into one buffer as the frames come (no second copy at the end).
    let read = async move {
        let mut body = body;
        let mut buf = BytesMut::with_capacity(want);
        while let Some(frame) = body.frame().await {
            let frame = frame.map_err(|_| BodyRefusal::Broken)?;
            if let Ok(data) = frame.into_data() {
                if buf.len() + data.len() > MAX_REQUEST_BYTES {
                    return Err(BodyRefusal::TooLarge);
                }
                buf.extend_from_slice(&data);
            }
        }
        Ok(buf.freeze())
    };
    let bytes = match tokio::time::timeout(BODY_TIMEOUT, read).await {
        Err(_) => return Err(BodyRefusal::Slow),
        Ok(result) => result?,
    };
    room.shrink(bytes.len());
    Ok((bytes, room))
}

/// A request body sent upstream that gives its room back once hyper has taken it.
pub(crate) struct OutBody {
    inner: Full<Bytes>,
    room: Option<BodyRoom>,
}

impl OutBody {
    pub(crate) fn new(bytes: Bytes, room: Option<BodyRoom>) -> OutBody {
        OutBody {
            inner: Full::new(bytes),
            room,
        }
    }
}

impl Body for OutBody {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.inner).poll_frame(cx);
        if polled.is_ready() {
            // The bytes are hyper's now (written out as the socket takes them).
            this.room = None;
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn room_is_given_back_when_shrunk_and_dropped() {
        let limits = Limits::default();
        let slots = limits.run("run-a", None);
        let whole = Arc::new(Semaphore::new(100));
        let share = Arc::new(Semaphore::new(50));
        whole
            .clone()
            .try_acquire_many_owned(40)
            .expect("room")
            .forget();
        share
            .clone()
            .try_acquire_many_owned(40)
            .expect("room")
            .forget();
        let mut room = BodyRoom {
            parts: vec![(share.clone(), 40), (whole.clone(), 40)],
        };
        room.shrink(10);
        assert_eq!(
            (share.available_permits(), whole.available_permits()),
            (40, 90)
        );
        drop(room);
        assert_eq!(
            (share.available_permits(), whole.available_permits()),
            (50, 100)
        );
        // A run's request slots.
        let held: Vec<_> = (0..DEFAULT_MAX_REQUESTS)
            .map(|_| slots.request().expect("a slot"))
            .collect();
        assert!(slots.request().is_none());
        drop(held);
        assert!(slots.request().is_some());
        assert_eq!(limits.body_free(), BODY_BUDGET_BYTES);
    }
}
