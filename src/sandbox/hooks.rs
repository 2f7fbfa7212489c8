//! Git hooks in a sandbox container over the worktree, for hooks the host must not run
//! (see [`crate::git::HookPlan`]): files in the worktree, or managers configured from it.
//!
//! One container per phase: `commit` runs `pre-commit`, `prepare-commit-msg` and `commit-msg`
//! (with the message in a file the hooks may edit), `pre-push` runs `pre-push` with git's
//! arguments and input. The container sees the worktree, its scratch git (so `git diff --cached`
//! and `git add` work inside) and the hooks; the host's git then commits or pushes with no hook.
//! `post-commit` and the merge and checkout hooks are not run for such worktrees.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::error::SandboxError;
use super::spec::{BindMount, SandboxSpec, WORKSPACE_MOUNT};
use super::{logcap, stderr_path, wait_or_kill, ContainerStatus, Sandbox};
use crate::git::{CommandFailure, HookLocation, PrePushInput, OUTPUT_LIMIT_BYTES};

/// Where the phase's input (message file, pre-push input) appears in the container.
pub const HOOK_IO_MOUNT: &str = "/rover-hook";
/// Where a hooks dir outside the worktree appears in the container (read-only).
pub const HOOKS_MOUNT: &str = "/rover-hooks";
/// Label on hook containers, with the phase.
pub const LABEL_HOOK: &str = "rover.hook";
/// Longest a phase may run.
pub const HOOK_TIMEOUT: Duration = Duration::from_secs(600);
/// Longest commit message read back from the hooks.
const MAX_MESSAGE_BYTES: u64 = 64 * 1024;

/// The driver: runs each existing executable hook of the phase in order and stops at the first
/// that fails, with its exit code.
const DRIVER: &str = r#"dir="$1"; phase="$2"; shift 2
run() {
  name="$1"; shift
  hook="$dir/$name"
  if [ -f "$hook" ] && [ -x "$hook" ]; then
    "$hook" "$@" < "$input"
    rc=$?
    if [ "$rc" -ne 0 ]; then
      echo "rover: the $name hook exited with $rc" >&2
      exit "$rc"
    fi
  fi
}
input=/dev/null
case "$phase" in
  commit)
    run pre-commit
    run prepare-commit-msg /rover-hook/COMMIT_EDITMSG message
    run commit-msg /rover-hook/COMMIT_EDITMSG
    ;;
  pre-push)
    input=/rover-hook/stdin
    run pre-push "$@"
    ;;
esac
"#;

/// How a phase ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HookVerdict {
    /// Every hook passed (or there were none); the commit message after the hooks, if the
    /// phase had one.
    Passed { message: Option<String> },
    /// A hook failed: the failure in the shape of a git command failure (the hook as command).
    Failed(Box<CommandFailure>),
}

/// What a phase needs: the engine, a spec over the worktree with its scratch git mounted, the
/// hooks' location and a host dir of rover's for the phase's files and logs.
pub struct HookContainer<'a> {
    pub sandbox: &'a dyn Sandbox,
    pub base: SandboxSpec,
    pub location: HookLocation,
    pub work_dir: PathBuf,
}

impl HookContainer<'_> {
    fn hooks_dir(&self) -> String {
        match &self.location {
            HookLocation::Worktree { relative } => {
                format!("{WORKSPACE_MOUNT}/{}", relative.display())
            }
            HookLocation::Outside { .. } => HOOKS_MOUNT.to_owned(),
        }
    }

    fn spec(&self, phase: &str, args: &[String]) -> SandboxSpec {
        let mut spec = self.base.clone();
        // The phase's files (the message the hooks may edit) come back through a mount: on
        // the local engine hooks keep the worktree mounted (see docs/sandbox.md).
        if self.sandbox.backend() == super::SandboxBackend::Local.name() {
            spec.workspace = super::WorkspaceMode::Mounted;
        }
        spec.name = Some(format!("{}-hooks-{phase}", self.base.container_name()));
        spec.env.clear();
        spec.cmd = vec![
            "/bin/sh".to_owned(),
            "-c".to_owned(),
            DRIVER.to_owned(),
            "rover-hooks".to_owned(),
            self.hooks_dir(),
            phase.to_owned(),
        ];
        spec.cmd.extend(args.iter().cloned());
        spec.extra_labels
            .insert(LABEL_HOOK.to_owned(), phase.to_owned());
        spec.extra_mounts.push(BindMount {
            host: self.work_dir.join("io"),
            target: HOOK_IO_MOUNT.to_owned(),
            read_only: false,
        });
        if let HookLocation::Outside { .. } = &self.location {
            spec.extra_mounts.push(BindMount {
                host: self.work_dir.join("hooks"),
                target: HOOKS_MOUNT.to_owned(),
                read_only: true,
            });
        }
        spec
    }

    /// A copy of a hooks dir outside the worktree for the container, readable and (what was
    /// executable for its owner) executable by the sandbox user whoever owns the original:
    /// a hook kept `0700` by root would otherwise be skipped in the sandbox as not executable.
    /// Links are copied as links; the copy is bounded ([`MAX_HOOKS_COPY`]).
    async fn copy_hooks(&self) -> Result<(), SandboxError> {
        let HookLocation::Outside { dir } = &self.location else {
            return Ok(());
        };
        let from = dir.clone();
        let to = self.work_dir.join("hooks");
        tokio::task::spawn_blocking(move || copy_tree(&from, &to))
            .await
            .map_err(|e| SandboxError::File {
                path: self.work_dir.join("hooks"),
                source: std::io::Error::other(e),
            })?
    }

    async fn prepare_io(&self, files: &[(&str, &str)]) -> Result<PathBuf, SandboxError> {
        let io = self.work_dir.join("io");
        let file_err = |path: &Path| {
            let path = path.to_path_buf();
            move |source| SandboxError::File { path, source }
        };
        if tokio::fs::symlink_metadata(&io).await.is_ok() {
            tokio::fs::remove_dir_all(&io)
                .await
                .map_err(file_err(&io))?;
        }
        tokio::fs::create_dir_all(&io)
            .await
            .map_err(file_err(&io))?;
        for (name, text) in files {
            let path = io.join(name);
            tokio::fs::write(&path, text)
                .await
                .map_err(file_err(&path))?;
        }
        self.copy_hooks().await?;
        Ok(io)
    }

    /// Runs the phase's container to its end; `None` on success, else the failure.
    async fn run(
        &self,
        phase: &str,
        args: &[String],
    ) -> Result<Option<Box<CommandFailure>>, SandboxError> {
        let spec = self.spec(phase, args);
        let name = spec.container_name();
        if self.sandbox.remove(&name).await? {
            tracing::info!(container = %name, "removed a hook container left by an earlier run");
        }
        let log = self.work_dir.join(format!("{phase}.log"));
        let id = self.sandbox.run(&spec).await?;
        let ended = async {
            let (logs, finished) = tokio::join!(
                self.sandbox.logs_to_file(&id, &log, spec.limits.log_bytes),
                wait_or_kill(self.sandbox, &id, HOOK_TIMEOUT),
            );
            Ok::<_, SandboxError>((logs?, finished?))
        }
        .await;
        let removed = self.sandbox.remove(&id).await;
        let (logs, finished) = ended?;
        removed?;
        let (stdout, cut_out) =
            logcap::read_bounded(std::slice::from_ref(&log), OUTPUT_LIMIT_BYTES).await;
        let (stderr, cut_err) =
            logcap::read_bounded(&[stderr_path(&log)], OUTPUT_LIMIT_BYTES).await;
        let over = logs.over_limit_summary(&format!("the {phase} hooks"), &log);
        let code = match finished.status {
            _ if finished.timed_out => None,
            ContainerStatus::Exited { code: 0, .. } if over.is_none() => return Ok(None),
            ContainerStatus::Exited { code, .. } => i32::try_from(code).ok(),
            _ => None,
        };
        let hook = stderr
            .lines()
            .rev()
            .find_map(|l| l.strip_prefix("rover: the ")?.split(' ').next())
            .unwrap_or(phase)
            .to_owned();
        let mut stderr = stderr;
        if finished.timed_out {
            let _ = write!(
                stderr,
                "\nrover: the {phase} hooks ran past {}s and were stopped",
                HOOK_TIMEOUT.as_secs()
            );
        }
        if let Some(summary) = &over {
            let _ = write!(stderr, "\nrover: {summary}; they were stopped");
        }
        Ok(Some(Box::new(CommandFailure {
            command: vec![
                format!("{}/{hook}", self.hooks_dir()),
                format!("(in the sandbox image {})", self.base.image),
            ],
            exit_code: code,
            stdout,
            stderr,
            truncated: cut_out || cut_err || over.is_some(),
        })))
    }

    /// Runs `pre-commit`, `prepare-commit-msg` and `commit-msg` with `message`; on success the
    /// message as the hooks left it.
    pub async fn commit(&self, message: &str) -> Result<HookVerdict, SandboxError> {
        let io = self.prepare_io(&[("COMMIT_EDITMSG", message)]).await?;
        if let Some(failure) = self.run("commit", &[]).await? {
            return Ok(HookVerdict::Failed(failure));
        }
        let path = io.join("COMMIT_EDITMSG");
        let message = tokio::task::spawn_blocking(move || {
            read_untrusted(&path, MAX_MESSAGE_BYTES).ok().flatten()
        })
        .await
        .ok()
        .flatten();
        Ok(HookVerdict::Passed { message })
    }

    /// Runs `pre-push` with git's arguments and input.
    pub async fn pre_push(&self, input: &PrePushInput) -> Result<HookVerdict, SandboxError> {
        self.prepare_io(&[("stdin", &input.stdin)]).await?;
        Ok(match self.run("pre-push", &input.args).await? {
            Some(failure) => HookVerdict::Failed(failure),
            None => HookVerdict::Passed { message: None },
        })
    }
}

/// Most entries and bytes copied of a hooks dir.
const MAX_HOOKS_COPY: (usize, u64) = (2000, 32 * 1024 * 1024);

/// Copies the tree at `from` to `to` (replaced): files with their mode made readable by all
/// and, when executable by their owner, executable by all; links as links; bounded.
fn copy_tree(from: &Path, to: &Path) -> Result<(), SandboxError> {
    use std::os::unix::fs::PermissionsExt as _;
    let file_err = |path: &Path| {
        let path = path.to_path_buf();
        move |source| SandboxError::File { path, source }
    };
    if std::fs::symlink_metadata(to).is_ok() {
        std::fs::remove_dir_all(to).map_err(file_err(to))?;
    }
    std::fs::create_dir_all(to).map_err(file_err(to))?;
    let (mut entries, mut bytes) = (0usize, 0u64);
    let mut stack = vec![PathBuf::new()];
    while let Some(relative) = stack.pop() {
        let Ok(read) = std::fs::read_dir(from.join(&relative)) else {
            continue;
        };
        for entry in read.flatten() {
            entries += 1;
            let rel = relative.join(entry.file_name());
            let (source, target) = (from.join(&rel), to.join(&rel));
            let Ok(meta) = std::fs::symlink_metadata(&source) else {
                continue;
            };
            bytes += meta.len();
            if entries > MAX_HOOKS_COPY.0 || bytes > MAX_HOOKS_COPY.1 {
                return Err(SandboxError::File {
                    path: from.to_path_buf(),
                    source: std::io::Error::other(format!(
                        "the hooks dir holds more than {} entries or {} MiB: too much to copy into a sandbox",
                        MAX_HOOKS_COPY.0,
                        MAX_HOOKS_COPY.1 >> 20
                    )),
                });
            }
            if meta.is_symlink() {
                let link = std::fs::read_link(&source).map_err(file_err(&source))?;
                std::os::unix::fs::symlink(link, &target).map_err(file_err(&target))?;
            } else if meta.is_dir() {
                std::fs::create_dir(&target).map_err(file_err(&target))?;
                std::fs::set_permissions(&target, std::fs::Permissions::from_mode(0o755))
                    .map_err(file_err(&target))?;
                stack.push(rel);
            } else if meta.is_file() {
                std::fs::copy(&source, &target).map_err(file_err(&target))?;
                let mode = if meta.permissions().mode() & 0o100 != 0 {
                    0o755
                } else {
                    0o644
                };
                std::fs::set_permissions(&target, std::fs::Permissions::from_mode(mode))
                    .map_err(file_err(&target))?;
            }
        }
    }
    Ok(())
}

/// Reads a file a container could have written: only a plain file (a link is not followed, a
/// directory or device is refused), at most `limit` bytes, as lossy text. `None` when it is not
/// a plain file.
pub fn read_untrusted(path: &Path, limit: u64) -> std::io::Result<Option<String>> {
    use std::io::Read as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    let file = match std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(nix::libc::O_NOFOLLOW | nix::libc::O_NONBLOCK)
        .open(path)
    {
        Ok(file) => file,
        Err(e) if e.raw_os_error() == Some(nix::libc::ELOOP) => return Ok(None),
        Err(e) => return Err(e),
    };
    if !file.metadata()?.is_file() {
        return Ok(None);
    }
    let mut bytes = Vec::new();
    file.take(limit).read_to_end(&mut bytes)?;
    Ok(Some(String::from_utf8_lossy(&bytes).into_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_hooks_dir_is_copied_usable_by_any_user_with_links_kept() {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = tempfile::tempdir().expect("tempdir");
        let hooks = dir.path().join("hooks");
        std::fs::create_dir_all(hooks.join("_")).expect("mkdir");
        std::fs::write(
            hooks.join("pre-commit"),
            "#!/bin/sh\n. \"$(dirname \"$0\")/_/lib.sh\"\n",
        )
        .expect("write");
        std::fs::set_permissions(
            hooks.join("pre-commit"),
            std::fs::Permissions::from_mode(0o700),
        )
        .expect("chmod");
        std::fs::write(hooks.join("_/lib.sh"), "true\n").expect("write");
        std::fs::write(hooks.join("pre-push.sample"), "x").expect("write");
        std::fs::set_permissions(
            hooks.join("pre-push.sample"),
            std::fs::Permissions::from_mode(0o600),
        )
        .expect("chmod");
        std::os::unix::fs::symlink("pre-commit", hooks.join("commit-msg")).expect("link");
        let copy = dir.path().join("copy");
        copy_tree(&hooks, &copy).expect("copied");
        let mode = |p: &str| {
            std::fs::symlink_metadata(copy.join(p))
                .expect("stat")
                .permissions()
                .mode()
                & 0o777
        };
        assert_eq!(mode("pre-commit"), 0o755);
        assert_eq!(mode("pre-push.sample"), 0o644);
        assert_eq!(mode("_/lib.sh"), 0o644);
        assert_eq!(
            std::fs::read_link(copy.join("commit-msg")).expect("a link"),
            Path::new("pre-commit")
        );
    }

    #[test]
    fn untrusted_reads_follow_no_link_and_stop_at_the_limit() {
        let dir = tempfile::tempdir().expect("tempdir");
        let secret = dir.path().join("secret");
        std::fs::write(&secret, "s3cret").expect("write");
        let link = dir.path().join("msg");
        std::os::unix::fs::symlink(&secret, &link).expect("symlink");
        assert_eq!(read_untrusted(&link, 100).expect("read"), None);
        assert_eq!(read_untrusted(dir.path(), 100).expect("read"), None);
        let plain = dir.path().join("plain");
        std::fs::write(&plain, "hello world").expect("write");
        assert_eq!(
            read_untrusted(&plain, 5).expect("read").as_deref(),
            Some("hello")
        );
    }
}
