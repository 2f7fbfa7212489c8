//! What an ended trace teaches about the CI of its pull request: a check that failed at one
//! head rover pushed, the `iterate` (or `retry`) the resolver decided on it, and a later look
//! at a new head of the same pull request that found every check green. Read from the
//! coordinator's typed CI looks (`CoordinateSpanMeta::ci`, `ci_status`), never from a model.

use uuid::Uuid;

use super::lessons::{fix_between, fix_of, one_line};
use crate::github::{CiState, CiStatus};
use crate::steps::meta::{self, CiWatchMeta, CoordinateSpanMeta, ResolveSpanMeta, WorkflowMeta};
use crate::store::{Span, StepKind, TraceView};

/// A CI check of a pull request that failed, and passed after the fix the trace pushed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CiFix {
    /// The check's name, as the repository's CI reported it (untrusted text).
    pub check: String,
    pub pr_number: u64,
    /// The look that found it failing, the resolve that decided the fix, the look at a later
    /// head that found every check green.
    pub failed: Uuid,
    pub decided: Uuid,
    pub passed: Uuid,
    /// What the fix was, as the resolve recorded it (its instructions, its corrective
    /// commands): untrusted text.
    pub fix: String,
    /// The title of the task the fix iterated on (empty when the trace names none).
    pub task: String,
}

/// A coordinator's look at a pull request's CI, with what it found.
fn looks(view: &TraceView) -> Vec<(&Span, CiWatchMeta, CiStatus)> {
    let mut looks: Vec<_> = view
        .spans
        .iter()
        .filter(|s| s.step == StepKind::Coordinate && s.status.is_final())
        .filter_map(|s| {
            let meta = CoordinateSpanMeta::of(s);
            let watch = meta.ci.filter(|w| !w.after_merge)?;
            Some((s, watch, meta.ci_status?))
        })
        .collect();
    looks.sort_by_key(|(s, _, _)| s.completed.unwrap_or(s.timestamp));
    looks
}

/// Whether a look found every check of its head green.
fn green(status: &CiStatus) -> bool {
    status.state == CiState::Success && status.total > 0 && status.failing.is_empty()
}

/// The title of the task a resolve iterated on, else of the latest workflow run before `at`.
fn task_of(view: &TraceView, resolve: &Span, before: &Span) -> String {
    let title = |action: Uuid| {
        view.actions
            .iter()
            .find(|a| a.id == action)
            .and_then(|a| meta::read::<WorkflowMeta>(a).ok())
            .map(|m| m.title)
    };
    ResolveSpanMeta::read(&resolve.meta)
        .ok()
        .and_then(|m| m.iterate_on)
        .and_then(title)
        .or_else(|| {
            view.spans
                .iter()
                .filter(|s| s.step == StepKind::Workflow && s.timestamp <= before.timestamp)
                .filter_map(|s| s.action_id)
                .next_back()
                .and_then(title)
        })
        .unwrap_or_default()
}

/// Every check that failed at a head of a pull request and was green at a later head of the
/// same pull request, with the resolver's fix between them. A check still red (or never looked
/// at again), or a green head that no `iterate`/`retry` preceded, teaches nothing.
pub fn ci_fixes(view: &TraceView) -> Vec<CiFix> {
    let looks = looks(view);
    let mut fixes = Vec::new();
    for (i, (red, watch, status)) in looks.iter().enumerate() {
        if status.state != CiState::Failure {
            continue;
        }
        let later = looks[i + 1..].iter().find(|(_, w, s)| {
            w.pr_number == watch.pr_number && !w.sha.eq_ignore_ascii_case(&watch.sha) && green(s)
        });
        let Some((passed, _, _)) = later else {
            continue;
        };
        let Some(resolve) = fix_between(view, red, passed) else {
            continue;
        };
        let Some(fix) = fix_of(resolve).filter(|f| !f.is_empty()) else {
            continue;
        };
        let task = task_of(view, resolve, red);
        for check in &status.failing {
            let check = one_line(check);
            if check.is_empty() {
                continue;
            }
            fixes.push(CiFix {
                check,
                pr_number: watch.pr_number,
                failed: red.id,
                decided: resolve.id,
                passed: passed.id,
                fix: fix.clone(),
                task: task.clone(),
            });
        }
    }
    fixes
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::steps::history::testing::Builder;
    use crate::steps::meta::Decision;
    use crate::store::SpanStatus;

    fn csv_task(b: &mut Builder) -> Uuid {
        b.workflow(
            &WorkflowMeta {
                title: "Parse csv".into(),
                ..WorkflowMeta::default()
            },
            SpanStatus::Completed,
        )
    }

    #[test]
    fn a_check_red_then_green_at_a_later_head_after_an_iterate_is_a_fix_with_its_evidence() {
        let mut b = Builder::new();
        let task = csv_task(&mut b);
        let red = b.ci_look("aaa", CiState::Failure, &["ci / test"]);
        let resolve = b.iterate(Some(task), "Quote the csv fields.");
        assert!(ci_fixes(&b.view).is_empty(), "not green yet");
        let green = b.ci_look("bbb", CiState::Success, &[]);
        let fixes = ci_fixes(&b.view);
        assert_eq!(fixes.len(), 1, "{fixes:?}");
        let fix = &fixes[0];
        assert_eq!(fix.check, "ci / test");
        assert_eq!(fix.pr_number, 7);
        assert_eq!(fix.failed, b.span_of(red));
        assert_eq!(fix.decided, b.span_of(resolve));
        assert_eq!(fix.passed, b.span_of(green));
        assert_eq!(fix.fix, "Quote the csv fields.");
        assert_eq!(fix.task, "Parse csv");
    }

    #[test]
    fn a_check_still_red_after_the_fix_or_green_without_a_fix_teaches_nothing() {
        let mut b = Builder::new();
        csv_task(&mut b);
        b.ci_look("aaa", CiState::Failure, &["ci / test"]);
        b.iterate(None, "Try harder.");
        b.ci_look("bbb", CiState::Failure, &["ci / test"]);
        assert!(ci_fixes(&b.view).is_empty());
        // Green at the same head (a re-run of a flaky check): nothing rover pushed fixed it.
        let mut same = Builder::new();
        same.ci_look("aaa", CiState::Failure, &["ci / test"]);
        same.iterate(None, "Quote the csv fields.");
        same.ci_look("aaa", CiState::Success, &[]);
        assert!(ci_fixes(&same.view).is_empty());
        // Green at a new head without an iterate or retry between (a person's push).
        let mut pushed = Builder::new();
        pushed.ci_look("aaa", CiState::Failure, &["ci / test"]);
        pushed.resolve(Decision::Push);
        pushed.ci_look("bbb", CiState::Success, &[]);
        assert!(ci_fixes(&pushed.view).is_empty());
    }
}
