//! The read-only commands: `trace`, `traces`, `status`. They work on any store, also while a
//! daemon writes to it (files are replaced atomically, so a read never sees a torn file).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::process::ExitCode;

use chrono::Utc;
use serde_json::{json, Value};

use super::{CliError, Context, Output};
use crate::store::{SpanStatus, StepKind};
use crate::trace::{self, render_list, render_tree, short};

pub fn trace(ctx: &Context, out: &mut Output, id: &str, json: bool) -> Result<ExitCode, CliError> {
    let store = ctx.existing_store()?;
    let trace_id = store.resolve_trace_id(id)?;
    let mut view = store.load_trace(trace_id)?;
    trace::note_building(&mut view, |span| store.artifacts_dir(span));
    if json {
        out.json(&trace::trace_json(&view))?;
    } else {
        out.print(&render_tree(&view, out.style(), Utc::now()))?;
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
        out.json(&trace::traces_json(&rows))?;
    } else {
        out.print(&render_list(&rows, out.style(), Utc::now()))?;
    }
    Ok(ExitCode::SUCCESS)
}

/// How many of the actions that run later `status` shows (the soonest first).
const LATER_SHOWN: usize = 10;

pub fn status(ctx: &Context, out: &mut Output, json: bool) -> Result<ExitCode, CliError> {
    let store = ctx.existing_store()?;
    let pid = store.daemon_pid();
    let state = store.read_state()?;
    let mut per_step: BTreeMap<String, usize> = BTreeMap::new();
    let mut dead_letters = Vec::new();
    let mut running = Vec::new();
    let now = Utc::now();
    // Actions that run later: backed off after an error, or a scheduled re-evaluation (a wait).
    let later: Vec<_> = state
        .pending
        .iter()
        .filter(|p| p.running_span_id.is_none() && p.not_before.is_some_and(|t| t > now))
        .collect();
    for p in &state.pending {
        *per_step.entry(p.action.to_string()).or_default() += 1;
        if super::is_dead_letter(p) {
            dead_letters.push(p);
        }
        if let Some(span_id) = p.running_span_id {
            if let Ok(span) = store.read_span(span_id) {
                if span.status == SpanStatus::Running {
                    running.push(span);
                }
            }
        }
    }
    // A detached run's span stays running while its work is collected: the collections going
    // on now, each under its run's span.
    let mut collecting = Vec::new();
    for run in &running {
        let Some(trace_id) = run.trace_id else {
            continue;
        };
        if let Ok(view) = store.load_trace(trace_id) {
            collecting.extend(view.spans.into_iter().filter(|s| {
                crate::orchestrator::is_collection(s)
                    && s.parent_id == Some(run.id)
                    && s.status == SpanStatus::Running
            }));
        }
    }
    let standing = super::budget::standing(ctx, &store)?;
    // On the swarm backend: which node runs which sandbox, as the swarm's manager says.
    let project_id = store
        .root()
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let placements = super::placements::placements(ctx, &project_id);
    let (telemetry, waiting) = super::telemetry::standing(&store)?;
    if json {
        out.json(&json!({
            "daemon": { "running": pid.is_some(), "pid": pid },
            "store": store.root(),
            "pending": per_step,
            "pendingTotal": state.pending.len(),
            "running": running.iter().map(|s| json!({"spanId": s.id, "step": s.step, "traceId": s.trace_id, "since": s.timestamp})).collect::<Vec<Value>>(),
            "collecting": collecting.iter().map(|s| json!({"spanId": s.id, "runSpanId": s.parent_id, "traceId": s.trace_id, "since": s.timestamp, "summary": s.summary})).collect::<Vec<Value>>(),
            "deadLetters": dead_letters,
            "later": later.iter().map(|p| json!({"actionId": p.action_id, "step": p.action, "traceId": p.trace_id, "notBefore": p.not_before, "attempts": p.attempts, "reason": p.summary})).collect::<Vec<Value>>(),
            "taskMappings": state.task_mappings,
            "budget": super::budget::standing_json(&standing),
            "placements": match &placements {
                None => Value::Null,
                Some(Ok(list)) => json!(list),
                Some(Err(e)) => json!({"error": e}),
            },
            "telemetry": super::telemetry::to_json(&telemetry, waiting),
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
    let _ = writeln!(text, "store    {}", store.root().display());
    if per_step.is_empty() {
        text.push_str("pending  none\n");
    } else {
        let parts: Vec<String> = per_step.iter().map(|(k, v)| format!("{k} {v}")).collect();
        let _ = writeln!(
            text,
            "pending  {} ({})",
            state.pending.len(),
            parts.join(", ")
        );
    }
    for span in &running {
        let _ = writeln!(
            text,
            "running  {} {} of trace {} since {}",
            span.step,
            short(span.id),
            span.trace_id.map(short).unwrap_or_default(),
            trace::human_age(span.timestamp, Utc::now())
        );
    }
    for span in &collecting {
        let _ = writeln!(
            text,
            "collect  {} of run {} of trace {} since {}: {}",
            short(span.id),
            span.parent_id.map(short).unwrap_or_default(),
            span.trace_id.map(short).unwrap_or_default(),
            trace::human_age(span.timestamp, Utc::now()),
            span.summary.as_deref().unwrap_or_default()
        );
    }
    // The soonest few: a queue of thousands of waits is a count, not a page (`--json` has all).
    let mut soonest: Vec<_> = later.iter().collect();
    soonest.sort_by_key(|p| p.not_before);
    for p in soonest.iter().take(LATER_SHOWN) {
        let at = p.not_before.unwrap_or(now);
        let _ = writeln!(
            text,
            "later    {} {} of trace {} runs {} ({}){}: {}",
            p.action,
            short(p.action_id),
            short(p.trace_id),
            trace::human_until(at, now),
            at.format("%Y-%m-%d %H:%M:%S UTC"),
            if p.attempts > 0 {
                format!(", after {} attempt(s)", p.attempts)
            } else {
                String::new()
            },
            p.summary.lines().next().unwrap_or_default()
        );
    }
    if later.len() > LATER_SHOWN {
        let _ = writeln!(
            text,
            "later    ... and {} more (`rover autopilot status --json` lists them all)",
            later.len() - LATER_SHOWN
        );
    }
    for p in &dead_letters {
        let _ = writeln!(
            text,
            "dead letter  action {} of type {:?} in trace {}: no step handles it",
            short(p.action_id),
            p.action.as_str(),
            short(p.trace_id)
        );
    }
    if state.task_mappings.is_empty() {
        text.push_str("tasks    none\n");
    }
    for (action_id, m) in &state.task_mappings {
        let _ = writeln!(
            text,
            "task     {} branch {} (action {}, trace {})",
            m.task_id,
            m.branch_name,
            &action_id[..8.min(action_id.len())],
            short(m.trace_id)
        );
    }
    match &placements {
        None => {}
        Some(Ok(list)) if list.is_empty() => text.push_str("nodes    no sandbox on the swarm\n"),
        Some(Ok(list)) => {
            for p in list {
                let _ = writeln!(
                    text,
                    "node     {} runs {} ({}{})",
                    p.node.as_deref().unwrap_or("no node yet"),
                    p.service,
                    p.task_state,
                    p.node_state
                        .as_deref()
                        .filter(|s| *s != "ready")
                        .map(|s| format!("; node {s}"))
                        .unwrap_or_default()
                );
            }
        }
        Some(Err(e)) => {
            let _ = writeln!(text, "nodes    cannot ask the swarm: {e}");
        }
    }
    text.push_str(&super::budget::standing_text(&standing));
    text.push_str(&super::telemetry::to_text(&telemetry, waiting));
    out.print(&text)?;
    Ok(ExitCode::SUCCESS)
}

/// What became of a trace an event started, in a few words: its outcome, and for a `noop` the
/// reason (an untrusted author, a decision not to act).
fn trace_result(view: &crate::store::TraceView) -> String {
    let outcome = view.outcome();
    let label = outcome.label();
    if let crate::store::TraceOutcome::Finished {
        step: StepKind::Noop,
        ..
    } = outcome
    {
        if let Some(noop) = view
            .actions
            .iter()
            .rev()
            .find(|a| a.action == StepKind::Noop)
        {
            return format!("{label}: {}", noop.reason);
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
