//! The log of an environment build: every step's command and output lines as they come,
//! milestones to the daemon's log and the console.

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::Command;

use super::build::{outcome_error, passed_env, shell_line, ERROR_LINES};
use super::error::EnvironmentError;
use crate::host_env::HostEnv;

/// The build's log file: every step's command and output lines as they come.
pub(super) struct Log {
    pub(super) path: PathBuf,
    file: tokio::fs::File,
    /// Images the steps tagged on the way (the dev container CLI's `vsc-...` image), removed
    /// once the environment image holds their layers.
    pub(super) tagged: Vec<String>,
    /// See [`super::build::BuildRequest::progress`].
    pub(super) progress: Option<tokio::sync::mpsc::UnboundedSender<String>>,
    /// rover's environment, of which the steps get [`super::build::PASSED_ENV`].
    host: HostEnv,
}

impl Log {
    pub(super) async fn create(path: &Path, host: &HostEnv) -> Result<Self, EnvironmentError> {
        if let Some(dir) = path.parent() {
            tokio::fs::create_dir_all(dir)
                .await
                .map_err(|source| EnvironmentError::Io {
                    path: dir.to_path_buf(),
                    source,
                })?;
        }
        let file = tokio::fs::File::create(path)
            .await
            .map_err(|source| EnvironmentError::Io {
                path: path.to_path_buf(),
                source,
            })?;
        Ok(Self {
            path: path.to_path_buf(),
            file,
            tagged: Vec::new(),
            host: host.clone(),
            progress: None,
        })
    }

    /// A line for the console, when someone watches.
    fn say(&self, line: &str) {
        if let Some(progress) = &self.progress {
            let _ = progress.send(line.chars().take(200).collect());
        }
    }

    pub(super) async fn note(&mut self, line: &str) {
        let _ = self.file.write_all(format!("{line}\n").as_bytes()).await;
        let _ = self.file.flush().await;
    }

    /// Runs one step, its output into the log as it comes; its stdout when it succeeds. It gets
    /// [`super::build::PASSED_ENV`] and the `extra` names of rover's environment.
    pub(super) async fn run(
        &mut self,
        step: &str,
        argv: &[String],
        deadline: Instant,
        limit: Duration,
        extra: &[String],
    ) -> Result<String, EnvironmentError> {
        let reproduce = shell_line(argv);
        self.note(&format!("rover: {step}\n$ {reproduce}")).await;
        tracing::info!(step, "environment build: {step}");
        self.say(step);
        let failed = |output: String, path: &Path| EnvironmentError::Build {
            step: step.to_owned(),
            output,
            log: path.to_path_buf(),
            reproduce: reproduce.clone(),
        };
        let mut child = Command::new(&argv[0])
            .args(&argv[1..])
            .env_clear()
            .envs(passed_env(&self.host, extra))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .process_group(0)
            .spawn()
            .map_err(|e| failed(format!("`{}` cannot run: {e}", argv[0]), &self.path))?;
        let mut out = BufReader::new(child.stdout.take().expect("piped")).lines();
        let mut err = BufReader::new(child.stderr.take().expect("piped")).lines();
        let (mut out_done, mut err_done) = (false, false);
        let mut stdout = String::new();
        let mut last: VecDeque<String> = VecDeque::new();
        let mut said = Instant::now();
        let timeout = tokio::time::sleep_until(deadline.into());
        tokio::pin!(timeout);
        while !(out_done && err_done) {
            let line = tokio::select! {
                l = out.next_line(), if !out_done => {
                    let Ok(Some(l)) = l else {
                        out_done = true;
                        continue;
                    };
                    if stdout.len() < 1 << 20 {
                        stdout.push_str(&l);
                        stdout.push('\n');
                    }
                    l
                }
                l = err.next_line(), if !err_done => {
                    let Ok(Some(l)) = l else {
                        err_done = true;
                        continue;
                    };
                    l
                }
                () = &mut timeout => {
                    let _ = child.start_kill();
                    self.note(&format!("rover: stopped after {} s", limit.as_secs())).await;
                    return Err(EnvironmentError::Timeout {
                        step: step.to_owned(),
                        secs: limit.as_secs(),
                        log: self.path.clone(),
                        reproduce,
                    });
                }
            };
            let _ = self.file.write_all(format!("{line}\n").as_bytes()).await;
            if let Some(tag) = line
                .split("Successfully tagged ")
                .nth(1)
                .map(str::trim)
                .filter(|t| t.starts_with("vsc-"))
            {
                self.tagged.push(tag.to_owned());
            }
            if milestone(&line) || said.elapsed() > Duration::from_secs(30) {
                said = Instant::now();
                tracing::info!(step, "environment build: {}", line.trim());
                self.say(&format!("{step}: {}", line.trim()));
            }
            last.push_back(line);
            if last.len() > ERROR_LINES {
                last.pop_front();
            }
        }
        let _ = self.file.flush().await;
        let status = child
            .wait()
            .await
            .map_err(|e| failed(format!("cannot wait for `{}`: {e}", argv[0]), &self.path))?;
        if status.success() {
            return Ok(stdout);
        }
        let lines: Vec<String> = last
            .into_iter()
            .filter(|l| !l.trim_start().starts_with("at ") && !l.trim().is_empty())
            .collect();
        let said = outcome_error(&stdout).map_or_else(String::new, |s| format!("{s}; "));
        Err(failed(
            format!(
                "{said}exit status {}; its last output:\n{}",
                status.code().unwrap_or(-1),
                lines.join("\n")
            ),
            &self.path,
        ))
    }
}

/// A line worth showing on the console while a build runs.
fn milestone(line: &str) -> bool {
    let line = line.trim();
    let text = line
        .strip_prefix('[')
        .and_then(|l| l.split_once("] "))
        .map_or(line, |(_, rest)| rest);
    text.starts_with("Step ")
        || text.starts_with("Running the ")
        || text.starts_with("Start: Run: docker build")
        || text.starts_with("Successfully built")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn milestones_are_steps_and_commands() {
        assert!(milestone("[2026-11-25T17:42:57.216Z] Step 1/8 : ARG X"));
        assert!(milestone(
            "[2026-11-25T17:43:31.882Z] Running the postCreateCommand from devcontainer.json..."
        ));
        assert!(!milestone(
            "Get:1 http://deb.debian.org/debian bookworm InRelease"
        ));
    }
}
