//! A trace's chain of steps (`step:status` of its spans, collections left out) and the short way
//! tests write the chain they expect: the steps space-separated, `:completed` left out
//! (`"event coordinate plan workflow:failed notify"`). The end-to-end shape "script the fakes,
//! run the pipeline, assert the chain" is `Scenario::settle_as` / `once_as` (the real binary)
//! and `Pipeline::run_as` (the in-process orchestrator), both checking through [`assert_chain`].

use rover::store::TraceView;

/// `step:status`, in creation order, of the trace's spans but its collections (`collect`
/// spans, checked where collection is tested).
pub fn chain(view: &TraceView) -> Vec<String> {
    view.spans
        .iter()
        .filter(|s| !rover::orchestrator::is_collection(s))
        .map(|s| format!("{}:{}", s.step, s.status))
        .collect()
}

/// The chain written the short way, spelled out: `"event plan:failed"` is
/// `["event:completed", "plan:failed"]`.
pub fn steps(short: &str) -> Vec<String> {
    short
        .split_whitespace()
        .map(|s| {
            if s.contains(':') {
                s.to_owned()
            } else {
                format!("{s}:completed")
            }
        })
        .collect()
}

/// Asserts that `view`'s chain of steps is `short` (see [`steps`]).
#[track_caller]
pub fn assert_chain(view: &TraceView, short: &str) {
    assert_eq!(chain(view), steps(short), "the chain of steps");
}
