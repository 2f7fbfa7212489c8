//! A look at the CI of what rover pushed (no AI), and which scheduled runs a CI outcome wakes.

use chrono::Utc;

use super::CoordinateStep;
use crate::git::short_sha;
use crate::github::{CiState, CiStatus};
use crate::intake::Signal;
use crate::orchestrator::{Finished, NextAction, Outcome, StepError};
use crate::steps::history::red_ci_looks;
use crate::steps::meta::{
    ci_watch_action, merge_action, CiWatchMeta, CoordinateMeta, CoordinateSpanMeta, DecidedBy,
    Decision, NotifyMeta, NotifyPurpose,
};
use crate::store::{Action, StepKind};

impl CoordinateStep {
    /// One look at the CI of a pull request rover pushed (no AI): red hands over to the
    /// resolver with the failing checks as this span's error (after `maxRetries` red looks in
    /// the trace, to a failure notify instead, whatever the resolver would say), green to a
    /// `ready` notify, pending to the next look; a pull request no longer open is not followed.
    pub(super) async fn look_at_ci(
        &self,
        ctx: &crate::orchestrator::StepContext,
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
            ..CoordinateSpanMeta::decided(Decision::Noop, DecidedBy::Ci)
        };
        if watch.after_merge {
            return self.look_after_merge(ctx, view, watch, span_meta).await;
        }
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
        let lifecycle = &self.services.config.autopilot.lifecycle;
        let mut verdict = ci_verdict(&status, watch.round, pipeline.ci_max_polls);
        // A mode that merges waits for the checks at most `lifecycle.ciTimeoutMins`; a person's
        // pull request is never rover's to merge, whatever the mode: green is answered.
        let merges = lifecycle.mode.merges() && !watch.persons_pull_request;
        let timed_out = merges
            && watch.since.is_some_and(|since| {
                chrono::Duration::from_std(lifecycle.ci_timeout())
                    .is_ok_and(|limit| Utc::now() - since >= limit)
            });
        if timed_out && verdict == CiVerdict::Again {
            verdict = CiVerdict::TimedOut;
        }
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
                (Decision::Wait, done)
            }
            CiVerdict::TimedOut => (Decision::Notify, timed_out_look(&watch, lifecycle)),
            CiVerdict::Green if merges => {
                (Decision::Merge, green_merges(&watch, &status, lifecycle))
            }
            CiVerdict::GiveUp => (Decision::Noop, Finished::completed(format!(
                "decided noop: CI of pull request #{} at {sha} had no outcome after {} looks; rover stops following it",
                watch.pr_number, watch.round
            ))),
            CiVerdict::NoCi => (Decision::Noop, Finished::completed(format!(
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
                (Decision::Notify, done)
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
                let earlier = red_ci_looks(view);
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
                (Decision::Resolve, finished)
            }
        };
        span_meta.decided.decision = Some(decision);
        span_meta.ci_status = Some(status);
        Ok(Outcome::Finished(done.with_meta_record(&span_meta)))
    }
}

/// The checks did not finish within `lifecycle.ciTimeoutMins` in a mode that merges: said on
/// the thread, and not merged.
fn timed_out_look(watch: &CiWatchMeta, lifecycle: &crate::config::LifecycleConfig) -> Finished {
    let mins = lifecycle.ci_timeout().as_secs() / 60;
    let within = if mins == 0 {
        "were not done at rover's first look".to_owned()
    } else {
        format!("did not finish within {mins} minutes")
    };
    let why = format!(
        "the checks of pull request #{} at {} {within} (`lifecycle.ciTimeoutMins`): rover does not merge it",
        watch.pr_number,
        short_sha(&watch.sha),
    );
    Finished::completed(format!("decided notify: {why}")).then(
        NextAction::new(StepKind::Notify, why.clone()).with_meta(&NotifyMeta {
            purpose: NotifyPurpose::Flag,
            message: Some(format!("{why}; a person can merge it once it is green.")),
            // rover's own words, posted as they are whatever the notifier writes.
            note: Some(format!("{why}; a person can merge it once it is green.")),
            pr_url: Some(watch.pr_url.clone()),
            ..NotifyMeta::default()
        }),
    )
}

/// Green in a mode that merges: the `merge` of the head that passed.
fn green_merges(
    watch: &CiWatchMeta,
    status: &CiStatus,
    lifecycle: &crate::config::LifecycleConfig,
) -> Finished {
    let reason = format!(
        "CI passed on pull request #{} at {} ({} checks): merge it (lifecycle mode {})",
        watch.pr_number,
        short_sha(&watch.sha),
        status.total,
        lifecycle.mode.as_str()
    );
    Finished::completed(format!("decided merge: {reason}")).then(merge_action(watch, reason))
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
    /// Still running past `lifecycle.ciTimeoutMins` in a mode that merges.
    TimedOut,
    /// No check or status reported for the commit after a few looks: the repository has no CI.
    NoCi,
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

/// Whether a scheduled coordinate action waits on `signal`: a CI outcome for the commit of its
/// CI watch, or for the head of the pull request its wait is about. Then the orchestrator makes
/// it due now (`orchestrator::Step::woken_by`): the watch looks at the CI, the wait is
/// re-evaluated, instead of at their scheduled time.
pub fn waits_on(action: &Action, signal: &Signal) -> bool {
    let Signal::Ci(outcome) = signal;
    let scheduled = crate::steps::meta::read::<CoordinateMeta>(action).unwrap_or_default();
    scheduled.ci.is_some_and(|ci| outcome.is_for(&ci.sha))
        || scheduled
            .wait
            .and_then(|w| w.head_sha)
            .is_some_and(|s| outcome.is_for(&s))
}
