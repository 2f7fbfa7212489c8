//! The workflow's own sandbox slots (a second scheduler beside the orchestrator's
//! `maxParallel`): at most [`MAX_SANDBOXES`] containers run at once, detached ones included.
//! Kept here, alone, until the orchestrator counts detached runs itself.

use std::collections::{HashMap, HashSet};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use uuid::Uuid;

use crate::store::{State, StepKind};

/// At most this many workflow sandboxes run at once (detached ones included).
pub const MAX_SANDBOXES: usize = 3;

/// A slot reserved by `ready` whose run never started (another process took the action) is
/// given back after this long.
const RESERVATION_TTL: Duration = Duration::from_secs(120);

/// Actions given a sandbox slot by `ready` whose `process` has not returned yet (so `monitor`
/// leaves them alone and the slot count sees them), with when they got it.
#[derive(Debug, Default)]
pub(super) struct Slots {
    launching: Mutex<HashMap<Uuid, Instant>>,
}

impl Slots {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<Uuid, Instant>> {
        self.launching
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// A slot for `action_id`, or why it must wait: detached runs in `state` hold theirs until
    /// `monitor` collects them.
    pub(super) fn reserve(&self, action_id: Uuid, state: &State) -> Result<(), String> {
        let mut slots = self.lock();
        slots.retain(|_, since| since.elapsed() < RESERVATION_TTL);
        if slots.contains_key(&action_id) {
            return Ok(());
        }
        let detached = state
            .pending
            .iter()
            .filter(|p| {
                p.action == StepKind::Workflow
                    && p.running_span_id.is_some()
                    && p.action_id != action_id
                    && !slots.contains_key(&p.action_id)
            })
            .count();
        if detached + slots.len() >= MAX_SANDBOXES {
            return Err(format!(
                "{MAX_SANDBOXES} workflow sandboxes are running; waiting for one to finish"
            ));
        }
        slots.insert(action_id, Instant::now());
        Ok(())
    }

    /// Holds `action_id`'s slot while its launch runs; given back when the guard drops.
    pub(super) fn hold(&self, action_id: Uuid) -> LaunchGuard<'_> {
        self.lock().insert(action_id, Instant::now());
        LaunchGuard {
            slots: self,
            id: action_id,
        }
    }

    /// The actions launching now.
    pub(super) fn launching(&self) -> HashSet<Uuid> {
        self.lock().keys().copied().collect()
    }
}

/// Removes an action from the launching set when `process` ends, however it ends.
pub(super) struct LaunchGuard<'a> {
    slots: &'a Slots,
    id: Uuid,
}

impl Drop for LaunchGuard<'_> {
    fn drop(&mut self) {
        self.slots.lock().remove(&self.id);
    }
}
