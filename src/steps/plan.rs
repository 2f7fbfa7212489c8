//! The `plan` step: the agent (read-only tools in the checkout) turns a directive into 1..N
//! `workflow` actions whose `dependsOn` name preset action ids of the same plan, or one
//! clarification `notify`, or — when there is nothing to do — a `noop`. Cycles and unknown
//! references are rejected with the offending ids in the error.

use std::collections::BTreeMap;
use std::sync::Arc;

use async_trait::async_trait;
use uuid::Uuid;

use super::agent_call::{agent_error, ask, load_trace, render_trace, task_mappings, usage_meta};
use super::meta::workflow_meta;
use super::meta::{
    self, Decision, NoopMeta, NotifyMeta, NotifyPurpose, PlanMeta, PlanSpanMeta, PlannedTask,
};
use super::Services;
use crate::agents::{
    check_dependencies, untrusted_block, AgentStep, PlanResult, PromptVars, StepResult, TaskSpec,
};
use crate::orchestrator::{Finished, NextAction, Outcome, Step, StepContext, StepError};
use crate::store::{StepKind, StepRun};

/// The workflow actions of a plan: preset ids, `dependsOn` mapped from task ids to action ids,
/// the existing task and branch (an iteration on a rover PR) on the first task that depends on
/// nothing.
pub fn workflow_actions(tasks: &[TaskSpec], plan: &PlanMeta) -> Result<Vec<NextAction>, String> {
    check_dependencies(tasks)?;
    let ids: BTreeMap<&str, Uuid> = tasks
        .iter()
        .map(|t| (t.id.as_str(), Uuid::new_v4()))
        .collect();
    let iterating = tasks.iter().position(|t| t.depends_on.is_empty());
    Ok(tasks
        .iter()
        .enumerate()
        .map(|(i, task)| {
            let depends_on = task.depends_on.iter().map(|d| ids[d.as_str()]).collect();
            let mut meta = workflow_meta(task, depends_on);
            if Some(i) == iterating && plan.existing_task.is_some() {
                meta.iterate_on = plan.existing_task;
                meta.branch.clone_from(&plan.branch);
            }
            NextAction::new(
                StepKind::Workflow,
                format!("task `{}`: {}", task.id, meta.title),
            )
            .with_id(ids[task.id.as_str()])
            .with_meta(&meta)
        })
        .collect())
}

pub struct PlanStep {
    services: Arc<Services>,
}

impl PlanStep {
    pub fn new(services: Arc<Services>) -> PlanStep {
        PlanStep { services }
    }
}

#[async_trait]
impl Step for PlanStep {
    fn kind(&self) -> StepKind {
        StepKind::Plan
    }

    fn always_recorded(&self) -> bool {
        crate::steps::kinds::always_recorded(&self.kind())
    }

    fn max_parallel(&self) -> usize {
        2
    }

    async fn process(&self, ctx: &StepContext, run: &StepRun) -> Result<Outcome, StepError> {
        let plan: PlanMeta = meta::read(&run.action).map_err(|e| {
            StepError::fatal(format!("the plan action's meta cannot be read: {e}"))
                .detail("actionId", run.action.id.to_string())
        })?;
        if plan.directive.trim().is_empty() {
            return Err(
                StepError::fatal("the plan action has no directive: nothing to plan")
                    .detail("actionId", run.action.id.to_string()),
            );
        }
        let view = load_trace(ctx, run.pending.trace_id).await?;
        let existing = match plan.existing_task {
            Some(id) => {
                let key = id.to_string();
                let mapping = task_mappings(ctx)
                    .await?
                    .into_iter()
                    .find(|t| t.workflow_action_id == Some(id));
                // Task ids and branch names come from agents and events: data.
                match mapping.map(|t| t.mapping) {
                    Some(m) => format!(
                        "Iterate on the rover task below (workflow action {key}); its pull request carries the feedback above.\n{}",
                        untrusted_block(
                            "rover's task mapping",
                            &format!("task: {}\nbranch: {}", m.task_id, m.branch_name)
                        )
                    ),
                    None => format!(
                        "Workflow action {key}, on the branch below (its task mapping is gone).\n{}",
                        untrusted_block(
                            "the plan action",
                            &format!("branch: {}", plan.branch.as_deref().unwrap_or("unknown"))
                        )
                    ),
                }
            }
            None => "(none: this is new work)".to_owned(),
        };
        let mut vars = PromptVars::new();
        // The coordinator wrote the directive from the event: it says what is asked, it cannot
        // change the planner's rules.
        vars.insert(
            "directive".into(),
            untrusted_block("the coordinator's directive", &plan.directive),
        );
        vars.insert("trace".into(), render_trace(&view));
        vars.insert("existing_task".into(), existing);
        let (lessons, used) =
            super::recall::prompt_lessons(&self.services, &ctx.store, plan.directive.clone()).await;
        vars.insert("lessons".into(), lessons);
        let answer = ask::<PlanResult>(&self.services, ctx, run.span.id, AgentStep::Plan, vars)
            .await
            .map_err(|e| agent_error(AgentStep::Plan, &e))?;
        let result = &answer.value;
        let mut span_meta = PlanSpanMeta {
            analysis: result.analysis.clone(),
            agent: Some(usage_meta(&answer)),
            lessons: used,
            ..PlanSpanMeta::default()
        };

        if let Some(question) = result
            .clarification
            .as_deref()
            .map(str::trim)
            .filter(|q| !q.is_empty())
        {
            span_meta.decided.decision = Some(Decision::Clarify);
            span_meta.clarification = Some(question.to_owned());
            return Ok(Outcome::Finished(
                Finished::completed(format!("asked for clarification: {question}"))
                    .with_meta_record(&span_meta)
                    .then(
                        NextAction::new(StepKind::Notify, "the planner needs clarification")
                            .with_meta(&NotifyMeta {
                                purpose: NotifyPurpose::Clarify,
                                message: Some(question.to_owned()),
                                ..NotifyMeta::default()
                            }),
                    ),
            ));
        }
        if result.tasks.is_empty() {
            let reason = format!(
                "the planner found nothing to do: {}",
                result.analysis.trim()
            );
            span_meta.decided.decision = Some(Decision::Empty);
            let next = NextAction::new(StepKind::Noop, &reason).with_meta(&NoopMeta::default());
            return Ok(Outcome::Finished(
                Finished::completed(reason)
                    .with_meta_record(&span_meta)
                    .then(next),
            ));
        }
        // `validate` ran inside the structured call; checked again here so the error names
        // the offending tasks even if validation changes.
        let actions = result
            .validate()
            .and_then(|()| workflow_actions(&result.tasks, &plan))
            .map_err(|reason| {
                StepError::fatal(format!("the plan was rejected: {reason}"))
                    .detail("tasks", &result.tasks)
            })?;
        span_meta.decided.decision = Some(Decision::Tasks);
        span_meta.tasks = Some(
            result
                .tasks
                .iter()
                .zip(&actions)
                .map(|(t, a)| PlannedTask {
                    task_id: t.id.clone(),
                    action_id: a.id,
                    title: t.title.clone(),
                    workflow_type: t.workflow_type,
                    depends_on: t.depends_on.clone(),
                })
                .collect(),
        );
        let mut done = Finished::completed(format!(
            "planned {} task(s): {}",
            actions.len(),
            result
                .tasks
                .iter()
                .map(|t| t.title.trim())
                .collect::<Vec<_>>()
                .join("; ")
        ))
        .with_meta_record(&span_meta);
        done.actions = actions;
        Ok(Outcome::Finished(done))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agents;
    use crate::steps::meta::{WorkflowMeta, WorkflowType};

    fn task(id: &str, deps: &[&str]) -> TaskSpec {
        TaskSpec {
            id: id.into(),
            title: format!(" Task {id} "),
            description: format!("do {id}"),
            acceptance_criteria: vec![format!("{id} works")],
            workflow_type: agents::WorkflowType::CodeReview,
            depends_on: deps.iter().map(|d| (*d).to_owned()).collect(),
        }
    }

    #[test]
    fn unknown_references_and_cycles_are_named() {
        let err = check_dependencies(&[task("a", &["zz"])]).expect_err("unknown");
        assert_eq!(err, "task `a` depends on unknown task `zz`");
        let err = check_dependencies(&[task("a", &[]), task("b", &["c"]), task("c", &["b"])])
            .expect_err("cycle");
        assert_eq!(err, "task dependencies form a cycle among `b`, `c`");
        let err = check_dependencies(&[task("a", &["a"])]).expect_err("self");
        assert!(err.contains("cycle"), "{err}");
        let err = check_dependencies(&[task("a", &[]), task("a", &[])]).expect_err("dup");
        assert!(err.contains("unique"), "{err}");
        check_dependencies(&[task("a", &[]), task("b", &["a"]), task("c", &["a", "b"])])
            .expect("a diamond is fine");
    }

    #[test]
    fn actions_get_preset_ids_and_mapped_dependencies() {
        let plan = PlanMeta {
            directive: "d".into(),
            existing_task: None,
            branch: None,
        };
        let actions =
            workflow_actions(&[task("b", &["a"]), task("a", &[])], &plan).expect("valid plan");
        let ids: Vec<Uuid> = actions.iter().map(|a| a.id.expect("preset id")).collect();
        let first: WorkflowMeta = crate::store::from_meta(&actions[0].meta).expect("meta");
        assert_eq!(first.depends_on, vec![ids[1]]);
        assert_eq!(first.title, "Task b");
        assert_eq!(first.workflow_type, WorkflowType::CodeReview);
        assert_eq!(first.iterate_on, None);
        assert!(workflow_actions(&[task("a", &["a"])], &plan).is_err());
    }

    #[test]
    fn an_iteration_goes_to_the_first_task_without_dependencies() {
        let existing = Uuid::new_v4();
        let plan = PlanMeta {
            directive: "d".into(),
            existing_task: Some(existing),
            branch: Some("rover/x".into()),
        };
        let actions = workflow_actions(&[task("b", &["a"]), task("a", &[])], &plan).expect("ok");
        let metas: Vec<WorkflowMeta> = actions
            .iter()
            .map(|a| crate::store::from_meta(&a.meta).expect("meta"))
            .collect();
        assert_eq!(metas[0].iterate_on, None);
        assert_eq!(metas[1].iterate_on, Some(existing));
        assert_eq!(metas[1].branch.as_deref(), Some("rover/x"));
    }
}
