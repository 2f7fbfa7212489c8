//! `push`: its action (the branches) and its span (the pull request, a conflict, or the
//! secrets that kept it from pushing).

use serde::{Deserialize, Serialize};

use crate::store::records::present;
use crate::store::Span;

/// `push`: push the trace's branches and open or update the PR.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PushMeta {
    #[serde(default)]
    pub branches: Vec<String>,
}

/// How a push ended (`meta.status` of its span).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PushStatus {
    Pushed,
    /// The task branches could not be consolidated: the resolver decides.
    Conflict,
    /// What the push would send holds secrets (`secretsFound`): nothing was pushed.
    Secrets,
}

/// The secrets a refused push would have sent, as the push span records them and the resolver
/// reads them back: where each one is and what it is, never its value.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SecretsFound {
    #[serde(default)]
    pub findings: Vec<crate::git::SecretFinding>,
    /// Findings beyond those listed, counted only.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub more: usize,
}

#[allow(
    clippy::trivially_copy_pass_by_ref,
    reason = "serde's skip_serializing_if"
)]
fn is_zero(n: &usize) -> bool {
    *n == 0
}

impl SecretsFound {
    /// What was found, for a message: `a; b; and 2 more`.
    pub fn describe(&self) -> String {
        crate::git::describe_findings(&self.findings, self.more)
    }
}

/// A consolidation conflict as the push span records it and the resolver reads it back.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PushConflict {
    pub source_branch: String,
    pub target: String,
    #[serde(default)]
    pub files: Vec<String>,
    /// `target` is the base branch the task's pull request merges into (its remote-tracking
    /// name, e.g. `origin/main`), which moved on since the push: GitHub could not bring the
    /// branch up to date. Otherwise `target` is the branch holding the other tasks' work.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub base: bool,
}

/// The `push` span's meta (its error, if any, is under `error`: `ErrorMeta`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PushSpanMeta {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<PushStatus>,
    /// The branch pushed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub branch: Option<String>,
    /// The task branches of the trace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub branches: Option<Vec<String>>,
    /// The task branches merged into the pushed one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub merged: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rebased: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub worktree: Option<std::path::PathBuf>,
    /// Where the `pre-push` hook ran (the same record as the commit span's `hooks`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hooks: Option<crate::git::HookPlan>,
    #[serde(flatten)]
    pub pull_request: PushPullRequest,
    /// Why no pull request was opened (`none: local event`, ...).
    #[serde(
        default,
        rename = "pullRequest",
        skip_serializing_if = "Option::is_none"
    )]
    pub pull_request_note: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub conflict: Option<PushConflict>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secrets_found: Option<SecretsFound>,
    /// Where the change went when the trace worked on a person's pull request.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub contributor: Option<ContributorDelivery>,
    /// The files of the pushed change that steer rover, its sandbox, its agents or CI (see
    /// `steps::push::steering`): the pull request body warns about them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub steering: Option<Vec<String>>,
}

/// The part of a `push` span's meta that `gc`, telemetry and the `/rover` commands read back (the budget reads
/// `prCreated` as `budget::PullRequestOpened`): the pull
/// request the push opened or found. A push without one (a local event, no GitHub client)
/// records `prUrl: null`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PushPullRequest {
    /// Present as `null` when the push opened no pull request.
    #[serde(
        default,
        deserialize_with = "present",
        skip_serializing_if = "Option::is_none"
    )]
    pub pr_url: Option<Option<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pr_number: Option<u64>,
    /// Whether this push opened the pull request (it counts against the budget's PR cap).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pr_created: Option<bool>,
    /// The commit pushed (`null` when it could not be read back).
    #[serde(
        default,
        deserialize_with = "present",
        skip_serializing_if = "Option::is_none"
    )]
    pub head_sha: Option<Option<String>>,
}

impl PushPullRequest {
    /// What a push span recorded of its pull request (nothing, for other shapes).
    pub fn of(span: &Span) -> PushPullRequest {
        crate::store::from_meta(&span.meta).unwrap_or_default()
    }

    /// Whether the push has a pull request (a URL or a number).
    pub fn exists(&self) -> bool {
        self.pr_url.as_ref().is_some_and(Option::is_some) || self.pr_number.is_some()
    }
}

/// What rover did with its change on a person's pull request (`autopilot.github.contributorPrs`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ContributorDelivery {
    /// `proposed` (a pull request into their branch), `pushedOnto` (onto their branch) or
    /// `branchOnly` (their branch is in a fork: rover's branch is here, nothing opened).
    pub how: ContributorHow,
    /// The person's pull request.
    pub pr_number: u64,
    /// Its head branch (in `headRepo`).
    pub head_branch: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub head_repo: Option<String>,
    /// What the reply on the thread says was done, word for word.
    pub note: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum ContributorHow {
    Proposed,
    PushedOnto,
    BranchOnly,
}

/// The part of a span's meta the resolver reads to find a consolidation conflict.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
pub struct ConflictSpanMeta {
    #[serde(default)]
    pub conflict: Option<PushConflict>,
}

impl ConflictSpanMeta {
    /// The conflict a span recorded (none, for a span whose meta has another shape there).
    pub fn of(span: &Span) -> Option<PushConflict> {
        crate::store::from_meta::<ConflictSpanMeta>(&span.meta)
            .ok()
            .and_then(|m| m.conflict)
    }
}

/// The part of a span's meta the resolver reads to find a push refused for secrets.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SecretsSpanMeta {
    #[serde(default)]
    pub branch: Option<String>,
    #[serde(default)]
    pub secrets_found: Option<SecretsFound>,
}

impl SecretsSpanMeta {
    /// The branch and the secrets a push span recorded (none for another span, or a push that
    /// found none).
    pub fn of(span: &Span) -> Option<(String, SecretsFound)> {
        let meta = crate::store::from_meta::<SecretsSpanMeta>(&span.meta).ok()?;
        Some((meta.branch.unwrap_or_default(), meta.secrets_found?))
    }
}
