//! A fake of the Anthropic Messages API on 127.0.0.1 for driving the real `claude` CLI:
//! `POST /v1/messages` answered as a server-sent-event stream. When the request offers the
//! `StructuredOutput` tool (the CLI's `--json-schema`) and no tool result came back yet, the
//! model calls it with the scripted answer; otherwise it says a short text and ends its turn.
//! Every request is recorded (path, size, body) so tests can measure what the CLI sends.

#![allow(dead_code, reason = "each test uses a different part of the fake")]

use std::sync::{Arc, Mutex};

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, Response, StatusCode, Uri};
use axum::Router;
use serde_json::{json, Value};

use super::fake_server::{serve, sse, Needles, Script, Served};

/// One request the fake received.
#[derive(Debug, Clone)]
pub struct Recorded {
    pub method: String,
    pub path: String,
    pub bytes: usize,
    pub body: Value,
    /// The credential it came with: `x-api-key`, else the bearer token.
    pub key: Option<String>,
}

/// What the fake answers to one turn (a request that is not the follow-up of a tool result).
#[derive(Debug, Clone)]
pub enum Reply {
    /// The model calls `StructuredOutput` with this value (or says it, without the tool).
    Answer(Value),
    /// An API error: HTTP status, Anthropic error type, message.
    Error(u16, &'static str, &'static str),
    /// The answer of the first pair whose text appears in the request's system prompt (each
    /// rover step has its own role line); an error when none does. An answer
    /// `{"__sequence": [a, b, ...]}` gives `a` to that role's first turn, `b` to its second, and
    /// repeats the last.
    BySystem(Vec<(&'static str, Value)>),
}

struct FakeState {
    replies: Script<Reply>,
    /// Fresh turns seen per role line of `BySystem`.
    roles: Needles,
    requests: Vec<Recorded>,
}

type Shared = Arc<Mutex<FakeState>>;

pub struct FakeAnthropic {
    pub url: String,
    state: Shared,
    _served: Served,
}

impl FakeAnthropic {
    /// Serves on a free loopback port; `answer` is what the model puts in `StructuredOutput`.
    pub async fn start(answer: Value) -> FakeAnthropic {
        Self::scripted(vec![Reply::Answer(answer)]).await
    }

    /// Serves `replies` turn by turn (the last one repeats).
    pub async fn scripted(replies: Vec<Reply>) -> FakeAnthropic {
        let state: Shared = Arc::new(Mutex::new(FakeState {
            replies: Script::new(replies),
            roles: Needles::default(),
            requests: Vec::new(),
        }));
        let app = Router::new().fallback(handle).with_state(state.clone());
        let served = serve(app, "the fake Anthropic API").await;
        FakeAnthropic {
            url: format!("http://{}", served.addr),
            state,
            _served: served,
        }
    }

    pub fn requests(&self) -> Vec<Recorded> {
        self.state.lock().expect("lock").requests.clone()
    }
}

async fn handle(
    State(state): State<Shared>,
    method: axum::http::Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response<Body> {
    let key = headers
        .get("x-api-key")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
        .or_else(|| {
            headers
                .get("authorization")
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.strip_prefix("Bearer "))
                .map(str::to_owned)
        });
    let parsed: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    // How far the turn got: every tool result sent back is one step of the script done.
    // A turn starts at the last user message that is a prompt, not tool results (a resumed
    // session carries the earlier turns before it).
    let is_result = |b: &Value| b["type"] == "tool_result";
    let results = parsed["messages"].as_array().map_or(0, |m| {
        let start = m
            .iter()
            .rposition(|msg| {
                msg["role"] == "user"
                    && !msg["content"]
                        .as_array()
                        .is_some_and(|c| c.iter().any(is_result))
            })
            .unwrap_or(0);
        m[start..]
            .iter()
            .filter_map(|msg| msg["content"].as_array())
            .flatten()
            .filter(|b| is_result(b))
            .count()
    });
    let fresh_turn = uri.path() == "/v1/messages" && results == 0;
    let reply = {
        let mut st = state.lock().expect("lock");
        st.requests.push(Recorded {
            method: method.to_string(),
            path: uri.path().to_owned(),
            bytes: body.len(),
            body: parsed.clone(),
            key,
        });
        st.replies
            .next(fresh_turn)
            .unwrap_or(Reply::Answer(Value::Null))
    };
    if fresh_turn {
        if let Reply::Error(status, kind, message) = reply {
            let mut response = Response::builder()
                .status(StatusCode::from_u16(status).expect("status"))
                .header("content-type", "application/json")
                .header("request-id", "req_fakeerr");
            if status == 429 {
                response = response
                    .header("retry-after", "30")
                    .header("anthropic-ratelimit-requests-reset", "2030-01-01T00:00:00Z");
            }
            return response
                .body(Body::from(
                    json!({"type": "error", "error": {"type": kind, "message": message}})
                        .to_string(),
                ))
                .expect("response");
        }
    }
    let answer = match reply {
        Reply::Answer(value) => value,
        Reply::Error(..) => Value::Null,
        Reply::BySystem(pairs) => state
            .lock()
            .expect("lock")
            .roles
            .pick(pairs, &parsed["system"].to_string(), fresh_turn)
            .unwrap_or_else(|| json!({"error": "the fake has no answer for this system prompt"})),
    };
    if uri.path() != "/v1/messages" {
        return Response::builder()
            .status(StatusCode::NOT_FOUND)
            .header("content-type", "application/json")
            .body(Body::from(
                json!({"type": "error", "error": {"type": "not_found_error", "message": "not found"}}).to_string(),
            ))
            .expect("response");
    }
    // An answer may script tool calls first: `{"__tools": [{"name": .., "input": ..}], "answer": ..}`,
    // and the input tokens each of its responses reports: `"__input_tokens": N` (default 12).
    let input_tokens = answer
        .get("__input_tokens")
        .and_then(Value::as_u64)
        .unwrap_or(12);
    let (tools, answer) = match answer.get("__tools").and_then(Value::as_array) {
        Some(tools) => (tools.clone(), answer["answer"].clone()),
        None => (Vec::new(), answer),
    };
    let model = parsed["model"].as_str().unwrap_or("claude-fake").to_owned();
    let offers_structured = parsed["tools"]
        .as_array()
        .is_some_and(|t| t.iter().any(|t| t["name"] == "StructuredOutput"));
    let start = json!({"type": "message_start", "message": {"id": format!("msg_fake{results}"), "type": "message", "role": "assistant", "model": model,
        "content": [], "stop_reason": null, "stop_sequence": null, "usage": {"input_tokens": input_tokens, "output_tokens": 1}}});
    let tool_call = |name: &str, input: &Value| {
        vec![
            start.clone(),
            json!({"type": "content_block_start", "index": 0, "content_block": {"type": "tool_use", "id": format!("toolu_fake{results}"), "name": name, "input": {}}}),
            json!({"type": "content_block_delta", "index": 0, "delta": {"type": "input_json_delta", "partial_json": input.to_string()}}),
            json!({"type": "content_block_stop", "index": 0}),
            json!({"type": "message_delta", "delta": {"stop_reason": "tool_use", "stop_sequence": null}, "usage": {"output_tokens": 20}}),
            json!({"type": "message_stop"}),
        ]
    };
    let events = if results < tools.len() {
        let tool = &tools[results];
        tool_call(tool["name"].as_str().unwrap_or("Bash"), &tool["input"])
    } else if results == tools.len() && offers_structured {
        tool_call("StructuredOutput", &answer)
    } else {
        vec![
            start,
            json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}),
            json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "Done."}}),
            json!({"type": "content_block_stop", "index": 0}),
            json!({"type": "message_delta", "delta": {"stop_reason": "end_turn", "stop_sequence": null}, "usage": {"output_tokens": 2}}),
            json!({"type": "message_stop"}),
        ]
    };
    Response::builder()
        .status(StatusCode::OK)
        .header("content-type", "text/event-stream")
        .header("request-id", "req_fake1")
        .body(Body::from(sse(&events, "message")))
        .expect("response")
}
