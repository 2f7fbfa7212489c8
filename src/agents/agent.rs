//! The `Agent` trait and its adapter over an agent CLI on the host ([`CliAgent`], what the
//! CLIs differ in being their [`AgentCli`]).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;

use super::cli::{AgentCli, AgentKind, HostCall};
use super::env::{agent_env, redact_secrets, ALWAYS_DENIED_ENV};
use super::error::AgentError;
use super::pricing::CodexPrices;
use super::runner::{run_process, ProcessEnd, ProcessOutcome, ProcessSpec};
use super::settings::AgentSettings;
use super::types::{AgentRequest, AgentResponse, ErrorClass, ParseError};
use crate::host_env::HostEnv;

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
    /// The executable the adapter was given, if any (it wins over `host`'s variable).
    given: Option<PathBuf>,
    binary: PathBuf,
    extra_env: Vec<String>,
    fixed_env: Vec<(String, String)>,
    kill_grace: Duration,
    /// rover's environment, of which the agent gets the allow-listed variables.
    host: HostEnv,
}

impl Launcher {
    fn new(kind: AgentKind, binary: Option<PathBuf>, settings: &AgentSettings) -> Self {
        Self {
            kind,
            given: binary,
            binary: PathBuf::new(),
            extra_env: settings.extra_env.clone(),
            fixed_env: Vec::new(),
            kill_grace: settings.kill_grace(),
            host: HostEnv::default(),
        }
        .with_host(HostEnv::default())
    }

    /// In rover's environment `host`: the executable given, else the one its variable
    /// (`ROVER_CLAUDE_BIN`, ...) names, else the CLI's name on `PATH`.
    fn with_host(mut self, host: HostEnv) -> Self {
        self.binary = self
            .given
            .clone()
            .or_else(|| host.var_os(self.kind.bin_env_var()).map(PathBuf::from))
            .unwrap_or_else(|| PathBuf::from(self.kind.default_binary()));
        self.host = host;
        self
    }

    /// The allow-listed environment plus the fixed pairs (GitHub tokens never pass), as the
    /// CLI reads it (codex: `OPENAI_API_KEY` also as `CODEX_API_KEY` when only that is set).
    fn env(&self) -> Vec<(String, String)> {
        let mut env = self.given_env();
        self.kind.cli().host_env(&mut env);
        env
    }

    /// The allow-listed environment plus the fixed pairs, as the user gave them.
    fn given_env(&self) -> Vec<(String, String)> {
        let mut env = agent_env(&self.extra_env, &self.host);
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

/// The request with any GitHub token value of `host` removed from the texts the agent will see.
fn redacted(mut req: AgentRequest, host: &HostEnv) -> AgentRequest {
    req.prompt = redact_secrets(&req.prompt, host);
    req.system_prompt = redact_secrets(&req.system_prompt, host);
    req
}

/// An agent CLI run on the host: its process, its stream parsed as it comes, the answer
/// priced and its failure classified.
#[derive(Clone)]
pub struct CliAgent {
    launcher: Launcher,
    prices: CodexPrices,
}

impl CliAgent {
    /// An adapter of `kind`; `binary` overrides the variable that names the executable
    /// (`ROVER_CLAUDE_BIN`, ...) and the CLI's name on `PATH`. It sees an empty environment
    /// until [`CliAgent::with_host`] gives it rover's.
    pub fn new(kind: AgentKind, binary: Option<PathBuf>, settings: &AgentSettings) -> Self {
        Self {
            launcher: Launcher::new(kind, binary, settings),
            prices: settings.codex_prices.clone(),
        }
    }

    /// The adapter in rover's environment `host`: where its executable's variable and `PATH`
    /// are read, and what the agent gets of it (the allow-list; never a GitHub token).
    #[must_use]
    pub fn with_host(mut self, host: HostEnv) -> Self {
        self.launcher = self.launcher.with_host(host);
        self
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

    fn cli(&self) -> &'static dyn AgentCli {
        self.launcher.kind.cli()
    }
}

impl std::fmt::Debug for CliAgent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CliAgent")
            .field("launcher", &self.launcher)
            .finish_non_exhaustive()
    }
}

/// Claude Code's adapter: `ClaudeAgent::new(binary, settings)`.
pub struct ClaudeAgent;

impl ClaudeAgent {
    /// An adapter; `binary` overrides `ROVER_CLAUDE_BIN` and the `claude` on `PATH`.
    #[allow(clippy::new_ret_no_self)]
    pub fn new(binary: Option<PathBuf>, settings: &AgentSettings) -> CliAgent {
        CliAgent::new(AgentKind::Claude, binary, settings)
    }
}

/// Codex's adapter: `CodexAgent::new(binary, settings)`.
pub struct CodexAgent;

impl CodexAgent {
    /// An adapter; `binary` overrides `ROVER_CODEX_BIN` and the `codex` on `PATH`.
    #[allow(clippy::new_ret_no_self)]
    pub fn new(binary: Option<PathBuf>, settings: &AgentSettings) -> CliAgent {
        CliAgent::new(AgentKind::Codex, binary, settings)
    }
}

/// Whether `dir` is inside a git repository (a `.git` dir or file in it or an ancestor).
fn in_git_repo(dir: &Path) -> bool {
    dir.ancestors().any(|d| d.join(".git").exists())
}

/// The request's schema in a temporary file (for a CLI that reads it from one), and whether
/// the working directory is in a git repository: small blocking file work, off the runtime.
async fn host_files(
    req: &AgentRequest,
    schema_file: bool,
) -> Result<(Option<tempfile::NamedTempFile>, bool), AgentError> {
    let schema = req.schema.clone().filter(|_| schema_file);
    let workdir = req.workdir.clone();
    tokio::task::spawn_blocking(move || {
        let in_repo = in_git_repo(&workdir);
        let Some(schema) = schema else {
            return Ok((None, in_repo));
        };
        let file = tempfile::Builder::new()
            .prefix("rover-schema-")
            .suffix(".json")
            .tempfile()
            .map_err(|source| AgentError::Io {
                path: std::env::temp_dir(),
                source,
            })?;
        std::fs::write(file.path(), schema.to_string()).map_err(|source| AgentError::Io {
            path: file.path().to_owned(),
            source,
        })?;
        Ok((Some(file), in_repo))
    })
    .await
    .expect("the schema-file task does not panic")
}

#[async_trait]
impl Agent for CliAgent {
    fn kind(&self) -> AgentKind {
        self.launcher.kind
    }

    async fn run(&self, req: AgentRequest) -> Result<AgentResponse, AgentError> {
        let req = redacted(req, &self.launcher.host);
        let cli = self.cli();
        let (schema_file, in_repo) = host_files(&req, cli.schema_file()).await?;
        let mut spec = self.launcher.spec(&req, Vec::new(), cli.host_stdin(&req));
        spec.args = cli.host_args(
            &req,
            &HostCall {
                schema_file: schema_file.as_ref().map(tempfile::NamedTempFile::path),
                in_git_repo: in_repo,
                env: &spec.env,
            },
        );
        let mut stream = cli.stream(req.schema.is_some());
        let outcome = run_process(spec, &mut |line: &str| stream.push_line(line))
            .await
            .map_err(|err| self.launcher.spawn_error(err))?;
        drop(schema_file);
        let kind = self.launcher.kind;
        let mut result = conclude(kind, &req, &outcome, stream.finish());
        if let Ok(response) = &mut result {
            cli.fill_cost(&self.prices, req.model.as_deref(), response);
        }
        log_outcome(kind, &outcome, &result);
        result
    }

    async fn check(&self) -> Result<String, AgentError> {
        let version = self.launcher.check().await?;
        let env = self.launcher.given_env();
        let cli = self.cli();
        let kind = self.launcher.kind;
        // A few file probes (a CLI's login file, its config) off the runtime.
        let credentials = tokio::task::spawn_blocking(move || cli.host_credentials(&env))
            .await
            .expect("the credentials probe does not panic")
            .map_err(|message| AgentError::Auth {
                agent: kind,
                message: format!("no credentials found: {message}"),
            })?;
        if let Some(credentials) = credentials {
            tracing::info!(credentials = %credentials, "{kind} will authenticate with {credentials}");
        }
        Ok(version)
    }
}

/// The configured agent (`settings.agent`) in rover's environment `host`, its binary from its
/// variable (`ROVER_CLAUDE_BIN`, `ROVER_CODEX_BIN`) or `PATH`.
pub fn agent_from_settings(settings: &AgentSettings, host: &HostEnv) -> Arc<dyn Agent> {
    Arc::new(CliAgent::new(settings.agent, None, settings).with_host(host.clone()))
}
