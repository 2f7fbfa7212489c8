//! The request handed to an agent and the response parsed from its output stream.

use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// What the agent may do in its working directory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum ToolPolicy {
    /// No tools at all: everything the step needs is in its prompt. Every host-side step.
    None,
    /// Read, search and list files only.
    #[default]
    ReadOnly,
    /// Read plus shell commands (commit, resolve, push).
    ReadBash,
    /// Read, shell and file edits (the workflow agent in its sandbox).
    FullEdit,
}

/// One call to an agent.
#[derive(Debug, Clone)]
pub struct AgentRequest {
    /// The working directory the agent runs in.
    pub workdir: PathBuf,
    /// Instructions appended to the agent's own system prompt (role, rules, output format).
    pub system_prompt: String,
    /// The task and its context.
    pub prompt: String,
    /// JSON schema of the expected structured answer, if one is expected.
    pub schema: Option<Value>,
    /// What the agent may do.
    pub tools: ToolPolicy,
    /// Model name or alias; `None` uses the CLI's default.
    pub model: Option<String>,
    /// Upper bound on model round trips (claude only; codex has no such flag).
    pub max_turns: Option<u32>,
    /// Absolute wall-clock limit for the whole call.
    pub timeout: Duration,
    /// Limit on silence: no output line for this long ends the call.
    pub inactivity_timeout: Duration,
    /// Continue this session instead of starting a new one.
    pub resume_session: Option<String>,
    /// Where to keep the raw stdout lines (stderr goes next to it with a `.stderr` suffix).
    pub transcript: Option<PathBuf>,
}

impl AgentRequest {
    /// A request with the default limits (30 min absolute, 10 min inactivity) and read-only tools.
    pub fn new(workdir: impl Into<PathBuf>, prompt: impl Into<String>) -> Self {
        Self {
            workdir: workdir.into(),
            system_prompt: String::new(),
            prompt: prompt.into(),
            schema: None,
            tools: ToolPolicy::ReadOnly,
            model: None,
            max_turns: None,
            timeout: Duration::from_secs(30 * 60),
            inactivity_timeout: Duration::from_secs(10 * 60),
            resume_session: None,
            transcript: None,
        }
    }
}

/// Token counts reported by the CLI.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Usage {
    /// Input tokens (not counting cached reads).
    pub input: u64,
    /// Output tokens.
    pub output: u64,
    /// Cached input tokens read.
    pub cached: u64,
}

/// A tool call the CLI refused (claude `permission_denials`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PermissionDenial {
    /// The tool, e.g. `Bash`.
    pub tool_name: String,
    /// The tool's input as the model sent it.
    pub tool_input: Value,
}

/// Why the CLI reported a failed run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum ErrorClass {
    /// The API key was rejected (HTTP 401/403).
    Auth,
    /// HTTP 429.
    RateLimited,
    /// HTTP 529/503/500: the provider is overloaded or failing.
    Overloaded,
    /// HTTP 400 or another request error.
    BadRequest,
    /// The turn limit was reached.
    MaxTurns,
    /// The budget limit was reached.
    Budget,
    /// Anything else the CLI flagged as an error.
    Other,
}

/// What one agent call produced.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AgentResponse {
    /// The final answer text (claude `result`, codex last `agent_message`).
    pub text: String,
    /// The structured answer when a schema was asked and the CLI returned one.
    pub structured: Option<Value>,
    /// Session (claude) or thread (codex) id, for resuming.
    pub session_id: Option<String>,
    /// Token usage.
    pub usage: Usage,
    /// Cost in USD when the CLI reports it (claude only).
    pub cost_usd: Option<f64>,
    /// Model round trips.
    pub turns: Option<u32>,
    /// Duration as the CLI reports it, else as measured by the runner.
    pub duration_ms: Option<u64>,
    /// Tool calls that were refused.
    pub permission_denials: Vec<PermissionDenial>,
    /// Whether the CLI flagged the run as failed.
    pub is_error: bool,
    /// The kind of failure when `is_error`.
    pub error_class: Option<ErrorClass>,
    /// The CLI's error message when `is_error`.
    pub error_message: Option<String>,
    /// Non-fatal warnings seen in the stream (codex `error` events).
    pub warnings: Vec<String>,
    /// Tool invocations seen (commands run, files changed).
    pub tool_calls: u32,
    /// When a reported rate limit resets (claude `rate_limit_event`), if known.
    pub rate_limit_reset: Option<chrono::DateTime<chrono::Utc>>,
    /// Where the raw transcript was written, if anywhere.
    pub transcript: Option<PathBuf>,
}

/// Why a stream could not be turned into a response.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ParseError {
    /// The stream ended before the final line (claude `result`, codex `turn.completed`/`turn.failed`).
    #[error("the agent output ended without a final result line ({lines} lines read)")]
    NoResult {
        /// Lines seen.
        lines: usize,
    },
    /// Claude printed more than one `result` line for a single-turn run.
    #[error("the agent output has {count} result lines, expected exactly one")]
    ManyResults {
        /// How many result lines were seen.
        count: usize,
    },
    /// A line that must be JSON was not.
    #[error("the agent output is not valid json: {reason}")]
    Invalid {
        /// What serde said.
        reason: String,
    },
}

/// The pipeline steps that call an agent; each has its prompt, result type, tools and model.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum AgentStep {
    /// Decide what to do about an event.
    Coordinate,
    /// Break a directive into workflow tasks.
    Plan,
    /// Write a commit message.
    Commit,
    /// Diagnose the trace and decide the next action.
    Resolve,
    /// Push branches and open the pull request.
    Push,
    /// Compose the message for the source channel.
    Notify,
    /// Summarize a trace that ends in noop.
    Summarize,
    /// The coding agent inside the sandbox.
    Workflow,
    /// Reads the task's diff against its acceptance criteria before the push, in the sandbox
    /// with read-only tools.
    Review,
}

impl AgentStep {
    /// Every step, in pipeline order.
    pub const ALL: [AgentStep; 9] = [
        AgentStep::Coordinate,
        AgentStep::Plan,
        AgentStep::Commit,
        AgentStep::Resolve,
        AgentStep::Push,
        AgentStep::Notify,
        AgentStep::Summarize,
        AgentStep::Workflow,
        AgentStep::Review,
    ];

    /// The lowercase name used in file names (`prompts/<name>.md`, `.rover/AUTOPILOT.<name>.md`).
    pub fn name(self) -> &'static str {
        match self {
            AgentStep::Coordinate => "coordinate",
            AgentStep::Plan => "plan",
            AgentStep::Commit => "commit",
            AgentStep::Resolve => "resolve",
            AgentStep::Push => "push",
            AgentStep::Notify => "notify",
            AgentStep::Summarize => "summarize",
            AgentStep::Workflow => "workflow",
            AgentStep::Review => "review",
        }
    }

    /// The tools the step's agent gets: none for every step on the host (what they need is
    /// in their prompt, and no model chooses a command that runs on the host), full edits for
    /// the workflow agent in its sandbox, reading only for the reviewer in its sandbox.
    pub fn tools(self) -> ToolPolicy {
        match self {
            AgentStep::Workflow => ToolPolicy::FullEdit,
            AgentStep::Review => ToolPolicy::ReadOnly,
            _ => ToolPolicy::None,
        }
    }
}

impl std::fmt::Display for AgentStep {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}
