//! The Lessons page (`/memory`): each repository's lessons (`autopilot/memory/lessons.json`,
//! read as `rover autopilot memory list` reads them) with their kind, statement, weight, pin,
//! evidence (links to the traces) and last use. A statement is text learned from untrusted work
//! (a resolver's answer, a trace's commands): escaped and marked as such. With
//! `--allow-actions`, **forget** and **pin** are POSTs checked as cancel is (CSRF token, own
//! origin) and done by the same code as `rover autopilot memory forget|pin`.

use std::fmt::Write as _;

use axum::extract::{Path, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{Html, IntoResponse, Response};
use serde::Deserialize;

use super::html::{document, esc, iso, message};
use super::{Dash, Shared};
use crate::memory::{Lesson, LessonBook};
use crate::store::AutopilotStore;
use crate::trace::short;

pub async fn page(State(shared): State<Shared>) -> Response {
    super::blocking(shared, |dash| {
        Html(document("Lessons", "/memory", &render(dash))).into_response()
    })
    .await
}

fn render(dash: &Dash) -> String {
    let opened = dash.sources.open(&dash.ctx);
    let mut out = String::from(
        "<h1>Lessons</h1><p class=\"note\">what rover learned from this repository's ended traces \
         and tells its agents (docs/memory.md); each statement is text learned from untrusted \
         work</p>",
    );
    for problem in &opened.problems {
        let _ = write!(out, "<p class=\"problem\">{}</p>", esc(problem));
    }
    let csrf = dash.allow_actions.then(|| dash.auth.csrf());
    for source in &opened.stores {
        let _ = write!(
            out,
            "<section class=\"repo\"><h2>{}</h2>",
            esc(&source.repo)
        );
        match LessonBook::load(&source.store) {
            Ok(book) => lessons_table(
                &super::super::memory::sorted(book),
                csrf.as_deref(),
                &mut out,
            ),
            Err(e) => {
                let _ = write!(
                    out,
                    "<p class=\"problem\">the lessons cannot be read: {}</p>",
                    esc(&crate::error::error_chain(&e))
                );
            }
        }
        out.push_str("</section>");
    }
    out
}

fn lessons_table(lessons: &[Lesson], csrf: Option<&str>, out: &mut String) {
    if lessons.is_empty() {
        out.push_str("<p class=\"empty\">no lessons yet</p>");
        return;
    }
    let _ = write!(
        out,
        "<table class=\"lessons\"><thead><tr><th>id</th><th>kind</th><th>statement</th>\
         <th>weight</th><th>pinned</th><th>evidence</th><th>last used</th>{}</tr></thead><tbody>",
        if csrf.is_some() { "<th></th>" } else { "" }
    );
    for l in lessons {
        let _ = write!(
            out,
            "<tr class=\"lesson\" data-lesson=\"{id}\"><td>{id}</td><td>{}</td>\
             <td class=\"statement\"><span class=\"untrusted\">learned from untrusted work:</span> \
             <q>{}</q></td><td class=\"weight\">{}</td><td class=\"pinned\">{}</td><td>{}</td><td>{}</td>",
            l.kind.as_str(),
            esc(&l.statement),
            l.weight(),
            if l.pinned { "pinned" } else { "" },
            evidence(l),
            l.last_used
                .map_or_else(|| "never".to_owned(), |t| format!("<time datetime=\"{0}\">{0}</time>", iso(t))),
            id = esc(&l.id),
        );
        if let Some(csrf) = csrf {
            let (pin, label) = if l.pinned {
                ("false", "Unpin")
            } else {
                ("true", "Pin")
            };
            let _ = write!(
                out,
                "<td class=\"actions\"><form method=\"post\" action=\"/memory/{id}/pin\">\
                 <input type=\"hidden\" name=\"csrf\" value=\"{csrf}\">\
                 <input type=\"hidden\" name=\"pinned\" value=\"{pin}\"><button>{label}</button></form>\
                 <form method=\"post\" action=\"/memory/{id}/forget\">\
                 <input type=\"hidden\" name=\"csrf\" value=\"{csrf}\">\
                 <button class=\"danger\">Forget</button></form></td>",
                id = esc(&l.id)
            );
        }
        out.push_str("</tr>");
    }
    out.push_str("</tbody></table>");
}

/// Each piece of evidence: its trace (a link), when, the command with its exit codes, and a
/// CI check's or a review's outcomes.
fn evidence(l: &Lesson) -> String {
    let mut out = String::new();
    for e in &l.evidence {
        let _ = write!(
            out,
            "<div class=\"evidence\"><a href=\"/trace/{}\">{}</a> <time datetime=\"{2}\">{2}</time>",
            e.trace_id,
            short(e.trace_id),
            iso(e.at)
        );
        if !e.command.is_empty() {
            let codes: Vec<String> = e.exit_codes.iter().map(i64::to_string).collect();
            let _ = write!(
                out,
                " <code>{}</code> (exit {})",
                esc(&e.command.join(" ")),
                codes.join(" then ")
            );
        }
        // A CI check's or a review's outcomes, as `memory show` prints them.
        let conclusions = esc(&e.conclusions.join(" then "));
        match &e.check {
            Some(check) => {
                let _ = write!(out, " check <code>{}</code> ({conclusions})", esc(check));
            }
            None if !e.conclusions.is_empty() => {
                let _ = write!(out, " outcome {conclusions}");
            }
            None => {}
        }
        out.push_str("</div>");
    }
    if !l.contradictions.is_empty() {
        let _ = write!(
            out,
            "<div>{} contradiction(s)</div>",
            l.contradictions.len()
        );
    }
    out
}

#[derive(Deserialize)]
pub struct LessonForm {
    #[serde(default)]
    csrf: String,
    #[serde(default)]
    pinned: Option<String>,
}

/// `POST /memory/ID/forget`.
pub async fn forget(
    State(shared): State<Shared>,
    Path(id): Path<String>,
    headers: HeaderMap,
    axum::Form(form): axum::Form<LessonForm>,
) -> Response {
    act(shared, id, &headers, form, false).await
}

/// `POST /memory/ID/pin` with `pinned=true|false`.
pub async fn pin(
    State(shared): State<Shared>,
    Path(id): Path<String>,
    headers: HeaderMap,
    axum::Form(form): axum::Form<LessonForm>,
) -> Response {
    act(shared, id, &headers, form, true).await
}

async fn act(
    shared: Shared,
    id: String,
    headers: &HeaderMap,
    form: LessonForm,
    pin: bool,
) -> Response {
    if !shared.allow_actions {
        return refused(
            "this dashboard is read-only: start it with --allow-actions to forget and pin lessons",
        );
    }
    if let Some(why) = shared.auth.refuses_post(headers, &form.csrf) {
        return refused(why);
    }
    super::blocking(shared, move |dash| {
        let done = holder(dash, &id).and_then(|store| {
            if pin {
                let pinned = form.pinned.as_deref() != Some("false");
                super::super::memory::pin(&store, &id, pinned).map(|_| ())
            } else {
                super::super::memory::forget(&store, &id).map(|_| ())
            }
        });
        match done {
            Ok(()) => (StatusCode::SEE_OTHER, [(header::LOCATION, "/memory")]).into_response(),
            Err(e) => super::failure(&e),
        }
    })
    .await
}

/// The store whose book holds lesson `id` (or a prefix), as `memory forget` finds it.
fn holder(dash: &Dash, id: &str) -> Result<AutopilotStore, super::super::CliError> {
    let opened = dash.sources.open(&dash.ctx);
    opened
        .stores
        .into_iter()
        .find(|s| LessonBook::load(&s.store).is_ok_and(|b| b.find(id).is_ok()))
        .map(|s| s.store)
        .ok_or_else(|| super::super::CliError::NotFound(format!("no lesson {id}")))
}

fn refused(why: &str) -> Response {
    (StatusCode::FORBIDDEN, Html(message("Refused", why))).into_response()
}
