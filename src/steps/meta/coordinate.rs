//! `coordinate`: its action (a first look, a scheduled wait, a look at CI) and its span.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::github::NormalizedEvent;
use crate::orchestrator::NextAction;
use crate::store::records::present;
use crate::store::{Span, StepKind};

use super::{DecidedBy, Decision, DecisionSpanMeta};

/// `coordinate`: decide what to do about the trace's root event.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CoordinateMeta {
    /// Set when this run re-evaluates an earlier `wait` of the same trace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wait: Option<WaitMeta>,
    /// Set when this run looks at the CI of a pull request rover pushed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ci: Option<CiWatchMeta>,
    /// Not to run before this time (the store queues the action so): a wait's deadline.
    #[serde(default, skip_serializing_if = "Option::is_none", rename = "notBefore")]
    pub not_before: Option<chrono::DateTime<chrono::Utc>>,
}

/// A look at the CI of a pull request rover pushed, scheduled after the push: red → the
/// resolver, green → a notify that the pull request is ready, pending → look again later.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CiWatchMeta {
    pub pr_number: u64,
    pub pr_url: String,
    pub branch: String,
    /// The commit rover pushed: its checks and statuses are what counts.
    pub sha: String,
    /// How many looks so far, this one included.
    pub round: u32,
    /// When rover started following this head's checks (`lifecycle.ciTimeoutMins` counts from
    /// here in a mode that merges).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub since: Option<DateTime<Utc>>,
    /// The watch of rover's merge commit on the base branch (`branch`), after the merge of pull
    /// request `pr_number` (`lifecycle.postMergeCi`): green or red, the trace answers.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub after_merge: bool,
    /// The pull request is a person's (rover pushed onto their branch) or rover's proposal
    /// into a person's branch: green is answered, never merged, whatever the lifecycle mode.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub persons_pull_request: bool,
}

/// A coordinator `wait`, scheduled as a later `coordinate` of the same trace: it runs at its
/// deadline, or a newer trusted event about the same issue or pull request takes it over.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WaitMeta {
    /// What the coordinator waits for, in its words.
    pub condition: String,
    /// What it is about, as [`subject_key`] gives it (`#12`, `refs/heads/main`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subject: Option<String>,
    /// The head commit of the pull request (or the pushed commit) when the wait was decided: a
    /// CI outcome for it ends the wait early.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub head_sha: Option<String>,
    /// When the wait was decided.
    pub since: chrono::DateTime<chrono::Utc>,
    /// How many waits this trace decided so far (1 for the first).
    pub round: u32,
}

/// The `coordinate` span's meta: the decision (shared with `resolve` and `plan`) and what it was
/// made from. Which keys a run writes depends on what decided: the agent (its answer, the
/// trust verdict, the rover pull request, the open waits, the wait re-evaluated), a rule, the
/// trust check, a look at CI (the watch, the status, how many looks were red) or a newer trace
/// taking a wait over. An error (a red CI, a failed trust lookup) is under `error`:
/// `ErrorMeta`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CoordinateSpanMeta {
    #[serde(flatten)]
    pub decided: DecisionSpanMeta,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub confidence: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasoning: Option<String>,
    /// The agent's whole answer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub answer: Option<crate::agents::CoordinateResult>,
    /// The trust check's verdict: `null` when the agent decided about a local request.
    #[serde(
        default,
        deserialize_with = "present",
        skip_serializing_if = "Option::is_none"
    )]
    pub trust: Option<Option<crate::github::TrustDecision>>,
    /// The rover pull request the event is about: `null` when the agent decided about another.
    #[serde(
        default,
        deserialize_with = "present",
        skip_serializing_if = "Option::is_none"
    )]
    pub rover_pr: Option<Option<RoverPrMeta>>,
    /// The open waits on the same subject the agent was shown.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub open_waits: Option<Vec<OpenWait>>,
    /// The wait this run re-evaluated: `null` when the agent decided without one, or a newer
    /// trace took over a run that had none.
    #[serde(
        default,
        deserialize_with = "present",
        skip_serializing_if = "Option::is_none"
    )]
    pub wait: Option<Option<WaitMeta>>,
    /// The CI watch this run looked at.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ci: Option<CiWatchMeta>,
    /// On a red look: the red looks of the trace so far, this one included.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub red_looks: Option<u32>,
    /// The CI status a look found.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ci_status: Option<crate::github::CiStatus>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent: Option<crate::store::AgentMeta>,
    /// A `/rover` command this run took.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub command: Option<CommandRecord>,
    /// A trace this look started: rover's fix of the base branch its merge left red.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_trace: Option<uuid::Uuid>,
}

impl CoordinateSpanMeta {
    /// A run that decided `decision`, decided by `by`; the rest is filled by the caller.
    pub fn decided(decision: impl Into<Decision>, by: DecidedBy) -> CoordinateSpanMeta {
        CoordinateSpanMeta {
            decided: DecisionSpanMeta {
                decision: Some(decision.into()),
                decided_by: Some(by),
                superseded_by: None,
            },
            ..CoordinateSpanMeta::default()
        }
    }

    /// What a coordinate span recorded (nothing, for a span whose meta has other shapes).
    pub fn of(span: &Span) -> CoordinateSpanMeta {
        crate::store::from_meta(&span.meta).unwrap_or_default()
    }
}

/// A pull request rover opened, as the coordinator records it: its head branch is a task's.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RoverPrMeta {
    pub branch: String,
    /// The workflow action ids (the task mappings' keys) with their task ids.
    #[serde(default)]
    pub tasks: Vec<(String, String)>,
}

/// A wait recorded by an earlier trace about the same issue or pull request.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct OpenWait {
    pub trace_id: Uuid,
    pub at: chrono::DateTime<chrono::Utc>,
    pub condition: String,
}

/// What an event is about, for matching waits across traces: `#<number>` for an issue or pull
/// request, the ref for a push.
pub fn subject_key(event: &NormalizedEvent) -> Option<String> {
    match (event.number, &event.git_ref) {
        (Some(n), _) => Some(format!("#{n}")),
        (None, Some(git_ref)) => Some(git_ref.clone()),
        (None, None) => None,
    }
}

/// The scheduled look at a pull request's CI (see [`CiWatchMeta`]), `ci_poll_secs` from `now`.
pub fn ci_watch_action(
    watch: CiWatchMeta,
    pipeline: &crate::config::PipelineConfig,
    now: DateTime<Utc>,
) -> NextAction {
    let secs = i64::try_from(pipeline.ci_poll_secs).unwrap_or(i64::MAX);
    let at = now + chrono::Duration::try_seconds(secs).unwrap_or(chrono::Duration::MAX);
    NextAction::new(
        StepKind::Coordinate,
        format!(
            "follow the CI of pull request #{} at {} (look {} of at most {})",
            watch.pr_number,
            watch.sha.get(..12).unwrap_or(&watch.sha),
            watch.round,
            pipeline.ci_max_polls
        ),
    )
    .with_meta(&CoordinateMeta {
        wait: None,
        ci: Some(watch),
        not_before: Some(at),
    })
}

/// What became of a command.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum CommandOutcome {
    /// Done as asked.
    Done,
    /// Nothing to do (no trace working on the thread, nothing failed to retry).
    Nothing,
    /// Not taken: an untrusted author, an unknown command.
    Refused,
}

impl CommandOutcome {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Done => "done",
            Self::Nothing => "nothing to do",
            Self::Refused => "refused",
        }
    }
}

/// The `coordinate` span's record of a command (`meta.command`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CommandRecord {
    pub command: String,
    pub outcome: CommandOutcome,
    /// What was done, or why not.
    pub detail: String,
    /// The trace the command was about.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target: Option<Uuid>,
    /// Whether an answer was posted on the thread (a refusal past the rate limit is not).
    pub answered: bool,
    /// Whether the command was acknowledged with a reaction.
    pub acknowledged: bool,
}
