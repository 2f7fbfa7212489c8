//! Which project a command is about: the repository, its `owner/name`, and the project id that
//! names its store.
//!
//! The project id is `<owner>-<name>-<8 hex>` where the hex is the start of a UUIDv5 (URL
//! namespace) of the normalized remote (`host/owner/name`, lowercase), so two clones of one
//! repository share a store and two repositories never do. A repository without a GitHub-like
//! `origin` uses its directory name and canonical path instead.

use std::path::{Path, PathBuf};
use std::process::Command;

use uuid::Uuid;

use crate::host_env::HostEnv;

/// Environment variable naming the data root.
pub const DATA_DIR_ENV: &str = "ROVER_DATA_DIR";

#[derive(Debug, thiserror::Error)]
pub enum ProjectError {
    #[error("{dir} is not inside a git repository: run rover in your repository, or pass --project-id ID (and --repo OWNER/NAME)")]
    NotARepository { dir: PathBuf },
    #[error("cannot tell where rover keeps its data: set {DATA_DIR_ENV} or HOME")]
    NoDataDir,
    #[error("{value:?} is not OWNER/NAME")]
    BadRepo { value: String },
}

impl crate::error::Kinded for ProjectError {
    fn kind(&self) -> crate::error::ErrorKind {
        use crate::error::ErrorKind;
        match self {
            ProjectError::NotARepository { .. } | ProjectError::BadRepo { .. } => ErrorKind::Usage,
            ProjectError::NoDataDir => ErrorKind::Config,
        }
    }
}

/// `owner/name` of a GitHub repository.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RepoSlug {
    pub owner: String,
    pub name: String,
}

impl RepoSlug {
    pub fn parse(value: &str) -> Result<RepoSlug, ProjectError> {
        let bad = || ProjectError::BadRepo {
            value: value.to_owned(),
        };
        let (owner, name) = value.trim().split_once('/').ok_or_else(bad)?;
        let ok = |s: &str| {
            !s.is_empty()
                && s.chars()
                    .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
        };
        if !ok(owner) || !ok(name) {
            return Err(bad());
        }
        Ok(RepoSlug {
            owner: owner.to_owned(),
            name: name.trim_end_matches(".git").to_owned(),
        })
    }

    /// From a remote URL: `https://host/o/n(.git)`, `git@host:o/n(.git)`, `ssh://git@host/o/n`.
    pub fn from_remote(url: &str) -> Option<(String, RepoSlug)> {
        let url = url.trim();
        let rest = if let Some((_, rest)) = url.split_once("://") {
            rest.split_once('@').map_or(rest, |(_, r)| r).to_owned()
        } else if let Some((userhost, path)) = url.split_once(':') {
            let host = userhost.split_once('@').map_or(userhost, |(_, h)| h);
            format!("{host}/{path}")
        } else {
            return None;
        };
        let mut parts = rest.trim_end_matches('/').split('/');
        let host = parts.next()?.to_ascii_lowercase();
        let segments: Vec<&str> = parts.collect();
        if segments.len() < 2 || host.is_empty() {
            return None;
        }
        let owner = segments[segments.len() - 2];
        let name = segments[segments.len() - 1];
        RepoSlug::parse(&format!("{owner}/{name}"))
            .ok()
            .map(|s| (host, s))
    }
}

impl std::fmt::Display for RepoSlug {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.owner, self.name)
    }
}

/// The project id for a repository identified by `key` (normalized remote or path).
pub fn project_id(label: &str, key: &str) -> String {
    let hash = Uuid::new_v5(&Uuid::NAMESPACE_URL, key.as_bytes())
        .simple()
        .to_string();
    let label: String = label
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c.to_ascii_lowercase()
            } else {
                '-'
            }
        })
        .collect();
    format!("{label}-{}", &hash[..8])
}

/// The repository around `dir`, its origin's slug (if any) and its project id.
#[derive(Debug, Clone)]
pub struct Project {
    pub root: PathBuf,
    pub repo: Option<RepoSlug>,
    pub id: String,
}

impl Project {
    pub fn discover(dir: &Path) -> Result<Project, ProjectError> {
        let not_repo = || ProjectError::NotARepository {
            dir: dir.to_owned(),
        };
        let root = git_output(dir, &["rev-parse", "--show-toplevel"]).ok_or_else(not_repo)?;
        let root = PathBuf::from(root);
        let remote = git_output(&root, &["config", "--get", "remote.origin.url"]);
        let parsed = remote.as_deref().and_then(RepoSlug::from_remote);
        let id = if let Some((host, slug)) = &parsed {
            project_id(
                &format!("{}-{}", slug.owner, slug.name),
                &format!("{host}/{}", slug.to_string().to_ascii_lowercase()),
            )
        } else {
            {
                let canonical = root.canonicalize().unwrap_or_else(|_| root.clone());
                let label = canonical
                    .file_name()
                    .map_or("repo".into(), |n| n.to_string_lossy().into_owned());
                project_id(&label, &canonical.to_string_lossy())
            }
        };
        Ok(Project {
            root,
            repo: parsed.map(|(_, s)| s),
            id,
        })
    }
}

fn git_output(dir: &Path, args: &[&str]) -> Option<String> {
    let out = Command::new("git")
        .arg("-C")
        .arg(dir)
        .args(args)
        .output()
        .ok()?;
    if !out.status.success() {
        return None;
    }
    let s = String::from_utf8(out.stdout).ok()?.trim().to_owned();
    (!s.is_empty()).then_some(s)
}

/// `$ROVER_DATA_DIR`, else `~/.rover/data`, in `host`'s environment.
pub fn data_dir(host: &HostEnv) -> Result<PathBuf, ProjectError> {
    if let Some(dir) = host.var_os(DATA_DIR_ENV).filter(|d| !d.is_empty()) {
        return Ok(PathBuf::from(dir));
    }
    host.var_os("HOME")
        .filter(|h| !h.is_empty())
        .map(|h| PathBuf::from(h).join(".rover").join("data"))
        .ok_or(ProjectError::NoDataDir)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn remotes_of_every_shape_give_the_same_slug_and_id() {
        let shapes = [
            "https://github.com/Acme/widgets.git",
            "https://github.com/Acme/widgets",
            "git@github.com:Acme/widgets.git",
            "ssh://git@github.com/Acme/widgets",
        ];
        let ids: Vec<String> = shapes
            .iter()
            .map(|u| {
                let (host, slug) = RepoSlug::from_remote(u).unwrap();
                assert_eq!(slug.to_string(), "Acme/widgets");
                project_id(
                    &format!("{}-{}", slug.owner, slug.name),
                    &format!("{host}/{}", slug.to_string().to_ascii_lowercase()),
                )
            })
            .collect();
        assert!(ids.iter().all(|id| id == &ids[0]), "{ids:?}");
        assert!(ids[0].starts_with("acme-widgets-") && ids[0].len() == "acme-widgets-".len() + 8);
    }

    #[test]
    fn bad_repo_values_are_rejected() {
        assert!(RepoSlug::parse("acme").is_err());
        assert!(RepoSlug::parse("acme/wid gets").is_err());
        assert_eq!(RepoSlug::parse("acme/widgets").unwrap().name, "widgets");
    }
}
