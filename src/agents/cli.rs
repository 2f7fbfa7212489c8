//! What differs between the agent CLIs rover drives, in one trait: [`AgentCli`]. Everything
//! else (the host process, the sandboxed run through rover's proxy, the parsing of a
//! container's log, the pricing of an answer) is written once against it, so another CLI is
//! one file implementing it plus its line in [`CLIS`].

use std::path::Path;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::pricing::CodexPrices;
use super::types::{AgentRequest, AgentResponse, AgentStep, ParseError};

/// A model API an agent CLI talks to, which rover's proxy forwards to under `/<name>/...`
/// with the key it holds for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Provider {
    /// The Anthropic Messages API, under `/anthropic/...`.
    Anthropic,
    /// The OpenAI Responses API, under `/openai/...`.
    Openai,
}

impl Provider {
    /// The name used in grants, paths, telemetry (`gen_ai.provider.name`) and messages.
    pub fn name(self) -> &'static str {
        match self {
            Provider::Anthropic => "anthropic",
            Provider::Openai => "openai",
        }
    }

    /// The variables of rover's environment the proxy takes this API's key from, first
    /// preferred, for the warning when none is set.
    pub fn key_names(self) -> &'static [&'static str] {
        match self {
            Provider::Anthropic => &["ANTHROPIC_API_KEY", "CLAUDE_CODE_OAUTH_TOKEN"],
            Provider::Openai => &["OPENAI_API_KEY", "CODEX_API_KEY"],
        }
    }
}

/// How a CLI is called on the host, beyond the request: what the adapter prepared for it.
#[derive(Debug, Clone, Copy)]
pub struct HostCall<'a> {
    /// Where the request's schema was written, when the CLI asked for a file
    /// ([`AgentCli::schema_file`]).
    pub schema_file: Option<&'a Path>,
    /// Whether the working directory is inside a git repository.
    pub in_git_repo: bool,
    /// The environment the process gets.
    pub env: &'a [(String, String)],
}

/// An incremental parser of a CLI's stdout, fed one line at a time.
pub trait AgentStream: Send {
    /// Feeds one stdout line; returns true once the final answer has arrived.
    fn push_line(&mut self, line: &str) -> bool;
    /// The answer, or why the output holds none.
    fn finish(self: Box<Self>) -> Result<AgentResponse, ParseError>;
    /// What the agent did last among the lines fed so far, in its own words: its last text,
    /// or the tool it called (untrusted: a page or a terminal must escape it).
    fn last_activity(&self) -> Option<String> {
        None
    }
}

/// What an agent did last, read from `lines` (the tail of its stdout, any CLI of [`CLIS`]):
/// the one parser of each CLI is fed the lines and the one that recognised something answers.
pub fn last_activity(lines: &str) -> Option<String> {
    CLIS.iter().find_map(|kind| {
        let mut stream = kind.cli().stream(false);
        for line in lines.lines() {
            stream.push_line(line);
        }
        stream.last_activity()
    })
}

/// One agent CLI: how it is found, called, pointed at a model API and read.
pub trait AgentCli: Send + Sync + 'static {
    /// Its name in `autopilot.agent.agent`, spans and logs; also the executable looked up on
    /// `PATH` (and run in a sandbox) when no path is configured.
    fn name(&self) -> &'static str;
    /// The variable of rover's environment that names the executable.
    fn bin_env_var(&self) -> &'static str;
    /// How to install it, shown when it is missing.
    fn install_hint(&self) -> &'static str;
    /// What to set when the model API rejects its credentials.
    fn credentials_hint(&self) -> &'static str;
    /// The model API it talks to.
    fn provider(&self) -> Provider;
    /// The model for `step` when none is configured (`None`: the CLI's own default).
    fn default_model(&self, _step: AgentStep) -> Option<&'static str> {
        None
    }

    /// The variables that point it at the model API at `base_url` (rover's proxy, under the
    /// provider's path) with `key` (the run's token).
    fn model_env(&self, base_url: &str, key: &str) -> Vec<(String, String)>;
    /// The argv (without the program) inside a container, where there is no stdin; pointed at
    /// `model_base_url` when given, for a CLI that reads it from an argument rather than a
    /// variable. The prompt is bounded by [`super::MAX_SANDBOX_PROMPT_BYTES`].
    fn sandbox_args(&self, request: &AgentRequest, model_base_url: Option<&str>) -> Vec<String>;

    /// The argv (without the program) on the host.
    fn host_args(&self, request: &AgentRequest, call: &HostCall<'_>) -> Vec<String>;
    /// What goes to its stdin on the host (`None`: stdin closed).
    fn host_stdin(&self, _request: &AgentRequest) -> Option<Vec<u8>> {
        None
    }
    /// Whether the request's schema is handed over as a file ([`HostCall::schema_file`]).
    fn schema_file(&self) -> bool {
        false
    }
    /// Adjusts the environment of a host process (e.g. a key under the name the CLI reads).
    fn host_env(&self, _env: &mut Vec<(String, String)>) {}
    /// What it will authenticate with on the host, checked without a model call (blocking:
    /// it may look at files); `Ok(None)`: nothing to check.
    fn host_credentials(&self, _env: &[(String, String)]) -> Result<Option<String>, String> {
        Ok(None)
    }

    /// A parser of its stdout; `expect_json`: the final message is the structured answer.
    fn stream(&self, expect_json: bool) -> Box<dyn AgentStream>;
    /// Parses a captured stdout given a line at a time.
    fn parse_lines(
        &self,
        lines: &mut dyn Iterator<Item = String>,
        expect_json: bool,
    ) -> Result<AgentResponse, ParseError> {
        let mut stream = self.stream(expect_json);
        for line in lines {
            stream.push_line(&line);
        }
        stream.finish()
    }
    /// Fills in the answer's cost in USD when the CLI reports tokens only.
    fn fill_cost(
        &self,
        _prices: &CodexPrices,
        _model: Option<&str>,
        _response: &mut AgentResponse,
    ) {
    }
}

/// Every agent CLI rover knows, by name.
pub const CLIS: &[AgentKind] = &[AgentKind::Claude, AgentKind::Codex];

/// Which agent CLI runs a request: a name in `rover.json` (`"claude"`, `"codex"`), one of
/// [`CLIS`], and the [`AgentCli`] behind it.
#[derive(Clone, Copy)]
pub struct AgentKind(&'static dyn AgentCli);

#[allow(non_upper_case_globals)]
impl AgentKind {
    /// Claude Code (`claude -p`).
    pub const Claude: AgentKind = AgentKind(&super::claude::Claude);
    /// OpenAI Codex (`codex exec`).
    pub const Codex: AgentKind = AgentKind(&super::codex::Codex);

    /// A kind for a CLI rover does not list (a test's).
    pub const fn of(cli: &'static dyn AgentCli) -> AgentKind {
        AgentKind(cli)
    }

    /// The one named `name`, among [`CLIS`].
    pub fn named(name: &str) -> Option<AgentKind> {
        CLIS.iter().copied().find(|k| k.name() == name)
    }

    /// What the CLI does.
    pub fn cli(self) -> &'static dyn AgentCli {
        self.0
    }

    /// Its name (also its executable's).
    pub fn name(self) -> &'static str {
        self.0.name()
    }

    /// The executable name looked up on `PATH` when no path is configured.
    pub fn default_binary(self) -> &'static str {
        self.0.name()
    }

    /// The environment variable that overrides the executable path.
    pub fn bin_env_var(self) -> &'static str {
        self.0.bin_env_var()
    }

    /// How to install the CLI, shown when it is missing.
    pub fn install_hint(self) -> &'static str {
        self.0.install_hint()
    }

    /// What to set when the model API rejects the credentials.
    pub fn credentials_hint(self) -> &'static str {
        self.0.credentials_hint()
    }

    /// The model API it talks to.
    pub fn provider(self) -> Provider {
        self.0.provider()
    }
}

impl Default for AgentKind {
    fn default() -> Self {
        AgentKind::Claude
    }
}

impl PartialEq for AgentKind {
    fn eq(&self, other: &Self) -> bool {
        self.name() == other.name()
    }
}

impl Eq for AgentKind {}

impl std::hash::Hash for AgentKind {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.name().hash(state);
    }
}

impl std::fmt::Debug for AgentKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::fmt::Display for AgentKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl Serialize for AgentKind {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.name())
    }
}

impl<'de> Deserialize<'de> for AgentKind {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let name = String::deserialize(d)?;
        AgentKind::named(&name).ok_or_else(|| {
            // The words serde uses for an unknown variant of an enum.
            let names: Vec<String> = CLIS.iter().map(|k| format!("`{}`", k.name())).collect();
            let expected = match names.as_slice() {
                [one] => one.clone(),
                [a, b] => format!("{a} or {b}"),
                all => format!("one of {}", all.join(", ")),
            };
            serde::de::Error::custom(format!("unknown variant `{name}`, expected {expected}"))
        })
    }
}
