//! The release side of [`OctoGitHub`]: the releases there are, a new one (GitHub makes its tag
//! at the target commit), and the pull requests merged into a branch, for release notes.

use chrono::{DateTime, Utc};
use http::Method;
use serde::Deserialize;
use serde_json::json;

use super::OctoGitHub;
use crate::github::api::{MergedPull, NewRelease, Release};
use crate::github::error::GitHubError;

#[derive(Deserialize)]
struct RawRelease {
    id: u64,
    tag_name: String,
    #[serde(default)]
    target_commitish: String,
    #[serde(default)]
    html_url: String,
    #[serde(default)]
    created_at: Option<DateTime<Utc>>,
    #[serde(default)]
    draft: bool,
    #[serde(default)]
    prerelease: bool,
}

impl From<RawRelease> for Release {
    fn from(r: RawRelease) -> Release {
        Release {
            id: r.id,
            tag_name: r.tag_name,
            target_commitish: r.target_commitish,
            html_url: r.html_url,
            created_at: r.created_at,
            draft: r.draft,
            prerelease: r.prerelease,
        }
    }
}

impl OctoGitHub {
    /// `GET /releases`, the first page, newest first.
    pub(super) async fn releases(&self) -> Result<Vec<Release>, GitHubError> {
        let (raw, _) = self
            .call::<Vec<RawRelease>>(
                "releases",
                Method::GET,
                &self.path("/releases?per_page=100"),
                None,
            )
            .await?;
        Ok(raw.into_iter().map(Release::from).collect())
    }

    /// `POST /releases`.
    pub(super) async fn new_release(&self, new: &NewRelease) -> Result<Release, GitHubError> {
        let what = format!("release {}", new.tag_name);
        let payload = json!({"tag_name": new.tag_name, "target_commitish": new.target_commitish,
                             "name": new.name, "body": new.body, "draft": false,
                             "prerelease": false, "generate_release_notes": false});
        let (raw, _) = self
            .call::<RawRelease>(&what, Method::POST, &self.path("/releases"), Some(&payload))
            .await?;
        Ok(raw.into())
    }

    /// `GET /pulls?state=closed&base=...`, most recently updated first, the merged ones.
    pub(super) async fn merged_into(&self, base: &str) -> Result<Vec<MergedPull>, GitHubError> {
        #[derive(Deserialize)]
        struct RawPull {
            number: u64,
            #[serde(default)]
            title: String,
            #[serde(default)]
            html_url: String,
            #[serde(default)]
            merged_at: Option<DateTime<Utc>>,
        }
        let what = format!("pull requests merged into {base}");
        let path = self.path(&format!(
            "/pulls?state=closed&base={}&sort=updated&direction=desc&per_page=100",
            super::encode(base, false)
        ));
        let (raw, _) = self
            .call::<Vec<RawPull>>(&what, Method::GET, &path, None)
            .await?;
        Ok(raw
            .into_iter()
            .filter_map(|p| {
                Some(MergedPull {
                    number: p.number,
                    title: p.title,
                    html_url: p.html_url,
                    merged_at: p.merged_at?,
                })
            })
            .collect())
    }
}
