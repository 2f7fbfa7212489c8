//! The `release` step's records: what a release action asks (the merge commit whose checks
//! passed on the base branch, and the answer so far) and what its span says it made.

use serde::{Deserialize, Serialize};

use super::CiWatchMeta;
use crate::orchestrator::NextAction;
use crate::store::StepKind;

/// A `release` action: tag `sha`, rover's merge of `pr_number` into `branch` whose checks
/// passed there, with the next version, and make a GitHub release of it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ReleaseMeta {
    pub pr_number: u64,
    pub pr_url: String,
    /// The base branch the merge went to.
    pub branch: String,
    /// The merge commit: the one commit rover tags.
    pub sha: String,
    /// What the trace answers about the merge (the release is added to it).
    pub merged: String,
}

/// What a `release` span did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ReleaseOutcome {
    /// GitHub made the release and its tag.
    Released,
    /// A release of this commit was there already (made before a restart): nothing new.
    Existing,
    /// GitHub refused it (a tag of that name exists, no rights): said, not retried.
    Refused,
}

/// The `release` span's record.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ReleaseSpanMeta {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub release_outcome: Option<ReleaseOutcome>,
    /// The tag made (or found).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tag: Option<String>,
    /// The latest release's tag before it (none: the first).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub previous_tag: Option<String>,
    /// The commit tagged.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sha: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub release_url: Option<String>,
    /// The pull requests the notes list.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pulls: Vec<u64>,
    /// Why it refused, in GitHub's words.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

impl ReleaseSpanMeta {
    /// What a `release` span recorded (nothing, for a span whose meta has other shapes).
    pub fn of(span: &crate::store::Span) -> ReleaseSpanMeta {
        crate::store::from_meta(&span.meta).unwrap_or_default()
    }
}

/// The action a green look at the merge commit hands to when the lifecycle releases.
pub fn release_action(watch: &CiWatchMeta, merged: String) -> NextAction {
    NextAction::new(
        StepKind::Release,
        format!(
            "the checks of merge commit {} passed on `{}`: release it",
            &watch.sha[..watch.sha.len().min(7)],
            watch.branch
        ),
    )
    .with_meta(&ReleaseMeta {
        pr_number: watch.pr_number,
        pr_url: watch.pr_url.clone(),
        branch: watch.branch.clone(),
        sha: watch.sha.clone(),
        merged,
    })
}
