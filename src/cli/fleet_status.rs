//! `rover autopilot status` for a daemon file (`--config FILE`, or outside a checkout with one at
//! the default place): the daemon serving it, and one line per repository: how it stands
//! (`serving`, `failing` with the reason and when it is tried again, `stopped`, `removed`,
//! `skipped`, `not started`) and its queue, read from its own store as `status` in its checkout
//! reads it. With `"repositories": "installed"`, the repositories are those the daemon found
//! installed, and how its latest listing went.

use std::fmt::Write as _;
use std::path::Path;
use std::process::ExitCode;

use chrono::Utc;
use serde_json::{json, Value};

use super::{CliError, Context, Output};
use crate::config::{DaemonFile, ServedRepo};
use crate::daemon::{status_path, FleetStatus, RepoStatus};
use crate::project::Project;
use crate::store::{AutopilotStore, DaemonLock};

/// One repository's line.
struct Line {
    repo: String,
    project_id: Option<String>,
    standing: Option<RepoStatus>,
    /// Its queue, when its store exists: (pending, running, dead letters).
    queue: Option<(usize, usize, usize)>,
    /// Its store cannot be read: why.
    unreadable: Option<String>,
}

pub fn fleet_status(
    ctx: &Context,
    out: &mut Output,
    json: bool,
    path: &Path,
) -> Result<ExitCode, CliError> {
    let file = DaemonFile::load(path)?;
    let data_dir = crate::project::data_dir(&ctx.host)?;
    let status_file = status_path(&data_dir);
    let recorded: Option<FleetStatus> = crate::store::fsio::read_json(&status_file)?;
    let pid = DaemonLock::holder(&data_dir.join("daemon").join("daemon.lock"));
    // The standing is the daemon's of this file only.
    let recorded = recorded.filter(|s| s.file == file.path);
    let lines: Vec<Line> = served(&file, recorded.as_ref())
        .iter()
        .map(|repo| line(&data_dir, repo, recorded.as_ref()))
        .collect();
    let listing = recorded.as_ref().and_then(|s| s.last_listing.clone());
    if json {
        out.json(&json!({
            "daemon": {"running": pid.is_some(), "pid": pid, "file": file.path},
            "lastListing": listing,
            "repositories": lines.iter().map(line_json).collect::<Vec<Value>>(),
        }))?;
        return Ok(ExitCode::SUCCESS);
    }
    let mut text = String::new();
    match &pid {
        Some(pid) => {
            let _ = writeln!(text, "daemon   running (pid {pid})");
        }
        None => text.push_str("daemon   not running\n"),
    }
    let _ = writeln!(
        text,
        "file     {} ({} repositories)",
        file.path.display(),
        lines.len()
    );
    if let Some(l) = &listing {
        let _ = match &l.error {
            Some(e) => writeln!(
                text,
                "listing  failed {} s ago: {e} (the repositories served stay served)",
                (Utc::now() - l.at).num_seconds().max(0)
            ),
            None => writeln!(
                text,
                "listing  {} repositories installed on, {} s ago",
                l.repositories,
                (Utc::now() - l.at).num_seconds().max(0)
            ),
        };
    }
    let width = lines.iter().map(|l| l.repo.len()).max().unwrap_or(4).max(4);
    let _ = writeln!(
        text,
        "{:width$}  {:11}  {:>7}  {:>7}  {:>4}  WHY",
        "REPO", "STATE", "PENDING", "RUNNING", "DEAD"
    );
    for l in &lines {
        let (pending, running, dead) = l.queue.map_or_else(
            || ("-".to_owned(), "-".to_owned(), "-".to_owned()),
            |(p, r, d)| (p.to_string(), r.to_string(), d.to_string()),
        );
        let _ = writeln!(
            text,
            "{:width$}  {:11}  {pending:>7}  {running:>7}  {dead:>4}  {}",
            l.repo,
            state_of(l),
            why(l)
        );
    }
    out.print(&text)?;
    Ok(ExitCode::SUCCESS)
}

/// The store of the repository of the daemon file at `path` that holds trace `id` (a trace,
/// span or action id, or a prefix), and the trace's id: `trace <ID>` outside a checkout.
pub fn store_with_trace(
    ctx: &Context,
    path: &Path,
    id: &str,
) -> Result<(AutopilotStore, uuid::Uuid), CliError> {
    let file = DaemonFile::load(path)?;
    let data_dir = crate::project::data_dir(&ctx.host)?;
    let recorded: Option<FleetStatus> =
        crate::store::fsio::read_json(&status_path(&data_dir)).unwrap_or_default();
    let repositories = served(&file, recorded.as_ref());
    let mut found = Vec::new();
    for repo in &repositories {
        let Ok(project) = Project::discover(&repo.checkout_in(&data_dir)) else {
            continue;
        };
        let Ok(store) = AutopilotStore::open_existing(&data_dir, &project.id) else {
            continue;
        };
        if let Ok(trace) = store.resolve_trace_id(id) {
            found.push((repo.full_name(), store, trace));
        }
    }
    match found.len() {
        0 => Err(CliError::NotFound(format!(
            "no trace {id} in the {} repositories of {}",
            repositories.len(),
            file.path.display()
        ))),
        1 => {
            let (_, store, trace) = found.remove(0);
            Ok((store, trace))
        }
        _ => Err(CliError::Usage(format!(
            "{id} names a trace in {}: give more of the id",
            found
                .iter()
                .map(|(repo, _, _)| repo.as_str())
                .collect::<Vec<_>>()
                .join(" and ")
        ))),
    }
}

/// The repositories of `file`: those it lists, or with `"repositories": "installed"` those
/// the daemon serving it recorded (at their default checkouts).
fn served(file: &DaemonFile, recorded: Option<&FleetStatus>) -> Vec<ServedRepo> {
    if file.installed.is_none() {
        return file.repositories.clone();
    }
    recorded
        .filter(|s| s.file == file.path)
        .map(|s| {
            s.repositories
                .iter()
                .filter_map(|r| crate::project::RepoSlug::parse(&r.repo).ok())
                .map(|slug| ServedRepo {
                    slug,
                    checkout: None,
                    api_url: None,
                    clone_url: None,
                    app: None,
                })
                .collect()
        })
        .unwrap_or_default()
}

fn line(data_dir: &Path, repo: &ServedRepo, recorded: Option<&FleetStatus>) -> Line {
    let name = repo.full_name();
    let standing = recorded.and_then(|s| s.repositories.iter().find(|r| r.repo == name).cloned());
    let project_id = standing
        .as_ref()
        .and_then(|s| s.project_id.clone())
        .or_else(|| {
            Project::discover(&repo.checkout_in(data_dir))
                .ok()
                .map(|p| p.id)
        });
    let mut line = Line {
        repo: name,
        project_id,
        standing,
        queue: None,
        unreadable: None,
    };
    let Some(id) = &line.project_id else {
        return line;
    };
    let Ok(store) = AutopilotStore::open_existing(data_dir, id) else {
        return line;
    };
    match store.read_state() {
        Ok(state) => {
            let running = state
                .pending
                .iter()
                .filter(|p| p.running_span_id.is_some())
                .count();
            let dead = state
                .pending
                .iter()
                .filter(|p| super::is_dead_letter(p))
                .count();
            line.queue = Some((state.pending.len(), running, dead));
        }
        Err(e) => line.unreadable = Some(e.to_string()),
    }
    line
}

fn state_of(l: &Line) -> &'static str {
    l.standing
        .as_ref()
        .map_or("not started", |s| s.state.as_str())
}

fn why(l: &Line) -> String {
    if let Some(e) = &l.unreadable {
        return format!("its store cannot be read: {e}");
    }
    let Some(s) = &l.standing else {
        return String::new();
    };
    let mut why = s.reason.clone().unwrap_or_default();
    if let Some(at) = s.retry_at {
        let secs = (at - Utc::now()).num_seconds().max(0);
        let _ = write!(why, " (try {} in {secs} s)", s.failures + 1);
    }
    why
}

fn line_json(l: &Line) -> Value {
    json!({
        "repo": l.repo,
        "projectId": l.project_id,
        "state": state_of(l),
        "reason": l.standing.as_ref().and_then(|s| s.reason.clone()),
        "kind": l.standing.as_ref().and_then(|s| s.kind.clone()),
        "retryAt": l.standing.as_ref().and_then(|s| s.retry_at),
        "failures": l.standing.as_ref().map_or(0, |s| s.failures),
        "since": l.standing.as_ref().map(|s| s.since),
        "pending": l.queue.map(|q| q.0),
        "running": l.queue.map(|q| q.1),
        "deadLetters": l.queue.map(|q| q.2),
        "storeError": l.unreadable,
    })
}
