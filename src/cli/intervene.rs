//! A person steering rover: `cancel`, `fail` and `retry` a trace, and the dead letters. Each
//! writes a span in the trace saying who did what, through the store lock, so they work with the
//! daemon running (it is woken and stops the trace's running agents and containers) or stopped.

use std::process::ExitCode;

use chrono::Utc;
use uuid::Uuid;

use super::{CliError, Context, Output};
use crate::steps::meta::{NotifyMeta, NotifyPurpose};
use crate::store::{
    Action, AutopilotStore, ClosedTrace, InterventionSpanMeta, RunSpanMeta, Span, SpanStatus,
    StepKind, TraceView,
};

fn open_store(ctx: &Context) -> Result<AutopilotStore, CliError> {
    let project_id = ctx.project_id()?;
    Ok(AutopilotStore::open_existing(
        &crate::project::data_dir()?,
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

/// Whether anything of the trace is queued or running.
fn has_work(view: &TraceView) -> bool {
    !view.pending.is_empty()
}

/// `cancel` and `fail`: close the trace, take its queued work off the queue, stop what runs,
/// and answer on its channel saying who did it.
pub fn close(
    ctx: &Context,
    out: &mut Output,
    id: &str,
    command: &str,
    reason: Option<String>,
    by: Option<String>,
) -> Result<ExitCode, CliError> {
    let store = open_store(ctx)?;
    let trace_id = store.resolve_trace_id(id)?;
    let view = store.load_trace(trace_id)?;
    let short = crate::trace::short(trace_id);
    if let Some(closed) = store.read_state()?.closed.get(&trace_id) {
        return Err(CliError::Refused(format!(
            "trace {short} was already {}",
            closed.describe()
        )));
    }
    if !has_work(&view) {
        return Err(CliError::Refused(format!(
            "trace {short} has ended (nothing queued or running): nothing to {command}; `rover autopilot trace {short}` shows how"
        )));
    }
    let closed = ClosedTrace {
        command: command.to_owned(),
        by: actor(by),
        reason: reason.unwrap_or_default().trim().to_owned(),
        at: Utc::now(),
    };
    let what = closed.describe();
    let running: Vec<String> = store
        .read_state()?
        .pending
        .iter()
        .filter(|p| p.trace_id == trace_id && p.running_span_id.is_some())
        .map(|p| format!("{} ({})", p.action, crate::trace::short(p.action_id)))
        .collect();
    let record = InterventionSpanMeta {
        by: closed.by.clone(),
        reason: Some(closed.reason.clone()),
        stopping: Some(running.clone()),
        ..InterventionSpanMeta::default()
    };
    let span = Span::intervention(trace_id, command, what.clone(), &record);
    let notify = NotifyMeta {
        purpose: if command == "fail" {
            NotifyPurpose::Failure
        } else {
            NotifyPurpose::Flag
        },
        message: Some(format!("This work was {what}.")),
        failed_step: None,
        error: (command == "fail").then(|| what.clone()),
        pr_url: None,
        breaker_note: None,
        // A person's decision, not a failure of rover's: the circuit breaker does not count it.
        circuit_breaker: true,
    };
    let notify_meta = crate::steps::meta::to_meta(&notify);
    let answer = Action::new(
        StepKind::Notify,
        &span,
        what.clone(),
        notify_meta,
        Utc::now(),
    );
    let removed = store.intervene(
        &span,
        std::slice::from_ref(&answer),
        |p| p.trace_id == trace_id && !p.action.is_terminal(),
        Some(closed),
    )?;
    out.print(&format!("trace {short} {what}\n"))?;
    for p in &removed {
        out.print(&format!(
            "  took {} ({}) off the queue\n",
            p.action,
            crate::trace::short(p.action_id)
        ))?;
    }
    for r in &running {
        out.print(&format!("  stopping {r}\n"))?;
    }
    wake_daemon(&store, out, "stops what still runs and posts the answer")?;
    Ok(ExitCode::SUCCESS)
}

/// The action a `retry <id>` means: the action itself, or the trace's latest failed action.
fn failed_action(store: &AutopilotStore, view: &TraceView, id: &str) -> Result<Action, CliError> {
    let short = crate::trace::short(view.trace_id());
    let named = view
        .actions
        .iter()
        .find(|a| a.id.to_string() == id || (id.len() >= 8 && a.id.to_string().starts_with(id)));
    if let Some(action) = named {
        return Ok(action.clone());
    }
    let failed = view
        .spans
        .iter()
        .filter(|s| s.status == SpanStatus::Error && s.action_id.is_some())
        .filter(|s| !RunSpanMeta::of(s).stopped())
        .max_by_key(|s| s.completed.unwrap_or(s.timestamp))
        .ok_or_else(|| {
            CliError::Refused(format!(
                "trace {short} has no failed step to retry; `rover autopilot trace {short}` shows it"
            ))
        })?;
    Ok(store.read_action(failed.action_id.expect("filtered"))?)
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
    let view = store.load_trace(trace_id)?;
    let short = crate::trace::short(trace_id);
    if let Some(closed) = store.read_state()?.closed.get(&trace_id) {
        return Err(CliError::Refused(format!(
            "trace {short} was {}; it is not retried",
            closed.describe()
        )));
    }
    let original = failed_action(&store, &view, id)?;
    if let Some(p) = view.pending.iter().find(|p| p.action_id == original.id) {
        return Err(CliError::Refused(format!(
            "action {} ({}) is still queued (attempt {}): nothing to retry yet",
            crate::trace::short(original.id),
            original.action,
            p.attempts
        )));
    }
    let by = actor(by);
    // Same producer and meta as the original, so the step sees the same input; a new id, so
    // a fresh attempt budget.
    let mut again = original.clone();
    again.id = Uuid::new_v4();
    again.timestamp = Utc::now();
    again.reason = format!("retried by {by}: {}", original.reason);
    let record = InterventionSpanMeta {
        by: by.clone(),
        retried: Some(original.id),
        action: Some(again.id),
        ..InterventionSpanMeta::default()
    };
    let summary = format!(
        "{} ({}) retried by {by}",
        original.action,
        crate::trace::short(original.id)
    );
    let span = Span::intervention(trace_id, "retry", summary.clone(), &record);
    store.intervene(&span, std::slice::from_ref(&again), |_| false, None)?;
    out.print(&format!(
        "{summary}: queued as action {}\n",
        crate::trace::short(again.id)
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
            CliError::Refused(format!(
                "no dead letter {id:?}: `rover autopilot dead-letters` lists them"
            ))
        })?;
    let by = actor(by);
    let command = if drop { "drop" } else { "requeue" };
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
    let span = Span::intervention(pending.trace_id, command, summary.clone(), &record);
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
/// without `--dry-run`, queue the cleanup of what is due (the daemon runs it).
pub fn gc(
    ctx: &Context,
    out: &mut Output,
    dry_run: bool,
    json: bool,
    retain_days: Option<u64>,
) -> Result<ExitCode, CliError> {
    let store = open_store(ctx)?;
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
        crate::steps::workflow::image_of,
        dry_run,
    );
    if json {
        out.print(&format!(
            "{}\n",
            serde_json::to_string_pretty(&serde_json::json!({
                "retainDays": retain_days, "dryRun": dry_run, "plan": plan, "environmentImages": images,
                "queued": queued.iter().map(ToString::to_string).collect::<Vec<_>>(),
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
    if !dry_run && !queued.is_empty() {
        wake_daemon(
            &store,
            out,
            "removes their worktrees, branches, containers and task mappings",
        )?;
    }
    Ok(ExitCode::SUCCESS)
}
