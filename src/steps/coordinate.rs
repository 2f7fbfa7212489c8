//! The `coordinate` step: decides what rover does about a trace's root event.
//!
//! Trust first, without AI: a GitHub event from an author without write access ends in `noop`;
//! a lookup that fails transiently is retried with the orchestrator's backoff. A merged pull request rover opened ends in `cleanup` by rule.
//! Everything else goes to the agent (read-only tools in the checkout) with the event, the
//! GitHub context, the trace so far, rover's task mappings and the open waits of the same issue
//! or PR; its decision becomes exactly one action with typed meta.
//!
//! A `wait` is a scheduled re-evaluation: a `coordinate` action of the same trace that runs at
//! its deadline (`pipeline.waitSecs`), at most `pipeline.maxWaits` times. A newer trusted event
//! about the same issue or pull request takes it over at once: the newer trace decides, with the
//! wait among its open waits, and the waiting action ends saying which trace took over; a CI
//! outcome for the pull request's head (webhook) makes it re-evaluate at once.
//!
//! After a push, a scheduled `coordinate` with `meta.ci` looks at the pushed commit's CI without
//! AI: red → `resolve` (at most `maxRetries` red looks per trace, then a failure notify), green →
//! a `ready` notify, still running → another look.

use std::fmt::Write as _;
use std::sync::Arc;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use serde::Serialize;
use uuid::Uuid;

use super::agent_call::{
    agent_error, ask, event_meta, load_trace, render_trace, task_mappings, MappedTask,
};
pub use super::meta::OpenWait;
use super::meta::{
    subject_key, CiWatchMeta, CleanupMeta, CoordinateMeta, CoordinateSpanMeta, DecidedBy,
    DecisionSpanMeta, EventMeta, EventSource, NoopMeta, NotifyMeta, NotifyPurpose, PlanMeta,
    RoverPrMeta, WaitMeta, WAIT_PREFIX,
};
use super::plan::workflow_meta;
use super::trust_check::trust_unknown;
use super::Services;
use crate::agents::{untrusted_block, AgentStep, CoordinateDecision, CoordinateResult, PromptVars};
use crate::github::{
    build_context, CiState, CiStatus, EventAction, EventKind, NormalizedEvent, TrustDecision,
    TrustPolicy, Visibility,
};
use crate::orchestrator::{Finished, NextAction, Outcome, Step, StepContext, StepError};
use crate::store::blocking;
use crate::store::{AutopilotStore, StepKind, StepRun};

/// How many recent traces are searched for open waits of the same issue or PR.
const WAIT_LOOKBACK: usize = 50;
/// How many open waits are shown to the agent.
const MAX_WAITS: usize = 5;
/// The prompt heading of a run that re-evaluates the trace's own wait.
pub const REEVALUATION_HEADING: &str = "## Re-evaluating a wait";

/// The task mappings of a pull request rover opened (its head branch is a task's branch).
#[derive(Debug, Clone)]
struct RoverPr {
    branch: String,
    /// Workflow action ids (the mapping keys) with their task ids.
    tasks: Vec<(String, String)>,
    /// The same keys read as workflow action ids.
    workflow_action_ids: Vec<Uuid>,
}

impl RoverPr {
    fn find(branch: Option<&str>, mappings: &[MappedTask]) -> Option<RoverPr> {
        let branch = branch.filter(|b| !b.is_empty())?;
        let mut of_branch: Vec<&MappedTask> = mappings
            .iter()
            .filter(|t| t.mapping.branch_name == branch)
            .collect();
        // A consolidated pull request carries every task of the trace that opened it, each on
        // its own branch: the head's tasks first (an iteration reuses the first), then the rest.
        let traces: std::collections::BTreeSet<Uuid> =
            of_branch.iter().map(|t| t.mapping.trace_id).collect();
        of_branch.extend(
            mappings.iter().filter(|t| {
                t.mapping.branch_name != branch && traces.contains(&t.mapping.trace_id)
            }),
        );
        (!of_branch.is_empty()).then(|| RoverPr {
            branch: branch.to_owned(),
            tasks: of_branch
                .iter()
                .map(|t| (t.key.clone(), t.mapping.task_id.clone()))
                .collect(),
            workflow_action_ids: of_branch
                .iter()
                .filter_map(|t| t.workflow_action_id)
                .collect(),
        })
    }

    /// The workflow action whose task an iteration reuses: the first mapping.
    fn existing_task(&self) -> Option<Uuid> {
        self.workflow_action_ids.first().copied()
    }

    /// As the coordinate span records it.
    fn record(&self) -> RoverPrMeta {
        RoverPrMeta {
            branch: self.branch.clone(),
            tasks: self.tasks.clone(),
        }
    }

    fn cleanup(&self) -> CleanupMeta {
        CleanupMeta {
            tasks: self.workflow_action_ids.clone(),
            branch: Some(self.branch.clone()),
        }
    }
}

/// What the coordinator knows before asking the agent.
struct Gathered {
    /// The event as the prompt shows it.
    event: String,
    /// The GitHub context (untrusted block), the trace so far and the open waits.
    context: String,
    subject: Option<String>,
    rover_pr: Option<RoverPr>,
    merged: bool,
    open_waits: Vec<OpenWait>,
    trust: Option<TrustDecision>,
    /// How many waits this trace decided before this run.
    wait_round: u32,
    /// The pull request's head commit (or the pushed commit): a CI outcome for it wakes a wait.
    head_sha: Option<String>,
}

/// How long a wait lasts and how many one trace may decide (from `pipeline`).
#[derive(Debug, Clone, Copy)]
struct WaitPolicy {
    secs: u64,
    max: u32,
    now: DateTime<Utc>,
}

pub struct CoordinateStep {
    services: Arc<Services>,
    /// Kept across runs: its permission cache saves lookups.
    trust: TrustPolicy,
}

impl CoordinateStep {
    pub fn new(services: Arc<Services>) -> CoordinateStep {
        let trust = TrustPolicy::new(&services.config.autopilot.github.trust);
        CoordinateStep { services, trust }
    }

    /// One look at the CI of a pull request rover pushed (no AI): red hands over to the
    /// resolver with the failing checks as this span's error (after `maxRetries` red looks in
    /// the trace, to a failure notify instead, whatever the resolver would say), green to a
    /// `ready` notify, pending to the next look; a pull request no longer open is not followed.
    async fn look_at_ci(
        &self,
        watch: CiWatchMeta,
        view: &crate::store::TraceView,
    ) -> Result<Outcome, StepError> {
        let github = self.services.github.as_ref().ok_or_else(|| {
            StepError::fatal("rover has no GitHub client to look at the pull request's CI")
        })?;
        let gh_error = |what: &str, e: &crate::github::GitHubError| {
            StepError::from_error(e, e.is_retryable())
                .not_before(e.retry_at())
                .detail("what", what)
                .detail("prNumber", watch.pr_number)
        };
        let pipeline = &self.services.config.autopilot.pipeline;
        let pr = github
            .get_pull_request(watch.pr_number)
            .await
            .map_err(|e| gh_error("reading the pull request", &e))?;
        let mut span_meta = CoordinateSpanMeta {
            ci: Some(watch.clone()),
            ..CoordinateSpanMeta::decided("noop", DecidedBy::Ci)
        };
        if pr.state != crate::github::IssueState::Open {
            let reason = format!(
                "pull request #{} is {}: its CI is no longer followed",
                pr.number,
                if pr.merged { "merged" } else { "closed" }
            );
            return Ok(Outcome::Finished(
                Finished::completed(format!("decided noop: {reason}")).with_meta_record(&span_meta),
            ));
        }
        let status = github
            .ci_status(&watch.sha)
            .await
            .map_err(|e| gh_error("reading the CI status", &e))?;
        let verdict = ci_verdict(&status, watch.round, pipeline.ci_max_polls);
        let sha = short_sha(&watch.sha);
        let (decision, done) = match verdict {
            CiVerdict::Again => {
                let next = CiWatchMeta {
                    round: watch.round + 1,
                    ..watch.clone()
                };
                let done = Finished::completed(format!(
                    "CI of pull request #{} at {sha} is still running ({} pending of {}): looking again later",
                    watch.pr_number,
                    status.pending.len(),
                    status.total
                ))
                .then(ci_watch_action(next, pipeline, Utc::now()));
                ("wait", done)
            }
            CiVerdict::GiveUp => ("noop", Finished::completed(format!(
                "decided noop: CI of pull request #{} at {sha} had no outcome after {} looks; rover stops following it",
                watch.pr_number, watch.round
            ))),
            CiVerdict::NoCi => ("noop", Finished::completed(format!(
                "decided noop: no check or status was reported for pull request #{} at {sha} in {} looks: the repository seems to have no CI",
                watch.pr_number, watch.round
            ))),
            CiVerdict::Green => {
                let reason = format!(
                    "CI passed on pull request #{} at {sha} ({} checks)",
                    watch.pr_number, status.total
                );
                let done = Finished::completed(format!("decided notify: {reason}")).then(
                    NextAction::new(StepKind::Notify, format!("{reason}: it is ready")).with_meta(
                        &NotifyMeta {
                            purpose: NotifyPurpose::Ready,
                            message: Some(format!(
                                "CI passed on pull request #{}; it is ready for review.",
                                watch.pr_number
                            )),
                            pr_url: Some(watch.pr_url.clone()),
                            ..NotifyMeta::default()
                        },
                    ),
                );
                ("notify", done)
            }
            CiVerdict::Red(failing) => {
                // Check names come from the repository's CI: data for the resolver, not orders.
                let message = format!(
                    "CI failed on rover's pull request #{} at {sha}: {}",
                    watch.pr_number,
                    failing.join(", ")
                );
                let mut finished = Finished::failed(message.clone());
                StepError::fatal(message.clone())
                    .detail("failingChecks", &failing)
                    .detail("prNumber", watch.pr_number)
                    .detail("prUrl", &watch.pr_url)
                    .detail("sha", &watch.sha)
                    .detail("branch", &watch.branch)
                    .to_meta()
                    .put_into(&mut finished.meta);
                let earlier = red_looks(view);
                span_meta.red_looks = Some(earlier + 1);
                let max = pipeline.max_retries;
                if earlier >= max {
                    let why = format!(
                        "{message}; CI was red {} time(s) in this trace, the most `pipeline.maxRetries` ({max}) allows",
                        earlier + 1
                    );
                    finished = finished.then(
                        NextAction::new(StepKind::Notify, format!("the trace failed: {why}"))
                            .with_meta(&NotifyMeta {
                                pr_url: Some(watch.pr_url.clone()),
                                ..NotifyMeta::failure(&StepKind::Coordinate, &why)
                            }),
                    );
                } else {
                    finished = finished.then(NextAction::new(
                        StepKind::Resolve,
                        format!("{message}: decide how to fix it on `{}`", watch.branch),
                    ));
                }
                ("resolve", finished)
            }
        };
        span_meta.decided.decision = Some(decision.to_owned());
        span_meta.ci_status = Some(status);
        Ok(Outcome::Finished(done.with_meta_record(&span_meta)))
    }

    /// Trust, context and rover-PR detection for a GitHub event; `Err(finished)` when the
    /// author is not trusted (the run ends there, without AI).
    async fn gather_github(
        &self,
        meta: &EventMeta,
        event: &NormalizedEvent,
        mappings: &[MappedTask],
        attempt: u32,
    ) -> Result<Result<Gathered, Finished>, StepError> {
        let github = self.services.github.as_ref().ok_or_else(|| {
            StepError::fatal(
                "this trace is a GitHub event but rover has no GitHub client: set GITHUB_TOKEN and the repository",
            )
        })?;
        let trust = match self.trust.decide(github.as_ref(), &event.actor).await {
            Ok(trust) => trust,
            Err(e) => {
                return trust_unknown(&self.services, &event.actor, &e, attempt).map(Err);
            }
        };
        if !trust.trusted {
            let reason = format!("untrusted author: {}", trust.reason);
            return Ok(Err(Finished::completed(format!("decided noop: {reason}"))
                .with_meta_record(&CoordinateSpanMeta {
                    trust: Some(Some(trust)),
                    ..CoordinateSpanMeta::decided("noop", DecidedBy::Trust)
                })
                .then(NextAction::new(StepKind::Noop, reason).with_meta(
                    &NoopMeta {
                        untrusted: true,
                        ..NoopMeta::default()
                    },
                ))));
        }
        let settings = &self.services.config.autopilot.github;
        // Picked up: a trusted author's issue, comment or review is acknowledged at once.
        if let Some(content) = settings.reactions.acknowledge.as_deref() {
            super::command::acknowledge(github.as_ref(), event, content).await;
        }
        let context = build_context(
            github.as_ref(),
            event,
            &settings.context,
            settings.bot_login.as_deref(),
        )
        .await
        .map_err(|e| {
            StepError::from_error(&e, e.is_retryable())
                .detail("eventId", &event.id)
                .detail("what", "fetching the event's context from GitHub")
        })?;
        let pull = context.subject.as_ref().and_then(|s| s.pull.as_ref());
        let head = event
            .head_branch
            .clone()
            .or_else(|| pull.map(|p| p.head_branch.clone()));
        let merged = event.merged == Some(true) || pull.is_some_and(|p| p.merged);
        Ok(Ok(Gathered {
            // Branch and label names come from GitHub users (the one-line label quotes a ref):
            // data, not instructions.
            event: untrusted_block(
                "github event",
                &format!("{}\n\n{}", meta.label, event_json(event)),
            ),
            context: untrusted_block(&format!("github {}", event.repo), &context.render()),
            subject: subject_key(event),
            rover_pr: RoverPr::find(head.as_deref(), mappings),
            merged,
            open_waits: Vec::new(),
            trust: Some(trust),
            wait_round: 0,
            head_sha: pull
                .map(|p| p.head_sha.clone())
                .or_else(|| event.commit_sha.clone())
                .filter(|s| !s.is_empty()),
        }))
    }
}

/// The event as the coordinator's prompt shows it: every field but the body, which is in the
/// context (as untrusted data), so the event itself stays small. The keys come in the order
/// the prompt always showed them (alphabetical).
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct PromptEvent<'a> {
    action: &'a Option<EventAction>,
    actor: &'a str,
    base_branch: &'a Option<String>,
    before_sha: &'a Option<String>,
    channel: &'a crate::github::Channel,
    comment_id: &'a Option<u64>,
    commit_sha: &'a Option<String>,
    created_at: &'a Option<DateTime<Utc>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    dedupe_key: &'a Option<String>,
    git_ref: &'a Option<String>,
    head_branch: &'a Option<String>,
    html_url: &'a Option<String>,
    id: &'a str,
    is_pull_request: bool,
    kind: EventKind,
    label: &'a Option<String>,
    merged: &'a Option<bool>,
    number: &'a Option<u64>,
    repo: &'a str,
    review_comment_id: &'a Option<u64>,
    review_id: &'a Option<u64>,
    visibility: Visibility,
}

impl<'a> PromptEvent<'a> {
    fn of(event: &'a NormalizedEvent) -> PromptEvent<'a> {
        // No `..`: a new event field must be placed here (or left out on purpose, as the body).
        let NormalizedEvent {
            id,
            kind,
            action,
            actor,
            repo,
            number,
            is_pull_request,
            comment_id,
            review_id,
            review_comment_id,
            commit_sha,
            git_ref,
            before_sha,
            head_branch,
            base_branch,
            merged,
            label,
            body: _,
            html_url,
            created_at,
            channel,
            visibility,
            dedupe_key,
        } = event;
        PromptEvent {
            action,
            actor,
            base_branch,
            before_sha,
            channel,
            comment_id,
            commit_sha,
            created_at,
            dedupe_key,
            git_ref,
            head_branch,
            html_url,
            id,
            is_pull_request: *is_pull_request,
            kind: *kind,
            label,
            merged,
            number,
            repo,
            review_comment_id,
            review_id,
            visibility: *visibility,
        }
    }
}

fn event_json(event: &NormalizedEvent) -> String {
    serde_json::to_string_pretty(&PromptEvent::of(event)).unwrap_or_default()
}

/// Whether a trace's coordinator decided to act (not `noop` or `wait`).
fn acted(view: &crate::store::TraceView) -> bool {
    view.spans.iter().any(|s| {
        s.step == StepKind::Coordinate
            && s.status == crate::store::SpanStatus::Completed
            && DecisionSpanMeta::of(s)
                .decision
                .is_some_and(|d| !matches!(d.as_str(), "noop" | "wait"))
    })
}

/// Open waits of other recent traces about `subject` (a [`subject_key`]), up to the newest
/// trace that acted on it (newest first, at most [`MAX_WAITS`]).
pub fn open_waits(store: &AutopilotStore, this_trace: Uuid, subject: &str) -> Vec<OpenWait> {
    let Ok(recent) = store.recent_traces(WAIT_LOOKBACK) else {
        return Vec::new();
    };
    let mut waits = Vec::new();
    // `recent_traces` lists the newest first.
    for entry in recent.iter().filter(|e| e.trace_id != this_trace) {
        let Ok(view) = store.load_trace(entry.trace_id) else {
            continue;
        };
        let same_subject = view
            .root()
            .and_then(|r| EventMeta::of(r).ok())
            .and_then(|m| m.event)
            .and_then(|e| subject_key(&e))
            .as_deref()
            == Some(subject);
        if !same_subject {
            continue;
        }
        if acted(&view) {
            // A newer trace already acted on this subject: older waits are settled.
            break;
        }
        for action in view
            .actions
            .iter()
            .filter(|a| a.action == StepKind::Noop && a.reason.starts_with(WAIT_PREFIX))
        {
            let condition = super::meta::read::<NoopMeta>(action)
                .ok()
                .and_then(|m| m.waiting_for)
                .unwrap_or_else(|| action.reason[WAIT_PREFIX.len()..].trim().to_owned());
            waits.push(OpenWait {
                trace_id: entry.trace_id,
                at: action.timestamp,
                condition,
            });
        }
        if waits.len() >= MAX_WAITS {
            break;
        }
    }
    waits.truncate(MAX_WAITS);
    waits
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
            short_sha(&watch.sha),
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

fn short_sha(sha: &str) -> &str {
    &sha[..sha.len().min(12)]
}

/// What a look at a pull request's CI leads to.
#[derive(Debug, Clone, PartialEq)]
pub enum CiVerdict {
    /// Red: the resolver decides (iterate on the same branch, within `maxRetries`).
    Red(Vec<String>),
    /// Green: tell the channel the pull request is ready.
    Green,
    /// Still running (or nothing reported yet): look again later.
    Again,
    /// Looked often enough without an outcome.
    GiveUp,
    /// No check or status reported for the commit after a few looks: the repository has no CI.
    NoCi,
}

/// How many earlier looks at CI in the trace were red.
fn red_looks(view: &crate::store::TraceView) -> u32 {
    let n = view
        .spans
        .iter()
        .filter(|s| DecisionSpanMeta::is_red_ci(s))
        .count();
    u32::try_from(n).unwrap_or(u32::MAX)
}

/// Looks without a single check or status before rover concludes there is no CI.
const NO_CI_LOOKS: u32 = 3;

/// The verdict for `status` at look `round` of at most `max`.
pub fn ci_verdict(status: &CiStatus, round: u32, max: u32) -> CiVerdict {
    match status.state {
        CiState::Failure => CiVerdict::Red(status.failing.clone()),
        CiState::Success if status.total > 0 => CiVerdict::Green,
        _ if status.total == 0 && round >= NO_CI_LOOKS.min(max) => CiVerdict::NoCi,
        _ if round >= max => CiVerdict::GiveUp,
        _ => CiVerdict::Again,
    }
}

/// A check run, check suite or status reported for `sha`: the CI watches of that commit look
/// now, and the coordinator waits on a pull request whose head it is re-evaluate now, instead
/// of at their scheduled time. Returns how many were woken.
pub fn wake_ci_watches(
    store: &AutopilotStore,
    sha: &str,
) -> Result<usize, crate::store::StoreError> {
    let state = store.read_state()?;
    let mut woken = 0;
    for pending in state.pending.iter().filter(|p| {
        p.action == StepKind::Coordinate && p.running_span_id.is_none() && p.not_before.is_some()
    }) {
        let Ok(action) = store.read_action(pending.action_id) else {
            continue;
        };
        let scheduled = super::meta::read::<CoordinateMeta>(&action).unwrap_or_default();
        let same = |s: &str| s.eq_ignore_ascii_case(sha);
        let watches_sha = scheduled.ci.is_some_and(|ci| same(&ci.sha))
            || scheduled
                .wait
                .and_then(|w| w.head_sha)
                .is_some_and(|s| same(&s));
        if watches_sha && store.wake_pending(pending.action_id)? {
            woken += 1;
        }
    }
    Ok(woken)
}

/// Take over the scheduled waits of other traces about `subject` (see the module docs): each
/// becomes due now, marked superseded by `this_trace`. Returns them as open waits.
pub fn take_over_waits(
    store: &AutopilotStore,
    this_trace: Uuid,
    subject: &str,
) -> Result<Vec<OpenWait>, crate::store::StoreError> {
    let state = store.read_state()?;
    let mut taken = Vec::new();
    for pending in state.pending.iter().filter(|p| {
        p.action == StepKind::Coordinate
            && p.trace_id != this_trace
            && p.running_span_id.is_none()
            && p.superseded_by.is_none()
    }) {
        let Ok(action) = store.read_action(pending.action_id) else {
            continue;
        };
        let Some(wait) = super::meta::read::<CoordinateMeta>(&action)
            .ok()
            .and_then(|m| m.wait)
        else {
            continue;
        };
        if wait.subject.as_deref() != Some(subject) {
            continue;
        }
        if store.supersede_pending(pending.action_id, this_trace)? {
            taken.push(OpenWait {
                trace_id: pending.trace_id,
                at: wait.since,
                condition: wait.condition,
            });
        }
    }
    Ok(taken)
}

/// Rover's task mappings for the prompt, their names in untrusted blocks: task ids come from
/// the planner, branch names from task titles and events.
fn render_mappings(mappings: &[MappedTask], rover_pr: Option<&RoverPr>) -> String {
    let mut out = String::new();
    if let Some(pr) = rover_pr {
        let tasks = pr
            .tasks
            .iter()
            .map(|(_, t)| format!("`{t}`"))
            .collect::<Vec<_>>()
            .join(", ");
        let _ = writeln!(
            out,
            "This event is about a pull request rover opened: its head branch belongs to rover's task(s).\n{}\n",
            untrusted_block(
                "the pull request's branch and tasks",
                &format!("head branch `{}`, task(s) {tasks}", pr.branch)
            )
        );
    }
    if mappings.is_empty() {
        out.push_str("(rover owns no tasks right now)\n");
        return out;
    }
    let mut list = String::new();
    for MappedTask {
        key, mapping: m, ..
    } in mappings
    {
        let _ = writeln!(
            list,
            "- task `{}`: branch `{}` (workflow action {key}, trace {})",
            m.task_id, m.branch_name, m.trace_id
        );
    }
    out.push_str(&untrusted_block("rover's task mappings", &list));
    out
}

/// The open waits for the prompt, as one untrusted block: their conditions are agents' words.
fn render_waits(waits: &[OpenWait]) -> String {
    if waits.is_empty() {
        return "(none)".to_owned();
    }
    let list = waits
        .iter()
        .map(|w| {
            format!(
                "- since {} (trace {}): waiting for {}",
                w.at.to_rfc3339(),
                w.trace_id,
                w.condition
            )
        })
        .collect::<Vec<_>>()
        .join("\n");
    untrusted_block("open waits (conditions coordinators wrote)", &list)
}

/// The one action for the agent's decision.
fn route(
    result: &CoordinateResult,
    gathered: &Gathered,
    mappings: &[MappedTask],
    policy: WaitPolicy,
) -> NextAction {
    let reasoning = result.reasoning.trim();
    let text = |v: &Option<String>| v.as_deref().unwrap_or_default().trim().to_owned();
    match result.decision {
        CoordinateDecision::Noop => {
            NextAction::new(StepKind::Noop, reasoning).with_meta(&NoopMeta::default())
        }
        CoordinateDecision::Plan => {
            let pr = gathered.rover_pr.as_ref();
            NextAction::new(StepKind::Plan, reasoning).with_meta(&PlanMeta {
                directive: text(&result.directive),
                existing_task: pr.and_then(RoverPr::existing_task),
                branch: pr.map(|p| p.branch.clone()),
            })
        }
        CoordinateDecision::Workflow => match &result.task {
            Some(task) => {
                let mut meta = workflow_meta(task, Vec::new());
                if let Some(pr) = &gathered.rover_pr {
                    meta.iterate_on = pr.existing_task();
                    meta.branch = Some(pr.branch.clone());
                }
                NextAction::new(StepKind::Workflow, format!("{}: {}", task.title, reasoning))
                    .with_meta(&meta)
            }
            // `validate` requires a task; kept total for safety.
            None => NextAction::new(
                StepKind::Noop,
                format!("the coordinator chose a workflow without a task: {reasoning}"),
            )
            .with_meta(&NoopMeta::default()),
        },
        CoordinateDecision::Notify => {
            NextAction::new(StepKind::Notify, reasoning).with_meta(&NotifyMeta {
                purpose: NotifyPurpose::Answer,
                message: Some(text(&result.message)),
                ..NotifyMeta::default()
            })
        }
        CoordinateDecision::Flag => NextAction::new(
            StepKind::Notify,
            format!("flagged for a human: {}", text(&result.condition)),
        )
        .with_meta(&NotifyMeta {
            purpose: NotifyPurpose::Flag,
            message: Some(format!(
                "A maintainer should take a look before rover does anything here: {}",
                text(&result.condition)
            )),
            ..NotifyMeta::default()
        }),
        CoordinateDecision::Wait => {
            let condition = text(&result.condition);
            let round = gathered.wait_round + 1;
            if round > policy.max {
                return NextAction::new(
                    StepKind::Noop,
                    format!(
                        "{WAIT_PREFIX} {condition} (not re-evaluated again: this trace already waited {} time(s), the most `pipeline.maxWaits` allows)",
                        gathered.wait_round
                    ),
                )
                .with_meta(&NoopMeta {
                    waiting_for: Some(condition),
                    subject: gathered.subject.clone(),
                    ..NoopMeta::default()
                });
            }
            let secs = i64::try_from(policy.secs).unwrap_or(i64::MAX);
            let at =
                policy.now + chrono::Duration::try_seconds(secs).unwrap_or(chrono::Duration::MAX);
            let woken_by = gathered.subject.as_deref().map_or_else(String::new, |s| {
                format!(", or sooner by the next event about {s}")
            });
            NextAction::new(
                StepKind::Coordinate,
                format!(
                    "{WAIT_PREFIX} {condition} (re-evaluated at {}{woken_by})",
                    at.format("%Y-%m-%d %H:%M:%S UTC")
                ),
            )
            .with_meta(&CoordinateMeta {
                wait: Some(WaitMeta {
                    condition,
                    subject: gathered.subject.clone(),
                    head_sha: gathered.head_sha.clone(),
                    since: policy.now,
                    round,
                }),
                ci: None,
                not_before: Some(at),
            })
        }
        CoordinateDecision::Cleanup => {
            let wanted = text(&result.task_id);
            let mut cleanup = gathered
                .rover_pr
                .as_ref()
                .map(RoverPr::cleanup)
                .unwrap_or_default();
            for t in mappings {
                if t.mapping.task_id == wanted || t.key == wanted {
                    if let Some(id) = t.workflow_action_id {
                        if !cleanup.tasks.contains(&id) {
                            cleanup.tasks.push(id);
                        }
                    }
                    cleanup
                        .branch
                        .get_or_insert_with(|| t.mapping.branch_name.clone());
                }
            }
            if cleanup.tasks.is_empty() {
                NextAction::new(
                    StepKind::Noop,
                    format!("the coordinator asked to clean up task `{wanted}`, which rover does not know: {reasoning}"),
                )
                .with_meta(&NoopMeta::default())
            } else {
                NextAction::new(StepKind::Cleanup, reasoning).with_meta(&cleanup)
            }
        }
    }
}

#[async_trait]
impl Step for CoordinateStep {
    fn kind(&self) -> StepKind {
        StepKind::Coordinate
    }

    fn max_parallel(&self) -> usize {
        3
    }

    async fn process(&self, ctx: &StepContext, run: &StepRun) -> Result<Outcome, StepError> {
        let trace_id = run.pending.trace_id;
        let scheduled: CoordinateMeta = super::meta::read(&run.action).unwrap_or_default();
        if let Some(by) = run.pending.superseded_by {
            let reason = format!(
                "a newer event about the same subject took over this wait: trace {by} decides"
            );
            let mut span_meta = CoordinateSpanMeta {
                wait: Some(scheduled.wait.clone()),
                ..CoordinateSpanMeta::decided("noop", DecidedBy::Wait)
            };
            span_meta.decided.superseded_by = Some(by.to_string());
            return Ok(Outcome::Finished(
                Finished::completed(format!("decided noop: {reason}"))
                    .with_meta_record(&span_meta)
                    .then(
                        NextAction::new(StepKind::Noop, reason).with_meta(&NoopMeta {
                            subject: scheduled.wait.as_ref().and_then(|w| w.subject.clone()),
                            ..NoopMeta::default()
                        }),
                    ),
            ));
        }
        if let Some(watch) = scheduled.ci {
            let view = load_trace(ctx, trace_id).await?;
            return self.look_at_ci(watch, &view).await;
        }
        let view = load_trace(ctx, trace_id).await?;
        let meta = event_meta(&view)?;
        if let Some((event, command)) = super::command::of_meta(&meta, &self.services) {
            let github = self.services.github.clone().ok_or_else(|| {
                StepError::fatal("a command from GitHub but rover has no GitHub client")
            })?;
            let trust = match self.trust.decide(github.as_ref(), &event.actor).await {
                Ok(trust) => trust,
                Err(e) => {
                    let finished =
                        trust_unknown(&self.services, &event.actor, &e, run.pending.attempts)?;
                    return Ok(Outcome::Finished(finished));
                }
            };
            return super::command::take(&self.services, ctx, run, &meta, event, &command, trust)
                .await;
        }
        let mappings = task_mappings(ctx).await?;
        let mut gathered = match (meta.source, &meta.event) {
            (EventSource::Github, Some(event)) => {
                match self
                    .gather_github(&meta, event, &mappings, run.pending.attempts)
                    .await?
                {
                    Ok(g) => g,
                    Err(untrusted) => return Ok(Outcome::Finished(untrusted)),
                }
            }
            (EventSource::Github, None) => {
                return Err(StepError::fatal(
                    "the root span of this GitHub trace carries no event: it cannot be coordinated",
                ))
            }
            (EventSource::Local, _) => Gathered {
                event: format!(
                    "{}\n\nA local request from rover's own user (trusted), submitted with `rover autopilot submit`:\n\n{}",
                    meta.label,
                    meta.request.as_deref().unwrap_or_default()
                ),
                context: "(a local request: there is no GitHub context)".to_owned(),
                subject: None,
                rover_pr: None,
                merged: false,
                open_waits: Vec::new(),
                trust: None,
                wait_round: 0,
                head_sha: None,
            },
        };

        // A rover PR merged or closed: a simple fork, hardcoded. Closed without merging, its
        // work is not wanted as it is; its workspace is freed all the same (the branch stays on
        // GitHub, and a reopened pull request's next review starts a fresh task from it).
        let closed_pr = meta.event.as_ref().is_some_and(|e| {
            e.kind == EventKind::PullRequest && e.action == Some(EventAction::Closed)
        });
        if let (true, Some(pr)) = (closed_pr, &gathered.rover_pr) {
            let how = if gathered.merged {
                "was merged"
            } else {
                "was closed without merging"
            };
            let reason = format!(
                "rover's pull request from `{}` {how}: tear down its workspace",
                pr.branch
            );
            return Ok(Outcome::Finished(
                Finished::completed(format!("decided cleanup: {reason}"))
                    .with_meta_record(&CoordinateSpanMeta {
                        confidence: Some(1.0),
                        reasoning: Some(reason.clone()),
                        rover_pr: Some(Some(pr.record())),
                        trust: Some(gathered.trust.clone()),
                        ..CoordinateSpanMeta::decided("cleanup", DecidedBy::Rule)
                    })
                    .then(NextAction::new(StepKind::Cleanup, reason).with_meta(&pr.cleanup())),
            ));
        }
        // A pull request from one of rover's branches, closed after its workspace was already
        // freed (the start's check of kept pull requests found it closed first, or an earlier
        // close event did): nothing is left to do, and no model is asked about a closed PR.
        let head = meta.event.as_ref().and_then(|e| e.head_branch.as_deref());
        if let (true, None, Some(branch)) = (closed_pr, &gathered.rover_pr, head) {
            if branch.starts_with(crate::git::BRANCH_PREFIX) {
                let reason = format!(
                    "the pull request from rover's branch `{branch}` is closed and rover holds no workspace for it any more: nothing to do"
                );
                return Ok(Outcome::Finished(
                    Finished::completed(format!("decided noop: {reason}"))
                        .with_meta_record(&CoordinateSpanMeta {
                            confidence: Some(1.0),
                            reasoning: Some(reason.clone()),
                            rover_pr: Some(None),
                            trust: Some(gathered.trust.clone()),
                            ..CoordinateSpanMeta::decided("noop", DecidedBy::Rule)
                        })
                        .then(
                            NextAction::new(StepKind::Noop, reason).with_meta(&NoopMeta {
                                rule: true,
                                ..NoopMeta::default()
                            }),
                        ),
                ));
            }
        }

        gathered.wait_round = scheduled.wait.as_ref().map_or(0, |w| w.round);
        if let Some(subject) = gathered.subject.clone() {
            let taken = blocking(ctx.store.clone(), {
                let subject = subject.clone();
                move |s| take_over_waits(s, trace_id, &subject)
            })
            .await
            .map_err(|e| {
                StepError::from_error(&e, true)
                    .detail("what", "taking over the waits on the same subject")
            })?;
            let older = blocking(ctx.store.clone(), move |s| {
                Ok(open_waits(s, trace_id, &subject))
            })
            .await
            .unwrap_or_default();
            gathered.open_waits = taken;
            gathered.open_waits.extend(older);
            gathered.open_waits.truncate(MAX_WAITS);
        }
        let mut context = format!(
            "{}\n\n## Trace so far\n{}\n\n## Open waits on the same issue, pull request or branch\n{}",
            gathered.context,
            render_trace(&view),
            render_waits(&gathered.open_waits)
        );
        if let Some(wait) = &scheduled.wait {
            let _ = write!(
                context,
                "\n\n{REEVALUATION_HEADING}\nThis trace decided to wait (wait {} of at most {}) since {} for the condition below.\n{}\nThe wait is over: decide again from the current state above.",
                wait.round,
                self.services.config.autopilot.pipeline.max_waits,
                wait.since.to_rfc3339(),
                untrusted_block("the condition the coordinator waited for", &wait.condition)
            );
        }
        // Secrets never reach a prompt, even when someone pasted one into the thread.
        let redactor = &self.services.redactor;
        let mut vars = PromptVars::new();
        vars.insert(
            "event".into(),
            redactor.redact(&gathered.event, Visibility::Private),
        );
        vars.insert(
            "context".into(),
            redactor.redact(&context, Visibility::Private),
        );
        vars.insert(
            "task_mappings".into(),
            render_mappings(&mappings, gathered.rover_pr.as_ref()),
        );
        let answer = ask::<CoordinateResult>(
            &self.services,
            ctx,
            run.span.id,
            AgentStep::Coordinate,
            vars,
        )
        .await
        .map_err(|e| agent_error(AgentStep::Coordinate, &e))?;
        let result = &answer.value;
        let pipeline = &self.services.config.autopilot.pipeline;
        let policy = WaitPolicy {
            secs: pipeline.wait_secs,
            max: pipeline.max_waits,
            now: Utc::now(),
        };
        let action = route(result, &gathered, &mappings, policy);
        let decision = result.decision.as_str();
        Ok(Outcome::Finished(
            Finished::completed(format!(
                "decided {decision} ({:.2}): {}",
                result.confidence,
                result.reasoning.lines().next().unwrap_or_default()
            ))
            .with_meta_record(&CoordinateSpanMeta {
                confidence: Some(result.confidence),
                reasoning: Some(result.reasoning.clone()),
                answer: Some(result.clone()),
                trust: Some(gathered.trust),
                rover_pr: Some(gathered.rover_pr.as_ref().map(RoverPr::record)),
                open_waits: Some(gathered.open_waits),
                wait: Some(scheduled.wait),
                agent: Some(super::agent_call::usage_meta(&answer)),
                ..CoordinateSpanMeta::decided(decision, DecidedBy::Agent)
            })
            .then(action),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::github::Channel;
    use crate::store::TaskMapping;

    fn mapping(task: &str, branch: &str) -> TaskMapping {
        TaskMapping::new(task, branch, Uuid::new_v4(), Uuid::new_v4())
    }

    fn answer(decision: CoordinateDecision) -> CoordinateResult {
        CoordinateResult {
            decision,
            confidence: 0.5,
            reasoning: "why".into(),
            directive: Some("do it".into()),
            task: None,
            message: None,
            condition: Some("CI to finish".into()),
            task_id: Some("t-9".into()),
        }
    }

    fn gathered(rover_pr: Option<RoverPr>) -> Gathered {
        Gathered {
            event: String::new(),
            context: String::new(),
            subject: Some("refs/heads/main".into()),
            rover_pr,
            merged: false,
            open_waits: Vec::new(),
            trust: None,
            wait_round: 0,
            head_sha: Some("abc123".into()),
        }
    }

    fn policy() -> WaitPolicy {
        WaitPolicy {
            secs: 1800,
            max: 2,
            now: DateTime::parse_from_rfc3339("2026-01-02T03:04:05Z")
                .unwrap()
                .with_timezone(&Utc),
        }
    }

    fn ci(state: CiState, failing: &[&str], total: usize) -> CiStatus {
        CiStatus {
            sha: "abc".into(),
            state,
            failing: failing.iter().map(|s| (*s).to_owned()).collect(),
            pending: Vec::new(),
            total,
        }
    }

    #[test]
    fn ci_red_goes_to_the_resolver_green_notifies_pending_looks_again() {
        assert_eq!(
            ci_verdict(&ci(CiState::Failure, &["ci / test"], 2), 1, 5),
            CiVerdict::Red(vec!["ci / test".into()])
        );
        assert_eq!(
            ci_verdict(&ci(CiState::Success, &[], 2), 1, 5),
            CiVerdict::Green
        );
        assert_eq!(
            ci_verdict(&ci(CiState::Pending, &[], 2), 1, 5),
            CiVerdict::Again
        );
        assert_eq!(
            ci_verdict(&ci(CiState::Pending, &[], 2), 5, 5),
            CiVerdict::GiveUp
        );
        // Nothing reported: looked at a few times, then no CI is concluded.
        assert_eq!(
            ci_verdict(&ci(CiState::Pending, &[], 0), 2, 36),
            CiVerdict::Again
        );
        assert_eq!(
            ci_verdict(&ci(CiState::Pending, &[], 0), 3, 36),
            CiVerdict::NoCi
        );
        // "success" with nothing behind it is no green light.
        assert_eq!(
            ci_verdict(&ci(CiState::Success, &[], 0), 1, 36),
            CiVerdict::Again
        );
    }

    #[test]
    fn subjects_are_issue_numbers_or_refs() {
        let mut e = NormalizedEvent::local("1", "a", "", Utc::now());
        assert_eq!(subject_key(&e), None);
        e.git_ref = Some("refs/heads/main".into());
        assert_eq!(subject_key(&e).as_deref(), Some("refs/heads/main"));
        e.number = Some(4);
        e.channel = Channel::IssueComment { number: 4 };
        assert_eq!(subject_key(&e).as_deref(), Some("#4"));
    }

    #[test]
    fn the_prompt_shows_the_event_without_its_body_as_before() {
        // How the prompt rendered the event before it was typed: through a JSON value.
        let before = |e: &NormalizedEvent| {
            let mut value = serde_json::to_value(e).expect("serializes");
            value.as_object_mut().expect("an object").remove("body");
            value
        };
        let mut e = NormalizedEvent::local("1", "alice", "the body", Utc::now());
        e.kind = EventKind::PullRequest;
        e.action = Some(EventAction::Closed);
        e.repo = "o/r".into();
        e.number = Some(4);
        e.is_pull_request = true;
        e.comment_id = Some(5);
        e.review_id = Some(6);
        e.review_comment_id = Some(7);
        e.commit_sha = Some("abc".into());
        e.git_ref = Some("refs/heads/x".into());
        e.before_sha = Some("000".into());
        e.head_branch = Some("rover/x".into());
        e.base_branch = Some("main".into());
        e.merged = Some(true);
        e.label = Some("bug".into());
        e.body = Some("the body".into());
        e.html_url = Some("https://example.invalid/4".into());
        e.channel = Channel::PrComment { number: 4 };
        e.visibility = Visibility::Public;
        e.dedupe_key = Some("k".into());
        let shown = event_json(&e);
        assert!(!shown.contains("body"), "{shown}");
        // The same text, key for key.
        assert_eq!(
            shown,
            serde_json::to_string_pretty(&before(&e)).expect("renders")
        );
        // Without a dedupe key, and a channel of two fields (whose keys may come in another
        // order): the same content.
        e.dedupe_key = None;
        e.channel = Channel::ReviewThreadReply {
            number: 4,
            comment_id: 9,
        };
        let shown: serde_json::Value = serde_json::from_str(&event_json(&e)).expect("json");
        assert_eq!(shown, before(&e));
        assert!(shown.get("dedupeKey").is_none(), "{shown}");
    }

    #[test]
    fn a_rover_pr_is_found_by_its_head_branch() {
        let key = Uuid::new_v4().to_string();
        let mappings = vec![
            MappedTask::new(key.clone(), mapping("t-1", "rover/a")),
            MappedTask::new(Uuid::new_v4().to_string(), mapping("t-2", "rover/b")),
        ];
        let pr = RoverPr::find(Some("rover/a"), &mappings).expect("rover pr");
        assert_eq!(pr.tasks, vec![(key.clone(), "t-1".to_owned())]);
        assert_eq!(pr.existing_task().map(|u| u.to_string()), Some(key));
        assert!(RoverPr::find(Some("feature/x"), &mappings).is_none());
        assert!(RoverPr::find(Some(""), &mappings).is_none());
        assert!(RoverPr::find(None, &mappings).is_none());
    }

    #[test]
    fn a_consolidated_rover_pr_carries_every_task_of_its_trace() {
        let trace = Uuid::new_v4();
        let same = |task: &str, branch: &str| TaskMapping::new(task, branch, trace, Uuid::new_v4());
        let (head, other, stranger) = (Uuid::new_v4(), Uuid::new_v4(), Uuid::new_v4());
        let mappings = vec![
            MappedTask::new(other.to_string(), same("t-2", "rover/t2")),
            MappedTask::new(stranger.to_string(), mapping("t-3", "rover/t3")),
            MappedTask::new(head.to_string(), same("t-1", "rover/t1")),
        ];
        let pr = RoverPr::find(Some("rover/t1"), &mappings).expect("rover pr");
        assert_eq!(pr.workflow_action_ids, vec![head, other]);
        assert_eq!(
            pr.existing_task(),
            Some(head),
            "an iteration reuses the head's task"
        );
        assert_eq!(pr.cleanup().tasks, vec![head, other]);
    }

    #[test]
    fn every_decision_routes_to_one_action_and_only_a_wait_to_coordinate() {
        let mappings = vec![MappedTask::new(
            Uuid::new_v4().to_string(),
            mapping("t-9", "rover/t9"),
        )];
        for (decision, kind) in [
            (CoordinateDecision::Noop, StepKind::Noop),
            (CoordinateDecision::Plan, StepKind::Plan),
            (CoordinateDecision::Notify, StepKind::Notify),
            (CoordinateDecision::Flag, StepKind::Notify),
            (CoordinateDecision::Wait, StepKind::Coordinate),
            (CoordinateDecision::Cleanup, StepKind::Cleanup),
            // Without a task the workflow decision cannot be followed.
            (CoordinateDecision::Workflow, StepKind::Noop),
        ] {
            let action = route(&answer(decision), &gathered(None), &mappings, policy());
            assert_eq!(action.kind, kind, "{decision:?}");
        }
        let wait = route(
            &answer(CoordinateDecision::Wait),
            &gathered(None),
            &mappings,
            policy(),
        );
        assert_eq!(
            wait.reason,
            "waiting: CI to finish (re-evaluated at 2026-01-02 03:34:05 UTC, or sooner by the next event about refs/heads/main)"
        );
        assert_eq!(wait.meta["notBefore"], "2026-01-02T03:34:05Z");
        assert_eq!(wait.meta["wait"]["subject"], "refs/heads/main");
        assert_eq!(wait.meta["wait"]["condition"], "CI to finish");
        assert_eq!(wait.meta["wait"]["round"], 1);
        assert_eq!(wait.meta["wait"]["headSha"], "abc123");
        // The scheduled action is queued not before its deadline.
        let span = crate::store::Span::root(Uuid::new_v4(), Utc::now(), crate::store::Meta::new());
        let action =
            crate::store::Action::new(wait.kind.clone(), &span, wait.reason, wait.meta, Utc::now());
        assert_eq!(
            action.pending(span.id, Utc::now()).not_before,
            Some(policy().now + chrono::Duration::seconds(1800))
        );
        // Past `maxWaits` a wait ends the trace, still recording what it waited for.
        let mut waited = gathered(None);
        waited.wait_round = 2;
        let last = route(
            &answer(CoordinateDecision::Wait),
            &waited,
            &mappings,
            policy(),
        );
        assert_eq!(last.kind, StepKind::Noop);
        assert_eq!(last.meta["waitingFor"], "CI to finish");
        assert!(
            last.reason.contains("already waited 2 time(s)"),
            "{}",
            last.reason
        );
        let cleanup = route(
            &answer(CoordinateDecision::Cleanup),
            &gathered(None),
            &mappings,
            policy(),
        );
        assert_eq!(cleanup.meta["branch"], "rover/t9");
        // Cleanup of a task rover does not know ends in noop.
        let unknown = route(
            &answer(CoordinateDecision::Cleanup),
            &gathered(None),
            &[],
            policy(),
        );
        assert_eq!(unknown.kind, StepKind::Noop);
        assert!(
            unknown.reason.contains("does not know"),
            "{}",
            unknown.reason
        );
    }
}
