//! The `release` step (no AI): after rover's merge commit passed its checks on the base branch,
//! tag it with the next version (`autopilot.lifecycle.release`: the tag template and the bump)
//! and make a GitHub release whose notes list the pull requests merged since the last release
//! (titles and links, redacted as a public comment is). Scheduled only by a green look at the
//! merge commit (`coordinate`), so never from a red base branch. One release at a time across
//! the repository, so two merges never take the same version.

mod notes;

use std::sync::Arc;

use async_trait::async_trait;

use super::meta::{NotifyMeta, NotifyPurpose, ReleaseMeta, ReleaseOutcome, ReleaseSpanMeta};
use super::Services;
use crate::config::{TagTemplate, Version};
use crate::git::short_sha;
use crate::github::{GitHubError, NewRelease, Release};
use crate::orchestrator::{Finished, NextAction, Outcome, Step, StepContext, StepError};
use crate::store::{StepKind, StepRun};

pub struct ReleaseStep {
    services: Arc<Services>,
}

impl ReleaseStep {
    pub fn new(services: Arc<Services>) -> ReleaseStep {
        ReleaseStep { services }
    }

    async fn release(&self, meta: &ReleaseMeta) -> Result<Finished, StepError> {
        let Some((template, bump)) = self.services.config.autopilot.lifecycle.release.tagged()
        else {
            // The setting went away since the merge: the answer says the merge alone.
            return Ok(
                Finished::completed("no release: `lifecycle.release` is \"none\"").then(answer(
                    meta,
                    NotifyPurpose::Merged,
                    meta.merged.clone(),
                )),
            );
        };
        let github =
            self.services.github.as_ref().ok_or_else(|| {
                StepError::fatal("rover has no GitHub client to make the release")
            })?;
        let gh_error = |what: &str, e: &GitHubError| {
            StepError::from_error(e, e.is_retryable())
                .not_before(e.retry_at())
                .detail("what", what)
                .detail("sha", &meta.sha)
        };
        let releases = github
            .list_releases()
            .await
            .map_err(|e| gh_error("listing the releases", &e))?;
        // Made before a restart: this commit is released already.
        if let Some(made) = releases.iter().find(|r| r.target_commitish == meta.sha) {
            let record = ReleaseSpanMeta {
                release_outcome: Some(ReleaseOutcome::Existing),
                tag: Some(made.tag_name.clone()),
                sha: Some(meta.sha.clone()),
                release_url: Some(made.html_url.clone()),
                ..ReleaseSpanMeta::default()
            };
            let said = format!(
                "{} Released as {} ({}).",
                meta.merged, made.tag_name, made.html_url
            );
            return Ok(Finished::completed(format!(
                "{} was released as {} already",
                short_sha(&meta.sha),
                made.tag_name
            ))
            .with_meta_record(&record)
            .then(answer(meta, NotifyPurpose::Merged, said)));
        }
        let previous = latest_version(&releases, template);
        let version = previous.map_or(Version::default(), |(v, _)| v).bumped(bump);
        let tag = template.tag(version);
        let merged = github
            .merged_pull_requests(&meta.branch)
            .await
            .map_err(|e| gh_error("listing the merged pull requests", &e))?;
        let since = previous.and_then(|(_, r)| r.created_at);
        let listed = notes::since(&merged, since, meta);
        let body = self.services.redactor.redact(
            &notes::render(&listed, previous.map(|(_, r)| r.tag_name.as_str()), meta),
            crate::github::Visibility::Public,
        );
        let record = ReleaseSpanMeta {
            tag: Some(tag.clone()),
            previous_tag: previous.map(|(_, r)| r.tag_name.clone()),
            sha: Some(meta.sha.clone()),
            pulls: listed.iter().map(|p| p.number).collect(),
            ..ReleaseSpanMeta::default()
        };
        let new = NewRelease {
            tag_name: tag.clone(),
            target_commitish: meta.sha.clone(),
            name: tag.clone(),
            body,
        };
        match github.create_release(&new).await {
            Ok(made) => {
                let said = format!("{} Released as {tag} ({}).", meta.merged, made.html_url);
                Ok(Finished::completed(format!(
                    "released {tag} at {} ({} pull requests in the notes; {bump_word} after {})",
                    short_sha(&meta.sha),
                    listed.len(),
                    previous.map_or("none", |(_, r)| r.tag_name.as_str()),
                    bump_word = bump.as_str(),
                ))
                .with_meta_record(&ReleaseSpanMeta {
                    release_outcome: Some(ReleaseOutcome::Released),
                    release_url: Some(made.html_url),
                    ..record
                })
                .then(answer(meta, NotifyPurpose::Merged, said)))
            }
            Err(e) if e.is_retryable() => Err(gh_error("making the release", &e)),
            Err(e) => {
                let why = format!(
                    "GitHub refused the release {tag}: {}",
                    crate::error::error_chain(&e)
                );
                let said = format!("{} It was not released: {why}.", meta.merged);
                let mut finished = Finished::failed(format!("not released: {why}"))
                    .with_meta_record(&ReleaseSpanMeta {
                        release_outcome: Some(ReleaseOutcome::Refused),
                        reason: Some(why.clone()),
                        ..record
                    });
                StepError::fatal(why)
                    .detail("tag", &tag)
                    .detail("sha", &meta.sha)
                    .to_meta()
                    .put_into(&mut finished.meta);
                Ok(finished.then(answer(meta, NotifyPurpose::Flag, said)))
            }
        }
    }
}

/// The highest version among the published releases whose tags the template made, with its
/// release.
fn latest_version<'a>(
    releases: &'a [Release],
    template: &TagTemplate,
) -> Option<(Version, &'a Release)> {
    releases
        .iter()
        .filter(|r| !r.draft)
        .filter_map(|r| template.version_of(&r.tag_name).map(|v| (v, r)))
        .max_by_key(|(v, _)| *v)
}

/// The trace's answer: merged, green, and released (`Merged`) or not (`Flag`), in rover's own
/// words.
fn answer(meta: &ReleaseMeta, purpose: NotifyPurpose, said: String) -> NextAction {
    NextAction::new(StepKind::Notify, said.clone()).with_meta(&NotifyMeta {
        purpose,
        message: Some(said.clone()),
        note: Some(said),
        pr_url: Some(meta.pr_url.clone()),
        ..NotifyMeta::default()
    })
}

#[async_trait]
impl Step for ReleaseStep {
    fn kind(&self) -> StepKind {
        StepKind::Release
    }

    fn always_recorded(&self) -> bool {
        crate::steps::kinds::always_recorded(&self.kind())
    }

    /// One release at a time across the repository: the next version is read from the last.
    fn max_parallel(&self) -> usize {
        1
    }

    async fn process(&self, _ctx: &StepContext, run: &StepRun) -> Result<Outcome, StepError> {
        let meta: ReleaseMeta = super::meta::read(&run.action).map_err(|e| {
            StepError::fatal(format!("the release action's meta does not parse: {e}"))
        })?;
        Ok(Outcome::Finished(self.release(&meta).await?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn release(tag: &str, draft: bool) -> Release {
        Release {
            id: 1,
            tag_name: tag.into(),
            target_commitish: "main".into(),
            html_url: String::new(),
            created_at: None,
            draft,
            prerelease: false,
        }
    }

    #[test]
    fn the_latest_version_is_the_highest_the_template_made_not_the_newest() {
        let t = TagTemplate::parse(TagTemplate::DEFAULT).unwrap();
        let releases = [
            release("v1.10.0", false),
            release("nightly-2026", false),
            release("v1.9.7", false),
            release("v2.0.0", true),
        ];
        let (v, r) = latest_version(&releases, &t).unwrap();
        assert_eq!(
            (v.to_string(), r.tag_name.as_str()),
            ("1.10.0".into(), "v1.10.0")
        );
        assert!(latest_version(&[release("nightly", false)], &t).is_none());
    }
}
