//! The read-only commands: `trace`, `traces`, `events`, `status`. They work on any store, also
//! while a daemon writes to it (files are replaced atomically, so a read never sees a torn file);
//! outside a checkout, on every repository of the daemon file (`super::fleet_stores`).

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use chrono::Utc;
use serde_json::{json, Value};

use super::fleet_stores::{self, Fleet};
use super::{CliError, Context, Output};
use crate::steps::kinds::ends_trace;
use crate::store::{AutopilotStore, IntakeRecord, TraceEntry, TraceView};
use crate::trace::{self, render_list, render_tree, short};

pub fn trace(
    ctx: &Context,
    out: &mut Output,
    id: &str,
    json: bool,
    config: Option<PathBuf>,
) -> Result<ExitCode, CliError> {
    // Outside a checkout with a daemon file: found in whichever repository holds it.
    let (store, trace_id) = if let Some(path) = fleet_stores::daemon_file(ctx, config) {
        fleet_stores::store_with_trace(ctx, &path, id)?
    } else {
        let store = ctx.existing_store()?;
        let trace_id = store.resolve_trace_id(id)?;
        (store, trace_id)
    };
    let mut view = store.load_trace(trace_id)?;
    trace::note_building(&mut view, |span| store.artifacts_dir(span));
    if json {
        out.json(&trace::trace_json(&view, ends_trace))?;
    } else {
        out.print(&render_tree(&view, out.style(), Utc::now(), ends_trace))?;
    }
    Ok(ExitCode::SUCCESS)
}

type TraceRow = (TraceEntry, Option<TraceView>);

pub fn traces(
    ctx: &Context,
    out: &mut Output,
    limit: usize,
    json: bool,
    config: Option<PathBuf>,
) -> Result<ExitCode, CliError> {
    if let Some(path) = fleet_stores::daemon_file(ctx, config) {
        let fleet = Fleet::load(ctx, &path)?;
        let mut got = fleet.gather(|_, store| trace_rows(store, limit));
        // Newest first across the repositories, as in one.
        let mut rows = std::mem::take(&mut got.rows);
        rows.sort_by_key(|(_, (entry, _))| std::cmp::Reverse(entry.created_at));
        rows.truncate(limit);
        let (repos, rows): (Vec<String>, Vec<TraceRow>) = rows.into_iter().unzip();
        print_traces(out, &rows, json, Some(&repos))?;
        return got.finish(out, json);
    }
    let store = ctx.existing_store()?;
    print_traces(out, &trace_rows(&store, limit)?, json, None)?;
    Ok(ExitCode::SUCCESS)
}

/// The `limit` most recent traces of `store`, newest first, each with its view when it reads.
fn trace_rows(store: &AutopilotStore, limit: usize) -> Result<Vec<TraceRow>, CliError> {
    Ok(store
        .recent_traces(limit)?
        .into_iter()
        .map(|entry| {
            let view = store.load_trace(entry.trace_id).ok();
            (entry, view)
        })
        .collect())
}

/// The table (or JSON) of `traces`; with `repos`, each row's repository first.
fn print_traces(
    out: &mut Output,
    rows: &[TraceRow],
    json: bool,
    repos: Option<&[String]>,
) -> Result<(), CliError> {
    if json {
        let mut list = trace::traces_json(rows, ends_trace);
        if let Some(repos) = repos {
            fleet_stores::add_repo_field(&mut list["traces"], repos.iter().map(|r| json!(r)));
        }
        return out.json(&list);
    }
    let text = render_list(rows, out.style(), Utc::now(), ends_trace);
    match repos {
        Some(repos) if !rows.is_empty() => {
            out.print(&fleet_stores::with_repo_column(&text, true, repos))
        }
        _ => out.print(&text),
    }
}

pub use super::status::status;

/// What became of a trace an event started, in a few words: its outcome, and the reason of the
/// action that ended it when that reason says why (a `noop`'s: an untrusted author, a decision
/// not to act), or what its pull request waits on (checks, an approval, the merge cap).
fn trace_result(view: &crate::store::TraceView) -> String {
    let outcome = crate::steps::kinds::trace_outcome(view);
    let label = outcome.label();
    // A pull request waiting for its checks, an approval or the merge cap says so.
    if let Some(waiting) = crate::steps::history::waiting_on(view) {
        return format!("{label}: {waiting}");
    }
    if let crate::store::TraceOutcome::Finished { step, .. } = &outcome {
        if crate::steps::kinds::reason_is_outcome(step) {
            if let Some(last) = view.actions.iter().rev().find(|a| a.action == *step) {
                return format!("{label}: {}", last.reason);
            }
        }
    }
    label
}

/// One line of `events`: a record of a store's intake log with what became of its trace, or
/// (outside a checkout) a delivery the daemon's webhook endpoint refused.
struct EventRow {
    record: IntakeRecord,
    result: Option<String>,
    refused: bool,
}

impl EventRow {
    fn outcome(&self) -> &'static str {
        if self.refused {
            "refused"
        } else {
            self.record.outcome.as_str()
        }
    }
}

/// `rover autopilot events`: the intake log, newest last, with the outcome of each trace.
pub fn events(
    ctx: &Context,
    out: &mut Output,
    limit: usize,
    json: bool,
    config: Option<PathBuf>,
) -> Result<ExitCode, CliError> {
    if let Some(path) = fleet_stores::daemon_file(ctx, config) {
        return fleet_events(ctx, out, limit, json, &path);
    }
    let store = ctx.existing_store()?;
    let (total, rows) = event_rows(&store, limit)?;
    print_events(out, &rows, total, json, None)?;
    Ok(ExitCode::SUCCESS)
}

/// `events` outside a checkout: every repository's, and the deliveries refused for a repository
/// not served (unless `--repo` narrows), merged by time.
fn fleet_events(
    ctx: &Context,
    out: &mut Output,
    limit: usize,
    json: bool,
    path: &Path,
) -> Result<ExitCode, CliError> {
    let fleet = Fleet::load(ctx, path)?;
    let mut total = 0;
    let mut got = fleet.gather(|_, store| {
        let (n, rows) = event_rows(store, limit)?;
        total += n;
        Ok(rows)
    });
    let mut rows: Vec<(Option<String>, EventRow)> = std::mem::take(&mut got.rows)
        .into_iter()
        .map(|(repo, row)| (Some(repo), row))
        .collect();
    if ctx.global.repo.is_empty() {
        match super::refused::read(&super::refused::path(&fleet.data_dir)) {
            Ok(refused) => rows.extend(refused.into_iter().map(|r| {
                total += 1;
                let (repo, record) = r.into_record();
                let row = EventRow {
                    record,
                    result: None,
                    refused: true,
                };
                (repo, row)
            })),
            Err(e) => got.errors.push(e),
        }
    }
    // Oldest first, the most recent `limit`, as in one repository.
    rows.sort_by_key(|(_, row)| row.record.at);
    let rows = rows.split_off(rows.len().saturating_sub(limit));
    let (repos, rows): (Vec<Option<String>>, Vec<EventRow>) = rows.into_iter().unzip();
    print_events(out, &rows, total, json, Some(&repos))?;
    got.finish(out, json)
}

/// How many records `store`'s intake log keeps, and the most recent `limit`, oldest first, with
/// what became of their traces.
fn event_rows(store: &AutopilotStore, limit: usize) -> Result<(usize, Vec<EventRow>), CliError> {
    let records = store.read_intake()?;
    let total = records.len();
    let skip = records.len().saturating_sub(limit);
    let rows = records
        .into_iter()
        .skip(skip)
        .map(|record| {
            let result = record
                .trace_id
                .and_then(|t| store.load_trace(t).ok())
                .map(|view| trace_result(&view));
            EventRow {
                record,
                result,
                refused: false,
            }
        })
        .collect();
    Ok((total, rows))
}

/// The list (or JSON) of `events`; with `repos`, each row's repository first (`-` for a refused
/// delivery that named none).
fn print_events(
    out: &mut Output,
    rows: &[EventRow],
    total: usize,
    json: bool,
    repos: Option<&[Option<String>]>,
) -> Result<(), CliError> {
    if json {
        let mut items = Value::Array(rows.iter().map(event_json).collect());
        if let Some(repos) = repos {
            fleet_stores::add_repo_field(&mut items, repos.iter().map(|r| json!(r)));
        }
        return out.json(&items);
    }
    if total == 0 {
        return out.print("no events recorded yet\n");
    }
    let text: String = rows.iter().map(event_line).collect();
    match repos {
        Some(repos) => {
            let repos: Vec<String> = repos
                .iter()
                .map(|r| r.clone().unwrap_or_else(|| "-".to_owned()))
                .collect();
            out.print(&fleet_stores::with_repo_column(&text, false, &repos))
        }
        None => out.print(&text),
    }
}

/// A record as stored, with `traceOutcome` when it has a trace (`outcome` `refused` for a
/// refused delivery).
fn event_json(row: &EventRow) -> Value {
    let mut v = serde_json::to_value(&row.record).expect("intake records serialize");
    if let Some(o) = v.as_object_mut() {
        if let Some(result) = &row.result {
            o.insert("traceOutcome".into(), json!(result));
        }
        if row.refused {
            o.insert("outcome".into(), json!(row.outcome()));
        }
    }
    v
}

/// One line of `events`: time, path, outcome, the event, its trace and why.
fn event_line(row: &EventRow) -> String {
    let r = &row.record;
    let mut what = Vec::new();
    if let Some(kind) = &r.kind {
        what.push(kind.clone());
    }
    if let Some(action) = &r.action {
        what.push(action.clone());
    }
    if let Some(n) = r.number {
        what.push(format!("#{n}"));
    }
    if let Some(actor) = &r.actor {
        what.push(format!("by {actor}"));
    }
    let mut text = format!(
        "{}  {:<9} {:<9}",
        r.at.format("%Y-%m-%d %H:%M:%S"),
        r.via,
        row.outcome()
    );
    if !what.is_empty() {
        let _ = write!(text, " {}", what.join(" "));
    }
    if let Some(id) = &r.event_id {
        let _ = write!(text, " (event {id})");
    }
    if let Some(trace) = r.trace_id {
        let _ = write!(text, " -> trace {}", short(trace));
        if let Some(result) = &row.result {
            let _ = write!(text, " [{result}]");
        }
    }
    if let Some(reason) = &r.reason {
        let _ = write!(text, ": {reason}");
    }
    text.push('\n');
    text
}
