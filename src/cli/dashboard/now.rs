//! The Now page: what runs right now in each repository (step, trace, elapsed time, the trace's
//! spend so far), the queue by step, what runs later, the dead letters, and the budget and
//! circuit breaker as `status` says them. Its live part is sent again over `/live` whenever a
//! store changes (`live.rs`).

use std::collections::BTreeMap;
use std::fmt::Write as _;

use axum::extract::State;
use axum::response::{Html, IntoResponse, Response};
use chrono::Utc;

use super::html::{document, esc, iso};
use super::sources::Source;
use super::{Dash, Shared};
use crate::store::SpanStatus;
use crate::trace::{human_duration, short};

pub async fn page(State(shared): State<Shared>) -> Response {
    super::blocking(shared, |dash| {
        let body = format!(
            "<h1>Now</h1><div id=\"now\" data-live=\"/live\">{}</div>",
            live_part(dash)
        );
        Html(page_html(&body)).into_response()
    })
    .await
}

fn page_html(body: &str) -> String {
    document("Now", "/", body)
}

/// One repository's queue, as `status` reads it.
struct RepoNow {
    repo: String,
    daemon: Option<String>,
    rows: Vec<String>,
    per_step: BTreeMap<String, usize>,
    later: usize,
    waiting: Vec<(uuid::Uuid, String)>,
    dead: Vec<String>,
    budget: Option<String>,
}

/// The part of the page that changes: rendered for the page and for each live update.
pub fn live_part(dash: &Dash) -> String {
    live_part_and_runs(dash).0
}

/// The live part, and how many runs go on in it (while any does, what it shows changes without
/// a span or the queue being written: the agent's output, the proxy's refusals, the time).
pub fn live_part_and_runs(dash: &Dash) -> (String, usize) {
    let opened = dash.sources.open(&dash.ctx);
    let repos: Vec<RepoNow> = opened
        .stores
        .iter()
        .map(|source| repo_now(dash, source))
        .collect();
    let mut out = String::new();
    let running: usize = repos.iter().map(|r| r.rows.len()).sum();
    let _ = write!(
        out,
        "<section><h2>Running <span class=\"count\" id=\"running-count\">{running}</span></h2>"
    );
    if running == 0 {
        out.push_str("<p class=\"empty\" id=\"nothing-running\">nothing runs right now</p>");
    } else {
        out.push_str(
            "<table class=\"runs\" id=\"running\"><thead><tr><th>repository</th><th>step</th>\
             <th>span</th><th>trace</th><th>elapsed</th><th>trace spend so far</th>\
             <th>agent's last output</th></tr></thead><tbody>",
        );
        for r in &repos {
            for row in &r.rows {
                out.push_str(row);
            }
        }
        out.push_str("</tbody></table>");
    }
    out.push_str("</section>");
    queue_section(&repos, &mut out);
    super::refusals::section(&opened.stores, &mut out);
    for r in &repos {
        let _ = write!(
            out,
            "<section class=\"repo\"><h2>{}</h2><p>daemon {}</p>",
            esc(&r.repo),
            r.daemon
                .as_deref()
                .map_or("not running".to_owned(), |pid| format!(
                    "running (pid {})",
                    esc(pid)
                ))
        );
        for (trace, said) in &r.waiting {
            let _ = write!(
                out,
                "<p>trace <a href=\"/trace/{trace}\">{}</a> waits: {}</p>",
                short(*trace),
                esc(said)
            );
        }
        if let Some(budget) = &r.budget {
            let _ = write!(out, "<pre class=\"budget\">{}</pre>", esc(budget));
        }
        out.push_str("</section>");
    }
    for problem in &opened.problems {
        let _ = write!(out, "<p class=\"problem\">{}</p>", esc(problem));
    }
    let _ = write!(
        out,
        "<p class=\"asof\">as of <time datetime=\"{0}\">{0}</time></p>",
        iso(Utc::now())
    );
    (out, running)
}

/// The queue by step across the repositories, and the dead letters.
fn queue_section(repos: &[RepoNow], out: &mut String) {
    let mut per_step: BTreeMap<&str, usize> = BTreeMap::new();
    for r in repos {
        for (step, n) in &r.per_step {
            *per_step.entry(step.as_str()).or_default() += n;
        }
    }
    out.push_str("<section><h2>Queue</h2>");
    if per_step.is_empty() {
        out.push_str("<p class=\"empty\">nothing queued</p>");
    } else {
        out.push_str("<table class=\"queue\" id=\"queue\"><thead><tr><th>step</th><th>queued</th></tr></thead><tbody>");
        for (step, n) in &per_step {
            let _ = write!(out, "<tr><td>{}</td><td>{n}</td></tr>", esc(step));
        }
        out.push_str("</tbody></table>");
    }
    let later: usize = repos.iter().map(|r| r.later).sum();
    if later > 0 {
        let _ = write!(
            out,
            "<p>{later} action(s) run later (a wait, or a back-off after an error)</p>"
        );
    }
    let dead: Vec<&String> = repos.iter().flat_map(|r| &r.dead).collect();
    let _ = write!(
        out,
        "<h3>Dead letters <span class=\"count\">{}</span></h3>",
        dead.len()
    );
    if !dead.is_empty() {
        out.push_str("<ul class=\"dead\">");
        for d in dead {
            let _ = write!(out, "<li>{d}</li>");
        }
        out.push_str("</ul>");
    }
    out.push_str("</section>");
}

fn repo_now(dash: &Dash, source: &Source) -> RepoNow {
    let store = &source.store;
    let now = Utc::now();
    let mut out = RepoNow {
        repo: source.repo.clone(),
        daemon: store.daemon_pid(),
        rows: Vec::new(),
        per_step: BTreeMap::new(),
        later: 0,
        waiting: Vec::new(),
        dead: Vec::new(),
        budget: None,
    };
    let state = match store.read_state() {
        Ok(state) => state,
        Err(e) => {
            out.dead
                .push(esc(&format!("the queue cannot be read: {e}")));
            return out;
        }
    };
    let queue = super::super::status::queue(store, &state, now);
    for span in queue
        .running
        .iter()
        .filter(|s| s.status == SpanStatus::Running)
    {
        let trace = span.trace_id;
        let spend = trace
            .and_then(|t| store.load_trace(t).ok())
            .map(|view| crate::budget::trace_usage(&view))
            .filter(|u| u.calls > 0)
            .map_or_else(|| "—".to_owned(), |u| u.label());
        let trace_cell = trace.map_or_else(String::new, |t| {
            format!("<a href=\"/trace/{t}\">{}</a>", short(t))
        });
        // Text an agent wrote: escaped, and marked as such.
        let said = super::activity::last_line(store, span.id).map_or_else(String::new, |line| {
            format!(
                "<q class=\"agent-said\" title=\"written by the agent\">{}</q>",
                esc(&line)
            )
        });
        out.rows.push(format!(
            "<tr class=\"run\" data-span=\"{}\"><td>{}</td><td class=\"step\">{}</td><td>{}</td>\
             <td>{trace_cell}</td><td class=\"elapsed\" data-since=\"{}\">{}</td><td>{}</td>\
             <td class=\"activity\">{said}</td></tr>",
            span.id,
            esc(&source.repo),
            esc(span.step.as_str()),
            short(span.id),
            iso(span.timestamp),
            human_duration(span.timestamp, now),
            esc(&spend)
        ));
    }
    out.per_step.clone_from(&queue.per_step);
    out.later = queue.later.len();
    out.waiting.clone_from(&queue.waiting);
    out.dead = queue
        .dead_letters
        .iter()
        .map(|p| {
            format!(
                "{}: action {} of type {} in trace <a href=\"/trace/{}\">{}</a>: no step handles it",
                esc(&source.repo),
                short(p.action_id),
                esc(p.action.as_str()),
                p.trace_id,
                short(p.trace_id)
            )
        })
        .collect();
    out.budget = super::super::budget::standing(&dash.ctx, store)
        .ok()
        .map(|s| super::super::budget::standing_text(&s));
    out
}
