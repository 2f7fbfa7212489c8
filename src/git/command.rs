//! Running the `git` CLI: argv only, own process group, stdin closed, output kept in full up to a bound.

use std::ffi::OsString;
use std::fmt;
use std::path::Path;
use std::process::Stdio;

use serde::Serialize;

use super::boundary::{hardening, WorktreeGit, NO_HOOKS};
use super::error::GitError;

/// How much of stdout and of stderr a [`CommandFailure`] keeps (each); the middle is cut.
pub const OUTPUT_LIMIT_BYTES: usize = 64 * 1024;

/// A command that ran and exited unsuccessfully, kept whole for the span that records it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CommandFailure {
    /// The argv, program first.
    pub command: Vec<String>,
    /// The exit code; `None` when a signal ended the process.
    pub exit_code: Option<i32>,
    /// Standard output, bounded to [`OUTPUT_LIMIT_BYTES`] with the cut marked in the text.
    pub stdout: String,
    /// Standard error, bounded the same way.
    pub stderr: String,
    /// Whether stdout or stderr was cut.
    pub truncated: bool,
}

impl CommandFailure {
    /// A network-ish failure that a later attempt may not hit.
    pub(crate) fn looks_transient(&self) -> bool {
        let err = self.stderr.to_ascii_lowercase();
        [
            "could not resolve host",
            "connection timed out",
            "connection reset",
            "the remote end hung up unexpectedly",
            "temporary failure",
            "index.lock",
        ]
        .iter()
        .any(|needle| err.contains(needle))
    }
}

impl fmt::Display for CommandFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let code = self
            .exit_code
            .map_or_else(|| "a signal".to_string(), |c| format!("exit code {c}"));
        let first_line = self
            .stderr
            .lines()
            .find(|l| !l.trim().is_empty())
            .or_else(|| self.stdout.lines().find(|l| !l.trim().is_empty()))
            .unwrap_or("no output");
        write!(
            f,
            "`{}` failed with {code}: {first_line}",
            self.command.join(" ")
        )
    }
}

impl std::error::Error for CommandFailure {}

/// The output of a successful command.
#[derive(Debug, Clone)]
pub(crate) struct CommandOutput {
    pub stdout: String,
    #[allow(
        dead_code,
        reason = "kept for callers that want to show progress lines"
    )]
    pub stderr: String,
}

/// Keeps the head and tail of `bytes` within `limit`, marking the cut; lossy UTF-8.
/// Returns the text and whether it was cut.
pub fn bounded_text(bytes: &[u8], limit: usize) -> (String, bool) {
    if bytes.len() <= limit {
        return (String::from_utf8_lossy(bytes).into_owned(), false);
    }
    let half = limit / 2;
    let cut = bytes.len() - 2 * half;
    let text = format!(
        "{}\n[... {cut} bytes truncated by rover ...]\n{}",
        String::from_utf8_lossy(&bytes[..half]),
        String::from_utf8_lossy(&bytes[bytes.len() - half..]),
    );
    (text, true)
}

/// Which repository a `git` command works on.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Target<'a> {
    /// A task worktree, through the git dir rover registered for it; hooks are looked up in
    /// `hooks` only ([`super::boundary::NO_HOOKS`] for none).
    Worktree {
        wg: &'a WorktreeGit,
        hooks: &'a Path,
    },
    /// A directory git discovers the repository from (the user's own checkout); no hooks.
    #[cfg_attr(
        not(test),
        allow(dead_code, reason = "the checkout's own commands use it")
    )]
    Dir(&'a Path),
}

impl Target<'_> {
    fn dir(&self) -> &Path {
        match self {
            Self::Worktree { wg, .. } => &wg.work_tree,
            Self::Dir(dir) => dir,
        }
    }

    /// Everything before the subcommand: where the repository is, then the hardening.
    fn prefix(&self) -> Vec<String> {
        match self {
            Self::Worktree { wg, hooks } => {
                let mut args = vec![
                    format!("--git-dir={}", wg.git_dir.display()),
                    format!("--work-tree={}", wg.work_tree.display()),
                ];
                args.extend(hardening(hooks));
                args.extend(wg.drivers_off.iter().cloned());
                args
            }
            Self::Dir(dir) => {
                let mut args = vec!["-C".to_owned(), dir.display().to_string()];
                args.extend(hardening(Path::new(NO_HOOKS)));
                args
            }
        }
    }
}

/// Variables that would point git at another repository than the one named on its command line.
const REPOSITORY_ENV: &[&str] = &[
    "GIT_DIR",
    "GIT_WORK_TREE",
    "GIT_COMMON_DIR",
    "GIT_INDEX_FILE",
    "GIT_OBJECT_DIRECTORY",
    "GIT_ALTERNATE_OBJECT_DIRECTORIES",
    "GIT_CONFIG_PARAMETERS",
    "GIT_CEILING_DIRECTORIES",
];

/// Runs `git <args>` on `target` with `envs` added to the inherited environment.
pub(crate) async fn run_git(
    target: Target<'_>,
    args: &[&str],
    envs: &[(OsString, OsString)],
) -> Result<CommandOutput, GitError> {
    run(target, args, envs, None).await
}

/// [`run_git`] with `input` on standard input (closed after it).
pub(crate) async fn run_git_input(
    target: Target<'_>,
    args: &[&str],
    envs: &[(OsString, OsString)],
    input: &[u8],
) -> Result<CommandOutput, GitError> {
    run(target, args, envs, Some(input)).await
}

async fn run(
    target: Target<'_>,
    args: &[&str],
    envs: &[(OsString, OsString)],
    input: Option<&[u8]>,
) -> Result<CommandOutput, GitError> {
    let dir = target.dir();
    let mut argv = target.prefix();
    argv.extend(args.iter().map(ToString::to_string));
    let mut cmd = tokio::process::Command::new("git");
    cmd.current_dir(dir).args(&argv);
    // Hooks run as git's children: they never see rover's GitHub token. A push gets its
    // credential through `envs` (the credential helper's variable), and only that push.
    for name in crate::agents::ALWAYS_DENIED_ENV
        .iter()
        .chain([&super::push::GIT_TOKEN_ENV])
        .chain(REPOSITORY_ENV)
    {
        cmd.env_remove(name);
    }
    cmd.envs(envs.iter().map(|(k, v)| (k, v)))
        // Never wait for a human: no editor, no pager, no terminal prompt for credentials.
        .env("GIT_TERMINAL_PROMPT", "0")
        .env("GIT_EDITOR", "true")
        .env("GIT_SEQUENCE_EDITOR", "true")
        .env("GIT_PAGER", "cat")
        .stdin(if input.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .process_group(0);
    let spawn_err = |source| GitError::Spawn {
        path: dir.to_path_buf(),
        source,
    };
    let mut child = cmd.spawn().map_err(spawn_err)?;
    if let (Some(input), Some(mut stdin)) = (input, child.stdin.take()) {
        use tokio::io::AsyncWriteExt as _;
        // Written before the output is read: inputs here are a few lines, within a pipe's buffer.
        stdin.write_all(input).await.map_err(spawn_err)?;
    }
    let output = child.wait_with_output().await.map_err(spawn_err)?;
    if output.status.success() {
        return Ok(CommandOutput {
            stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
        });
    }
    let (stdout, cut_out) = bounded_text(&output.stdout, OUTPUT_LIMIT_BYTES);
    let (stderr, cut_err) = bounded_text(&output.stderr, OUTPUT_LIMIT_BYTES);
    // A remote or hook may echo the credential it was given: the failure (kept in spans and
    // prompts) never holds it.
    let (stdout, stderr) = (scrub_token(stdout, envs), scrub_token(stderr, envs));
    let mut command = vec!["git".to_string()];
    command.extend(argv);
    Err(CommandFailure {
        command,
        exit_code: output.status.code(),
        stdout,
        stderr,
        truncated: cut_out || cut_err,
    }
    .into())
}

/// `text` with the value of the credential env var (if given and not trivially short) replaced.
fn scrub_token(text: String, envs: &[(OsString, OsString)]) -> String {
    envs.iter()
        .filter(|(k, v)| k == super::GIT_TOKEN_ENV && v.len() >= 6)
        .fold(text, |text, (_, v)| {
            text.replace(&*v.to_string_lossy(), crate::github::redact::SECRET)
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failure_never_holds_the_credential_it_was_given() {
        let envs = vec![(
            OsString::from(super::super::GIT_TOKEN_ENV),
            OsString::from("ghp_secretvalue123"),
        )];
        let out = scrub_token("remote: token ghp_secretvalue123 rejected".into(), &envs);
        assert_eq!(out, "remote: token [redacted secret] rejected");
        assert_eq!(scrub_token("no token".into(), &[]), "no token");
    }

    #[test]
    fn short_output_is_kept_whole() {
        assert_eq!(bounded_text(b"hello", 10), ("hello".to_string(), false));
    }

    #[test]
    fn long_output_keeps_head_and_tail_and_marks_the_cut() {
        let bytes: Vec<u8> = (0..100u8).map(|i| b'a' + i % 26).collect();
        let (text, cut) = bounded_text(&bytes, 20);
        assert!(cut);
        assert!(text.starts_with("abcdefghij\n"));
        assert!(text.contains("[... 80 bytes truncated by rover ...]"));
        assert!(text.ends_with(&String::from_utf8_lossy(&bytes[90..]).into_owned()));
    }

    #[tokio::test]
    async fn failing_command_keeps_argv_code_and_stderr() {
        let dir = tempfile::tempdir().expect("tempdir");
        let err = run_git(Target::Dir(dir.path()), &["rev-parse", "HEAD"], &[])
            .await
            .expect_err("not a repository");
        let failure = err.command_failure().expect("a command failure");
        assert_eq!(failure.exit_code, Some(128));
        assert!(
            failure.stderr.contains("not a git repository"),
            "{}",
            failure.stderr
        );
        assert_eq!(failure.command[0], "git");
        assert_eq!(
            failure.command[1..3],
            ["-C".to_owned(), dir.path().display().to_string()]
        );
        assert!(failure.command.contains(&"core.fsmonitor=false".to_owned()));
        assert_eq!(
            failure.command[failure.command.len() - 2..],
            ["rev-parse", "HEAD"]
        );
        assert!(!err.is_retryable());
    }
}
