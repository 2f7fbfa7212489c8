//! The human form of a trace: a tree where each span shows the actions it produced, and under
//! each action the span(s) that processed it (several when a run was retried).

use std::fmt::Write as _;

use chrono::{DateTime, Utc};
use serde_json::Value;
use uuid::Uuid;

use super::{human_age, human_duration, short, EndsTrace};
use crate::store::{
    Action, ErrorMeta, RunSpanMeta, Span, SpanStatus, TraceEntry, TraceOutcome, TraceView,
};

/// How to decorate output: colour only on a terminal and without `NO_COLOR`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Style {
    pub color: bool,
}

impl Style {
    fn paint(self, code: &str, text: &str) -> String {
        if self.color {
            format!("\x1b[{code}m{text}\x1b[0m")
        } else {
            text.to_owned()
        }
    }

    fn status(self, status: SpanStatus) -> String {
        let code = match status {
            SpanStatus::Running => "33",
            SpanStatus::Completed => "32",
            SpanStatus::Failed | SpanStatus::Error => "31",
        };
        self.paint(code, status.as_str())
    }

    fn dim(self, text: &str) -> String {
        self.paint("2", text)
    }

    fn bold(self, text: &str) -> String {
        self.paint("1", text)
    }
}

/// Render one trace. `now` dates running spans.
pub fn render_tree(view: &TraceView, style: Style, now: DateTime<Utc>, ends: EndsTrace) -> String {
    let mut out = String::new();
    let outcome = view.outcome_by(ends);
    let _ = writeln!(out, "{} {}", style.bold("trace"), view.trace_id());
    let _ = writeln!(out, "  event    {}", view.index.event);
    let _ = writeln!(out, "  outcome  {}", outcome_text(&outcome, style));
    let end = view
        .spans
        .iter()
        .filter_map(|s| s.completed)
        .max()
        .unwrap_or(view.index.created_at);
    let end = if outcome == TraceOutcome::Running {
        now
    } else {
        end
    };
    let _ = writeln!(
        out,
        "  started  {}  ({} {}: {} spans, {} actions, {} pending)",
        view.index
            .created_at
            .to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
        human_duration(view.index.created_at, end),
        if outcome == TraceOutcome::Running {
            "so far"
        } else {
            "in all"
        },
        view.spans.len(),
        view.actions.len(),
        view.pending.len(),
    );
    let total = crate::budget::trace_usage(view);
    if total.calls > 0 {
        let _ = writeln!(
            out,
            "  cost     {} in {} agent call(s) ({} in, {} out)",
            total.label(),
            total.calls,
            total.input_tokens,
            total.output_tokens
        );
    }
    out.push('\n');
    let roots: Vec<&Span> = view
        .spans
        .iter()
        .filter(|s| s.parent_id.is_none())
        .collect();
    let mut r = Renderer {
        view,
        style,
        now,
        out,
    };
    for root in roots {
        r.span(root, "", "");
    }
    // Spans whose parent is not part of the trace (should not happen; shown, not hidden).
    let known: Vec<Uuid> = view.spans.iter().map(|s| s.id).collect();
    for orphan in view
        .spans
        .iter()
        .filter(|s| s.parent_id.is_some_and(|p| !known.contains(&p)))
    {
        r.span(orphan, "", "");
    }
    let mut out = r.out;
    for id in &view.missing {
        let _ = writeln!(
            out,
            "missing  {id}: listed by the trace index but its file is gone"
        );
    }
    out
}

fn outcome_text(outcome: &TraceOutcome, style: Style) -> String {
    match outcome {
        TraceOutcome::Running => style.status(SpanStatus::Running),
        TraceOutcome::Stalled => style.paint(
            "31",
            "stalled (nothing queued or running, and no terminal step)",
        ),
        TraceOutcome::Finished { step, status } => format!("{step} ({})", style.status(*status)),
    }
}

struct Renderer<'a> {
    view: &'a TraceView,
    style: Style,
    now: DateTime<Utc>,
    out: String,
}

impl<'a> Renderer<'a> {
    /// A span line, its error details, then its children in time order: the actions it
    /// produced, and spans directly below it that no action started (a detached run's
    /// `collect` span, a person's intervention).
    fn span(&mut self, span: &'a Span, lead: &str, rest: &str) {
        let end = span.completed.unwrap_or(self.now);
        let summary = span
            .summary
            .as_deref()
            .unwrap_or(if span.status == SpanStatus::Running {
                "…"
            } else {
                ""
            });
        let run_meta = RunSpanMeta::of(span);
        let attempt = run_meta.attempt.filter(|a| *a > 1);
        let cost = crate::budget::SpanUsage::of(span)
            .map(|u| format!("  {}", u.label()))
            .unwrap_or_default();
        let _ = writeln!(
            self.out,
            "{lead}{} {}  {}  {}{}{}{}",
            self.style.bold(span.step.as_str()),
            self.style.dim(&short(span.id)),
            self.style.status(span.status),
            human_duration(span.timestamp, end),
            cost,
            attempt
                .map(|a| format!("  attempt {a}"))
                .unwrap_or_default(),
            if summary.is_empty() {
                String::new()
            } else {
                format!("  {}", one_line(summary))
            },
        );
        let children = children(self.view, span);
        let detail_lead = format!(
            "{rest}{}",
            if children.is_empty() {
                "    "
            } else {
                "│   "
            }
        );
        if matches!(span.status, SpanStatus::Failed | SpanStatus::Error) {
            self.error_details(span, &detail_lead);
        }
        for warning in &run_meta.budget_warnings {
            let _ = writeln!(self.out, "{detail_lead}budget warning: {warning}");
        }
        self.out.push_str(&span_detail_lines(span, &detail_lead));
        let n = children.len();
        for (i, child) in children.into_iter().enumerate() {
            let last = i + 1 == n;
            let (l, r) = if last {
                ("└─ ", "   ")
            } else {
                ("├─ ", "│  ")
            };
            match child {
                Child::Action(a) => self.action(a, &format!("{rest}{l}"), &format!("{rest}{r}")),
                Child::Span(s) => self.span(s, &format!("{rest}{l}"), &format!("{rest}{r}")),
            }
        }
    }

    fn action(&mut self, action: &'a Action, lead: &str, rest: &str) {
        let runs: Vec<&'a Span> = self
            .view
            .spans
            .iter()
            .filter(|s| s.action_id == Some(action.id))
            .collect();
        let state = if let (Some(_), crate::store::StepKind::Other(kind)) = (
            self.view.pending.iter().find(|p| p.action_id == action.id),
            &action.action,
        ) {
            format!("  [dead letter: no step handles {kind:?}]")
        } else if let Some(p) = self.view.pending.iter().find(|p| p.action_id == action.id) {
            if p.running_span_id.is_some() {
                "  [in progress]".to_owned()
            } else if let Some(at) = p.not_before.filter(|at| *at > self.now) {
                // Backed off after an error, or a wait: says when it runs again.
                format!(
                    "  [pending, runs {} at {}]",
                    crate::trace::human_until(at, self.now),
                    at.format("%Y-%m-%d %H:%M:%S UTC")
                )
            } else {
                "  [pending]".to_owned()
            }
        } else if runs.is_empty() {
            "  [not taken]".to_owned()
        } else {
            String::new()
        };
        let _ = writeln!(
            self.out,
            "{lead}→ {} {}{}  {}",
            action.action,
            self.style.dim(&short(action.id)),
            self.style.paint("33", &state),
            one_line(&action.reason),
        );
        let n = runs.len();
        for (i, run) in runs.into_iter().enumerate() {
            let last = i + 1 == n;
            let (l, r) = if last {
                ("└─ ", "   ")
            } else {
                ("├─ ", "│  ")
            };
            self.span(run, &format!("{rest}{l}"), &format!("{rest}{r}"));
        }
    }

    /// The error of a failed span: message, command, exit code, and the tail of stderr.
    fn error_details(&mut self, span: &Span, lead: &str) {
        let Some(detail) = error_detail(span) else {
            return;
        };
        let _ = writeln!(
            self.out,
            "{lead}{} {}",
            self.style.paint("31", "error:"),
            detail.message
        );
        for line in &detail.lines {
            let _ = writeln!(self.out, "{lead}{line}");
        }
    }
}

/// What `trace` prints of a failed span's error: its message on one line, then the command,
/// the exit code and the last 10 lines of stderr (the dashboard shows the same).
pub struct ErrorDetail {
    pub message: String,
    pub lines: Vec<String>,
}

/// The error detail of `span`, when it recorded an error (older spans hold the bare message).
pub fn error_detail(span: &Span) -> Option<ErrorDetail> {
    let error = ErrorMeta::of_any(span)?;
    let mut lines = Vec::new();
    if let Some(command) = error.detail("command") {
        let command = match command {
            Value::Array(parts) => parts
                .iter()
                .filter_map(Value::as_str)
                .collect::<Vec<_>>()
                .join(" "),
            other => other.as_str().unwrap_or_default().to_owned(),
        };
        lines.push(format!("command: {command}"));
    }
    if let Some(code) = error.detail("exitCode").filter(|c| !c.is_null()) {
        lines.push(format!("exit code: {code}"));
    }
    if let Some(stderr) = error
        .detail("stderr")
        .and_then(Value::as_str)
        .filter(|s| !s.trim().is_empty())
    {
        let all: Vec<&str> = stderr.trim_end().lines().collect();
        let skip = all.len().saturating_sub(10);
        lines.push(format!(
            "stderr{}:",
            if skip > 0 {
                format!(" (last 10 of {} lines)", all.len())
            } else {
                String::new()
            }
        ));
        lines.extend(all[skip..].iter().map(|line| format!("  {line}")));
    }
    Some(ErrorDetail {
        message: one_line(&error.message),
        lines,
    })
}

/// What `trace` prints under a span besides its error: the environment build, the network
/// ledger and the review's verdicts, each line starting with `lead`.
pub fn span_detail_lines(span: &Span, lead: &str) -> String {
    let mut out = super::environment::environment_lines(&span.meta, lead);
    out.push_str(&super::network::network_lines(&span.meta, lead));
    out.push_str(&super::review::review_lines(span, lead));
    out.push_str(&super::lessons::lessons_line(&span.meta, lead));
    out
}

fn children<'v>(view: &'v TraceView, span: &Span) -> Vec<Child<'v>> {
    let mut children: Vec<Child<'v>> = view.actions_of(span.id).map(Child::Action).collect();
    children.extend(
        view.spans
            .iter()
            .filter(|s| s.parent_id == Some(span.id) && s.action_id.is_none())
            .map(Child::Span),
    );
    // In time order: a detached run's `collect` span before the action its collection produced.
    children.sort_by_key(|c| match c {
        Child::Action(a) => a.timestamp,
        Child::Span(s) => s.timestamp,
    });
    children
}

enum Child<'a> {
    Action(&'a Action),
    Span(&'a Span),
}

/// The first line of `text`, at most 160 characters, without control characters: a summary
/// can quote a model's or a container's words, and no escape sequence of theirs reaches the
/// terminal.
pub fn one_line(text: &str) -> String {
    let line = text.lines().next().unwrap_or_default();
    let printable: Vec<char> = line.chars().filter(|c| !c.is_control()).collect();
    let mut out: String = printable.iter().take(160).collect();
    if printable.len() > 160 || text.lines().nth(1).is_some() {
        out.push('…');
    }
    out
}

/// The table of `traces`: id, age, outcome, spans, event.
pub fn render_list(
    rows: &[(TraceEntry, Option<TraceView>)],
    style: Style,
    now: DateTime<Utc>,
    ends: EndsTrace,
) -> String {
    if rows.is_empty() {
        return "no traces yet\n".into();
    }
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{:<10}{:<10}{:<22}{:>6}  EVENT",
        "TRACE", "AGE", "OUTCOME", "SPANS"
    );
    for (entry, view) in rows {
        let (outcome, spans) = match view {
            Some(v) => (v.outcome_by(ends).label(), v.spans.len().to_string()),
            None => ("unreadable".to_owned(), "?".to_owned()),
        };
        let painted = match view.as_ref().map(|v| v.outcome_by(ends)) {
            Some(TraceOutcome::Finished {
                status: SpanStatus::Completed,
                ..
            }) => style.paint("32", &format!("{outcome:<22}")),
            Some(TraceOutcome::Running) => style.paint("33", &format!("{outcome:<22}")),
            _ => style.paint("31", &format!("{outcome:<22}")),
        };
        let _ = writeln!(
            out,
            "{:<10}{:<10}{painted}{spans:>6}  {}",
            short(entry.trace_id),
            human_age(entry.created_at, now),
            one_line(&entry.event)
        );
    }
    out
}
