//! The read-only commands: `trace`, `traces`, `status`. They work on any store (`trace`
//! outside a checkout: in any repository of the daemon file), also while a daemon writes to it (files are replaced atomically, so a read never sees a torn file).

use std::fmt::Write as _;
use std::process::ExitCode;

use chrono::Utc;
use serde_json::{json, Value};

use super::{CliError, Context, Output};
use crate::steps::kinds::ends_trace;
use crate::trace::{self, render_list, render_tree, short};

pub fn trace(ctx: &Context, out: &mut Output, id: &str, json: bool) -> Result<ExitCode, CliError> {
    // Outside a checkout with a daemon file: found in whichever repository holds it.
    let (store, trace_id) = if let Some(path) = ctx.daemon_file(None) {
        super::fleet_status::store_with_trace(ctx, &path, id)?
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

pub fn traces(
    ctx: &Context,
    out: &mut Output,
    limit: usize,
    json: bool,
) -> Result<ExitCode, CliError> {
    let store = ctx.existing_store()?;
    let rows: Vec<_> = store
        .recent_traces(limit)?
        .into_iter()
        .map(|entry| {
            let view = store.load_trace(entry.trace_id).ok();
            (entry, view)
        })
        .collect();
    if json {
        out.json(&trace::traces_json(&rows, ends_trace))?;
    } else {
        out.print(&render_list(&rows, out.style(), Utc::now(), ends_trace))?;
    }
    Ok(ExitCode::SUCCESS)
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

/// `rover autopilot events`: the intake log, newest last, with the outcome of each trace.
pub fn events(
    ctx: &Context,
    out: &mut Output,
    limit: usize,
    json: bool,
) -> Result<ExitCode, CliError> {
    let store = ctx.existing_store()?;
    let records = store.read_intake()?;
    let total = records.len();
    let skip = records.len().saturating_sub(limit);
    let rows: Vec<_> = records
        .into_iter()
        .skip(skip)
        .map(|r| {
            let result = r
                .trace_id
                .and_then(|t| store.load_trace(t).ok())
                .map(|view| trace_result(&view));
            (r, result)
        })
        .collect();
    if json {
        let items: Vec<Value> = rows
            .iter()
            .map(|(r, result)| {
                let mut v = serde_json::to_value(r).expect("intake records serialize");
                if let (Some(result), Some(o)) = (result, v.as_object_mut()) {
                    o.insert("traceOutcome".into(), json!(result));
                }
                v
            })
            .collect();
        out.json(&Value::Array(items))?;
        return Ok(ExitCode::SUCCESS);
    }
    if total == 0 {
        out.print("no events recorded yet\n")?;
        return Ok(ExitCode::SUCCESS);
    }
    let mut text = String::new();
    for (r, result) in &rows {
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
        let _ = write!(
            text,
            "{}  {:<9} {:<9}",
            r.at.format("%Y-%m-%d %H:%M:%S"),
            r.via,
            r.outcome.as_str()
        );
        if !what.is_empty() {
            let _ = write!(text, " {}", what.join(" "));
        }
        if let Some(id) = &r.event_id {
            let _ = write!(text, " (event {id})");
        }
        if let Some(trace) = r.trace_id {
            let _ = write!(text, " -> trace {}", short(trace));
            if let Some(result) = result {
                let _ = write!(text, " [{result}]");
            }
        }
        if let Some(reason) = &r.reason {
            let _ = write!(text, ": {reason}");
        }
        text.push('\n');
    }
    out.print(&text)?;
    Ok(ExitCode::SUCCESS)
}
