//! A person steering rover: `cancel`, `fail` and `retry` a trace, and the dead letters. Each
//! writes a span in the trace saying who did what, through the store lock, so they work with the
//! daemon running (it is woken and stops the trace's running agents and containers) or stopped.

use std::fmt::Write as _;
use std::process::ExitCode;

use chrono::Utc;
use uuid::Uuid;

use super::{CliError, Context, Output};
use crate::steps::meta::{Intervention, InterventionSpanMeta};
use crate::store::{AutopilotStore, PendingAction, Span};

fn open_store(ctx: &Context) -> Result<AutopilotStore, CliError> {
    let project_id = ctx.project_id()?;
    Ok(AutopilotStore::open_existing(
        &crate::project::data_dir(&ctx.host)?,
        &project_id,
    )?)
}

/// Who is acting: `--by`, else the login name.
pub(super) fn actor(by: Option<String>) -> String {
    by.filter(|b| !b.trim().is_empty())
        .or_else(|| std::env::var("USER").ok())
        .unwrap_or_else(|| "someone".into())
}

/// Wake a running daemon so it acts on the change now; says what happens otherwise.
pub(super) fn wake_daemon(
    store: &AutopilotStore,
    out: &mut Output,
    then: &str,
) -> Result<(), CliError> {
    match super::wake_daemon(store) {
        Some(pid) => out.print(&format!("the daemon (pid {pid}) {then} now\n")),
        None => out.print(&format!(
            "no daemon is running: the next `rover autopilot start` (or `start --once`) {then}\n"
        )),
    }
}

fn refused(e: crate::steps::intervene::InterveneError) -> CliError {
    CliError::Intervene(e)
}

/// `cancel` and `fail`: close the trace, take its queued work off the queue, stop what runs,
/// and answer on its channel saying who did it (`steps::intervene`).
pub fn close(
    ctx: &Context,
    out: &mut Output,
    id: &str,
    command: crate::store::CloseCommand,
    reason: Option<String>,
    by: Option<String>,
) -> Result<ExitCode, CliError> {
    let store = open_store(ctx)?;
    let trace_id = store.resolve_trace_id(id)?;
    let short = crate::trace::short(trace_id);
    let closed = crate::steps::intervene::close_trace(
        &store,
        trace_id,
        command,
        &reason.unwrap_or_default(),
        &actor(by),
    )
    .map_err(refused)?;
    out.print(&format!("trace {short} {}\n", closed.what))?;
    for p in &closed.removed {
        out.print(&format!(
            "  took {} ({}) off the queue\n",
            p.action,
            crate::trace::short(p.action_id)
        ))?;
    }
    for r in &closed.running {
        out.print(&format!("  stopping {r}\n"))?;
    }
    wake_daemon(&store, out, "stops what still runs and posts the answer")?;
    Ok(ExitCode::SUCCESS)
}

/// `retry <trace|action>`: queue the failed action again (a new action with a fresh attempt
/// budget, from the same producer), recorded by a `retry` span.
pub fn retry(
    ctx: &Context,
    out: &mut Output,
    id: &str,
    by: Option<String>,
) -> Result<ExitCode, CliError> {
    let store = open_store(ctx)?;
    let trace_id = store.resolve_trace_id(id)?;
    let retried =
        crate::steps::intervene::retry_trace(&store, trace_id, Some(id), &actor(by), None)
            .map_err(refused)?;
    out.print(&format!(
        "{}: queued as action {}\n",
        retried.summary,
        crate::trace::short(retried.action)
    ))?;
    wake_daemon(&store, out, "runs it")?;
    Ok(ExitCode::SUCCESS)
}

/// `dead-letters [--json]`: queued actions no step of this rover handles; outside a checkout,
/// every repository's of the daemon file, oldest first.
pub fn dead_letters(
    ctx: &Context,
    out: &mut Output,
    json: bool,
    config: Option<std::path::PathBuf>,
) -> Result<ExitCode, CliError> {
    if let Some(path) = super::fleet_stores::daemon_file(ctx, config) {
        let fleet = super::fleet_stores::Fleet::load(ctx, &path)?;
        let mut got = fleet.gather(|_, store| letters(store));
        let mut rows = std::mem::take(&mut got.rows);
        rows.sort_by_key(|(_, p)| p.created_at);
        let (repos, letters): (Vec<String>, Vec<PendingAction>) = rows.into_iter().unzip();
        print_letters(out, &letters, json, Some(&repos))?;
        return got.finish(out, json);
    }
    let store = open_store(ctx)?;
    print_letters(out, &letters(&store)?, json, None)?;
    Ok(ExitCode::SUCCESS)
}

fn letters(store: &AutopilotStore) -> Result<Vec<PendingAction>, CliError> {
    Ok(store
        .read_state()?
        .pending
        .into_iter()
        .filter(super::is_dead_letter)
        .collect())
}

/// The list (or JSON) of `dead-letters`; with `repos`, each one's repository first.
fn print_letters(
    out: &mut Output,
    letters: &[PendingAction],
    json: bool,
    repos: Option<&[String]>,
) -> Result<(), CliError> {
    if json {
        let mut list = serde_json::json!(letters);
        if let Some(repos) = repos {
            super::fleet_stores::add_repo_field(
                &mut list,
                repos.iter().map(|r| serde_json::json!(r)),
            );
        }
        return out.print(&format!(
            "{}\n",
            serde_json::to_string_pretty(&serde_json::json!({"deadLetters": list}))
                .expect("records serialize")
        ));
    }
    if letters.is_empty() {
        return out.print("no dead letters\n");
    }
    let mut text = String::new();
    for p in letters {
        let _ = writeln!(
            text,
            "{}  {:?} in trace {} since {}: {}",
            crate::trace::short(p.action_id),
            p.action.as_str(),
            crate::trace::short(p.trace_id),
            p.created_at.format("%Y-%m-%d %H:%M"),
            p.summary
        );
    }
    match repos {
        Some(repos) => out.print(&super::fleet_stores::with_repo_column(&text, false, repos))?,
        None => out.print(&text)?,
    }
    out.print("`rover autopilot dead-letters drop <action>` removes one (recorded in its trace); `requeue <action>` puts it back in line once a rover that handles its type runs\n")
}

/// `dead-letters drop|requeue <action>`.
pub fn dead_letter(
    ctx: &Context,
    out: &mut Output,
    id: &str,
    drop: bool,
    by: Option<String>,
) -> Result<ExitCode, CliError> {
    let store = open_store(ctx)?;
    let pending = store
        .read_state()?
        .pending
        .into_iter()
        .filter(super::is_dead_letter)
        .find(|p| {
            let full = p.action_id.to_string();
            full == id || (id.len() >= 8 && full.starts_with(id))
        })
        .ok_or_else(|| {
            CliError::NotFound(format!(
                "no dead letter {id:?}: `rover autopilot dead-letters` lists them"
            ))
        })?;
    let by = actor(by);
    let command = if drop {
        Intervention::Drop
    } else {
        Intervention::Requeue
    };
    let record = InterventionSpanMeta {
        by: by.clone(),
        action: Some(pending.action_id),
        action_type: Some(pending.action.clone()),
        ..InterventionSpanMeta::default()
    };
    let summary = format!(
        "dead letter {} ({:?}) {} by {by}",
        crate::trace::short(pending.action_id),
        pending.action.as_str(),
        if drop { "dropped" } else { "requeued" }
    );
    let span = Span::intervention(pending.trace_id, command.as_str(), summary.clone(), &record);
    if drop {
        store.intervene(&span, &[], |p| p.action_id == pending.action_id, None)?;
    } else {
        // Back in line with a fresh attempt budget, behind what is queued now.
        let original = store.read_action(pending.action_id)?;
        let mut again = original.clone();
        again.id = Uuid::new_v4();
        again.timestamp = Utc::now();
        again.reason = format!("requeued by {by}: {}", original.reason);
        store.intervene(
            &span,
            std::slice::from_ref(&again),
            |p| p.action_id == pending.action_id,
            None,
        )?;
    }
    out.print(&format!("{summary}\n"))?;
    Ok(ExitCode::SUCCESS)
}
