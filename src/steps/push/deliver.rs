//! Where the pushed change goes. Usually rover's branch and its own pull request into the
//! default branch. When the trace works on a person's pull request (a review asking for
//! changes, a comment asking rover to fix something on it), never a second pull request into
//! the default branch carrying the person's commits: a pull request into their head branch, or
//! rover's commits pushed onto it (`autopilot.github.contributorPrs`), or, for a fork's branch
//! rover can do neither with, its branch alone with a reply saying how to take it.

use super::super::meta::{ContributorDelivery, ContributorHow, EventMeta};
use super::super::Services;
use super::{github_step_error, pr_body, pr_title, Task};
use crate::github::{compose, ContributorPrs, GitHub, GitHubError, NewPullRequest, PullRequest};
use crate::orchestrator::StepError;

/// What the choice depends on besides the pull request.
pub(super) struct Here<'a> {
    /// This repository (`owner/name`).
    pub repo: Option<&'a str>,
    pub default_branch: &'a str,
    pub mode: ContributorPrs,
}

/// Where the change goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Delivery {
    /// rover's branch with its own pull request (found, or opened into the default branch).
    Own,
    /// A pull request from rover's branch into the person's head branch.
    Propose(PullRequest),
    /// rover's commits pushed onto the person's head branch.
    Onto(PullRequest),
    /// The person's branch is in a fork: rover's branch is pushed here and nothing is opened.
    BranchOnly(PullRequest),
}

impl Delivery {
    /// The pull request the trace works on, when the work is about one that is not rover's own
    /// `target` branch's. A merged one is left out: its commits are in the default branch
    /// already, so a pull request into it duplicates nothing.
    pub(super) async fn find(
        gh: &dyn GitHub,
        event: &EventMeta,
        target: &str,
        here: &Here<'_>,
    ) -> Result<Delivery, GitHubError> {
        let Some(number) = event
            .event
            .as_ref()
            .filter(|e| e.is_pull_request)
            .and_then(|e| e.number)
        else {
            return Ok(Delivery::Own);
        };
        let pr = gh.get_pull_request(number).await?;
        Ok(Delivery::decide(pr, target, here))
    }

    fn decide(pr: PullRequest, target: &str, here: &Here<'_>) -> Delivery {
        if pr.head_branch == target || pr.merged {
            return Delivery::Own;
        }
        if !here.repo.is_some_and(|r| pr.head_in(r)) {
            return Delivery::BranchOnly(pr);
        }
        // Never onto the default branch (a pull request from it into another), nor onto a name
        // git would not take as a plain branch: proposed instead.
        let onto = here.mode == ContributorPrs::Push
            && crate::git::is_branch_name(&pr.head_branch)
            && here.default_branch != pr.head_branch;
        if onto {
            Delivery::Onto(pr)
        } else {
            Delivery::Propose(pr)
        }
    }

    /// The remote branch the push goes to: the person's head for [`Delivery::Onto`], else
    /// rover's own `target`.
    pub(super) fn dest(&self, target: &str) -> String {
        match self {
            Delivery::Onto(pr) => pr.head_branch.clone(),
            _ => target.to_owned(),
        }
    }

    /// What the span records and the reply says, once `target` is pushed (`opened`: the pull
    /// request rover proposed, for [`Delivery::Propose`]).
    pub(super) fn record(
        &self,
        target: &str,
        repo: Option<&str>,
        opened: Option<&PullRequest>,
    ) -> Option<ContributorDelivery> {
        let (how, pr, note) = match self {
            Delivery::Own => return None,
            Delivery::Propose(pr) => (
                ContributorHow::Proposed,
                pr,
                format!(
                    "I proposed my change as a pull request into your branch `{}`{}: merge it to take the change into #{}. Nothing was pushed to your branch or to the default branch.",
                    pr.head_branch,
                    opened.map(|o| format!(" (#{})", o.number)).unwrap_or_default(),
                    pr.number
                ),
            ),
            Delivery::Onto(pr) => (
                ContributorHow::PushedOnto,
                pr,
                format!(
                    "I pushed my change onto your branch `{}`, so it is part of #{} now (on top of your commits, nothing rewritten).",
                    pr.head_branch, pr.number
                ),
            ),
            Delivery::BranchOnly(pr) => (
                ContributorHow::BranchOnly,
                pr,
                format!(
                    "Your branch `{}` is in {}: rover neither pushes to a fork nor opens pull requests there. My change is on branch `{target}` of {}: `git pull <this repository's URL> {target}` on your branch takes it into #{}.",
                    pr.head_branch,
                    pr.head_repo
                        .as_deref()
                        .map_or_else(|| "a fork that no longer exists".to_owned(), |r| format!("the fork `{r}`")),
                    repo.map_or_else(|| "this repository".to_owned(), |r| format!("`{r}`")),
                    pr.number
                ),
            ),
        };
        Some(ContributorDelivery {
            how,
            pr_number: pr.number,
            head_branch: pr.head_branch.clone(),
            head_repo: pr.head_repo.clone(),
            note,
        })
    }
}

impl Delivery {
    /// The pull request the push goes with, and whether it was opened now: rover's own (found,
    /// or opened into `default_branch`), one proposed into the person's branch, or the person's
    /// own; none for a fork's branch. `opening`'s base is set here.
    pub(super) async fn pull_request(
        &self,
        gh: &dyn GitHub,
        services: &Services,
        opening: &Opening<'_>,
        default_branch: &str,
    ) -> Result<Option<(PullRequest, bool)>, StepError> {
        Ok(match self {
            Delivery::Own => Some(
                find_or_open(
                    gh,
                    services,
                    &Opening {
                        base: default_branch,
                        ..*opening
                    },
                )
                .await?,
            ),
            Delivery::Propose(theirs) => Some(
                find_or_open(
                    gh,
                    services,
                    &Opening {
                        base: &theirs.head_branch,
                        ..*opening
                    },
                )
                .await?,
            ),
            Delivery::Onto(theirs) => Some((theirs.clone(), false)),
            Delivery::BranchOnly(_) => None,
        })
    }
}

/// What a pull request rover finds or opens is made of.
pub(super) struct Opening<'a> {
    pub branch: &'a str,
    /// The branch it goes into.
    pub base: &'a str,
    pub tasks: &'a [&'a Task],
    pub event: &'a EventMeta,
    /// The files of the change that steer rover (a warning in the body).
    pub steering: &'a [String],
    /// What the self-review checked (a section of the body), when it ran.
    pub self_review: Option<&'a str>,
    pub trace_id: &'a str,
    pub action_id: &'a str,
}

/// The open PR of `branch`, or a new one into `base`; the bool says whether it was opened now.
pub(super) async fn find_or_open(
    gh: &dyn GitHub,
    services: &Services,
    opening: &Opening<'_>,
) -> Result<(PullRequest, bool), StepError> {
    let branch = opening.branch;
    if let Some(existing) = gh
        .find_pull_request_for_branch(branch)
        .await
        .map_err(|e| github_step_error("find the pull request of the branch", &e))?
    {
        return Ok((existing, false));
    }
    let base = opening.base.to_owned();
    let event = opening.event;
    let body = services.redactor.redact(
        &pr_body(opening.tasks, event, opening.steering, opening.self_review),
        event.visibility,
    );
    let new = NewPullRequest {
        title: services
            .redactor
            .redact(&pr_title(opening.tasks, event), event.visibility),
        head: branch.to_owned(),
        base: base.clone(),
        body: compose(&body, opening.trace_id, opening.action_id),
        draft: false,
    };
    let pr = gh.open_pull_request(&new).await.map_err(|e| {
        github_step_error("open the pull request", &e)
            .detail("head", branch)
            .detail("base", &base)
    })?;
    Ok((pr, true))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::github::IssueState;

    fn pr(head: &str, repo: Option<&str>) -> PullRequest {
        PullRequest {
            number: 12,
            title: "Speed up".into(),
            body: String::new(),
            state: IssueState::Open,
            draft: false,
            merged: false,
            labels: vec![],
            author: "bob".into(),
            head_branch: head.into(),
            head_sha: "abc".into(),
            head_repo: repo.map(str::to_owned),
            maintainer_can_modify: true,
            base_branch: "main".into(),
            html_url: "https://github.com/o/r/pull/12".into(),
            mergeable_state: None,
        }
    }

    fn here(mode: ContributorPrs) -> Here<'static> {
        Here {
            repo: Some("o/r"),
            default_branch: "main",
            mode,
        }
    }

    #[test]
    fn a_persons_pull_request_is_never_duplicated_into_the_default_branch() {
        let same = pr("feature/fast", Some("O/R"));
        assert_eq!(
            Delivery::decide(same.clone(), "rover/x", &here(ContributorPrs::Propose)),
            Delivery::Propose(same.clone())
        );
        assert_eq!(
            Delivery::decide(same.clone(), "rover/x", &here(ContributorPrs::Push)),
            Delivery::Onto(same.clone())
        );
        assert_eq!(Delivery::Onto(same.clone()).dest("rover/x"), "feature/fast");
        assert_eq!(Delivery::Propose(same.clone()).dest("rover/x"), "rover/x");
        // A fork's branch, with or without maintainers' edits: rover's branch alone.
        for mode in [ContributorPrs::Propose, ContributorPrs::Push] {
            let fork = pr("feature/fast", Some("bob/r"));
            assert_eq!(
                Delivery::decide(fork.clone(), "rover/x", &here(mode)),
                Delivery::BranchOnly(fork)
            );
            let gone = pr("feature/fast", None);
            assert_eq!(
                Delivery::decide(gone.clone(), "rover/x", &here(mode)),
                Delivery::BranchOnly(gone)
            );
        }
        // Never pushed onto the default branch, nor onto a name git would read as syntax.
        for head in ["main", "-f", "a:b"] {
            let theirs = pr(head, Some("o/r"));
            assert_eq!(
                Delivery::decide(theirs.clone(), "rover/x", &here(ContributorPrs::Push)),
                Delivery::Propose(theirs)
            );
        }
        // rover's own pull request, and a merged one: the usual.
        let own = pr("rover/x", Some("o/r"));
        assert_eq!(
            Delivery::decide(own, "rover/x", &here(ContributorPrs::Push)),
            Delivery::Own
        );
        let mut merged = pr("feature/fast", Some("o/r"));
        merged.merged = true;
        assert_eq!(
            Delivery::decide(merged, "rover/x", &here(ContributorPrs::Push)),
            Delivery::Own
        );
    }

    #[test]
    fn the_reply_says_what_was_done() {
        let same = pr("feature/fast", Some("o/r"));
        let mut opened = pr("rover/x", Some("o/r"));
        opened.number = 13;
        let proposed = Delivery::Propose(same.clone())
            .record("rover/x", Some("o/r"), Some(&opened))
            .expect("a record");
        assert_eq!(proposed.how, ContributorHow::Proposed);
        assert!(
            proposed
                .note
                .contains("into your branch `feature/fast` (#13)"),
            "{}",
            proposed.note
        );
        let onto = Delivery::Onto(same)
            .record("rover/x", Some("o/r"), None)
            .unwrap();
        assert!(
            onto.note.contains("onto your branch `feature/fast`"),
            "{}",
            onto.note
        );
        let fork = Delivery::BranchOnly(pr("fix", Some("bob/r")))
            .record("rover/x", Some("o/r"), None)
            .unwrap();
        assert!(fork.note.contains("the fork `bob/r`"), "{}", fork.note);
        assert!(
            fork.note.contains("branch `rover/x` of `o/r`"),
            "{}",
            fork.note
        );
        assert_eq!(Delivery::Own.record("rover/x", None, None), None);
    }
}
