//! What the trace did on its thread and for people: the subject its event is about, the pull
//! request it opened, whether it was cleaned up, when it ended, a `/rover` refusal it answered,
//! an intervention a command marked.

use chrono::{DateTime, Utc};

use crate::steps::meta::{
    subject_key, CommandOutcome, CoordinateSpanMeta, EventMeta, Intervention, InterventionSpanMeta,
    MergeOutcome, MergeSpanMeta, PushPullRequest,
};
use crate::store::{AutopilotStore, Span, SpanStatus, StepKind, StoreError, TraceView};

/// What the trace's event is about, as [`subject_key`] gives it (`#12`, `refs/heads/main`).
pub fn subject_of(view: &TraceView) -> Option<String> {
    view.root()
        .and_then(|r| EventMeta::of(r).ok())
        .and_then(|m| m.event)
        .and_then(|e| subject_key(&e))
}

/// Whether one of the trace's pushes opened or found pull request `number`.
pub fn pushed_pull_request(view: &TraceView, number: u64) -> bool {
    view.spans
        .iter()
        .any(|s| s.step == StepKind::Push && PushPullRequest::of(s).pr_number == Some(number))
}

/// What a trace that has not ended waits on, in its own words: its pull request waiting to be
/// merged (a trusted approval, the hourly cap, GitHub's protection) or for its checks, when a
/// look at that is queued and the latest such look said so; `None` otherwise.
pub fn waiting_on(view: &TraceView) -> Option<String> {
    let queued = |kind: StepKind| view.pending.iter().any(|p| p.action == kind);
    let latest = |kind: StepKind| {
        view.spans
            .iter()
            .filter(|s| s.step == kind && s.status.is_final())
            .max_by_key(|s| s.completed)
    };
    if queued(StepKind::Merge) {
        let last = latest(StepKind::Merge)?;
        return (MergeSpanMeta::of(last).merge_outcome == Some(MergeOutcome::Waiting))
            .then(|| said(last))
            .flatten();
    }
    if queued(StepKind::Coordinate) {
        let last = latest(StepKind::Coordinate)?;
        let meta: CoordinateSpanMeta = crate::store::from_meta(&last.meta).unwrap_or_default();
        let checks_running = meta.ci_status.is_some()
            && meta.decided.decision == Some(crate::steps::meta::Decision::Wait);
        return checks_running.then(|| said(last)).flatten();
    }
    None
}

/// A span's summary as one line without control characters (it can quote GitHub's words).
fn said(span: &Span) -> Option<String> {
    let summary = span.summary.as_deref()?;
    Some(
        summary
            .lines()
            .next()
            .unwrap_or_default()
            .chars()
            .filter(|c| !c.is_control())
            .collect(),
    )
}

/// The pull request the trace pushed and nothing cleaned up yet: `Some` with the last push's
/// number (when it recorded one), `None` when it pushed none or a cleanup ran.
pub fn open_pull_request(view: &TraceView) -> Option<Option<u64>> {
    let pushed: Vec<PushPullRequest> = view
        .spans
        .iter()
        .filter(|s| s.step == StepKind::Push && s.status == SpanStatus::Completed)
        .map(PushPullRequest::of)
        .filter(PushPullRequest::exists)
        .collect();
    let cleaned = view.spans.iter().any(|s| s.step == StepKind::Cleanup);
    (!pushed.is_empty() && !cleaned).then(|| pushed.iter().rev().find_map(|p| p.pr_number))
}

/// When the trace's last span finished (its creation, when none did).
pub fn ended_at(view: &TraceView) -> DateTime<Utc> {
    view.spans
        .iter()
        .filter_map(|s| s.completed)
        .max()
        .unwrap_or(view.index.created_at)
}

/// Whether the trace's coordinator answered a refused `/rover` command on the thread since
/// `since` (what the rate limit on refusals counts).
pub fn refusal_answered_since(view: &TraceView, since: DateTime<Utc>) -> bool {
    view.spans.iter().any(|s| {
        s.step == StepKind::Coordinate
            && s.completed.unwrap_or(s.timestamp) >= since
            && CoordinateSpanMeta::of(s)
                .command
                .is_some_and(|c| c.outcome == CommandOutcome::Refused && c.answered)
    })
}

/// The `cancel` or `retry` span whose reason carries `mark` (a command's mark on what it did):
/// a command run again after a crash finds it and does not act twice.
pub fn intervention_marked<'v>(view: &'v TraceView, mark: &str) -> Option<&'v Span> {
    view.spans.iter().find(|s| {
        matches!(
            Intervention::of(s),
            Some(Intervention::Cancel | Intervention::Retry | Intervention::Approve)
        ) && InterventionSpanMeta::of(s)
            .and_then(|m| m.reason)
            .is_some_and(|r| r.contains(mark))
    })
}

/// Who approved the merge of the trace's pull request at exactly `head` from the thread
/// (`/rover merge`, taken from trusted people only).
pub fn merge_approvals(view: &TraceView, head: &str) -> Vec<String> {
    let mut by: Vec<String> = view
        .spans
        .iter()
        .filter(|s| Intervention::of(s) == Some(Intervention::Approve))
        .filter_map(InterventionSpanMeta::of)
        .filter(|m| m.head_sha.as_deref() == Some(head))
        .map(|m| m.by.to_ascii_lowercase())
        .collect();
    by.sort();
    by.dedup();
    by
}

/// When the merges rover made since `since` were made, in the `lookback` most recent traces of
/// the store (what `lifecycle.maxMergesPerHour` counts, across the repository).
pub fn merges_since(
    store: &AutopilotStore,
    since: DateTime<Utc>,
    lookback: usize,
) -> Result<Vec<DateTime<Utc>>, StoreError> {
    let mut merges = Vec::new();
    for entry in store.recent_traces(lookback)? {
        let view = store.load_trace(entry.trace_id)?;
        merges.extend(
            view.spans
                .iter()
                .filter(|s| s.step == StepKind::Merge)
                .map(MergeSpanMeta::of)
                .filter(|m| m.merge_outcome == Some(MergeOutcome::Merged))
                .filter_map(|m| m.merged_at)
                .filter(|at| *at >= since),
        );
    }
    Ok(merges)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::steps::history::testing::Builder;
    use crate::steps::meta::{CommandRecord, DecidedBy, Decision};
    use crate::store::Meta;

    fn pushed(number: Option<u64>) -> Meta {
        crate::store::to_meta(&PushPullRequest {
            pr_url: Some(number.map(|n| format!("https://github.com/o/r/pull/{n}"))),
            pr_number: number,
            ..PushPullRequest::default()
        })
    }

    #[test]
    fn a_pushed_pull_request_stays_open_until_a_cleanup() {
        let mut b = Builder::new();
        assert_eq!(open_pull_request(&b.view), None);
        b.span(
            StepKind::Push,
            SpanStatus::Completed,
            Meta::new(),
            pushed(None),
        );
        assert_eq!(open_pull_request(&b.view), None);
        b.span(
            StepKind::Push,
            SpanStatus::Failed,
            Meta::new(),
            pushed(Some(9)),
        );
        assert_eq!(open_pull_request(&b.view), None);
        assert!(pushed_pull_request(&b.view, 9));
        b.span(
            StepKind::Push,
            SpanStatus::Completed,
            Meta::new(),
            pushed(Some(12)),
        );
        assert_eq!(open_pull_request(&b.view), Some(Some(12)));
        assert!(pushed_pull_request(&b.view, 12) && !pushed_pull_request(&b.view, 13));
        let last = b.bare(StepKind::Cleanup, SpanStatus::Completed);
        assert_eq!(open_pull_request(&b.view), None);
        let cleanup = b.view.spans.iter().find(|s| s.action_id == Some(last));
        assert_eq!(Some(ended_at(&b.view)), cleanup.and_then(|s| s.completed));
    }

    #[test]
    fn only_an_answered_refusal_since_the_time_counts() {
        let mut b = Builder::new();
        let start = b.clock;
        let command = |outcome, answered| {
            crate::store::to_meta(&CoordinateSpanMeta {
                command: Some(CommandRecord {
                    command: "stop".into(),
                    outcome,
                    detail: String::new(),
                    target: None,
                    answered,
                    acknowledged: false,
                }),
                ..CoordinateSpanMeta::decided(Decision::Command, DecidedBy::Command)
            })
        };
        b.span(
            StepKind::Coordinate,
            SpanStatus::Completed,
            Meta::new(),
            command(CommandOutcome::Refused, false),
        );
        b.span(
            StepKind::Coordinate,
            SpanStatus::Completed,
            Meta::new(),
            command(CommandOutcome::Done, true),
        );
        assert!(!refusal_answered_since(&b.view, start));
        b.span(
            StepKind::Coordinate,
            SpanStatus::Completed,
            Meta::new(),
            command(CommandOutcome::Refused, true),
        );
        assert!(refusal_answered_since(&b.view, start));
        assert!(!refusal_answered_since(&b.view, b.clock));
    }

    #[test]
    fn a_commands_mark_is_found_on_a_cancel_or_retry_span_only() {
        let mut b = Builder::new();
        let trace = b.view.trace_id();
        let record = |reason: &str| InterventionSpanMeta {
            by: "alice".into(),
            reason: Some(reason.into()),
            ..InterventionSpanMeta::default()
        };
        let mark = "command trace 1a2b3c4d";
        for step in ["gc", "fail"] {
            let span = Span::intervention(trace, step, "s".into(), &record(mark));
            b.view.spans.push(span);
        }
        assert!(intervention_marked(&b.view, mark).is_none());
        let span = Span::intervention(trace, "retry", "s".into(), &record("another"));
        b.view.spans.push(span);
        assert!(intervention_marked(&b.view, mark).is_none());
        let span = Span::intervention(
            trace,
            "cancel",
            "s".into(),
            &record(&format!("stop ({mark})")),
        );
        let id = span.id;
        b.view.spans.push(span);
        assert_eq!(intervention_marked(&b.view, mark).map(|s| s.id), Some(id));
    }

    #[test]
    fn a_trace_waiting_to_merge_or_for_checks_says_what_it_waits_on() {
        let mut b = Builder::new();
        let waiting = crate::store::to_meta(&MergeSpanMeta {
            merge_outcome: Some(MergeOutcome::Waiting),
            pr_number: Some(7),
            ..MergeSpanMeta::default()
        });
        b.span(StepKind::Merge, SpanStatus::Completed, Meta::new(), waiting);
        b.view.spans.last_mut().unwrap().summary =
            Some("waiting to merge: a trusted \u{1b}[2Japproval of the head\nmore".into());
        assert_eq!(waiting_on(&b.view), None, "nothing queued: it ended");
        let next = b
            .view
            .actions
            .last()
            .unwrap()
            .pending(b.view.trace_id(), b.clock);
        b.view.pending.push(next);
        assert_eq!(
            waiting_on(&b.view).as_deref(),
            Some("waiting to merge: a trusted [2Japproval of the head"),
            "one line, no control characters"
        );
        // A merge that went through waits on nothing.
        let merged = crate::store::to_meta(&MergeSpanMeta {
            merge_outcome: Some(MergeOutcome::Merged),
            ..MergeSpanMeta::default()
        });
        b.span(StepKind::Merge, SpanStatus::Completed, Meta::new(), merged);
        assert_eq!(waiting_on(&b.view), None);
    }
}
