//! Claude Code CLI: the argv for `claude -p --output-format stream-json` and the stream parser.

use serde_json::Value;

use super::cli::{AgentCli, AgentStream, HostCall, Provider};
use super::types::{
    AgentRequest, AgentResponse, AgentStep, ErrorClass, ParseError, PermissionDenial, ToolPolicy,
    Usage,
};
use super::{truncate_marked, MAX_SANDBOX_PROMPT_BYTES};

/// Claude Code: `claude -p --output-format stream-json --verbose ...`, the prompt on stdin on
/// the host and after `--` in a sandbox; the model API's address and key as variables.
#[derive(Debug, Clone, Copy)]
pub struct Claude;

impl AgentCli for Claude {
    fn name(&self) -> &'static str {
        "claude"
    }

    fn bin_env_var(&self) -> &'static str {
        super::ROVER_CLAUDE_BIN
    }

    fn install_hint(&self) -> &'static str {
        "npm install -g @anthropic-ai/claude-code"
    }

    fn credentials_hint(&self) -> &'static str {
        "check ANTHROPIC_API_KEY"
    }

    fn provider(&self) -> Provider {
        Provider::Anthropic
    }

    /// A small model for notify and summarize, a strong one for plan and resolve, the middle
    /// one elsewhere (the CLI's aliases).
    fn default_model(&self, step: AgentStep) -> Option<&'static str> {
        Some(match step {
            AgentStep::Notify | AgentStep::Summarize => "haiku",
            AgentStep::Plan | AgentStep::Resolve => "opus",
            _ => "sonnet",
        })
    }

    fn model_env(&self, base_url: &str, key: &str) -> Vec<(String, String)> {
        vec![
            ("ANTHROPIC_BASE_URL".to_owned(), base_url.to_owned()),
            ("ANTHROPIC_API_KEY".to_owned(), key.to_owned()),
        ]
    }

    fn sandbox_args(&self, request: &AgentRequest, _model_base_url: Option<&str>) -> Vec<String> {
        let prompt = truncate_marked(&request.prompt, MAX_SANDBOX_PROMPT_BYTES);
        let mut bounded = request.clone();
        bounded.system_prompt = truncate_marked(&request.system_prompt, MAX_SANDBOX_PROMPT_BYTES);
        sandbox_args(&bounded, prompt)
    }

    fn host_args(&self, request: &AgentRequest, _call: &HostCall<'_>) -> Vec<String> {
        host_args(request)
    }

    fn host_stdin(&self, request: &AgentRequest) -> Option<Vec<u8>> {
        Some(request.prompt.clone().into_bytes())
    }

    fn stream(&self, _expect_json: bool) -> Box<dyn AgentStream> {
        Box::<ClaudeStream>::default()
    }

    /// Also reads the `json` object and the one-line `json --verbose` array.
    fn parse_lines(
        &self,
        lines: &mut dyn Iterator<Item = String>,
        _expect_json: bool,
    ) -> Result<AgentResponse, ParseError> {
        parse_lines(lines)
    }
}

impl AgentStream for ClaudeStream {
    fn push_line(&mut self, line: &str) -> bool {
        ClaudeStream::push_line(self, line)
    }

    fn finish(self: Box<Self>) -> Result<AgentResponse, ParseError> {
        ClaudeStream::finish(*self)
    }

    fn last_activity(&self) -> Option<String> {
        self.last_activity.clone()
    }
}

/// A `tool_use` block as one line: the tool and what it was given first among the usual
/// fields (the command, the file, the pattern).
fn tool_use(block: &Value) -> String {
    let name = block.get("name").and_then(Value::as_str).unwrap_or("tool");
    let input = [
        "command",
        "file_path",
        "path",
        "pattern",
        "url",
        "description",
    ]
    .iter()
    .find_map(|k| {
        block
            .pointer(&format!("/input/{k}"))
            .and_then(Value::as_str)
    });
    match input {
        Some(input) => format!("{name}: {input}"),
        None => name.to_owned(),
    }
}

/// The tools allowed for each policy (`--tools=...` and `--allowedTools=...`).
pub fn allowed_tools(policy: ToolPolicy) -> &'static str {
    match policy {
        ToolPolicy::None => "",
        ToolPolicy::ReadOnly => "Read,Glob,Grep",
        ToolPolicy::ReadBash => "Read,Glob,Grep,Bash",
        ToolPolicy::FullEdit => "Read,Glob,Grep,Bash,Edit,Write,NotebookEdit",
    }
}

/// Arguments shared by the host and the sandbox invocation (everything but the prompt).
///
/// On the host (`host`), the CLI loads no settings, hooks or MCP servers but the user's own
/// (`--setting-sources=user`, `--strict-mcp-config`): the working directory is never a
/// repository's, but nothing there is read as configuration either. The step's tools are the
/// only ones the model is offered (`--tools`), and rover's role prompt replaces Claude Code's
/// coding prompt. In the sandbox the coding agent keeps its own prompt and gets rover's
/// appended; a sandboxed step with fewer tools than the coding agent's (the reviewer) gets
/// exactly its list and rover's prompt alone, as on the host.
fn common_args(req: &AgentRequest, host: bool) -> Vec<String> {
    let mut args = vec![
        "-p".to_owned(),
        "--output-format".to_owned(),
        "stream-json".to_owned(),
        "--verbose".to_owned(),
    ];
    if let Some(model) = &req.model {
        args.push("--model".to_owned());
        args.push(model.clone());
    }
    if let Some(turns) = req.max_turns {
        args.push("--max-turns".to_owned());
        args.push(turns.to_string());
    }
    // Everywhere but the workflow agent's sandbox, the step's tool list is the whole of what
    // the model is offered: no settings, hooks or MCP servers of a repository can widen it (the
    // reviewer reads a worktree that could carry a `.claude/settings.json` of its own).
    let only_listed = host || req.tools != ToolPolicy::FullEdit;
    if only_listed {
        args.push("--setting-sources=user".to_owned());
        args.push("--strict-mcp-config".to_owned());
    }
    // `=` form: these options are variadic and would swallow a following positional prompt.
    if only_listed {
        args.push(format!("--tools={}", allowed_tools(req.tools)));
    }
    if req.tools != ToolPolicy::None {
        args.push(format!("--allowedTools={}", allowed_tools(req.tools)));
    }
    if req.tools == ToolPolicy::FullEdit {
        args.push("--permission-mode".to_owned());
        args.push("acceptEdits".to_owned());
    }
    if !req.system_prompt.is_empty() {
        // `=` form so a prompt starting with a dash can never be read as an option.
        // Claude Code's coding prompt is for the agent that edits; every other step gets
        // rover's role prompt alone.
        let flag = if only_listed {
            "--system-prompt"
        } else {
            "--append-system-prompt"
        };
        args.push(format!("{flag}={}", req.system_prompt));
    }
    if let Some(schema) = &req.schema {
        args.push("--json-schema".to_owned());
        args.push(schema.to_string());
    }
    if let Some(session) = &req.resume_session {
        args.push("--resume".to_owned());
        args.push(session.clone());
    }
    args
}

/// The argv (without the program) to run on the host; the prompt goes on stdin.
pub fn host_args(req: &AgentRequest) -> Vec<String> {
    common_args(req, true)
}

/// The argv (without the program) to run inside a container, where there is no stdin:
/// the prompt is the last positional argument after `--`.
pub fn sandbox_args(req: &AgentRequest, prompt: String) -> Vec<String> {
    let mut args = common_args(req, false);
    args.push("--".to_owned());
    args.push(prompt);
    args
}

/// Incremental parser of a `stream-json` stream, fed one stdout line at a time.
#[derive(Debug, Default)]
pub struct ClaudeStream {
    session_id: Option<String>,
    last_text: Option<String>,
    assistant_error: Option<String>,
    rate_limit_reset: Option<chrono::DateTime<chrono::Utc>>,
    result: Option<Value>,
    results: usize,
    lines: usize,
    tool_calls: u32,
    /// The last text or tool call of an assistant message.
    last_activity: Option<String>,
}

impl ClaudeStream {
    /// Feeds one stdout line; returns true once the final `result` line has arrived.
    pub fn push_line(&mut self, line: &str) -> bool {
        self.lines += 1;
        let trimmed = line.trim();
        if trimmed.is_empty() {
            return false;
        }
        // Non-JSON lines (warnings, a truncated tail) carry nothing we use.
        match serde_json::from_str::<Value>(trimmed) {
            Ok(value) => self.push_value(value),
            Err(_) => false,
        }
    }

    fn push_value(&mut self, value: Value) -> bool {
        if self.session_id.is_none() {
            if let Some(id) = value.get("session_id").and_then(Value::as_str) {
                self.session_id = Some(id.to_owned());
            }
        }
        match value.get("type").and_then(Value::as_str) {
            Some("assistant") => {
                if let Some(code) = value.get("error").and_then(Value::as_str) {
                    self.assistant_error = Some(code.to_owned());
                }
                let blocks = value
                    .pointer("/message/content")
                    .and_then(Value::as_array)
                    .map(Vec::as_slice)
                    .unwrap_or_default();
                for block in blocks {
                    match block.get("type").and_then(Value::as_str) {
                        Some("text") => {
                            if let Some(text) = block.get("text").and_then(Value::as_str) {
                                self.last_text = Some(text.to_owned());
                                self.last_activity = Some(text.to_owned());
                            }
                        }
                        Some("tool_use") => {
                            self.tool_calls += 1;
                            self.last_activity = Some(tool_use(block));
                        }
                        _ => {}
                    }
                }
                false
            }
            Some("rate_limit_event") => {
                // SDK `SDKRateLimitInfo.resetsAt`: epoch seconds (milliseconds tolerated).
                let reset = value
                    .pointer("/rate_limit_info/resetsAt")
                    .and_then(Value::as_i64)
                    .and_then(|at| {
                        if at > 100_000_000_000 {
                            chrono::DateTime::from_timestamp_millis(at)
                        } else {
                            chrono::DateTime::from_timestamp(at, 0)
                        }
                    });
                if reset.is_some() {
                    self.rate_limit_reset = reset;
                }
                false
            }
            Some("result") => {
                self.results += 1;
                if self.result.is_none() {
                    self.result = Some(value);
                }
                true
            }
            // Unknown kinds (system/*, user, stream_event, rate_limit_event, ...) are skipped.
            _ => false,
        }
    }

    /// Whether the final `result` line has been seen.
    pub fn has_result(&self) -> bool {
        self.result.is_some()
    }

    /// The session id seen so far.
    pub fn session_id(&self) -> Option<&str> {
        self.session_id.as_deref()
    }

    /// Turns what was seen into a response; fails when no (or more than one) result arrived.
    pub fn finish(self) -> Result<AgentResponse, ParseError> {
        if self.results > 1 {
            return Err(ParseError::ManyResults {
                count: self.results,
            });
        }
        let Some(result) = self.result else {
            return Err(ParseError::NoResult { lines: self.lines });
        };
        let subtype = result.get("subtype").and_then(Value::as_str).unwrap_or("");
        // `is_error` decides: an API error arrives with `subtype: "success"`.
        let is_error = result
            .get("is_error")
            .and_then(Value::as_bool)
            .unwrap_or(subtype != "success");
        let text = result
            .get("result")
            .and_then(Value::as_str)
            .map(str::to_owned)
            .or_else(|| self.last_text.clone())
            .unwrap_or_default();
        let errors: Vec<String> = result
            .get("errors")
            .and_then(Value::as_array)
            .map(|list| {
                list.iter()
                    .filter_map(Value::as_str)
                    .map(str::to_owned)
                    .collect()
            })
            .unwrap_or_default();
        let error_class = is_error.then(|| {
            classify(
                subtype,
                result.get("api_error_status").and_then(Value::as_u64),
                self.assistant_error.as_deref(),
            )
        });
        let error_message = is_error.then(|| {
            if errors.is_empty() {
                text.clone()
            } else {
                errors.join("; ")
            }
        });
        let structured = result
            .get("structured_output")
            .filter(|value| !value.is_null())
            .cloned();
        let session_id = result
            .get("session_id")
            .and_then(Value::as_str)
            .map(str::to_owned)
            .or(self.session_id);
        let permission_denials = result
            .get("permission_denials")
            .and_then(Value::as_array)
            .map(|list| {
                list.iter()
                    .map(|denial| PermissionDenial {
                        tool_name: denial
                            .get("tool_name")
                            .and_then(Value::as_str)
                            .unwrap_or("unknown")
                            .to_owned(),
                        tool_input: denial.get("tool_input").cloned().unwrap_or(Value::Null),
                    })
                    .collect()
            })
            .unwrap_or_default();
        Ok(AgentResponse {
            text,
            structured,
            session_id,
            usage: usage(&result),
            cost_usd: result.get("total_cost_usd").and_then(Value::as_f64),
            turns: result
                .get("num_turns")
                .and_then(Value::as_u64)
                .and_then(|n| u32::try_from(n).ok()),
            duration_ms: result.get("duration_ms").and_then(Value::as_u64),
            permission_denials,
            is_error,
            error_class,
            error_message,
            warnings: Vec::new(),
            tool_calls: self.tool_calls,
            rate_limit_reset: self.rate_limit_reset,
            transcript: None,
        })
    }
}

/// Token usage: `modelUsage` (all models, the accounting field) when present, else `usage`.
fn usage(result: &Value) -> Usage {
    let field = |value: &Value, key: &str| value.get(key).and_then(Value::as_u64).unwrap_or(0);
    if let Some(models) = result.get("modelUsage").and_then(Value::as_object) {
        if !models.is_empty() {
            return models.values().fold(Usage::default(), |acc, model| Usage {
                input: acc.input + field(model, "inputTokens"),
                output: acc.output + field(model, "outputTokens"),
                cached: acc.cached + field(model, "cacheReadInputTokens"),
            });
        }
    }
    let Some(usage) = result.get("usage") else {
        return Usage::default();
    };
    Usage {
        input: field(usage, "input_tokens"),
        output: field(usage, "output_tokens"),
        cached: field(usage, "cache_read_input_tokens"),
    }
}

fn classify(subtype: &str, status: Option<u64>, assistant_error: Option<&str>) -> ErrorClass {
    match subtype {
        "error_max_turns" => return ErrorClass::MaxTurns,
        "error_max_budget_usd" => return ErrorClass::Budget,
        _ => {}
    }
    match status {
        Some(401 | 403) => return ErrorClass::Auth,
        Some(429) => return ErrorClass::RateLimited,
        Some(500 | 502 | 503 | 504 | 529) => return ErrorClass::Overloaded,
        Some(400 | 404 | 413 | 422) => return ErrorClass::BadRequest,
        _ => {}
    }
    match assistant_error {
        Some(
            "authentication_failed"
            | "oauth_org_not_allowed"
            | "billing_error"
            | "account_on_hold"
            | "cloud_credential_error",
        ) => ErrorClass::Auth,
        Some("rate_limit") => ErrorClass::RateLimited,
        Some("overloaded" | "server_error") => ErrorClass::Overloaded,
        Some("invalid_request" | "model_not_found") => ErrorClass::BadRequest,
        _ => ErrorClass::Other,
    }
}

/// Parses a captured stdout given a line at a time: `stream-json` lines, a `json` object, or
/// the `json --verbose` array on one line (as the CLI prints it).
pub fn parse_lines(lines: impl Iterator<Item = String>) -> Result<AgentResponse, ParseError> {
    let mut stream = ClaudeStream::default();
    let mut first = true;
    for line in lines {
        let trimmed = line.trim();
        if first && trimmed.starts_with('[') {
            let values: Vec<Value> =
                serde_json::from_str(trimmed).map_err(|err| ParseError::Invalid {
                    reason: err.to_string(),
                })?;
            for value in values {
                stream.lines += 1;
                stream.push_value(value);
            }
            first = false;
            continue;
        }
        first &= trimmed.is_empty();
        stream.push_line(&line);
    }
    stream.finish()
}

/// Parses a whole captured stdout: `stream-json` lines, a `json` object, or the `json --verbose` array.
pub fn parse_output(bytes: &[u8]) -> Result<AgentResponse, ParseError> {
    let text = String::from_utf8_lossy(bytes);
    let mut stream = ClaudeStream::default();
    if text.trim_start().starts_with('[') {
        let values: Vec<Value> =
            serde_json::from_str(text.trim()).map_err(|err| ParseError::Invalid {
                reason: err.to_string(),
            })?;
        for value in values {
            stream.lines += 1;
            stream.push_value(value);
        }
    } else {
        for line in text.lines() {
            stream.push_line(line);
        }
    }
    stream.finish()
}
