//! The trace and its errors as the resolver's prompt shows them.

use std::fmt::Write as _;

use serde_json::Value;

use super::{MAX_ERROR_CHARS, MAX_TRACE_CHARS};
use crate::agents::{truncate_marked, untrusted_block};
use crate::steps::agent_call::TRACE_SOURCE;
use crate::steps::history::{action_of, decision_of, failed_runs};
use crate::steps::meta;
use crate::steps::meta::WorkflowMeta;
use crate::store::{ErrorMeta, StepKind, TraceView};

/// The trace as the prompt lists it: one line per span with its summary and key meta, as one
/// untrusted block (summaries, reasons and titles quote agents, events and commands).
pub(super) fn render_trace(view: &TraceView) -> String {
    let mut out = String::new();
    for span in &view.spans {
        let summary = span.summary.as_deref().unwrap_or("(no summary)");
        let _ = write!(out, "- {} [{}] {}", span.step, span.status, summary.trim());
        if let Some(decision) = decision_of(span) {
            let _ = write!(out, " (decision: {decision})");
        }
        if let Some(action) = action_of(view, span) {
            let _ = write!(out, "\n  reason: {}", action.reason.trim());
            if span.step == StepKind::Workflow {
                if let Ok(m) = meta::read::<WorkflowMeta>(action) {
                    let _ = write!(out, "\n  task: {}", m.title);
                }
            }
        }
        out.push('\n');
    }
    for pending in &view.pending {
        let _ = writeln!(out, "- {} [queued] {}", pending.action, pending.summary);
    }
    untrusted_block(TRACE_SOURCE, &truncate_marked(&out, MAX_TRACE_CHARS))
}

/// The error details of every span that did not complete (command, exit code, stderr...).
pub(super) fn render_errors(view: &TraceView) -> String {
    let mut out = String::new();
    for span in failed_runs(view) {
        let _ = writeln!(out, "### {} [{}] span {}", span.step, span.status, span.id);
        let detail = ErrorMeta::of_any(span)
            .and_then(|error| serde_json::to_value(error).ok())
            .unwrap_or_else(|| Value::Object(span.meta.clone()));
        let text = serde_json::to_string_pretty(&detail).unwrap_or_default();
        // Messages and output of commands, hooks, gates and agents: data.
        out.push_str(&untrusted_block(
            &format!("the {} step's error", span.step),
            &truncate_marked(&text, MAX_ERROR_CHARS),
        ));
        out.push_str("\n\n");
    }
    if out.is_empty() {
        "No step failed.".to_owned()
    } else {
        out
    }
}
