//! `TestEnv`: a temp data dir and project id, and the real `rover` binary run as a user runs it.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use rover::store::AutopilotStore;
use tempfile::TempDir;

pub struct TestEnv {
    pub dir: TempDir,
    pub data_dir: PathBuf,
    pub project_id: String,
}

impl TestEnv {
    pub fn new() -> TestEnv {
        let dir = tempfile::tempdir().expect("temp dir");
        let data_dir = dir.path().join("data");
        TestEnv {
            dir,
            data_dir,
            // Unique per test: Docker labels carry the project id, and tests run in parallel
            // against one engine (a shared id let one test's orphan sweep remove another's
            // containers).
            project_id: format!(
                "acme-widgets-{}",
                &uuid::Uuid::new_v4().simple().to_string()[..8]
            ),
        }
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// The repository `rover autopilot start` runs in (created on first use), with the fake
    /// agent as `claude`.
    pub fn repo(&self) -> PathBuf {
        let repo = self.dir.path().join("repo");
        if !repo.exists() {
            std::fs::create_dir_all(&repo).expect("mkdir repo");
            for args in [
                &["init", "-q", "-b", "main"][..],
                &[
                    "-c",
                    "user.name=t",
                    "-c",
                    "user.email=t@e",
                    "commit",
                    "-q",
                    "--allow-empty",
                    "-m",
                    "init",
                ],
            ] {
                let ok = Command::new("git")
                    .args(args)
                    .current_dir(&repo)
                    .env("GIT_CONFIG_GLOBAL", "/dev/null")
                    .env("GIT_CONFIG_NOSYSTEM", "1")
                    .status()
                    .expect("git");
                assert!(ok.success());
            }
            let bin = self.dir.path().join("bin");
            std::fs::create_dir_all(&bin).expect("mkdir bin");
            std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_rover-fake-agent"), bin.join("claude"))
                .expect("symlink claude");
        }
        repo
    }

    pub fn store(&self) -> AutopilotStore {
        AutopilotStore::open(&self.data_dir, &self.project_id).expect("open store")
    }

    /// `rover <args> --project-id <id>` with a hermetic environment.
    pub fn command(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new(rover_bin());
        cmd.args(args)
            .arg("--project-id")
            .arg(&self.project_id)
            .env("ROVER_DATA_DIR", &self.data_dir)
            .env("NO_COLOR", "1")
            .env("GIT_CONFIG_GLOBAL", "/dev/null")
            .env("GIT_CONFIG_NOSYSTEM", "1")
            .env(
                "ROVER_CLAUDE_BIN",
                self.dir.path().join("bin").join("claude"),
            )
            .env_remove("GITHUB_TOKEN")
            .env_remove("GH_TOKEN")
            // OpenTelemetry export only where a test asks for it.
            .env_remove("OTEL_EXPORTER_OTLP_ENDPOINT")
            .env_remove("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
            .env_remove("OTEL_EXPORTER_OTLP_PROTOCOL")
            .env_remove("OTEL_EXPORTER_OTLP_HEADERS")
            .current_dir(if self.path().join("repo").exists() {
                self.path().join("repo")
            } else {
                self.path().to_owned()
            });
        cmd
    }

    pub fn rover(&self, args: &[&str]) -> Output {
        self.command(args).output().expect("run rover")
    }
}

pub fn rover_bin() -> &'static str {
    env!("CARGO_BIN_EXE_rover")
}

pub fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

pub fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}
