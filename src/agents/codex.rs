//! Codex CLI: the argv for `codex exec --json` and the JSONL event parser.

use std::fmt::Write as _;
use std::path::Path;

use serde_json::Value;

use super::cli::{AgentCli, AgentStream, HostCall, Provider};
use super::env::{
    codex_credentials, env_value, map_codex_key, CODEX_API_KEY, OPENAI_API_KEY, OPENAI_BASE_URL,
};
use super::pricing::CodexPrices;
use super::types::{AgentRequest, AgentResponse, ErrorClass, ParseError, ToolPolicy, Usage};
use super::{truncate_marked, MAX_SANDBOX_PROMPT_BYTES};

/// Codex: `codex exec --json -s ... [--output-schema FILE] -- PROMPT`, stdin closed. It reads
/// the model API's address from its config only, so rover hands it over as a `-c` value.
#[derive(Debug, Clone, Copy)]
pub struct Codex;

impl AgentCli for Codex {
    fn name(&self) -> &'static str {
        "codex"
    }

    fn bin_env_var(&self) -> &'static str {
        super::ROVER_CODEX_BIN
    }

    fn install_hint(&self) -> &'static str {
        "npm install -g @openai/codex"
    }

    fn credentials_hint(&self) -> &'static str {
        "set CODEX_API_KEY (or OPENAI_API_KEY, which rover passes on as CODEX_API_KEY) or run `codex login`"
    }

    fn provider(&self) -> Provider {
        Provider::Openai
    }

    fn model_env(&self, base_url: &str, key: &str) -> Vec<(String, String)> {
        vec![
            (OPENAI_BASE_URL.to_owned(), base_url.to_owned()),
            (CODEX_API_KEY.to_owned(), key.to_owned()),
            (OPENAI_API_KEY.to_owned(), key.to_owned()),
        ]
    }

    /// The instructions, the prompt and the schema asked for in one prompt argument; codex
    /// ignores `OPENAI_BASE_URL` as a variable, so the base URL goes in as its
    /// `openai_base_url` config value for this run: nothing is written into a `CODEX_HOME`
    /// (in the container codex keeps its sessions under the tmpfs `HOME`).
    fn sandbox_args(&self, request: &AgentRequest, model_base_url: Option<&str>) -> Vec<String> {
        let mut text = combined_prompt(request);
        if let Some(schema) = &request.schema {
            text.push_str(
                "\n\nEnd with a final message that is only a JSON object matching this JSON schema:\n",
            );
            text.push_str(&schema.to_string());
        }
        let mut args = sandbox_args(request, truncate_marked(&text, MAX_SANDBOX_PROMPT_BYTES));
        if let Some(url) = model_base_url {
            insert_base_url(&mut args, url);
        }
        args
    }

    fn host_args(&self, request: &AgentRequest, call: &HostCall<'_>) -> Vec<String> {
        let mut args = host_args(request, call.schema_file, call.in_git_repo);
        if let Some(url) = env_value(call.env, OPENAI_BASE_URL) {
            insert_base_url(&mut args, url);
        }
        args
    }

    fn schema_file(&self) -> bool {
        true
    }

    /// `OPENAI_API_KEY` also as `CODEX_API_KEY` when only that is set.
    fn host_env(&self, env: &mut Vec<(String, String)>) {
        map_codex_key(env);
    }

    /// The key or login it will use, and the base URL when one is set.
    fn host_credentials(&self, env: &[(String, String)]) -> Result<Option<String>, String> {
        let credentials = codex_credentials(env)?;
        Ok(Some(match env_value(env, OPENAI_BASE_URL) {
            Some(url) => format!("{credentials} at {url}"),
            None => credentials,
        }))
    }

    fn stream(&self, expect_json: bool) -> Box<dyn AgentStream> {
        Box::new(CodexStream::new(expect_json))
    }

    /// codex reports tokens only: the price table makes them USD for the budgets.
    fn fill_cost(&self, prices: &CodexPrices, model: Option<&str>, response: &mut AgentResponse) {
        prices.fill_cost(model, response);
    }
}

impl AgentStream for CodexStream {
    fn push_line(&mut self, line: &str) -> bool {
        CodexStream::push_line(self, line)
    }

    fn finish(self: Box<Self>) -> Result<AgentResponse, ParseError> {
        CodexStream::finish(*self)
    }

    fn last_activity(&self) -> Option<String> {
        self.last_activity.clone()
    }
}

/// The `-s/--sandbox` value for a tool policy on the host.
pub fn sandbox_mode(policy: ToolPolicy) -> &'static str {
    match policy {
        ToolPolicy::None | ToolPolicy::ReadOnly => "read-only",
        ToolPolicy::ReadBash | ToolPolicy::FullEdit => "workspace-write",
    }
}

/// Codex has no system-prompt flag: the instructions lead the prompt text.
pub fn combined_prompt(req: &AgentRequest) -> String {
    if req.system_prompt.is_empty() {
        req.prompt.clone()
    } else {
        format!("{}\n\n---\n\n{}", req.system_prompt, req.prompt)
    }
}

fn push_tail(args: &mut Vec<String>, req: &AgentRequest, prompt: String) {
    if let Some(session) = &req.resume_session {
        args.push("resume".to_owned());
        args.push("--".to_owned());
        args.push(session.clone());
    } else {
        args.push("--".to_owned());
    }
    args.push(prompt);
}

/// The argv (without the program) to run on the host, stdin closed.
///
/// `schema_file` is where the caller wrote the schema; `in_git_repo` says whether the workdir
/// is inside a git repository (codex refuses to run elsewhere without `--skip-git-repo-check`).
pub fn host_args(req: &AgentRequest, schema_file: Option<&Path>, in_git_repo: bool) -> Vec<String> {
    let mut args = vec![
        "exec".to_owned(),
        "--json".to_owned(),
        "-s".to_owned(),
        sandbox_mode(req.tools).to_owned(),
    ];
    if !in_git_repo {
        args.push("--skip-git-repo-check".to_owned());
    }
    if req.tools == ToolPolicy::None {
        // No tool that runs or reads anything on the host: the answer comes from the prompt.
        for feature in ["shell_tool", "unified_exec", "view_image"] {
            args.push("-c".to_owned());
            args.push(format!("features.{feature}=false"));
        }
        args.push("-c".to_owned());
        args.push("web_search=\"disabled\"".to_owned());
    }
    if req.tools == ToolPolicy::ReadBash {
        // The git steps push and install tools: codex's workspace sandbox blocks the network
        // unless told otherwise.
        args.push("-c".to_owned());
        args.push("sandbox_workspace_write.network_access=true".to_owned());
    }
    if let Some(model) = &req.model {
        args.push("-m".to_owned());
        args.push(model.clone());
    }
    if let Some(path) = schema_file {
        args.push("--output-schema".to_owned());
        args.push(path.display().to_string());
    }
    push_tail(&mut args, req, combined_prompt(req));
    args
}

/// The argv (without the program) to run inside a container.
///
/// The container is the sandbox, so codex's own sandbox is bypassed for edits; the worktree's
/// `.git` points outside the container, hence `--skip-git-repo-check`. No schema file exists in
/// the container: the schema is stated in the prompt and the answer validated by rover.
pub fn sandbox_args(req: &AgentRequest, prompt: String) -> Vec<String> {
    let mut args = vec!["exec".to_owned(), "--json".to_owned()];
    if matches!(req.tools, ToolPolicy::None | ToolPolicy::ReadOnly) {
        args.push("-s".to_owned());
        args.push("read-only".to_owned());
    } else {
        args.push("--dangerously-bypass-approvals-and-sandbox".to_owned());
    }
    args.push("--skip-git-repo-check".to_owned());
    if let Some(model) = &req.model {
        args.push("-m".to_owned());
        args.push(model.clone());
    }
    push_tail(&mut args, req, prompt);
    args
}

/// Incremental parser of `codex exec --json` events, fed one stdout line at a time.
#[derive(Debug, Default)]
pub struct CodexStream {
    expect_json: bool,
    thread_id: Option<String>,
    last_message: Option<String>,
    usage: Usage,
    completed: bool,
    failed: Option<String>,
    warnings: Vec<String>,
    tool_calls: u32,
    turns: u32,
    lines: usize,
    /// The last message or command of the turn.
    last_activity: Option<String>,
}

impl CodexStream {
    /// A parser; `expect_json` says the final message should be read as the structured answer.
    pub fn new(expect_json: bool) -> Self {
        Self {
            expect_json,
            ..Self::default()
        }
    }

    /// Feeds one stdout line; returns true once `turn.completed` or `turn.failed` arrived.
    pub fn push_line(&mut self, line: &str) -> bool {
        self.lines += 1;
        let Ok(value) = serde_json::from_str::<Value>(line.trim()) else {
            return false;
        };
        let text = |value: &Value, pointer: &str| {
            value
                .pointer(pointer)
                .and_then(Value::as_str)
                .map(str::to_owned)
        };
        match value.get("type").and_then(Value::as_str) {
            Some("thread.started") => self.thread_id = text(&value, "/thread_id"),
            Some("turn.completed") => {
                let field = |key: &str| {
                    value
                        .pointer(&format!("/usage/{key}"))
                        .and_then(Value::as_u64)
                        .unwrap_or(0)
                };
                let cached = field("cached_input_tokens");
                self.usage = Usage {
                    // codex counts cached tokens inside input_tokens.
                    input: field("input_tokens").saturating_sub(cached),
                    output: field("output_tokens"),
                    cached,
                };
                self.turns += 1;
                self.completed = true;
                return true;
            }
            Some("turn.failed") => {
                self.failed = Some(
                    text(&value, "/error/message").unwrap_or_else(|| "turn failed".to_owned()),
                );
                self.turns += 1;
                return true;
            }
            // A top-level `error` before `turn.completed` is not fatal (reconnects, fallbacks).
            Some("error") => {
                if let Some(message) = text(&value, "/message") {
                    self.warnings.push(message);
                }
            }
            Some("item.started") => {
                if let Some(command) = text(&value, "/item/command") {
                    self.last_activity = Some(command);
                }
            }
            Some("item.completed") => match value.pointer("/item/type").and_then(Value::as_str) {
                Some("agent_message") => {
                    self.last_message = text(&value, "/item/text");
                    self.last_activity.clone_from(&self.last_message);
                }
                Some("error") => {
                    if let Some(message) = text(&value, "/item/message") {
                        self.warnings.push(message);
                    }
                }
                Some(
                    kind @ ("command_execution" | "file_change" | "mcp_tool_call" | "web_search"),
                ) => {
                    self.tool_calls += 1;
                    self.last_activity = Some(
                        text(&value, "/item/command")
                            .or_else(|| text(&value, "/item/tool"))
                            .or_else(|| text(&value, "/item/query"))
                            .unwrap_or_else(|| kind.replace('_', " ")),
                    );
                }
                _ => {}
            },
            _ => {}
        }
        false
    }

    /// Whether the turn has ended.
    pub fn has_result(&self) -> bool {
        self.completed || self.failed.is_some()
    }

    /// The thread id seen so far.
    pub fn session_id(&self) -> Option<&str> {
        self.thread_id.as_deref()
    }

    /// Turns what was seen into a response; fails when the turn never ended.
    pub fn finish(self) -> Result<AgentResponse, ParseError> {
        if !self.has_result() {
            return Err(ParseError::NoResult { lines: self.lines });
        }
        let text = self.last_message.unwrap_or_default();
        // codex does not validate against the schema; we only read the text as JSON here and
        // leave validation to the caller. Text that is not JSON stays unstructured.
        let structured = if self.expect_json {
            serde_json::from_str::<Value>(text.trim()).ok()
        } else {
            None
        };
        let is_error = self.failed.is_some();
        Ok(AgentResponse {
            text,
            structured,
            session_id: self.thread_id,
            usage: self.usage,
            cost_usd: None,
            turns: Some(self.turns),
            duration_ms: None,
            permission_denials: Vec::new(),
            is_error,
            error_class: self.failed.as_deref().map(classify),
            error_message: self.failed,
            warnings: self.warnings,
            tool_calls: self.tool_calls,
            rate_limit_reset: None,
            transcript: None,
        })
    }
}

/// Classifies a `turn.failed` message (real shapes in `tests/fixtures/codex/err_*.jsonl`):
/// `unexpected status 401 Unauthorized: ...`, `exceeded retry limit, last status: 429 ...`,
/// the 500 text `We’re currently experiencing high demand, ...`, or for a 400 the API's raw
/// JSON error body (`{"error": {"type": "invalid_request_error", ...}}`).
fn classify(message: &str) -> ErrorClass {
    if let Some(class) = classify_json_body(message) {
        return class;
    }
    let lower = message.to_ascii_lowercase();
    match http_status(&lower) {
        Some(status) => classify_status(status),
        None if lower.contains("unauthorized") || lower.contains("missing bearer") => {
            ErrorClass::Auth
        }
        None if lower.contains("rate limit")
            || lower.contains("too many requests")
            || lower.contains("usage limit") =>
        {
            ErrorClass::RateLimited
        }
        None if lower.contains("overloaded") || lower.contains("high demand") => {
            ErrorClass::Overloaded
        }
        None => ErrorClass::Other,
    }
}

fn classify_status(status: u16) -> ErrorClass {
    match status {
        401 | 403 => ErrorClass::Auth,
        429 => ErrorClass::RateLimited,
        500 | 502 | 503 | 504 | 529 => ErrorClass::Overloaded,
        400 | 404 | 413 | 422 => ErrorClass::BadRequest,
        _ => ErrorClass::Other,
    }
}

/// The HTTP status after `status ` or `status: ` in a lowercased message.
fn http_status(lower: &str) -> Option<u16> {
    lower.match_indices("status").find_map(|(at, word)| {
        let rest = lower[at + word.len()..].trim_start_matches([':', ' ']);
        let digits = rest.get(..3)?;
        let after = rest[3..].chars().next();
        (digits.bytes().all(|b| b.is_ascii_digit()) && !after.is_some_and(|c| c.is_ascii_digit()))
            .then(|| digits.parse().ok())
            .flatten()
    })
}

/// A message that is an API error body as JSON: by its status when it has one, by its error
/// type otherwise. Codex shows the raw body for a 400, so an unknown type is a bad request.
fn classify_json_body(message: &str) -> Option<ErrorClass> {
    let body: Value = serde_json::from_str(message.trim()).ok()?;
    let error = body.get("error")?;
    let status = body
        .get("status")
        .or_else(|| error.get("status"))
        .and_then(Value::as_u64)
        .and_then(|n| u16::try_from(n).ok());
    if let Some(status) = status {
        return Some(classify_status(status));
    }
    let field = |key: &str| error.get(key).and_then(Value::as_str).unwrap_or_default();
    Some(match (field("type"), field("code")) {
        (_, "invalid_api_key") | ("authentication_error" | "permission_error", _) => {
            ErrorClass::Auth
        }
        ("rate_limit_error" | "insufficient_quota", _) | (_, "rate_limit_exceeded") => {
            ErrorClass::RateLimited
        }
        ("server_error" | "overloaded_error", _) => ErrorClass::Overloaded,
        _ => ErrorClass::BadRequest,
    })
}

/// The `-c` override that points codex at `url`: codex 0.169 ignores `OPENAI_BASE_URL` as a
/// variable and reads `openai_base_url` from its config, which `-c` sets for one run without
/// touching the user's `$CODEX_HOME`.
pub fn base_url_override(url: &str) -> [String; 2] {
    [
        "-c".to_owned(),
        format!("openai_base_url={}", toml_string(url)),
    ]
}

/// Inserts [`base_url_override`] right after the `exec` of an argv (with or without the
/// program first), so it precedes `resume` and the `--` before the prompt.
pub fn insert_base_url(argv: &mut Vec<String>, url: &str) {
    let at = argv.iter().position(|a| a == "exec").map_or(0, |i| i + 1);
    argv.splice(at..at, base_url_override(url));
}

/// A TOML basic string.
fn toml_string(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 2);
    out.push('"');
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if c.is_control() => {
                // Writing to a String cannot fail.
                let _ = write!(out, "\\u{:04X}", u32::from(c));
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// Parses a captured stdout of `codex exec --json` given a line at a time.
pub fn parse_lines(
    lines: impl Iterator<Item = String>,
    expect_json: bool,
) -> Result<AgentResponse, ParseError> {
    let mut stream = CodexStream::new(expect_json);
    for line in lines {
        stream.push_line(&line);
    }
    stream.finish()
}

/// Parses a whole captured stdout of `codex exec --json`.
pub fn parse_output(bytes: &[u8], expect_json: bool) -> Result<AgentResponse, ParseError> {
    let mut stream = CodexStream::new(expect_json);
    for line in String::from_utf8_lossy(bytes).lines() {
        stream.push_line(line);
    }
    stream.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failure_messages_are_classified_by_status() {
        let cases = [
            ("unexpected status 401 Unauthorized: x", ErrorClass::Auth),
            (
                "unexpected status 429 Too Many Requests: x",
                ErrorClass::RateLimited,
            ),
            (
                "unexpected status 529 Site Overloaded: x",
                ErrorClass::Overloaded,
            ),
            (
                "unexpected status 400 Bad Request: x",
                ErrorClass::BadRequest,
            ),
            ("stream disconnected", ErrorClass::Other),
            (
                "exceeded retry limit, last status: 429 Too Many Requests",
                ErrorClass::RateLimited,
            ),
            (
                "We’re currently experiencing high demand, which may cause temporary errors.",
                ErrorClass::Overloaded,
            ),
            (
                r#"{"error": {"message": "bad", "type": "invalid_request_error", "param": null}}"#,
                ErrorClass::BadRequest,
            ),
            (
                r#"{"error":{"message":"x","type":"invalid_request_error"},"status":401}"#,
                ErrorClass::Auth,
            ),
            (
                r#"{"error":{"message":"slow down","type":"requests","code":"rate_limit_exceeded"}}"#,
                ErrorClass::RateLimited,
            ),
            ("status 4000 is no http status", ErrorClass::Other),
        ];
        for (message, class) in cases {
            assert_eq!(classify(message), class, "{message}");
        }
    }

    #[test]
    fn git_steps_get_network_and_read_only_steps_do_not() {
        let mut req = AgentRequest::new("/tmp", "p");
        assert!(!host_args(&req, None, true)
            .iter()
            .any(|a| a.contains("network_access")));
        req.tools = ToolPolicy::ReadBash;
        assert!(host_args(&req, None, true)
            .iter()
            .any(|a| a == "sandbox_workspace_write.network_access=true"));
    }

    #[test]
    fn base_url_goes_in_a_config_override_before_the_prompt() {
        let mut req = AgentRequest::new("/tmp", "p");
        req.resume_session = Some("t1".into());
        let mut argv = host_args(&req, None, true);
        insert_base_url(&mut argv, "http://127.0.0.1:9/v1");
        assert_eq!(
            argv[..3],
            ["exec", "-c", "openai_base_url=\"http://127.0.0.1:9/v1\""]
        );
        let mut sandboxed = vec!["codex".to_owned()];
        sandboxed.extend(sandbox_args(&req, "p".into()));
        insert_base_url(&mut sandboxed, "http://h/v1");
        assert_eq!(
            sandboxed[1..4],
            ["exec", "-c", "openai_base_url=\"http://h/v1\""]
        );
        assert!(sandboxed.iter().position(|a| a == "resume") > Some(3));
        assert_eq!(toml_string("a\"b\\c\n"), r#""a\"b\\c\u000A""#);
    }
}
