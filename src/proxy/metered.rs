//! A model response body passed through frame by frame (nothing held back, so server-sent events
//! flow) while its bytes are counted and its usage read; once the event that closes the usage
//! has come (or the body ends) the run's ledger is updated before that frame reaches the client,
//! so the client's next request, which may follow before the body's end, is checked against
//! it; when the client goes away mid-stream the ledger is updated with what was seen.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use hyper::body::{Body, Bytes, Frame, Incoming, SizeHint};
use tokio::sync::OwnedSemaphorePermit;
use tokio::task::JoinHandle;

use super::daemon_wide::DaemonHold;
use super::grant::{Grant, Provider};
use super::ledger::Ledger;
use super::reserve::Reservation;
use super::respond::BoxError;
use super::server::{off_runtime, Shared};
use super::usage::UsageParser;

/// What the ledger entry of one response needs besides the body.
pub(crate) struct Exchange {
    pub shared: Arc<Shared>,
    pub grant: Grant,
    pub provider: Provider,
    /// The model the request asked for.
    pub model: Option<String>,
    pub bytes_up: u64,
    /// The run's request slot and the request's reservation: given back once the ledger holds
    /// the answer's real usage (both count meanwhile: never neither).
    pub held: Option<(OwnedSemaphorePermit, Option<Reservation>)>,
    /// The request's reservation of the daemon's budget ([`super::daemon_wide`]): replaced by
    /// the answer's real spend once the run's ledger holds it.
    pub daemon: Option<DaemonHold>,
}

pub(crate) struct MeteredBody {
    inner: Incoming,
    parser: Option<UsageParser>,
    bytes_down: u64,
    exchange: Option<Exchange>,
    /// The ledger write started at the end of the body; the end is passed on once it is done.
    writing: Option<JoinHandle<()>>,
    /// The frame that completed the usage, passed on once the ledger write is done.
    held: Option<Frame<Bytes>>,
    done: bool,
}

impl MeteredBody {
    pub(crate) fn new(inner: Incoming, parser: UsageParser, exchange: Exchange) -> MeteredBody {
        MeteredBody {
            inner,
            parser: Some(parser),
            bytes_down: 0,
            exchange: Some(exchange),
            writing: None,
            held: None,
            done: false,
        }
    }

    /// Start the ledger write (once); `None` if it was started before.
    fn settle(&mut self) -> Option<JoinHandle<()>> {
        let exchange = self.exchange.take()?;
        let seen = self.parser.take()?.finish();
        let usd =
            exchange
                .shared
                .config
                .prices
                .usd(exchange.provider, exchange.model.as_deref(), &seen);
        let model = exchange.model.clone().or_else(|| seen.model.clone());
        let bytes_down = self.bytes_down;
        let handle = tokio::runtime::Handle::try_current().ok()?;
        let dir = exchange.shared.dir().to_owned();
        let grant = exchange.grant;
        let bytes_up = exchange.bytes_up;
        let held = exchange.held;
        let daemon = exchange.daemon;
        Some(handle.spawn(async move {
            let run = grant.run.clone();
            let written = off_runtime(move || {
                let tokens = seen.usage.total();
                let written = Ledger::update(&dir, &grant, |ledger| {
                    ledger.record_response(
                        bytes_up,
                        bytes_down,
                        &seen.usage,
                        usd,
                        model.as_deref(),
                    );
                });
                if let Some(daemon) = daemon {
                    if let Err(e) = daemon.settle(usd, tokens) {
                        tracing::error!(run = %grant.run, error = %e, "cannot count a model response in the daemon's spend");
                    }
                }
                written
            })
            .await;
            if let Err(e) = written {
                tracing::error!(run, error = %e, "cannot record a model response in the run's ledger");
            }
            drop(held);
        }))
    }
}

impl Body for MeteredBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        loop {
            if let Some(writing) = this.writing.as_mut() {
                // A failed write was logged by the task; the client still gets its frame or end.
                let _ = ready!(Pin::new(writing).poll(cx));
                this.writing = None;
                match this.held.take() {
                    Some(frame) => return Poll::Ready(Some(Ok(frame))),
                    None => this.done = true,
                }
            }
            if this.done {
                return Poll::Ready(None);
            }
            match ready!(Pin::new(&mut this.inner).poll_frame(cx)) {
                Some(Ok(frame)) => {
                    let mut complete = false;
                    if let Some(data) = frame.data_ref() {
                        this.bytes_down += data.len() as u64;
                        if let Some(parser) = this.parser.as_mut() {
                            parser.feed(data);
                            complete = parser.complete();
                        }
                    }
                    // The answer is whole: its spend is recorded before the client has it (the
                    // few bytes after it are not counted).
                    if complete {
                        if let Some(writing) = this.settle() {
                            this.writing = Some(writing);
                            this.held = Some(frame);
                            continue;
                        }
                    }
                    return Poll::Ready(Some(Ok(frame)));
                }
                Some(Err(e)) => {
                    // The upstream broke off: count what came, without waiting for the write.
                    drop(this.settle());
                    this.done = true;
                    return Poll::Ready(Some(Err(e.into())));
                }
                None => match this.settle() {
                    Some(writing) => this.writing = Some(writing),
                    None => this.done = true,
                },
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.done
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

impl Drop for MeteredBody {
    fn drop(&mut self) {
        // The client went away (or hyper stopped reading) before the end: count what was seen.
        drop(self.settle());
    }
}
