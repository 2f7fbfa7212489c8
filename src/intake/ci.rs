//! CI outcomes as a source: a check run, check suite or workflow run completed, or a final
//! commit status, for one commit. It starts no trace and is no work by itself: intake hands it
//! to the [`Queue`] as a [`Signal`], and the scheduler (the orchestrator) asks each step which
//! of its scheduled runs wait on it (`orchestrator::Step::woken_by`; the coordinate step
//! answers for the CI watch of rover's pull request at that commit and for a wait on a pull
//! request whose head it is). Those runs are made due now (their `notBefore` cleared, on disk
//! before the answer) and look at GitHub themselves: the payload is only a hint, never read as
//! the CI's result.

use super::Queue;
use crate::store::StoreError;

/// A final CI outcome reported for commit `sha`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CiOutcome {
    /// The commit, lowercase hex.
    pub sha: String,
    /// What reported it, for people: `check_run completed (success)`, `status failure`.
    pub what: String,
}

impl CiOutcome {
    /// The outcome for `sha` (lowercased: GitHub's shas are, a step's record may not be).
    pub fn new(sha: &str, what: impl Into<String>) -> Self {
        Self {
            sha: sha.to_ascii_lowercase(),
            what: what.into(),
        }
    }

    /// Whether `sha` names this outcome's commit (any case).
    pub fn is_for(&self, sha: &str) -> bool {
        self.sha.eq_ignore_ascii_case(sha)
    }
}

/// Something that concerns runs already scheduled, handed to the [`Queue`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Signal {
    /// A CI outcome for a commit.
    Ci(CiOutcome),
}

/// Hand a CI outcome to the queue: the scheduled runs waiting on its commit are due now
/// (persisted when this returns) and the queue is woken for them. Returns how many.
pub async fn ingest_ci(queue: &dyn Queue, outcome: CiOutcome) -> Result<usize, StoreError> {
    let signal = Signal::Ci(outcome);
    let woken = queue.signal(&signal).await?;
    if woken > 0 {
        queue.wake();
    }
    Ok(woken)
}
