//! `rover autopilot status` for a daemon file (`--config FILE`, or outside a checkout with one at
//! the default place): the daemon serving it, and one line per repository: how it stands
//! (`serving`, `failing` with the reason and when it is tried again, `stopped`, `removed`,
//! `skipped`, `not started`) and its queue, read from its own store as `status` in its checkout
//! reads it (`--repo` narrows to some). A store that cannot be read is said on its line, and the
//! exit code is its kind's. With `"repositories": "installed"`, the repositories are those the
//! daemon found installed, and how its latest listing went.

use std::fmt::Write as _;
use std::path::Path;
use std::process::ExitCode;

use chrono::Utc;
use serde_json::{json, Value};

use super::fleet_stores::{Fleet, Served};
use super::{CliError, Context, Output};
use crate::daemon::RepoStatus;
use crate::error::{error_chain, Kinded};
use crate::store::DaemonLock;

/// One repository's line.
struct Line {
    repo: String,
    project_id: Option<String>,
    standing: Option<RepoStatus>,
    /// Its queue, when its store exists: (pending, running, dead letters).
    queue: Option<(usize, usize, usize)>,
    /// Its store cannot be read: why.
    unreadable: Option<CliError>,
}

pub fn fleet_status(
    ctx: &Context,
    out: &mut Output,
    json: bool,
    path: &Path,
) -> Result<ExitCode, CliError> {
    let fleet = Fleet::load(ctx, path)?;
    let file = &fleet.file;
    let pid = DaemonLock::holder(&fleet.data_dir.join("daemon").join("daemon.lock"));
    let lines: Vec<Line> = fleet
        .repos
        .iter()
        .map(|served| line(&fleet.data_dir, served))
        .collect();
    let listing = fleet.last_listing.clone();
    if json {
        out.json(&json!({
            "daemon": {"running": pid.is_some(), "pid": pid, "file": file.path},
            "lastListing": listing,
            "paused": fleet.paused,
            "repositories": lines.iter().map(line_json).collect::<Vec<Value>>(),
        }))?;
        return Ok(exit_code(&lines));
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
    if let Some(why) = &fleet.paused {
        let _ = writeln!(text, "paused   new agent runs in every repository: {why}");
    }
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
    Ok(exit_code(&lines))
}

/// Each store that cannot be read said on stderr; the exit code of the first one's kind, or 0.
fn exit_code(lines: &[Line]) -> ExitCode {
    let mut code = None;
    for l in lines {
        if let Some(e) = &l.unreadable {
            eprintln!("error: {}: {}", l.repo, error_chain(e));
            code.get_or_insert(super::exit_code_of(e.kind()));
        }
    }
    code.unwrap_or(ExitCode::SUCCESS)
}

fn line(data_dir: &Path, served: &Served) -> Line {
    let mut line = Line {
        repo: served.name.clone(),
        project_id: served.project_id.clone(),
        standing: served.standing.clone(),
        queue: None,
        unreadable: None,
    };
    let state = match served.open(data_dir) {
        Ok(Some(store)) => store.read_state().map_err(CliError::from),
        Ok(None) => return line,
        Err(e) => Err(e),
    };
    match state {
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
        Err(e) => line.unreadable = Some(e),
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
        return format!("its store cannot be read: {}", error_chain(e));
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
        "storeError": l.unreadable.as_ref().map(|e| error_chain(e)),
    })
}
