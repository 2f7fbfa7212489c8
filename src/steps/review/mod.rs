//! The `review` step: the self-review before every push (`autopilot.pipeline.selfReview`).
//!
//! The resolver decided to push; before the push, a reviewer agent reads each task's change
//! against the task's acceptance criteria and the repository's instructions, in the sandbox
//! over the task's worktree with read-only tools (claude gets exactly `Read,Glob,Grep`, codex its
//! read-only sandbox) and a workspace that is only read (mounted read-only, or shipped and never
//! taken back). Its prompt is lean: the task, its criteria and the diff, not the repository.
//!
//! A task whose branch head an earlier review of the trace approved is not read again. Every
//! task approved: the push goes on with the branches the resolver chose. A `changes` verdict
//! stops the round there and hands the resolver the findings: it iterates on that task with
//! them as its instructions, bounded by `maxRetries` like any iterate. A review that cannot
//! give a verdict (the container failed, the answer is malformed) is a failed span with the
//! error in full, handed to the resolver; a push it then decides goes without another review.

mod run;

use std::collections::BTreeMap;
use std::sync::Arc;

use async_trait::async_trait;
use uuid::Uuid;

use super::history::{approved_before, latest_workflow_on_branch};
use super::meta::{
    self, PushMeta, ResolveMeta, ReviewChanges, ReviewMeta, ReviewSpanMeta, TaskReview,
    WorkflowMeta,
};
use super::Services;
use crate::agents::ReviewVerdict;
use crate::orchestrator::{Finished, NextAction, Outcome, SlotFacts, Step, StepContext, StepError};
use crate::store::{
    blocking, AgentMeta, AgentUsage, PendingAction, StepKind, StepRun, TaskMapping, TraceView,
};

pub use run::MAX_DIFF_BYTES;

/// The self-review step.
pub struct ReviewStep {
    services: Arc<Services>,
}

impl ReviewStep {
    pub fn new(services: Arc<Services>) -> ReviewStep {
        ReviewStep { services }
    }
}

/// One task to read: its latest workflow, its worktree and where it forked, its branch's head.
pub(crate) struct ReviewTask {
    pub workflow_action_id: Uuid,
    pub meta: WorkflowMeta,
    pub branch: String,
    pub worktree: std::path::PathBuf,
    pub fork_point: String,
    pub head: String,
}

#[async_trait]
impl Step for ReviewStep {
    fn kind(&self) -> StepKind {
        StepKind::Review
    }

    fn max_parallel(&self) -> usize {
        2
    }

    fn exclusive_per_trace(&self) -> bool {
        true
    }

    /// The reviewer agent runs in a sandbox: one of the daemon's agent slots.
    fn takes_agent_slot(&self) -> bool {
        true
    }

    async fn slot_facts(&self, ctx: &StepContext, pending: &PendingAction) -> SlotFacts {
        let trace_id = pending.trace_id;
        let labels = blocking(ctx.store.clone(), move |s| {
            Ok(crate::steps::agent_call::trace_labels(s, trace_id))
        })
        .await
        .unwrap_or_default();
        SlotFacts {
            labels,
            ..SlotFacts::default()
        }
    }

    async fn process(&self, ctx: &StepContext, run: &StepRun) -> Result<Outcome, StepError> {
        let asked: ReviewMeta = meta::read(&run.action)
            .map_err(|e| StepError::fatal(format!("the review action's meta is invalid: {e}")))?;
        let trace_id = run.pending.trace_id;
        let (view, mappings) = blocking(ctx.store.clone(), move |s| {
            Ok((s.load_trace(trace_id)?, s.read_state()?.task_mappings))
        })
        .await
        .map_err(|e| StepError::from_error(&e, true))?;
        let tasks = self.tasks(&view, &mappings, &asked.branches).await?;
        let mut span_meta = ReviewSpanMeta::default();
        for task in &tasks {
            if let Some(earlier) = approved_before(&view, &task.branch, &task.head) {
                span_meta.reviews.push(TaskReview {
                    carried: true,
                    agent: None,
                    container: None,
                    ..earlier
                });
                continue;
            }
            let read = self.read(ctx, run, task, span_meta.reviews.len()).await;
            if let Some(agent) = &read.agent {
                span_meta.agent = Some(add_usage(span_meta.agent.take(), agent));
            }
            match read.result {
                Ok(review) => {
                    let changes = review.verdict == ReviewVerdict::Changes;
                    span_meta.reviews.push(review);
                    if changes {
                        break;
                    }
                }
                Err(error) => {
                    let summary = format!(
                        "the self-review of {} gave no verdict: {}",
                        task.meta.title, error.message
                    );
                    return Ok(Outcome::Finished(
                        Finished::failed(summary)
                            .with_meta_record(&span_meta)
                            .with_error(&error)
                            .then(NextAction::new(
                                StepKind::Resolve,
                                "the self-review could not give a verdict; the resolver decides",
                            ).with_meta(&ResolveMeta::default())),
                    ));
                }
            }
        }
        Ok(Outcome::Finished(finished(&asked, &span_meta, run.span.id)))
    }
}

impl ReviewStep {
    /// The tasks behind `branches`, in their order: each branch's latest workflow run.
    async fn tasks(
        &self,
        view: &TraceView,
        mappings: &BTreeMap<String, TaskMapping>,
        branches: &[String],
    ) -> Result<Vec<ReviewTask>, StepError> {
        let ws = super::tasks::workspace(&self.services)
            .await
            .map_err(|e| super::tasks::git_error("cannot open the repository", &e))?;
        let mut tasks = Vec::new();
        for branch in branches {
            let Some((id, meta)) = latest_workflow_on_branch(view, mappings, branch) else {
                return Err(StepError::fatal(format!(
                    "the trace has no task on branch `{branch}` to review"
                )));
            };
            let mapping = &mappings[&id.to_string()];
            let (Some(worktree), Some(fork_point)) =
                (mapping.worktree_path.clone(), mapping.fork_point.clone())
            else {
                return Err(StepError::fatal(format!(
                    "the task on branch `{branch}` has no worktree or fork point to review"
                )));
            };
            let head = ws.branch_head(branch).await.map_err(|e| {
                super::tasks::git_error("cannot read the head of the task's branch", &e)
                    .detail("branch", branch)
            })?;
            tasks.push(ReviewTask {
                workflow_action_id: id,
                meta,
                branch: branch.clone(),
                worktree,
                fork_point,
                head,
            });
        }
        Ok(tasks)
    }
}

/// The span and what follows it: the push when every task is approved, else the resolver with
/// the findings of the task that needs changes.
fn finished(asked: &ReviewMeta, span_meta: &ReviewSpanMeta, span_id: Uuid) -> Finished {
    let read = span_meta.reviews.iter().filter(|r| !r.carried).count();
    if let Some(changes) = span_meta.changes().cloned() {
        let count = changes.findings.len();
        let summary = format!(
            "changes: {} ({count} finding{}): {}",
            changes.title,
            if count == 1 { "" } else { "s" },
            changes.summary_line()
        );
        let handed = ReviewChanges {
            span_id,
            workflow_action_id: changes.workflow_action_id,
            branch: changes.branch.clone(),
            title: changes.title.clone(),
            findings: changes.findings_text(),
        };
        return Finished::completed(summary)
            .with_meta_record(span_meta)
            .then(
                NextAction::new(
                    StepKind::Resolve,
                    format!("the self-review asked for changes to {}", changes.title),
                )
                .with_meta(&ResolveMeta {
                    workflow_action_id: Some(changes.workflow_action_id),
                    review: Some(handed),
                    ..ResolveMeta::default()
                }),
            );
    }
    let summary = match (span_meta.reviews.len(), read) {
        (0, _) => "approve: nothing to review".to_owned(),
        (all, read) if read == all => format!("approve: {all} task(s) read and approved"),
        (all, read) => format!(
            "approve: {read} task(s) read, {} approved earlier at the same head",
            all - read
        ),
    };
    Finished::completed(summary.clone())
        .with_meta_record(span_meta)
        .then(
            NextAction::new(
                StepKind::Push,
                format!("push the reviewed work ({summary})"),
            )
            .with_meta(&PushMeta {
                branches: asked.branches.clone(),
            }),
        )
}

/// `total` plus one call's figures (a failed call adds nothing).
fn add_usage(total: Option<AgentMeta>, call: &AgentMeta) -> AgentMeta {
    let Some(add) = call.usage() else {
        return total.unwrap_or_else(|| call.clone());
    };
    let mut sum = total
        .as_ref()
        .and_then(AgentMeta::usage)
        .cloned()
        .unwrap_or_default();
    let AgentUsage {
        turns,
        cost_usd,
        input_tokens,
        output_tokens,
        cached_tokens,
        ..
    } = add;
    sum.turns = Some(sum.turns.unwrap_or(0) + turns.unwrap_or(0));
    sum.cost_usd = Some(sum.cost_usd.unwrap_or(0.0) + cost_usd.unwrap_or(0.0));
    sum.input_tokens += input_tokens;
    sum.output_tokens += output_tokens;
    sum.cached_tokens += cached_tokens;
    AgentMeta::Used(sum)
}

#[cfg(test)]
mod tests;
