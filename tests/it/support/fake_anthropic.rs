//! A fake of the Anthropic Messages API on 127.0.0.1 for driving the real `claude` CLI:
//! `POST /v1/messages` answered as a server-sent-event stream. When the request offers the
//! `StructuredOutput` tool (the CLI's `--json-schema`) and no tool result came back yet, the
//! model calls it with the scripted answer; otherwise it says a short text and ends its turn.
//! Every request is recorded (path, size, body) so tests can measure what the CLI sends.

#![allow(dead_code, reason = "each test uses a different part of the fake")]

use std::fmt::Write as _;
use std::sync::{Arc, Mutex};

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, Response, StatusCode, Uri};
use axum::Router;
use serde_json::{json, Value};

/// One request the fake received.
#[derive(Debug, Clone)]
pub struct Recorded {
    pub path: String,
    pub bytes: usize,
    pub body: Value,
}

#[derive(Default)]
struct FakeState {
    answer: Value,
    requests: Vec<Recorded>,
}

type Shared = Arc<Mutex<FakeState>>;

pub struct FakeAnthropic {
    pub url: String,
    state: Shared,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for FakeAnthropic {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl FakeAnthropic {
    /// Serves on a free loopback port; `answer` is what the model puts in `StructuredOutput`.
    pub async fn start(answer: Value) -> FakeAnthropic {
        let state: Shared = Arc::new(Mutex::new(FakeState {
            answer,
            requests: Vec::new(),
        }));
        let app = Router::new().fallback(handle).with_state(state.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind loopback");
        let addr = listener.local_addr().expect("local addr");
        let task = tokio::spawn(async move {
            axum::serve(listener, app)
                .await
                .expect("fake anthropic serves");
        });
        FakeAnthropic {
            url: format!("http://{addr}"),
            state,
            task,
        }
    }

    pub fn requests(&self) -> Vec<Recorded> {
        self.state.lock().expect("lock").requests.clone()
    }
}

fn sse(events: &[Value]) -> String {
    let mut out = String::new();
    for event in events {
        let _ = write!(
            out,
            "event: {}\ndata: {}\n\n",
            event["type"].as_str().unwrap_or("message"),
            event
        );
    }
    out
}

async fn handle(
    State(state): State<Shared>,
    uri: Uri,
    _headers: HeaderMap,
    body: Bytes,
) -> Response<Body> {
    let parsed: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let answer = {
        let mut st = state.lock().expect("lock");
        st.requests.push(Recorded {
            path: uri.path().to_owned(),
            bytes: body.len(),
            body: parsed.clone(),
        });
        st.answer.clone()
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
    let model = parsed["model"].as_str().unwrap_or("claude-fake").to_owned();
    let offers_structured = parsed["tools"]
        .as_array()
        .is_some_and(|t| t.iter().any(|t| t["name"] == "StructuredOutput"));
    let answered = parsed["messages"].as_array().is_some_and(|m| {
        m.iter().any(|msg| {
            msg["content"]
                .as_array()
                .is_some_and(|c| c.iter().any(|b| b["type"] == "tool_result"))
        })
    });
    let start = json!({"type": "message_start", "message": {"id": "msg_fake1", "type": "message", "role": "assistant", "model": model,
        "content": [], "stop_reason": null, "stop_sequence": null, "usage": {"input_tokens": 12, "output_tokens": 1}}});
    let events = if offers_structured && !answered {
        vec![
            start,
            json!({"type": "content_block_start", "index": 0, "content_block": {"type": "tool_use", "id": "toolu_fake1", "name": "StructuredOutput", "input": {}}}),
            json!({"type": "content_block_delta", "index": 0, "delta": {"type": "input_json_delta", "partial_json": answer.to_string()}}),
            json!({"type": "content_block_stop", "index": 0}),
            json!({"type": "message_delta", "delta": {"stop_reason": "tool_use", "stop_sequence": null}, "usage": {"output_tokens": 20}}),
            json!({"type": "message_stop"}),
        ]
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
        .body(Body::from(sse(&events)))
        .expect("response")
}
