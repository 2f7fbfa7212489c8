//! What the fakes of outside HTTP services (GitHub, the Anthropic and OpenAI model APIs) share:
//! serving a router on a free loopback port for as long as the fake lives, a scripted list of
//! replies taken turn by turn, answers chosen by a needle in the request with per-needle
//! sequences, and server-sent-event framing.

#![allow(dead_code, reason = "each fake uses a different part")]

use std::collections::HashMap;
use std::fmt::Write as _;
use std::net::SocketAddr;

use axum::Router;
use serde_json::Value;

/// A router served on 127.0.0.1 until this is dropped.
pub struct Served {
    pub addr: SocketAddr,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Served {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Served {
    /// A server started otherwise, stopped when this is dropped.
    pub fn from_task(addr: SocketAddr, task: tokio::task::JoinHandle<()>) -> Served {
        Served { addr, task }
    }
}

/// Serves `app` on a free loopback port; `what` names the fake in a panic.
pub async fn serve(app: Router, what: &'static str) -> Served {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind loopback");
    let addr = listener.local_addr().expect("local addr");
    let task = tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, app).await {
            panic!("{what} stopped serving: {e}");
        }
    });
    Served { addr, task }
}

/// Replies taken in order, one per turn; the last one repeats.
#[derive(Debug, Clone)]
pub struct Script<R> {
    replies: Vec<R>,
    turns: usize,
}

impl<R: Clone> Script<R> {
    pub fn new(replies: Vec<R>) -> Self {
        Script { replies, turns: 0 }
    }

    /// The current turn's reply; a fresh turn moves the script on (follow-up requests of the
    /// same turn, such as tool results, get the same reply).
    pub fn next(&mut self, fresh_turn: bool) -> Option<R> {
        let reply = self
            .replies
            .get(self.turns)
            .or_else(|| self.replies.last())
            .cloned();
        if fresh_turn {
            self.turns += 1;
        }
        reply
    }
}

/// Answers chosen by the first needle found in a request, each answer either a value or
/// `{"__sequence": [a, b, ...]}`: `a` for that needle's first fresh turn, `b` for its second,
/// the last repeating.
#[derive(Debug, Default)]
pub struct Needles {
    seen: HashMap<&'static str, usize>,
}

impl Needles {
    /// The answer for `haystack` among `pairs`, or `None` when no needle is in it.
    pub fn pick(
        &mut self,
        pairs: Vec<(&'static str, Value)>,
        haystack: &str,
        fresh_turn: bool,
    ) -> Option<Value> {
        let (needle, value) = pairs
            .into_iter()
            .find(|(needle, _)| haystack.contains(needle))?;
        let Some(sequence) = value.get("__sequence").and_then(Value::as_array) else {
            return Some(value);
        };
        let seen = self.seen.entry(needle).or_insert(0);
        if fresh_turn {
            *seen += 1;
        }
        let at = seen.saturating_sub(1).min(sequence.len().saturating_sub(1));
        Some(sequence.get(at).cloned().unwrap_or(Value::Null))
    }
}

/// Server-sent events, each named by its `type` field (or `fallback`).
pub fn sse(events: &[Value], fallback: &str) -> String {
    let mut out = String::new();
    for event in events {
        let _ = write!(
            out,
            "event: {}\ndata: {}\n\n",
            event["type"].as_str().unwrap_or(fallback),
            event
        );
    }
    out
}
