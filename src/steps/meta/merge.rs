//! The `merge` step's records: what a merge action asks (the pull request and the head whose
//! checks passed) and what its span says happened (merged, waiting and for what, refused).

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use super::CiWatchMeta;
use crate::orchestrator::NextAction;
use crate::store::StepKind;

/// A `merge` action: merge rover's pull request `pr_number` at `sha`, the head whose required
/// checks passed, under `autopilot.lifecycle.mode`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MergeMeta {
    pub pr_number: u64,
    pub pr_url: String,
    pub branch: String,
    /// The head whose checks passed: the only commit rover merges.
    pub sha: String,
    /// When rover first asked to merge it (the approval timeout counts from here).
    pub asked_at: DateTime<Utc>,
    /// How many looks so far, this one included.
    #[serde(default)]
    pub round: u32,
    /// rover already said on the thread that it waits for an approval (said once).
    #[serde(default)]
    pub told_waiting: bool,
    /// When the scheduled look is due.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub not_before: Option<DateTime<Utc>>,
}

/// What a `merge` span decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum MergeOutcome {
    /// GitHub merged it.
    Merged,
    /// Not yet: an approval, the hourly cap, or GitHub's protection (looked at again later).
    Waiting,
    /// The head moved after its checks passed: its new checks are followed first.
    HeadMoved,
    /// The branch was behind its base and GitHub was asked to bring it up to date: the new
    /// head's checks come first.
    Updated,
    /// The branch is behind its base and conflicts with it (GitHub cannot bring it up to
    /// date): the resolver decides, the conflict recorded as a push's is.
    Conflict,
    /// Never merged by rover: not its pull request, or GitHub refused for good.
    Refused,
    /// The pull request is no longer open.
    Closed,
}

/// The `merge` span's record (`trace` shows it, the budget's hourly cap counts the merged).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MergeSpanMeta {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub merge_outcome: Option<MergeOutcome>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pr_number: Option<u64>,
    /// `autopilot.lifecycle.mode` when it decided.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<String>,
    /// The head it merged (or would have).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub head_sha: Option<String>,
    /// The merge commit GitHub made.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub merge_sha: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub merge_method: Option<String>,
    /// Who approved the merged head (trusted people only).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub approved_by: Vec<String>,
    /// Changed files that steer rover or its sandbox: they need a trusted approval whatever
    /// the mode.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub steering_files: Vec<String>,
    /// What it waits for, or why it refused, in words.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub merged_at: Option<DateTime<Utc>>,
    /// The conflict with the base that moved on (outcome `conflict`), read back by the
    /// resolver as a push's consolidation conflict is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub conflict: Option<super::PushConflict>,
}

impl MergeSpanMeta {
    /// What a `merge` span recorded (nothing, for a span whose meta has other shapes).
    pub fn of(span: &crate::store::Span) -> MergeSpanMeta {
        crate::store::from_meta(&span.meta).unwrap_or_default()
    }
}

/// The action a green look at CI hands to when the lifecycle mode merges: merge `watch`'s head
/// (the one whose checks passed).
pub fn merge_action(watch: &CiWatchMeta, reason: String) -> NextAction {
    NextAction::new(StepKind::Merge, reason).with_meta(&MergeMeta {
        pr_number: watch.pr_number,
        pr_url: watch.pr_url.clone(),
        branch: watch.branch.clone(),
        sha: watch.sha.clone(),
        asked_at: Utc::now(),
        round: 1,
        told_waiting: false,
        not_before: None,
    })
}

/// What a `merge` or `release` span did, in a word and its object (`merged`, `waiting`,
/// `released v1.2.3`): what a replay compares of a step that decides without a `decision`.
/// `None` for a span of any other shape.
pub fn lifecycle_outcome(meta: &crate::store::Meta) -> Option<String> {
    if let Some(outcome) = crate::store::from_meta::<MergeSpanMeta>(meta)
        .ok()
        .and_then(|m| m.merge_outcome)
    {
        return Some(word(&outcome));
    }
    let release = crate::store::from_meta::<super::ReleaseSpanMeta>(meta).ok()?;
    let outcome = word(&release.release_outcome?);
    Some(match release.tag {
        Some(tag) => format!("{outcome} {tag}"),
        None => outcome,
    })
}

/// A unit variant's serialized name.
fn word<T: Serialize>(value: &T) -> String {
    match serde_json::to_value(value) {
        Ok(serde_json::Value::String(s)) => s,
        _ => String::new(),
    }
}
