//! The `coordinate` step: decides what rover does about a trace's root event.
//!
//! Trust first, without AI: a GitHub event from an author without write access ends in `noop`;
//! a lookup that fails transiently is retried with the orchestrator's backoff. A pull request
//! rover opened that is merged or closed ends in `cleanup` by rule (`noop`, without a model, when
//! its workspace was already freed).
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
//!
//! Its parts: `gather` (trust, context, rover's pull request, the event as the prompt shows it),
//! `waits` (open waits of the same subject, taken over by a newer trace), `ci` (the look at CI),
//! `routing` (the one action a decision becomes), `rover_pr`.

use std::fmt::Write as _;
use std::sync::Arc;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use uuid::Uuid;

use super::agent_call::{
    agent_error, ask, event_meta, load_trace, render_trace, task_mappings, MappedTask,
};
pub use super::meta::OpenWait;
use super::meta::{
    CoordinateMeta, CoordinateSpanMeta, DecidedBy, Decision, EventMeta, EventSource, NoopMeta,
    WaitMeta,
};
use super::trust_check::trust_unknown;
use super::Services;
use crate::agents::{untrusted_block, AgentStep, CoordinateResult, PromptVars};
use crate::github::{
    EventAction, EventKind, NormalizedEvent, TrustDecision, TrustPolicy, Visibility,
};
use crate::orchestrator::{Finished, NextAction, Outcome, Step, StepContext, StepError};
use crate::store::blocking;
use crate::store::{StepKind, StepRun, TraceView};

/// How many recent traces are searched for open waits of the same issue or PR.
const WAIT_LOOKBACK: usize = 50;
/// How many open waits are shown to the agent.
const MAX_WAITS: usize = 5;
/// The prompt heading of a run that re-evaluates the trace's own wait.
pub const REEVALUATION_HEADING: &str = "## Re-evaluating a wait";

mod after_merge;
mod ci;
pub mod command;
mod gather;
mod revert;
mod routing;
mod rover_pr;
#[cfg(test)]
mod tests;
mod waits;

pub use super::meta::ci_watch_action;
pub use ci::{ci_verdict, waits_on, CiVerdict};
use routing::{render_mappings, route};
use rover_pr::RoverPr;
use waits::render_waits;
pub use waits::{open_waits, take_over_waits};

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
}

#[async_trait]
impl Step for CoordinateStep {
    fn kind(&self) -> StepKind {
        StepKind::Coordinate
    }

    fn always_recorded(&self) -> bool {
        crate::steps::kinds::always_recorded(&self.kind())
    }

    fn max_parallel(&self) -> usize {
        3
    }

    fn woken_by(&self, action: &crate::store::Action, signal: &crate::intake::Signal) -> bool {
        waits_on(action, signal)
    }

    async fn process(&self, ctx: &StepContext, run: &StepRun) -> Result<Outcome, StepError> {
        let trace_id = run.pending.trace_id;
        let scheduled: CoordinateMeta = super::meta::read(&run.action).unwrap_or_default();
        if let Some(by) = run.pending.superseded_by {
            return Ok(Outcome::Finished(superseded(&scheduled, by)));
        }
        if let Some(watch) = scheduled.ci {
            let view = load_trace(ctx, trace_id).await?;
            return self.look_at_ci(ctx, watch, &view).await;
        }
        let wait = scheduled.wait;
        let view = load_trace(ctx, trace_id).await?;
        let meta = event_meta(&view)?;
        if let Some((event, command)) = command::of_meta(&meta, &self.services) {
            return self.command(ctx, run, &meta, event, &command).await;
        }
        if let Some(reverting) = meta.reverting() {
            return Ok(Outcome::Finished(revert::revert_rule(reverting)));
        }
        let mappings = task_mappings(ctx).await?;
        let mut gathered = match self.gather(&meta, &mappings, run.pending.attempts).await? {
            Ok(g) => g,
            Err(untrusted) => return Ok(Outcome::Finished(untrusted)),
        };
        if let Some(finished) = closed_pr_rule(&meta, &gathered) {
            return Ok(Outcome::Finished(finished));
        }
        gathered.wait_round = wait.as_ref().map_or(0, |w| w.round);
        if let Some(subject) = gathered.subject.clone() {
            gathered.open_waits = same_subject_waits(ctx, trace_id, subject).await?;
        }
        let vars = self.prompt_vars(&gathered, &view, wait.as_ref(), &mappings);
        self.decide(ctx, run, gathered, wait, &mappings, vars).await
    }
}

impl CoordinateStep {
    /// A command from GitHub (`@rover …`): its author's trust first (a lookup that fails is
    /// retried, then the span fails), then the command.
    async fn command(
        &self,
        ctx: &StepContext,
        run: &StepRun,
        meta: &EventMeta,
        event: &NormalizedEvent,
        command: &command::ThreadCommand,
    ) -> Result<Outcome, StepError> {
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
        command::take(&self.services, ctx, run, meta, event, command, trust).await
    }

    /// What the coordinator knows before asking: a GitHub event's context (`Err`: the span of
    /// an author rover does not act for), or a local request's.
    async fn gather(
        &self,
        meta: &EventMeta,
        mappings: &[MappedTask],
        attempts: u32,
    ) -> Result<Result<Gathered, Finished>, StepError> {
        match (meta.source, &meta.event) {
            (EventSource::Github, Some(event)) => {
                self.gather_github(meta, event, mappings, attempts).await
            }
            (EventSource::Github, None) => Err(StepError::fatal(
                "the root span of this GitHub trace carries no event: it cannot be coordinated",
            )),
            (EventSource::Local, _) => Ok(Ok(Gathered {
                event: format!(
                    "{}\n\n{}:\n\n{}",
                    meta.label,
                    match meta.follows.filter(|_| meta.is_red_main_fix()) {
                        Some(origin) => format!("A request rover made itself (trusted: it follows trace {origin}, which a trusted person started, and whose merge left the base branch red)"),
                        None => "A local request from rover's own user (trusted), submitted with `rover autopilot submit`".to_owned(),
                    },
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
            })),
        }
    }

    /// The agent's variables: the event, the context (the trace so far, the open waits and
    /// the wait this run re-evaluates) and rover's task mappings. Secrets never reach a
    /// prompt, even when someone pasted one into the thread.
    fn prompt_vars(
        &self,
        gathered: &Gathered,
        view: &TraceView,
        wait: Option<&WaitMeta>,
        mappings: &[MappedTask],
    ) -> PromptVars {
        let mut context = format!(
            "{}\n\n## Trace so far\n{}\n\n## Open waits on the same issue, pull request or branch\n{}",
            gathered.context,
            render_trace(view),
            render_waits(&gathered.open_waits)
        );
        if let Some(wait) = wait {
            let _ = write!(
                context,
                "\n\n{REEVALUATION_HEADING}\nThis trace decided to wait (wait {} of at most {}) since {} for the condition below.\n{}\nThe wait is over: decide again from the current state above.",
                wait.round,
                self.services.config.autopilot.pipeline.max_waits,
                wait.since.to_rfc3339(),
                untrusted_block("the condition the coordinator waited for", &wait.condition)
            );
        }
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
            render_mappings(mappings, gathered.rover_pr.as_ref()),
        );
        vars
    }

    /// Asks the agent; its decision becomes the one next action.
    async fn decide(
        &self,
        ctx: &StepContext,
        run: &StepRun,
        gathered: Gathered,
        wait: Option<WaitMeta>,
        mappings: &[MappedTask],
        mut vars: PromptVars,
    ) -> Result<Outcome, StepError> {
        let query = format!("{}\n{}", vars["event"], vars["context"]);
        let (lessons, used) =
            crate::steps::recall::prompt_lessons(&self.services, &ctx.store, query).await;
        vars.insert("lessons".into(), lessons);
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
        let action = route(result, &gathered, mappings, policy);
        let decision = Decision::from(result.decision);
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
                wait: Some(wait),
                agent: Some(super::agent_call::usage_meta(&answer)),
                ..CoordinateSpanMeta::decided(decision, DecidedBy::Agent)
            })
            .with_meta_record(&used)
            .then(action),
        ))
    }
}

/// A wait a newer event about the same subject took over: noop, naming the trace that decides.
fn superseded(scheduled: &CoordinateMeta, by: Uuid) -> Finished {
    let reason =
        format!("a newer event about the same subject took over this wait: trace {by} decides");
    let mut span_meta = CoordinateSpanMeta {
        wait: Some(scheduled.wait.clone()),
        ..CoordinateSpanMeta::decided(Decision::Noop, DecidedBy::Wait)
    };
    span_meta.decided.superseded_by = Some(by.to_string());
    Finished::completed(format!("decided noop: {reason}"))
        .with_meta_record(&span_meta)
        .then(
            NextAction::new(StepKind::Noop, reason).with_meta(&NoopMeta {
                subject: scheduled.wait.as_ref().and_then(|w| w.subject.clone()),
                ..NoopMeta::default()
            }),
        )
}

/// A pull request from one of rover's branches, merged or closed: decided by rule, without a
/// model. None when the event is not such a close.
fn closed_pr_rule(meta: &EventMeta, gathered: &Gathered) -> Option<Finished> {
    let closed_pr = meta
        .event
        .as_ref()
        .is_some_and(|e| e.kind == EventKind::PullRequest && e.action == Some(EventAction::Closed));
    if !closed_pr {
        return None;
    }
    // A rover PR merged or closed: a simple fork, hardcoded. Closed without merging, its
    // work is not wanted as it is; its workspace is freed all the same (the branch stays on
    // GitHub, and a reopened pull request's next review starts a fresh task from it).
    if let Some(pr) = &gathered.rover_pr {
        let how = if gathered.merged {
            "was merged"
        } else {
            "was closed without merging"
        };
        let reason = format!(
            "rover's pull request from `{}` {how}: tear down its workspace",
            pr.branch
        );
        return Some(
            Finished::completed(format!("decided cleanup: {reason}"))
                .with_meta_record(&CoordinateSpanMeta {
                    confidence: Some(1.0),
                    reasoning: Some(reason.clone()),
                    rover_pr: Some(Some(pr.record())),
                    trust: Some(gathered.trust.clone()),
                    ..CoordinateSpanMeta::decided(Decision::Cleanup, DecidedBy::Rule)
                })
                .then(NextAction::new(StepKind::Cleanup, reason).with_meta(&pr.cleanup())),
        );
    }
    // A pull request from one of rover's branches, closed after its workspace was already
    // freed (the start's check of kept pull requests found it closed first, or an earlier
    // close event did): nothing is left to do, and no model is asked about a closed PR.
    let branch = meta.event.as_ref().and_then(|e| e.head_branch.as_deref())?;
    if !branch.starts_with(crate::git::BRANCH_PREFIX) {
        return None;
    }
    let reason = format!(
        "the pull request from rover's branch `{branch}` is closed and rover holds no workspace for it any more: nothing to do"
    );
    Some(
        Finished::completed(format!("decided noop: {reason}"))
            .with_meta_record(&CoordinateSpanMeta {
                confidence: Some(1.0),
                reasoning: Some(reason.clone()),
                rover_pr: Some(None),
                trust: Some(gathered.trust.clone()),
                ..CoordinateSpanMeta::decided(Decision::Noop, DecidedBy::Rule)
            })
            .then(
                NextAction::new(StepKind::Noop, reason).with_meta(&NoopMeta {
                    rule: true,
                    ..NoopMeta::default()
                }),
            ),
    )
}

/// The open waits on `subject`: those this trace takes over first, then other traces' older
/// ones, at most [`MAX_WAITS`].
async fn same_subject_waits(
    ctx: &StepContext,
    trace_id: Uuid,
    subject: String,
) -> Result<Vec<OpenWait>, StepError> {
    let taken = blocking(ctx.store.clone(), {
        let subject = subject.clone();
        move |s| {
            let woken = waits::wake_merges(s, &subject)?;
            if woken > 0 {
                tracing::info!(%subject, woken, "scheduled merges look now");
            }
            take_over_waits(s, trace_id, &subject)
        }
    })
    .await
    .map_err(|e| {
        StepError::from_error(&e, true).detail("what", "taking over the waits on the same subject")
    })?;
    let older = blocking(ctx.store.clone(), move |s| {
        Ok(open_waits(s, trace_id, &subject))
    })
    .await
    .unwrap_or_default();
    let mut waits = taken;
    waits.extend(older);
    waits.truncate(MAX_WAITS);
    Ok(waits)
}
