//! The JSON forms of `trace --json` and `traces --json`: the records as stored, plus the derived
//! fields a script needs (outcome, pending flags). Field names are a contract (`docs/cli.md`).

use chrono::{DateTime, SecondsFormat, Utc};
use serde_json::{json, Value};

fn iso(t: DateTime<Utc>) -> String {
    t.to_rfc3339_opts(SecondsFormat::Millis, true)
}

use super::EndsTrace;
use crate::store::{TraceEntry, TraceView};

/// One trace: `traceId`, `event`, `outcome`, `createdAt`, `updatedAt`, `spans` (as stored),
/// `actions` (as stored, plus `pending: bool`), `pending` (queue entries), `missing` (ids).
pub fn trace_json(view: &TraceView, ends: EndsTrace) -> Value {
    let actions: Vec<Value> = view
        .actions
        .iter()
        .map(|a| {
            let mut v = serde_json::to_value(a).expect("actions serialize");
            v["pending"] = json!(view.is_pending(a.id));
            v
        })
        .collect();
    json!({
        "traceId": view.trace_id(),
        "event": view.index.event,
        "outcome": view.outcome_by(ends),
        "createdAt": iso(view.index.created_at),
        "updatedAt": iso(view.index.updated_at),
        "spans": view.spans,
        "actions": actions,
        "pending": view.pending,
        "missing": view.missing,
        "cost": cost_json(view),
    })
}

/// `cost`: `{total: {inputTokens, outputTokens, costUsd, calls}, steps: [{spanId, step, ...}]}`
/// for the spans that recorded an agent call.
fn cost_json(view: &TraceView) -> Value {
    let steps: Vec<Value> = view
        .spans
        .iter()
        .filter_map(|s| {
            crate::budget::SpanUsage::of(s).map(|u| {
                let mut v = serde_json::to_value(u).expect("usage serializes");
                v["spanId"] = json!(s.id);
                v["step"] = json!(s.step);
                v
            })
        })
        .collect();
    json!({ "total": crate::budget::trace_usage(view), "steps": steps })
}

/// The list: `traces: [{traceId, createdAt, event, outcome, spans, lastStep}]`, newest first.
pub fn traces_json(rows: &[(TraceEntry, Option<TraceView>)], ends: EndsTrace) -> Value {
    let traces: Vec<Value> = rows
        .iter()
        .map(|(entry, view)| {
            json!({
                "traceId": entry.trace_id,
                "createdAt": iso(entry.created_at),
                "event": entry.event,
                "outcome": view.as_ref().map(|v| v.outcome_by(ends)),
                "spans": view.as_ref().map(|v| v.spans.len()),
                "lastStep": view.as_ref().and_then(|v| v.spans.last()).map(|s| s.step.to_string()),
            })
        })
        .collect();
    json!({ "traces": traces })
}
