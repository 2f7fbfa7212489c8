//! A look at the CI of what rover pushed (no AI), and the CI watches a CI outcome wakes.

use chrono::Utc;

use super::CoordinateStep;
use crate::github::{CiState, CiStatus};
use crate::orchestrator::{Finished, NextAction, Outcome, StepError};
use crate::steps::meta::{
    ci_watch_action, CiWatchMeta, CoordinateMeta, CoordinateSpanMeta, DecidedBy, DecisionSpanMeta,
    NotifyMeta, NotifyPurpose,
};
use crate::store::{AutopilotStore, StepKind};

impl CoordinateStep {
    /// One look at the CI of a pull request rover pushed (no AI): red hands over to the
    /// resolver with the failing checks as this span's error (after `maxRetries` red looks in
    /// the trace, to a failure notify instead, whatever the resolver would say), green to a
    /// `ready` notify, pending to the next look; a pull request no longer open is not followed.
    pub(super) async fn look_at_ci(
        &self,
        watch: CiWatchMeta,
        view: &crate::store::TraceView,
    ) -> Result<Outcome, StepError> {
        let github = self.services.github.as_ref().ok_or_else(|| {
            StepError::fatal("rover has no GitHub client to look at the pull request's CI")
        })?;
        let gh_error = |what: &str, e: &crate::github::GitHubError| {
            StepError::from_error(e, e.is_retryable())
                .not_before(e.retry_at())
                .detail("what", what)
                .detail("prNumber", watch.pr_number)
        };
        let pipeline = &self.services.config.autopilot.pipeline;
        let pr = github
            .get_pull_request(watch.pr_number)
            .await
            .map_err(|e| gh_error("reading the pull request", &e))?;
        let mut span_meta = CoordinateSpanMeta {
            ci: Some(watch.clone()),
            ..CoordinateSpanMeta::decided("noop", DecidedBy::Ci)
        };
        if pr.state != crate::github::IssueState::Open {
            let reason = format!(
                "pull request #{} is {}: its CI is no longer followed",
                pr.number,
                if pr.merged { "merged" } else { "closed" }
            );
            return Ok(Outcome::Finished(
                Finished::completed(format!("decided noop: {reason}")).with_meta_record(&span_meta),
            ));
        }
        let status = github
            .ci_status(&watch.sha)
            .await
            .map_err(|e| gh_error("reading the CI status", &e))?;
        let verdict = ci_verdict(&status, watch.round, pipeline.ci_max_polls);
        let sha = short_sha(&watch.sha);
        let (decision, done) = match verdict {
            CiVerdict::Again => {
                let next = CiWatchMeta {
                    round: watch.round + 1,
                    ..watch.clone()
                };
                let done = Finished::completed(format!(
                    "CI of pull request #{} at {sha} is still running ({} pending of {}): looking again later",
                    watch.pr_number,
                    status.pending.len(),
                    status.total
                ))
                .then(ci_watch_action(next, pipeline, Utc::now()));
                ("wait", done)
            }
            CiVerdict::GiveUp => ("noop", Finished::completed(format!(
                "decided noop: CI of pull request #{} at {sha} had no outcome after {} looks; rover stops following it",
                watch.pr_number, watch.round
            ))),
            CiVerdict::NoCi => ("noop", Finished::completed(format!(
                "decided noop: no check or status was reported for pull request #{} at {sha} in {} looks: the repository seems to have no CI",
                watch.pr_number, watch.round
            ))),
            CiVerdict::Green => {
                let reason = format!(
                    "CI passed on pull request #{} at {sha} ({} checks)",
                    watch.pr_number, status.total
                );
                let done = Finished::completed(format!("decided notify: {reason}")).then(
                    NextAction::new(StepKind::Notify, format!("{reason}: it is ready")).with_meta(
                        &NotifyMeta {
                            purpose: NotifyPurpose::Ready,
                            message: Some(format!(
                                "CI passed on pull request #{}; it is ready for review.",
                                watch.pr_number
                            )),
                            pr_url: Some(watch.pr_url.clone()),
                            ..NotifyMeta::default()
                        },
                    ),
                );
                ("notify", done)
            }
            CiVerdict::Red(failing) => {
                // Check names come from the repository's CI: data for the resolver, not orders.
                let message = format!(
                    "CI failed on rover's pull request #{} at {sha}: {}",
                    watch.pr_number,
                    failing.join(", ")
                );
                let mut finished = Finished::failed(message.clone());
                StepError::fatal(message.clone())
                    .detail("failingChecks", &failing)
                    .detail("prNumber", watch.pr_number)
                    .detail("prUrl", &watch.pr_url)
                    .detail("sha", &watch.sha)
                    .detail("branch", &watch.branch)
                    .to_meta()
                    .put_into(&mut finished.meta);
                let earlier = red_looks(view);
                span_meta.red_looks = Some(earlier + 1);
                let max = pipeline.max_retries;
                if earlier >= max {
                    let why = format!(
                        "{message}; CI was red {} time(s) in this trace, the most `pipeline.maxRetries` ({max}) allows",
                        earlier + 1
                    );
                    finished = finished.then(
                        NextAction::new(StepKind::Notify, format!("the trace failed: {why}"))
                            .with_meta(&NotifyMeta {
                                pr_url: Some(watch.pr_url.clone()),
                                ..NotifyMeta::failure(&StepKind::Coordinate, &why)
                            }),
                    );
                } else {
                    finished = finished.then(NextAction::new(
                        StepKind::Resolve,
                        format!("{message}: decide how to fix it on `{}`", watch.branch),
                    ));
                }
                ("resolve", finished)
            }
        };
        span_meta.decided.decision = Some(decision.to_owned());
        span_meta.ci_status = Some(status);
        Ok(Outcome::Finished(done.with_meta_record(&span_meta)))
    }
}

pub(super) fn short_sha(sha: &str) -> &str {
    &sha[..sha.len().min(12)]
}

/// What a look at a pull request's CI leads to.
#[derive(Debug, Clone, PartialEq)]
pub enum CiVerdict {
    /// Red: the resolver decides (iterate on the same branch, within `maxRetries`).
    Red(Vec<String>),
    /// Green: tell the channel the pull request is ready.
    Green,
    /// Still running (or nothing reported yet): look again later.
    Again,
    /// Looked often enough without an outcome.
    GiveUp,
    /// No check or status reported for the commit after a few looks: the repository has no CI.
    NoCi,
}

/// How many earlier looks at CI in the trace were red.
pub(super) fn red_looks(view: &crate::store::TraceView) -> u32 {
    let n = view
        .spans
        .iter()
        .filter(|s| DecisionSpanMeta::is_red_ci(s))
        .count();
    u32::try_from(n).unwrap_or(u32::MAX)
}

/// Looks without a single check or status before rover concludes there is no CI.
pub(super) const NO_CI_LOOKS: u32 = 3;

/// The verdict for `status` at look `round` of at most `max`.
pub fn ci_verdict(status: &CiStatus, round: u32, max: u32) -> CiVerdict {
    match status.state {
        CiState::Failure => CiVerdict::Red(status.failing.clone()),
        CiState::Success if status.total > 0 => CiVerdict::Green,
        _ if status.total == 0 && round >= NO_CI_LOOKS.min(max) => CiVerdict::NoCi,
        _ if round >= max => CiVerdict::GiveUp,
        _ => CiVerdict::Again,
    }
}

/// A check run, check suite or status reported for `sha`: the CI watches of that commit look
/// now, and the coordinator waits on a pull request whose head it is re-evaluate now, instead
/// of at their scheduled time. Returns how many were woken.
pub fn wake_ci_watches(
    store: &AutopilotStore,
    sha: &str,
) -> Result<usize, crate::store::StoreError> {
    let state = store.read_state()?;
    let mut woken = 0;
    for pending in state.pending.iter().filter(|p| {
        p.action == StepKind::Coordinate && p.running_span_id.is_none() && p.not_before.is_some()
    }) {
        let Ok(action) = store.read_action(pending.action_id) else {
            continue;
        };
        let scheduled = crate::steps::meta::read::<CoordinateMeta>(&action).unwrap_or_default();
        let same = |s: &str| s.eq_ignore_ascii_case(sha);
        let watches_sha = scheduled.ci.is_some_and(|ci| same(&ci.sha))
            || scheduled
                .wait
                .and_then(|w| w.head_sha)
                .is_some_and(|s| same(&s));
        if watches_sha && store.wake_pending(pending.action_id)? {
            woken += 1;
        }
    }
    Ok(woken)
}
