//! Real git repositories in temp dirs for tests: a bare `origin`, a checkout, hermetic config.

use std::path::{Path, PathBuf};
use std::process::Command;

use rover::git::Workspace;

/// The environment every git child in tests gets: no global or system config.
pub const HERMETIC_ENV: [(&str, &str); 2] = [
    ("GIT_CONFIG_GLOBAL", "/dev/null"),
    ("GIT_CONFIG_NOSYSTEM", "1"),
];

/// A checkout with one commit on `main`, pushed to a bare `origin` next to it, plus a data dir
/// (outside the checkout) for worktrees.
pub struct TestRepo {
    pub dir: tempfile::TempDir,
    pub checkout: PathBuf,
    pub origin: PathBuf,
    pub data: PathBuf,
}

/// The file at `path` on `branch` of the repository at `dir` (`git show branch:path`).
pub fn show(dir: &Path, branch: &str, path: &str) -> String {
    git(dir, &["show", &format!("{branch}:{path}")])
}

/// Runs git with the hermetic env in `dir`; panics with stderr on failure; returns stdout.
pub fn git(dir: &Path, args: &[&str]) -> String {
    let out = Command::new("git")
        .arg("-C")
        .arg(dir)
        .args(args)
        .envs(HERMETIC_ENV)
        .output()
        .expect("git runs");
    assert!(
        out.status.success(),
        "git {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// Sets the identity a commit needs in a repository's local config.
pub fn set_identity(dir: &Path) {
    git(dir, &["config", "user.name", "Rover Test"]);
    git(dir, &["config", "user.email", "rover-test@example.com"]);
}

impl TestRepo {
    pub fn new() -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let origin = dir.path().join("origin.git");
        let checkout = dir.path().join("checkout");
        let data = dir.path().join("data");
        std::fs::create_dir_all(&checkout).expect("mkdir checkout");
        std::fs::create_dir_all(&data).expect("mkdir data");
        git(
            dir.path(),
            &["init", "--quiet", "--bare", "-b", "main", "origin.git"],
        );
        git(&checkout, &["init", "--quiet", "-b", "main"]);
        set_identity(&checkout);
        std::fs::write(checkout.join("README.md"), "hello\n").expect("write README");
        git(&checkout, &["add", "-A"]);
        git(&checkout, &["commit", "--quiet", "-m", "Initial commit"]);
        git(
            &checkout,
            &[
                "remote",
                "add",
                "origin",
                origin.to_str().expect("utf-8 path"),
            ],
        );
        git(&checkout, &["push", "--quiet", "-u", "origin", "main"]);
        git(&checkout, &["remote", "set-head", "origin", "main"]);
        Self {
            dir,
            checkout,
            origin,
            data,
        }
    }

    /// A workspace over the checkout whose git children use the hermetic env.
    pub async fn workspace(&self) -> Workspace {
        let mut ws = Workspace::open(&self.checkout)
            .await
            .expect("open workspace");
        for (k, v) in HERMETIC_ENV {
            ws = ws.with_env(k, v);
        }
        ws
    }

    /// A path for a worktree under the data dir.
    pub fn worktree_path(&self, name: &str) -> PathBuf {
        self.data.join("worktrees").join(name)
    }

    /// A second clone of `origin` (another user), with identity set.
    pub fn other_clone(&self, name: &str) -> PathBuf {
        let path = self.dir.path().join(name);
        git(
            self.dir.path(),
            &[
                "clone",
                "--quiet",
                self.origin.to_str().expect("utf-8 path"),
                name,
            ],
        );
        set_identity(&path);
        path
    }
}
