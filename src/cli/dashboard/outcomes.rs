//! The Outcomes page: per day, per week and per repository, the traces by outcome, the pull
//! requests opened and merged, the time from event to pull request (p50/p90), the retries per
//! trace and the spend (USD and tokens); the spend by step. Each chart (SVG drawn here) has its
//! table under it. Read from the 2,000 most recent traces of each repository at most, through
//! the typed records the `trace` command reads (`SpanUsage`, `PushPullRequest`,
//! `MergeSpanMeta`) and the history's `retries_so_far`; the spend by model from the proxy's
//! ledgers recorded in the spans (`RunNetworkMeta`, each run's `byModel`).

use std::collections::BTreeMap;
use std::fmt::Write as _;

use axum::extract::State;
use axum::response::{Html, IntoResponse, Response};
use chrono::{DateTime, Datelike, Utc};

use super::html::{document, esc};
use super::{Dash, Shared};
use crate::agent_run::RunNetworkMeta;
use crate::budget::{usd, SpanUsage};
use crate::proxy::ModelUsage;
use crate::steps::meta::{MergeOutcome, MergeSpanMeta, PushPullRequest};
use crate::store::{SpanStatus, TraceOutcome, TraceView};

/// The most recent traces of each repository the page reads.
const SCAN: usize = 2_000;

/// The figures of a set of traces.
#[derive(Default, Clone)]
pub struct Tally {
    pub traces: usize,
    pub completed: usize,
    pub failed: usize,
    pub running: usize,
    pub stalled: usize,
    pub prs_opened: usize,
    pub prs_merged: usize,
    pub retries: u64,
    pub usage: SpanUsage,
    /// Milliseconds from the event to its pull request, for each trace that opened one.
    pub to_pr_ms: Vec<i64>,
}

impl Tally {
    fn add(&mut self, view: &TraceView) {
        self.traces += 1;
        match view.outcome_by(crate::steps::kinds::ends_trace) {
            TraceOutcome::Running => self.running += 1,
            TraceOutcome::Stalled => self.stalled += 1,
            TraceOutcome::Finished {
                status: SpanStatus::Completed,
                ..
            } => {
                self.completed += 1;
            }
            TraceOutcome::Finished { .. } => self.failed += 1,
        }
        let mut first_pr: Option<DateTime<Utc>> = None;
        for span in &view.spans {
            if let Some(u) = SpanUsage::of(span) {
                self.usage += u;
            }
            if PushPullRequest::of(span).pr_created == Some(true) {
                self.prs_opened += 1;
                let at = span.completed.unwrap_or(span.timestamp);
                first_pr = Some(first_pr.map_or(at, |f| f.min(at)));
            }
            if MergeSpanMeta::of(span).merge_outcome == Some(MergeOutcome::Merged) {
                self.prs_merged += 1;
            }
        }
        if let Some(at) = first_pr {
            self.to_pr_ms
                .push((at - view.index.created_at).num_milliseconds().max(0));
        }
        self.retries += u64::from(crate::steps::history::retries_so_far(view));
    }

    /// The `p`th percentile (nearest rank) of the event-to-PR times.
    pub fn to_pr(&self, p: usize) -> Option<i64> {
        let mut v = self.to_pr_ms.clone();
        if v.is_empty() {
            return None;
        }
        v.sort_unstable();
        let rank = (p * v.len()).div_ceil(100).clamp(1, v.len());
        Some(v[rank - 1])
    }
}

/// Everything the page shows.
#[derive(Default)]
pub struct Figures {
    pub days: BTreeMap<String, Tally>,
    pub weeks: BTreeMap<String, Tally>,
    pub repos: BTreeMap<String, Tally>,
    pub all: Tally,
    pub by_step: BTreeMap<String, SpanUsage>,
    /// The model calls that went through rover's proxy, by model.
    pub by_model: BTreeMap<String, ModelUsage>,
    pub problems: Vec<String>,
}

pub fn figures(dash: &Dash) -> Figures {
    let opened = dash.sources.open(&dash.ctx);
    let mut f = Figures {
        problems: opened.problems.clone(),
        ..Figures::default()
    };
    for source in &opened.stores {
        let entries = match source.store.recent_traces(SCAN) {
            Ok(e) => e,
            Err(e) => {
                f.problems.push(format!("{}: {e}", source.repo));
                continue;
            }
        };
        for entry in entries {
            let Ok(view) = source.store.load_trace(entry.trace_id) else {
                continue;
            };
            let at = entry.created_at;
            let week = at.iso_week();
            f.days
                .entry(at.format("%Y-%m-%d").to_string())
                .or_default()
                .add(&view);
            f.weeks
                .entry(format!("{}-W{:02}", week.year(), week.week()))
                .or_default()
                .add(&view);
            f.repos.entry(source.repo.clone()).or_default().add(&view);
            f.all.add(&view);
            for span in &view.spans {
                if let Some(u) = SpanUsage::of(span) {
                    *f.by_step.entry(span.step.as_str().to_owned()).or_default() += u;
                }
                if let Some(ledger) = RunNetworkMeta::of(&span.meta).network {
                    for (model, u) in &ledger.by_model {
                        f.by_model.entry(model.clone()).or_default().add(u);
                    }
                }
            }
        }
    }
    f
}

pub async fn page(State(shared): State<Shared>) -> Response {
    super::blocking(shared, |dash| {
        Html(document("Outcomes", "/outcomes", &render(&figures(dash)))).into_response()
    })
    .await
}

fn duration(ms: Option<i64>) -> String {
    ms.map_or_else(
        || "—".to_owned(),
        |ms| {
            let t = DateTime::<Utc>::UNIX_EPOCH;
            crate::trace::human_duration(t, t + chrono::Duration::milliseconds(ms))
        },
    )
}

fn render(f: &Figures) -> String {
    let mut out = String::from("<h1>Outcomes and spend</h1>");
    for p in &f.problems {
        let _ = write!(out, "<p class=\"problem\">{}</p>", esc(p));
    }
    let _ = write!(
        out,
        "<p class=\"note\">the {SCAN} most recent traces of each repository at most: {} traces, \
         {} spent, event to pull request p50 {} and p90 {}, {} retries per trace</p>",
        f.all.traces,
        usd(f.all.usage.cost_usd),
        duration(f.all.to_pr(50)),
        duration(f.all.to_pr(90)),
        retries_per_trace(&f.all),
    );
    out.push_str("<h2>Traces by day</h2>");
    outcome_chart(&f.days, &mut out);
    tally_table("days", "day", &f.days, &mut out);
    out.push_str("<h2>By week</h2>");
    tally_table("weeks", "week", &f.weeks, &mut out);
    out.push_str("<h2>By repository</h2>");
    tally_table("repos", "repository", &f.repos, &mut out);
    out.push_str("<h2>Spend by step</h2>");
    step_chart(&f.by_step, &mut out);
    out.push_str("<h2>Spend by model</h2>");
    model_chart(&f.by_model, &mut out);
    out
}

fn retries_per_trace(t: &Tally) -> String {
    if t.traces == 0 {
        return "—".to_owned();
    }
    #[allow(clippy::cast_precision_loss)]
    let r = t.retries as f64 / t.traces as f64;
    format!("{r:.2}")
}

/// Stacked bars: completed, failed, stalled, running per day.
fn outcome_chart(days: &BTreeMap<String, Tally>, out: &mut String) {
    let max = days.values().map(|t| t.traces).max().unwrap_or(0).max(1);
    let (w, h, bar) = (760.0, 160.0, 28.0_f64);
    let _ = write!(
        out,
        "<svg class=\"chart\" id=\"outcome-chart\" viewBox=\"0 0 {w} {}\" width=\"100%\" role=\"img\" \
         aria-label=\"traces by day and outcome\">",
        h + 20.0
    );
    for (i, (day, t)) in days.iter().enumerate() {
        #[allow(clippy::cast_precision_loss)]
        let x = 10.0 + i as f64 * (bar + 8.0);
        let mut y = h;
        for (n, class) in [
            (t.completed, "st-completed"),
            (t.failed, "st-failed"),
            (t.stalled, "st-other"),
            (t.running, "st-running"),
        ] {
            #[allow(clippy::cast_precision_loss)]
            let bh = h * n as f64 / max as f64;
            if n > 0 {
                let _ = write!(
                    out,
                    "<rect class=\"{class}\" x=\"{x:.1}\" y=\"{:.1}\" width=\"{bar}\" height=\"{bh:.1}\"><title>{} {n}</title></rect>",
                    y - bh,
                    esc(day)
                );
            }
            y -= bh;
        }
        let _ = write!(
            out,
            "<text class=\"axis\" x=\"{:.1}\" y=\"{}\" text-anchor=\"middle\">{}</text>",
            x + bar / 2.0,
            h + 14.0,
            esc(day.get(5..).unwrap_or(day))
        );
    }
    out.push_str("</svg>");
}

fn tally_table(id: &str, first: &str, rows: &BTreeMap<String, Tally>, out: &mut String) {
    let _ = write!(
        out,
        "<table class=\"tally\" id=\"{id}\"><thead><tr><th>{first}</th><th>traces</th><th>completed</th>\
         <th>failed</th><th>stalled</th><th>running</th><th>PRs opened</th><th>PRs merged</th>\
         <th>event → PR p50</th><th>p90</th><th>retries per trace</th><th>USD</th><th>tokens</th></tr></thead><tbody>"
    );
    for (key, t) in rows {
        let _ = write!(
            out,
            "<tr data-key=\"{k}\"><td>{k}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td>\
             <td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            t.traces,
            t.completed,
            t.failed,
            t.stalled,
            t.running,
            t.prs_opened,
            t.prs_merged,
            duration(t.to_pr(50)),
            duration(t.to_pr(90)),
            retries_per_trace(t),
            usd(t.usage.cost_usd),
            t.usage.tokens(),
            k = esc(key),
        );
    }
    out.push_str("</tbody></table>");
}

/// Horizontal bars of USD, one per `(label, usd)`, as chart `id`.
fn usd_bars(id: &str, what: &str, bars: &[(&str, f64)], out: &mut String) {
    let max = bars.iter().map(|(_, u)| *u).fold(0.0, f64::max);
    #[allow(clippy::cast_precision_loss)]
    let h = 22.0 * bars.len() as f64 + 4.0;
    let _ = write!(
        out,
        "<svg class=\"chart\" id=\"{id}\" viewBox=\"0 0 760 {h}\" width=\"100%\" role=\"img\" aria-label=\"USD by {what}\">"
    );
    for (i, (label, cost)) in bars.iter().enumerate() {
        #[allow(clippy::cast_precision_loss)]
        let y = 4.0 + 22.0 * i as f64;
        let w = if max > 0.0 { 480.0 * cost / max } else { 0.0 };
        let _ = write!(
            out,
            "<text class=\"label\" x=\"4\" y=\"{:.1}\">{}</text><rect class=\"st-completed\" x=\"200\" y=\"{y:.1}\" \
             width=\"{:.1}\" height=\"14\"/><text class=\"axis\" x=\"{:.1}\" y=\"{:.1}\">{}</text>",
            y + 12.0,
            esc(label),
            w.max(1.0),
            206.0 + w,
            y + 12.0,
            usd(*cost)
        );
    }
    out.push_str("</svg>");
}

/// Horizontal bars of USD by step, the table under it.
fn step_chart(steps: &BTreeMap<String, SpanUsage>, out: &mut String) {
    let bars: Vec<(&str, f64)> = steps
        .iter()
        .map(|(s, u)| (s.as_str(), u.cost_usd))
        .collect();
    usd_bars("step-chart", "step", &bars, out);
    out.push_str("<table class=\"tally\" id=\"steps\"><thead><tr><th>step</th><th>agent calls</th><th>USD</th><th>tokens in</th><th>tokens out</th></tr></thead><tbody>");
    for (step, u) in steps {
        let _ = write!(
            out,
            "<tr data-key=\"{s}\"><td>{s}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            u.calls,
            usd(u.cost_usd),
            u.input_tokens,
            u.output_tokens,
            s = esc(step)
        );
    }
    out.push_str("</tbody></table>");
}

/// Horizontal bars of USD by model, the table under it (the model calls that went through
/// rover's proxy, as its ledgers recorded them).
fn model_chart(models: &BTreeMap<String, ModelUsage>, out: &mut String) {
    if models.is_empty() {
        out.push_str(
            "<p class=\"empty\" id=\"models-empty\">no model call recorded by rover's proxy</p>",
        );
        return;
    }
    let bars: Vec<(&str, f64)> = models.iter().map(|(m, u)| (m.as_str(), u.usd)).collect();
    usd_bars("model-chart", "model", &bars, out);
    out.push_str("<table class=\"tally\" id=\"models\"><thead><tr><th>model</th><th>requests</th><th>USD</th><th>tokens in</th><th>tokens out</th></tr></thead><tbody>");
    for (model, u) in models {
        let _ = write!(
            out,
            "<tr data-key=\"{m}\"><td>{m}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            u.requests,
            usd(u.usd),
            u.usage.total() - u.usage.output,
            u.usage.output,
            m = esc(model)
        );
    }
    out.push_str("</tbody></table>");
}
