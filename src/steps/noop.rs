//! The `noop` step (terminal): an explicit end for a trace in which nothing is done, with the
//! reason and a one-line summary of what the pipeline evaluated. [`SummarizingNoopStep`] asks a
//! small model for the summary and falls back to the chain of span summaries when it fails;
//! [`NoopStep`] (for tests and agent-less setups) always uses the chain. A wait recorded by the
//! coordinator (`waiting: ...`) keeps its condition in the span.

use std::sync::Arc;

use async_trait::async_trait;

use super::agent_call::{ask, failure_meta, load_trace, render_trace, usage_meta};
use super::meta::{self, NoopMeta, NoopSpanMeta, SummarySource};
use super::Services;
use crate::agents::{untrusted_block, AgentStep, PromptVars, SummarizeResult};
use crate::github::Visibility;
use crate::orchestrator::{Finished, Outcome, Step, StepContext, StepError};
use crate::store::{AgentMeta, StepKind, StepRun, TraceView};

/// The noop step without AI: the summary is always [`chain_summary`].
pub struct NoopStep;

/// The noop step with a small model's summary (`meta.summary`), falling back to
/// [`chain_summary`] when the agent fails; `meta.summarySource` says which was used.
pub struct SummarizingNoopStep {
    services: Arc<Services>,
}

impl SummarizingNoopStep {
    pub fn new(services: Arc<Services>) -> SummarizingNoopStep {
        SummarizingNoopStep { services }
    }
}

/// The span of a noop run: the reason, the summary and its source, a wait's condition and the
/// summarizing agent's call, if any.
fn finished(
    run: &StepRun,
    summary: &str,
    source: SummarySource,
    agent: Option<AgentMeta>,
) -> Finished {
    let noop: NoopMeta = meta::read(&run.action).unwrap_or_default();
    // A wait's subject is recorded with its condition, `null` when it has none.
    let subject = noop.waiting_for.is_some().then_some(noop.subject);
    Finished::completed(run.action.reason.clone()).with_meta_record(&NoopSpanMeta {
        reason: run.action.reason.clone(),
        summary: summary.to_owned(),
        summary_source: source,
        waiting_for: noop.waiting_for,
        subject,
        agent,
    })
}

/// The fallback summary: each finished span's summary, in order, joined.
pub fn chain_summary(view: &TraceView) -> String {
    let parts: Vec<String> = view
        .spans
        .iter()
        .filter_map(|s| {
            s.summary
                .as_deref()
                .map(|text| format!("{}: {}", s.step, text.lines().next().unwrap_or_default()))
        })
        .collect();
    if parts.is_empty() {
        "nothing was recorded".into()
    } else {
        parts.join(" → ")
    }
}

#[async_trait]
impl Step for NoopStep {
    fn kind(&self) -> StepKind {
        StepKind::Noop
    }

    fn max_parallel(&self) -> usize {
        5
    }

    async fn process(&self, ctx: &StepContext, run: &StepRun) -> Result<Outcome, StepError> {
        let view = load_trace(ctx, run.pending.trace_id).await?;
        Ok(Outcome::Finished(finished(
            run,
            &chain_summary(&view),
            SummarySource::SpanSummaries,
            None,
        )))
    }
}

#[async_trait]
impl Step for SummarizingNoopStep {
    fn kind(&self) -> StepKind {
        StepKind::Noop
    }

    fn max_parallel(&self) -> usize {
        5
    }

    async fn process(&self, ctx: &StepContext, run: &StepRun) -> Result<Outcome, StepError> {
        let view = load_trace(ctx, run.pending.trace_id).await?;
        let noop: NoopMeta = meta::read(&run.action).unwrap_or_default();
        if noop.untrusted || noop.command {
            return Ok(Outcome::Finished(finished(
                run,
                &chain_summary(&view),
                SummarySource::SpanSummariesUntrusted,
                None,
            )));
        }
        if noop.rule {
            return Ok(Outcome::Finished(finished(
                run,
                &chain_summary(&view),
                SummarySource::SpanSummaries,
                None,
            )));
        }
        let redactor = &self.services.redactor;
        let mut vars = PromptVars::new();
        // The reason quotes the deciding agent (a coordinator's reasoning, a planner's analysis).
        vars.insert(
            "reason".into(),
            redactor.redact(
                &untrusted_block("the reason the trace recorded", &run.action.reason),
                Visibility::Private,
            ),
        );
        vars.insert(
            "trace".into(),
            redactor.redact(&render_trace(&view), Visibility::Private),
        );
        let answer =
            ask::<SummarizeResult>(&self.services, ctx, run.span.id, AgentStep::Summarize, vars)
                .await;
        let done = match answer {
            Ok(answer) => finished(
                run,
                answer.value.summary.trim(),
                SummarySource::Agent,
                Some(usage_meta(&answer)),
            ),
            Err(e) => finished(
                run,
                &chain_summary(&view),
                SummarySource::SpanSummaries,
                Some(failure_meta(&e)),
            ),
        };
        Ok(Outcome::Finished(done))
    }
}
