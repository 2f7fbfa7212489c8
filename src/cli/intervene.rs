//! A person steering rover: `cancel`, `fail` and `retry` a trace, and the dead letters. Each
//! writes a span in the trace saying who did what, through the store lock, so they work with the
//! daemon running (it is woken and stops the trace's running agents and containers) or stopped.

use std::process::ExitCode;

use chrono::Utc;
use uuid::Uuid;

use super::{CliError, Context, Output};
use crate::steps::meta::{Intervention, InterventionSpanMeta};
use crate::store::{AutopilotStore, Span};

fn open_store(ctx: &Context) -> Result<AutopilotStore, CliError> {
    let project_id = ctx.project_id()?;
    Ok(AutopilotStore::open_existing(
        &crate::project::data_dir(&ctx.host)?,
        &project_id,
    )?)
}

/// Who is acting: `--by`, else the login name.
fn actor(by: Option<String>) -> String {
    by.filter(|b| !b.trim().is_empty())
        .or_else(|| std::env::var("USER").ok())
        .unwrap_or_else(|| "someone".into())
}

/// Wake a running daemon so it acts on the change now; says what happens otherwise.
fn wake_daemon(store: &AutopilotStore, out: &mut Output, then: &str) -> Result<(), CliError> {
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

/// `dead-letters [--json]`: queued actions no step of this rover handles.
pub fn dead_letters(ctx: &Context, out: &mut Output, json: bool) -> Result<ExitCode, CliError> {
    let store = open_store(ctx)?;
    let letters: Vec<_> = store
        .read_state()?
        .pending
        .into_iter()
        .filter(super::is_dead_letter)
        .collect();
    if json {
        out.print(&format!(
            "{}\n",
            serde_json::to_string_pretty(&serde_json::json!({"deadLetters": letters}))
                .expect("records serialize")
        ))?;
        return Ok(ExitCode::SUCCESS);
    }
    if letters.is_empty() {
        out.print("no dead letters\n")?;
    }
    for p in &letters {
        out.print(&format!(
            "{}  {:?} in trace {} since {}: {}\n",
            crate::trace::short(p.action_id),
            p.action.as_str(),
            crate::trace::short(p.trace_id),
            p.created_at.format("%Y-%m-%d %H:%M"),
            p.summary
        ))?;
    }
    if !letters.is_empty() {
        out.print("`rover autopilot dead-letters drop <action>` removes one (recorded in its trace); `requeue <action>` puts it back in line once a rover that handles its type runs\n")?;
    }
    Ok(ExitCode::SUCCESS)
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

/// `gc [--dry-run] [--json] [--retain-days N]`: what ended traces hold and when it is freed;
/// without `--dry-run`, queue the cleanup of what is due (the daemon runs it). Then rover's
/// containers, networks and volumes of stores gone or whose daemon is dead (`cli::gc`): swept
/// even without a store for this project.
pub fn gc(
    ctx: &Context,
    out: &mut Output,
    dry_run: bool,
    json: bool,
    retain_days: Option<u64>,
) -> Result<ExitCode, CliError> {
    let store = match open_store(ctx) {
        Ok(store) => store,
        Err(CliError::Store(crate::store::StoreError::MissingStore { path })) => {
            let leftovers = super::gc::sweep(dry_run, &ctx.host)?;
            if json {
                out.print(&format!(
                    "{}\n",
                    serde_json::to_string_pretty(&serde_json::json!({
                        "dryRun": dry_run, "store": null, "leftovers": leftovers,
                    }))
                    .expect("records serialize")
                ))?;
            } else {
                out.print(&format!(
                    "no rover store at {}: no traces to reclaim\n",
                    path.display()
                ))?;
                super::gc::print(out, &leftovers, dry_run)?;
            }
            return Ok(ExitCode::SUCCESS);
        }
        Err(e) => return Err(e),
    };
    let retain_days = retain_days.unwrap_or_else(|| {
        ctx.project()
            .ok()
            .and_then(|p| crate::config::RoverConfig::load(&p.root).ok())
            .map_or(7, |c| c.autopilot.pipeline.retain_days)
    });
    let (plan, queued) = if dry_run {
        (
            crate::steps::gc::plan(&store, crate::steps::gc::retention(retain_days), Utc::now())?,
            Vec::new(),
        )
    } else {
        crate::steps::gc::run(&store, retain_days, &actor(None))?
    };
    // Environment images: all of the project's but the newest and those of traces that keep
    // their tasks.
    let live: Vec<uuid::Uuid> = plan
        .live
        .iter()
        .copied()
        .chain(plan.later.iter().chain(&plan.open_prs).map(|r| r.trace_id))
        .collect();
    let images = crate::environment::gc::sweep(
        &store,
        &ctx.project_id()?,
        &live,
        crate::steps::history::image_of,
        dry_run,
    );
    let leftovers = super::gc::sweep(dry_run, &ctx.host)?;
    if json {
        out.print(&format!(
            "{}\n",
            serde_json::to_string_pretty(&serde_json::json!({
                "retainDays": retain_days, "dryRun": dry_run, "plan": plan, "environmentImages": images,
                "queued": queued.iter().map(ToString::to_string).collect::<Vec<_>>(),
                "leftovers": leftovers,
            }))
            .expect("records serialize")
        ))?;
        return Ok(ExitCode::SUCCESS);
    }
    let line = |r: &crate::steps::gc::Reclaim| {
        format!(
            "{}  {} task(s) [{}]  ended {}  {}",
            crate::trace::short(r.trace_id),
            r.tasks.len(),
            r.branches.join(", "),
            r.ended_at.format("%Y-%m-%d %H:%M"),
            r.label
        )
    };
    let verb = if dry_run { "due now" } else { "reclaiming" };
    out.print(&format!(
        "{verb} (ended more than {retain_days} day(s) ago):\n"
    ))?;
    if plan.due.is_empty() {
        out.print("  nothing\n")?;
    }
    for r in &plan.due {
        out.print(&format!("  {}\n", line(r)))?;
    }
    for r in &plan.later {
        out.print(&format!(
            "kept until {}: {}\n",
            r.due_at.format("%Y-%m-%d %H:%M"),
            line(r)
        ))?;
    }
    for r in &plan.open_prs {
        out.print(&format!(
            "kept while its pull request is open: {}\n",
            line(r)
        ))?;
    }
    if !plan.live.is_empty() {
        out.print(&format!(
            "{} trace(s) with work queued or running keep theirs\n",
            plan.live.len()
        ))?;
    }
    for image in &images.removed {
        out.print(&format!(
            "environment image {}: {image}\n",
            if dry_run { "unused" } else { "removed" }
        ))?;
    }
    for error in &images.errors {
        out.print(&format!("environment images: {error}\n"))?;
    }
    super::gc::print(out, &leftovers, dry_run)?;
    if !dry_run && !queued.is_empty() {
        wake_daemon(
            &store,
            out,
            "removes their worktrees, branches, containers and task mappings",
        )?;
    }
    Ok(ExitCode::SUCCESS)
}
