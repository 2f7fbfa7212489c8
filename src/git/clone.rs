//! A checkout rover makes itself, for a repository a daemon file serves that has none: a full
//! `git clone` into a hidden sibling of its place, renamed into place once complete, so a clone
//! that is interrupted never looks like a checkout.

use std::path::{Path, PathBuf};

use super::command::{run_git, Target};
use super::error::GitError;

/// Clones `url` to `dest`, which must not exist. `token`, when given, reaches git only through
/// the credential helper's variable (never the URL, argv or `.git/config`), as for a fetch.
///
/// The clone is made in `.<name>.rover-clone` beside `dest` (one an interrupted clone left is
/// removed first) and renamed to `dest` when complete; on a failure it is removed.
pub async fn clone_checkout(url: &str, dest: &Path, token: Option<&str>) -> Result<(), GitError> {
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| GitError::Io { path, source }
    };
    let partial = partial_path(dest);
    let parent = partial.parent().unwrap_or(Path::new("/")).to_path_buf();
    std::fs::create_dir_all(&parent).map_err(io(&parent))?;
    if partial.exists() {
        std::fs::remove_dir_all(&partial).map_err(io(&partial))?;
    }
    let envs = token.map(super::push::credential_envs).unwrap_or_default();
    let target = partial.to_string_lossy().into_owned();
    let args = [
        "clone",
        "--quiet",
        "--no-recurse-submodules",
        "--",
        url,
        target.as_str(),
    ];
    let cloned = match run_git(Target::Dir(&parent), &args, &envs).await {
        Ok(_) => std::fs::rename(&partial, dest).map_err(io(dest)),
        Err(e) => Err(e),
    };
    if cloned.is_err() && partial.exists() {
        if let Err(e) = std::fs::remove_dir_all(&partial) {
            tracing::warn!(path = %partial.display(), error = %e, "cannot remove an unfinished clone");
        }
    }
    cloned
}

/// Where the clone of `dest` is made before it is complete.
fn partial_path(dest: &Path) -> PathBuf {
    let name = dest
        .file_name()
        .map_or_else(|| "checkout".into(), |n| n.to_string_lossy());
    dest.with_file_name(format!(".{name}.rover-clone"))
}

/// `url` as it may be shown: without a user or password an operator wrote into it.
pub fn shown_url(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    let host_end = rest.find('/').unwrap_or(rest.len());
    match rest[..host_end].rfind('@') {
        Some(at) => format!("{scheme}://***@{}", &rest[at + 1..]),
        None => url.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn git(dir: &Path, args: &[&str]) {
        let ok = std::process::Command::new("git")
            .current_dir(dir)
            .args(args)
            .env("GIT_CONFIG_GLOBAL", "/dev/null")
            .env("GIT_CONFIG_NOSYSTEM", "1")
            .status()
            .expect("git");
        assert!(ok.success(), "git {args:?}");
    }

    #[tokio::test]
    async fn a_clone_lands_whole_at_its_place_and_a_failed_one_leaves_nothing() {
        let root = tempfile::tempdir().expect("a temp dir");
        let origin = root.path().join("origin");
        std::fs::create_dir_all(&origin).expect("mkdir");
        git(&origin, &["init", "-q", "-b", "main"]);
        std::fs::write(origin.join("README.md"), "# hi\n").expect("write");
        git(&origin, &["add", "-A"]);
        git(
            &origin,
            &[
                "-c",
                "user.name=T",
                "-c",
                "user.email=t@example.com",
                "commit",
                "-q",
                "-m",
                "one",
            ],
        );
        let dest = root.path().join("checkouts/octo/api");
        // A partial clone an interrupted run left is not a checkout, and is replaced.
        std::fs::create_dir_all(partial_path(&dest)).expect("mkdir");
        clone_checkout(
            origin.to_str().expect("utf-8"),
            &dest,
            Some("ghp_not_used_here"),
        )
        .await
        .expect("cloned");
        assert!(dest.join("README.md").is_file());
        assert!(!partial_path(&dest).exists());
        let config = std::fs::read_to_string(dest.join(".git/config")).expect("its config");
        assert!(!config.contains("ghp_not_used_here"), "{config}");

        let missing = root.path().join("checkouts/octo/gone");
        let err = clone_checkout("/nowhere/at/all.git", &missing, None)
            .await
            .expect_err("no such origin");
        assert!(matches!(err, GitError::Command(_)), "{err}");
        assert!(!missing.exists() && !partial_path(&missing).exists());
    }

    #[test]
    fn a_shown_url_holds_no_credentials() {
        assert_eq!(
            shown_url("https://x-access-token:ghs_abc@github.com/o/n.git"),
            "https://***@github.com/o/n.git"
        );
        assert_eq!(
            shown_url("https://github.com/o/n.git"),
            "https://github.com/o/n.git"
        );
        assert_eq!(shown_url("/srv/mirrors/n.git"), "/srv/mirrors/n.git");
        assert_eq!(
            shown_url("ssh://git@host/o/n@x.git"),
            "ssh://***@host/o/n@x.git"
        );
    }
}
