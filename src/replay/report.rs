//! How a replay is shown: one trace step by step, and a folder as a summary table.

use std::fmt::Write as _;
use std::path::Path;

use super::run::{StepHow, TraceReplay};

/// One trace, step by step: the recorded outcome, the replayed one, what differs.
pub fn render_trace(r: &TraceReplay) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "trace {}  {}", r.trace_id, r.event);
    for s in &r.steps {
        let mark = match s.how {
            StepHow::Replayed if s.differences.is_empty() => "same",
            StepHow::Replayed => "DIVERGED",
            StepHow::Recorded => "recorded",
            StepHow::Skipped => "skipped",
            StepHow::NotReplayable => "NOT REPLAYABLE",
        };
        let first = r.first_divergence == Some(s.span_id);
        let _ = writeln!(
            out,
            "  {:<10} {:<14} {}{}",
            s.step.to_string(),
            mark,
            short(s.span_id),
            if first { "  ← first divergence" } else { "" }
        );
        match s.how {
            StepHow::Replayed => {
                let _ = writeln!(out, "      recorded: {}", s.recorded.line());
                if let Some(now) = &s.replayed {
                    let _ = writeln!(out, "      now:      {}", now.line());
                }
                for d in &s.differences {
                    let _ = writeln!(out, "      differs:  {d}");
                }
            }
            StepHow::Recorded => {
                let _ = writeln!(out, "      {}", s.recorded.line());
            }
            StepHow::Skipped | StepHow::NotReplayable => {}
        }
        if let Some(reason) = &s.reason {
            let _ = writeln!(out, "      why: {reason}");
        }
        for n in &s.notes {
            let _ = writeln!(out, "      note: {n}");
        }
    }
    let _ = writeln!(
        out,
        "{}: {} step(s) replayed in {} ms",
        r.verdict.as_str(),
        r.replayed,
        r.millis
    );
    out
}

/// A folder's replays as a table: one row per file.
pub fn render_table(rows: &[(&Path, Result<&TraceReplay, String>)]) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{:<16} {:<10} {:>8} {:<16} {:>7}  FILE / EVENT",
        "VERDICT", "TRACE", "REPLAYED", "FIRST DIVERGENCE", "MS"
    );
    let (mut same, mut diverged, mut not) = (0, 0, 0);
    for (path, r) in rows {
        let name = path
            .file_name()
            .map_or_else(String::new, |n| n.to_string_lossy().into_owned());
        match r {
            Ok(r) => {
                match r.verdict {
                    super::Verdict::Same => same += 1,
                    super::Verdict::Diverged => diverged += 1,
                    super::Verdict::NotReplayable => not += 1,
                }
                let first = r
                    .first_divergence
                    .and_then(|id| r.steps.iter().find(|s| s.span_id == id))
                    .map_or_else(
                        || "-".to_owned(),
                        |s| format!("{} {}", s.step, short(s.span_id)),
                    );
                let _ = writeln!(
                    out,
                    "{:<16} {:<10} {:>8} {:<16} {:>7}  {name}  {}",
                    r.verdict.as_str(),
                    short(r.trace_id),
                    r.replayed,
                    first,
                    r.millis,
                    r.event
                );
            }
            Err(e) => {
                not += 1;
                let _ = writeln!(
                    out,
                    "{:<16} {:<10} {:>8} {:<16} {:>7}  {name}  {e}",
                    "not replayable", "-", 0, "-", "-"
                );
            }
        }
    }
    let _ = writeln!(
        out,
        "{} trace(s): {same} same, {diverged} diverged, {not} not replayable",
        rows.len()
    );
    out
}

fn short(id: uuid::Uuid) -> String {
    id.to_string()[..8].to_owned()
}
