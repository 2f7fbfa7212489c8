//! Typed meta of every action type, shared by the step that produces an action and the step that
//! consumes it, so the two can never disagree on key names. Serialized camelCase into the
//! action's `meta`; unknown keys are ignored on read so older actions still load.

use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::github::{Channel, NormalizedEvent, Visibility};
use crate::store::{Action, Meta, Span, StepKind};

/// A typed record as an action's meta.
pub fn to_meta<T: Serialize>(record: &T) -> Meta {
    match serde_json::to_value(record) {
        Ok(serde_json::Value::Object(map)) => map,
        _ => Meta::new(),
    }
}

/// Read an action's meta as the typed record of its type.
pub fn read<T: for<'de> Deserialize<'de>>(action: &Action) -> Result<T, serde_json::Error> {
    serde_json::from_value(serde_json::Value::Object(action.meta.clone()))
}

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

/// `plan`: decompose a directive into workflow tasks.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PlanMeta {
    pub directive: String,
    /// When iterating on a rover PR: the workflow action whose task and branch to reuse.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub existing_task: Option<Uuid>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub branch: Option<String>,
}

/// The `plan` span's meta: the agent's analysis and what it led to (`decision`: `clarify`,
/// `empty` or `tasks`), with the question or the planned tasks.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PlanSpanMeta {
    #[serde(flatten)]
    pub decided: DecisionSpanMeta,
    #[serde(default)]
    pub analysis: String,
    /// The question asked instead of planning (`decision: clarify`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub clarification: Option<String>,
    /// The tasks planned, each with its workflow action (`decision: tasks`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tasks: Option<Vec<PlannedTask>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent: Option<crate::store::AgentMeta>,
}

impl PlanSpanMeta {
    /// What a plan span recorded (nothing, for a span whose meta has other shapes).
    pub fn of(span: &Span) -> PlanSpanMeta {
        serde_json::from_value(serde_json::Value::Object(span.meta.clone())).unwrap_or_default()
    }
}

/// One task of a plan as its span lists it: the planner's task id and the workflow action it
/// became.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PlannedTask {
    pub task_id: String,
    /// The preset id of the task's workflow action.
    pub action_id: Option<Uuid>,
    /// As the planner wrote it.
    pub title: String,
    pub workflow_type: crate::agents::WorkflowType,
    /// The planner's task ids this one depends on.
    #[serde(default)]
    pub depends_on: Vec<String>,
}

/// The kinds of workflow agent.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum WorkflowType {
    #[default]
    Swe,
    CodeReview,
    BugFinder,
    SecurityAnalyst,
}

/// `workflow`: one task for a coding agent in a sandbox.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WorkflowMeta {
    pub title: String,
    pub description: String,
    #[serde(default)]
    pub acceptance_criteria: Vec<String>,
    #[serde(default)]
    pub workflow_type: WorkflowType,
    /// Workflow action ids of the same plan this task builds on.
    #[serde(default)]
    pub depends_on: Vec<Uuid>,
    /// Iterate on an earlier workflow's task and branch (resolver `iterate`, PR feedback).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub iterate_on: Option<Uuid>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub branch: Option<String>,
    /// New instructions for an iteration.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instructions: Option<String>,
    /// A branch to merge into the task's worktree before the agent runs, conflicts left in the
    /// files for the agent to resolve (the resolver's answer to a consolidation conflict).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub merge_from: Option<String>,
}

/// How a workflow ended, as the committer is told.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TaskStatus {
    Completed,
    Failed,
    Error,
}

/// `commit`: record the work of a workflow.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CommitMeta {
    /// The workflow action whose task mapping names the worktree and branch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workflow_action_id: Option<Uuid>,
    pub task_status: TaskStatus,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub summary: Option<String>,
}

impl CommitMeta {
    /// After the workflow step of `workflow_action_id` could not finish (its error is in its
    /// span).
    pub fn after_error(workflow_action_id: Uuid) -> CommitMeta {
        CommitMeta {
            workflow_action_id: Some(workflow_action_id),
            task_status: TaskStatus::Error,
            summary: None,
        }
    }
}

/// The `commit` span's meta, written once per outcome (its error, if any, is under `error`:
/// `ErrorMeta`; a tampered worktree also sets `tampered`: `OutcomeSpanMeta`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CommitSpanMeta {
    /// Whether the step made a commit (every finished commit span says).
    #[serde(default)]
    pub committed: bool,
    /// How a task that did not complete ended (nothing is committed then).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub task_status: Option<TaskStatus>,
    /// The workflow action committed for (`null` for a task that did not complete and whose
    /// commit names none).
    #[serde(
        default,
        deserialize_with = "null_or_value",
        skip_serializing_if = "Option::is_none"
    )]
    pub workflow_action_id: Option<Option<Uuid>>,
    /// The workflow agent's summary of a task that did not complete (`null`: it gave none).
    #[serde(
        default,
        deserialize_with = "null_or_value",
        skip_serializing_if = "Option::is_none"
    )]
    pub task_summary: Option<Option<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub branch_name: Option<String>,
    /// The worktree, as displayed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub worktree_path: Option<String>,
    /// What the task changed, staged.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub diff: Option<crate::git::DiffSummary>,
    /// Nested repositories left out of the commit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub skipped_nested_repositories: Option<Vec<String>>,
    /// The task changed nothing (`committed` is false).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub no_changes: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message_source: Option<CommitMessageSource>,
    /// The commit message agent's call (or why the message fell back).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent: Option<crate::store::AgentMeta>,
    /// Where the commit hooks run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hooks: Option<crate::git::HookPlan>,
    /// The commit message (as the hooks left it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// The commit made.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sha: Option<String>,
    #[serde(flatten)]
    pub outcome: OutcomeSpanMeta,
}

impl CommitSpanMeta {
    /// The typed keys of a commit span's meta (other keys are ignored).
    pub fn read(meta: &Meta) -> Result<CommitSpanMeta, serde_json::Error> {
        serde_json::from_value(serde_json::Value::Object(meta.clone()))
    }
}

/// Where a commit message came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CommitMessageSource {
    /// The commit message agent wrote it.
    Agent,
    /// The task's title and summary (the agent could not).
    Fallback,
}

/// For a span meta key written `null` on some paths and left out on others: a present key,
/// `null` or a value, is `Some` (a missing key stays `None`: `default`).
#[allow(clippy::option_option)] // present-but-null differs from missing on disk
fn null_or_value<'de, D: serde::Deserializer<'de>, T: Deserialize<'de>>(
    d: D,
) -> Result<Option<Option<T>>, D::Error> {
    Option::<T>::deserialize(d).map(Some)
}

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
}

/// The `resolve` span's meta: the decision and what led to it, written once per outcome. A
/// quick exit (superseded, retries or waits used up, a tampered worktree) writes only its part;
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
    /// The agent's instructions for an `iterate` (`null`: it gave none; absent: no answer).
    #[serde(
        default,
        deserialize_with = "null_or_value",
        skip_serializing_if = "Option::is_none"
    )]
    pub instructions: Option<Option<String>>,
    /// The step a `retry` asked for (`null`: none; absent: no answer).
    #[serde(
        default,
        deserialize_with = "null_or_value",
        skip_serializing_if = "Option::is_none"
    )]
    pub retry_step: Option<Option<crate::agents::RetryStep>>,
    /// The agent's message for the channel (`null`: none; absent: no answer).
    #[serde(
        default,
        deserialize_with = "null_or_value",
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
        serde_json::from_value(serde_json::Value::Object(meta.clone()))
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
}

/// The corrective commands of a `retry` as they ran in the sandbox (`ran` with `runs`), or why
/// none could (`reason`, with the `commands` asked for).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CorrectiveRuns {
    pub ran: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runs: Option<Vec<super::sandboxed::CorrectiveRun>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub commands: Option<Vec<String>>,
}

impl CorrectiveRuns {
    pub fn ran(runs: Vec<super::sandboxed::CorrectiveRun>) -> CorrectiveRuns {
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

/// `push`: push the trace's branches and open or update the PR.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PushMeta {
    #[serde(default)]
    pub branches: Vec<String>,
}

/// How a push ended (`meta.status` of its span).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PushStatus {
    Pushed,
    /// The task branches could not be consolidated: the resolver decides.
    Conflict,
}

/// A consolidation conflict as the push span records it and the resolver reads it back.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PushConflict {
    pub source_branch: String,
    pub target: String,
    #[serde(default)]
    pub files: Vec<String>,
}

/// The `push` span's meta (its error, if any, is under `error`: `ErrorMeta`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PushSpanMeta {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<PushStatus>,
    /// The branch pushed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub branch: Option<String>,
    /// The task branches of the trace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub branches: Option<Vec<String>>,
    /// The task branches merged into the pushed one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub merged: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rebased: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub worktree: Option<std::path::PathBuf>,
    #[serde(flatten)]
    pub pull_request: crate::store::PushPullRequest,
    /// Why no pull request was opened (`none: local event`, ...).
    #[serde(
        default,
        rename = "pullRequest",
        skip_serializing_if = "Option::is_none"
    )]
    pub pull_request_note: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub conflict: Option<PushConflict>,
}

/// The part of a span's meta the resolver reads to find a consolidation conflict.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
pub struct ConflictSpanMeta {
    #[serde(default)]
    pub conflict: Option<PushConflict>,
}

impl ConflictSpanMeta {
    /// The conflict a span recorded (none, for a span whose meta has another shape there).
    pub fn of(span: &Span) -> Option<PushConflict> {
        serde_json::from_value::<ConflictSpanMeta>(serde_json::Value::Object(span.meta.clone()))
            .ok()
            .and_then(|m| m.conflict)
    }
}

/// Why a notify is sent; decides the message's shape and the channel's form (comment, review).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum NotifyPurpose {
    /// A direct answer or acknowledgement.
    #[default]
    Answer,
    /// A question the pipeline needs answered before it can go on.
    Clarify,
    /// Ask a human to look.
    Flag,
    /// Work was pushed: the PR and a summary.
    Pushed,
    /// Findings of a code review, posted as a PR review.
    Review,
    /// The trace could not do its job: why.
    Failure,
    /// A budget stopped the trace.
    Budget,
    /// CI passed on rover's pull request: it is ready for review.
    Ready,
}

impl NotifyPurpose {
    /// The name as serialized.
    pub fn as_str(self) -> &'static str {
        match self {
            NotifyPurpose::Answer => "answer",
            NotifyPurpose::Clarify => "clarify",
            NotifyPurpose::Flag => "flag",
            NotifyPurpose::Pushed => "pushed",
            NotifyPurpose::Review => "review",
            NotifyPurpose::Failure => "failure",
            NotifyPurpose::Budget => "budget",
            NotifyPurpose::Ready => "ready",
        }
    }
}

/// `notify`: answer on the channel the root event came from.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NotifyMeta {
    pub purpose: NotifyPurpose,
    /// A message drafted by the producing step (the notifier may rephrase it for the channel).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failed_step: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pr_url: Option<String>,
    /// Added by the orchestrator to the failure notify that trips the circuit breaker: posted
    /// after the message, so the trace is answered once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub breaker_note: Option<String>,
    /// Rover's own notify (the breaker's, a person's decision): not a trace outcome for the
    /// circuit breaker (`circuitBreaker`, read below the steps as `store::NotifyHeader`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub circuit_breaker: bool,
}

impl NotifyMeta {
    /// The purpose of a notify action's meta, read alone (none when it does not parse).
    pub fn purpose_of(meta: &Meta) -> Option<NotifyPurpose> {
        #[derive(Deserialize)]
        struct Purpose {
            purpose: Option<NotifyPurpose>,
        }
        serde_json::from_value::<Purpose>(serde_json::Value::Object(meta.clone()))
            .ok()
            .and_then(|p| p.purpose)
    }
}

impl NotifyMeta {
    pub fn failure(step: &StepKind, error: &str) -> NotifyMeta {
        NotifyMeta {
            purpose: NotifyPurpose::Failure,
            message: None,
            failed_step: Some(step.to_string()),
            error: Some(error.to_owned()),
            pr_url: None,
            breaker_note: None,
            circuit_breaker: false,
        }
    }
}

/// The `notify` span's meta: the message as sent and where it went. A local answer records
/// `channel: "local"`; a GitHub one the channel and the delivery ([`NotifyDelivery`]).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NotifySpanMeta {
    #[serde(default)]
    pub purpose: NotifyPurpose,
    #[serde(default)]
    pub visibility: Visibility,
    /// The message as posted (redacted for the channel).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message_source: Option<MessageSource>,
    /// The agent call's figures, or why it failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent: Option<crate::store::AgentMeta>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub channel: Option<NotifyChannel>,
    /// How the message was delivered on GitHub (none for the local channel).
    #[serde(flatten)]
    pub delivery: Option<NotifyDelivery>,
}

impl NotifySpanMeta {
    /// What a notify span recorded (none, for a span whose meta has other shapes).
    pub fn of(span: &Span) -> Option<NotifySpanMeta> {
        serde_json::from_value(serde_json::Value::Object(span.meta.clone())).ok()
    }

    /// The message, when it was answered on the local channel (the trace holds it).
    pub fn local_answer(&self) -> Option<&str> {
        self.channel
            .as_ref()
            .filter(|c| c.is_local())
            .and(self.message.as_deref())
    }
}

/// Where a message came from: the agent, or the deterministic fallback when the agent failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum MessageSource {
    Agent,
    Fallback,
}

/// The channel a notify span records: `"local"`, a GitHub channel as [`Channel`] serializes
/// it, or another implementation's `{"type": "local"}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum NotifyChannel {
    Github(Channel),
    /// `local`.
    Named(String),
    Typed {
        #[serde(rename = "type")]
        kind: String,
    },
}

impl NotifyChannel {
    /// The local channel, as rover writes it.
    pub fn local() -> NotifyChannel {
        NotifyChannel::Named("local".into())
    }

    /// Whether the answer went to the local channel (the trace).
    pub fn is_local(&self) -> bool {
        match self {
            NotifyChannel::Github(channel) => *channel == Channel::Local,
            NotifyChannel::Named(name) | NotifyChannel::Typed { kind: name } => name == "local",
        }
    }
}

/// A GitHub delivery: where the post can be seen (`url` and `commentId` are `null` when
/// GitHub did not say), and whether an earlier post was found instead.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NotifyDelivery {
    pub url: Option<String>,
    pub comment_id: Option<u64>,
    pub already_posted: bool,
}

/// What decided a `coordinate` run's outcome (`meta.decidedBy` of its span).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DecidedBy {
    /// The coordinator agent.
    Agent,
    /// A fixed rule (a merged rover pull request is cleaned up).
    Rule,
    /// The trust check: an untrusted author's event is a `noop`.
    Trust,
    /// A look at the CI of a pull request rover pushed.
    Ci,
    /// A scheduled re-evaluation of a wait that a newer trace took over.
    Wait,
    /// A value this rover does not write (another implementation's).
    #[serde(other)]
    Other,
}

/// The part of a deciding span's meta (`coordinate`, `resolve`, `plan`) that later runs read
/// back: what was decided, by what, and whether a newer trace took the decision over. The
/// steps write these keys with the rest of their span meta.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DecisionSpanMeta {
    /// `noop`, `plan`, ... for the coordinator; `push`, `fail`, ... for the resolver.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decision: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decided_by: Option<DecidedBy>,
    /// The trace that took a scheduled re-evaluation over.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub superseded_by: Option<String>,
}

impl DecisionSpanMeta {
    /// What a span recorded of its decision (nothing, for a span whose meta has other shapes
    /// under these keys).
    pub fn of(span: &Span) -> DecisionSpanMeta {
        serde_json::from_value(serde_json::Value::Object(span.meta.clone())).unwrap_or_default()
    }

    /// Whether a coordinator's look at CI found it red (a failed `coordinate` decided by CI).
    pub fn is_red_ci(span: &Span) -> bool {
        span.step == StepKind::Coordinate
            && span.status == crate::store::SpanStatus::Failed
            && DecisionSpanMeta::of(span).decided_by == Some(DecidedBy::Ci)
    }
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
        deserialize_with = "null_kept",
        skip_serializing_if = "Option::is_none"
    )]
    pub trust: Option<Option<crate::github::TrustDecision>>,
    /// The rover pull request the event is about: `null` when the agent decided about another.
    #[serde(
        default,
        deserialize_with = "null_kept",
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
        deserialize_with = "null_kept",
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
}

impl CoordinateSpanMeta {
    /// A run that decided `decision`, decided by `by`; the rest is filled by the caller.
    pub fn decided(decision: &str, by: DecidedBy) -> CoordinateSpanMeta {
        CoordinateSpanMeta {
            decided: DecisionSpanMeta {
                decision: Some(decision.to_owned()),
                decided_by: Some(by),
                superseded_by: None,
            },
            ..CoordinateSpanMeta::default()
        }
    }

    /// What a coordinate span recorded (nothing, for a span whose meta has other shapes).
    pub fn of(span: &Span) -> CoordinateSpanMeta {
        serde_json::from_value(serde_json::Value::Object(span.meta.clone())).unwrap_or_default()
    }
}

/// A key written either with a value or as `null`: present (`Some`) even when `null` (a
/// missing key stays `None`: `default`).
#[allow(clippy::option_option)] // present-but-null differs from missing on disk
fn null_kept<'de, D, T>(d: D) -> Result<Option<Option<T>>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Deserialize<'de>,
{
    Option::<T>::deserialize(d).map(Some)
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

/// What the resolver reads of any span about how a task's run went wrong, written by the
/// steps that find it (`workflow`, `commit`): the task never started because a dependency
/// failed, or its sandbox tampered with the worktree's git metadata.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct OutcomeSpanMeta {
    /// The dependency (a workflow action of the same plan) whose failure kept this task from
    /// starting: not the task to iterate on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dependency_failed: Option<Uuid>,
    /// The sandbox changed the worktree's git metadata: nothing of it is trusted.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub tampered: bool,
}

impl OutcomeSpanMeta {
    /// What a span recorded (nothing, for a span whose meta has other shapes under these keys).
    pub fn of(span: &Span) -> OutcomeSpanMeta {
        serde_json::from_value(serde_json::Value::Object(span.meta.clone())).unwrap_or_default()
    }

    /// Whether the span's sandbox tampered with the worktree, by its flag or its error's.
    pub fn is_tampered(span: &Span) -> bool {
        OutcomeSpanMeta::of(span).tampered
            || crate::store::ErrorMeta::of(span).is_some_and(|e| e.tampered)
    }
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

/// How the reason of a `noop` that records a coordinator `wait` starts.
pub const WAIT_PREFIX: &str = "waiting:";

/// `noop`: end the trace, recording why nothing is done (the reason is the action's `reason`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NoopMeta {
    /// For a coordinator `wait`: the condition waited for (the next event's coordinator sees it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub waiting_for: Option<String>,
    /// For a wait: what it is about, as [`subject_key`] gives it (`#12`, `refs/heads/main`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subject: Option<String>,
    /// The event came from an untrusted author: no agent may look at this trace, not even to
    /// summarize it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub untrusted: bool,
}

/// The `noop` span's meta: why nothing is done, a one-line summary of what the trace evaluated
/// and where the summary came from, and for a wait what it waited for.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NoopSpanMeta {
    /// The action's reason.
    #[serde(default)]
    pub reason: String,
    #[serde(default)]
    pub summary: String,
    #[serde(default)]
    pub summary_source: SummarySource,
    /// For a coordinator `wait`: the condition waited for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub waiting_for: Option<String>,
    /// With `waitingFor`: what the wait is about ([`subject_key`]), `null` when nothing.
    #[serde(
        default,
        deserialize_with = "null_kept",
        skip_serializing_if = "Option::is_none"
    )]
    pub subject: Option<Option<String>>,
    /// The summarizing agent's call, answered or failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent: Option<crate::store::AgentMeta>,
}

impl NoopSpanMeta {
    /// What a noop span recorded (nothing, for a span whose meta has other shapes).
    pub fn of(span: &Span) -> NoopSpanMeta {
        serde_json::from_value(serde_json::Value::Object(span.meta.clone())).unwrap_or_default()
    }
}

/// Where a noop's summary came from (`summarySource`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum SummarySource {
    /// The summarizing agent.
    #[serde(rename = "agent")]
    Agent,
    /// The chain of span summaries (no agent, or the agent failed).
    #[default]
    #[serde(rename = "span summaries")]
    SpanSummaries,
    /// The chain of span summaries, because no agent may look at an untrusted event.
    #[serde(rename = "span summaries (untrusted event: no agent)")]
    SpanSummariesUntrusted,
}

/// `cleanup`: tear down the workspace of a rover task.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CleanupMeta {
    /// Workflow action ids whose task mappings to tear down.
    #[serde(default)]
    pub tasks: Vec<Uuid>,
    /// A branch to remove when no mapping names it any more.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub branch: Option<String>,
}

/// The `cleanup` span's meta: what happened to each task's resources, and what got in the way.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CleanupSpanMeta {
    #[serde(default)]
    pub tasks: Vec<crate::steps::cleanup::TaskCleanup>,
    #[serde(default)]
    pub notes: Vec<String>,
}

impl CleanupSpanMeta {
    /// What a cleanup span recorded (none, for a span whose meta has other shapes).
    pub fn of(span: &Span) -> Option<CleanupSpanMeta> {
        serde_json::from_value(serde_json::Value::Object(span.meta.clone())).ok()
    }
}

/// Where a trace's event came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum EventSource {
    Github,
    Local,
}

/// The root `event` span's meta: the normalized event and everything notify needs to answer on
/// the right channel with the right visibility.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EventMeta {
    pub source: EventSource,
    /// One line for lists: `IssuesEvent opened #12 by alice: title`.
    pub label: String,
    /// `IssuesEvent`, ..., or `LocalRequest`.
    #[serde(rename = "type")]
    pub kind: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub action: Option<String>,
    pub channel: Channel,
    pub visibility: Visibility,
    /// The GitHub event, normalized (GitHub events only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub event: Option<NormalizedEvent>,
    /// The request text (local events only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request: Option<String>,
}

impl EventMeta {
    pub fn to_meta(&self) -> Meta {
        match serde_json::to_value(self) {
            Ok(serde_json::Value::Object(map)) => map,
            _ => Meta::new(),
        }
    }

    /// Read the root span's meta back.
    pub fn of(root: &Span) -> Result<EventMeta, serde_json::Error> {
        serde_json::from_value(serde_json::Value::Object(root.meta.clone()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agents::CoordinateDecision;
    use crate::github::EventAction;

    fn serialized<T: Serialize>(v: T) -> String {
        serde_json::to_value(v)
            .expect("serializes")
            .as_str()
            .expect("a string")
            .to_owned()
    }

    #[test]
    fn as_str_names_each_variant_as_serialized() {
        use CoordinateDecision as C;
        use EventAction as A;
        use NotifyPurpose as P;
        for d in [
            C::Noop,
            C::Plan,
            C::Workflow,
            C::Notify,
            C::Wait,
            C::Flag,
            C::Cleanup,
        ] {
            assert_eq!(d.as_str(), serialized(d));
        }
        for p in [
            P::Answer,
            P::Clarify,
            P::Flag,
            P::Pushed,
            P::Review,
            P::Failure,
            P::Budget,
            P::Ready,
        ] {
            assert_eq!(p.as_str(), serialized(p));
        }
        for a in [
            A::Opened,
            A::Closed,
            A::Reopened,
            A::Labeled,
            A::ReadyForReview,
            A::ReviewRequested,
            A::Created,
            A::Submitted,
        ] {
            assert_eq!(a.as_str(), serialized(a));
        }
    }

    #[test]
    fn a_task_mapping_keeps_unknown_keys_and_reads_the_legacy_worktree_key() {
        let legacy = serde_json::json!({
            "taskId": "t1",
            "branchName": "rover/abc-x",
            "traceId": Uuid::nil(),
            "workflowSpanId": Uuid::nil(),
            "worktree": "/data/worktrees/abc",
            "otherTool": {"x": 1}
        });
        let m: crate::store::TaskMapping = serde_json::from_value(legacy).expect("parses");
        assert_eq!(
            m.worktree_path.as_deref(),
            Some(std::path::Path::new("/data/worktrees/abc"))
        );
        let back = serde_json::to_value(&m).expect("serializes");
        assert_eq!(back["otherTool"], serde_json::json!({"x": 1}));
        assert_eq!(back["worktreePath"], "/data/worktrees/abc");
        assert!(back.get("containerId").is_none(), "{back}");
    }

    #[test]
    fn the_push_span_meta_keeps_its_keys_and_a_null_pr_url() {
        let local = PushSpanMeta {
            status: Some(PushStatus::Pushed),
            branch: Some("rover/a".into()),
            pull_request: crate::store::PushPullRequest {
                pr_url: Some(None),
                ..Default::default()
            },
            pull_request_note: Some("none: local event".into()),
            ..PushSpanMeta::default()
        };
        let value = serde_json::to_value(&local).expect("serializes");
        assert_eq!(
            value,
            serde_json::json!({
                "status": "pushed", "branch": "rover/a", "prUrl": null,
                "pullRequest": "none: local event"
            })
        );
        let span = Span::root(Uuid::nil(), chrono::Utc::now(), to_meta(&local));
        let pr = crate::store::PushPullRequest::of(&span);
        assert_eq!(pr.pr_url, Some(None));
        assert!(!pr.exists());
        let conflict = PushSpanMeta {
            status: Some(PushStatus::Conflict),
            conflict: Some(PushConflict {
                source_branch: "rover/b".into(),
                target: "rover/a".into(),
                files: vec!["x.rs".into()],
            }),
            ..PushSpanMeta::default()
        };
        let span = Span::root(Uuid::nil(), chrono::Utc::now(), to_meta(&conflict));
        assert_eq!(span.meta["conflict"]["sourceBranch"], "rover/b");
        assert_eq!(ConflictSpanMeta::of(&span), conflict.conflict);
    }

    #[test]
    fn the_budget_reads_the_purpose_and_breaker_mark_the_notify_step_writes() {
        let own = NotifyMeta {
            purpose: NotifyPurpose::Failure,
            circuit_breaker: true,
            ..NotifyMeta::default()
        };
        let meta = to_meta(&own);
        assert_eq!(meta["circuitBreaker"], serde_json::json!(true));
        let header = crate::store::NotifyHeader::of(&meta);
        assert!(header.is_purpose("failure") && header.circuit_breaker);
        assert_eq!(NotifyMeta::purpose_of(&meta), Some(NotifyPurpose::Failure));
        let plain = to_meta(&NotifyMeta::failure(&StepKind::Push, "x"));
        assert!(!plain.contains_key("circuitBreaker"), "{plain:?}");
        assert!(!crate::store::NotifyHeader::of(&plain).circuit_breaker);
    }

    #[test]
    fn the_store_reads_the_label_the_event_step_writes() {
        let meta = EventMeta {
            source: EventSource::Local,
            label: "local request by me: x".into(),
            kind: "LocalRequest".into(),
            action: None,
            channel: Channel::Local,
            visibility: Visibility::Private,
            event: None,
            request: Some("x".into()),
        };
        let root = Span::root(Uuid::nil(), chrono::Utc::now(), meta.to_meta());
        assert_eq!(crate::store::event_label(&root), meta.label);
        let mut bare = root.clone();
        bare.meta.remove("label");
        bare.meta.insert("action".into(), serde_json::json!(7));
        assert_eq!(crate::store::event_label(&bare), "LocalRequest");
    }

    // h1: coordinate, noop, plan span metas

    /// `json` reads into `T` and serializes back to the same JSON.
    fn round_trips<T>(json: &serde_json::Value) -> T
    where
        T: Serialize + for<'de> Deserialize<'de>,
    {
        let record = T::deserialize(json).expect("reads");
        assert_eq!(&serde_json::to_value(&record).expect("serializes"), json);
        record
    }

    fn span_with<T: Serialize>(record: &T) -> Span {
        Span::root(Uuid::nil(), chrono::Utc::now(), to_meta(record))
    }

    #[test]
    fn the_coordinate_span_meta_keeps_its_keys_and_nulls() {
        // An agent's decision about a local request: trust, roverPr and wait written as null.
        let agent = round_trips::<CoordinateSpanMeta>(&serde_json::json!({
            "decision": "noop", "decidedBy": "agent", "confidence": 0.9, "reasoning": "why",
            "answer": {"decision": "noop", "confidence": 0.9, "reasoning": "why",
                "directive": null, "task": null, "message": null, "condition": null,
                "task_id": null},
            "trust": null, "roverPr": null, "wait": null,
            "openWaits": [{"traceId": Uuid::nil(), "at": "2026-01-02T03:04:05Z",
                "condition": "CI to finish"}],
            "agent": {"turns": 2, "costUsd": null, "inputTokens": 10, "outputTokens": 5,
                "cachedTokens": 0, "attempts": 1}
        }));
        assert_eq!(agent.trust, Some(None));
        assert_eq!(agent.rover_pr, Some(None));
        assert_eq!(agent.wait, Some(None));
        assert_eq!(agent.decided.decided_by, Some(DecidedBy::Agent));
        // A rule's cleanup of a rover pull request, with the trust verdict.
        let rule = round_trips::<CoordinateSpanMeta>(&serde_json::json!({
            "decision": "cleanup", "decidedBy": "rule", "confidence": 1.0, "reasoning": "merged",
            "roverPr": {"branch": "rover/a", "tasks": [[Uuid::nil(), "t-1"]]},
            "trust": {"trusted": true, "reason": "write access"}
        }));
        assert_eq!(
            rule.rover_pr,
            Some(Some(RoverPrMeta {
                branch: "rover/a".into(),
                tasks: vec![(Uuid::nil().to_string(), "t-1".into())],
            }))
        );
        // A wait a newer trace took over.
        round_trips::<CoordinateSpanMeta>(&serde_json::json!({
            "decision": "noop", "decidedBy": "wait", "supersededBy": "t2",
            "wait": {"condition": "CI", "subject": "#4", "since": "2026-01-02T03:04:05Z",
                "round": 1}
        }));
        // A red look at CI: its error is `ErrorMeta`, not part of the record.
        let mut red = serde_json::json!({
            "decision": "resolve", "decidedBy": "ci", "redLooks": 2,
            "ci": {"prNumber": 7, "prUrl": "u", "branch": "rover/a", "sha": "abc", "round": 1},
            "ciStatus": {"sha": "abc", "state": "failure", "failing": ["test"],
                "pending": [], "total": 2}
        });
        let look = round_trips::<CoordinateSpanMeta>(&red);
        red["error"] = serde_json::json!({"message": "CI failed", "retryable": false});
        let span = Span::root(
            Uuid::nil(),
            chrono::Utc::now(),
            red.as_object().unwrap().clone(),
        );
        assert_eq!(CoordinateSpanMeta::of(&span), look);
        assert!(DecisionSpanMeta::of(&span).decided_by == Some(DecidedBy::Ci));
        // Written, read back.
        let written = CoordinateSpanMeta {
            trust: Some(None),
            wait: Some(Some(WaitMeta {
                condition: "CI".into(),
                round: 2,
                ..WaitMeta::default()
            })),
            open_waits: Some(Vec::new()),
            ..CoordinateSpanMeta::decided("wait", DecidedBy::Agent)
        };
        let span = span_with(&written);
        assert_eq!(span.meta["trust"], serde_json::Value::Null);
        assert!(!span.meta.contains_key("roverPr"), "{:?}", span.meta);
        assert_eq!(CoordinateSpanMeta::of(&span), written);
        assert_eq!(DecisionSpanMeta::of(&span), written.decided);
    }

    #[test]
    fn the_noop_span_meta_keeps_its_keys_and_a_wait_without_subject() {
        let wait = round_trips::<NoopSpanMeta>(&serde_json::json!({
            "reason": "waiting: CI", "summary": "s", "summarySource": "span summaries",
            "waitingFor": "CI", "subject": null
        }));
        assert_eq!(wait.subject, Some(None));
        let failed = round_trips::<NoopSpanMeta>(&serde_json::json!({
            "reason": "r", "summary": "s", "summarySource": "span summaries",
            "agent": {"error": "refused", "errorClass": "auth"}
        }));
        assert!(matches!(
            failed.agent,
            Some(crate::store::AgentMeta::Failed(_))
        ));
        for (source, json) in [
            (SummarySource::Agent, "agent"),
            (SummarySource::SpanSummaries, "span summaries"),
            (
                SummarySource::SpanSummariesUntrusted,
                "span summaries (untrusted event: no agent)",
            ),
        ] {
            assert_eq!(serde_json::to_value(source).expect("serializes"), json);
        }
        let written = NoopSpanMeta {
            reason: "r".into(),
            summary: "s".into(),
            summary_source: SummarySource::SpanSummariesUntrusted,
            ..NoopSpanMeta::default()
        };
        let span = span_with(&written);
        assert!(!span.meta.contains_key("subject"), "{:?}", span.meta);
        assert!(!span.meta.contains_key("waitingFor"), "{:?}", span.meta);
        assert_eq!(NoopSpanMeta::of(&span), written);
    }

    #[test]
    fn the_plan_span_meta_keeps_its_keys() {
        let tasks = round_trips::<PlanSpanMeta>(&serde_json::json!({
            "decision": "tasks", "analysis": "two steps",
            "tasks": [
                {"taskId": "impl", "actionId": Uuid::nil(), "title": " Impl ",
                    "workflowType": "swe", "dependsOn": []},
                {"taskId": "review", "actionId": null, "title": "Review",
                    "workflowType": "code-review", "dependsOn": ["impl"]}
            ],
            "agent": {"turns": null, "costUsd": 0.1, "inputTokens": 1, "outputTokens": 2,
                "cachedTokens": 3}
        }));
        assert_eq!(tasks.decided.decision.as_deref(), Some("tasks"));
        round_trips::<PlanSpanMeta>(&serde_json::json!({
            "decision": "clarify", "analysis": "vague", "clarification": "Which one?"
        }));
        let written = PlanSpanMeta {
            decided: DecisionSpanMeta {
                decision: Some("empty".into()),
                ..DecisionSpanMeta::default()
            },
            analysis: "nothing".into(),
            ..PlanSpanMeta::default()
        };
        let span = span_with(&written);
        assert_eq!(PlanSpanMeta::of(&span), written);
        assert_eq!(PlanSpanMeta::of(&span_with(&tasks)), tasks);
    }

    // h3: notify, cleanup span metas

    /// Reads `written` as a span's meta and checks it serializes back to the same JSON.
    fn h3_round_trip<T: Serialize + for<'de> Deserialize<'de>>(written: &serde_json::Value) -> T {
        let read: T = serde_json::from_value(written.clone()).expect("reads");
        assert_eq!(&serde_json::to_value(&read).expect("serializes"), written);
        read
    }

    fn h3_span(meta: serde_json::Value) -> Span {
        let serde_json::Value::Object(map) = meta else {
            panic!("an object")
        };
        Span::root(Uuid::nil(), chrono::Utc::now(), map)
    }

    #[test]
    fn the_notify_span_meta_keeps_its_keys_and_the_delivery_nulls() {
        let local: NotifySpanMeta = h3_round_trip(&serde_json::json!({
            "purpose": "answer", "visibility": "private", "message": "It is 42.",
            "messageSource": "agent", "channel": "local",
            "agent": {"turns": 1, "costUsd": 0.01, "inputTokens": 5, "outputTokens": 7, "cachedTokens": 0}
        }));
        assert_eq!(local.delivery, None);
        assert_eq!(local.local_answer(), Some("It is 42."));
        let posted: NotifySpanMeta = h3_round_trip(&serde_json::json!({
            "purpose": "review", "visibility": "public", "message": "Findings.",
            "messageSource": "fallback", "agent": {"error": "no key", "errorClass": "auth"},
            "channel": {"kind": "prReview", "number": 4},
            "url": null, "commentId": null, "alreadyPosted": false
        }));
        assert_eq!(
            posted.channel,
            Some(NotifyChannel::Github(Channel::PrReview { number: 4 }))
        );
        assert_eq!(posted.delivery, Some(NotifyDelivery::default()));
        assert_eq!(posted.local_answer(), None);
        let found: NotifySpanMeta = h3_round_trip(&serde_json::json!({
            "purpose": "answer", "visibility": "public", "message": "m", "messageSource": "agent",
            "agent": {"turns": null, "costUsd": null, "inputTokens": 0, "outputTokens": 0, "cachedTokens": 0},
            "channel": {"kind": "reviewThreadReply", "number": 2, "commentId": 5},
            "url": "https://github.com/o/r/pull/2#discussion_r9", "commentId": 9, "alreadyPosted": true
        }));
        let delivery = found.delivery.expect("a delivery");
        assert_eq!(
            (delivery.comment_id, delivery.already_posted),
            (Some(9), true)
        );
    }

    #[test]
    fn a_written_notify_span_meta_reads_back_equal_and_local_takes_every_shape() {
        let written = NotifySpanMeta {
            purpose: NotifyPurpose::Pushed,
            visibility: Visibility::Public,
            message: Some("Pushed.".into()),
            message_source: Some(MessageSource::Agent),
            agent: Some(crate::store::AgentMeta::Used(crate::store::AgentUsage {
                turns: Some(2),
                ..crate::store::AgentUsage::default()
            })),
            channel: Some(NotifyChannel::Github(Channel::IssueComment { number: 3 })),
            delivery: Some(NotifyDelivery {
                url: Some("https://github.com/o/r/issues/3#issuecomment-1".into()),
                comment_id: Some(1),
                already_posted: false,
            }),
        };
        let span = h3_span(serde_json::to_value(&written).expect("serializes"));
        assert_eq!(span.meta["channel"]["kind"], "issueComment");
        assert_eq!(span.meta["commentId"], 1);
        assert_eq!(NotifySpanMeta::of(&span), Some(written));
        let local = NotifySpanMeta {
            message: Some("hi".into()),
            channel: Some(NotifyChannel::local()),
            ..NotifySpanMeta::default()
        };
        let span = h3_span(serde_json::to_value(&local).expect("serializes"));
        assert_eq!(span.meta["channel"], "local");
        assert!(!span.meta.contains_key("alreadyPosted"), "{:?}", span.meta);
        assert_eq!(NotifySpanMeta::of(&span), Some(local));
        // Another implementation's local channel, and the local channel as `Channel` writes it.
        for channel in [
            serde_json::json!({"type": "local"}),
            serde_json::json!({"kind": "local"}),
        ] {
            let span = h3_span(serde_json::json!({"message": "hi", "channel": channel}));
            let read = NotifySpanMeta::of(&span).expect("reads");
            assert_eq!(read.local_answer(), Some("hi"), "{channel}");
        }
        let github = h3_span(
            serde_json::json!({"message": "hi", "channel": {"kind": "prComment", "number": 1}}),
        );
        assert_eq!(
            NotifySpanMeta::of(&github).expect("reads").local_answer(),
            None
        );
    }

    #[test]
    fn the_cleanup_span_meta_keeps_its_keys() {
        use crate::steps::cleanup::{Piece, TaskCleanup};
        let read: CleanupSpanMeta = h3_round_trip(&serde_json::json!({
            "tasks": [{
                "workflowActionId": "00000000-0000-0000-0000-000000000001",
                "branch": "rover/a",
                "containers": {"result": "notApplicable"},
                "worktree": {"result": "removed"},
                "branchRemoval": {"result": "failed", "detail": "the branch is checked out"},
                "mapping": {"result": "alreadyGone"}
            }, {
                "workflowActionId": null, "branch": null,
                "containers": {"result": "alreadyGone"}, "worktree": {"result": "alreadyGone"},
                "branchRemoval": {"result": "notApplicable"}, "mapping": {"result": "notApplicable"}
            }],
            "notes": ["cannot open the repository: gone"]
        }));
        assert_eq!(
            read.tasks[0].branch_removal,
            Piece::Failed("the branch is checked out".into())
        );
        let written = CleanupSpanMeta {
            tasks: vec![TaskCleanup {
                workflow_action_id: Some(Uuid::nil()),
                branch: Some("rover/b".into()),
                containers: Piece::Removed,
                worktree: Piece::AlreadyGone,
                branch_removal: Piece::Removed,
                mapping: Piece::Removed,
            }],
            notes: Vec::new(),
        };
        let span = h3_span(serde_json::to_value(&written).expect("serializes"));
        assert_eq!(span.meta["notes"], serde_json::json!([]));
        assert_eq!(CleanupSpanMeta::of(&span), Some(written));
    }

    // h2: resolve, commit span metas
    fn h2_round_trip<T>(written: &serde_json::Value) -> T
    where
        T: Serialize + for<'de> Deserialize<'de>,
    {
        let serde_json::Value::Object(meta) = written.clone() else {
            panic!("an object")
        };
        let read: T = serde_json::from_value(serde_json::Value::Object(meta)).expect("reads");
        assert_eq!(&serde_json::to_value(&read).expect("serializes"), written);
        read
    }

    #[test]
    fn the_commit_span_meta_keeps_its_keys_and_nulls() {
        use serde_json::json;
        let workflow = Uuid::new_v4();
        let agent = json!({"turns": 1, "costUsd": 0.01, "inputTokens": 10, "outputTokens": 5,
            "cachedTokens": 0, "attempts": 1});
        // A commit made, its hooks on the host.
        let committed = json!({
            "committed": true, "workflowActionId": workflow, "branchName": "rover/a",
            "worktreePath": "/data/worktrees/a",
            "diff": {"filesChanged": 1, "insertions": 2, "deletions": 0, "files": ["a.rs"]},
            "skippedNestedRepositories": ["vendor/x"], "messageSource": "agent",
            "agent": agent, "hooks": {"runs": "host", "dir": "/data/hooks"},
            "message": "Add a\n\nbody", "sha": "0123456789abcdef"
        });
        let read: CommitSpanMeta = h2_round_trip(&committed);
        assert!(read.committed);
        assert_eq!(read.workflow_action_id, Some(Some(workflow)));
        assert_eq!(read.message_source, Some(CommitMessageSource::Agent));
        assert_eq!(
            read.agent
                .as_ref()
                .and_then(|a| a.usage())
                .map(|u| u.input_tokens),
            Some(10)
        );
        assert_eq!(read.diff.as_ref().map(|d| d.files_changed), Some(1));
        // A task that did not complete and named no workflow nor summary: the nulls stay.
        let failed_task = json!({"committed": false, "taskStatus": "failed",
            "workflowActionId": null, "taskSummary": null});
        let read: CommitSpanMeta = h2_round_trip(&failed_task);
        assert_eq!(read.task_status, Some(TaskStatus::Failed));
        assert_eq!(read.workflow_action_id, Some(None));
        assert_eq!(read.task_summary, Some(None));
        // Nothing to commit; a tampered worktree whose hooks would run in a sandbox, the
        // fallback message (its error is `ErrorMeta`'s, not read here).
        let nothing = json!({"committed": false, "noChanges": true, "workflowActionId": workflow,
            "branchName": "rover/a", "worktreePath": "/w", "skippedNestedRepositories": [],
            "diff": {"filesChanged": 0, "insertions": 0, "deletions": 0, "files": []}});
        assert!(h2_round_trip::<CommitSpanMeta>(&nothing).no_changes);
        let tampered = json!({"committed": false, "tampered": true, "workflowActionId": workflow,
            "messageSource": "fallback",
            "agent": {"error": "auth failed", "errorClass": "auth"},
            "hooks": {"runs": "sandbox", "location": {"in": "worktree", "relative": ".husky"},
                "reason": "the hooks are in the worktree"},
            "message": "m"});
        let read: CommitSpanMeta = h2_round_trip(&tampered);
        assert!(read.outcome.tampered);
        assert!(matches!(
            read.agent,
            Some(crate::store::AgentMeta::Failed(_))
        ));
        let mut with_error = tampered.as_object().cloned().expect("an object");
        with_error.insert("error".into(), json!({"message": "x", "retryable": false}));
        assert_eq!(CommitSpanMeta::read(&with_error).expect("reads"), read);
        // A record written reads back equal, absent keys staying absent.
        let written = CommitSpanMeta {
            committed: true,
            workflow_action_id: Some(Some(workflow)),
            branch_name: Some("rover/b".into()),
            sha: Some("abc".into()),
            hooks: Some(crate::git::HookPlan::Host { dir: "/h".into() }),
            ..CommitSpanMeta::default()
        };
        let meta = to_meta(&written);
        assert!(!meta.contains_key("taskSummary") && !meta.contains_key("noChanges"));
        assert!(!meta.contains_key("tampered"), "{meta:?}");
        assert_eq!(CommitSpanMeta::read(&meta).expect("reads"), written);
    }

    #[test]
    fn the_resolve_span_meta_keeps_its_keys_and_nulls() {
        use crate::agents::{CorrectiveCommand, ResolveDecision, RetryStep};
        use serde_json::json;
        let agent = json!({"turns": null, "costUsd": null, "inputTokens": 3, "outputTokens": 4,
            "cachedTokens": 1});
        // An agent's retry, its corrective command run in the sandbox.
        let retry = json!({
            "decision": "retry", "agentDecision": "retry", "reasoning": "npm was missing",
            "correctiveCommands": [{"command": "npm ci", "purpose": "install"}],
            "correctiveRuns": {"ran": true, "runs": [{"command": "npm ci", "exitCode": 0,
                "timedOut": false, "output": "ok"}]},
            "instructions": null, "retryStep": "commit", "message": null,
            "retries": 1, "maxRetries": 3, "workdir": "/data/agent-cwd", "agent": agent
        });
        let read: ResolveSpanMeta = h2_round_trip(&retry);
        assert_eq!(read.decision.decision.as_deref(), Some("retry"));
        assert_eq!(read.agent_decision, Some(ResolveDecision::Retry));
        assert_eq!(read.retry_step, Some(Some(RetryStep::Commit)));
        assert_eq!(read.instructions, Some(None));
        assert_eq!(
            read.corrective_runs
                .as_ref()
                .and_then(|r| r.runs.as_ref())
                .map(|runs| runs[0].succeeded()),
            Some(true)
        );
        // The commands could not run; a timed-out run has no exit code.
        let not_run = json!({"decision": "retry", "correctiveRuns": {"ran": false,
            "reason": "the trace has no task worktree to run them in", "commands": ["make"]}});
        let read: ResolveSpanMeta = h2_round_trip(&not_run);
        assert_eq!(
            read.corrective_runs,
            Some(CorrectiveRuns::not_run(
                "the trace has no task worktree to run them in".into(),
                vec!["make".into()]
            ))
        );
        h2_round_trip::<ResolveSpanMeta>(&json!({"correctiveRuns": {"ran": true, "runs": [
            {"command": "sleep 9", "exitCode": null, "timedOut": true, "output": ""}]}}));
        // An iterate on a conflict, as the push span records the conflict.
        let workflow = Uuid::new_v4();
        let conflict = json!({"decision": "iterate", "agentDecision": "iterate",
            "iterateOn": workflow,
            "conflict": {"sourceBranch": "rover/b", "target": "rover/a", "files": ["x.rs"]}});
        let read: ResolveSpanMeta = h2_round_trip(&conflict);
        assert_eq!(read.iterate_on, Some(workflow));
        let span = Span::root(Uuid::nil(), chrono::Utc::now(), to_meta(&read));
        assert_eq!(ConflictSpanMeta::of(&span), read.conflict);
        // The quick exits and a wait.
        let span_id = Uuid::new_v4();
        for quick in [
            json!({"decision": "fail", "reasoning": "r", "retries": 3, "maxRetries": 3,
                "quickExit": "maxRetries", "correctiveCommands": []}),
            json!({"decision": "fail", "reasoning": "r", "quickExit": "tampered",
                "tamperedSpan": span_id}),
            json!({"decision": "fail", "reasoning": "r", "quickExit": "maxWaits", "agent": agent}),
            json!({"decision": "fail", "quickExit": "conflictUnchanged", "agentDecision": "push"}),
            json!({"supersededBy": span_id}),
            json!({"decision": "wait", "reasoning": "CI runs",
                "wait": {"round": 1, "max": 3, "notBefore": "2026-01-02T03:04:05Z"},
                "correctiveCommands": [], "agent": agent}),
        ] {
            let read: ResolveSpanMeta = h2_round_trip(&quick);
            assert_eq!(
                serde_json::to_value(read.quick_exit).expect("serializes"),
                quick
                    .get("quickExit")
                    .cloned()
                    .unwrap_or(serde_json::Value::Null)
            );
        }
        let span = Span::root(
            Uuid::nil(),
            chrono::Utc::now(),
            to_meta(&json!({"supersededBy": span_id})),
        );
        assert_eq!(
            DecisionSpanMeta::of(&span).superseded_by,
            Some(span_id.to_string())
        );
        // A record written reads back equal, and what it leaves out stays out.
        let written = ResolveSpanMeta {
            decision: DecisionSpanMeta {
                decision: Some("push".into()),
                ..DecisionSpanMeta::default()
            },
            agent_decision: Some(ResolveDecision::Push),
            corrective_commands: Some(vec![CorrectiveCommand {
                command: "true".into(),
                purpose: "p".into(),
            }]),
            message: Some(Some("done".into())),
            retry_step: Some(None),
            ..ResolveSpanMeta::default()
        };
        let meta = to_meta(&written);
        assert_eq!(meta["retryStep"], serde_json::Value::Null);
        assert!(!meta.contains_key("instructions") && !meta.contains_key("quickExit"));
        assert_eq!(ResolveSpanMeta::read(&meta).expect("reads"), written);
    }
}
