//! The command line: `rover autopilot <command>`. Parsing, resolving which project and store a
//! command is about, and mapping errors to exit codes by their kind (`crate::error::ErrorKind`:
//! 2 usage, 65 corrupt, 66 not found, 70 internal, 75 unavailable, 77 refused, 78 config).

mod budget;
mod dashboard;
mod fleet_status;
mod fleet_stores;
mod gc;
mod inspect;
mod intervene;
mod memory;
mod output;
mod placements;
mod proxy;
mod refused;
mod replay;
mod start;
mod status;
mod submit;
mod telemetry;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

pub use output::Output;

use crate::error::{error_chain, ErrorKind, Kinded};
use crate::host_env::HostEnv;
use crate::project::{self, Project, ProjectError, RepoSlug};
use crate::store::{AutopilotStore, CloseCommand, StoreError};

/// rover watches a GitHub repository and reacts to its events with coding agents.
#[derive(Debug, Parser)]
#[command(name = "rover", version, about, propagate_version = true)]
pub struct Args {
    #[command(flatten)]
    pub global: GlobalArgs,
    #[command(subcommand)]
    pub command: Command,
}

/// Flags every command understands.
#[derive(Debug, Clone, clap::Args)]
pub struct GlobalArgs {
    /// Use the store of this project id instead of deriving it from the repository
    #[arg(long, global = true, value_name = "ID")]
    pub project_id: Option<String>,
    /// The GitHub repository, OWNER/NAME (default: the `origin` remote); outside a checkout,
    /// the repositories of the daemon file to look at (repeatable)
    #[arg(long, global = true, value_name = "OWNER/NAME", value_delimiter = ',')]
    pub repo: Vec<String>,
    /// The repository's directory (default: the current directory)
    #[arg(long, global = true, value_name = "DIR")]
    pub project_dir: Option<PathBuf>,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// React to repository events autonomously, and inspect what was done
    #[command(subcommand)]
    Autopilot(AutopilotCommand),
}

#[derive(Debug, Subcommand)]
pub enum DeadLetterCommand {
    /// Remove a dead letter from the queue (recorded in its trace)
    Drop {
        /// The action id (or a prefix of 8+ characters)
        id: String,
        /// Who drops it (default: $USER)
        #[arg(long)]
        by: Option<String>,
    },
    /// Put a dead letter back in line with a fresh attempt budget (for a rover that now handles its type)
    Requeue {
        /// The action id (or a prefix of 8+ characters)
        id: String,
        /// Who requeues it (default: $USER)
        #[arg(long)]
        by: Option<String>,
    },
}

#[derive(Debug, Subcommand)]
pub enum AutopilotCommand {
    /// Watch the repository and react to its events until stopped (SIGINT/SIGTERM)
    Start {
        /// Poll once, drain until nothing is runnable now, then exit (for cron)
        #[arg(long, conflicts_with = "webhook")]
        once: bool,
        /// Serve local requests (`rover autopilot submit`) only; no GitHub token needed
        #[arg(long, conflicts_with = "webhook")]
        local: bool,
        /// Also receive GitHub webhooks: serve `POST /github` on ADDR (plain HTTP; needs ROVER_WEBHOOK_SECRET)
        #[arg(long, value_name = "ADDR")]
        webhook: Option<std::net::SocketAddr>,
        /// Process the N most recent events already in the feed (the first start skips the backlog)
        #[arg(long, value_name = "N", conflicts_with = "local")]
        backlog: Option<usize>,
        /// Serve every repository the daemon file FILE lists (default outside a checkout: ~/.config/rover/daemon.json)
        #[arg(long, value_name = "FILE")]
        config: Option<PathBuf>,
        /// Also serve the dashboard on ADDR (as `rover autopilot dashboard --addr ADDR`)
        #[arg(long, value_name = "ADDR")]
        dashboard: Option<std::net::SocketAddr>,
        /// With --dashboard: offer cancel and retry on its pages
        #[arg(long, requires = "dashboard")]
        dashboard_actions: bool,
    },
    /// List recent events and what became of each: a trace started, a duplicate, or skipped and why
    Events {
        /// How many events to list (newest last)
        #[arg(long, default_value_t = 50)]
        limit: usize,
        /// Print the list as JSON (one array of records, format in docs/cli.md)
        #[arg(long)]
        json: bool,
        /// Every repository of the daemon file FILE, a REPO column first (default outside a checkout: ~/.config/rover/daemon.json)
        #[arg(long, value_name = "FILE")]
        config: Option<PathBuf>,
    },
    /// Submit a local request; it runs through the same pipeline as a GitHub event
    Submit {
        /// The request (read from standard input when absent or `-`)
        text: Option<String>,
    },
    /// Show one trace as a tree: steps, statuses, decisions, pending work and errors
    Trace {
        /// A trace, span or action id, or an unambiguous prefix of one (8+ characters)
        id: String,
        /// Print the trace as JSON (format in docs/cli.md)
        #[arg(long)]
        json: bool,
        /// Look in every repository of the daemon file FILE (default outside a checkout: ~/.config/rover/daemon.json)
        #[arg(long, value_name = "FILE")]
        config: Option<PathBuf>,
    },
    /// Run recorded traces again through this build's deciding steps, with the recorded model
    /// answers and GitHub reads (nothing is sent anywhere), and report where it decides
    /// otherwise. Exit 0: nothing diverged; 1: a divergence; 3: a trace cannot be replayed
    Replay {
        /// A trace id or an unambiguous prefix (8+ characters), from this project's store
        #[arg(conflicts_with = "dir")]
        trace: Option<String>,
        /// Replay every exported trace (*.json) in this folder and print a summary table
        #[arg(long, value_name = "FOLDER")]
        dir: Option<PathBuf>,
        /// Instead of replaying: write the trace (or the --last N most recent) as export files
        /// into this folder
        #[arg(long, value_name = "FOLDER", conflicts_with = "dir")]
        export: Option<PathBuf>,
        /// With --export: the N most recent traces
        #[arg(long, value_name = "N", requires = "export")]
        last: Option<usize>,
        /// Decide with this config file instead of the project's rover.json
        #[arg(long, value_name = "FILE")]
        config: Option<PathBuf>,
        /// Print the replay as JSON (format in docs/cli.md)
        #[arg(long)]
        json: bool,
    },
    /// List recent traces, newest first
    Traces {
        /// How many traces to list
        #[arg(long, default_value_t = 20)]
        limit: usize,
        /// Print the list as JSON
        #[arg(long)]
        json: bool,
        /// Every repository of the daemon file FILE, a REPO column first (default outside a checkout: ~/.config/rover/daemon.json)
        #[arg(long, value_name = "FILE")]
        config: Option<PathBuf>,
    },
    /// Close the circuit breaker so rover takes new work again
    Resume,
    /// Cancel a trace: take its queued work off the queue, stop its agents and containers, and say so on its channel
    Cancel {
        /// A trace, span or action id, or an unambiguous prefix of one (8+ characters)
        id: String,
        /// Why (shown in the trace and the answer)
        #[arg(long)]
        reason: Option<String>,
        /// Who cancels it (default: $USER)
        #[arg(long)]
        by: Option<String>,
    },
    /// Mark a trace failed: like cancel, and the answer says it failed and why
    Fail {
        /// A trace, span or action id, or an unambiguous prefix of one (8+ characters)
        id: String,
        /// Why it failed (shown in the trace and the answer)
        #[arg(long)]
        reason: String,
        /// Who fails it (default: $USER)
        #[arg(long)]
        by: Option<String>,
    },
    /// Run a failed action again with a fresh attempt budget (a trace id retries its latest failed action)
    Retry {
        /// An action id, or a trace id (or an id in it, or a prefix of 8+ characters)
        id: String,
        /// Who retries it (default: $USER)
        #[arg(long)]
        by: Option<String>,
    },
    /// Show what ended traces hold (worktrees, branches, containers, task mappings) and reclaim what is past pipeline.retainDays; remove rover's containers, networks and volumes whose store is gone or whose daemon is dead with no live run
    Gc {
        /// Only show what is due and what would be removed, free nothing
        #[arg(long)]
        dry_run: bool,
        /// Print the plan as JSON
        #[arg(long)]
        json: bool,
        /// Keep ended traces' resources this many days (default: pipeline.retainDays, 7)
        #[arg(long, value_name = "DAYS")]
        retain_days: Option<u64>,
        /// Every repository of the daemon file FILE, a REPO column first (default outside a checkout: ~/.config/rover/daemon.json)
        #[arg(long, value_name = "FILE")]
        config: Option<PathBuf>,
    },
    /// List queued actions no step handles, or drop or requeue one
    DeadLetters {
        #[command(subcommand)]
        command: Option<DeadLetterCommand>,
        /// Print the list as JSON
        #[arg(long)]
        json: bool,
        /// Every repository of the daemon file FILE, a REPO column first (default outside a checkout: ~/.config/rover/daemon.json)
        #[arg(long, value_name = "FILE")]
        config: Option<PathBuf>,
    },
    /// Serve the dashboard: what runs now, the traces as timelines (docs/dashboard.md)
    Dashboard {
        /// Where to listen; an address other than loopback needs ROVER_DASHBOARD_TOKEN
        #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:8790")]
        addr: std::net::SocketAddr,
        /// Offer cancel and retry on a trace's page (recorded with `by: dashboard`)
        #[arg(long)]
        allow_actions: bool,
        /// Every repository of the daemon file FILE (default outside a checkout: ~/.config/rover/daemon.json)
        #[arg(long, value_name = "FILE")]
        config: Option<PathBuf>,
    },
    /// Show whether a daemon runs, the queue, running steps, task mappings, spend and pauses
    Status {
        /// Print the status as JSON
        #[arg(long)]
        json: bool,
        /// The repositories of the daemon file FILE, one line each (default outside a checkout: ~/.config/rover/daemon.json)
        #[arg(long, value_name = "FILE")]
        config: Option<PathBuf>,
    },
    /// The lessons rover learned from ended traces: list them, show one with its evidence, forget or pin one
    Memory {
        #[command(subcommand)]
        command: Option<memory::MemoryCommand>,
        /// Print as JSON (format in docs/cli.md)
        #[arg(long, global = true)]
        json: bool,
        /// Every repository of the daemon file FILE (default outside a checkout: ~/.config/rover/daemon.json)
        #[arg(long, value_name = "FILE", global = true)]
        config: Option<PathBuf>,
    },
    /// rover's sandbox proxy and relays (run by rover in its own containers, not by hand)
    #[command(subcommand, hide = true)]
    Proxy(ProxyCommand),
}

/// The parts of a sandbox's closed network that run rover's binary (see docs/sandbox.md).
#[derive(Debug, Subcommand)]
pub enum ProxyCommand {
    /// Serve the model and egress proxy on DIR/sock/proxy.sock (upstreams and keys from ROVER_PROXY_*)
    Serve {
        #[arg(long, value_name = "DIR")]
        dir: PathBuf,
    },
    /// Hand every connection on ADDR to the proxy's socket, as run RUN
    Relay {
        /// The run's store key under a proxy server shared by many repositories
        #[arg(long)]
        key: Option<String>,
        #[arg(long)]
        run: String,
        #[arg(long, value_name = "PATH")]
        socket: PathBuf,
        #[arg(long, value_name = "ADDR")]
        listen: std::net::SocketAddr,
    },
}

/// A failure of a command, of one kind (see [`ErrorKind`]), with what the user can do about it.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    #[error(transparent)]
    Project(#[from] ProjectError),
    #[error(transparent)]
    DaemonFile(#[from] crate::config::DaemonFileError),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Start(#[from] crate::daemon::StartError),
    #[error(transparent)]
    Intervene(#[from] crate::steps::intervene::InterveneError),
    #[error(transparent)]
    Bundle(#[from] crate::replay::BundleError),
    #[error("cannot write the output")]
    Output(#[source] std::io::Error),
    /// A failure about one repository of the daemon file.
    #[error("{repo}")]
    InRepo {
        repo: String,
        #[source]
        source: Box<CliError>,
    },
    /// The command line asks for something that cannot be done as asked.
    #[error("{0}")]
    Usage(String),
    /// What the command names does not exist.
    #[error("{0}")]
    NotFound(String),
    /// A file or setting the command was pointed at is not usable.
    #[error("{0}")]
    Config(String),
    /// Something the command needs does not answer now.
    #[error("{0}")]
    Unavailable(String),
    /// A failure of rover's own (a runtime, a file it cannot write).
    #[error("{0}")]
    Internal(String),
}

impl Kinded for CliError {
    fn kind(&self) -> ErrorKind {
        match self {
            CliError::Project(e) => e.kind(),
            CliError::Store(e) => e.kind(),
            CliError::Start(e) => e.kind(),
            CliError::DaemonFile(e) => e.kind(),
            CliError::Intervene(e) => e.kind(),
            CliError::Bundle(e) => e.kind(),
            CliError::InRepo { source, .. } => source.kind(),
            CliError::Output(_) | CliError::Internal(_) => ErrorKind::Internal,
            CliError::Usage(_) => ErrorKind::Usage,
            CliError::NotFound(_) => ErrorKind::NotFound,
            CliError::Config(_) => ErrorKind::Config,
            CliError::Unavailable(_) => ErrorKind::Unavailable,
        }
    }
}

/// What a failed command prints with `--json` on standard output (`docs/cli.md`, Exit codes):
/// `{"error": {"kind", "message", "hint", "exitCode"}}`.
#[derive(Debug, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ErrorRecord {
    pub kind: ErrorKind,
    pub message: String,
    pub hint: String,
    pub exit_code: u8,
}

impl ErrorRecord {
    pub fn of(e: &CliError) -> ErrorRecord {
        let kind = e.kind();
        ErrorRecord {
            kind,
            message: error_chain(e),
            hint: kind.default_hint().to_owned(),
            exit_code: kind.exit_code(),
        }
    }
}

/// Parse the arguments, run the command, and turn the result into an exit code.
pub fn main() -> ExitCode {
    // Before any thread: the token leaves the environment, the process turns non-dumpable.
    let started = HostEnv::from_process();
    crate::github::octo::seal_token(&started);
    crate::github::webhook::seal_secret(&started);
    let args = match Args::try_parse() {
        Ok(args) => args,
        Err(e) => {
            let _ = e.print();
            return ExitCode::from(u8::try_from(e.exit_code()).unwrap_or(2));
        }
    };
    let json = args.wants_json();
    let mut out = Output::stdout();
    match run(args, &mut out) {
        Ok(code) => code,
        Err(CliError::Output(e)) if e.kind() == std::io::ErrorKind::BrokenPipe => ExitCode::SUCCESS,
        Err(e) => {
            let record = ErrorRecord::of(&e);
            eprintln!("error: {}", record.message);
            if json {
                let _ = out.json(&serde_json::json!({ "error": record }));
            }
            ExitCode::from(record.exit_code)
        }
    }
}

impl Args {
    /// Whether the command was asked for JSON output (its failure is then JSON too).
    fn wants_json(&self) -> bool {
        let Command::Autopilot(cmd) = &self.command;
        match cmd {
            AutopilotCommand::Events { json, .. }
            | AutopilotCommand::Trace { json, .. }
            | AutopilotCommand::Replay { json, .. }
            | AutopilotCommand::Traces { json, .. }
            | AutopilotCommand::Gc { json, .. }
            | AutopilotCommand::DeadLetters { json, .. }
            | AutopilotCommand::Status { json, .. }
            | AutopilotCommand::Memory { json, .. } => *json,
            AutopilotCommand::Start { .. }
            | AutopilotCommand::Submit { .. }
            | AutopilotCommand::Resume
            | AutopilotCommand::Cancel { .. }
            | AutopilotCommand::Fail { .. }
            | AutopilotCommand::Retry { .. }
            | AutopilotCommand::Dashboard { .. }
            | AutopilotCommand::Proxy(_) => false,
        }
    }
}

/// Wake the project's running daemon (SIGUSR1) so it drains now; its pid, or `None` when no
/// daemon runs.
pub(crate) fn wake_daemon(store: &crate::store::AutopilotStore) -> Option<i32> {
    let pid = store.daemon_pid().and_then(|p| p.parse::<i32>().ok())?;
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid),
        nix::sys::signal::Signal::SIGUSR1,
    );
    Some(pid)
}

/// The exit code of a command that printed what it could and met an error of `kind` on the way
/// (a repository of the daemon file whose store cannot be read).
pub(crate) fn exit_code_of(kind: ErrorKind) -> ExitCode {
    ExitCode::from(kind.exit_code())
}

/// A queued action no step of this rover handles: a dead letter (`status`, `dead-letters`).
pub(crate) fn is_dead_letter(p: &crate::store::PendingAction) -> bool {
    use crate::store::StepKind;
    matches!(p.action, StepKind::Other(_) | StepKind::Event)
}

pub fn run(args: Args, out: &mut Output) -> Result<ExitCode, CliError> {
    // rover's environment, read once for the command (the sealed secrets are gone from it
    // and held by the GitHub client) and handed down from here.
    let ctx = Context {
        global: args.global,
        host: HostEnv::from_process(),
    };
    match args.command {
        Command::Autopilot(cmd) => match cmd {
            AutopilotCommand::Start {
                once,
                local,
                webhook,
                backlog,
                config,
                dashboard,
                dashboard_actions,
            } => {
                let daemon_file = ctx.daemon_file(config);
                if let Some(addr) = dashboard {
                    // Bound (or refused) before the daemon starts; served beside it.
                    let sources = daemon_file
                        .clone()
                        .map_or(dashboard::Sources::Project, dashboard::Sources::Fleet);
                    let prepared = dashboard::prepare(&ctx, addr, dashboard_actions, sources)?;
                    out.print(&prepared.banner())?;
                    prepared.spawn();
                }
                start::start(
                    &ctx,
                    daemon_file,
                    crate::daemon::StartOptions {
                        once,
                        local,
                        webhook,
                        backlog,
                    },
                )
            }
            AutopilotCommand::Dashboard {
                addr,
                allow_actions,
                config,
            } => dashboard::dashboard(&ctx, out, addr, allow_actions, config),
            AutopilotCommand::Events {
                limit,
                json,
                config,
            } => inspect::events(&ctx, out, limit, json, config),
            AutopilotCommand::Submit { text } => submit::submit(&ctx, out, text),
            AutopilotCommand::Trace { id, json, config } => {
                inspect::trace(&ctx, out, &id, json, config)
            }
            AutopilotCommand::Traces {
                limit,
                json,
                config,
            } => inspect::traces(&ctx, out, limit, json, config),
            AutopilotCommand::Replay {
                trace,
                dir,
                export,
                last,
                config,
                json,
            } => replay::replay(
                &ctx,
                out,
                &replay::ReplayArgs {
                    trace,
                    dir,
                    export,
                    last,
                    config,
                    json,
                },
            ),
            AutopilotCommand::Status { json, config } => match fleet_stores::daemon_file(&ctx, config) {
                Some(path) => fleet_status::fleet_status(&ctx, out, json, &path),
                None => inspect::status(&ctx, out, json),
            },
            AutopilotCommand::Resume => budget::resume(&ctx, out),
            AutopilotCommand::Cancel { id, reason, by } => {
                intervene::close(&ctx, out, &id, CloseCommand::Cancel, reason, by)
            }
            AutopilotCommand::Fail { id, reason, by } => {
                intervene::close(&ctx, out, &id, CloseCommand::Fail, Some(reason), by)
            }
            AutopilotCommand::Retry { id, by } => intervene::retry(&ctx, out, &id, by),
            AutopilotCommand::Gc {
                dry_run,
                json,
                retain_days,
                config,
            } => gc::gc(&ctx, out, &gc::GcArgs { dry_run, json, retain_days }, config),
            AutopilotCommand::Proxy(command) => proxy::run(command),
            AutopilotCommand::Memory {
                command,
                json,
                config,
            } => memory::memory(&ctx, out, command, json, config),
            AutopilotCommand::DeadLetters {
                command,
                json,
                config,
            } => match command {
                None => intervene::dead_letters(&ctx, out, json, config),
                Some(_) if config.is_some() => Err(CliError::Usage(
                    "dead-letters drop and requeue act on one repository's store: run them in its checkout (or with --project-id), without --config".into(),
                )),
                Some(DeadLetterCommand::Drop { id, by }) => {
                    intervene::dead_letter(&ctx, out, &id, true, by)
                }
                Some(DeadLetterCommand::Requeue { id, by }) => {
                    intervene::dead_letter(&ctx, out, &id, false, by)
                }
            },
        },
    }
}

/// What a command knows about where it runs.
pub struct Context {
    pub global: GlobalArgs,
    /// rover's environment (without the sealed secrets), read once for the command.
    pub host: HostEnv,
}

impl Context {
    fn project_dir(&self) -> PathBuf {
        self.global
            .project_dir
            .clone()
            .unwrap_or_else(|| PathBuf::from("."))
    }

    /// The repository in the project directory (needed by commands that act on it).
    pub fn project(&self) -> Result<Project, CliError> {
        let mut project = Project::discover(&self.project_dir())?;
        match self.global.repo.as_slice() {
            [] => {}
            [repo] => project.repo = Some(RepoSlug::parse(repo)?),
            _ => {
                return Err(CliError::Usage(
                    "--repo names more than one repository: in a checkout, give one".into(),
                ))
            }
        }
        if let Some(id) = &self.global.project_id {
            project.id.clone_from(id);
        }
        Ok(project)
    }

    /// The daemon file a command serves or reads: `given` (`--config`), else outside a checkout
    /// with no project named, the one at the default place when there is one.
    pub fn daemon_file(&self, given: Option<PathBuf>) -> Option<PathBuf> {
        if given.is_some() {
            return given;
        }
        if !self.global.repo.is_empty()
            || self.global.project_id.is_some()
            || Project::discover(&self.project_dir()).is_ok()
        {
            return None;
        }
        crate::config::DaemonFile::default_path(&self.host).filter(|p| p.is_file())
    }

    /// The project id: `--project-id`, else derived from the repository.
    pub fn project_id(&self) -> Result<String, CliError> {
        match &self.global.project_id {
            Some(id) => Ok(id.clone()),
            None => Ok(Project::discover(&self.project_dir())?.id),
        }
    }

    /// An existing store, for inspection (never created by looking at it).
    pub fn existing_store(&self) -> Result<AutopilotStore, CliError> {
        Ok(AutopilotStore::open_existing(
            &project::data_dir(&self.host)?,
            &self.project_id()?,
        )?)
    }
}
