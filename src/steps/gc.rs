//! Reclaiming what ended traces hold (worktrees, branches, containers, task mappings) by policy:
//! a trace whose work is over (nothing queued or running) and whose last step finished more
//! than `pipeline.retainDays` ago gets a `gc` span and a `cleanup` action for its tasks; the
//! cleanup step frees them. A trace that pushed a pull request keeps its tasks while the PR may
//! still get feedback: its merge or close cleans up (the coordinator's `cleanup`).
//! `rover autopilot gc` runs this by hand; the daemon runs it every hour.

use std::collections::BTreeMap;

use chrono::{DateTime, Duration, Utc};
use serde::Serialize;
use uuid::Uuid;

use super::history::{ended_at, open_pull_request};
use super::meta::{self, CleanupMeta, Intervention, InterventionSpanMeta};
use crate::store::{Action, AutopilotStore, Span, StepKind, StoreError};

/// A trace whose resources are due (or not yet) for reclaiming.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Reclaim {
    pub trace_id: Uuid,
    /// The workflow actions whose task mappings (worktree, branch, containers) go.
    pub tasks: Vec<Uuid>,
    pub branches: Vec<String>,
    /// When the trace's last step finished.
    pub ended_at: DateTime<Utc>,
    /// When it is due (`ended_at` + retention).
    pub due_at: DateTime<Utc>,
    pub label: String,
    /// The pull request the trace pushed (for a trace kept for it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pr_number: Option<u64>,
}

/// What holds resources, grouped by trace: due now, later, and kept for an open pull request.
#[derive(Debug, Clone, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Plan {
    pub due: Vec<Reclaim>,
    pub later: Vec<Reclaim>,
    /// Traces that pushed a pull request (cleaned up when it is merged or closed).
    pub open_prs: Vec<Reclaim>,
    /// Traces with work queued or running.
    pub live: Vec<Uuid>,
}

/// Traces kept for a pull request that GitHub says is closed (merged or not) are due now: the
/// close event that would have cleaned them up was missed (rover was down, the feed skipped
/// it). `closed` holds the numbers of the pull requests found closed.
pub fn release_closed(plan: &mut Plan, closed: &[u64], now: DateTime<Utc>) {
    let (gone, kept): (Vec<Reclaim>, Vec<Reclaim>) = std::mem::take(&mut plan.open_prs)
        .into_iter()
        .partition(|r| r.pr_number.is_some_and(|n| closed.contains(&n)));
    plan.open_prs = kept;
    plan.due
        .extend(gone.into_iter().map(|r| Reclaim { due_at: now, ..r }));
}

/// The retention as a duration (at most a century).
pub fn retention(days: u64) -> Duration {
    Duration::days(i64::try_from(days.min(36_500)).expect("bounded"))
}

/// Plan and queue what is due now, as `by`; returns the plan and the queued cleanup actions.
pub fn run(
    store: &AutopilotStore,
    retain_days: u64,
    by: &str,
) -> Result<(Plan, Vec<Uuid>), StoreError> {
    run_releasing(store, retain_days, by, &[])
}

/// [`run`], with the traces kept for the pull requests numbered in `closed` due now (see
/// [`release_closed`]).
pub fn run_releasing(
    store: &AutopilotStore,
    retain_days: u64,
    by: &str,
    closed: &[u64],
) -> Result<(Plan, Vec<Uuid>), StoreError> {
    let now = Utc::now();
    let mut plan = plan(store, retention(retain_days), now)?;
    release_closed(&mut plan, closed, now);
    let queued = enqueue(store, &plan.due, by, retain_days)?;
    Ok((plan, queued))
}

/// Which traces' resources are due for reclaiming at `now` with `retain` of retention.
pub fn plan(
    store: &AutopilotStore,
    retain: Duration,
    now: DateTime<Utc>,
) -> Result<Plan, StoreError> {
    let state = store.read_state()?;
    let mut by_trace: BTreeMap<Uuid, (Vec<Uuid>, Vec<String>)> = BTreeMap::new();
    for (key, mapping) in &state.task_mappings {
        let Ok(action) = Uuid::parse_str(key) else {
            continue;
        };
        let entry = by_trace.entry(mapping.trace_id).or_default();
        entry.0.push(action);
        if !entry.1.contains(&mapping.branch_name) {
            entry.1.push(mapping.branch_name.clone());
        }
    }
    let mut plan = Plan::default();
    for (trace_id, (tasks, branches)) in by_trace {
        if state.pending.iter().any(|p| p.trace_id == trace_id) {
            plan.live.push(trace_id);
            continue;
        }
        let view = match store.load_trace(trace_id) {
            Ok(view) => view,
            // A mapping of a trace this store does not hold: not ours to judge.
            Err(StoreError::UnknownId { .. }) => continue,
            Err(e) => return Err(e),
        };
        let ended_at = ended_at(&view);
        let pr = open_pull_request(&view);
        let reclaim = Reclaim {
            trace_id,
            tasks,
            branches,
            ended_at,
            due_at: ended_at + retain,
            label: view.index.event.clone(),
            pr_number: pr.flatten(),
        };
        if pr.is_some() {
            plan.open_prs.push(reclaim);
        } else if reclaim.due_at <= now {
            plan.due.push(reclaim);
        } else {
            plan.later.push(reclaim);
        }
    }
    Ok(plan)
}

/// Queue the cleanup of each due trace: a `gc` span saying who and why, producing a `cleanup`
/// action for its tasks (run by the cleanup step). Returns the cleanup action ids.
pub fn enqueue(
    store: &AutopilotStore,
    due: &[Reclaim],
    by: &str,
    retain_days: u64,
) -> Result<Vec<Uuid>, StoreError> {
    let mut queued = Vec::new();
    for reclaim in due {
        let now = Utc::now();
        let summary = match reclaim.pr_number {
            Some(n) => format!(
                "reclaiming {} task(s) by {by}: its pull request #{n} is closed on GitHub",
                reclaim.tasks.len()
            ),
            None => format!(
                "reclaiming {} task(s) by {by}: the trace ended {} (retainDays {retain_days})",
                reclaim.tasks.len(),
                reclaim
                    .ended_at
                    .to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
            ),
        };
        let record = InterventionSpanMeta {
            by: by.to_owned(),
            retain_days: Some(retain_days),
            tasks: Some(reclaim.tasks.clone()),
            ..InterventionSpanMeta::default()
        };
        let span = Span::intervention(
            reclaim.trace_id,
            Intervention::Gc.as_str(),
            summary.clone(),
            &record,
        );
        let cleanup = Action::new(
            StepKind::Cleanup,
            &span,
            summary,
            meta::to_meta(&CleanupMeta {
                tasks: reclaim.tasks.clone(),
                branch: None,
            }),
            now,
        );
        store.intervene(&span, std::slice::from_ref(&cleanup), |_| false, None)?;
        queued.push(cleanup.id);
    }
    Ok(queued)
}
