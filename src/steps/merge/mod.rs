//! The `merge` step (no AI): rover merges its own pull request once its checks passed, within
//! `autopilot.lifecycle.mode`'s rules ([`rules`]), at exactly the head that passed (the merge
//! call carries its `sha`), never with an admin override. Scheduled by the CI watch of
//! `coordinate` when the checks are green and the mode merges; it looks again later while it
//! waits (an approval, the hourly cap, GitHub's protection) and says so on the thread once.

pub mod rules;

use std::sync::Arc;

use async_trait::async_trait;
use chrono::{DateTime, Duration, Utc};

use super::meta::{
    ci_watch_action, CiWatchMeta, MergeMeta, MergeOutcome, MergeSpanMeta, NotifyMeta, NotifyPurpose,
};
use super::Services;
use crate::config::LifecycleConfig;
use crate::git::short_sha;
use crate::github::{GitHub, GitHubError, MergeRequest, PullRequest};
use crate::orchestrator::{Finished, NextAction, Outcome, Step, StepContext, StepError};
use crate::store::replay_record::{is_serving, note_world_read, recall, recalled};
use crate::store::{AutopilotStore, StepKind, StepRun};
use rules::{decide, steering_files, Look, Verdict};

/// How many traces back the hourly cap looks for merges (a repository merging more than this
/// in an hour has a cap far above the default).
const CAP_LOOKBACK: usize = 200;

/// The least time between two looks of a waiting merge, seconds.
const MIN_LOOK_SECS: i64 = 60;

/// The world reads a replay serves back (`store::replay_record`): the merges of the last hour
/// across the store, the repository the run was bound to, the time of the look, the files a
/// branch conflicts on with its base.
const RECENT_MERGES: &str = "recent_merges";
const REPOSITORY: &str = "repository";
const CLOCK: &str = "clock";
const CONFLICTING_PATHS: &str = "conflicting_paths";

pub struct MergeStep {
    services: Arc<Services>,
}

impl MergeStep {
    pub fn new(services: Arc<Services>) -> MergeStep {
        MergeStep { services }
    }

    fn lifecycle(&self) -> &LifecycleConfig {
        &self.services.config.autopilot.lifecycle
    }

    /// Trusted people whose latest review approves `head` (a review of an older head, a
    /// reader's, or rover's own does not count).
    async fn approvers(
        &self,
        github: &dyn GitHub,
        pr: &PullRequest,
    ) -> Result<Vec<String>, GitHubError> {
        let reviews = github.list_reviews(pr.number).await?;
        let bot = self.services.config.autopilot.github.bot_login.as_deref();
        let mut latest: Vec<(String, bool)> = Vec::new();
        for review in &reviews {
            let state = review.state.to_ascii_uppercase();
            // Comments do not change a reviewer's verdict; dismissed and requested changes do.
            if state == "COMMENTED" || state == "PENDING" {
                continue;
            }
            let approves =
                state == "APPROVED" && review.commit_id.as_deref() == Some(pr.head_sha.as_str());
            let login = review.author.to_ascii_lowercase();
            latest.retain(|(l, _)| *l != login);
            latest.push((login, approves));
        }
        let policy =
            crate::github::trust::TrustPolicy::new(&self.services.config.autopilot.github.trust);
        let mut approvers = Vec::new();
        for (login, approves) in latest {
            if !approves || crate::github::events::is_bot_login(&login, bot) {
                continue;
            }
            if policy.decide(github, &login).await?.trusted {
                approvers.push(login);
            }
        }
        Ok(approvers)
    }

    /// The merge look, then what it leads to.
    async fn look(
        &self,
        ctx: &StepContext,
        trace_id: uuid::Uuid,
        meta: MergeMeta,
    ) -> Result<Finished, StepError> {
        let github = self.services.github.as_ref().ok_or_else(|| {
            StepError::fatal("rover has no GitHub client to merge the pull request")
        })?;
        let gh_error = |what: &str, e: &GitHubError| {
            StepError::from_error(e, e.is_retryable())
                .not_before(e.retry_at())
                .detail("what", what)
                .detail("prNumber", meta.pr_number)
        };
        let lifecycle = self.lifecycle().clone();
        let pr = github
            .get_pull_request(meta.pr_number)
            .await
            .map_err(|e| gh_error("reading the pull request", &e))?;
        let files = github
            .pull_request_files(meta.pr_number)
            .await
            .map_err(|e| gh_error("listing the files of the pull request", &e))?;
        let steering = steering_files(&files);
        let approvers = if pr.head_sha == meta.sha {
            let mut approvers = self
                .approvers(github.as_ref(), &pr)
                .await
                .map_err(|e| gh_error("reading the reviews of the pull request", &e))?;
            // `/rover merge` on the thread: an approval of this head by a trusted person.
            let view = crate::store::blocking(ctx.store.clone(), move |s| s.load_trace(trace_id))
                .await
                .map_err(|e| StepError::from_error(&e, true).detail("what", "reading the trace"))?;
            approvers.extend(super::history::merge_approvals(&view, &pr.head_sha));
            approvers.sort();
            approvers.dedup();
            approvers
        } else {
            Vec::new()
        };
        // What the store's other traces merged, and the clock: world reads a replay serves
        // back, so a replayed look decides at the time, and against the cap, it saw.
        let recent_merges: Vec<DateTime<Utc>> = if let Some(merges) = recalled(RECENT_MERGES, "") {
            merges
        } else {
            let merges = crate::store::blocking(ctx.store.clone(), merges_since)
                .await
                .map_err(|e| {
                    StepError::from_error(&e, true).detail("what", "counting the recent merges")
                })?;
            note_world_read(RECENT_MERGES, "", &merges);
            merges
        };
        // The repository the run was bound to: whose pull request it is is judged against it.
        let repo = recall(REPOSITORY, "", || github.repo().to_string());
        let now = recall(CLOCK, "", Utc::now);
        let verdict = decide(&Look {
            mode: lifecycle.mode,
            repo: &repo,
            pr: &pr,
            passed_sha: &meta.sha,
            steering: &steering,
            files_complete: files.len() < crate::github::octo::MAX_LISTED,
            approvers: &approvers,
            recent_merges: &recent_merges,
            cap: lifecycle.max_merges_per_hour(),
            now,
        });
        let record = MergeSpanMeta {
            pr_number: Some(pr.number),
            mode: Some(lifecycle.mode.as_str().to_owned()),
            head_sha: Some(pr.head_sha.clone()),
            approved_by: approvers.clone(),
            steering_files: steering,
            ..MergeSpanMeta::default()
        };
        Ok(match verdict {
            Verdict::Merge => self.merge(github.as_ref(), &meta, &pr, record).await?,
            Verdict::Closed(why) => Finished::completed(format!("not merged: {why}"))
                .with_meta_record(&MergeSpanMeta {
                    merge_outcome: Some(MergeOutcome::Closed),
                    reason: Some(why),
                    ..record
                }),
            Verdict::Refuse(why) => refused(&meta, record, &why),
            Verdict::HeadMoved { head } => self.head_moved(&meta, record, head),
            Verdict::NeedsApproval(why) => self.wait_for_approval(&meta, record, &why, now),
            Verdict::Capped { until } => {
                let why = format!(
                    "{} merges in the last hour, the most `lifecycle.maxMergesPerHour` allows: looking again at {}",
                    lifecycle.max_merges_per_hour(),
                    until.format("%H:%M UTC")
                );
                waiting(&meta, record, &why, until)
            }
        })
    }

    /// Ask GitHub to merge the head that passed; its refusal is a span that says GitHub's
    /// words, and the trace waits (405: not mergeable yet) or follows the new head (409) or
    /// fails (anything else): a refusal is never retried blindly.
    async fn merge(
        &self,
        github: &dyn GitHub,
        meta: &MergeMeta,
        pr: &PullRequest,
        record: MergeSpanMeta,
    ) -> Result<Finished, StepError> {
        let method = self.lifecycle().merge_method.as_str();
        let request = MergeRequest {
            sha: meta.sha.clone(),
            method: method.to_owned(),
            title: format!("{} (#{})", pr.title, pr.number),
            message: pr.body.clone(),
        };
        let short = short_sha(&meta.sha);
        match github.merge_pull_request(pr.number, &request).await {
            Ok(merged) => {
                let reason = format!(
                    "merged pull request #{} at {short} ({method}) as {}",
                    pr.number,
                    short_sha(&merged.sha)
                );
                // rover's own words, posted as they are whatever the notifier writes.
                let said = format!(
                    "Merged pull request #{} ({method}) after its checks passed at {short}; the merge commit is {}.",
                    pr.number,
                    short_sha(&merged.sha)
                );
                let notify = NotifyMeta {
                    purpose: NotifyPurpose::Merged,
                    message: Some(said.clone()),
                    note: Some(said),
                    pr_url: Some(meta.pr_url.clone()),
                    ..NotifyMeta::default()
                };
                let finished =
                    Finished::completed(reason.clone()).with_meta_record(&MergeSpanMeta {
                        merge_outcome: Some(MergeOutcome::Merged),
                        merge_sha: Some(merged.sha.clone()),
                        merge_method: Some(method.to_owned()),
                        merged_at: Some(Utc::now()),
                        ..record
                    });
                if !self.lifecycle().post_merge_ci() {
                    return Ok(
                        finished.then(NextAction::new(StepKind::Notify, reason).with_meta(&notify))
                    );
                }
                // The trace answers once the merge commit's checks on the base branch are in.
                Ok(finished.then(ci_watch_action(
                    CiWatchMeta {
                        pr_number: pr.number,
                        pr_url: meta.pr_url.clone(),
                        branch: pr.base_branch.clone(),
                        sha: merged.sha,
                        round: 1,
                        since: Some(Utc::now()),
                        after_merge: true,
                        persons_pull_request: false,
                    },
                    &self.services.config.autopilot.pipeline,
                    Utc::now(),
                )))
            }
            Err(GitHubError::Status {
                status: 409,
                message,
                ..
            }) => {
                // GitHub's 409 does not say the new head: read it.
                let now = github.get_pull_request(pr.number).await.map_err(|e| {
                    StepError::from_error(&e, e.is_retryable())
                        .detail("what", "reading the pull request after a 409")
                        .detail("prNumber", pr.number)
                })?;
                let why = format!(
                    "GitHub refused the merge (409: {message}): the head moved from {short} to {}; its new checks come first",
                    short_sha(&now.head_sha)
                );
                if now.head_sha == meta.sha {
                    return Ok(refused(meta, record, &why));
                }
                Ok(self.head_moved(
                    meta,
                    MergeSpanMeta {
                        reason: Some(why),
                        ..record
                    },
                    now.head_sha,
                ))
            }
            Err(GitHubError::Status {
                status: 405,
                message,
                ..
            }) => {
                if let Some(updated) = self
                    .bring_up_to_date(github, meta, &message, record.clone())
                    .await?
                {
                    return Ok(updated);
                }
                let why = format!(
                    "GitHub refused the merge (405: {message}): the repository's protection is not satisfied yet"
                );
                let max = self.services.config.autopilot.pipeline.ci_max_polls;
                if meta.round >= max {
                    return Ok(refused(
                        meta,
                        record,
                        &format!("{why}; still refused after {} looks", meta.round),
                    ));
                }
                Ok(waiting(meta, record, &why, self.next_look()))
            }
            Err(e) if e.is_retryable() => Err(StepError::from_error(&e, true)
                .not_before(e.retry_at())
                .detail("what", "merging the pull request")
                .detail("prNumber", pr.number)),
            Err(e) => Ok(refused(
                meta,
                record,
                &format!(
                    "GitHub refused the merge: {}",
                    crate::error::error_chain(&e)
                ),
            )),
        }
    }

    /// After GitHub's 405 (`refusal`): when the pull request's branch is behind its base
    /// (`mergeable_state: behind`, which a protection requiring branches to be up to date
    /// refuses), ask GitHub to bring it up to date at the head that passed (a merge of the base
    /// into it, never a force push). Then the merge waits: the next look finds the new head and
    /// follows its checks first. A conflict fails the merge in GitHub's words. `None`: the
    /// branch is not behind (or GitHub has nothing to bring), the refusal is about something
    /// else.
    async fn bring_up_to_date(
        &self,
        github: &dyn GitHub,
        meta: &MergeMeta,
        refusal: &str,
        record: MergeSpanMeta,
    ) -> Result<Option<Finished>, StepError> {
        let gh_error = |what: &str, e: &GitHubError| {
            StepError::from_error(e, e.is_retryable())
                .not_before(e.retry_at())
                .detail("what", what)
                .detail("prNumber", meta.pr_number)
        };
        let pr = github
            .get_pull_request(meta.pr_number)
            .await
            .map_err(|e| gh_error("reading the pull request after a 405", &e))?;
        if pr.mergeable_state.as_deref() != Some("behind") || pr.head_sha != meta.sha {
            return Ok(None);
        }
        let base = pr.base_branch.clone();
        match github
            .update_pull_request_branch(pr.number, &meta.sha)
            .await
        {
            Ok(said) => {
                let why = format!(
                    "GitHub refused the merge (405: {refusal}): the branch is behind `{base}`; rover brought it up to date (GitHub's update-branch: {said}), and its new head's checks come first"
                );
                Ok(Some(waiting_as(
                    MergeOutcome::Updated,
                    meta,
                    record,
                    &why,
                    self.next_look(),
                )))
            }
            Err(e) if e.is_retryable() => Err(gh_error("bringing the branch up to date", &e)),
            // 422: a conflict with the base goes to the resolver; anything else (nothing to
            // bring because GitHub's state was stale, or the head moved) leaves the refusal
            // standing, and the next look sees.
            Err(GitHubError::Validation {
                message, errors, ..
            }) => {
                let said = std::iter::once(message.as_str())
                    .chain(errors.iter().map(String::as_str))
                    .collect::<Vec<_>>()
                    .join("; ");
                if !said.to_ascii_lowercase().contains("conflict") {
                    tracing::info!(pr = pr.number, %said, "update-branch had nothing to do");
                    return Ok(None);
                }
                let why = format!(
                    "GitHub refused the merge (405: {refusal}): the branch is behind `{base}` and conflicts with it (GitHub's update-branch: {said})"
                );
                self.base_conflict(meta, &base, &why, record)
                    .await
                    .map(Some)
            }
            Err(e) => {
                let why = format!(
                    "GitHub refused the merge (405: {refusal}): the branch is behind `{base}` and GitHub cannot bring it up to date: {}; a person resolves it",
                    crate::error::error_chain(&e)
                );
                Ok(Some(refused(meta, record, &why)))
            }
        }
    }

    /// The branch conflicts with its base, which moved on: rover fetches the base, names the
    /// conflicting files (an in-memory merge of the head that passed with the base: nothing
    /// runs) and hands the decision to the resolver, as a consolidation conflict of the push
    /// is. An iterate then merges the base into the task's worktree, the agent resolves the
    /// markers, and the new head is pushed (never forced) and checked before a merge.
    async fn base_conflict(
        &self,
        meta: &MergeMeta,
        base: &str,
        why: &str,
        record: MergeSpanMeta,
    ) -> Result<Finished, StepError> {
        let key = format!("{}@{}..{base}", meta.pr_number, meta.sha);
        let files = match recalled::<(String, Vec<String>)>(CONFLICTING_PATHS, &key) {
            Some(found) => found,
            None if is_serving() => {
                return Err(StepError::fatal(
                    "a replay does not fetch: the conflicting files were not recorded",
                ))
            }
            None => {
                let found = self.name_conflicts(meta, base).await?;
                note_world_read(CONFLICTING_PATHS, &key, &found);
                found
            }
        };
        let (target, files) = files;
        let conflict = super::meta::PushConflict {
            source_branch: meta.branch.clone(),
            target,
            files,
            base: true,
        };
        let summary = format!(
            "merge conflict: `{}` conflicts with `{}` in {}",
            conflict.source_branch,
            conflict.target,
            if conflict.files.is_empty() {
                "files GitHub did not name".to_owned()
            } else {
                conflict.files.join(", ")
            }
        );
        let mut finished =
            Finished::failed(format!("not merged: {summary}")).with_meta_record(&MergeSpanMeta {
                merge_outcome: Some(MergeOutcome::Conflict),
                reason: Some(why.to_owned()),
                conflict: Some(conflict.clone()),
                ..record
            });
        StepError::fatal(why)
            .detail("prNumber", meta.pr_number)
            .detail("sha", &meta.sha)
            .detail("sourceBranch", &conflict.source_branch)
            .detail("conflicts", &conflict.files)
            .to_meta()
            .put_into(&mut finished.meta);
        Ok(finished.then(
            NextAction::new(StepKind::Resolve, format!("decide about the {summary}"))
                .with_meta(&super::meta::ResolveMeta::default()),
        ))
    }

    /// Fetch `base` and merge the head that passed with it in memory: the base's
    /// remote-tracking name and the paths that conflict.
    async fn name_conflicts(
        &self,
        meta: &MergeMeta,
        base: &str,
    ) -> Result<(String, Vec<String>), StepError> {
        let git_error = |what: &str, e: &crate::git::GitError| {
            super::tasks::git_error(what, e).detail("prNumber", meta.pr_number)
        };
        let ws = super::tasks::workspace(&self.services)
            .await
            .map_err(|e| git_error("open the repository", &e))?;
        let token = self
            .services
            .git_token()
            .await
            .map_err(|e| StepError::from_error(&e, e.is_retryable()))?;
        let remote = ws.remote().to_owned();
        let target = format!("{remote}/{base}");
        let mut refspecs = vec![format!("+refs/heads/{base}:refs/remotes/{target}")];
        if ws.commit_id(&meta.sha).await.is_none() {
            // A head rover does not have (GitHub's own update of the branch): its ref.
            refspecs.push(format!(
                "+refs/pull/{}/head:refs/remotes/{remote}/pr/{}",
                meta.pr_number, meta.pr_number
            ));
        }
        ws.fetch(&refspecs, token.as_deref())
            .await
            .map_err(|e| git_error(&format!("fetch `{base}` to name the conflicts"), &e))?;
        let files = ws
            .conflicting_paths(&meta.sha, &format!("refs/remotes/{target}"))
            .await
            .map_err(|e| git_error("merge the head with its base in memory", &e))?
            .unwrap_or_default();
        Ok((target, files))
    }

    /// The head is not the one whose checks passed: its checks are followed again (a `merge`
    /// follows when they are green).
    fn head_moved(&self, meta: &MergeMeta, record: MergeSpanMeta, head: String) -> Finished {
        let why = record.reason.clone().unwrap_or_else(|| {
            format!(
                "the head of pull request #{} moved from {} to {} after its checks passed: its new checks come first",
                meta.pr_number,
                short_sha(&meta.sha),
                short_sha(&head)
            )
        });
        let mut finished =
            Finished::completed(format!("not merged: {why}")).with_meta_record(&MergeSpanMeta {
                merge_outcome: Some(MergeOutcome::HeadMoved),
                reason: Some(why),
                ..record
            });
        finished = finished.then(ci_watch_action(
            CiWatchMeta {
                pr_number: meta.pr_number,
                pr_url: meta.pr_url.clone(),
                branch: meta.branch.clone(),
                sha: head,
                round: 1,
                since: Some(Utc::now()),
                after_merge: false,
                persons_pull_request: false,
            },
            &self.services.config.autopilot.pipeline,
            Utc::now(),
        ));
        finished
    }

    /// An approval is needed: look again later; past `approvalTimeoutMins` say so on the
    /// thread, once.
    fn wait_for_approval(
        &self,
        meta: &MergeMeta,
        record: MergeSpanMeta,
        why: &str,
        now: DateTime<Utc>,
    ) -> Finished {
        let timeout =
            Duration::from_std(self.lifecycle().approval_timeout()).unwrap_or(Duration::hours(1));
        let tell = !meta.told_waiting && now - meta.asked_at >= timeout;
        let mut finished = waiting(
            &MergeMeta {
                told_waiting: meta.told_waiting || tell,
                ..meta.clone()
            },
            record,
            why,
            self.next_look(),
        );
        if tell {
            let text = format!(
                "Pull request #{} passed its checks and waits for a merge: {why}. Approve its current head (a person with write access) and rover merges it.",
                meta.pr_number
            );
            finished = finished.then(
                NextAction::new(StepKind::Notify, "say the merge waits for an approval").with_meta(
                    &NotifyMeta {
                        purpose: NotifyPurpose::Flag,
                        message: Some(text.clone()),
                        note: Some(text),
                        pr_url: Some(meta.pr_url.clone()),
                        ..NotifyMeta::default()
                    },
                ),
            );
        }
        finished
    }

    /// The next look of a waiting merge: `ciPollSecs` from now, at least a minute (an event on
    /// the pull request, a review or a comment, makes it look at once).
    fn next_look(&self) -> DateTime<Utc> {
        let secs = i64::try_from(self.services.config.autopilot.pipeline.ci_poll_secs)
            .unwrap_or(i64::MAX)
            .max(MIN_LOOK_SECS);
        Utc::now() + Duration::try_seconds(secs).unwrap_or(Duration::hours(1))
    }
}

/// Not merged, and never will be by this trace: the span says why, the requester is told.
fn refused(meta: &MergeMeta, record: MergeSpanMeta, why: &str) -> Finished {
    let mut finished =
        Finished::failed(format!("not merged: {why}")).with_meta_record(&MergeSpanMeta {
            merge_outcome: Some(MergeOutcome::Refused),
            reason: Some(why.to_owned()),
            ..record
        });
    StepError::fatal(why)
        .detail("prNumber", meta.pr_number)
        .detail("sha", &meta.sha)
        .to_meta()
        .put_into(&mut finished.meta);
    finished.then(
        NextAction::new(StepKind::Notify, format!("the merge failed: {why}")).with_meta(
            &NotifyMeta {
                pr_url: Some(meta.pr_url.clone()),
                ..NotifyMeta::failure(&StepKind::Merge, why)
            },
        ),
    )
}

/// Not yet: the next look at `at`, the span saying what it waits for.
fn waiting(meta: &MergeMeta, record: MergeSpanMeta, why: &str, at: DateTime<Utc>) -> Finished {
    waiting_as(MergeOutcome::Waiting, meta, record, why, at)
}

/// [`waiting`], the span's outcome `outcome` (`updated`: the branch was brought up to date).
fn waiting_as(
    outcome: MergeOutcome,
    meta: &MergeMeta,
    record: MergeSpanMeta,
    why: &str,
    at: DateTime<Utc>,
) -> Finished {
    let next = MergeMeta {
        round: meta.round + 1,
        not_before: Some(at),
        ..meta.clone()
    };
    Finished::completed(format!("waiting to merge: {why}"))
        .with_meta_record(&MergeSpanMeta {
            merge_outcome: Some(outcome),
            reason: Some(why.to_owned()),
            ..record
        })
        .then(
            NextAction::new(
                StepKind::Merge,
                format!(
                    "merge pull request #{} (look {}): {why}",
                    meta.pr_number, next.round
                ),
            )
            .with_meta(&next),
        )
}

/// When the merges rover made in the last hour were made (the hourly cap counts them).
fn merges_since(store: &AutopilotStore) -> Result<Vec<DateTime<Utc>>, crate::store::StoreError> {
    let since = Utc::now() - Duration::hours(1);
    super::history::merges_since(store, since, CAP_LOOKBACK)
}

#[async_trait]
impl Step for MergeStep {
    fn kind(&self) -> StepKind {
        StepKind::Merge
    }

    fn always_recorded(&self) -> bool {
        crate::steps::kinds::always_recorded(&self.kind())
    }

    fn max_parallel(&self) -> usize {
        1
    }

    fn exclusive_per_trace(&self) -> bool {
        true
    }

    async fn process(&self, ctx: &StepContext, run: &StepRun) -> Result<Outcome, StepError> {
        let meta: MergeMeta = super::meta::read(&run.action).map_err(|e| {
            StepError::fatal(format!("the merge action's meta does not parse: {e}"))
        })?;
        Ok(Outcome::Finished(
            self.look(ctx, run.pending.trace_id, meta).await?,
        ))
    }
}
