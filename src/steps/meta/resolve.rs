//! `resolve`: its action and its span (the decision, quick exits, corrective runs, waits).

use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::store::records::present;
use crate::store::Meta;

use super::{DecisionSpanMeta, PushConflict};

/// `resolve`: decide how the trace goes on.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ResolveMeta {
    /// The workflow action a commit's resolve is about (for people reading the action).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workflow_action_id: Option<Uuid>,
    /// Not to run before this time (the store queues the action so): a resolver `wait`.
    #[serde(default, skip_serializing_if = "Option::is_none", rename = "notBefore")]
    pub not_before: Option<chrono::DateTime<chrono::Utc>>,
    /// The self-review asked for changes: the resolver iterates on the task with the findings
    /// as its instructions (no agent), or gives up when no iterate is left.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub review: Option<super::ReviewChanges>,
}

/// The `resolve` span's meta: the decision and what led to it, written once per outcome. A
/// quick exit (superseded, retries or waits used up, a tampered worktree, a push refused for
/// secrets) writes only its part;
/// an agent's answer writes it all.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ResolveSpanMeta {
    /// `decision` (what rover carried out) and, for a resolve that found another one already
    /// decided, `supersededBy` (that resolve's span).
    #[serde(flatten)]
    pub decision: DecisionSpanMeta,
    /// What the agent answered (differs from `decision` when rover could not carry it out).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent_decision: Option<crate::agents::ResolveDecision>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasoning: Option<String>,
    /// The rule that decided without (or against) the agent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quick_exit: Option<ResolveQuickExit>,
    /// The commands the agent asked to run before a retry (none for a quick exit or a wait).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub corrective_commands: Option<Vec<crate::agents::CorrectiveCommand>>,
    /// How the corrective commands ran, or why they could not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub corrective_runs: Option<CorrectiveRuns>,
    /// The workflow action an `iterate` goes on from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub iterate_on: Option<Uuid>,
    /// The consolidation conflict an `iterate` resolves.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub conflict: Option<PushConflict>,
    /// A `wait`: the resolve scheduled to look again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wait: Option<ResolveWaitMeta>,
    /// Iterate/retry decisions the trace made before this one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retries: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_retries: Option<u32>,
    /// The span whose sandbox tampered with the worktree.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tampered_span: Option<Uuid>,
    /// The workflow span whose environment build failed (with `quickExit: environmentBuild`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub environment_span: Option<Uuid>,
    /// The push span refused for the secrets it would have sent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secrets_span: Option<Uuid>,
    /// The review span whose findings an `iterate` carries (with `quickExit: reviewChanges`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub review_span: Option<Uuid>,
    /// The agent's instructions for an `iterate` (`null`: it gave none; absent: no answer).
    #[serde(
        default,
        deserialize_with = "present",
        skip_serializing_if = "Option::is_none"
    )]
    pub instructions: Option<Option<String>>,
    /// The step a `retry` asked for (`null`: none; absent: no answer).
    #[serde(
        default,
        deserialize_with = "present",
        skip_serializing_if = "Option::is_none"
    )]
    pub retry_step: Option<Option<crate::agents::RetryStep>>,
    /// The agent's message for the channel (`null`: none; absent: no answer).
    #[serde(
        default,
        deserialize_with = "present",
        skip_serializing_if = "Option::is_none"
    )]
    pub message: Option<Option<String>>,
    /// Where the agent ran (rover's empty host dir), as displayed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workdir: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent: Option<crate::store::AgentMeta>,
}

impl ResolveSpanMeta {
    /// The typed keys of a resolve span's meta (other keys are ignored).
    pub fn read(meta: &Meta) -> Result<ResolveSpanMeta, serde_json::Error> {
        crate::store::from_meta(meta)
    }
}

/// Why a resolve decided without asking the agent, or overrode its answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum ResolveQuickExit {
    /// The trace used up its iterate/retry decisions.
    MaxRetries,
    /// The agent kept answering `wait`.
    MaxWaits,
    /// A sandbox tampered with the worktree.
    Tampered,
    /// A push would meet the same consolidation conflict again.
    ConflictUnchanged,
    /// The push was refused: what it would send holds secrets.
    SecretsInPush,
    /// The repository's environment image did not build: no agent ran, and another attempt
    /// would build the same definition again.
    EnvironmentBuild,
    /// The self-review asked for changes: the task iterates with its findings, no agent asked.
    ReviewChanges,
}

/// The corrective commands of a `retry` as they ran in the sandbox (`ran` with `runs`), or why
/// none could (`reason`, with the `commands` asked for).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CorrectiveRuns {
    pub ran: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runs: Option<Vec<crate::steps::sandboxed::CorrectiveRun>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub commands: Option<Vec<String>>,
}

impl CorrectiveRuns {
    pub fn ran(runs: Vec<crate::steps::sandboxed::CorrectiveRun>) -> CorrectiveRuns {
        CorrectiveRuns {
            ran: true,
            runs: Some(runs),
            ..CorrectiveRuns::default()
        }
    }

    pub fn not_run(reason: String, commands: Vec<String>) -> CorrectiveRuns {
        CorrectiveRuns {
            ran: false,
            runs: None,
            reason: Some(reason),
            commands: Some(commands),
        }
    }
}

/// A resolver `wait`: which round, of at most how many, and when the next resolve runs.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ResolveWaitMeta {
    pub round: u32,
    pub max: u32,
    /// RFC 3339, whole seconds (the scheduled resolve's `notBefore`).
    pub not_before: String,
}
