//! What the push span records and the channel is told once the branch is pushed: the summary,
//! the pull request it went with (or why none), the reply to a person whose pull request the
//! work was about, and the watch on the pushed commit's CI.

use std::path::PathBuf;

use super::super::meta::{
    CiWatchMeta, EventMeta, EventSource, NotifyMeta, NotifyPurpose, PushPullRequest, PushSpanMeta,
    PushStatus,
};
use super::super::Services;
use super::deliver::Delivery;
use crate::github::PullRequest;
use crate::orchestrator::{Finished, NextAction};
use crate::store::StepKind;

/// What the push did, for the span.
pub(super) struct Pushed {
    pub target: String,
    /// The commit pushed (None when the branch head could not be read back).
    pub head_sha: Option<String>,
    pub merged: Vec<String>,
    pub rebased: bool,
    pub worktree: PathBuf,
    /// Where the `pre-push` hook ran.
    pub hooks: crate::git::HookPlan,
}

/// Where the pushed branch went and what the work is about.
pub(super) struct Landing<'a> {
    pub pushed: &'a Pushed,
    /// The remote branch pushed to.
    pub dest: &'a str,
    pub branches: &'a [String],
    /// The files of the change that steer rover.
    pub steering: &'a [String],
    pub delivery: &'a Delivery,
    pub event: &'a EventMeta,
    /// This repository (`owner/name`).
    pub repo: Option<&'a str>,
}

impl Landing<'_> {
    /// " onto `dest`" when the push went to another branch than its own (`quote`: in backticks).
    fn onto(&self, quote: bool) -> String {
        match (self.dest == self.pushed.target, quote) {
            (true, _) => String::new(),
            (false, true) => format!(" onto `{}`", self.dest),
            (false, false) => format!(" onto {}", self.dest),
        }
    }

    /// The completed push span: what was pushed where, merged and hooked.
    fn pushed_span(&self) -> Finished {
        let pushed = self.pushed;
        let steering = self.steering;
        Finished::completed(format!(
            "pushed {}{}{}{}",
            pushed.target,
            self.onto(false),
            if pushed.merged.is_empty() {
                String::new()
            } else {
                format!(" (merged {})", pushed.merged.join(", "))
            },
            if steering.is_empty() {
                String::new()
            } else {
                format!(
                    "; warning: it changes what steers rover: {}",
                    steering.join(", ")
                )
            }
        ))
        .with_meta_record(&PushSpanMeta {
            status: Some(PushStatus::Pushed),
            steering: (!steering.is_empty()).then(|| steering.to_vec()),
            branch: Some(pushed.target.clone()),
            branches: Some(self.branches.to_vec()),
            merged: Some(pushed.merged.clone()),
            rebased: Some(pushed.rebased),
            hooks: Some(pushed.hooks.clone()),
            worktree: Some(pushed.worktree.clone()),
            ..PushSpanMeta::default()
        })
    }

    /// The push span with the pull request it went with (`pr`: the pull request and whether it
    /// was opened now), then the notify and, when rover follows CI, a look at the pushed commit's.
    pub(super) fn finished(
        &self,
        services: &Services,
        pr: Option<(PullRequest, bool)>,
    ) -> Finished {
        let pushed = self.pushed;
        let mut finished = self.pushed_span();
        let mut notify = NotifyMeta {
            purpose: NotifyPurpose::Pushed,
            message: Some(format!("Pushed branch `{}`.", pushed.target)),
            ..NotifyMeta::default()
        };
        let proposed = pr
            .as_ref()
            .filter(|_| matches!(self.delivery, Delivery::Propose(_)));
        if let Some(record) =
            self.delivery
                .record(&pushed.target, self.repo, proposed.map(|p| &p.0))
        {
            notify.note = Some(record.note.clone());
            finished = finished.with_meta_record(&PushSpanMeta {
                contributor: Some(record),
                ..PushSpanMeta::default()
            });
        }
        let mut ci_watch = None;
        if let Some(pr) = pr {
            finished = self.with_pull_request(finished, &mut notify, &pr);
            // Rover follows the CI of what it pushed (see `coordinate`): the commit is its own.
            // A lifecycle mode that merges follows CI whatever `followCi` says: it merges on green.
            let follow = services.config.autopilot.pipeline.follow_ci
                || services.config.autopilot.lifecycle.mode.merges();
            ci_watch = pushed
                .head_sha
                .clone()
                .filter(|_| follow)
                .map(|sha| CiWatchMeta {
                    pr_number: pr.0.number,
                    pr_url: pr.0.html_url.clone(),
                    branch: self.dest.to_owned(),
                    sha,
                    round: 1,
                    since: Some(chrono::Utc::now()),
                    after_merge: false,
                    persons_pull_request: !matches!(self.delivery, Delivery::Own),
                });
        } else {
            finished = self.without_pull_request(finished);
        }
        let reason = format!("tell the channel about the push of {}", pushed.target);
        let mut finished =
            finished.then(NextAction::new(StepKind::Notify, reason).with_meta(&notify));
        if let Some(watch) = ci_watch {
            finished = finished.then(super::super::meta::ci_watch_action(
                watch,
                &services.config.autopilot.pipeline,
                chrono::Utc::now(),
            ));
        }
        finished
    }

    /// The pull request in the span's summary and meta and in the notify.
    fn with_pull_request(
        &self,
        finished: Finished,
        notify: &mut NotifyMeta,
        (pr, opened): &(PullRequest, bool),
    ) -> Finished {
        // Pushed onto the person's pull request: the reply is on it, no link to itself.
        if !matches!(self.delivery, Delivery::Onto(_)) {
            notify.pr_url = Some(pr.html_url.clone());
        }
        notify.message = Some(format!(
            "Pushed branch `{}`{} to pull request #{}: {}",
            self.pushed.target,
            self.onto(true),
            pr.number,
            pr.html_url
        ));
        let mut finished = finished;
        finished.summary = format!(
            "{} → PR #{} ({})",
            finished.summary,
            pr.number,
            if *opened { "opened" } else { "existing" }
        );
        finished.with_meta_record(&PushPullRequest {
            pr_url: Some(Some(pr.html_url.clone())),
            pr_number: Some(pr.number),
            pr_created: Some(*opened),
            head_sha: Some(self.pushed.head_sha.clone()),
        })
    }

    /// No pull request: the span says why.
    fn without_pull_request(&self, finished: Finished) -> Finished {
        finished.with_meta_record(&PushSpanMeta {
            pull_request: PushPullRequest {
                pr_url: Some(None),
                ..PushPullRequest::default()
            },
            pull_request_note: Some(
                if matches!(self.delivery, Delivery::BranchOnly(_)) {
                    "none: the pull request's branch is in a fork"
                } else if self.event.source == EventSource::Local {
                    "none: local event"
                } else {
                    "none: no GitHub client configured"
                }
                .to_owned(),
            ),
            ..PushSpanMeta::default()
        })
    }
}
