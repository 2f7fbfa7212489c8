//! Replaying one trace: each run of a deciding step (coordinate, plan, resolve) runs again
//! through this build's step code in its own world ([`super::world`]), with the recorded GitHub
//! reads and agent answers ([`super::world_fakes`]) and the current configuration; every other
//! span (workflow, commit, push, notify, cleanup, noop) stands in with what it recorded. Each
//! step is replayed against the recorded history, so a step after a divergence shows what this
//! build would decide had the trace gone as recorded up to it.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use chrono::{DateTime, Utc};
use serde::Serialize;
use uuid::Uuid;

use super::bundle::TraceBundle;
use super::compare::{differences, StepDecision};
use super::world_fakes::{ReplayAgent, ReplayGitHub, NO_ANSWER};
use crate::config::RoverConfig;
use crate::github::{Redactor, RepoRef};
use crate::orchestrator::{Outcome, StepContext};
use crate::project::RepoSlug;
use crate::steps::deciding_step;
use crate::steps::kinds::always_recorded;
use crate::steps::meta::{DecidedBy, DecisionSpanMeta};
use crate::steps::Services;
use crate::store::replay_record::ReplayRecord;
use crate::store::{ErrorMeta, Meta, RunSpanMeta, Span, SpanStatus, StepKind};

/// What replay runs with besides the trace.
#[derive(Clone)]
pub struct ReplaySettings {
    /// The configuration of this build's run (`rover.json` or `--config`).
    pub config: RoverConfig,
    /// The checkout whose custom instructions the prompts read (never written).
    pub repo_root: PathBuf,
    pub repo: Option<RepoSlug>,
}

/// How a trace's replay came out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum Verdict {
    /// Every replayed step decided as recorded.
    Same,
    /// At least one step decided otherwise.
    Diverged,
    /// Nothing diverged, but a deciding step could not be replayed (see its reason).
    NotReplayable,
}

impl Verdict {
    pub fn as_str(self) -> &'static str {
        match self {
            Verdict::Same => "same",
            Verdict::Diverged => "diverged",
            Verdict::NotReplayable => "not replayable",
        }
    }
}

/// What happened to one span in the replay.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum StepHow {
    /// Ran again through this build's step code.
    Replayed,
    /// Not a deciding step: its recorded result stands in.
    Recorded,
    /// A deciding step's run that never reached the step's code (interrupted, stopped, out of
    /// attempts) or is still running.
    Skipped,
    /// A deciding step that cannot be replayed (see `reason`).
    NotReplayable,
}

/// One span of the replayed trace.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct StepReplay {
    pub span_id: Uuid,
    pub step: StepKind,
    pub at: DateTime<Utc>,
    pub how: StepHow,
    pub recorded: StepDecision,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub replayed: Option<StepDecision>,
    /// How the replayed outcome differs (empty: the same).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub differences: Vec<String>,
    /// Worth knowing, not a divergence: a changed prompt, a GitHub call refused.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// A whole trace's replay.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct TraceReplay {
    pub trace_id: Uuid,
    pub event: String,
    pub verdict: Verdict,
    /// The first span whose replay diverged.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub first_divergence: Option<Uuid>,
    pub replayed: usize,
    pub steps: Vec<StepReplay>,
    pub millis: u64,
}

fn replayable(step: &StepKind) -> bool {
    always_recorded(step)
}

/// Replay `bundle` with `settings`.
pub async fn replay_trace(bundle: &TraceBundle, settings: &ReplaySettings) -> TraceReplay {
    let started = Instant::now();
    let mut spans: Vec<&Span> = bundle.spans.iter().collect();
    spans.sort_by_key(|s| s.timestamp);
    let mut steps = Vec::with_capacity(spans.len());
    for span in spans {
        let recorded = StepDecision::recorded(span, bundle.actions_of(span.id));
        let mut step = StepReplay {
            span_id: span.id,
            step: span.step.clone(),
            at: span.timestamp,
            how: StepHow::Recorded,
            recorded,
            replayed: None,
            differences: Vec::new(),
            notes: Vec::new(),
            reason: None,
        };
        if replayable(&span.step) {
            replay_one(bundle, span, settings, &mut step).await;
        }
        steps.push(step);
    }
    let first_divergence = steps
        .iter()
        .find(|s| !s.differences.is_empty())
        .map(|s| s.span_id);
    let verdict = if first_divergence.is_some() {
        Verdict::Diverged
    } else if steps.iter().any(|s| s.how == StepHow::NotReplayable) {
        Verdict::NotReplayable
    } else {
        Verdict::Same
    };
    TraceReplay {
        trace_id: bundle.trace_id,
        event: bundle.label(),
        verdict,
        first_divergence,
        replayed: steps.iter().filter(|s| s.how == StepHow::Replayed).count(),
        steps,
        millis: u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX),
    }
}

async fn replay_one(
    bundle: &TraceBundle,
    span: &Span,
    settings: &ReplaySettings,
    step: &mut StepReplay,
) {
    let record = bundle.records.get(&span.id);
    if DecisionSpanMeta::of(span).decided_by == Some(DecidedBy::Command) {
        // A command stops, retries or reports on other traces of the store and answers on
        // GitHub: an intervention, not a decision; replay does not run it.
        step.how = StepHow::Skipped;
        step.reason = Some(
            "a `/rover` command acts on the store's other traces and answers on GitHub: its recorded result stands in"
                .to_owned(),
        );
        return;
    }
    // An error span is the step's own error only when it carries one and was not cut off
    // (a shutdown or a kill between the run and its recording ends it `interrupted`).
    let own_error = span.status == SpanStatus::Error
        && record.is_some()
        && ErrorMeta::of(span).is_some()
        && !RunSpanMeta::of(span).interrupted;
    let reached = matches!(span.status, SpanStatus::Completed | SpanStatus::Failed) || own_error;
    if !reached {
        step.how = StepHow::Skipped;
        step.reason = Some(if span.status == SpanStatus::Running {
            "still running when the trace was read".to_owned()
        } else {
            "the run did not reach the step's code (interrupted, stopped or out of attempts)"
                .to_owned()
        });
        return;
    }
    let Some(record) = record else {
        step.how = StepHow::NotReplayable;
        step.reason = Some(
            "no replay record: the run was recorded by a rover without replay data (artifacts/<span>/replay.json)"
                .to_owned(),
        );
        return;
    };
    if record.truncated {
        step.how = StepHow::NotReplayable;
        step.reason = Some(
            "the run read more than the replay record keeps (its bounds are in docs/store.md)"
                .to_owned(),
        );
        return;
    }
    match run_step(bundle, span, record, settings).await {
        Ok(replayed) => {
            step.how = StepHow::Replayed;
            step.differences = differences(&step.recorded, &replayed.decision);
            if replayed.needs_answer {
                step.differences.insert(0, NO_ANSWER.to_owned());
            }
            step.replayed = Some(replayed.decision);
            step.notes = replayed.notes;
        }
        Err(reason) => {
            step.how = StepHow::NotReplayable;
            step.reason = Some(reason);
        }
    }
}

/// Run `span`'s step again in its world; its outcome and the notes.
async fn run_step(
    bundle: &TraceBundle,
    span: &Span,
    record: &ReplayRecord,
    settings: &ReplaySettings,
) -> Result<Replayed, String> {
    // A newer trace's takeover of a wait is a mark on the queue entry, which the trace does not
    // keep; the span recorded it.
    let superseded_by = DecisionSpanMeta::of(span)
        .superseded_by
        .and_then(|s| Uuid::parse_str(&s).ok());
    let world = super::world::build(bundle, span, record, superseded_by)?;
    let repo_name = bundle
        .repo
        .clone()
        .or_else(|| settings.repo.as_ref().map(ToString::to_string))
        .unwrap_or_else(|| "replay/replay".to_owned());
    let repo = RepoRef::parse(&repo_name).map_err(|e| e.to_string())?;
    let github = Arc::new(ReplayGitHub::new(repo, record.github_reads.clone()));
    let agent = Arc::new(ReplayAgent::new(
        settings.config.autopilot.agent.agent,
        record.answers.clone(),
    ));
    let services = Arc::new(Services {
        repo_root: settings.repo_root.clone(),
        repo: settings.repo.clone(),
        project_id: "replay".to_owned(),
        config: settings.config.clone(),
        agent: agent.clone(),
        github: Some(github.clone()),
        sandbox: None,
        redactor: Redactor::new(Vec::<String>::new()),
        github_token: None,
        git_env: Vec::new(),
        store_root: None,
        // The deciding steps read nothing of rover's environment: a replay is the same anywhere.
        host: crate::host_env::HostEnv::default(),
    });
    let Some(step) = deciding_step(&span.step, services) else {
        return Err(format!("{} is not a deciding step", span.step));
    };
    let ctx = StepContext::standalone(world.store.clone());
    let outcome =
        crate::store::replay_record::serving(record.clone(), step.process(&ctx, &world.run)).await;
    let mut notes = Vec::new();
    let replayed = match outcome {
        Ok(Outcome::Finished(f)) => StepDecision::replayed(
            f.status,
            &f.meta,
            f.actions.iter().map(|a| (&a.kind, &a.meta)),
        ),
        Ok(Outcome::Detached { meta }) => {
            StepDecision::replayed(SpanStatus::Running, &meta, std::iter::empty())
        }
        Err(e) => {
            notes.push(format!("the step ended with an error: {}", e.message));
            let mut meta = Meta::new();
            e.to_meta().put_into(&mut meta);
            // As the orchestrator ends a run on an error: retried while attempts are left,
            // otherwise an error span and the pipeline's hand-over.
            let max = settings
                .config
                .autopilot
                .pipeline
                .orchestrator()
                .max_attempts;
            if e.retryable && world.run.pending.attempts < max {
                StepDecision {
                    retried: true,
                    ..StepDecision::replayed(SpanStatus::Error, &meta, std::iter::empty())
                }
            } else {
                let next = crate::steps::pipeline::pipeline().fail_forward(
                    &span.step,
                    world.run.action.id,
                    &e,
                );
                StepDecision::replayed(
                    SpanStatus::Error,
                    &meta,
                    next.iter().map(|a| (&a.kind, &a.meta)),
                )
            }
        }
    };
    for check in agent.checks() {
        if !check.same {
            notes.push(format!(
                "the {} prompt changed since the recording: the recorded answer may not hold",
                check.step
            ));
        }
    }
    for refused in github.refused() {
        if !refused.starts_with("the write react(") {
            notes.push(format!(
                "this build asked GitHub for {refused}, which the trace did not record; refused"
            ));
        }
    }
    Ok(Replayed {
        decision: replayed,
        notes,
        needs_answer: agent.ran_out(),
    })
}

/// A replayed run's outcome.
struct Replayed {
    decision: StepDecision,
    notes: Vec<String>,
    /// The run asked the agent beyond the recorded answers (a divergence of its own).
    needs_answer: bool,
}
