//! Reading a model response's token usage while it streams past, without holding it: server-sent
//! events are cut into lines as chunks arrive (an event may be split anywhere), and only the
//! events that carry usage are parsed. Memory is bounded: an event larger than
//! [`MAX_EVENT_BYTES`] is skipped, a plain JSON body larger than [`MAX_JSON_BYTES`] is not read.

use serde_json::Value;

use super::grant::Provider;
use super::ledger::TokenUsage;

/// The largest server-sent event whose data is kept for parsing.
pub const MAX_EVENT_BYTES: usize = 1 << 20;
/// The largest non-streamed JSON body kept for parsing.
pub const MAX_JSON_BYTES: usize = 16 << 20;

/// The usage a response reported, as far as it was seen.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SeenUsage {
    pub usage: TokenUsage,
    /// Of `usage.cache_write`, the tokens written to Anthropic's 1-hour cache (billed higher).
    pub cache_write_1h: u64,
    /// The model the response names (used when the request's model is unknown).
    pub model: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Format {
    Sse,
    Json,
    Other,
}

/// Feeds on a response body chunk by chunk; [`UsageParser::finish`] gives what it carried.
#[derive(Debug)]
#[allow(
    clippy::struct_excessive_bools,
    reason = "independent states of one streaming parser"
)]
pub struct UsageParser {
    provider: Provider,
    format: Format,
    /// The current SSE line, without its newline.
    line: Vec<u8>,
    /// Whether the current line has no byte other than `\r` so far.
    line_blank: bool,
    /// The `data:` lines of the current event, each followed by `\n`.
    data: Vec<u8>,
    /// The current event outgrew the bound: skip it up to its end.
    oversize: bool,
    /// The JSON body so far (Json format), dropped when it outgrows the bound.
    json: Vec<u8>,
    json_oversize: bool,
    seen: SeenUsage,
    /// The event that closes the response's usage went by (Anthropic `message_delta`, OpenAI
    /// `response.completed`): the client may act on the answer before the body ends.
    complete: bool,
}

impl UsageParser {
    /// A parser for a `provider` response with this `content-type`.
    pub fn new(provider: Provider, content_type: Option<&str>) -> UsageParser {
        let media = content_type
            .and_then(|c| c.split(';').next())
            .map(|c| c.trim().to_ascii_lowercase());
        let format = match media.as_deref() {
            Some("text/event-stream") => Format::Sse,
            Some(m) if m == "application/json" || m.ends_with("+json") => Format::Json,
            _ => Format::Other,
        };
        UsageParser {
            provider,
            format,
            line: Vec::new(),
            line_blank: true,
            data: Vec::new(),
            oversize: false,
            json: Vec::new(),
            json_oversize: false,
            seen: SeenUsage::default(),
            complete: false,
        }
    }

    /// Take the next chunk of the body.
    pub fn feed(&mut self, mut chunk: &[u8]) {
        match self.format {
            Format::Other => {}
            Format::Json => {
                if self.json_oversize {
                    return;
                }
                if self.json.len() + chunk.len() > MAX_JSON_BYTES {
                    self.json_oversize = true;
                    self.json = Vec::new();
                } else {
                    self.json.extend_from_slice(chunk);
                }
            }
            Format::Sse => {
                while let Some(newline) = chunk.iter().position(|&b| b == b'\n') {
                    self.push_line_part(&chunk[..newline]);
                    self.end_line();
                    chunk = &chunk[newline + 1..];
                }
                self.push_line_part(chunk);
            }
        }
    }

    /// Whether the usage is final already: the event that closes it went by.
    pub fn complete(&self) -> bool {
        self.complete
    }

    /// The usage seen, once the body ended or was cut off.
    pub fn finish(mut self) -> SeenUsage {
        match self.format {
            Format::Sse => {
                // A stream that ends without the blank line after its last event.
                if !self.line_blank {
                    self.end_line();
                }
                if !self.oversize && !self.data.is_empty() {
                    self.dispatch();
                }
            }
            Format::Json => {
                if !self.json_oversize {
                    if let Ok(body) = serde_json::from_slice::<Value>(&self.json) {
                        self.read_body(&body);
                    }
                }
            }
            Format::Other => {}
        }
        self.seen
    }

    fn push_line_part(&mut self, part: &[u8]) {
        if part.is_empty() {
            return;
        }
        if part.iter().any(|&b| b != b'\r') {
            self.line_blank = false;
        }
        if self.oversize {
            return;
        }
        if self.line.len() + self.data.len() + part.len() > MAX_EVENT_BYTES {
            self.oversize = true;
            self.line = Vec::new();
            self.data = Vec::new();
            return;
        }
        self.line.extend_from_slice(part);
    }

    fn end_line(&mut self) {
        if self.line_blank {
            if !self.oversize && !self.data.is_empty() {
                self.dispatch();
            }
            self.data.clear();
            self.oversize = false;
        } else if !self.oversize {
            let line = self.line.strip_suffix(b"\r").unwrap_or(&self.line);
            if let Some(rest) = line.strip_prefix(b"data:") {
                let rest = rest.strip_prefix(b" ").unwrap_or(rest);
                self.data.extend_from_slice(rest);
                self.data.push(b'\n');
            }
        }
        self.line.clear();
        self.line_blank = true;
    }

    /// Parse the event in `data` if it may carry usage.
    fn dispatch(&mut self) {
        let needles: &[&[u8]] = match self.provider {
            Provider::Anthropic => &[b"message_start", b"message_delta"],
            Provider::Openai => &[b"\"usage\""],
        };
        if !needles.iter().any(|n| contains(&self.data, n)) {
            return;
        }
        let Ok(event) = serde_json::from_slice::<Value>(&self.data) else {
            return;
        };
        match (self.provider, event["type"].as_str()) {
            (Provider::Anthropic, Some("message_start")) => {
                self.note_model(&event["message"]["model"]);
                self.read_anthropic(&event["message"]["usage"]);
            }
            (Provider::Anthropic, Some("message_delta")) => {
                self.read_anthropic(&event["usage"]);
                self.complete = true;
            }
            (
                Provider::Openai,
                Some("response.completed" | "response.incomplete" | "response.failed"),
            ) => {
                self.note_model(&event["response"]["model"]);
                self.read_openai(&event["response"]["usage"]);
                self.complete = true;
            }
            _ => {}
        }
    }

    fn read_body(&mut self, body: &Value) {
        self.note_model(&body["model"]);
        match self.provider {
            Provider::Anthropic => self.read_anthropic(&body["usage"]),
            Provider::Openai => self.read_openai(&body["usage"]),
        }
    }

    fn note_model(&mut self, model: &Value) {
        if let Some(model) = model.as_str() {
            self.seen.model = Some(model.to_owned());
        }
    }

    /// Anthropic counts are totals so far (`message_delta` repeats them cumulatively): the last
    /// one seen wins. `input_tokens` excludes cache reads and writes.
    fn read_anthropic(&mut self, usage: &Value) {
        let seen = &mut self.seen;
        if let Some(n) = usage["input_tokens"].as_u64() {
            seen.usage.input = n;
        }
        if let Some(n) = usage["cache_read_input_tokens"].as_u64() {
            seen.usage.cached = n;
        }
        if let Some(n) = usage["cache_creation_input_tokens"].as_u64() {
            seen.usage.cache_write = n;
        }
        if let Some(n) = usage["cache_creation"]["ephemeral_1h_input_tokens"].as_u64() {
            seen.cache_write_1h = n;
        }
        if let Some(n) = usage["output_tokens"].as_u64() {
            seen.usage.output = n;
        }
    }

    /// OpenAI's `input_tokens` includes the cached ones.
    fn read_openai(&mut self, usage: &Value) {
        let Some(input) = usage["input_tokens"].as_u64() else {
            return;
        };
        let cached = usage["input_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap_or(0)
            .min(input);
        self.seen.usage = TokenUsage {
            input: input - cached,
            cached,
            cache_write: 0,
            output: usage["output_tokens"].as_u64().unwrap_or(0),
        };
    }
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

#[cfg(test)]
mod tests {
    use super::*;

    const ANTHROPIC_SSE: &str = "event: message_start\n\
data: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_1\",\"model\":\"claude-sonnet-4-5\",\"usage\":{\"input_tokens\":100,\"cache_read_input_tokens\":40,\"cache_creation_input_tokens\":10,\"output_tokens\":1}}}\n\n\
event: content_block_delta\n\
data: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"hi\"}}\n\n\
event: message_delta\n\
data: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\"},\"usage\":{\"output_tokens\":20}}\n\n\
event: message_stop\n\
data: {\"type\":\"message_stop\"}\n\n";

    fn expected_anthropic() -> TokenUsage {
        TokenUsage {
            input: 100,
            cached: 40,
            cache_write: 10,
            output: 20,
        }
    }

    fn parse_in_pieces(provider: Provider, kind: &str, body: &[u8], size: usize) -> SeenUsage {
        let mut parser = UsageParser::new(provider, Some(kind));
        for piece in body.chunks(size) {
            parser.feed(piece);
        }
        parser.finish()
    }

    #[test]
    fn anthropic_sse_usage_survives_any_split() {
        for size in [1, 2, 3, 7, 64, 10_000] {
            let seen = parse_in_pieces(
                Provider::Anthropic,
                "text/event-stream; charset=utf-8",
                ANTHROPIC_SSE.as_bytes(),
                size,
            );
            assert_eq!(seen.usage, expected_anthropic(), "chunks of {size}");
            assert_eq!(seen.model.as_deref(), Some("claude-sonnet-4-5"));
        }
        let crlf = ANTHROPIC_SSE.replace('\n', "\r\n");
        let seen = parse_in_pieces(Provider::Anthropic, "text/event-stream", crlf.as_bytes(), 5);
        assert_eq!(seen.usage, expected_anthropic(), "CRLF lines");
    }

    #[test]
    fn openai_completed_usage_excludes_cached_from_input() {
        let body = "event: response.created\ndata: {\"type\":\"response.created\",\"response\":{\"id\":\"r\"}}\n\n\
event: response.completed\ndata: {\"type\":\"response.completed\",\"response\":{\"id\":\"r\",\"model\":\"gpt-5\",\"usage\":{\"input_tokens\":100,\"input_tokens_details\":{\"cached_tokens\":40},\"output_tokens\":20,\"output_tokens_details\":{\"reasoning_tokens\":5},\"total_tokens\":120}}}\n\n";
        let seen = parse_in_pieces(Provider::Openai, "text/event-stream", body.as_bytes(), 3);
        assert_eq!(
            seen.usage,
            TokenUsage {
                input: 60,
                cached: 40,
                cache_write: 0,
                output: 20
            }
        );
        assert_eq!(seen.model.as_deref(), Some("gpt-5"));
    }

    #[test]
    fn json_bodies_are_read_whole() {
        let body = r#"{"id":"msg","model":"claude-haiku-4-5","usage":{"input_tokens":7,"output_tokens":3,"cache_creation":{"ephemeral_1h_input_tokens":2},"cache_creation_input_tokens":2}}"#;
        let seen = parse_in_pieces(Provider::Anthropic, "application/json", body.as_bytes(), 4);
        assert_eq!(
            (seen.usage.input, seen.usage.output, seen.cache_write_1h),
            (7, 3, 2)
        );
        let other = parse_in_pieces(Provider::Anthropic, "text/plain", body.as_bytes(), 4);
        assert_eq!(other, SeenUsage::default());
    }

    #[test]
    fn an_oversized_event_is_skipped_and_the_next_one_read() {
        let mut parser = UsageParser::new(Provider::Anthropic, Some("text/event-stream"));
        parser.feed(b"data: {\"type\":\"message_start\",\"pad\":\"");
        let pad = vec![b'x'; 64 * 1024];
        for _ in 0..(MAX_EVENT_BYTES / pad.len() + 2) {
            parser.feed(&pad);
        }
        assert!(parser.data.len() + parser.line.len() <= MAX_EVENT_BYTES);
        parser.feed(b"\"}\n\n");
        parser.feed(b"data: {\"type\":\"message_delta\",\"usage\":{\"output_tokens\":9}}\n\n");
        assert_eq!(parser.finish().usage.output, 9);
    }
}
