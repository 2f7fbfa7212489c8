//! The `resolve` step: looks at a whole trace after its commits and decides how it goes on.
//!
//! Quick exits come first and need no AI: a workflow or commit of the trace still queued or
//! running keeps the action queued (`ready` → `Wait`); a resolve that finds another resolve of
//! the trace already decided after the last commit finishes as superseded (several commits of
//! one trace each produce a resolve, only one decides); retries exhausted → `fail`. Otherwise
//! the agent (no tools, in rover's empty host dir) reads the trace with its error output (a red
//! CI of the pushed pull request among them) and the failed task's change, and answers `push | notify | iterate | retry | fail`. A `retry` may ask
//! for corrective commands: rover runs them in a sandbox container over the task's worktree,
//! never on the host. A worktree a sandbox tampered with ends the trace without an agent, and so
//! does a push refused because what it would send holds secrets (a secret in a commit stays in
//! the branch's history: no commit on top removes it).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use async_trait::async_trait;
use uuid::Uuid;

use super::agent_call::{self};
use super::meta::{CorrectiveRuns, ResolveMeta, ResolveSpanMeta};
use super::Services;
use crate::agents::{untrusted_block, AgentStep, PromptVars, ResolveDecision, ResolveResult};
use crate::orchestrator::{Outcome, Readiness, Step, StepContext, StepError};
use crate::steps::recall::recorded;
use crate::store::blocking;
use crate::store::{AgentMeta, PendingAction, StepKind, StepRun, TaskMapping, TraceView};

mod decision;
mod quick;
mod render;
#[cfg(test)]
mod tests;

use super::history::{busy, retries_so_far, task_worktree, waits_for_the_resolver};
use decision::{decide, decision_meta, scheduled_wait, Decided};
use quick::{quick_exit, Retries};
use render::{render_errors, render_trace};

/// Longest error detail of one span quoted in the prompt.
const MAX_ERROR_CHARS: usize = 16 * 1024;
/// Longest trace listing in the prompt.
const MAX_TRACE_CHARS: usize = 48 * 1024;
/// Longest diff of the failed task in the prompt.
const MAX_CHANGES_BYTES: usize = 24 * 1024;

/// The resolver step.
pub struct ResolveStep {
    services: Arc<Services>,
}

impl ResolveStep {
    pub fn new(services: Arc<Services>) -> ResolveStep {
        ResolveStep { services }
    }

    /// Runs the resolver's corrective commands in a sandbox over `worktree`; what ran (or why
    /// nothing could), for the span and the next resolver.
    async fn corrective(
        &self,
        ctx: &StepContext,
        run: &StepRun,
        worktree: Option<&Path>,
        result: &ResolveResult,
    ) -> Result<CorrectiveRuns, StepError> {
        let commands: Vec<String> = result
            .corrective_commands
            .iter()
            .map(|c| c.command.clone())
            .collect();
        let not_run = |why: String| CorrectiveRuns::not_run(why, commands.clone());
        let Some(worktree) = worktree else {
            return Ok(not_run(
                "the trace has no task worktree to run them in".into(),
            ));
        };
        let sandbox = match super::sandboxed::sandbox(&self.services) {
            Ok(sandbox) => sandbox,
            Err(e) => return Ok(not_run(e.message)),
        };
        let image = super::sandboxed::trace_image(ctx, &self.services, run.pending.trace_id).await;
        if let Err(e) = sandbox.ensure_image(&image).await {
            return Ok(not_run(e.to_string()));
        }
        let ws = super::tasks::workspace(&self.services)
            .await
            .map_err(|e| super::tasks::git_error("cannot open the repository", &e))?;
        let mut base = super::sandboxed::bare_spec(
            &self.services,
            vec!["true".into()],
            worktree,
            super::sandboxed::labels(&self.services, run.pending.trace_id, run.action.id),
        );
        base.image.clone_from(&image);
        let work_dir = ctx.store.artifacts_dir(run.span.id).join("corrective");
        let runs = super::sandboxed::run_corrective(
            &self.services,
            &ws,
            sandbox.as_ref(),
            base,
            &commands,
            &work_dir,
            &Services::sandbox_objects_dir(&ctx.store),
        )
        .await?;
        Ok(CorrectiveRuns::ran(runs))
    }
}

/// What the resolver sees of a trace: the view plus the task mappings of its workflows.
struct TraceState {
    view: TraceView,
    mappings: BTreeMap<String, TaskMapping>,
}

async fn load_state(ctx: &StepContext, trace_id: Uuid) -> Result<TraceState, StepError> {
    let (view, all) = blocking(ctx.store.clone(), move |s| {
        Ok((s.load_trace(trace_id)?, s.read_state()?.task_mappings))
    })
    .await
    .map_err(|e| StepError::from_error(&e, true))?;
    crate::store::replay_record::note_mappings(&all);
    let mappings = all
        .into_iter()
        .filter(|(_, m)| m.trace_id == trace_id)
        .collect();
    Ok(TraceState { view, mappings })
}

#[async_trait]
impl Step for ResolveStep {
    fn kind(&self) -> StepKind {
        StepKind::Resolve
    }

    fn always_recorded(&self) -> bool {
        crate::steps::kinds::always_recorded(&self.kind())
    }

    fn max_parallel(&self) -> usize {
        3
    }

    fn exclusive_per_trace(&self) -> bool {
        true
    }

    async fn ready(
        &self,
        ctx: &StepContext,
        pending: &PendingAction,
    ) -> Result<Readiness, StepError> {
        let state = load_state(ctx, pending.trace_id).await?;
        Ok(
            match busy(
                &state.view,
                &[StepKind::Workflow, StepKind::Commit],
                pending.action_id,
                // A task whose dependency failed waits for this resolver to iterate on it.
                |p| {
                    p.running_span_id.is_none()
                        && waits_for_the_resolver(&state.view, &state.mappings, p.action_id)
                },
            ) {
                Some(why) => Readiness::Wait(why),
                None => Readiness::Ready,
            },
        )
    }

    async fn process(&self, ctx: &StepContext, run: &StepRun) -> Result<Outcome, StepError> {
        let state = load_state(ctx, run.pending.trace_id).await?;
        let view = &state.view;
        let retries = Retries {
            used: retries_so_far(view),
            max: self.services.config.autopilot.pipeline.max_retries,
        };
        if let Some(finished) = quick_exit(view, run.span.id, retries) {
            return Ok(Outcome::Finished(finished));
        }
        // The self-review asked for changes: its findings are the diagnosis.
        let asked: ResolveMeta = super::meta::read(&run.action).unwrap_or_default();
        if let Some(review) = &asked.review {
            return Ok(Outcome::Finished(decision::iterate_on_review(
                view,
                &state.mappings,
                review,
                retries,
            )));
        }
        let task = task_worktree(view, &state.mappings);
        let mut vars = PromptVars::new();
        vars.insert("trace".into(), render_trace(view));
        vars.insert("errors".into(), render_errors(view));
        vars.insert("changes".into(), self.changes(task.as_ref()).await);
        vars.insert("retries".into(), retries.prompt());
        let query = format!(
            "{}\n{}\n{}",
            view.index.event, vars["trace"], vars["errors"]
        );
        let (lessons, used) =
            crate::steps::recall::prompt_lessons(&self.services, &ctx.store, query).await;
        vars.insert("lessons".into(), lessons);
        let dir = agent_call::host_workdir_path(&ctx.store);
        let answer = agent_call::ask::<ResolveResult>(
            &self.services,
            ctx,
            run.span.id,
            AgentStep::Resolve,
            vars,
        )
        .await
        .map_err(|e| agent_call::agent_error(AgentStep::Resolve, &e).detail("workdir", &dir))?;
        let usage = agent_call::usage_meta(&answer);
        let result = answer.value;
        if result.decision == ResolveDecision::Wait {
            let pipeline = &self.services.config.autopilot.pipeline;
            let (finished, span_meta) =
                scheduled_wait(view, &result, pipeline.wait_secs, pipeline.max_waits);
            let span_meta = ResolveSpanMeta {
                agent: Some(usage),
                ..span_meta
            };
            return recorded(
                Ok(Outcome::Finished(finished.with_meta_record(&span_meta))),
                &used,
            );
        }
        if retries.out()
            && matches!(
                result.decision,
                ResolveDecision::Iterate | ResolveDecision::Retry
            )
        {
            let mut finished = retries.gave_up(view);
            let mut span_meta = ResolveSpanMeta::read(&finished.meta).unwrap_or_default();
            span_meta.agent = Some(usage);
            span_meta.agent_decision = Some(result.decision);
            finished = finished.with_meta_record(&span_meta);
            return recorded(Ok(Outcome::Finished(finished)), &used);
        }
        let answered = Answered {
            result,
            usage,
            retries,
            dir,
        };
        recorded(
            self.decided(ctx, run, &state, task.as_ref(), answered)
                .await,
            &used,
        )
    }
}

/// The agent's answer and what the span records with it.
struct Answered {
    result: ResolveResult,
    usage: AgentMeta,
    retries: Retries,
    /// The directory the agent ran in.
    dir: PathBuf,
}

impl ResolveStep {
    /// The failed task's change as the prompt shows it.
    async fn changes(&self, task: Option<&(PathBuf, Option<String>)>) -> String {
        let ws = super::tasks::workspace(&self.services).await.ok();
        match (task, &ws) {
            (Some((worktree, Some(fork))), Some(ws)) => ws
                .diff_patch(worktree, fork, MAX_CHANGES_BYTES)
                .await
                .map_or_else(
                    |e| {
                        // git's message can quote the worktree's paths.
                        format!(
                            "(the change cannot be shown)\n{}",
                            untrusted_block("git", &e.to_string())
                        )
                    },
                    |patch| untrusted_block("the task's worktree", &patch),
                ),
            _ => "(no task worktree)".to_owned(),
        }
    }

    /// The agent's decision as the trace goes on, after the corrective commands a retry asked
    /// for ran.
    async fn decided(
        &self,
        ctx: &StepContext,
        run: &StepRun,
        state: &TraceState,
        task: Option<&(PathBuf, Option<String>)>,
        answered: Answered,
    ) -> Result<Outcome, StepError> {
        let Answered {
            result,
            usage,
            retries,
            dir,
        } = answered;
        let Decided {
            finished,
            decision,
            span_meta,
        } = decide(
            &state.view,
            &state.mappings,
            &result,
            self.services.config.autopilot.pipeline.self_review,
        )?;
        // The fix the resolver asked for runs in the sandbox over the task's worktree, before
        // the retry it prepares; never on the host.
        let corrective_runs =
            if decision == ResolveDecision::Retry && !result.corrective_commands.is_empty() {
                Some(
                    self.corrective(ctx, run, task.map(|t| t.0.as_path()), &result)
                        .await?,
                )
            } else {
                None
            };
        let span_meta = ResolveSpanMeta {
            decision: decision_meta(decision),
            agent_decision: Some(result.decision),
            reasoning: Some(result.reasoning.clone()),
            corrective_commands: Some(result.corrective_commands.clone()),
            corrective_runs,
            instructions: Some(result.instructions.clone()),
            retry_step: Some(result.retry_step),
            message: Some(result.message.clone()),
            retries: Some(retries.used),
            max_retries: Some(retries.max),
            workdir: Some(dir.display().to_string()),
            agent: Some(usage),
            ..span_meta
        };
        Ok(Outcome::Finished(finished.with_meta_record(&span_meta)))
    }
}
