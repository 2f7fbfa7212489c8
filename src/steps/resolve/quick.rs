//! The resolver's quick exits: what settles a trace without asking the agent (another resolve
//! decided already, a push refused for secrets, no retries left with nothing to push, a
//! tampered worktree, an environment that did not build).

use uuid::Uuid;

use super::super::history::{
    environment_failure, refused_for_secrets, superseding_resolve, tampered_span, unpushed_commit,
};
use super::super::meta::{DecisionSpanMeta, ResolveQuickExit, ResolveSpanMeta};
use super::decision::{decision_meta, fail_finished};
use crate::agents::ResolveDecision;
use crate::orchestrator::Finished;
use crate::store::TraceView;

/// How many iterate/retry decisions the trace used, and the limit.
#[derive(Debug, Clone, Copy)]
pub(super) struct Retries {
    pub used: u32,
    pub max: u32,
}

impl Retries {
    /// None left. The limit stops the next iterate or retry, never the push of work it allowed.
    pub(super) fn out(self) -> bool {
        self.used >= self.max
    }

    /// The trace fails: the limit is reached.
    pub(super) fn gave_up(self, view: &TraceView) -> Finished {
        let (retries, max) = (self.used, self.max);
        let why = format!(
            "gave up after {retries} iterate/retry attempts (the limit is {max}); the last failure is in the trace"
        );
        let span_meta = ResolveSpanMeta {
            decision: decision_meta(ResolveDecision::Fail),
            reasoning: Some(why.clone()),
            retries: Some(retries),
            max_retries: Some(max),
            quick_exit: Some(ResolveQuickExit::MaxRetries),
            corrective_commands: Some(Vec::new()),
            ..ResolveSpanMeta::default()
        };
        fail_finished(view, format!("fail: {why}"), &why).with_meta_record(&span_meta)
    }

    /// What the prompt tells the agent about them.
    pub(super) fn prompt(self) -> String {
        let (retries, max) = (self.used, self.max);
        if self.out() {
            format!("{retries} of at most {max} iterate/retry decisions used: none is left, so `iterate` and `retry` end the trace; push the work already committed, notify, or fail.")
        } else {
            format!("{retries} of at most {max} iterate/retry decisions used.")
        }
    }
}

/// How the resolve of span `span_id` ends without the agent, if it does.
pub(super) fn quick_exit(view: &TraceView, span_id: Uuid, retries: Retries) -> Option<Finished> {
    if let Some(other) = superseding_resolve(view, span_id) {
        let span_meta = ResolveSpanMeta {
            decision: DecisionSpanMeta {
                superseded_by: Some(other.to_string()),
                ..DecisionSpanMeta::default()
            },
            ..ResolveSpanMeta::default()
        };
        return Some(
            Finished::completed(format!("superseded by {other}")).with_meta_record(&span_meta),
        );
    }
    // A push refused for secrets ends the trace: they are in the branch's history, which a
    // commit on top cannot change, and no agent is asked (its answer could quote them).
    if let Some((span, branch, found)) = refused_for_secrets(view) {
        let why = format!(
            "the push of `{branch}` was refused: it would have sent {}. A secret in a commit stays in the branch's history, so no commit on top can remove it; nothing was pushed and the trace stops here",
            found.describe()
        );
        let span_meta = ResolveSpanMeta {
            quick_exit: Some(ResolveQuickExit::SecretsInPush),
            secrets_span: Some(span.id),
            ..ResolveSpanMeta::default()
        };
        return Some(fail(view, &why, span_meta));
    }
    // With no retries left and nothing committed since the last push, no agent is asked.
    if retries.out() && !unpushed_commit(view) {
        return Some(retries.gave_up(view));
    }
    // A sandbox that changed the worktree's git metadata ends the trace: its work is not
    // trusted, and no agent is asked (its output could be the attacker's).
    if let Some(span) = tampered_span(view) {
        let why = format!(
            "the sandbox of the {} step tampered with the worktree's git metadata; its work was not committed and the trace stops here",
            span.step
        );
        let span_meta = ResolveSpanMeta {
            quick_exit: Some(ResolveQuickExit::Tampered),
            tampered_span: Some(span.id),
            ..ResolveSpanMeta::default()
        };
        return Some(fail(view, &why, span_meta));
    }
    // The repository's environment did not build: no agent ran, and another attempt would
    // build the same definition again; the span holds the error and the command to rerun it.
    let span = environment_failure(view)?;
    let why = format!(
        "the repository's environment did not build, so no agent ran: {}",
        span.summary
            .as_deref()
            .unwrap_or_default()
            .trim_start_matches("not started: ")
    );
    let span_meta = ResolveSpanMeta {
        quick_exit: Some(ResolveQuickExit::EnvironmentBuild),
        environment_span: Some(span.id),
        ..ResolveSpanMeta::default()
    };
    Some(fail(view, &why, span_meta))
}

/// The trace fails for `why`, with `span_meta`'s quick exit: the decision and reasoning are
/// set here.
fn fail(view: &TraceView, why: &str, span_meta: ResolveSpanMeta) -> Finished {
    let span_meta = ResolveSpanMeta {
        decision: decision_meta(ResolveDecision::Fail),
        reasoning: Some(why.to_owned()),
        ..span_meta
    };
    fail_finished(view, format!("fail: {why}"), why).with_meta_record(&span_meta)
}
