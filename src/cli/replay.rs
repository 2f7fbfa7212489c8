//! `rover autopilot replay`: a trace of this project's store, or a folder of exported traces,
//! run again through this build's deciding steps (see `replay`); `--export` writes the export
//! files a folder holds.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use super::{CliError, Context, Output};
use crate::config::RoverConfig;
use crate::project::Project;
use crate::replay::{
    exit_code, folder_files, replay_trace, report, ReplaySettings, TraceBundle, TraceReplay,
};

/// What `replay` was asked.
#[derive(Debug, Clone, Default)]
pub struct ReplayArgs {
    pub trace: Option<String>,
    pub dir: Option<PathBuf>,
    pub export: Option<PathBuf>,
    pub last: Option<usize>,
    pub config: Option<PathBuf>,
    pub json: bool,
}

pub fn replay(ctx: &Context, out: &mut Output, args: &ReplayArgs) -> Result<ExitCode, CliError> {
    if let Some(folder) = &args.export {
        return export(ctx, out, args, folder);
    }
    let settings = settings(ctx, args.config.as_deref())?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| CliError::Internal(format!("cannot start the async runtime: {e}")))?;
    if let Some(dir) = &args.dir {
        let files = folder_files(dir)?;
        if files.is_empty() {
            return Err(CliError::NotFound(format!(
                "{} holds no exported trace (*.json): make them with `rover autopilot replay --export {} --last N`",
                dir.display(),
                dir.display()
            )));
        }
        let mut results: Vec<(PathBuf, Result<TraceReplay, String>)> = Vec::new();
        for file in files {
            let result = match TraceBundle::read(&file) {
                Ok(bundle) => Ok(runtime.block_on(replay_trace(&bundle, &settings))),
                Err(e) => Err(e.to_string()),
            };
            results.push((file, result));
        }
        let unreadable = results.iter().any(|(_, r)| r.is_err());
        let mut code = exit_code(results.iter().filter_map(|(_, r)| r.as_ref().ok()));
        if unreadable && code == crate::replay::EXIT_SAME {
            code = crate::replay::EXIT_NOT_REPLAYABLE;
        }
        if args.json {
            let traces: Vec<serde_json::Value> = results
                .iter()
                .map(|(path, r)| match r {
                    Ok(r) => serde_json::json!({"file": path, "replay": r}),
                    Err(e) => serde_json::json!({"file": path, "error": e}),
                })
                .collect();
            out.json(&serde_json::json!({"exitCode": code, "traces": traces}))?;
        } else {
            let rows: Vec<(&Path, Result<&TraceReplay, String>)> = results
                .iter()
                .map(|(p, r)| (p.as_path(), r.as_ref().map_err(Clone::clone)))
                .collect();
            out.print(&report::render_table(&rows))?;
        }
        return Ok(ExitCode::from(code));
    }
    let Some(id) = &args.trace else {
        return Err(CliError::Usage(
            "name a trace to replay (an id or a prefix of 8+ characters), or a folder with --dir"
                .into(),
        ));
    };
    let store = ctx.existing_store()?;
    let trace_id = store.resolve_trace_id(id)?;
    let bundle = TraceBundle::from_store(
        &store,
        trace_id,
        settings.repo.as_ref().map(ToString::to_string),
    )?;
    let result = runtime.block_on(replay_trace(&bundle, &settings));
    if args.json {
        out.json(&serde_json::to_value(&result).unwrap_or_default())?;
    } else {
        out.print(&report::render_trace(&result))?;
    }
    Ok(ExitCode::from(exit_code([&result])))
}

/// The configuration and checkout replay runs with: `--config`, else the project's
/// `rover.json`; outside a repository, the defaults and the current directory.
fn settings(ctx: &Context, config: Option<&Path>) -> Result<ReplaySettings, CliError> {
    let project = ctx.project().ok();
    let repo_root = project
        .as_ref()
        .map_or_else(|| PathBuf::from("."), |p: &Project| p.root.clone());
    let config = match config {
        Some(path) => {
            let text = std::fs::read_to_string(path).map_err(|e| {
                CliError::NotFound(format!("cannot read the config {}: {e}", path.display()))
            })?;
            RoverConfig::parse(&text).map_err(|reason| {
                CliError::Config(format!("{} is not valid: {reason}", path.display()))
            })?
        }
        None => RoverConfig::load(&repo_root)
            .map_err(|e| CliError::Config(crate::error::error_chain(&e)))?,
    };
    Ok(ReplaySettings {
        config,
        repo_root,
        repo: project.and_then(|p| p.repo),
    })
}

/// `--export <folder>`: the named trace, or the `--last N` most recent, as export files.
fn export(
    ctx: &Context,
    out: &mut Output,
    args: &ReplayArgs,
    folder: &Path,
) -> Result<ExitCode, CliError> {
    let store = ctx.existing_store()?;
    let repo = ctx
        .project()
        .ok()
        .and_then(|p| p.repo)
        .map(|r| r.to_string());
    let ids = match (&args.trace, args.last) {
        (Some(id), _) => vec![store.resolve_trace_id(id)?],
        (None, Some(n)) => store
            .recent_traces(n)?
            .into_iter()
            .map(|e| e.trace_id)
            .collect(),
        (None, None) => {
            return Err(CliError::Usage(
                "--export needs a trace id or --last N (the N most recent traces)".into(),
            ))
        }
    };
    let mut written = Vec::new();
    for id in ids {
        let bundle = TraceBundle::from_store(&store, id, repo.clone())?;
        written.push(bundle.write_to(folder)?);
    }
    if args.json {
        out.json(&serde_json::json!({"exported": written}))?;
    } else {
        let mut text = String::new();
        for path in &written {
            let _ = writeln!(text, "exported {}", path.display());
        }
        out.print(&text)?;
    }
    Ok(ExitCode::SUCCESS)
}
