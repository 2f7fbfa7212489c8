//! Bringing the checkout up to date before a task forks: `git fetch` of exactly the refs the
//! task needs (the default branch, a pushed commit, a pull request's head), never forced onto a
//! local branch, with no hook and no submodule.

use super::command::{run_git, Target};
use super::error::GitError;
use super::workspace::{blocking, Workspace};

impl Workspace {
    /// Fetches `refspecs` from the workspace's remote into the checkout; `token`, when given,
    /// reaches git only through the credential helper's variable.
    pub async fn fetch(&self, refspecs: &[String], token: Option<&str>) -> Result<(), GitError> {
        let mut envs = self.envs().to_vec();
        if let Some(token) = token {
            envs.extend(super::push::credential_envs(token));
        }
        let mut args = vec![
            "fetch",
            "--quiet",
            "--no-tags",
            "--no-recurse-submodules",
            "--no-write-fetch-head",
            self.remote(),
        ];
        args.extend(refspecs.iter().map(String::as_str));
        run_git(Target::Dir(self.repo_path()), &args, &envs).await?;
        Ok(())
    }

    /// The full id of the commit `name` (a sha or a ref) names in the checkout, if it has it.
    pub async fn commit_id(&self, name: &str) -> Option<String> {
        let repo_path = self.repo_path().to_path_buf();
        let name = name.to_owned();
        blocking(move || {
            let repo = git2::Repository::open(&repo_path).ok()?;
            let object = repo.revparse_single(&name).ok()?;
            let id = object.peel_to_commit().ok()?.id();
            Some(id.to_string())
        })
        .await
        .ok()
        .flatten()
    }
}
