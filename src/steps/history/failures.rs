//! What went wrong in the trace: its failed runs, the latest of them, the workflow behind it,
//! a conflict or a refused push it ended with, a worktree its sandbox tampered with, an
//! environment that did not build.

use uuid::Uuid;

use super::work::workflow_of_commit;
use crate::steps::meta::{
    self, ConflictSpanMeta, OutcomeSpanMeta, PushConflict, SecretsFound, SecretsSpanMeta,
    WorkflowMeta, WorkflowSpanMeta,
};
use crate::store::{RunSpanMeta, Span, SpanStatus, StepKind, TraceView};

/// Whether `span` did not complete (it failed or errored).
fn unsuccessful(span: &Span) -> bool {
    matches!(span.status, SpanStatus::Failed | SpanStatus::Error)
}

/// The trace's spans that did not complete, in order.
pub fn failed_runs(view: &TraceView) -> impl Iterator<Item = &Span> {
    view.spans.iter().filter(|s| unsuccessful(s))
}

/// The latest span of `kind` that did not complete.
pub fn last_unsuccessful<'v>(view: &'v TraceView, kind: &StepKind) -> Option<&'v Span> {
    view.spans
        .iter()
        .rev()
        .find(|s| &s.step == kind && unsuccessful(s))
}

/// The latest span that did not complete among workflow, commit and push: the step a failure
/// notify names.
pub fn last_failure(view: &TraceView) -> Option<&Span> {
    view.spans.iter().rev().find(|s| {
        matches!(
            s.step,
            StepKind::Workflow | StepKind::Commit | StepKind::Push
        ) && unsuccessful(s)
    })
}

/// The run a person's (or a `/rover`) `retry` means: the latest step run that errored, not one
/// a budget or a person stopped.
pub fn last_errored_run(view: &TraceView) -> Option<&Span> {
    view.spans
        .iter()
        .filter(|s| s.status == SpanStatus::Error && s.action_id.is_some())
        .filter(|s| !RunSpanMeta::of(s).stopped())
        .max_by_key(|s| s.completed.unwrap_or(s.timestamp))
}

/// The workflow action to iterate on or retry: the one behind the latest unsuccessful workflow
/// or commit, else the latest workflow.
pub fn failed_workflow(view: &TraceView) -> Option<(Uuid, WorkflowMeta)> {
    let from_span = |span: &Span| -> Option<Uuid> {
        match span.step {
            StepKind::Workflow => span.action_id,
            StepKind::Commit => workflow_of_commit(view, span),
            _ => None,
        }
    };
    // A task that never started because its dependency failed is not the one to iterate: the
    // dependency is (it has the worktree and the failure).
    let never_started = |span: &Span| OutcomeSpanMeta::of(span).dependency_failed.is_some();
    let candidate = view
        .spans
        .iter()
        .rev()
        .filter(|s| unsuccessful(s))
        .filter(|s| !never_started(s))
        .find_map(from_span)
        .or_else(|| {
            view.spans
                .iter()
                .rev()
                .find(|s| s.step == StepKind::Workflow)
                .and_then(|s| s.action_id)
        })?;
    let action = view.actions.iter().find(|a| a.id == candidate)?;
    let meta = meta::read::<WorkflowMeta>(action).ok()?;
    Some((candidate, meta))
}

/// A span that recorded a worktree tampered with by its sandbox.
pub fn tampered_span(view: &TraceView) -> Option<&Span> {
    view.spans.iter().find(|s| OutcomeSpanMeta::is_tampered(s))
}

/// Whether `span` is a workflow span whose environment build failed.
pub fn environment_failed(span: &Span) -> bool {
    span.step == StepKind::Workflow
        && crate::store::from_meta::<WorkflowSpanMeta>(&span.meta)
            .ok()
            .and_then(|m| m.environment)
            .is_some_and(|e| e.error.is_some())
}

/// The first workflow span of the trace whose environment did not build.
pub fn environment_failure(view: &TraceView) -> Option<&Span> {
    view.spans.iter().find(|s| environment_failed(s))
}

/// The trace's latest push, when it was refused for the secrets it would have sent: the span,
/// its branch and what it found. A later push that went through clears it (a person rewrote
/// the branch's history and retried).
pub fn refused_for_secrets(view: &TraceView) -> Option<(&Span, String, SecretsFound)> {
    let push = view
        .spans
        .iter()
        .rev()
        .find(|s| s.step == StepKind::Push && s.status.is_final())?;
    let (branch, found) = SecretsSpanMeta::of(push)?;
    Some((push, branch, found))
}

/// Whether `span` is a push that could not consolidate the task branches, or a merge whose
/// branch conflicts with the base that moved on (both record a [`PushConflict`]).
pub fn is_conflict(span: &Span) -> bool {
    matches!(span.step, StepKind::Push | StepKind::Merge) && ConflictSpanMeta::of(span).is_some()
}

/// The conflict of the trace's latest failure, when that failure is a push that could not
/// consolidate the task branches or a merge that conflicts with its base.
pub fn latest_conflict(view: &TraceView) -> Option<PushConflict> {
    let latest = failed_runs(view).max_by_key(|s| s.completed.unwrap_or(s.timestamp))?;
    ConflictSpanMeta::of(latest)
}

/// Whether the trace's latest failure is a consolidation conflict with no commit after it
/// (a push would meet the same conflict).
pub fn conflict_unchanged(view: &TraceView) -> bool {
    if latest_conflict(view).is_none() {
        return false;
    }
    let conflict_at = view
        .spans
        .iter()
        .filter(|s| is_conflict(s))
        .filter_map(|s| s.completed)
        .max();
    !view.spans.iter().any(|s| {
        s.step == StepKind::Commit
            && s.status == SpanStatus::Completed
            && s.completed.zip(conflict_at).is_some_and(|(c, at)| c > at)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::steps::history::testing::Builder;
    use crate::steps::meta::{PushSpanMeta, PushStatus};
    use crate::store::Meta;

    fn error(tampered: bool) -> Meta {
        let mut meta = Meta::new();
        meta.insert(
            "error".into(),
            serde_json::json!({"message": "boom", "tampered": tampered}),
        );
        meta
    }

    #[test]
    fn the_last_failure_is_the_latest_unsuccessful_workflow_commit_or_push() {
        let mut b = Builder::new();
        assert!(last_failure(&b.view).is_none());
        let wf = b.bare(StepKind::Workflow, SpanStatus::Failed);
        b.commit(wf, SpanStatus::Error);
        b.bare(StepKind::Notify, SpanStatus::Error);
        b.bare(StepKind::Push, SpanStatus::Completed);
        assert_eq!(
            last_failure(&b.view).map(|s| s.step.clone()),
            Some(StepKind::Commit)
        );
        assert_eq!(
            last_unsuccessful(&b.view, &StepKind::Workflow).and_then(|s| s.action_id),
            Some(wf)
        );
        assert!(last_unsuccessful(&b.view, &StepKind::Push).is_none());
        assert_eq!(failed_runs(&b.view).count(), 3);
    }

    #[test]
    fn the_run_to_retry_is_the_latest_errored_one_not_stopped_by_a_person() {
        let mut b = Builder::new();
        b.bare(StepKind::Workflow, SpanStatus::Failed);
        assert!(last_errored_run(&b.view).is_none());
        let first = b.span(
            StepKind::Commit,
            SpanStatus::Error,
            Meta::new(),
            error(false),
        );
        let mut stopped = error(false);
        RunSpanMeta {
            closed_by_hand: true,
            ..RunSpanMeta::default()
        }
        .put_into(&mut stopped);
        b.span(StepKind::Push, SpanStatus::Error, Meta::new(), stopped);
        assert_eq!(
            last_errored_run(&b.view).and_then(|s| s.action_id),
            Some(first)
        );
    }

    #[test]
    fn the_failed_workflow_is_behind_the_latest_failure_not_a_task_its_dependency_kept() {
        let mut b = Builder::new();
        let task = |title: &str| WorkflowMeta {
            title: title.into(),
            ..WorkflowMeta::default()
        };
        let parser = b.workflow(&task("parser"), SpanStatus::Completed);
        b.commit(parser, SpanStatus::Failed);
        let mut kept = Meta::new();
        kept.insert("dependencyFailed".into(), parser.to_string().into());
        b.span(
            StepKind::Workflow,
            SpanStatus::Failed,
            crate::store::to_meta(&task("cli")),
            kept,
        );
        let (id, meta) = failed_workflow(&b.view).expect("found");
        assert_eq!((id, meta.title.as_str()), (parser, "parser"));
        // With no failure, the latest workflow.
        let mut b = Builder::new();
        b.workflow(&task("a"), SpanStatus::Completed);
        let last = b.workflow(&task("b"), SpanStatus::Completed);
        assert_eq!(failed_workflow(&b.view).map(|f| f.0), Some(last));
    }

    #[test]
    fn a_tampered_worktree_is_found_by_its_flag_or_its_error() {
        let mut b = Builder::new();
        let workflow = b.bare(StepKind::Workflow, SpanStatus::Completed);
        b.commit(workflow, SpanStatus::Completed);
        b.span(
            StepKind::Commit,
            SpanStatus::Error,
            Meta::new(),
            error(false),
        );
        assert!(tampered_span(&b.view).is_none());
        b.span(
            StepKind::Commit,
            SpanStatus::Error,
            Meta::new(),
            error(true),
        );
        assert_eq!(
            tampered_span(&b.view).map(|s| s.step.clone()),
            Some(StepKind::Commit)
        );
        let mut b = Builder::new();
        let mut flag = Meta::new();
        flag.insert("tampered".into(), true.into());
        b.span(StepKind::Workflow, SpanStatus::Failed, Meta::new(), flag);
        assert!(tampered_span(&b.view).is_some());
    }

    #[test]
    fn an_environment_failure_is_a_workflow_span_whose_build_recorded_an_error() {
        let mut b = Builder::new();
        let env = |error: Option<&str>| {
            crate::store::to_meta(&WorkflowSpanMeta {
                environment: Some(crate::environment::EnvironmentMeta {
                    error: error.map(str::to_owned),
                    ..crate::environment::EnvironmentMeta::image("rover/env:1")
                }),
                ..WorkflowSpanMeta::default()
            })
        };
        b.span(
            StepKind::Workflow,
            SpanStatus::Completed,
            Meta::new(),
            env(None),
        );
        assert!(environment_failure(&b.view).is_none());
        let failed = env(Some("setup.sh exited 1"));
        b.span(
            StepKind::Workflow,
            SpanStatus::Failed,
            Meta::new(),
            failed.clone(),
        );
        assert!(environment_failure(&b.view).is_some());
        // The same meta on another step's span is no environment failure.
        let mut b = Builder::new();
        b.span(StepKind::Commit, SpanStatus::Failed, Meta::new(), failed);
        assert!(environment_failure(&b.view).is_none());
    }

    #[test]
    fn a_push_refused_for_secrets_counts_until_a_later_push_goes_through() {
        let mut b = Builder::new();
        assert!(refused_for_secrets(&b.view).is_none());
        let refused = crate::store::to_meta(&PushSpanMeta {
            status: Some(PushStatus::Secrets),
            branch: Some("rover/a".into()),
            secrets_found: Some(SecretsFound {
                findings: Vec::new(),
                more: 1,
            }),
            ..PushSpanMeta::default()
        });
        b.span(StepKind::Push, SpanStatus::Failed, Meta::new(), refused);
        let (span, branch, found) = refused_for_secrets(&b.view).expect("refused");
        assert_eq!(
            (span.step.clone(), branch.as_str(), found.more),
            (StepKind::Push, "rover/a", 1)
        );
        b.bare(StepKind::Push, SpanStatus::Completed);
        assert!(refused_for_secrets(&b.view).is_none());
    }

    #[test]
    fn a_conflict_stays_unchanged_until_a_commit_after_it() {
        let mut b = Builder::new();
        assert!(latest_conflict(&b.view).is_none() && !conflict_unchanged(&b.view));
        let conflict = crate::store::to_meta(&PushSpanMeta {
            conflict: Some(PushConflict {
                source_branch: "rover/b".into(),
                target: "rover/a".into(),
                files: vec!["src/lib.rs".into()],
                base: false,
            }),
            ..PushSpanMeta::default()
        });
        b.span(StepKind::Push, SpanStatus::Failed, Meta::new(), conflict);
        assert_eq!(
            latest_conflict(&b.view).map(|c| c.files),
            Some(vec!["src/lib.rs".to_owned()])
        );
        assert!(conflict_unchanged(&b.view));
        let wf = b.bare(StepKind::Workflow, SpanStatus::Completed);
        b.commit(wf, SpanStatus::Completed);
        assert!(!conflict_unchanged(&b.view));
        // A later failure that is no conflict: the conflict is no longer the latest failure.
        b.bare(StepKind::Workflow, SpanStatus::Failed);
        assert!(latest_conflict(&b.view).is_none());
    }

    #[test]
    fn a_merge_that_conflicts_with_its_base_is_the_latest_conflict_until_a_commit() {
        let mut b = Builder::new();
        let conflict = PushConflict {
            source_branch: "rover/a".into(),
            target: "origin/main".into(),
            files: vec!["csv.txt".into()],
            base: true,
        };
        let merge = crate::store::to_meta(&crate::steps::meta::MergeSpanMeta {
            conflict: Some(conflict.clone()),
            ..Default::default()
        });
        b.span(StepKind::Merge, SpanStatus::Failed, Meta::new(), merge);
        assert_eq!(latest_conflict(&b.view), Some(conflict.clone()));
        assert!(conflict_unchanged(&b.view));
        // A resolve span that repeats the conflict in its meta is not a conflict itself.
        let resolve = crate::store::to_meta(&crate::steps::meta::ResolveSpanMeta {
            conflict: Some(conflict),
            ..Default::default()
        });
        b.span(
            StepKind::Resolve,
            SpanStatus::Completed,
            Meta::new(),
            resolve,
        );
        assert_eq!(b.view.spans.iter().filter(|s| is_conflict(s)).count(), 1);
        let wf = b.bare(StepKind::Workflow, SpanStatus::Completed);
        b.commit(wf, SpanStatus::Completed);
        assert!(!conflict_unchanged(&b.view));
    }
}
