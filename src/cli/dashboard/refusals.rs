//! The Now page's recent refusals of rover's proxy: what a run asked for and was refused (a
//! destination its egress does not allow, a model request past its budget), from the ledgers
//! the proxy keeps for live runs (`<store>/proxy/runs/<run>/ledger.json`) and the ledgers
//! recorded in the spans of the most recent traces once their runs ended (`RunNetworkMeta`).
//! A ledger that does not read is said on the page, naming its file.

use std::collections::BTreeSet;
use std::fmt::Write as _;

use chrono::{DateTime, Utc};
use uuid::Uuid;

use super::html::{esc, iso};
use super::sources::Source;
use crate::agent_run::{RunNetworkMeta, WireLedger};
use crate::proxy::{is_valid_run, RUNS_DIR};
use crate::store::fsio::read_json;
use crate::trace::short;

/// Most refusals shown, newest first.
pub const MAX_SHOWN: usize = 20;
/// How many of each repository's most recent traces are read for their recorded ledgers.
const RECENT_TRACES: usize = 20;
/// The ledger file of a run, as the proxy writes it.
const LEDGER_FILE: &str = "ledger.json";

/// One refusal, as the page lists it.
struct Shown {
    at: DateTime<Utc>,
    repo: String,
    trace: Uuid,
    reason: String,
}

/// The section: the most recent refusals across `stores`, and the ledgers that did not read.
pub fn section(stores: &[Source], out: &mut String) {
    let mut shown = Vec::new();
    let mut problems = Vec::new();
    for source in stores {
        live(source, &mut shown, &mut problems);
        recorded(source, &mut shown);
    }
    // A run's ledger is live and recorded at once until the proxy forgets the run.
    let mut seen = BTreeSet::new();
    shown.retain(|s| seen.insert((s.trace, s.at, s.reason.clone())));
    shown.sort_by_key(|s| std::cmp::Reverse(s.at));
    shown.truncate(MAX_SHOWN);
    let _ = write!(
        out,
        "<section><h2>Refused by the proxy <span class=\"count\" id=\"refusal-count\">{}</span></h2>",
        shown.len()
    );
    if shown.is_empty() {
        out.push_str("<p class=\"empty\">no recent refusal</p>");
    } else {
        out.push_str(
            "<table class=\"refusals\" id=\"refusals\"><thead><tr><th>when</th><th>repository</th>\
             <th>trace</th><th>reason</th></tr></thead><tbody>",
        );
        for s in &shown {
            let _ = write!(
                out,
                "<tr class=\"refusal\"><td><time datetime=\"{0}\">{0}</time></td><td>{1}</td>\
                 <td><a href=\"/trace/{2}\">{3}</a></td><td class=\"reason\">{4}</td></tr>",
                iso(s.at),
                esc(&s.repo),
                s.trace,
                short(s.trace),
                esc(&s.reason)
            );
        }
        out.push_str("</tbody></table>");
    }
    for problem in &problems {
        let _ = write!(out, "<p class=\"problem\">{}</p>", esc(problem));
    }
    out.push_str("</section>");
}

/// The refusals in the ledgers of the runs the proxy serves now.
fn live(source: &Source, shown: &mut Vec<Shown>, problems: &mut Vec<String>) {
    let runs = source.store.proxy_dir().join(RUNS_DIR);
    let Ok(entries) = std::fs::read_dir(&runs) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(run) = name.to_str().filter(|r| is_valid_run(r)) else {
            continue;
        };
        let path = runs.join(run).join(LEDGER_FILE);
        match read_json::<WireLedger>(&path) {
            Ok(Some(ledger)) => add(source, &ledger, shown),
            Ok(None) => {}
            Err(e) => problems.push(format!(
                "{}: the proxy's ledger cannot be read: {}",
                source.repo,
                crate::error::error_chain(&e)
            )),
        }
    }
}

/// The refusals recorded in the spans of the most recent traces.
fn recorded(source: &Source, shown: &mut Vec<Shown>) {
    let Ok(entries) = source.store.recent_traces(RECENT_TRACES) else {
        return;
    };
    for entry in entries {
        let Ok(view) = source.store.load_trace(entry.trace_id) else {
            continue;
        };
        for span in &view.spans {
            if let Some(ledger) = RunNetworkMeta::of(&span.meta).network {
                add(source, &ledger, shown);
            }
        }
    }
}

fn add(source: &Source, ledger: &WireLedger, shown: &mut Vec<Shown>) {
    shown.extend(ledger.refusals.iter().map(|r| Shown {
        at: r.at,
        repo: source.repo.clone(),
        trace: ledger.trace_id,
        reason: r.reason.clone(),
    }));
}
