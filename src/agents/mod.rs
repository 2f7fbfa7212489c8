//! AI coding agents: one `Agent` interface over the Claude Code and Codex CLIs.
//!
//! Parsers (`claude`, `codex`) are pure; `runner` owns the child process; `agent` glues them
//! into the `Agent` trait; `structured` + `results` turn answers into typed step results;
//! `prompts` renders the embedded step prompts; `settings` is the `rover.json` part.

mod agent;
pub mod claude;
mod cli;
pub mod codex;
mod env;
mod error;
mod pricing;
mod prompts;
mod results;
mod runner;
mod settings;
mod structured;
mod types;
mod untrusted;

#[cfg(test)]
mod parse_tests;

pub use agent::{agent_from_settings, Agent, ClaudeAgent, CliAgent, CodexAgent};
pub use cli::{last_activity, AgentCli, AgentKind, AgentStream, HostCall, Provider, CLIS};
pub use env::{
    agent_env, codex_credentials, codex_home, env_value, map_codex_key, redact_secrets,
    ALWAYS_DENIED_ENV, BASE_ALLOWED_ENV, CODEX_API_KEY, OPENAI_API_KEY, OPENAI_BASE_URL,
};
pub use error::AgentError;
pub use pricing::{
    usd, ClaudePrices, CodexPrices, ModelPrice, CLAUDE_CACHE_WRITE_1H_FACTOR,
    CLAUDE_CACHE_WRITE_FACTOR, DEFAULT_PRICE_KEY,
};
pub use prompts::{
    placeholders, render_prompt, step_request, step_schema, template, untrusted_block,
    CustomInstructions, PromptVars, RenderedPrompt, MAX_CUSTOM_BYTES, ROVER_TRAILER,
};
pub use results::{
    check_dependencies, contains_ai_attribution, CommitMessageResult, CoordinateDecision,
    CoordinateResult, CorrectiveCommand, NotifyResult, PlanResult, PullRequestRef, PushResult,
    PushStatus, ResolveDecision, ResolveResult, RetryStep, ReviewFinding, ReviewResult,
    ReviewVerdict, StepResult, SummarizeResult, TaskSpec, WorkflowResult, WorkflowStatus,
    WorkflowType,
};
pub use runner::{run_process, ProcessEnd, ProcessOutcome, ProcessSpec};
pub use settings::{AgentSettings, StepModels};
pub use structured::{extract, run_structured, schema_for, strict_schema, Structured};
pub use types::{
    AgentRequest, AgentResponse, AgentStep, ErrorClass, ParseError, PermissionDenial, ToolPolicy,
    Usage,
};
pub use untrusted::marker_like_tags;

/// Path of the `claude` executable (default: `claude` on `PATH`).
pub const ROVER_CLAUDE_BIN: &str = "ROVER_CLAUDE_BIN";
/// Path of the `codex` executable (default: `codex` on `PATH`).
pub const ROVER_CODEX_BIN: &str = "ROVER_CODEX_BIN";

/// Longest prompt passed as one argv item inside a container (Linux caps one argument at 128 KiB).
pub const MAX_SANDBOX_PROMPT_BYTES: usize = 120 * 1024;

/// Cuts `text` to at most `max` bytes on a char boundary, marking the cut.
pub fn truncate_marked(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_owned();
    }
    let marker_room = 80;
    let mut cut = max.saturating_sub(marker_room);
    while cut > 0 && !text.is_char_boundary(cut) {
        cut -= 1;
    }
    let dropped = text.len() - cut;
    format!(
        "{}\n\n[... truncated by rover: {dropped} bytes omitted ...]\n",
        &text[..cut]
    )
}

/// The argv (program first) to run the agent as a container's command, pointed at
/// `model_base_url` when the CLI takes it as an argument (see [`AgentCli::sandbox_args`]).
///
/// There is no stdin in the container: claude gets the prompt after `--`, codex as its prompt
/// argument (with the instructions and, when a schema is asked, the schema stated in it). The
/// prompt is bounded by [`MAX_SANDBOX_PROMPT_BYTES`] with a marked truncation.
pub fn sandbox_argv(
    kind: AgentKind,
    request: &AgentRequest,
    model_base_url: Option<&str>,
) -> Vec<String> {
    let mut argv = vec![kind.default_binary().to_owned()];
    argv.extend(kind.cli().sandbox_args(request, model_base_url));
    argv
}

/// Parses a container's captured stdout for the given agent.
pub fn parse_output(
    kind: AgentKind,
    stdout: &[u8],
    expect_json: bool,
) -> Result<AgentResponse, ParseError> {
    let text = String::from_utf8_lossy(stdout);
    kind.cli()
        .parse_lines(&mut text.lines().map(str::to_owned), expect_json)
}

/// Longest stdout line [`parse_output_reader`] looks at; a longer one (no event rover reads is
/// that long: the CLIs cut tool output far below it) is skipped whole.
pub const MAX_LINE_BYTES: usize = 4 * 1024 * 1024;

/// Parses a container's captured stdout from `reader` a line at a time, as [`parse_output`]
/// does from the whole of it, holding at most one line of [`MAX_LINE_BYTES`] in memory
/// however long the output (claude's `json --verbose` array must be on one line, as printed).
pub fn parse_output_reader(
    kind: AgentKind,
    reader: impl std::io::BufRead,
    expect_json: bool,
) -> Result<AgentResponse, ParseError> {
    let lines = BoundedLines {
        reader,
        max: MAX_LINE_BYTES,
        buf: Vec::new(),
    };
    let mut lines = lines;
    kind.cli().parse_lines(&mut lines, expect_json)
}

/// The lines of a reader as `str::lines` gives them (lossy UTF-8); a line longer than `max`
/// comes out empty. A read error ends them.
struct BoundedLines<R> {
    reader: R,
    max: usize,
    buf: Vec<u8>,
}

impl<R: std::io::BufRead> Iterator for BoundedLines<R> {
    type Item = String;

    fn next(&mut self) -> Option<String> {
        self.buf.clear();
        let mut read_any = false;
        let mut overlong = false;
        loop {
            let available = match self.reader.fill_buf() {
                Ok(bytes) => bytes,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(_) => break,
            };
            if available.is_empty() {
                break;
            }
            read_any = true;
            let (take, done) = match available.iter().position(|b| *b == b'\n') {
                Some(i) => (i + 1, true),
                None => (available.len(), false),
            };
            if !overlong {
                if self.buf.len() + take - usize::from(done) > self.max {
                    overlong = true;
                    self.buf.clear();
                } else {
                    self.buf.extend_from_slice(&available[..take]);
                }
            }
            self.reader.consume(take);
            if done {
                break;
            }
        }
        if !read_any {
            return None;
        }
        if overlong {
            return Some(String::new());
        }
        let mut line: &[u8] = &self.buf;
        if let Some(rest) = line.strip_suffix(b"\n") {
            line = rest.strip_suffix(b"\r").unwrap_or(rest);
        }
        Some(String::from_utf8_lossy(line).into_owned())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_come_as_str_lines_gives_them_and_overlong_ones_empty() {
        let lines = |text: &[u8], max: usize| -> Vec<String> {
            BoundedLines {
                reader: std::io::BufReader::with_capacity(3, text),
                max,
                buf: Vec::new(),
            }
            .collect()
        };
        for text in ["", "\n", "a", "a\n", "a\r\nb\n\nc", "one\ntwo\n"] {
            let want: Vec<String> = text.lines().map(str::to_owned).collect();
            assert_eq!(lines(text.as_bytes(), 100), want, "{text:?}");
        }
        assert_eq!(lines(b"ab\nabcdef\nabc", 3), ["ab", "", "abc"]);
        assert_eq!(lines(b"abcdef", 3), [""]);
        assert_eq!(lines(b"abcd", 3), [""]);
    }

    #[test]
    fn truncation_is_marked_bounded_and_on_a_char_boundary() {
        assert_eq!(truncate_marked("short", 100), "short");
        let text = "é".repeat(1000);
        let cut = truncate_marked(&text, 500);
        assert!(cut.len() <= 500, "{}", cut.len());
        assert!(cut.contains("truncated by rover"));
        assert!(cut.starts_with("éé"));
    }
}
