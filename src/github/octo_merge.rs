//! The merge side of [`OctoGitHub`]: the files a pull request changes and the merge itself
//! (`PUT /pulls/{n}/merge` at an exact head), bringing a branch up to date with its base
//! (`PUT /pulls/{n}/update-branch`), with the client's requests and error mapping.

use http::Method;
use serde::Deserialize;
use serde_json::json;

use super::OctoGitHub;
use crate::github::api::{MergeRequest, Merged};
use crate::github::error::GitHubError;

impl OctoGitHub {
    /// The paths pull request `number` changes (a rename under both names).
    pub(super) async fn files_of(&self, number: u64) -> Result<Vec<String>, GitHubError> {
        #[derive(Deserialize)]
        struct RawFile {
            filename: String,
            #[serde(default)]
            previous_filename: Option<String>,
        }
        let what = format!("files of pull request #{number}");
        let raw: Vec<RawFile> = self
            .list_all(&what, &self.path(&format!("/pulls/{number}/files")))
            .await?;
        Ok(raw
            .into_iter()
            .flat_map(|f| std::iter::once(f.filename).chain(f.previous_filename))
            .collect())
    }

    /// Merge pull request `number` at exactly `merge.sha`.
    pub(super) async fn merge_at(
        &self,
        number: u64,
        merge: &MergeRequest,
    ) -> Result<Merged, GitHubError> {
        #[derive(Deserialize)]
        struct RawMerged {
            sha: String,
            #[serde(default)]
            message: String,
        }
        let what = format!("merge of pull request #{number}");
        let payload = json!({"sha": merge.sha, "merge_method": merge.method,
                             "commit_title": merge.title, "commit_message": merge.message});
        let (raw, _) = self
            .call::<RawMerged>(
                &what,
                Method::PUT,
                &self.path(&format!("/pulls/{number}/merge")),
                Some(&payload),
            )
            .await?;
        Ok(Merged {
            sha: raw.sha,
            message: raw.message,
        })
    }

    /// `PUT /pulls/{n}/update-branch` at `expected_head_sha`.
    pub(super) async fn update_branch(
        &self,
        number: u64,
        expected_head_sha: &str,
    ) -> Result<String, GitHubError> {
        #[derive(Deserialize)]
        struct RawUpdate {
            #[serde(default)]
            message: String,
        }
        let what = format!("update of pull request #{number}'s branch");
        let payload = json!({"expected_head_sha": expected_head_sha});
        let (raw, _) = self
            .call::<RawUpdate>(
                &what,
                Method::PUT,
                &self.path(&format!("/pulls/{number}/update-branch")),
                Some(&payload),
            )
            .await?;
        Ok(raw.message)
    }
}
