//! The look at the checks of rover's merge commit on the base branch
//! (`autopilot.lifecycle.postMergeCi`): green, the trace answers that the pull request was
//! merged and is green there (after the `release` step, when `lifecycle.release` tags it); red, it answers that the merge left the base branch red, naming
//! the failing checks, for a person to look (`lifecycle.onRedMain: "notify"`); still running,
//! it looks again; no outcome after `pipeline.ciMaxPolls` looks, it answers the merge alone.

use chrono::Utc;

use super::ci::{ci_verdict, short_sha, CiVerdict};
use super::CoordinateStep;
use crate::orchestrator::{Finished, NextAction, Outcome, StepError};
use crate::steps::meta::{
    ci_watch_action, release_action, CiWatchMeta, CoordinateSpanMeta, Decision, NotifyMeta,
    NotifyPurpose,
};
use crate::store::StepKind;

impl CoordinateStep {
    pub(super) async fn look_after_merge(
        &self,
        watch: CiWatchMeta,
        mut span_meta: CoordinateSpanMeta,
    ) -> Result<Outcome, StepError> {
        let github = self.services.github.as_ref().ok_or_else(|| {
            StepError::fatal("rover has no GitHub client to look at the merge commit's CI")
        })?;
        let pipeline = &self.services.config.autopilot.pipeline;
        let status = github.ci_status(&watch.sha).await.map_err(|e| {
            StepError::from_error(&e, e.is_retryable())
                .not_before(e.retry_at())
                .detail("what", "reading the CI status of the merge commit")
                .detail("sha", &watch.sha)
        })?;
        let sha = short_sha(&watch.sha);
        let merged = format!(
            "Merged pull request #{} (merge commit {sha} on `{}`)",
            watch.pr_number, watch.branch
        );
        let answer = |purpose: NotifyPurpose, text: String| {
            NextAction::new(StepKind::Notify, text.clone()).with_meta(&NotifyMeta {
                purpose,
                message: Some(text.clone()),
                note: Some(text),
                pr_url: Some(watch.pr_url.clone()),
                ..NotifyMeta::default()
            })
        };
        let (decision, done) = match ci_verdict(&status, watch.round, pipeline.ci_max_polls) {
            CiVerdict::Again | CiVerdict::TimedOut => {
                let next = CiWatchMeta {
                    round: watch.round + 1,
                    ..watch.clone()
                };
                let done = Finished::completed(format!(
                    "the checks of merge commit {sha} on `{}` are still running ({} pending of {}): looking again later",
                    watch.branch,
                    status.pending.len(),
                    status.total
                ))
                .then(ci_watch_action(next, pipeline, Utc::now()));
                (Decision::Wait, done)
            }
            CiVerdict::Green => {
                let text = format!(
                    "{merged}; its checks passed on `{}` ({} checks).",
                    watch.branch, status.total
                );
                if self
                    .services
                    .config
                    .autopilot
                    .lifecycle
                    .release
                    .tagged()
                    .is_some()
                {
                    // Only a green base branch is released.
                    (
                        Decision::Release,
                        Finished::completed(format!("decided release: {text}"))
                            .then(release_action(&watch, text)),
                    )
                } else {
                    (
                        Decision::Notify,
                        Finished::completed(format!("decided notify: {text}"))
                            .then(answer(NotifyPurpose::Merged, text)),
                    )
                }
            }
            CiVerdict::Red(failing) => {
                // Check names come from the repository's CI: said, never acted on as orders.
                let text = format!(
                    "{merged}, but its checks failed on `{}`: {}. A person should look (`lifecycle.onRedMain`: notify).",
                    watch.branch,
                    failing.join(", ")
                );
                (
                    Decision::Flag,
                    Finished::completed(format!("decided flag: {text}"))
                        .then(answer(NotifyPurpose::Flag, text)),
                )
            }
            CiVerdict::GiveUp | CiVerdict::NoCi => {
                let text = format!(
                    "{merged}; no check result on `{}` after {} looks.",
                    watch.branch, watch.round
                );
                (
                    Decision::Notify,
                    Finished::completed(format!("decided notify: {text}"))
                        .then(answer(NotifyPurpose::Merged, text)),
                )
            }
        };
        span_meta.decided.decision = Some(decision);
        span_meta.ci_status = Some(status);
        Ok(Outcome::Finished(done.with_meta_record(&span_meta)))
    }
}
