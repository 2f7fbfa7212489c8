//! What an ended trace teaches about its commits' hooks and its environment: a commit whose
//! hooks failed (the commit span's error: the command, its exit code and standard error) and
//! a later commit of the same task that passed after a `retry` or an `iterate`; an environment
//! image that did not build for one workflow run and built for a later one, after a retry (the
//! resolver's or a person's). Read from the typed commit and workflow spans, never from a model.

use uuid::Uuid;

use super::lessons::{fix_between, fix_of, one_line};
use crate::steps::meta::{CommitSpanMeta, Decision, Intervention, WorkflowSpanMeta};
use crate::store::{ErrorMeta, Span, SpanStatus, StepKind, TraceView};

/// A commit whose hooks failed, and a later commit of the same task that passed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HookFix {
    /// The failing command's argv, as the commit span recorded it.
    pub command: Vec<String>,
    /// Its exit code (`None`: a signal ended it).
    pub exit_code: Option<i64>,
    /// The first line of its standard error, on one line (untrusted text).
    pub stderr: String,
    /// The hooks that ran (`pre-commit`, `commit-msg`), as the hook plan named them.
    pub hooks: Vec<String>,
    /// The failed commit, the resolve that decided the retry or iterate, the commit that passed.
    pub failed: Uuid,
    pub decided: Uuid,
    pub passed: Uuid,
    /// What the fix was: the resolve's instructions or corrective commands, else the retry.
    pub fix: String,
    /// The branch committed on.
    pub branch: String,
}

/// An environment that did not build for a run of the trace and built for a later one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EnvironmentFix {
    /// The build's failure, its last line (untrusted: the setup's output).
    pub error: String,
    /// The definition's files (`.rover/setup.sh`, `.devcontainer/devcontainer.json`).
    pub inputs: Vec<String>,
    /// The run whose environment failed, the retry (a resolve or a person's), the run whose
    /// environment built.
    pub failed: Uuid,
    pub decided: Uuid,
    pub passed: Uuid,
    /// What changed: the resolve's fix, the definition's new hash, or the retry.
    pub fix: String,
}

/// A commit span's failure in its hooks: a command that failed while a hook plan ran hooks.
fn hook_failure(span: &Span) -> Option<(CommitSpanMeta, ErrorMeta)> {
    if span.step != StepKind::Commit
        || !matches!(span.status, SpanStatus::Error | SpanStatus::Failed)
    {
        return None;
    }
    let meta = CommitSpanMeta::read(&span.meta).ok()?;
    let ran_hooks = matches!(
        meta.hooks,
        Some(crate::git::HookPlan::Host { .. } | crate::git::HookPlan::Sandbox { .. })
    );
    let error = ErrorMeta::of(span)?;
    (ran_hooks && error.detail("command").is_some()).then_some((meta, error))
}

/// The task a commit span was for (its workflow action, else its branch).
fn same_task(a: &CommitSpanMeta, b: &CommitSpanMeta) -> bool {
    match (
        a.workflow_action_id.flatten(),
        b.workflow_action_id.flatten(),
    ) {
        (Some(x), Some(y)) => x == y,
        _ => a.branch_name.is_some() && a.branch_name == b.branch_name,
    }
}

/// The fix a resolve recorded, else what it decided in words.
fn fix_or_retry(resolve: &Span, what: &str) -> String {
    fix_of(resolve).unwrap_or_else(|| match super::decision_of(resolve) {
        Some(Decision::Iterate) => format!("an iteration of the task ({what})"),
        _ => format!("a retry ({what})"),
    })
}

/// Every commit whose hooks failed and whose task committed later, after a `retry` or an
/// `iterate` the resolver decided. A commit that never passed teaches nothing.
pub fn hook_fixes(view: &TraceView) -> Vec<HookFix> {
    let mut fixes = Vec::new();
    for failed in &view.spans {
        let Some((meta, error)) = hook_failure(failed) else {
            continue;
        };
        let passed = view.spans.iter().find(|s| {
            s.step == StepKind::Commit
                && s.status == SpanStatus::Completed
                && s.timestamp >= failed.completed.unwrap_or(failed.timestamp)
                && CommitSpanMeta::read(&s.meta).is_ok_and(|m| m.committed && same_task(&meta, &m))
        });
        let Some(passed) = passed else { continue };
        let Some(resolve) = fix_between(view, failed, passed) else {
            continue;
        };
        let command: Vec<String> = error
            .detail("command")
            .and_then(|v| serde_json::from_value(v.clone()).ok())
            .unwrap_or_default();
        let stderr = error
            .detail("stderr")
            .and_then(|v| v.as_str())
            .and_then(|s| s.lines().map(str::trim).find(|l| !l.is_empty()))
            .map(one_line)
            .unwrap_or_default();
        let hooks = match meta.hooks {
            Some(
                crate::git::HookPlan::Host { hooks, .. }
                | crate::git::HookPlan::Sandbox { hooks, .. },
            ) => hooks,
            _ => Vec::new(),
        };
        fixes.push(HookFix {
            command: command.iter().map(|c| one_line(c)).collect(),
            exit_code: error.detail("exitCode").and_then(serde_json::Value::as_i64),
            stderr,
            hooks: hooks.iter().map(|h| one_line(h)).collect(),
            failed: failed.id,
            decided: resolve.id,
            passed: passed.id,
            fix: fix_or_retry(resolve, "of the commit"),
            branch: meta.branch_name.unwrap_or_default(),
        });
    }
    fixes
}

/// The environment a workflow span recorded.
fn environment(span: &Span) -> Option<crate::environment::EnvironmentMeta> {
    if span.step != StepKind::Workflow {
        return None;
    }
    crate::store::from_meta::<WorkflowSpanMeta>(&span.meta)
        .ok()?
        .environment
}

/// A person's `retry` between `failed` and `passed` (its span).
fn persons_retry<'v>(view: &'v TraceView, failed: &Span, passed: &Span) -> Option<&'v Span> {
    let failed_at = failed.completed.unwrap_or(failed.timestamp);
    view.spans
        .iter()
        .filter(|s| Intervention::of(s) == Some(Intervention::Retry))
        .rfind(|s| s.timestamp >= failed_at && s.timestamp <= passed.timestamp)
}

/// The first environment that did not build and a later run whose environment built, with the
/// retry between them (the resolver's `retry`/`iterate`, or a person's `retry`). An environment
/// that never built teaches nothing.
pub fn environment_fixes(view: &TraceView) -> Vec<EnvironmentFix> {
    let Some((failed, broken)) = view
        .spans
        .iter()
        .find_map(|s| environment(s).filter(|e| e.error.is_some()).map(|e| (s, e)))
    else {
        return Vec::new();
    };
    let built = view.spans.iter().find_map(|s| {
        let env = environment(s)?;
        (s.timestamp > failed.timestamp && env.error.is_none()).then_some((s, env))
    });
    let Some((passed, fixed)) = built else {
        return Vec::new();
    };
    let changed = match (&broken.hash, &fixed.hash) {
        (Some(a), Some(b)) if a != b => Some(format!(
            "the definition changed (image {} → {})",
            a.get(..12).unwrap_or(a),
            b.get(..12).unwrap_or(b)
        )),
        _ => None,
    };
    let (decided, fix) = if let Some(resolve) = fix_between(view, failed, passed) {
        (resolve, fix_or_retry(resolve, "of the run"))
    } else if let Some(retry) = persons_retry(view, failed, passed) {
        (retry, "a person's retry".to_owned())
    } else {
        return Vec::new();
    };
    let fix = match changed {
        Some(changed) => format!("{fix}; {changed}"),
        None => fix,
    };
    let error = broken
        .error
        .as_deref()
        .and_then(|e| e.lines().map(str::trim).rfind(|l| !l.is_empty()))
        .map(one_line)
        .unwrap_or_default();
    vec![EnvironmentFix {
        error,
        inputs: broken.inputs.iter().map(|i| one_line(i)).collect(),
        failed: failed.id,
        decided: decided.id,
        passed: passed.id,
        fix,
    }]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::environment::{EnvSource, EnvironmentMeta};
    use crate::steps::history::testing::Builder;
    use crate::store::Meta;

    #[test]
    fn a_commit_whose_hook_failed_and_passed_after_a_retry_is_a_fix_with_its_evidence() {
        let mut b = Builder::new();
        let wf = b.bare(StepKind::Workflow, SpanStatus::Completed);
        let failed = b.hook_failed_commit(wf, "trailing whitespace in src/a.rs");
        assert!(hook_fixes(&b.view).is_empty(), "not passed yet");
        let retry = b.resolve(Decision::Retry);
        let passed = b.passed_commit(wf, "rover/a");
        let fixes = hook_fixes(&b.view);
        assert_eq!(fixes.len(), 1, "{fixes:?}");
        let fix = &fixes[0];
        assert_eq!(fix.command, vec!["git", "commit", "-F", "-"]);
        assert_eq!(fix.exit_code, Some(1));
        assert_eq!(fix.stderr, "trailing whitespace in src/a.rs");
        assert_eq!(fix.hooks, vec!["pre-commit"]);
        assert_eq!(fix.failed, b.span_of(failed));
        assert_eq!(fix.decided, b.span_of(retry));
        assert_eq!(fix.passed, b.span_of(passed));
        assert_eq!(fix.fix, "a retry (of the commit)");
        assert_eq!(fix.branch, "rover/a");
    }

    #[test]
    fn a_hook_that_never_passed_or_passed_without_a_retry_teaches_nothing() {
        let mut b = Builder::new();
        let wf = b.bare(StepKind::Workflow, SpanStatus::Completed);
        b.hook_failed_commit(wf, "lint failed");
        b.iterate(Some(wf), "Strip the trailing whitespace.");
        b.hook_failed_commit(wf, "lint failed");
        assert!(hook_fixes(&b.view).is_empty());
        // Another task's commit passing is no fix of this one.
        let other = b.bare(StepKind::Workflow, SpanStatus::Completed);
        b.resolve(Decision::Retry);
        b.passed_commit(other, "rover/b");
        assert!(hook_fixes(&b.view).is_empty());
        // Passed with no retry or iterate between: nothing says what fixed it.
        let mut c = Builder::new();
        let wf = c.bare(StepKind::Workflow, SpanStatus::Completed);
        c.hook_failed_commit(wf, "lint failed");
        c.passed_commit(wf, "rover/a");
        assert!(hook_fixes(&c.view).is_empty());
    }

    fn env(error: Option<&str>, hash: &str) -> Meta {
        crate::store::to_meta(&WorkflowSpanMeta {
            environment: Some(EnvironmentMeta {
                source: EnvSource::SetupScript,
                hash: Some(hash.into()),
                inputs: vec![".rover/setup.sh".into()],
                built: error.is_none(),
                error: error.map(str::to_owned),
                ..EnvironmentMeta::image("rover-env")
            }),
            ..WorkflowSpanMeta::default()
        })
    }

    #[test]
    fn an_environment_that_built_after_a_retry_is_a_fix_and_one_that_never_built_is_not() {
        let mut b = Builder::new();
        let failed = b.span(
            StepKind::Workflow,
            SpanStatus::Error,
            Meta::new(),
            env(
                Some("step 3/4\napt-get: package libfoo-dev not found\n"),
                "aaaa",
            ),
        );
        let retry = b.resolve(Decision::Retry);
        assert!(environment_fixes(&b.view).is_empty(), "not built yet");
        b.span(
            StepKind::Workflow,
            SpanStatus::Error,
            Meta::new(),
            env(Some("still broken"), "aaaa"),
        );
        assert!(environment_fixes(&b.view).is_empty(), "still not built");
        let passed = b.span(
            StepKind::Workflow,
            SpanStatus::Completed,
            Meta::new(),
            env(None, "bbbb"),
        );
        let fixes = environment_fixes(&b.view);
        assert_eq!(fixes.len(), 1, "{fixes:?}");
        let fix = &fixes[0];
        assert_eq!(fix.error, "apt-get: package libfoo-dev not found");
        assert_eq!(fix.inputs, vec![".rover/setup.sh"]);
        assert_eq!(fix.failed, b.span_of(failed));
        assert_eq!(fix.decided, b.span_of(retry));
        assert_eq!(fix.passed, b.span_of(passed));
        assert_eq!(
            fix.fix,
            "a retry (of the run); the definition changed (image aaaa → bbbb)"
        );
    }

    #[test]
    fn an_environment_that_built_after_a_persons_retry_is_a_fix_and_without_any_retry_is_not() {
        let mut b = Builder::new();
        b.span(
            StepKind::Workflow,
            SpanStatus::Error,
            Meta::new(),
            env(Some("pip: no matching distribution"), "aaaa"),
        );
        let mut without = Builder::new();
        without.view = b.view.clone();
        without.clock = b.clock;
        let retry = b.bare(StepKind::Other("retry".into()), SpanStatus::Completed);
        for built in [&mut b, &mut without] {
            built.span(
                StepKind::Workflow,
                SpanStatus::Completed,
                Meta::new(),
                env(None, "bbbb"),
            );
        }
        let fixes = environment_fixes(&b.view);
        assert_eq!(fixes.len(), 1, "{fixes:?}");
        assert_eq!(fixes[0].decided, b.span_of(retry));
        assert_eq!(
            fixes[0].fix,
            "a person's retry; the definition changed (image aaaa → bbbb)"
        );
        assert!(environment_fixes(&without.view).is_empty());
    }
}
