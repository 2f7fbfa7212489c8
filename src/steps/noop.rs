//! The `noop` step: an explicit end for a trace in which nothing is done, with the reason and a
//! one-line summary of what the pipeline evaluated. The summary is the chain of span summaries;
//! a small model rephrases it when an agent is configured (see the agents module).

use async_trait::async_trait;

use crate::orchestrator::{blocking, Finished, Outcome, Step, StepContext, StepError};
use crate::store::{StepKind, StepRun, TraceView};

pub struct NoopStep;

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
        let trace_id = run.pending.trace_id;
        let view = blocking(ctx.store.clone(), move |s| s.load_trace(trace_id))
            .await
            .map_err(|e| StepError::from_error(&e, true))?;
        let summary = chain_summary(&view);
        Ok(Outcome::Finished(
            Finished::completed(run.action.reason.clone())
                .meta("reason", &run.action.reason)
                .meta("summary", &summary)
                .meta("summarySource", "span summaries"),
        ))
    }
}
