//! rover's own sandbox image: the Dockerfile rover carries in its binary (`docs/sandbox/Dockerfile`),
//! built on first use when `autopilot.sandbox.image` is left at its default and tagged by a hash
//! of everything that goes into it (`rover-sandbox:<hash>`), so a rover whose Dockerfile or
//! build settings changed builds anew and an unchanged one costs one `docker image inspect`.
//!
//! The build runs the `docker` CLI with a context rover makes (the Dockerfile, and the host's
//! CLIs when `autopilot.sandbox.build` asks for them), its output in a log file and its steps on
//! rover's console; one build per image at a time in this process.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use serde::Deserialize;
use sha2::{Digest, Sha256};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

use super::error::SandboxError;
use crate::host_env::HostEnv;

/// The Dockerfile of rover's sandbox image, as `docs/sandbox.md` describes it.
pub const DOCKERFILE: &str = include_str!("../../docs/sandbox/Dockerfile");

/// `autopilot.sandbox.image` when not set: rover's own image, built from [`DOCKERFILE`].
pub const DEFAULT_IMAGE: &str = "rover-sandbox:latest";

/// The repository rover's own images are tagged in (`rover-sandbox:<hash>`).
pub const OWN_REPO: &str = "rover-sandbox";

/// The label rover's own images carry: the hash they were built from.
pub const LABEL_OWN_IMAGE: &str = "rover.image.own";

/// How many of a failed build's last output lines its error quotes.
const ERROR_LINES: usize = 15;

/// How rover builds its own sandbox image (`autopilot.sandbox.build` in `rover.json`), used
/// when `autopilot.sandbox.image` is left at its default.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct ImageBuildSettings {
    /// The image the Dockerfile builds on: any Debian bookworm image (the engine pulls it when
    /// it is not there).
    pub base: String,
    /// Which Claude Code goes in: an npm version (`latest`, `2.1.197`), or `host` for the
    /// `claude` executable rover runs on this machine (`ROVER_CLAUDE_BIN`, else `claude` on
    /// `PATH`), copied in (a build that cannot reach the npm registry).
    pub claude_code: String,
    /// Which Codex CLI goes in: an npm version, `host` for the native codex of the `codex` rover
    /// runs (`ROVER_CODEX_BIN`, else `codex` on `PATH`), or `none`.
    pub codex: String,
}

impl Default for ImageBuildSettings {
    fn default() -> Self {
        Self {
            base: "node:22-bookworm-slim".to_owned(),
            claude_code: "latest".to_owned(),
            codex: "latest".to_owned(),
        }
    }
}

/// Where one CLI of the image comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Cli {
    /// An npm version (or `latest`).
    Npm(String),
    /// A file (claude's executable) or directory (codex's native platform directory) of the host.
    Host(PathBuf),
    /// Left out (codex only).
    None,
}

impl Cli {
    /// The Dockerfile's build argument for it.
    fn build_arg(&self) -> &str {
        match self {
            Self::Npm(version) => version,
            Self::Host(_) => "vendor",
            Self::None => "none",
        }
    }
}

/// rover's own image as the settings make it: its name, and how to build it.
#[derive(Debug)]
pub struct OwnImage {
    reference: String,
    hash: String,
    base: String,
    claude: Cli,
    codex: Cli,
    /// Where the build's log goes (`sandbox-image-<hash>.log`).
    log_dir: PathBuf,
    timeout: Duration,
    /// rover's environment: what `docker build` is given of it ([`super::build_env`]).
    host: HostEnv,
    lock: tokio::sync::Mutex<()>,
}

impl OwnImage {
    /// The image `settings` describe, with the build's log under `log_dir`; reads nothing but
    /// the host CLIs' metadata (`host`), found by rover's environment (`env`: their variables,
    /// `PATH`). An error names the setting to fix.
    pub fn resolve(
        settings: &ImageBuildSettings,
        log_dir: &Path,
        timeout: Duration,
        env: &HostEnv,
    ) -> Result<Self, SandboxError> {
        let refuse = |reason: String| SandboxError::ImageBuild {
            image: DEFAULT_IMAGE.to_owned(),
            reason,
        };
        if !is_image_reference(&settings.base) {
            return Err(refuse(format!(
                "autopilot.sandbox.build.base `{}` is not an image reference",
                settings.base
            )));
        }
        let claude = match settings.claude_code.as_str() {
            "host" => Cli::Host(host_claude(env)?),
            "none" => return Err(refuse(
                "autopilot.sandbox.build.claudeCode cannot be `none`: every sandbox runs claude"
                    .to_owned(),
            )),
            version => Cli::Npm(version_of("claudeCode", version).map_err(refuse)?),
        };
        let codex = match settings.codex.as_str() {
            "host" => Cli::Host(host_codex(env)?),
            "none" => Cli::None,
            version => Cli::Npm(version_of("codex", version).map_err(refuse)?),
        };
        let mut hasher = Sha256::new();
        hasher.update(DOCKERFILE.as_bytes());
        for part in [
            settings.base.as_str(),
            claude.build_arg(),
            codex.build_arg(),
        ] {
            hasher.update(b"\0");
            hasher.update(part.as_bytes());
        }
        for cli in [&claude, &codex] {
            if let Cli::Host(path) = cli {
                hasher.update(b"\0");
                hasher.update(host_identity(path)?.as_bytes());
            }
        }
        let hash = super::runnet::hex(&hasher.finalize())[..12].to_owned();
        Ok(Self {
            reference: format!("{OWN_REPO}:{hash}"),
            hash,
            base: settings.base.clone(),
            claude,
            codex,
            log_dir: log_dir.to_owned(),
            timeout,
            host: env.clone(),
            lock: tokio::sync::Mutex::new(()),
        })
    }

    /// The image's name, `rover-sandbox:<hash>`.
    pub fn reference(&self) -> &str {
        &self.reference
    }

    /// The build's log file.
    pub fn log_path(&self) -> PathBuf {
        self.log_dir
            .join(format!("sandbox-image-{}.log", self.hash))
    }

    /// Builds the image unless it is there (`exists` asks the engine); one build at a time, the
    /// second caller finds the first's image.
    pub async fn ensure<F, Fut>(&self, exists: F) -> Result<(), SandboxError>
    where
        F: Fn() -> Fut,
        Fut: std::future::Future<Output = Result<bool, SandboxError>>,
    {
        if exists().await? {
            return Ok(());
        }
        let _held = self.lock.lock().await;
        if exists().await? {
            return Ok(());
        }
        self.build().await
    }

    /// Runs `docker build` over a context of the Dockerfile and the host CLIs asked for.
    async fn build(&self) -> Result<(), SandboxError> {
        let fail = |reason: String| SandboxError::ImageBuild {
            image: self.reference.clone(),
            reason,
        };
        let file_err = |path: &Path| {
            let path = path.to_owned();
            move |source| SandboxError::File { path, source }
        };
        std::fs::create_dir_all(&self.log_dir).map_err(file_err(&self.log_dir))?;
        let context = tempfile::Builder::new()
            .prefix("rover-sandbox-context.")
            .tempdir_in(&self.log_dir)
            .map_err(file_err(&self.log_dir))?;
        self.make_context(context.path())?;
        let log_path = self.log_path();
        let mut log = tokio::fs::File::create(&log_path)
            .await
            .map_err(file_err(&log_path))?;
        let args = self.build_args(context.path());
        say(&format!(
            "rover: building the sandbox image {} from the Dockerfile rover carries (first use; a few minutes; log: {})",
            self.reference,
            log_path.display()
        ));
        let started = Instant::now();
        let _ = log
            .write_all(format!("$ docker {}\n", args.join(" ")).as_bytes())
            .await;
        let mut command = tokio::process::Command::new("docker");
        command
            .args(&args)
            .env_clear()
            .envs(super::build_env(&self.host))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        let mut child = command.spawn().map_err(|e| {
            fail(format!(
                "cannot run `docker build`: {e}; rover builds its sandbox image with the docker CLI: install it (Debian: apt-get install docker.io) or set autopilot.sandbox.image to an image you built"
            ))
        })?;
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<String>();
        for stream in [
            child
                .stdout
                .take()
                .map(|s| Box::new(s) as Box<dyn tokio::io::AsyncRead + Send + Unpin>),
            child
                .stderr
                .take()
                .map(|s| Box::new(s) as Box<dyn tokio::io::AsyncRead + Send + Unpin>),
        ]
        .into_iter()
        .flatten()
        {
            let tx = tx.clone();
            tokio::spawn(async move {
                let mut lines = BufReader::new(stream).lines();
                while let Ok(Some(line)) = lines.next_line().await {
                    if tx.send(line).is_err() {
                        break;
                    }
                }
            });
        }
        drop(tx);
        let mut tail: std::collections::VecDeque<String> = std::collections::VecDeque::new();
        let read = async {
            while let Some(line) = rx.recv().await {
                let _ = log.write_all(line.as_bytes()).await;
                let _ = log.write_all(b"\n").await;
                // Build output for a terminal: no escape sequence of it gets through.
                let clean: String = line.chars().filter(|c| !c.is_control()).collect();
                if is_step(&clean) {
                    say(&format!(
                        "rover: {}: {}",
                        self.reference,
                        clean.chars().take(160).collect::<String>()
                    ));
                }
                if tail.len() == ERROR_LINES {
                    tail.pop_front();
                }
                tail.push_back(clean);
            }
            child.wait().await
        };
        let Ok(status) = tokio::time::timeout(self.timeout, read).await else {
            let _ = log.flush().await;
            return Err(fail(format!(
                "stopped after {} s (autopilot.sandbox.environment.buildTimeoutSecs); its output is in {}",
                self.timeout.as_secs(),
                log_path.display()
            )));
        };
        let status = status.map_err(|e| fail(format!("cannot wait for `docker build`: {e}")))?;
        let _ = log.flush().await;
        if !status.success() {
            let tail: Vec<String> = tail.into_iter().collect();
            return Err(fail(format!(
                "`docker build` exited with {}; its output is in {} and ends with:\n{}\nTo build it yourself: docker build{} -t {} docs/sandbox (in rover's source), or set autopilot.sandbox.image to an image you built",
                status.code().map_or_else(|| "a signal".to_owned(), |c| c.to_string()),
                log_path.display(),
                tail.join("\n"),
                self.arg_flags(),
                self.reference,
            )));
        }
        tracing::info!(image = %self.reference, secs = started.elapsed().as_secs(), "built rover's sandbox image");
        say(&format!(
            "rover: built the sandbox image {} in {} s",
            self.reference,
            started.elapsed().as_secs()
        ));
        Ok(())
    }

    /// The build's argv after `docker`.
    fn build_args(&self, context: &Path) -> Vec<String> {
        let mut args = vec![
            "build".to_owned(),
            "--label".to_owned(),
            format!("{LABEL_OWN_IMAGE}={}", self.hash),
        ];
        for (name, value) in self.arg_values() {
            args.push("--build-arg".to_owned());
            args.push(format!("{name}={value}"));
        }
        args.extend([
            "-t".to_owned(),
            self.reference.clone(),
            context.display().to_string(),
        ]);
        args
    }

    fn arg_values(&self) -> [(&'static str, &str); 3] {
        [
            ("BASE", self.base.as_str()),
            ("CLAUDE_CODE_VERSION", self.claude.build_arg()),
            ("CODEX_VERSION", self.codex.build_arg()),
        ]
    }

    /// The build arguments as a person types them.
    fn arg_flags(&self) -> String {
        self.arg_values()
            .iter()
            .fold(String::new(), |mut flags, (name, value)| {
                let _ = write!(flags, " --build-arg {name}={value}");
                flags
            })
    }

    /// The Dockerfile, and the host CLIs under `vendor/` (hard-linked when the file system
    /// allows it, else copied).
    fn make_context(&self, dir: &Path) -> Result<(), SandboxError> {
        let file_err = |path: &Path| {
            let path = path.to_owned();
            move |source| SandboxError::File { path, source }
        };
        let dockerfile = dir.join("Dockerfile");
        std::fs::write(&dockerfile, DOCKERFILE).map_err(file_err(&dockerfile))?;
        let vendor = dir.join("vendor");
        if let Cli::Host(claude) = &self.claude {
            std::fs::create_dir_all(&vendor).map_err(file_err(&vendor))?;
            place(claude, &vendor.join("claude"))?;
        }
        if let Cli::Host(codex) = &self.codex {
            std::fs::create_dir_all(&vendor).map_err(file_err(&vendor))?;
            place_dir(codex, &vendor.join("codex"))?;
        }
        Ok(())
    }
}

/// Hard-links `from` to `to`, else copies it.
fn place(from: &Path, to: &Path) -> Result<(), SandboxError> {
    if std::fs::hard_link(from, to).is_ok() {
        return Ok(());
    }
    std::fs::copy(from, to)
        .map(|_| ())
        .map_err(|source| SandboxError::File {
            path: from.to_owned(),
            source,
        })
}

/// Copies the tree at `from` to `to`: directories and regular files (links are refused: the
/// build context holds nothing that points elsewhere on the host).
fn place_dir(from: &Path, to: &Path) -> Result<(), SandboxError> {
    let file_err = |path: &Path| {
        let path = path.to_owned();
        move |source| SandboxError::File { path, source }
    };
    std::fs::create_dir_all(to).map_err(file_err(to))?;
    for entry in std::fs::read_dir(from).map_err(file_err(from))? {
        let entry = entry.map_err(file_err(from))?;
        let kind = entry.file_type().map_err(file_err(&entry.path()))?;
        let target = to.join(entry.file_name());
        if kind.is_dir() {
            place_dir(&entry.path(), &target)?;
        } else if kind.is_file() {
            place(&entry.path(), &target)?;
        } else {
            return Err(SandboxError::ImageBuild {
                image: DEFAULT_IMAGE.to_owned(),
                reason: format!(
                    "{} is a link: the host codex directory rover copies into its image must hold files and directories only",
                    entry.path().display()
                ),
            });
        }
    }
    Ok(())
}

/// A line of `docker build`'s output that starts a step (the classic builder's `Step 3/9 :`,
/// BuildKit's `#7 [2/5] RUN`).
fn is_step(line: &str) -> bool {
    line.starts_with("Step ")
        || (line.starts_with('#')
            && line
                .split_once(' ')
                .is_some_and(|(_, rest)| rest.starts_with('[')))
}

fn say(line: &str) {
    println!("{line}");
    tracing::info!("{line}");
}

/// Whether `text` can be an image reference (`name[:tag][@digest]`, with a registry host and
/// path): letters, digits and `._-/:@`, not starting with `-`.
fn is_image_reference(text: &str) -> bool {
    !text.is_empty()
        && text.len() <= 255
        && !text.starts_with('-')
        && text
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "._-/:@".contains(c))
}

/// An npm version or tag for `key`, as the Dockerfile puts it after `@`.
fn version_of(key: &str, version: &str) -> Result<String, String> {
    let valid = !version.is_empty()
        && version.len() <= 64
        && version
            .chars()
            .next()
            .is_some_and(|c| c.is_ascii_alphanumeric())
        && version
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "._+-".contains(c));
    if valid && version != "vendor" {
        Ok(version.to_owned())
    } else {
        Err(format!(
            "autopilot.sandbox.build.{key} `{version}` is neither an npm version (`latest`, `2.1.197`), `host`{}",
            if key == "codex" { " nor `none`" } else { "" }
        ))
    }
}

/// The executable `name` resolves to in `host`'s environment: the variable `env` if set, else
/// the first on `PATH`.
fn host_program(host: &HostEnv, env: &str, name: &str) -> Option<PathBuf> {
    if let Some(path) = host.var_os(env).filter(|p| !p.is_empty()) {
        return Some(PathBuf::from(path));
    }
    std::env::split_paths(host.var_os("PATH")?)
        .map(|dir| dir.join(name))
        .find(|p| p.is_file())
}

/// The native `claude` executable rover runs (links followed): the npm package's binary.
fn host_claude(host: &HostEnv) -> Result<PathBuf, SandboxError> {
    let refuse = |reason: String| SandboxError::ImageBuild {
        image: DEFAULT_IMAGE.to_owned(),
        reason,
    };
    let program = host_program(host, crate::agents::ROVER_CLAUDE_BIN, "claude").ok_or_else(|| {
        refuse("autopilot.sandbox.build.claudeCode is `host`, but there is no `claude` on PATH (nor ROVER_CLAUDE_BIN)".to_owned())
    })?;
    let exe = std::fs::canonicalize(&program).map_err(|source| SandboxError::File {
        path: program.clone(),
        source,
    })?;
    let mut magic = [0u8; 4];
    let native = std::fs::File::open(&exe)
        .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut magic))
        .is_ok()
        && magic == *b"\x7fELF";
    if !native {
        return Err(refuse(format!(
            "autopilot.sandbox.build.claudeCode is `host`, but {} is not a native executable (an older Claude Code is a Node script): name an npm version instead",
            exe.display()
        )));
    }
    Ok(exe)
}

/// The native platform directory of the `codex` rover runs: the npm wrapper
/// (`@openai/codex/bin/codex.js`) sits beside `@openai/codex-linux-<arch>`, whose
/// `vendor/<target>/` holds `bin/codex` and its helpers.
fn host_codex(host: &HostEnv) -> Result<PathBuf, SandboxError> {
    let refuse = |reason: String| SandboxError::ImageBuild {
        image: DEFAULT_IMAGE.to_owned(),
        reason,
    };
    let program = host_program(host, crate::agents::ROVER_CODEX_BIN, "codex").ok_or_else(|| {
        refuse("autopilot.sandbox.build.codex is `host`, but there is no `codex` on PATH (nor ROVER_CODEX_BIN)".to_owned())
    })?;
    let wrapper = std::fs::canonicalize(&program).map_err(|source| SandboxError::File {
        path: program.clone(),
        source,
    })?;
    let (package, target) = match std::env::consts::ARCH {
        "aarch64" => ("codex-linux-arm64", "aarch64-unknown-linux-musl"),
        _ => ("codex-linux-x64", "x86_64-unknown-linux-musl"),
    };
    // `<scope>/codex/bin/codex.js`: the platform package is beside the wrapper's package, or
    // under its own node_modules.
    let codex_pkg = wrapper.parent().and_then(Path::parent);
    let candidates: Vec<PathBuf> = codex_pkg
        .into_iter()
        .flat_map(|pkg| {
            [
                pkg.parent().map(|scope| scope.join(package)),
                Some(pkg.join("node_modules/@openai").join(package)),
            ]
        })
        .flatten()
        .map(|p| p.join("vendor").join(target))
        .collect();
    candidates
        .iter()
        .find(|dir| dir.join("bin/codex").is_file())
        .cloned()
        .ok_or_else(|| {
            refuse(format!(
                "autopilot.sandbox.build.codex is `host`, but no native codex was found beside {} (looked in {}): name an npm version, or `none`",
                wrapper.display(),
                candidates
                    .iter()
                    .map(|c| c.display().to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            ))
        })
}

/// What names a host file or directory's version without reading it: its path, size and
/// modification time (a reinstalled CLI changes them, so the image is built anew).
fn host_identity(path: &Path) -> Result<String, SandboxError> {
    let meta = std::fs::metadata(path).map_err(|source| SandboxError::File {
        path: path.to_owned(),
        source,
    })?;
    let mtime = meta
        .modified()
        .ok()
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .map_or(0, |d| d.as_nanos());
    Ok(format!("{} {} {mtime}", path.display(), meta.len()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn resolve(settings: &ImageBuildSettings) -> Result<OwnImage, SandboxError> {
        OwnImage::resolve(
            settings,
            Path::new("/tmp"),
            Duration::from_secs(60),
            &HostEnv::default(),
        )
    }

    #[test]
    fn the_name_is_a_hash_of_the_dockerfile_and_the_build_settings() {
        let default = resolve(&ImageBuildSettings::default()).unwrap();
        assert!(default.reference().starts_with("rover-sandbox:"));
        assert_eq!(default.reference().len(), "rover-sandbox:".len() + 12);
        assert_eq!(
            default.reference(),
            resolve(&ImageBuildSettings::default()).unwrap().reference()
        );
        let pinned = resolve(&ImageBuildSettings {
            claude_code: "2.1.197".to_owned(),
            ..ImageBuildSettings::default()
        })
        .unwrap();
        assert_ne!(default.reference(), pinned.reference());
        let args = pinned.build_args(Path::new("/ctx"));
        assert!(
            args.contains(&"CLAUDE_CODE_VERSION=2.1.197".to_owned()),
            "{args:?}"
        );
        assert!(
            args.contains(&"BASE=node:22-bookworm-slim".to_owned()),
            "{args:?}"
        );
        assert!(
            args.contains(&format!("{LABEL_OWN_IMAGE}={}", pinned.hash)),
            "{args:?}"
        );
    }

    #[test]
    fn settings_that_would_reach_the_shell_or_another_flag_are_refused() {
        for (base, claude, codex) in [
            ("--network=host", "latest", "latest"),
            ("node:22; rm -rf /", "latest", "latest"),
            ("node:22", "1.0 && curl x", "latest"),
            ("node:22", "$(id)", "latest"),
            ("node:22", "vendor", "latest"),
            ("node:22", "none", "latest"),
            ("node:22", "latest", "-x"),
            ("node:22", "latest", ""),
        ] {
            let err = resolve(&ImageBuildSettings {
                base: base.to_owned(),
                claude_code: claude.to_owned(),
                codex: codex.to_owned(),
            })
            .unwrap_err()
            .to_string();
            assert!(err.contains("autopilot.sandbox.build."), "{err}");
        }
        let none = resolve(&ImageBuildSettings {
            codex: "none".to_owned(),
            ..ImageBuildSettings::default()
        })
        .unwrap();
        assert!(none
            .build_args(Path::new("/ctx"))
            .contains(&"CODEX_VERSION=none".to_owned()));
    }

    #[test]
    fn build_steps_of_either_builder_are_shown() {
        assert!(is_step("Step 3/9 : RUN apt-get update"));
        assert!(is_step("#7 [2/5] RUN apt-get update"));
        assert!(!is_step("#7 0.512 Get:1 http://deb.debian.org"));
        assert!(!is_step(" ---> Running in 1234"));
    }

    #[test]
    fn the_carried_dockerfile_is_the_one_the_docs_describe() {
        assert!(DOCKERFILE.contains("ARG BASE=node:22-bookworm-slim"));
        assert!(DOCKERFILE.contains("CLAUDE_CODE_VERSION"));
        assert!(DOCKERFILE.contains("LABEL rover.image=\"agents\""));
    }
}
