//! The orchestrator as intake's [`Queue`]: new work wakes the drain, and a [`Signal`] (a CI
//! outcome) makes the scheduled runs that wait on it due now. Which runs wait on it is each
//! run's step's answer ([`Step::woken_by`]), so the scheduler reads no step's records and intake
//! names no step.

use std::collections::BTreeMap;
use std::sync::Arc;

use async_trait::async_trait;

use super::{Step, StepOrchestrator};
use crate::intake::{Queue, Signal};
use crate::store::{AutopilotStore, StepKind, StoreError};

#[async_trait]
impl Queue for StepOrchestrator {
    fn wake(&self) {
        StepOrchestrator::wake(self);
    }

    async fn signal(&self, signal: &Signal) -> Result<usize, StoreError> {
        let steps = self.inner.steps.clone();
        let owned = signal.clone();
        let woken = crate::store::blocking(self.store().clone(), move |store| {
            wake_waiting(store, &steps, &owned)
        })
        .await?;
        if woken > 0 {
            tracing::info!(?signal, woken, "scheduled runs made due by a signal");
        }
        Ok(woken)
    }
}

/// Clear `notBefore` of every queued action not running whose step says it waits on `signal`.
/// Returns how many. An action whose file cannot be read is left to its scheduled time.
fn wake_waiting(
    store: &AutopilotStore,
    steps: &BTreeMap<StepKind, Arc<dyn Step>>,
    signal: &Signal,
) -> Result<usize, StoreError> {
    let state = store.read_state()?;
    let mut woken = 0;
    for pending in state
        .pending
        .iter()
        .filter(|p| p.running_span_id.is_none() && p.not_before.is_some())
    {
        let Some(step) = steps.get(&pending.action) else {
            continue;
        };
        let Ok(action) = store.read_action(pending.action_id) else {
            continue;
        };
        if step.woken_by(&action, signal) && store.wake_pending(pending.action_id)? {
            woken += 1;
        }
    }
    Ok(woken)
}
