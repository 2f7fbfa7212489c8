//! The `Agent` trait and its two adapters over the real CLIs.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;

use super::claude::{self, ClaudeStream};
use super::codex::{self, CodexStream};
use super::env::{
    agent_env, codex_credentials, env_value, map_codex_key, redact_secrets, ALWAYS_DENIED_ENV,
    OPENAI_BASE_URL,
};
use super::error::AgentError;
use super::pricing::CodexPrices;
use super::runner::{run_process, ProcessEnd, ProcessOutcome, ProcessSpec};
use super::settings::AgentSettings;
use super::types::{AgentKind, AgentRequest, AgentResponse, ErrorClass, ParseError};

/// Longest stdout line kept (tool results can be several MB on one line).
const MAX_LINE_BYTES: usize = 64 * 1024 * 1024;

/// One coding agent: run a request, or check the CLI is installed.
#[async_trait]
pub trait Agent: Send + Sync {
    /// Which CLI this is.
    fn kind(&self) -> AgentKind;

    /// Runs one request to its end. Dropping the future stops the agent's process group.
    async fn run(&self, req: AgentRequest) -> Result<AgentResponse, AgentError>;

    /// Runs `--version`; a missing CLI gives one message naming it and how to install it.
    /// Codex also needs credentials it can find (checked without a model call).
    async fn check(&self) -> Result<String, AgentError>;
}

/// Where an adapter finds its executable and what it passes to it.
#[derive(Debug, Clone)]
struct Launcher {
    kind: AgentKind,
    binary: PathBuf,
    extra_env: Vec<String>,
    fixed_env: Vec<(String, String)>,
    kill_grace: Duration,
}

impl Launcher {
    fn new(kind: AgentKind, binary: Option<PathBuf>, settings: &AgentSettings) -> Self {
        let binary = binary
            .or_else(|| std::env::var_os(kind.bin_env_var()).map(PathBuf::from))
            .unwrap_or_else(|| PathBuf::from(kind.default_binary()));
        Self {
            kind,
            binary,
            extra_env: settings.extra_env.clone(),
            fixed_env: Vec::new(),
            kill_grace: settings.kill_grace(),
        }
    }

    /// The allow-listed environment plus the fixed pairs (GitHub tokens never pass); codex
    /// also gets `OPENAI_API_KEY` as `CODEX_API_KEY` when only that is set.
    fn env(&self) -> Vec<(String, String)> {
        let mut env = self.given_env();
        if self.kind == AgentKind::Codex {
            map_codex_key(&mut env);
        }
        env
    }

    /// The allow-listed environment plus the fixed pairs, as the user gave them.
    fn given_env(&self) -> Vec<(String, String)> {
        let mut env = agent_env(&self.extra_env);
        for (name, value) in &self.fixed_env {
            if ALWAYS_DENIED_ENV.contains(&name.as_str()) {
                continue;
            }
            env.retain(|(existing, _)| existing != name);
            env.push((name.clone(), value.clone()));
        }
        env
    }

    fn spawn_error(&self, err: AgentError) -> AgentError {
        match err {
            AgentError::Spawn { source, .. } if source.kind() == std::io::ErrorKind::NotFound => {
                AgentError::NotFound {
                    binary: self.binary.display().to_string(),
                    env_var: self.kind.bin_env_var(),
                    install: self.kind.install_hint(),
                }
            }
            other => other,
        }
    }

    fn spec(&self, req: &AgentRequest, args: Vec<String>, stdin: Option<Vec<u8>>) -> ProcessSpec {
        ProcessSpec {
            program: self.binary.clone(),
            args,
            cwd: req.workdir.clone(),
            env: self.env(),
            stdin,
            timeout: req.timeout,
            inactivity_timeout: req.inactivity_timeout,
            kill_grace: self.kill_grace,
            after_result_grace: Duration::from_secs(3),
            transcript: req.transcript.clone(),
            max_line_bytes: MAX_LINE_BYTES,
        }
    }

    async fn check(&self) -> Result<String, AgentError> {
        let spec = ProcessSpec {
            program: self.binary.clone(),
            args: vec!["--version".to_owned()],
            cwd: std::env::temp_dir(),
            env: self.env(),
            stdin: None,
            timeout: Duration::from_secs(60),
            inactivity_timeout: Duration::from_secs(60),
            kill_grace: self.kill_grace,
            after_result_grace: Duration::from_secs(1),
            transcript: None,
            max_line_bytes: 64 * 1024,
        };
        let mut first = None;
        let outcome = run_process(spec, &mut |line: &str| {
            if first.is_none() && !line.trim().is_empty() {
                first = Some(line.trim().to_owned());
            }
            false
        })
        .await
        .map_err(|err| self.spawn_error(err))?;
        match (outcome.exit_code, first) {
            (Some(0), Some(version)) => Ok(version),
            (exit, _) => Err(AgentError::Failed {
                exit,
                message: format!(
                    "`{} --version` did not print a version",
                    self.binary.display()
                ),
                stderr: outcome.stderr,
            }),
        }
    }
}

/// Logs the end of a call: never the prompt or the environment (they may hold secrets).
fn log_outcome(
    kind: AgentKind,
    outcome: &ProcessOutcome,
    result: &Result<AgentResponse, AgentError>,
) {
    match result {
        Ok(response) => tracing::info!(
            agent = %kind,
            elapsed_ms = u64::try_from(outcome.elapsed.as_millis()).unwrap_or(u64::MAX),
            exit = ?outcome.exit_code,
            session = ?response.session_id,
            turns = ?response.turns,
            input_tokens = response.usage.input,
            output_tokens = response.usage.output,
            cost_usd = ?response.cost_usd,
            "agent call finished"
        ),
        Err(err) => tracing::warn!(
            agent = %kind,
            elapsed_ms = u64::try_from(outcome.elapsed.as_millis()).unwrap_or(u64::MAX),
            exit = ?outcome.exit_code,
            signal = ?outcome.signal,
            class = err.class(),
            retryable = err.is_retryable(),
            error = err as &dyn std::error::Error,
            "agent call failed: {err}"
        ),
    }
}

/// The response, or the classified error, for a finished process and its parsed stream.
fn conclude(
    kind: AgentKind,
    req: &AgentRequest,
    outcome: &ProcessOutcome,
    parsed: Result<AgentResponse, ParseError>,
) -> Result<AgentResponse, AgentError> {
    match outcome.end {
        ProcessEnd::Timeout => return Err(AgentError::Timeout { after: req.timeout }),
        ProcessEnd::Inactive => {
            return Err(AgentError::Inactive {
                after: req.inactivity_timeout,
            })
        }
        ProcessEnd::Finished => {}
    }
    let killed =
        !outcome.stopped_by_us && (outcome.signal == Some(9) || outcome.exit_code == Some(137));
    match parsed {
        Ok(mut response) => {
            response.transcript.clone_from(&req.transcript);
            if response.duration_ms.is_none() {
                response.duration_ms = u64::try_from(outcome.elapsed.as_millis()).ok();
            }
            if !response.is_error {
                // A success result followed by a non-zero exit is still a success.
                return Ok(response);
            }
            let message = response.error_message.clone().unwrap_or_default();
            Err(match response.error_class {
                Some(ErrorClass::Auth) => AgentError::Auth {
                    agent: kind,
                    message,
                },
                Some(ErrorClass::BadRequest) => AgentError::BadRequest { message },
                Some(ErrorClass::RateLimited) => AgentError::RateLimited {
                    reset: response.rate_limit_reset,
                    message,
                },
                Some(ErrorClass::Overloaded) => AgentError::Overloaded { message },
                Some(ErrorClass::MaxTurns) => AgentError::MaxTurns { message },
                _ => AgentError::Failed {
                    exit: outcome.exit_code,
                    message,
                    stderr: outcome.stderr.clone(),
                },
            })
        }
        Err(_) if killed => Err(AgentError::Killed {
            how: outcome.signal.map_or_else(
                || format!("exit {}", outcome.exit_code.unwrap_or_default()),
                |signal| format!("signal {signal}"),
            ),
        }),
        Err(_) if outcome.stdout_bytes == 0 && outcome.exit_code != Some(0) => {
            Err(AgentError::Refused {
                exit: outcome.exit_code,
                stderr: outcome.stderr.trim().to_owned(),
            })
        }
        Err(err) if outcome.exit_code != Some(0) => Err(AgentError::Failed {
            exit: outcome.exit_code,
            message: err.to_string(),
            stderr: outcome.stderr.clone(),
        }),
        Err(err) => Err(AgentError::BadOutput {
            reason: err.to_string(),
            raw: outcome.stdout_tail.clone(),
        }),
    }
}

/// The request with any GitHub token value removed from the texts the agent will see.
fn redacted(mut req: AgentRequest) -> AgentRequest {
    req.prompt = redact_secrets(&req.prompt);
    req.system_prompt = redact_secrets(&req.system_prompt);
    req
}

/// Claude Code: `claude -p --output-format stream-json --verbose ...`, prompt on stdin.
#[derive(Debug, Clone)]
pub struct ClaudeAgent {
    launcher: Launcher,
}

impl ClaudeAgent {
    /// An adapter; `binary` overrides `ROVER_CLAUDE_BIN` and the `claude` on `PATH`.
    pub fn new(binary: Option<PathBuf>, settings: &AgentSettings) -> Self {
        Self {
            launcher: Launcher::new(AgentKind::Claude, binary, settings),
        }
    }

    /// Sets an environment variable for the agent (e.g. `CLAUDE_CODE_MAX_RETRIES=0`); the
    /// GitHub token variables are ignored here too.
    #[must_use]
    pub fn with_env(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.launcher.fixed_env.push((name.into(), value.into()));
        self
    }

    /// The executable this adapter runs.
    pub fn binary(&self) -> &Path {
        &self.launcher.binary
    }
}

#[async_trait]
impl Agent for ClaudeAgent {
    fn kind(&self) -> AgentKind {
        AgentKind::Claude
    }

    async fn run(&self, req: AgentRequest) -> Result<AgentResponse, AgentError> {
        let req = redacted(req);
        let args = claude::host_args(&req);
        let spec = self
            .launcher
            .spec(&req, args, Some(req.prompt.clone().into_bytes()));
        let mut stream = ClaudeStream::default();
        let outcome = run_process(spec, &mut |line: &str| stream.push_line(line))
            .await
            .map_err(|err| self.launcher.spawn_error(err))?;
        let result = conclude(AgentKind::Claude, &req, &outcome, stream.finish());
        log_outcome(AgentKind::Claude, &outcome, &result);
        result
    }

    async fn check(&self) -> Result<String, AgentError> {
        self.launcher.check().await
    }
}

/// Codex: `codex exec --json -s ... [--output-schema FILE] -- PROMPT`, stdin closed.
#[derive(Debug, Clone)]
pub struct CodexAgent {
    launcher: Launcher,
    prices: CodexPrices,
}

impl CodexAgent {
    /// An adapter; `binary` overrides `ROVER_CODEX_BIN` and the `codex` on `PATH`.
    pub fn new(binary: Option<PathBuf>, settings: &AgentSettings) -> Self {
        Self {
            launcher: Launcher::new(AgentKind::Codex, binary, settings),
            prices: settings.codex_prices.clone(),
        }
    }

    /// Sets an environment variable for the agent (e.g. `CLAUDE_CODE_MAX_RETRIES=0`); the
    /// GitHub token variables are ignored here too.
    #[must_use]
    pub fn with_env(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.launcher.fixed_env.push((name.into(), value.into()));
        self
    }

    /// The executable this adapter runs.
    pub fn binary(&self) -> &Path {
        &self.launcher.binary
    }
}

/// Whether `dir` is inside a git repository (a `.git` dir or file in it or an ancestor).
fn in_git_repo(dir: &Path) -> bool {
    dir.ancestors().any(|d| d.join(".git").exists())
}

#[async_trait]
impl Agent for CodexAgent {
    fn kind(&self) -> AgentKind {
        AgentKind::Codex
    }

    async fn run(&self, req: AgentRequest) -> Result<AgentResponse, AgentError> {
        let req = redacted(req);
        let schema = req.schema.clone();
        let workdir = req.workdir.clone();
        // Small blocking file work (schema file, repo probe) off the runtime.
        let (schema_file, in_repo) = tokio::task::spawn_blocking(move || {
            let in_repo = in_git_repo(&workdir);
            let file = match schema {
                Some(schema) => {
                    let file = tempfile::Builder::new()
                        .prefix("rover-schema-")
                        .suffix(".json")
                        .tempfile()
                        .map_err(|source| AgentError::Io {
                            path: std::env::temp_dir(),
                            source,
                        })?;
                    std::fs::write(file.path(), schema.to_string()).map_err(|source| {
                        AgentError::Io {
                            path: file.path().to_owned(),
                            source,
                        }
                    })?;
                    Some(file)
                }
                None => None,
            };
            Ok::<_, AgentError>((file, in_repo))
        })
        .await
        .expect("the schema-file task does not panic")?;
        let mut args = codex::host_args(
            &req,
            schema_file.as_ref().map(tempfile::NamedTempFile::path),
            in_repo,
        );
        let mut spec = self.launcher.spec(&req, Vec::new(), None);
        if let Some(url) = env_value(&spec.env, OPENAI_BASE_URL) {
            codex::insert_base_url(&mut args, url);
        }
        spec.args = args;
        let mut stream = CodexStream::new(req.schema.is_some());
        let outcome = run_process(spec, &mut |line: &str| stream.push_line(line))
            .await
            .map_err(|err| self.launcher.spawn_error(err))?;
        drop(schema_file);
        let mut result = conclude(AgentKind::Codex, &req, &outcome, stream.finish());
        if let Ok(response) = &mut result {
            // codex reports tokens only: the price table makes them USD for the budgets.
            self.prices.fill_cost(req.model.as_deref(), response);
        }
        log_outcome(AgentKind::Codex, &outcome, &result);
        result
    }

    async fn check(&self) -> Result<String, AgentError> {
        let version = self.launcher.check().await?;
        let env = self.launcher.given_env();
        let base_url = env_value(&env, OPENAI_BASE_URL).map(str::to_owned);
        // A few file probes (`auth.json`, `config.toml`) off the runtime.
        let credentials = tokio::task::spawn_blocking(move || codex_credentials(&env))
            .await
            .expect("the credentials probe does not panic")
            .map_err(|message| AgentError::Auth {
                agent: AgentKind::Codex,
                message: format!("no credentials found: {message}"),
            })?;
        tracing::info!(
            credentials = %credentials,
            base_url = base_url.as_deref().unwrap_or("(codex default)"),
            "codex will authenticate with {credentials}"
        );
        Ok(version)
    }
}

/// The configured agent (`settings.agent`), its binary from `ROVER_CLAUDE_BIN` / `ROVER_CODEX_BIN`
/// or `PATH`.
pub fn agent_from_settings(settings: &AgentSettings) -> Arc<dyn Agent> {
    match settings.agent {
        AgentKind::Claude => Arc::new(ClaudeAgent::new(None, settings)),
        AgentKind::Codex => Arc::new(CodexAgent::new(None, settings)),
    }
}
