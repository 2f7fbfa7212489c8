//! rover's revert of its own merge that left the base branch red (`lifecycle.onRedMain:
//! "revert"`): decided by rule, no agent. One task whose workflow reverts the merge commit with
//! git (no agent writes it) on a branch of its own; its pull request goes through the same
//! mode's rules as any other.

use crate::git::short_sha;
use crate::intake::Reverting;
use crate::orchestrator::{Finished, NextAction};
use crate::steps::meta::{CoordinateSpanMeta, DecidedBy, Decision, WorkflowMeta};
use crate::store::StepKind;

/// The task that reverts `reverting`, as the coordinator's decision.
pub(super) fn revert_rule(reverting: &Reverting) -> Finished {
    let sha = short_sha(&reverting.sha);
    let title = format!("Revert pull request #{}", reverting.pr_number);
    let task = WorkflowMeta {
        title: title.clone(),
        description: format!(
            "Revert merge commit {sha} of pull request #{} ({}) on `{}`: its checks failed there after rover merged it.",
            reverting.pr_number, reverting.pr_url, reverting.branch
        ),
        acceptance_criteria: vec![format!(
            "the change of merge commit {sha} is taken back, and nothing else changes"
        )],
        revert: Some(reverting.sha.clone()),
        ..WorkflowMeta::default()
    };
    let reason = format!(
        "rover's merge {sha} of pull request #{} left `{}` red: revert it",
        reverting.pr_number, reverting.branch
    );
    Finished::completed(format!("decided workflow: {reason}"))
        .with_meta_record(&CoordinateSpanMeta {
            confidence: Some(1.0),
            reasoning: Some(reason.clone()),
            ..CoordinateSpanMeta::decided(Decision::Workflow, DecidedBy::Rule)
        })
        .then(NextAction::new(StepKind::Workflow, format!("{title}: {reason}")).with_meta(&task))
}
