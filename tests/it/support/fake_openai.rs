//! A fake of the OpenAI Responses API on 127.0.0.1 for driving the real `codex` CLI:
//! `POST /v1/responses` answered as a server-sent-event stream with one assistant message
//! (the scripted answer, as JSON text when the request asks for a JSON schema), or a scripted
//! error. A WebSocket upgrade is refused with 426, so codex falls back to HTTPS at once.
//! Every request is recorded.

#![allow(dead_code, reason = "each test uses a different part of the fake")]

use std::sync::{Arc, Mutex};

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, Method, Response, StatusCode, Uri};
use axum::Router;
use serde_json::{json, Value};

use super::fake_server::{serve, sse, Needles, Script, Served};

/// One request the fake received.
#[derive(Debug, Clone)]
pub struct Recorded {
    pub method: String,
    pub path: String,
    pub authorized: bool,
    /// The bearer token it came with.
    pub key: Option<String>,
    pub bytes: usize,
    pub body: Value,
}

/// What the fake answers to one `POST /v1/responses`.
#[derive(Debug, Clone)]
pub enum Reply {
    Answer(Value),
    /// HTTP status and the error body's `message`.
    Error(u16, &'static str),
    /// The answer of the first pair whose text appears in the request (codex puts rover's
    /// instructions, with each step's role line, in its input); an error text when none does.
    /// `{"__sequence": [a, b, ...]}` gives `a` to that prompt's first call, `b` to its second,
    /// and repeats the last.
    ByPrompt(Vec<(&'static str, Value)>),
}

struct FakeState {
    replies: Script<Reply>,
    /// Calls seen per prompt needle of `ByPrompt` (a call's first request, not tool turns).
    prompts: Needles,
    requests: Vec<Recorded>,
}

type Shared = Arc<Mutex<FakeState>>;

pub struct FakeOpenAi {
    /// The base URL codex takes (`.../v1`).
    pub url: String,
    state: Shared,
    _served: Served,
}

impl FakeOpenAi {
    /// Serves `replies` request by request (the last one repeats).
    pub async fn start(replies: Vec<Reply>) -> FakeOpenAi {
        let state: Shared = Arc::new(Mutex::new(FakeState {
            replies: Script::new(replies),
            prompts: Needles::default(),
            requests: Vec::new(),
        }));
        let app = Router::new().fallback(handle).with_state(state.clone());
        let served = serve(app, "the fake OpenAI API").await;
        FakeOpenAi {
            url: format!("http://{}/v1", served.addr),
            state,
            _served: served,
        }
    }

    pub fn requests(&self) -> Vec<Recorded> {
        self.state.lock().expect("lock").requests.clone()
    }

    /// The model requests (`POST .../responses`).
    pub fn responses_requests(&self) -> Vec<Recorded> {
        self.requests()
            .into_iter()
            .filter(|r| r.method == "POST" && r.path.ends_with("/responses"))
            .collect()
    }
}

fn json_response(status: u16, body: &Value) -> Response<Body> {
    Response::builder()
        .status(StatusCode::from_u16(status).expect("status"))
        .header("content-type", "application/json")
        .body(Body::from(body.to_string()))
        .expect("response")
}

async fn handle(
    State(state): State<Shared>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response<Body> {
    let parsed: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let authorized = headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("Bearer ") && v.len() > 7);
    let key = headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::to_owned);
    let is_model = method == Method::POST && uri.path().ends_with("/responses");
    let reply = {
        let mut st = state.lock().expect("lock");
        st.requests.push(Recorded {
            method: method.to_string(),
            path: uri.path().to_owned(),
            authorized,
            key,
            bytes: body.len(),
            body: parsed.clone(),
        });
        st.replies
            .next(is_model)
            .unwrap_or(Reply::Answer(Value::Null))
    };
    if headers.contains_key("upgrade") {
        return Response::builder()
            .status(StatusCode::UPGRADE_REQUIRED)
            .body(Body::empty())
            .expect("response");
    }
    if !is_model {
        return json_response(
            404,
            &json!({"error": {"message": "not found", "type": "invalid_request_error"}}),
        );
    }
    if !authorized {
        return json_response(
            401,
            &json!({"error": {"message": "Missing bearer or basic authentication in header", "type": "invalid_request_error", "param": null, "code": null}}),
        );
    }
    let answer = match reply {
        Reply::Error(status, message) => {
            let (kind, code) = match status {
                429 => ("tokens", json!("rate_limit_exceeded")),
                500.. => ("server_error", Value::Null),
                _ => ("invalid_request_error", Value::Null),
            };
            return json_response(
                status,
                &json!({"error": {"message": message, "type": kind, "param": null, "code": code}}),
            );
        }
        Reply::Answer(value) => value,
        Reply::ByPrompt(pairs) => {
            let text = parsed.to_string();
            let first_request = !parsed["input"]
                .as_array()
                .is_some_and(|items| items.iter().any(|i| i["type"] == "function_call_output"));
            state
                .lock()
                .expect("lock")
                .prompts
                .pick(pairs, &text, first_request)
                .unwrap_or_else(|| json!("the fake has no answer for this prompt"))
        }
    };
    // An answer may script tool calls first: `{"__tools": [{"name": .., "arguments": ..}],
    // "answer": ..}`; each function call output codex sends back is one step done.
    let outputs = parsed["input"].as_array().map_or(0, |items| {
        items
            .iter()
            .filter(|i| i["type"] == "function_call_output")
            .count()
    });
    // And the input tokens each of its responses reports: `"__input_tokens": N` (default 100).
    let input_tokens = answer
        .get("__input_tokens")
        .and_then(Value::as_u64)
        .unwrap_or(100);
    let (tools, answer) = match answer.get("__tools").and_then(Value::as_array) {
        Some(tools) => (tools.clone(), answer["answer"].clone()),
        None => (Vec::new(), answer),
    };
    let item = if outputs < tools.len() {
        let tool = &tools[outputs];
        json!({"type": "function_call", "id": format!("fc_fake{outputs}"), "call_id": format!("call_fake{outputs}"),
            "name": tool["name"], "arguments": tool["arguments"].to_string()})
    } else {
        let text = match answer {
            Value::String(text) => text,
            other => other.to_string(),
        };
        json!({"type": "message", "role": "assistant", "id": "msg_fake1",
            "content": [{"type": "output_text", "text": text}]})
    };
    let events = [
        json!({"type": "response.created", "response": {"id": "resp_fake1"}}),
        json!({"type": "response.output_item.done", "item": item}),
        json!({"type": "response.completed", "response": {"id": "resp_fake1", "usage": {"input_tokens": input_tokens,
            "input_tokens_details": {"cached_tokens": 40}, "output_tokens": 20,
            "output_tokens_details": {"reasoning_tokens": 5}, "total_tokens": input_tokens + 20}}}),
    ];
    Response::builder()
        .status(StatusCode::OK)
        .header("content-type", "text/event-stream")
        .body(Body::from(sse(&events, "")))
        .expect("response")
}
