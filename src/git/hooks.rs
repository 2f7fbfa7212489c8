//! Where a task's git hooks run: in a sandbox container by default, on the host only when the
//! user opts in.
//!
//! A hook is the user's code, but it runs with the worktree as its working directory, and a
//! worktree holds files the sandboxed agent wrote: a hook that calls `./scripts/lint`,
//! `node_modules/.bin/...`, `make lint`, `npm test` or a hook manager (pre-commit, husky,
//! lefthook, ...) executes agent-written code. No reading of a hook's text can tell which ones do,
//! so by default every hook runs in a sandbox container over the worktree, and the host's `git`
//! looks for hooks nowhere ([`super::NO_HOOKS`]). `autopilot.sandbox.hooks = "host"` lets the
//! hooks of the repository's own hooks dir run on the host as git runs them (documented, and
//! `start` warns); hooks whose files are in the worktree (`core.hooksPath` into it, as husky sets
//! it) run in a sandbox whatever the mode.

use std::path::{Component, Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::boundary::{locate, open, WorktreeGit};
use super::command::{run_git, Target};
use super::error::GitError;
use super::workspace::{blocking, Workspace};

/// Where the repository's hooks run (`rover.json`: `autopilot.sandbox.hooks`).
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema,
)]
#[serde(rename_all = "camelCase")]
pub enum HookMode {
    /// Every hook runs in a sandbox container (the default). `"auto"`, the former default that
    /// guessed from a hook's text, is read as this.
    #[default]
    #[serde(alias = "auto")]
    Sandbox,
    /// Hooks of the repository's own hooks dir (outside the worktree) run on the host, with the
    /// worktree as their working directory: whatever they execute from the worktree is code the
    /// agent could have written. Hooks whose files are in the worktree still run in a sandbox.
    Host,
}

/// The hooks git runs for a commit, a push and the merges rover makes.
pub const HOOK_NAMES: &[&str] = &[
    "pre-commit",
    "prepare-commit-msg",
    "commit-msg",
    "post-commit",
    "pre-merge-commit",
    "post-merge",
    "pre-push",
    "post-checkout",
    "post-rewrite",
    "reference-transaction",
];

/// Where the hooks of a worktree run, and which hooks there are (the names of [`HOOK_NAMES`]
/// present in the hooks dir). Recorded in the commit and push spans (`hooks`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", tag = "runs")]
pub enum HookPlan {
    /// On the host, by git, from this directory (outside the worktree): `hooks: "host"` only.
    Host {
        dir: PathBuf,
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        hooks: Vec<String>,
    },
    /// In a sandbox container over the worktree; the host's git runs none.
    Sandbox {
        location: HookLocation,
        reason: String,
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        hooks: Vec<String>,
    },
    /// The hooks dir has no hook git would run for rover's commands: nothing runs anywhere.
    None { dir: PathBuf },
}

/// Where hook files are, for a container.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", tag = "in")]
pub enum HookLocation {
    /// In the worktree, at this path relative to its root.
    Worktree { relative: PathBuf },
    /// In a directory outside the worktree (mounted read-only into the container).
    Outside { dir: PathBuf },
}

impl HookPlan {
    /// The hooks dir the host's git may use: the host dir, or none.
    pub fn host_dir(&self) -> &Path {
        match self {
            Self::Host { dir, .. } => dir,
            Self::Sandbox { .. } | Self::None { .. } => Path::new(super::NO_HOOKS),
        }
    }

    pub fn in_sandbox(&self) -> bool {
        matches!(self, Self::Sandbox { .. })
    }
}

impl Workspace {
    /// Where the hooks of `worktree` run under `mode` (see the module doc).
    pub async fn hook_plan(&self, worktree: &Path, mode: HookMode) -> Result<HookPlan, GitError> {
        let repo = self.repo_path().to_path_buf();
        let worktree = worktree.to_path_buf();
        blocking(move || {
            let wg = locate(&repo, &worktree)?;
            plan(&wg, mode)
        })
        .await?
    }
}

/// What git hands a `pre-push` hook for one branch: its arguments and standard input.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PrePushInput {
    /// `<remote name> <remote url>`.
    pub args: Vec<String>,
    /// `<local ref> <local sha> <remote ref> <remote sha>\n`.
    pub stdin: String,
}

impl Workspace {
    /// The arguments and input git would give `pre-push` for pushing `branch` from `worktree`
    /// to the remote's branch `dest`.
    pub async fn pre_push_input(
        &self,
        worktree: &Path,
        branch: &str,
        dest: &str,
    ) -> Result<PrePushInput, GitError> {
        let wg = self.worktree_git(worktree).await?;
        let target = Target::Worktree {
            wg: &wg,
            hooks: Path::new(super::NO_HOOKS),
        };
        let url = run_git(target, &["remote", "get-url", self.remote()], self.envs())
            .await
            .map(|out| out.stdout.trim().to_owned())
            .unwrap_or_default();
        let local = run_git(
            target,
            &["rev-parse", &format!("refs/heads/{branch}")],
            self.envs(),
        )
        .await?
        .stdout
        .trim()
        .to_owned();
        let remote_sha = run_git(
            target,
            &[
                "rev-parse",
                "--verify",
                "--quiet",
                &format!("refs/remotes/{}/{dest}", self.remote()),
            ],
            self.envs(),
        )
        .await
        .map_or_else(
            |_| "0".repeat(local.len().max(40)),
            |out| out.stdout.trim().to_owned(),
        );
        Ok(PrePushInput {
            args: vec![self.remote().to_owned(), url],
            stdin: format!("refs/heads/{branch} {local} refs/heads/{dest} {remote_sha}\n"),
        })
    }

    /// Runs hook `name` from the host hooks dir `dir` for `worktree`, as git would (cwd the
    /// worktree, `GIT_DIR` rover's), when it exists and is executable; `false` when it does not.
    /// A failure is [`GitError::Command`] with the hook's exit code and output.
    pub async fn run_host_hook(
        &self,
        worktree: &Path,
        dir: &Path,
        name: &str,
        args: &[String],
        stdin: &str,
    ) -> Result<bool, GitError> {
        let wg = self.worktree_git(worktree).await?;
        let hook = dir.join(name);
        let runnable = std::fs::metadata(&hook).is_ok_and(|m| {
            use std::os::unix::fs::PermissionsExt as _;
            m.is_file() && m.permissions().mode() & 0o111 != 0
        });
        if !runnable {
            return Ok(false);
        }
        let mut cmd = tokio::process::Command::new(&hook);
        cmd.args(args).current_dir(&wg.work_tree);
        for var in crate::agents::ALWAYS_DENIED_ENV
            .iter()
            .chain([&super::push::GIT_TOKEN_ENV])
        {
            cmd.env_remove(var);
        }
        cmd.envs(self.envs().iter().map(|(k, v)| (k, v)))
            .env("GIT_DIR", &wg.git_dir)
            .env("GIT_TERMINAL_PROMPT", "0")
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .kill_on_drop(true)
            .process_group(0);
        let mut child = cmd.spawn().map_err(|source| GitError::Spawn {
            path: hook.clone(),
            source,
        })?;
        if let Some(mut input) = child.stdin.take() {
            use tokio::io::AsyncWriteExt as _;
            // A hook that does not read its input closes the pipe early: not an error.
            let _ = input.write_all(stdin.as_bytes()).await;
        }
        let output = child
            .wait_with_output()
            .await
            .map_err(|source| GitError::Spawn {
                path: hook.clone(),
                source,
            })?;
        if output.status.success() {
            return Ok(true);
        }
        let (out, cut_out) = super::bounded_output(&output.stdout, super::OUTPUT_LIMIT_BYTES);
        let (err, cut_err) = super::bounded_output(&output.stderr, super::OUTPUT_LIMIT_BYTES);
        // The command as recorded names the remote, not its URL (which may hold credentials).
        let mut command = vec![hook.display().to_string()];
        command.extend(args.iter().take(1).cloned());
        Err(super::CommandFailure {
            command,
            exit_code: output.status.code(),
            stdout: out,
            stderr: err,
            truncated: cut_out || cut_err,
        }
        .into())
    }
}

/// `path` with `.` and `..` folded away, without touching the file system.
fn normalize(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for part in path.components() {
        match part {
            Component::ParentDir => {
                out.pop();
            }
            Component::CurDir => {}
            other => out.push(other),
        }
    }
    out
}

pub(crate) fn plan(wg: &WorktreeGit, mode: HookMode) -> Result<HookPlan, GitError> {
    let repo = open(wg)?;
    // The user's configuration (system, global, the repository's): a sandbox cannot write it.
    let configured = repo
        .config()
        .ok()
        .and_then(|c| c.get_path("core.hooksPath").ok());
    let dir = match configured {
        Some(path) if path.is_relative() => normalize(&wg.work_tree.join(path)),
        Some(path) => normalize(&path),
        None => wg.common_dir.join("hooks"),
    };
    let resolved = dir.canonicalize().unwrap_or_else(|_| dir.clone());
    if let Ok(relative) = resolved
        .strip_prefix(&wg.work_tree)
        .or_else(|_| dir.strip_prefix(&wg.work_tree))
    {
        let hooks = present(&wg.work_tree.join(relative));
        if hooks.is_empty() {
            return Ok(HookPlan::None { dir: resolved });
        }
        return Ok(HookPlan::Sandbox {
            location: HookLocation::Worktree {
                relative: relative.to_path_buf(),
            },
            reason: format!(
                "core.hooksPath points into the worktree ({}): its hooks are files the agent could change",
                relative.display()
            ),
            hooks,
        });
    }
    let hooks = present(&resolved);
    if hooks.is_empty() {
        return Ok(HookPlan::None { dir: resolved });
    }
    Ok(match mode {
        HookMode::Host => HookPlan::Host {
            dir: resolved,
            hooks,
        },
        HookMode::Sandbox => HookPlan::Sandbox {
            location: HookLocation::Outside { dir: resolved },
            reason:
                "hooks run in a sandbox (autopilot.sandbox.hooks is \"sandbox\", the default): \
                     their working directory is the agent's worktree"
                    .to_owned(),
            hooks,
        },
    })
}

/// The names of [`HOOK_NAMES`] that are files in `dir` (a link counts: git would follow it).
fn present(dir: &Path) -> Vec<String> {
    HOOK_NAMES
        .iter()
        .filter(|name| dir.join(name).is_file())
        .map(|name| (*name).to_owned())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn normalize_folds_dots() {
        assert_eq!(
            normalize(Path::new("/w/t/./.husky/../.husky/_")),
            PathBuf::from("/w/t/.husky/_")
        );
        assert_eq!(normalize(Path::new("/w/t/../x")), PathBuf::from("/w/x"));
    }

    #[test]
    fn the_host_dir_of_a_sandbox_plan_is_none() {
        let plan = HookPlan::Sandbox {
            location: HookLocation::Worktree {
                relative: ".husky/_".into(),
            },
            reason: String::new(),
            hooks: vec!["pre-commit".into()],
        };
        assert_eq!(plan.host_dir(), Path::new("/dev/null"));
        assert!(plan.in_sandbox());
        let none = HookPlan::None { dir: "/h".into() };
        assert_eq!(none.host_dir(), Path::new("/dev/null"));
        assert_eq!(
            serde_json::to_value(&none).expect("json"),
            serde_json::json!({"runs": "none", "dir": "/h"})
        );
    }

    #[test]
    fn the_former_auto_mode_reads_as_sandbox() {
        let mode: HookMode = serde_json::from_str("\"auto\"").expect("alias");
        assert_eq!(mode, HookMode::Sandbox);
        assert_eq!(HookMode::default(), HookMode::Sandbox);
        let host: HookMode = serde_json::from_str("\"host\"").expect("host");
        assert_eq!(host, HookMode::Host);
    }
}
