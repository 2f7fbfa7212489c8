//! What the scheduler scores a queued task by (`orchestrator::SlotFacts`): the queued tasks of
//! its trace that wait on it (through `dependsOn`, directly or through others), the labels its
//! issue or pull request carried, and how many runs of the task came before (the resolver's
//! iterations through `iterateOn`, and the action's own interrupted or retried starts).

use std::collections::{HashMap, HashSet, VecDeque};

use uuid::Uuid;

use crate::orchestrator::SlotFacts;
use crate::steps::agent_call::trace_labels;
use crate::steps::meta::{self, WorkflowMeta};
use crate::store::{AutopilotStore, PendingAction, State, StepKind, StoreError};

/// The longest `iterateOn` chain followed (each link is an earlier run of the same task).
const MAX_CHAIN: u32 = 50;

/// The facts of workflow action `pending`, read from `store`.
pub(super) fn slot_facts(
    store: &AutopilotStore,
    pending: &PendingAction,
) -> Result<SlotFacts, StoreError> {
    let state = store.read_state()?;
    Ok(SlotFacts {
        unblocks: waiting_on(store, &state, pending)?,
        labels: trace_labels(store, pending.trace_id),
        retries: earlier_runs(store, pending.action_id) + pending.attempts,
    })
}

/// The queued workflow tasks of `pending`'s trace that wait on it, directly or not.
fn waiting_on(
    store: &AutopilotStore,
    state: &State,
    pending: &PendingAction,
) -> Result<usize, StoreError> {
    let mut waits_on: HashMap<Uuid, Vec<Uuid>> = HashMap::new();
    for other in state.pending.iter().filter(|p| {
        p.trace_id == pending.trace_id
            && p.action == StepKind::Workflow
            && p.action_id != pending.action_id
    }) {
        let action = store.read_action(other.action_id)?;
        if let Ok(m) = meta::read::<WorkflowMeta>(&action) {
            for dep in m.depends_on {
                waits_on.entry(dep).or_default().push(other.action_id);
            }
        }
    }
    let mut seen = HashSet::new();
    let mut next = VecDeque::from([pending.action_id]);
    while let Some(id) = next.pop_front() {
        for waiter in waits_on.get(&id).into_iter().flatten() {
            if *waiter != pending.action_id && seen.insert(*waiter) {
                next.push_back(*waiter);
            }
        }
    }
    Ok(seen.len())
}

/// How many earlier workflow runs of the same task came before this action (`iterateOn`); a
/// link that cannot be read (an action gc removed) ends the chain.
fn earlier_runs(store: &AutopilotStore, action_id: Uuid) -> u32 {
    let mut runs = 0;
    let mut at = action_id;
    while runs < MAX_CHAIN {
        let earlier = store
            .read_action(at)
            .ok()
            .and_then(|action| meta::read::<WorkflowMeta>(&action).ok())
            .and_then(|m| m.iterate_on);
        match earlier {
            Some(earlier) if earlier != at => {
                runs += 1;
                at = earlier;
            }
            _ => break,
        }
    }
    runs
}
