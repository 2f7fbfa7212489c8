//! The merge rules, as one pure decision over what GitHub said: whose pull request it is, which
//! head passed its checks, what it changes, who approved which head, how many merges the last
//! hour saw. Nothing here calls GitHub; [`decide`] is what the `merge` step does with its look.

use chrono::{DateTime, Duration, Utc};

use crate::config::LifecycleMode;
use crate::github::{IssueState, PullRequest};

/// The paths of `files` that steer rover ([`crate::steps::steering`], the list the push step
/// warns about), sorted, once each: a pull request changing one is never merged without a
/// trusted approval of its current head, whatever the mode.
pub fn steering_files(files: &[String]) -> Vec<String> {
    let mut found = crate::steps::steering::steering(files);
    found.sort();
    found.dedup();
    found
}

/// What the `merge` step saw.
#[derive(Debug, Clone)]
pub struct Look<'a> {
    pub mode: LifecycleMode,
    /// This repository, `owner/name`.
    pub repo: &'a str,
    pub pr: &'a PullRequest,
    /// The head whose checks passed.
    pub passed_sha: &'a str,
    /// Changed files that steer rover ([`steering_files`]).
    pub steering: &'a [String],
    /// Whether the list of changed files is whole (a list as long as the client reads may
    /// have been cut, and what steers rover may be past its end).
    pub files_complete: bool,
    /// Trusted people whose latest review approves the current head.
    pub approvers: &'a [String],
    /// When the merges of the last hour were made (any trace of this repository).
    pub recent_merges: &'a [DateTime<Utc>],
    /// `lifecycle.maxMergesPerHour`.
    pub cap: u32,
    pub now: DateTime<Utc>,
}

/// What to do about it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Merge the head that passed.
    Merge,
    /// Merged or closed meanwhile: nothing to do.
    Closed(String),
    /// Never merged by rover (not its own pull request, a fork, a draft).
    Refuse(String),
    /// The head is no longer the one whose checks passed: follow the new head's checks.
    HeadMoved { head: String },
    /// A trusted approval of the current head is needed first.
    NeedsApproval(String),
    /// The hourly cap is reached: look again at `until`.
    Capped { until: DateTime<Utc> },
}

/// The rules, in the order they are checked: the state, whose it is, the head, the approval,
/// the cap.
pub fn decide(look: &Look<'_>) -> Verdict {
    let pr = look.pr;
    if pr.merged || pr.state != IssueState::Open {
        return Verdict::Closed(format!(
            "pull request #{} is {}",
            pr.number,
            if pr.merged { "merged" } else { "closed" }
        ));
    }
    if !pr.head_branch.starts_with("rover/") || !pr.head_in(look.repo) {
        return Verdict::Refuse(format!(
            "pull request #{} is not rover's own (head `{}` of {}): rover merges only the pull requests it opened from its own rover/ branches",
            pr.number,
            pr.head_branch,
            pr.head_repo.as_deref().unwrap_or("a deleted fork")
        ));
    }
    if pr.draft {
        return Verdict::Refuse(format!(
            "pull request #{} is a draft: rover does not merge drafts",
            pr.number
        ));
    }
    if pr.head_sha != look.passed_sha {
        return Verdict::HeadMoved {
            head: pr.head_sha.clone(),
        };
    }
    let short = &pr.head_sha[..pr.head_sha.len().min(12)];
    if look.approvers.is_empty() {
        if !look.files_complete {
            return Verdict::NeedsApproval(format!(
                "it changes more files than rover can list ({} or more), so rover cannot tell whether it changes what steers rover: a trusted person's approval of {short} is needed",
                crate::github::octo::MAX_LISTED
            ));
        }
        if !look.steering.is_empty() {
            return Verdict::NeedsApproval(format!(
                "it changes what steers rover ({}): a trusted person's approval of {short} is needed whatever the mode",
                look.steering.join(", ")
            ));
        }
        if look.mode == LifecycleMode::Prod {
            return Verdict::NeedsApproval(format!(
                "lifecycle mode prod: a trusted person's approval of {short} is needed"
            ));
        }
    }
    let hour_ago = look.now - Duration::hours(1);
    let mut recent: Vec<DateTime<Utc>> = look
        .recent_merges
        .iter()
        .copied()
        .filter(|at| *at > hour_ago)
        .collect();
    recent.sort();
    if u32::try_from(recent.len()).unwrap_or(u32::MAX) >= look.cap {
        // The first merge in the window leaves it an hour after it was made.
        let until = recent
            .first()
            .map_or(look.now, |first| *first + Duration::hours(1));
        return Verdict::Capped {
            until: until.max(look.now + Duration::seconds(1)),
        };
    }
    Verdict::Merge
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pr() -> PullRequest {
        PullRequest {
            number: 7,
            title: "Add a flag".into(),
            body: String::new(),
            state: IssueState::Open,
            draft: false,
            merged: false,
            labels: Vec::new(),
            author: "rover-bot[bot]".into(),
            head_branch: "rover/issue-3-add-flag".into(),
            head_sha: "a".repeat(40),
            head_repo: Some("acme/widgets".into()),
            maintainer_can_modify: true,
            base_branch: "main".into(),
            html_url: "https://github.com/acme/widgets/pull/7".into(),
            mergeable_state: None,
        }
    }

    fn look<'a>(pr: &'a PullRequest, passed: &'a str) -> Look<'a> {
        Look {
            mode: LifecycleMode::Dev,
            repo: "acme/widgets",
            pr,
            passed_sha: passed,
            steering: &[],
            files_complete: true,
            approvers: &[],
            recent_merges: &[],
            cap: 10,
            now: Utc::now(),
        }
    }

    #[test]
    fn dev_merges_rovers_own_green_head() {
        let pr = pr();
        let sha = "a".repeat(40);
        assert_eq!(decide(&look(&pr, &sha)), Verdict::Merge);
    }

    #[test]
    fn a_persons_branch_a_fork_and_a_draft_are_never_merged() {
        let sha = "a".repeat(40);
        let mut person = pr();
        person.head_branch = "feature/mine".into();
        assert!(matches!(decide(&look(&person, &sha)), Verdict::Refuse(_)));
        let mut fork = pr();
        fork.head_repo = Some("mallory/widgets".into());
        assert!(matches!(decide(&look(&fork, &sha)), Verdict::Refuse(_)));
        let mut gone = pr();
        gone.head_repo = None;
        assert!(matches!(decide(&look(&gone, &sha)), Verdict::Refuse(_)));
        let mut draft = pr();
        draft.draft = true;
        assert!(matches!(decide(&look(&draft, &sha)), Verdict::Refuse(_)));
    }

    #[test]
    fn a_head_that_moved_after_its_checks_is_not_merged() {
        let pr = pr();
        let older = "b".repeat(40);
        assert_eq!(
            decide(&look(&pr, &older)),
            Verdict::HeadMoved {
                head: "a".repeat(40)
            }
        );
    }

    #[test]
    fn prod_and_steering_changes_need_a_trusted_approval_of_the_head() {
        let pr = pr();
        let sha = "a".repeat(40);
        let prod = Look {
            mode: LifecycleMode::Prod,
            ..look(&pr, &sha)
        };
        assert!(matches!(decide(&prod), Verdict::NeedsApproval(_)));
        let alice = vec!["alice".to_owned()];
        assert_eq!(
            decide(&Look {
                approvers: &alice,
                ..prod.clone()
            }),
            Verdict::Merge
        );
        let steering = steering_files(&[
            "src/lib.rs".into(),
            ".github/workflows/ci.yml".into(),
            "Rover.json".into(),
        ]);
        assert_eq!(steering, [".github/workflows/ci.yml", "Rover.json"]);
        let dev = Look {
            steering: &steering,
            ..look(&pr, &sha)
        };
        match decide(&dev) {
            Verdict::NeedsApproval(why) => assert!(why.contains("Rover.json"), "{why}"),
            other => panic!("{other:?}"),
        }
        assert_eq!(
            decide(&Look {
                approvers: &alice,
                ..dev
            }),
            Verdict::Merge
        );
    }

    #[test]
    fn a_file_list_that_may_be_cut_needs_an_approval_as_a_steering_change_does() {
        let pr = pr();
        let sha = "a".repeat(40);
        let cut = Look {
            files_complete: false,
            ..look(&pr, &sha)
        };
        match decide(&cut) {
            Verdict::NeedsApproval(why) => assert!(why.contains("more files than rover can list")),
            other => panic!("{other:?}"),
        }
        let alice = vec!["alice".to_owned()];
        assert_eq!(
            decide(&Look {
                approvers: &alice,
                ..cut
            }),
            Verdict::Merge
        );
    }

    #[test]
    fn the_steering_paths_match_folders_and_files_not_lookalikes() {
        let files: Vec<String> = [
            ".rover/setup.sh",
            ".devcontainer/devcontainer.json",
            ".husky/pre-commit",
            "docs/rover.json",
            ".roverrc",
            "src/.github/workflows/x.yml",
            "AGENTS.md",
        ]
        .map(String::from)
        .to_vec();
        assert_eq!(
            steering_files(&files),
            [
                ".devcontainer/devcontainer.json",
                ".husky/pre-commit",
                ".rover/setup.sh",
                "AGENTS.md"
            ]
        );
    }

    #[test]
    fn the_hourly_cap_holds_and_says_when_it_frees() {
        let pr = pr();
        let sha = "a".repeat(40);
        let now = Utc::now();
        let merges: Vec<DateTime<Utc>> = (0..3)
            .map(|i| now - Duration::minutes(50 - i * 10))
            .chain([now - Duration::minutes(90)])
            .collect();
        let capped = Look {
            recent_merges: &merges,
            cap: 3,
            now,
            ..look(&pr, &sha)
        };
        assert_eq!(
            decide(&capped),
            Verdict::Capped {
                until: now + Duration::minutes(10)
            }
        );
        assert_eq!(decide(&Look { cap: 4, ..capped }), Verdict::Merge);
    }

    #[test]
    fn merged_or_closed_is_left_alone() {
        let sha = "a".repeat(40);
        let mut merged = pr();
        merged.merged = true;
        merged.state = IssueState::Closed;
        assert!(matches!(decide(&look(&merged, &sha)), Verdict::Closed(_)));
    }
}
