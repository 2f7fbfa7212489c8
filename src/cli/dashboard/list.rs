//! The Traces page: every repository's traces, newest first, filtered by repository, outcome,
//! step, author and date, sortable by time, spans, duration and spend, 50 a page. The first
//! page of an unfiltered list reads the stores' recent-traces caches and the 50 traces shown;
//! a filter on what only a trace knows (its outcome, its steps, its author) or a sort on it
//! reads the 2,000 most recent traces of each repository at most, and says so.

use std::fmt::Write as _;

use axum::extract::{Query, State};
use axum::response::{Html, IntoResponse, Response};
use chrono::{DateTime, NaiveDate, Utc};
use serde::Deserialize;
use uuid::Uuid;

use super::html::{document, esc, iso, status_class, url_part};
use super::{Dash, Shared};
use crate::steps::kinds::ends_trace;
use crate::store::{SpanStatus, TraceEntry, TraceOutcome, TraceView};
use crate::trace::{human_duration, one_line, short};

/// Rows a page shows.
const PAGE: usize = 50;
/// The most recent traces of each repository a filter or a sort on a trace's content reads.
const SCAN: usize = 2_000;

/// The query of `/traces`: each filter empty or absent when not asked for.
#[derive(Debug, Default, Clone, Deserialize)]
pub struct ListQuery {
    #[serde(default)]
    pub repo: String,
    /// `running`, `stalled`, `completed` (ended well), `failed` (ended otherwise), or a label
    /// as `traces` prints it (`notify`, `merge (failed)`).
    #[serde(default)]
    pub outcome: String,
    /// The trace has a span of this step.
    #[serde(default)]
    pub step: String,
    /// The event's author (its GitHub login).
    #[serde(default)]
    pub author: String,
    /// `YYYY-MM-DD`, inclusive, UTC.
    #[serde(default)]
    pub from: String,
    #[serde(default)]
    pub to: String,
    /// `created` (default), `spans`, `duration`, `cost`.
    #[serde(default)]
    pub sort: String,
    /// `desc` (default) or `asc`.
    #[serde(default)]
    pub order: String,
    #[serde(default)]
    pub page: Option<usize>,
}

impl ListQuery {
    fn needs_views(&self) -> bool {
        !self.outcome.is_empty()
            || !self.step.is_empty()
            || !self.author.is_empty()
            || !matches!(self.sort.as_str(), "" | "created")
    }

    fn page(&self) -> usize {
        self.page.unwrap_or(1).max(1)
    }

    /// This query sorted by `key` in `order`, from its first page.
    fn sorted(&self, key: &str, order: &str) -> String {
        let mut q = self.clone();
        key.clone_into(&mut q.sort);
        order.clone_into(&mut q.order);
        q.page = None;
        q.link()
    }

    /// This query's page `page`.
    fn paged(&self, page: usize) -> String {
        let mut q = self.clone();
        q.page = Some(page);
        q.link()
    }

    fn link(&self) -> String {
        let mut parts = Vec::new();
        for (k, v) in [
            ("repo", &self.repo),
            ("outcome", &self.outcome),
            ("step", &self.step),
            ("author", &self.author),
            ("from", &self.from),
            ("to", &self.to),
            ("sort", &self.sort),
            ("order", &self.order),
        ] {
            if !v.is_empty() {
                parts.push(format!("{k}={}", url_part(v)));
            }
        }
        if let Some(p) = self.page.filter(|p| *p > 1) {
            parts.push(format!("page={p}"));
        }
        format!("/traces?{}", parts.join("&"))
    }
}

/// One row: where the trace is, its entry, and its view once read.
pub struct Row {
    pub repo: String,
    pub entry: TraceEntry,
    pub view: Option<TraceView>,
}

/// What a trace's view says for the list.
pub struct Facts {
    pub outcome: TraceOutcome,
    pub spans: usize,
    pub duration_ms: i64,
    pub cost_usd: f64,
    pub tokens: u64,
    pub author: Option<String>,
}

pub fn facts(view: &TraceView) -> Facts {
    let usage = crate::budget::trace_usage(view);
    let outcome = view.outcome_by(ends_trace);
    let end = if outcome == TraceOutcome::Running {
        Utc::now()
    } else {
        crate::steps::history::ended_at(view)
    };
    Facts {
        outcome,
        spans: view.spans.len(),
        duration_ms: (end - view.index.created_at).num_milliseconds().max(0),
        cost_usd: usage.cost_usd,
        tokens: usage.tokens(),
        author: author_of(view),
    }
}

/// The GitHub login whose event started the trace: the normalized event's actor, else the
/// `by LOGIN:` of the trace's label (`IssuesEvent opened #12 by alice: title`, as intake
/// writes it; the actor comes before the title, so a title cannot pose as it).
pub fn author_of(view: &TraceView) -> Option<String> {
    let root = view.root();
    if let Some(e) = root
        .and_then(|r| crate::intake::EventMeta::of(r).ok())
        .and_then(|m| m.event)
    {
        return Some(e.actor);
    }
    let label = &view.index.event;
    let head = label.split(": ").next()?;
    let (_, by) = head.split_once(" by ")?;
    (!by.is_empty() && !by.contains(' ')).then(|| by.to_owned())
}

fn outcome_matches(asked: &str, outcome: &TraceOutcome) -> bool {
    match (asked, outcome) {
        ("running", TraceOutcome::Running) | ("stalled", TraceOutcome::Stalled) => true,
        ("completed", TraceOutcome::Finished { status, .. }) => *status == SpanStatus::Completed,
        ("failed", TraceOutcome::Finished { status, .. }) => *status != SpanStatus::Completed,
        (label, outcome) => outcome.label() == label,
    }
}

fn view_matches(q: &ListQuery, view: &TraceView) -> bool {
    let f = facts(view);
    (q.outcome.is_empty() || outcome_matches(&q.outcome, &f.outcome))
        && (q.step.is_empty() || view.spans.iter().any(|s| s.step.as_str() == q.step))
        && (q.author.is_empty()
            || f.author
                .as_deref()
                .is_some_and(|a| a.eq_ignore_ascii_case(q.author.trim())))
}

fn day(text: &str, end: bool) -> Option<DateTime<Utc>> {
    let date = NaiveDate::parse_from_str(text.trim(), "%Y-%m-%d").ok()?;
    let t = if end {
        date.succ_opt()?.and_hms_opt(0, 0, 0)?
    } else {
        date.and_hms_opt(0, 0, 0)?
    };
    Some(t.and_utc())
}

/// The rows of the page asked for, and whether there are more after it.
pub fn select(dash: &Dash, q: &ListQuery) -> (Vec<Row>, bool, Vec<String>, Vec<String>) {
    let opened = dash.sources.open(&dash.ctx);
    let repos: Vec<String> = opened.stores.iter().map(|s| s.repo.clone()).collect();
    let mut problems = opened.problems.clone();
    let wanted = q.page() * PAGE + 1;
    let per_store = if q.needs_views() { SCAN } else { wanted };
    let (from, to) = (day(&q.from, false), day(&q.to, true));
    let mut rows: Vec<Row> = Vec::new();
    for source in &opened.stores {
        if !q.repo.is_empty() && q.repo != source.repo {
            continue;
        }
        match source.store.recent_traces(per_store) {
            Ok(entries) => rows.extend(
                entries
                    .into_iter()
                    .filter(|e| from.is_none_or(|f| e.created_at >= f))
                    .filter(|e| to.is_none_or(|t| e.created_at < t))
                    .map(|entry| Row {
                        repo: source.repo.clone(),
                        entry,
                        view: None,
                    }),
            ),
            Err(e) => problems.push(format!("{}: {e}", source.repo)),
        }
    }
    rows.sort_by_key(|r| std::cmp::Reverse(r.entry.created_at));
    let store_of = |repo: &str| opened.stores.iter().find(|s| s.repo == repo);
    let load = |row: &mut Row| {
        if row.view.is_none() {
            row.view =
                store_of(&row.repo).and_then(|s| s.store.load_trace(row.entry.trace_id).ok());
        }
    };
    if q.needs_views() {
        let sorting = !matches!(q.sort.as_str(), "" | "created");
        let mut kept = Vec::new();
        for mut row in rows {
            if !sorting && kept.len() >= wanted {
                break;
            }
            load(&mut row);
            if row.view.as_ref().is_some_and(|v| view_matches(q, v)) {
                kept.push(row);
            }
        }
        rows = kept;
        sort(&mut rows, q);
    } else if q.order == "asc" {
        rows.reverse();
    }
    let skip = (q.page() - 1) * PAGE;
    let mut page: Vec<Row> = rows.into_iter().skip(skip).take(PAGE + 1).collect();
    let more = page.len() > PAGE;
    page.truncate(PAGE);
    for row in &mut page {
        load(row);
    }
    (page, more, repos, problems)
}

fn sort(rows: &mut [Row], q: &ListQuery) {
    let key = |r: &Row| -> f64 {
        let Some(f) = r.view.as_ref().map(facts) else {
            return 0.0;
        };
        #[allow(clippy::cast_precision_loss)]
        match q.sort.as_str() {
            "spans" => f.spans as f64,
            "duration" => f.duration_ms as f64,
            "cost" => f.cost_usd,
            _ => r.entry.created_at.timestamp_millis() as f64,
        }
    };
    rows.sort_by(|a, b| key(b).total_cmp(&key(a)));
    if q.order == "asc" {
        rows.reverse();
    }
}

pub async fn page(State(shared): State<Shared>, Query(q): Query<ListQuery>) -> Response {
    super::blocking(shared, move |dash| {
        let (rows, more, repos, problems) = select(dash, &q);
        Html(document(
            "Traces",
            "/traces",
            &render(&q, &rows, more, &repos, &problems),
        ))
        .into_response()
    })
    .await
}

fn render(
    q: &ListQuery,
    rows: &[Row],
    more: bool,
    repos: &[String],
    problems: &[String],
) -> String {
    let mut out = String::from("<h1>Traces</h1>");
    filter_form(q, repos, &mut out);
    for p in problems {
        let _ = write!(out, "<p class=\"problem\">{}</p>", esc(p));
    }
    if q.needs_views() {
        let _ = write!(
            out,
            "<p class=\"note\">filtered and sorted among the {SCAN} most recent traces of each repository</p>"
        );
    }
    if rows.is_empty() {
        out.push_str("<p class=\"empty\" id=\"no-traces\">no traces match</p>");
        return out;
    }
    let header = |key: &str, name: &str| {
        let current = q.sort == key || (q.sort.is_empty() && key == "created");
        let order = if current && q.order != "asc" {
            "asc"
        } else {
            "desc"
        };
        format!(
            "<th><a href=\"{}\">{name}</a></th>",
            esc(&q.sorted(key, order))
        )
    };
    let _ = write!(
        out,
        "<table class=\"traces\" id=\"traces\"><thead><tr><th>repository</th><th>trace</th>{}<th>outcome</th>{}{}{}<th>author</th><th>event</th></tr></thead><tbody>",
        header("created", "started"),
        header("spans", "spans"),
        header("duration", "duration"),
        header("cost", "spend"),
    );
    for row in rows {
        row_html(row, &mut out);
    }
    out.push_str("</tbody></table><nav class=\"pages\">");
    if q.page() > 1 {
        let _ = write!(
            out,
            "<a rel=\"prev\" href=\"{}\">newer</a> ",
            esc(&q.paged(q.page() - 1))
        );
    }
    let _ = write!(out, "<span>page {}</span>", q.page());
    if more {
        let _ = write!(
            out,
            " <a rel=\"next\" href=\"{}\">older</a>",
            esc(&q.paged(q.page() + 1))
        );
    }
    out.push_str("</nav>");
    out
}

fn row_html(row: &Row, out: &mut String) {
    let id: Uuid = row.entry.trace_id;
    let (outcome, class, spans, duration, cost, author) = match row.view.as_ref().map(facts) {
        Some(f) => {
            let class = match &f.outcome {
                TraceOutcome::Running => "running",
                TraceOutcome::Stalled => "failed",
                TraceOutcome::Finished { status, .. } => status.as_str(),
            };
            (
                f.outcome.label(),
                status_class(class),
                f.spans.to_string(),
                human_duration(
                    row.entry.created_at,
                    row.entry.created_at + chrono::Duration::milliseconds(f.duration_ms),
                ),
                if f.tokens > 0 || f.cost_usd > 0.0 {
                    format!("{} · {} tok", crate::budget::usd(f.cost_usd), f.tokens)
                } else {
                    "—".to_owned()
                },
                f.author.unwrap_or_default(),
            )
        }
        None => (
            "unreadable".to_owned(),
            "st-error",
            "?".into(),
            String::new(),
            String::new(),
            String::new(),
        ),
    };
    let _ = write!(
        out,
        "<tr class=\"trace\" data-trace=\"{id}\"><td>{repo}</td><td><a href=\"/trace/{id}\">{short}</a></td>\
         <td><time datetime=\"{at}\">{at}</time></td><td><span class=\"badge {class}\">{outcome}</span></td>\
         <td>{spans}</td><td>{duration}</td><td>{cost}</td><td>{author}</td><td class=\"event\">{event}</td></tr>",
        repo = esc(&row.repo),
        short = short(id),
        at = iso(row.entry.created_at),
        outcome = esc(&outcome),
        cost = esc(&cost),
        author = esc(&author),
        event = esc(&one_line(&row.entry.event)),
    );
}

fn filter_form(q: &ListQuery, repos: &[String], out: &mut String) {
    out.push_str("<form method=\"get\" action=\"/traces\" class=\"filters\" id=\"filters\">");
    out.push_str("<label>repository <select name=\"repo\"><option value=\"\">all</option>");
    for r in repos {
        let sel = if *r == q.repo { " selected" } else { "" };
        let _ = write!(out, "<option{sel}>{}</option>", esc(r));
    }
    out.push_str("</select></label><label>outcome <select name=\"outcome\">");
    for o in ["", "running", "completed", "failed", "stalled"] {
        let sel = if o == q.outcome { " selected" } else { "" };
        let _ = write!(
            out,
            "<option value=\"{o}\"{sel}>{}</option>",
            if o.is_empty() { "any" } else { o }
        );
    }
    out.push_str("</select></label>");
    for (name, value, kind) in [
        ("step", &q.step, "text"),
        ("author", &q.author, "text"),
        ("from", &q.from, "date"),
        ("to", &q.to, "date"),
    ] {
        let _ = write!(
            out,
            "<label>{name} <input type=\"{kind}\" name=\"{name}\" value=\"{}\"></label>",
            esc(value)
        );
    }
    out.push_str("<button type=\"submit\">Filter</button></form>");
}
