//! `rover autopilot status`: the daemon, the queue (by step, running, being collected, later,
//! what a pull request waits on, dead letters), the task mappings, the swarm's placements, the budget and the telemetry
//! exporter, as text or `--json`.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::process::ExitCode;

use chrono::{DateTime, Utc};
use serde_json::{json, Value};

use super::{CliError, Context, Output};
use crate::store::{AutopilotStore, PendingAction, Span, SpanStatus, State};
use crate::trace::{self, short};

/// How many of the actions that run later `status` shows (the soonest first).
const LATER_SHOWN: usize = 10;

/// Where the queue stands (also what the dashboard's Now page shows).
pub(super) struct Queue<'a> {
    state: &'a State,
    pub per_step: BTreeMap<String, usize>,
    pub dead_letters: Vec<&'a PendingAction>,
    pub running: Vec<Span>,
    /// A detached run's span stays running while its work is collected: the collections going
    /// on now, each under its run's span.
    pub collecting: Vec<Span>,
    /// Actions that run later: backed off after an error, or a scheduled re-evaluation (a wait).
    pub later: Vec<&'a PendingAction>,
    /// Traces whose pull request waits (its checks, a trusted approval, the merge cap,
    /// GitHub's protection), with what it waits on in the trace's own words.
    pub waiting: Vec<(uuid::Uuid, String)>,
    /// Queued actions the daemon could not start yet, with why it said (`waiting.json`: an
    /// agent slot, a step's slots, a budget, unmet dependencies).
    held_back: Vec<(&'a PendingAction, String)>,
}

/// The most held-back actions `status` lists by line (`--json` has them all).
const HELD_BACK_SHOWN: usize = 10;

pub fn status(ctx: &Context, out: &mut Output, json: bool) -> Result<ExitCode, CliError> {
    let store = ctx.existing_store()?;
    let pid = store.daemon_pid();
    let state = store.read_state()?;
    let now = Utc::now();
    let mut queue = queue(&store, &state, now);
    let reasons = store.read_waiting()?;
    queue.held_back = state
        .pending
        .iter()
        .filter(|p| {
            p.running_span_id.is_none() && !queue.later.iter().any(|l| l.action_id == p.action_id)
        })
        .filter_map(|p| reasons.get(&p.action_id).map(|r| (p, r.clone())))
        .collect();
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
            "pending": queue.per_step,
            "pendingTotal": state.pending.len(),
            "running": queue.running.iter().map(|s| json!({"spanId": s.id, "step": s.step, "traceId": s.trace_id, "since": s.timestamp})).collect::<Vec<Value>>(),
            "collecting": queue.collecting.iter().map(|s| json!({"spanId": s.id, "runSpanId": s.parent_id, "traceId": s.trace_id, "since": s.timestamp, "summary": s.summary})).collect::<Vec<Value>>(),
            "deadLetters": queue.dead_letters,
            "later": queue.later.iter().map(|p| json!({"actionId": p.action_id, "step": p.action, "traceId": p.trace_id, "notBefore": p.not_before, "attempts": p.attempts, "reason": p.summary})).collect::<Vec<Value>>(),
            "waiting": queue.waiting.iter().map(|(id, said)| json!({"traceId": id, "waitingOn": said})).collect::<Vec<Value>>(),
            "heldBack": queue.held_back.iter().map(|(p, why)| json!({"actionId": p.action_id, "step": p.action, "traceId": p.trace_id, "reason": why})).collect::<Vec<Value>>(),
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
    queue_text(&queue, now, &mut text);
    tasks_text(&state, &mut text);
    placements_text(placements.as_ref(), &mut text);
    text.push_str(&super::budget::standing_text(&standing));
    text.push_str(&super::telemetry::to_text(&telemetry, waiting));
    out.print(&text)?;
    Ok(ExitCode::SUCCESS)
}

/// The queue of `state` as it stands `now`, with the spans of its running actions.
pub(super) fn queue<'a>(store: &AutopilotStore, state: &'a State, now: DateTime<Utc>) -> Queue<'a> {
    let mut queue = Queue {
        state,
        per_step: BTreeMap::new(),
        dead_letters: Vec::new(),
        running: Vec::new(),
        collecting: Vec::new(),
        later: state
            .pending
            .iter()
            .filter(|p| p.running_span_id.is_none() && p.not_before.is_some_and(|t| t > now))
            .collect(),
        waiting: Vec::new(),
        held_back: Vec::new(),
    };
    // The traces of the soonest actions that run later, as many as `later` shows.
    let mut soonest = queue.later.clone();
    soonest.sort_by_key(|p| p.not_before);
    let mut waiting_traces: Vec<uuid::Uuid> = Vec::new();
    for p in soonest {
        if waiting_traces.len() == LATER_SHOWN {
            break;
        }
        if !waiting_traces.contains(&p.trace_id) {
            waiting_traces.push(p.trace_id);
        }
    }
    for trace_id in waiting_traces {
        if let Some(said) = store
            .load_trace(trace_id)
            .ok()
            .and_then(|view| crate::steps::history::waiting_on(&view))
        {
            queue.waiting.push((trace_id, said));
        }
    }
    for p in &state.pending {
        *queue.per_step.entry(p.action.to_string()).or_default() += 1;
        if super::is_dead_letter(p) {
            queue.dead_letters.push(p);
        }
        if let Some(span_id) = p.running_span_id {
            if let Ok(span) = store.read_span(span_id) {
                if span.status == SpanStatus::Running {
                    queue.running.push(span);
                }
            }
        }
    }
    for run in &queue.running {
        let Some(trace_id) = run.trace_id else {
            continue;
        };
        if let Ok(view) = store.load_trace(trace_id) {
            queue.collecting.extend(view.spans.into_iter().filter(|s| {
                crate::orchestrator::is_collection(s)
                    && s.parent_id == Some(run.id)
                    && s.status == SpanStatus::Running
            }));
        }
    }
    queue
}

/// The queue's lines: pending by step, running, being collected, later, dead letters.
fn queue_text(queue: &Queue<'_>, now: DateTime<Utc>, text: &mut String) {
    if queue.per_step.is_empty() {
        text.push_str("pending  none\n");
    } else {
        let parts: Vec<String> = queue
            .per_step
            .iter()
            .map(|(k, v)| format!("{k} {v}"))
            .collect();
        let _ = writeln!(
            text,
            "pending  {} ({})",
            queue.state.pending.len(),
            parts.join(", ")
        );
    }
    for span in &queue.running {
        let _ = writeln!(
            text,
            "running  {} {} of trace {} since {}",
            span.step,
            short(span.id),
            span.trace_id.map(short).unwrap_or_default(),
            trace::human_age(span.timestamp, Utc::now())
        );
    }
    for span in &queue.collecting {
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
    later_text(&queue.later, now, text);
    for (trace_id, said) in &queue.waiting {
        let _ = writeln!(text, "waiting  trace {}: {said}", short(*trace_id));
    }
    for (p, why) in queue.held_back.iter().take(HELD_BACK_SHOWN) {
        let _ = writeln!(
            text,
            "queued   {} {} of trace {}: {why}",
            p.action,
            short(p.action_id),
            short(p.trace_id)
        );
    }
    if queue.held_back.len() > HELD_BACK_SHOWN {
        let _ = writeln!(
            text,
            "queued   and {} more held back (--json lists them all)",
            queue.held_back.len() - HELD_BACK_SHOWN
        );
    }
    for p in &queue.dead_letters {
        let _ = writeln!(
            text,
            "dead letter  action {} of type {:?} in trace {}: no step handles it",
            short(p.action_id),
            p.action.as_str(),
            short(p.trace_id)
        );
    }
}

/// The soonest few of the actions that run later: a queue of thousands of waits is a count,
/// not a page (`--json` has all).
fn later_text(later: &[&PendingAction], now: DateTime<Utc>, text: &mut String) {
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
}

/// The task mappings' lines.
fn tasks_text(state: &State, text: &mut String) {
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
}

/// The swarm's placements' lines (none off the swarm).
fn placements_text(
    placements: Option<&Result<Vec<crate::sandbox::swarm::Placement>, String>>,
    text: &mut String,
) {
    match placements {
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
}
