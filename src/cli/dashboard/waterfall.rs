//! A trace's page: its spans as a waterfall on a time axis (nested by parent, coloured by
//! status, a wait a gap between bars), then a row per span with its cost and tokens, its
//! decision, the actions it produced with their reasons, the error detail `trace` prints and
//! the environment build, network ledger and review lines `trace` prints (the same functions:
//! `trace::error_detail`, `trace::span_detail_lines`); links to the GitHub thread and pull
//! requests; with `--allow-actions`, cancel and retry.

use std::fmt::Write as _;

use axum::extract::{Path, State};
use axum::response::{Html, IntoResponse, Response};
use chrono::{DateTime, Utc};
use uuid::Uuid;

use super::html::{document, esc, iso, status_class};
use super::sources::Source;
use super::{Dash, Shared};
use crate::steps::meta::{DecisionSpanMeta, PushPullRequest};
use crate::store::{Span, SpanStatus, TraceOutcome, TraceView};
use crate::trace::{human_duration, one_line, short};

/// The waterfall's geometry: the label column and the time axis, in SVG units.
const LABEL_W: f64 = 260.0;
const CHART_W: f64 = 700.0;
const ROW_H: f64 = 20.0;
const AXIS_H: f64 = 24.0;

pub async fn page(State(shared): State<Shared>, Path(id): Path<String>) -> Response {
    super::blocking(shared, move |dash| match render(dash, &id) {
        Ok(html) => Html(html).into_response(),
        Err(e) => super::failure(&e),
    })
    .await
}

fn render(dash: &Dash, id: &str) -> Result<String, super::super::CliError> {
    let opened = dash.sources.open(&dash.ctx);
    let (source, trace_id) = opened.find_trace(id)?;
    let mut view = source.store.load_trace(trace_id)?;
    crate::trace::note_building(&mut view, |span| source.store.artifacts_dir(span));
    let now = Utc::now();
    let order = tree_order(&view);
    let mut body = String::new();
    header(dash, source, &view, now, &mut body);
    waterfall(&view, &order, now, &mut body);
    span_table(&view, &order, now, &mut body);
    for missing in &view.missing {
        let _ = write!(
            body,
            "<p class=\"problem\">missing {missing}: listed by the trace index but its file is gone</p>"
        );
    }
    Ok(document(&format!("trace {}", short(trace_id)), "", &body))
}

/// The spans in the tree's order: each after its parent, siblings by start time; a span whose
/// parent is not in the trace at the end (shown, not hidden). With each span its depth.
pub fn tree_order(view: &TraceView) -> Vec<(&Span, usize)> {
    let mut out = Vec::with_capacity(view.spans.len());
    let known: std::collections::HashSet<Uuid> = view.spans.iter().map(|s| s.id).collect();
    let mut children: std::collections::HashMap<Uuid, Vec<&Span>> =
        std::collections::HashMap::new();
    let mut roots = Vec::new();
    for s in &view.spans {
        match s.parent_id.filter(|p| known.contains(p)) {
            Some(p) => children.entry(p).or_default().push(s),
            None => roots.push(s),
        }
    }
    for list in children.values_mut() {
        list.sort_by_key(|s| s.timestamp);
    }
    roots.sort_by_key(|s| (s.parent_id.is_some(), s.timestamp));
    let mut stack: Vec<(&Span, usize)> = roots.into_iter().rev().map(|s| (s, 0)).collect();
    while let Some((span, depth)) = stack.pop() {
        out.push((span, depth));
        if let Some(kids) = children.get(&span.id) {
            stack.extend(kids.iter().rev().map(|k| (*k, depth + 1)));
        }
    }
    out
}

fn end_of(view: &TraceView, now: DateTime<Utc>) -> DateTime<Utc> {
    if view.spans.iter().any(|s| s.status == SpanStatus::Running) || !view.pending.is_empty() {
        return now;
    }
    crate::steps::history::ended_at(view)
}

fn header(dash: &Dash, source: &Source, view: &TraceView, now: DateTime<Utc>, out: &mut String) {
    let repo = source.repo.as_str();
    let outcome = view.outcome_by(crate::steps::kinds::ends_trace);
    let class = match &outcome {
        TraceOutcome::Running => "running",
        TraceOutcome::Stalled => "failed",
        TraceOutcome::Finished { status, .. } => status.as_str(),
    };
    let usage = crate::budget::trace_usage(view);
    let id = view.trace_id();
    let _ = write!(
        out,
        "<h1>trace <code>{id}</code></h1><p class=\"event\" id=\"event\">{event}</p><dl class=\"facts\">\
         <dt>repository</dt><dd>{repo}</dd><dt>outcome</dt><dd><span class=\"badge {class}\" id=\"outcome\">{label}</span></dd>\
         <dt>started</dt><dd><time datetime=\"{at}\">{at}</time></dd>",
        event = esc(&one_line(&view.index.event)),
        repo = esc(repo),
        class = status_class(class),
        label = esc(&outcome.label()),
        at = iso(view.index.created_at),
    );
    let _ = write!(
        out,
        "<dt>duration</dt><dd>{}{}</dd><dt>spans</dt><dd>{} spans, {} actions, {} pending</dd>\
         <dt>spend</dt><dd id=\"spend\">{} in {} agent call(s) ({} tokens in, {} out)</dd>",
        human_duration(view.index.created_at, end_of(view, now)),
        if outcome == TraceOutcome::Running {
            " so far"
        } else {
            ""
        },
        view.spans.len(),
        view.actions.len(),
        view.pending.len(),
        esc(&crate::budget::usd(usage.cost_usd)),
        usage.calls,
        usage.input_tokens,
        usage.output_tokens,
    );
    links(view, &source.web, out);
    out.push_str("</dl>");
    if dash.allow_actions {
        let csrf = dash.auth.csrf();
        let _ = write!(
            out,
            "<div class=\"actions\"><form method=\"post\" action=\"/trace/{id}/cancel\">\
             <input type=\"hidden\" name=\"csrf\" value=\"{csrf}\">\
             <input type=\"text\" name=\"reason\" placeholder=\"why (optional)\" maxlength=\"200\">\
             <button id=\"cancel\" class=\"danger\">Cancel trace</button></form>\
             <form method=\"post\" action=\"/trace/{id}/retry\"><input type=\"hidden\" name=\"csrf\" value=\"{csrf}\">\
             <button id=\"retry\">Retry its failed action</button></form></div>"
        );
    }
}

/// Links to the event's thread on GitHub (at `web`, the repository's GitHub web address) and
/// to the pull requests the trace pushed.
fn links(view: &TraceView, web: &str, out: &mut String) {
    let event = view
        .root()
        .and_then(|r| crate::intake::EventMeta::of(r).ok())
        .and_then(|m| m.event);
    if let Some(e) = &event {
        let _ = write!(out, "<dt>author</dt><dd>{}</dd>", esc(&e.actor));
        if let Some(n) = e.number {
            let kind = if e.is_pull_request { "pull" } else { "issues" };
            let url = format!("{}/{}/{kind}/{n}", web.trim_end_matches('/'), e.repo);
            let _ = write!(
                out,
                "<dt>thread</dt><dd><a href=\"{}\" rel=\"noreferrer\">{} #{n}</a></dd>",
                esc(&url),
                esc(&e.repo)
            );
        }
    }
    // Each pull request a push recorded (the typed record reads nothing on other spans).
    let mut seen: Vec<String> = Vec::new();
    for pr in view.spans.iter().map(PushPullRequest::of) {
        let Some(Some(url)) = pr.pr_url else {
            continue;
        };
        if !(url.starts_with("https://") || url.starts_with("http://")) || seen.contains(&url) {
            continue;
        }
        let _ = write!(
            out,
            "<dt>pull request</dt><dd><a href=\"{}\" rel=\"noreferrer\">{}</a></dd>",
            esc(&url),
            pr.pr_number.map_or_else(|| esc(&url), |n| format!("#{n}"))
        );
        seen.push(url);
    }
}

/// The waterfall: one bar per span on the trace's time axis.
fn waterfall(view: &TraceView, order: &[(&Span, usize)], now: DateTime<Utc>, out: &mut String) {
    let t0 = view.index.created_at;
    let total_ms = (end_of(view, now) - t0).num_milliseconds().max(1);
    #[allow(clippy::cast_precision_loss)]
    let x = |t: DateTime<Utc>| {
        LABEL_W + CHART_W * ((t - t0).num_milliseconds().max(0) as f64 / total_ms as f64)
    };
    #[allow(clippy::cast_precision_loss)]
    let height = AXIS_H + ROW_H * order.len() as f64 + 4.0;
    let _ = write!(
        out,
        "<h2>Timeline</h2><svg class=\"waterfall\" id=\"waterfall\" viewBox=\"0 0 {} {height}\" \
         width=\"100%\" role=\"img\" aria-label=\"the trace's spans on a time axis\">",
        LABEL_W + CHART_W + 10.0
    );
    for i in 0..=4 {
        let ms = total_ms * i / 4;
        let tx = x(t0 + chrono::Duration::milliseconds(ms));
        let _ = write!(
            out,
            "<line class=\"tick\" x1=\"{tx:.1}\" x2=\"{tx:.1}\" y1=\"{AXIS_H}\" y2=\"{height}\"/>\
             <text class=\"axis\" x=\"{tx:.1}\" y=\"14\" text-anchor=\"{}\">{}</text>",
            match i {
                0 => "start",
                4 => "end",
                _ => "middle",
            },
            human_duration(t0, t0 + chrono::Duration::milliseconds(ms))
        );
    }
    for (i, (span, depth)) in order.iter().enumerate() {
        #[allow(clippy::cast_precision_loss)]
        let y = AXIS_H + ROW_H * i as f64;
        let end = span.completed.unwrap_or(now);
        let (x1, x2) = (x(span.timestamp), x(end));
        let cost = crate::budget::SpanUsage::of(span)
            .map(|u| format!(", {}", u.label()))
            .unwrap_or_default();
        #[allow(clippy::cast_precision_loss)]
        let indent = 4.0 + 12.0 * (*depth).min(12) as f64;
        let _ = write!(
            out,
            "<g class=\"bar {}\" data-span=\"{}\"><title>{} {}: {}, {}{}</title>\
             <text class=\"label\" x=\"{indent}\" y=\"{:.1}\">{} {}</text>\
             <rect x=\"{x1:.1}\" y=\"{:.1}\" width=\"{:.1}\" height=\"{:.1}\" rx=\"2\"/></g>",
            status_class(span.status.as_str()),
            span.id,
            esc(span.step.as_str()),
            short(span.id),
            span.status.as_str(),
            human_duration(span.timestamp, end),
            esc(&cost),
            y + 14.0,
            esc(span.step.as_str()),
            short(span.id),
            y + 4.0,
            (x2 - x1).max(2.0),
            ROW_H - 8.0,
        );
    }
    out.push_str("</svg>");
}

/// A row per span in the waterfall's order, its details under it.
fn span_table(view: &TraceView, order: &[(&Span, usize)], now: DateTime<Utc>, out: &mut String) {
    out.push_str(
        "<h2>Spans</h2><table class=\"spans\" id=\"spans\"><thead><tr><th>step</th><th>status</th>\
         <th>start</th><th>duration</th><th>cost</th><th>tokens</th><th>decision</th><th>summary</th>\
         </tr></thead><tbody>",
    );
    let t0 = view.index.created_at;
    for (span, depth) in order {
        let end = span.completed.unwrap_or(now);
        let usage = crate::budget::SpanUsage::of(span);
        let decision = DecisionSpanMeta::of(span)
            .decision
            .map(|d| d.to_string())
            .unwrap_or_default();
        let _ = write!(
            out,
            "<tr class=\"span\" data-span=\"{}\" data-start-ms=\"{}\"><td class=\"d{}\">{} <code>{}</code></td>\
             <td><span class=\"badge {}\">{}</span></td><td>+{}</td><td>{}</td><td class=\"cost\">{}</td>\
             <td>{}</td><td>{}</td><td class=\"summary\">{}</td></tr>",
            span.id,
            (span.timestamp - t0).num_milliseconds(),
            (*depth).min(8),
            esc(span.step.as_str()),
            short(span.id),
            status_class(span.status.as_str()),
            span.status.as_str(),
            human_duration(t0, span.timestamp),
            human_duration(span.timestamp, end),
            usage.map_or_else(|| "—".to_owned(), |u| esc(&crate::budget::usd(u.cost_usd))),
            usage.map_or_else(String::new, |u| format!("{} in, {} out", u.input_tokens, u.output_tokens)),
            esc(&decision),
            esc(&one_line(span.summary.as_deref().unwrap_or_default())),
        );
        details(view, span, out);
    }
    out.push_str("</tbody></table>");
}

/// What `trace` prints under a span: the error, the environment, network and review lines,
/// and the actions it produced with their reasons.
fn details(view: &TraceView, span: &Span, out: &mut String) {
    let mut text = String::new();
    if matches!(span.status, SpanStatus::Failed | SpanStatus::Error) {
        if let Some(e) = crate::trace::error_detail(span) {
            let _ = writeln!(text, "error: {}", e.message);
            for line in &e.lines {
                let _ = writeln!(text, "{line}");
            }
        }
    }
    text.push_str(&crate::trace::span_detail_lines(span, ""));
    let mut actions = String::new();
    for a in view.actions_of(span.id) {
        let state = if view.is_pending(a.id) {
            " (pending)"
        } else {
            ""
        };
        let _ = write!(
            actions,
            "<li>→ <b>{}</b>{state}: {}</li>",
            esc(a.action.as_str()),
            esc(&one_line(&a.reason))
        );
    }
    if text.is_empty() && actions.is_empty() {
        return;
    }
    let _ = write!(out, "<tr class=\"detail\"><td colspan=\"8\">");
    if !text.is_empty() {
        let class = if text.starts_with("error:") {
            "error"
        } else {
            "lines"
        };
        let _ = write!(out, "<pre class=\"{class}\">{}</pre>", esc(&text));
    }
    if !actions.is_empty() {
        let _ = write!(out, "<ul class=\"produced\">{actions}</ul>");
    }
    out.push_str("</td></tr>");
}
