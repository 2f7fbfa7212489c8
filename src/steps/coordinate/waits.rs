//! Open waits on the same subject: found, taken over by a newer trace, shown to the agent.

use uuid::Uuid;

use super::{MAX_WAITS, WAIT_LOOKBACK};
use crate::agents::untrusted_block;
use crate::steps::history::{coordinator_acted, recorded_waits, subject_of};
use crate::steps::meta::{CoordinateMeta, MergeMeta, OpenWait};
use crate::store::{AutopilotStore, StepKind};

/// Open waits of other recent traces about `subject` (a [`subject_key`]), up to the newest
/// trace that acted on it (newest first, at most [`MAX_WAITS`]).
pub fn open_waits(store: &AutopilotStore, this_trace: Uuid, subject: &str) -> Vec<OpenWait> {
    let Ok(recent) = store.recent_traces(WAIT_LOOKBACK) else {
        return Vec::new();
    };
    let mut waits = Vec::new();
    // `recent_traces` lists the newest first.
    for entry in recent.iter().filter(|e| e.trace_id != this_trace) {
        let Ok(view) = store.load_trace(entry.trace_id) else {
            continue;
        };
        if subject_of(&view).as_deref() != Some(subject) {
            continue;
        }
        if coordinator_acted(&view) {
            // A newer trace already acted on this subject: older waits are settled.
            break;
        }
        waits.extend(
            recorded_waits(&view)
                .into_iter()
                .map(|(at, condition)| OpenWait {
                    trace_id: entry.trace_id,
                    at,
                    condition,
                }),
        );
        if waits.len() >= MAX_WAITS {
            break;
        }
    }
    waits.truncate(MAX_WAITS);
    waits
}

/// Take over the scheduled waits of other traces about `subject` (see the module docs): each
/// becomes due now, marked superseded by `this_trace`. Returns them as open waits.
pub fn take_over_waits(
    store: &AutopilotStore,
    this_trace: Uuid,
    subject: &str,
) -> Result<Vec<OpenWait>, crate::store::StoreError> {
    let state = store.read_state()?;
    let mut taken = Vec::new();
    for pending in state.pending.iter().filter(|p| {
        p.action == StepKind::Coordinate
            && p.trace_id != this_trace
            && p.running_span_id.is_none()
            && p.superseded_by.is_none()
    }) {
        let Ok(action) = store.read_action(pending.action_id) else {
            continue;
        };
        let Some(wait) = crate::steps::meta::read::<CoordinateMeta>(&action)
            .ok()
            .and_then(|m| m.wait)
        else {
            continue;
        };
        if wait.subject.as_deref() != Some(subject) {
            continue;
        }
        if store.supersede_pending(pending.action_id, this_trace)? {
            taken.push(OpenWait {
                trace_id: pending.trace_id,
                at: wait.since,
                condition: wait.condition,
            });
        }
    }
    Ok(taken)
}

/// Make the scheduled merges of pull request `subject` (`#<n>`) due now: something happened on
/// it (a review, a comment), so a merge waiting for an approval looks again at once instead of
/// at its next look. The merge decides by what GitHub says, never by the event. Returns how
/// many were woken.
pub fn wake_merges(
    store: &AutopilotStore,
    subject: &str,
) -> Result<usize, crate::store::StoreError> {
    let Some(number) = subject
        .strip_prefix('#')
        .and_then(|n| n.parse::<u64>().ok())
    else {
        return Ok(0);
    };
    let state = store.read_state()?;
    let mut woken = 0;
    for pending in state.pending.iter().filter(|p| {
        p.action == StepKind::Merge && p.running_span_id.is_none() && p.not_before.is_some()
    }) {
        let Ok(action) = store.read_action(pending.action_id) else {
            continue;
        };
        let about = crate::steps::meta::read::<MergeMeta>(&action).map(|m| m.pr_number);
        if about.is_ok_and(|n| n == number) && store.wake_pending(pending.action_id)? {
            woken += 1;
        }
    }
    Ok(woken)
}

/// The open waits for the prompt, as one untrusted block: their conditions are agents' words.
pub(super) fn render_waits(waits: &[OpenWait]) -> String {
    if waits.is_empty() {
        return "(none)".to_owned();
    }
    let list = waits
        .iter()
        .map(|w| {
            format!(
                "- since {} (trace {}): waiting for {}",
                w.at.to_rfc3339(),
                w.trace_id,
                w.condition
            )
        })
        .collect::<Vec<_>>()
        .join("\n");
    untrusted_block("open waits (conditions coordinators wrote)", &list)
}
