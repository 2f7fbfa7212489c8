//! The store a replayed step run reads: a fresh store in a temporary directory holding the
//! trace as it stood when the original run started. Spans that started earlier are there (one
//! still running then is written as running, its action claimed), actions created earlier are
//! there (the ones no earlier run had consumed are queued), the replayed action is queued with
//! its attempts so far, and `state.json` holds the task mappings the original run read (without
//! their worktree and container: a replay reads no task's files). Then the replayed action is
//! claimed as the orchestrator claims it.

use chrono::{DateTime, Utc};
use uuid::Uuid;

use super::bundle::TraceBundle;
use crate::store::replay_record::ReplayRecord;
use crate::store::{AutopilotStore, Span, SpanStatus, StepRun};

/// A replay's store; the directory goes when this is dropped.
pub struct World {
    _dir: tempfile::TempDir,
    pub store: AutopilotStore,
    pub run: StepRun,
}

/// The project id of a replay's store.
const PROJECT: &str = "replay";

/// The world of `span`'s run.
pub fn build(
    bundle: &TraceBundle,
    span: &Span,
    record: &ReplayRecord,
    superseded_by: Option<Uuid>,
) -> Result<World, String> {
    let action_id = span
        .action_id
        .ok_or_else(|| format!("span {} names no action it processed", span.id))?;
    let dir = tempfile::Builder::new()
        .prefix("rover-replay-")
        .tempdir()
        .map_err(|e| format!("cannot make a temporary directory: {e}"))?;
    let store = AutopilotStore::open(dir.path(), PROJECT).map_err(|e| e.to_string())?;
    let at = span.timestamp;
    let earlier: Vec<&Span> = bundle
        .spans
        .iter()
        .filter(|s| s.timestamp < at && s.id != span.id)
        .collect();
    let mut still_running: Vec<(Uuid, Uuid)> = Vec::new();
    for s in &earlier {
        let finished_later = s.completed.is_some_and(|c| c > at);
        if finished_later {
            let mut running = (*s).clone();
            running.status = SpanStatus::Running;
            running.completed = None;
            running.summary = None;
            store.write_span(&running).map_err(|e| e.to_string())?;
            if let Some(a) = s.action_id {
                still_running.push((a, s.id));
            }
        } else {
            store.write_span(s).map_err(|e| e.to_string())?;
        }
    }
    let actions: Vec<_> = bundle
        .actions
        .iter()
        .filter(|a| a.timestamp < at || a.id == action_id)
        .collect();
    if !actions.iter().any(|a| a.id == action_id) {
        return Err(format!(
            "the action {action_id} that span {} processed is not in the trace",
            span.id
        ));
    }
    for a in &actions {
        store.write_action(a).map_err(|e| e.to_string())?;
    }
    store.rebuild_indexes().map_err(|e| e.to_string())?;
    let consumed_before = |id: Uuid| {
        earlier
            .iter()
            .any(|s| s.action_id == Some(id) && !still_running.iter().any(|(_, r)| *r == s.id))
    };
    let attempts = attempts_before(bundle, action_id, at);
    let trace_id = bundle.trace_id;
    store
        .transact(|txn| {
            for a in &actions {
                let running = still_running.iter().find(|(id, _)| *id == a.id);
                if a.id != action_id && running.is_none() && consumed_before(a.id) {
                    continue;
                }
                let mut pending = a.pending(trace_id, a.timestamp);
                if a.id == action_id {
                    pending.attempts = attempts;
                    pending.superseded_by = superseded_by;
                    pending.not_before = None;
                }
                pending.running_span_id = running.map(|(_, s)| *s);
                txn.push_pending(pending)?;
            }
            if let Some(mappings) = &record.task_mappings {
                // Without their worktree and container: a replay reads no task's files (an
                // export may come from anywhere, its paths too) and touches no container.
                let mut mappings = mappings.clone();
                for m in mappings.values_mut() {
                    m.worktree_path = None;
                    m.container_id = None;
                }
                txn.state_mut()?.task_mappings = mappings;
            }
            Ok(())
        })
        .map_err(|e| e.to_string())?;
    let run = store
        .begin_step(action_id, &span.step)
        .map_err(|e| e.to_string())?;
    Ok(World {
        _dir: dir,
        store,
        run,
    })
}

/// Runs of `action_id` started before `at` (the orchestrator counts each claim).
fn attempts_before(bundle: &TraceBundle, action_id: Uuid, at: DateTime<Utc>) -> u32 {
    let n = bundle
        .spans
        .iter()
        .filter(|s| s.action_id == Some(action_id) && s.timestamp < at)
        .count();
    u32::try_from(n).unwrap_or(u32::MAX)
}
