//! What the trace's deciding spans decided: whether its coordinator acted, how many looks at CI
//! were red, how many retries and waits its resolvers spent, and whether another resolve already
//! decided what the current one would.

use uuid::Uuid;

use crate::steps::meta::{Decision, DecisionSpanMeta, SecretsSpanMeta, WAIT_PREFIX};
use crate::store::{Span, SpanStatus, StepKind, TraceView};

/// What `span` decided, if it is a deciding span that says.
pub fn decision_of(span: &Span) -> Option<Decision> {
    DecisionSpanMeta::of(span).decision
}

/// How many of the trace's `step` spans decided one of `decisions`.
fn decided(view: &TraceView, step: &StepKind, wanted: impl Fn(&Decision) -> bool) -> u32 {
    let n = view
        .spans
        .iter()
        .filter(|s| &s.step == step)
        .filter(|s| decision_of(s).is_some_and(|d| wanted(&d)))
        .count();
    u32::try_from(n).unwrap_or(u32::MAX)
}

/// Whether the trace's coordinator decided to act on its event (a completed `coordinate` that
/// decided neither `noop` nor `wait`): a newer trace that acted settles the older waits on the
/// same subject.
pub fn coordinator_acted(view: &TraceView) -> bool {
    view.spans.iter().any(|s| {
        s.step == StepKind::Coordinate
            && s.status == SpanStatus::Completed
            && decision_of(s).is_some_and(|d| d.is_action())
    })
}

/// How many of the trace's looks at CI found it red (failed `coordinate` runs decided by CI).
pub fn red_ci_looks(view: &TraceView) -> u32 {
    let n = view
        .spans
        .iter()
        .filter(|s| DecisionSpanMeta::is_red_ci(s))
        .count();
    u32::try_from(n).unwrap_or(u32::MAX)
}

/// How many `iterate` and `retry` decisions the trace's resolves made so far: what
/// `pipeline.maxRetries` limits.
pub fn retries_so_far(view: &TraceView) -> u32 {
    decided(view, &StepKind::Resolve, Decision::is_retry)
}

/// How many `wait` decisions the trace's resolves made so far: what `pipeline.maxWaits` limits.
pub fn resolver_waits(view: &TraceView) -> u32 {
    decided(view, &StepKind::Resolve, |d| *d == Decision::Wait)
}

/// The waits the trace's coordinator recorded as `noop` actions (`waiting: <condition>`), each
/// with when it was decided and its condition.
pub fn recorded_waits(view: &TraceView) -> Vec<(chrono::DateTime<chrono::Utc>, String)> {
    view.actions
        .iter()
        .filter(|a| a.action == StepKind::Noop && a.reason.starts_with(WAIT_PREFIX))
        .map(|action| {
            let condition = crate::steps::meta::read::<crate::steps::meta::NoopMeta>(action)
                .ok()
                .and_then(|m| m.waiting_for)
                .unwrap_or_else(|| action.reason[WAIT_PREFIX.len()..].trim().to_owned());
            (action.timestamp, condition)
        })
        .collect()
}

/// A resolve of the trace (not `current`) that decided after the last commit finished, after
/// the last red CI of a pushed pull request, after a consolidation conflict or a conflict with the base, after a push
/// refused for secrets, or after a self-review that did not approve (each calls for a new
/// decision): the current resolve is superseded by it.
pub fn superseding_resolve(view: &TraceView, current: Uuid) -> Option<Uuid> {
    let calls_for_a_decision = view
        .spans
        .iter()
        .filter(|s| {
            (s.step == StepKind::Commit && s.status.is_final())
                || DecisionSpanMeta::is_red_ci(s)
                || super::failures::is_conflict(s)
                || (s.step == StepKind::Push && SecretsSpanMeta::of(s).is_some())
                || (s.step == StepKind::Review && s.status.is_final())
        })
        .filter_map(|s| s.completed)
        .max()?;
    view.spans
        .iter()
        .filter(|s| s.step == StepKind::Resolve && s.id != current && s.status.is_final())
        // A `wait` asked for another look: it decided nothing this one would repeat.
        .filter(|s| {
            let decided = DecisionSpanMeta::of(s);
            decided.decision.is_some_and(|d| d != Decision::Wait) && decided.superseded_by.is_none()
        })
        .find(|s| s.timestamp >= calls_for_a_decision)
        .map(|s| s.id)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::steps::history::testing::Builder;
    use crate::steps::meta::{CoordinateSpanMeta, DecidedBy, NoopMeta};
    use crate::store::Meta;

    fn coordinate(b: &mut Builder, status: SpanStatus, meta: &CoordinateSpanMeta) -> Uuid {
        b.span(
            StepKind::Coordinate,
            status,
            Meta::new(),
            crate::store::to_meta(meta),
        )
    }

    #[test]
    fn a_coordinator_acted_unless_it_decided_noop_or_wait_or_did_not_complete() {
        for (decision, status, acted) in [
            (Decision::Noop, SpanStatus::Completed, false),
            (Decision::Wait, SpanStatus::Completed, false),
            (Decision::Plan, SpanStatus::Completed, true),
            (Decision::Cleanup, SpanStatus::Completed, true),
            (
                Decision::Other("escalate".into()),
                SpanStatus::Completed,
                true,
            ),
            (Decision::Plan, SpanStatus::Error, false),
        ] {
            let mut b = Builder::new();
            assert!(!coordinator_acted(&b.view));
            let meta = CoordinateSpanMeta::decided(decision.clone(), DecidedBy::Agent);
            coordinate(&mut b, status, &meta);
            assert_eq!(coordinator_acted(&b.view), acted, "{decision} {status}");
        }
        // A resolve's `push` is no coordinator acting.
        let mut b = Builder::new();
        b.resolve(Decision::Push);
        assert!(!coordinator_acted(&b.view));
    }

    #[test]
    fn only_failed_looks_decided_by_ci_count_as_red() {
        let mut b = Builder::new();
        let red = CoordinateSpanMeta::decided(Decision::Resolve, DecidedBy::Ci);
        coordinate(&mut b, SpanStatus::Failed, &red);
        coordinate(
            &mut b,
            SpanStatus::Completed,
            &CoordinateSpanMeta::decided(Decision::Wait, DecidedBy::Ci),
        );
        coordinate(
            &mut b,
            SpanStatus::Failed,
            &CoordinateSpanMeta::decided(Decision::Noop, DecidedBy::Trust),
        );
        assert_eq!(red_ci_looks(&b.view), 1);
        coordinate(&mut b, SpanStatus::Failed, &red);
        assert_eq!(red_ci_looks(&b.view), 2);
    }

    #[test]
    fn only_iterate_and_retry_count_as_retries_and_only_waits_as_waits() {
        let mut b = Builder::new();
        assert_eq!((retries_so_far(&b.view), resolver_waits(&b.view)), (0, 0));
        for d in [
            Decision::Iterate,
            Decision::Push,
            Decision::Retry,
            Decision::Fail,
            Decision::Wait,
            Decision::Other("retry-later".into()),
        ] {
            b.resolve(d);
        }
        // A coordinator's wait is not the resolver's.
        coordinate(
            &mut b,
            SpanStatus::Completed,
            &CoordinateSpanMeta::decided(Decision::Wait, DecidedBy::Agent),
        );
        assert_eq!((retries_so_far(&b.view), resolver_waits(&b.view)), (2, 1));
    }

    #[test]
    fn a_resolve_after_the_last_commit_supersedes_later_ones_but_a_wait_does_not() {
        let mut b = Builder::new();
        let wf_a = b.bare(StepKind::Workflow, SpanStatus::Completed);
        b.commit(wf_a, SpanStatus::Completed);
        let wf_b = b.bare(StepKind::Workflow, SpanStatus::Completed);
        b.commit(wf_b, SpanStatus::Completed);
        b.resolve(Decision::Wait);
        let current = Uuid::new_v4();
        assert_eq!(superseding_resolve(&b.view, current), None);
        let first = b.resolve(Decision::Push);
        assert_eq!(
            superseding_resolve(&b.view, current),
            Some(b.span_of(first))
        );
        // The resolve is not superseded by itself.
        assert_eq!(superseding_resolve(&b.view, b.span_of(first)), None);
        // A commit after that resolve (an iteration) makes the next resolve decide again.
        b.commit(wf_b, SpanStatus::Completed);
        assert_eq!(superseding_resolve(&b.view, current), None);
    }

    #[test]
    fn a_red_ci_a_conflict_or_a_push_refused_for_secrets_calls_for_a_new_decision() {
        use crate::steps::meta::{PushConflict, PushSpanMeta, PushStatus, SecretsFound};
        let calls = [
            (
                StepKind::Coordinate,
                crate::store::to_meta(&CoordinateSpanMeta::decided(
                    Decision::Resolve,
                    DecidedBy::Ci,
                )),
            ),
            (
                StepKind::Push,
                crate::store::to_meta(&PushSpanMeta {
                    conflict: Some(PushConflict::default()),
                    ..PushSpanMeta::default()
                }),
            ),
            (
                StepKind::Push,
                crate::store::to_meta(&PushSpanMeta {
                    status: Some(PushStatus::Secrets),
                    branch: Some("rover/a".into()),
                    secrets_found: Some(SecretsFound {
                        findings: Vec::new(),
                        more: 1,
                    }),
                    ..PushSpanMeta::default()
                }),
            ),
        ];
        for (step, meta) in calls {
            let mut b = Builder::new();
            let wf = b.bare(StepKind::Workflow, SpanStatus::Completed);
            b.commit(wf, SpanStatus::Completed);
            b.resolve(Decision::Push);
            let current = Uuid::new_v4();
            assert!(superseding_resolve(&b.view, current).is_some());
            b.span(step.clone(), SpanStatus::Failed, Meta::new(), meta);
            assert_eq!(superseding_resolve(&b.view, current), None, "{step}");
        }
    }

    #[test]
    fn the_waits_a_coordinator_recorded_come_with_their_condition() {
        let mut b = Builder::new();
        let with_meta = crate::store::to_meta(&NoopMeta {
            waiting_for: Some("CI to finish".into()),
            ..NoopMeta::default()
        });
        let root = b.view.spans[0].clone();
        for (reason, meta) in [
            ("waiting: CI (re-evaluated later)", with_meta),
            ("waiting: a review", Meta::new()),
            ("untrusted author", Meta::new()),
        ] {
            let action = crate::store::Action::new(StepKind::Noop, &root, reason, meta, b.clock);
            b.view.actions.push(action);
        }
        let conditions: Vec<String> = recorded_waits(&b.view).into_iter().map(|w| w.1).collect();
        assert_eq!(conditions, ["CI to finish", "a review"]);
    }
}
