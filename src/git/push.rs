//! Pushing a task branch with the `git` CLI: upstream set, rebase-and-retry once, never forced.

use std::ffi::OsString;
use std::path::Path;

use super::boundary::NO_HOOKS;
use super::command::{run_git, Target};
use super::error::GitError;
use super::hooks::HookPlan;
use super::scan::SecretScan;
use super::workspace::Workspace;

/// The variable that carries the GitHub token to the credential helper of one `git push` child.
/// The token never appears in argv, in a URL or in the parent's environment.
pub const GIT_TOKEN_ENV: &str = "ROVER_GIT_TOKEN";

/// A credential helper that answers `get` from [`GIT_TOKEN_ENV`]; it contains no data itself.
const TOKEN_HELPER: &str =
    "!f() { test \"$1\" = get || return 0; echo username=x-access-token; echo \"password=${ROVER_GIT_TOKEN}\"; }; f";

/// What `push_branch` did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PushReport {
    /// The local branch pushed.
    pub branch: String,
    /// The remote's branch it was pushed to (the same name, unless pushed onto another's).
    pub dest: String,
    /// The remote pushed to.
    pub remote: String,
    /// Whether the first push was rejected as non-fast-forward and the branch was rebased onto
    /// the remote's copy before the second (last) attempt.
    pub rebased: bool,
}

impl Workspace {
    /// Pushes `branch` from `worktree` to the workspace's remote branch `dest` (the same name,
    /// or a person's branch rover's commits go onto) and sets it as upstream.
    ///
    /// A non-fast-forward rejection leads to `git pull --rebase` (of `dest`) and one more push; a second
    /// rejection or a rebase conflict is an error (the rebase is aborted). Never forced.
    /// `token`, when given, reaches git only through a credential helper reading an env var.
    ///
    /// Hooks never run while git holds the credential: the `pre-push` hook of a host plan runs
    /// first, on its own (a sandbox plan's caller runs it in a container before calling this),
    /// and the push itself looks for hooks nowhere.
    ///
    /// Before each attempt, what it would send is scanned with `secrets` (see `scan`): a secret
    /// rover holds or a key-shaped string is [`GitError::SecretsInPush`] and nothing is sent.
    pub async fn push_branch(
        &self,
        worktree: &Path,
        branch: &str,
        dest: &str,
        token: Option<&str>,
        hooks: &HookPlan,
        secrets: &SecretScan,
    ) -> Result<PushReport, GitError> {
        let wg = self.verify_worktree(worktree).await?;
        self.check_outgoing(branch, secrets).await?;
        if let HookPlan::Host { dir, .. } = hooks {
            let input = self.pre_push_input(worktree, branch, dest).await?;
            self.run_host_hook(worktree, dir, "pre-push", &input.args, &input.stdin)
                .await?;
        }
        let target = Target::Worktree {
            wg: &wg,
            hooks: Path::new(NO_HOOKS),
        };
        let mut envs = self.envs().to_vec();
        if let Some(token) = token {
            envs.extend(credential_envs(token));
        }
        let refspec = format!("refs/heads/{branch}:refs/heads/{dest}");
        let push_args = [
            "push",
            "--porcelain",
            "--set-upstream",
            self.remote(),
            refspec.as_str(),
        ];
        let first = run_git(target, &push_args, &envs).await;
        match first {
            Ok(_) => {
                return Ok(PushReport {
                    branch: branch.to_string(),
                    dest: dest.to_string(),
                    remote: self.remote().to_string(),
                    rebased: false,
                })
            }
            Err(GitError::Command(failure))
                if is_non_fast_forward(&failure.stdout, &failure.stderr) =>
            {
                tracing::debug!(stderr = %failure.stderr, "first push rejected");
            }
            Err(other) => return Err(other),
        }
        tracing::info!(
            branch,
            "push rejected as non-fast-forward; rebasing onto the remote and retrying once"
        );
        let pull = run_git(
            target,
            &["pull", "--rebase", "--no-autostash", self.remote(), dest],
            &envs,
        )
        .await;
        if let Err(err) = pull {
            // Leave the worktree as it was; the caller reports the conflict.
            let _ = run_git(target, &["rebase", "--abort"], self.envs()).await;
            return Err(match err {
                GitError::Command(failure) => GitError::RebaseConflict {
                    branch: branch.to_string(),
                    failure,
                },
                other => other,
            });
        }
        // The rebased commits are new ones: scanned again before they leave.
        self.check_outgoing(branch, secrets).await?;
        run_git(target, &push_args, &envs).await?;
        Ok(PushReport {
            branch: branch.to_string(),
            dest: dest.to_string(),
            remote: self.remote().to_string(),
            rebased: true,
        })
    }
}

fn is_non_fast_forward(stdout: &str, stderr: &str) -> bool {
    [stdout, stderr].iter().any(|text| {
        text.contains("non-fast-forward")
            || text.contains("(fetch first)")
            || text.contains("[rejected]")
    })
}

/// Env for one git child: reset inherited credential helpers, then answer from the token var.
pub(crate) fn credential_envs(token: &str) -> Vec<(OsString, OsString)> {
    [
        ("GIT_CONFIG_COUNT", "2"),
        ("GIT_CONFIG_KEY_0", "credential.helper"),
        ("GIT_CONFIG_VALUE_0", ""),
        ("GIT_CONFIG_KEY_1", "credential.helper"),
        ("GIT_CONFIG_VALUE_1", TOKEN_HELPER),
        (GIT_TOKEN_ENV, token),
    ]
    .into_iter()
    .map(|(k, v)| (OsString::from(k), OsString::from(v)))
    .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recognises_rejections() {
        assert!(is_non_fast_forward(
            "",
            " ! [rejected]        x -> x (fetch first)"
        ));
        assert!(is_non_fast_forward(
            "!\trefs/heads/x:refs/heads/x\t[rejected] (non-fast-forward)",
            ""
        ));
        assert!(!is_non_fast_forward(
            "",
            "fatal: could not read from remote repository"
        ));
    }

    #[test]
    fn token_stays_out_of_the_helper_text() {
        let envs = credential_envs("ghp_secret");
        let helper = &envs[4].1;
        assert!(!helper.to_string_lossy().contains("ghp_secret"));
        assert_eq!(
            envs[5],
            (OsString::from(GIT_TOKEN_ENV), OsString::from("ghp_secret"))
        );
    }
}
