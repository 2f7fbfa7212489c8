//! Which environment a repository declares on its default branch, and the files that define it
//! (what the image's content hash covers).

use std::collections::BTreeMap;
use std::fmt::Write as _;

use sha2::{Digest, Sha256};

use super::devcontainer::{parse_devcontainer, DevcontainerConfig, DEVCONTAINER_PATHS};
use super::error::EnvironmentError;
use super::record::EnvSource;
use crate::git::{DefaultBranchSnapshot, SnapshotEntry, Workspace};
use crate::sandbox::SandboxSettings;

/// The rover-specific setup script, run over `autopilot.sandbox.image` when there is no dev
/// container definition.
pub const SETUP_SCRIPT: &str = ".rover/setup.sh";

/// File names that pin dependencies, wherever they are in the tree: a change to one rebuilds.
pub const LOCKFILES: &[&str] = &[
    "requirements.txt",
    "constraints.txt",
    "Pipfile.lock",
    "poetry.lock",
    "pdm.lock",
    "uv.lock",
    "Cargo.lock",
    "rust-toolchain",
    "rust-toolchain.toml",
    "package-lock.json",
    "npm-shrinkwrap.json",
    "yarn.lock",
    "pnpm-lock.yaml",
    "go.sum",
    "Gemfile.lock",
    "composer.lock",
    "mix.lock",
    "flake.lock",
];

/// Largest definition file rover reads (a `devcontainer.json`, a Dockerfile).
const MAX_DEFINITION_BYTES: usize = 1024 * 1024;

/// A repository's declared environment as of one default-branch commit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Definition {
    pub source: EnvSource,
    /// The default branch's commit it was read from.
    pub commit: String,
    /// The `devcontainer.json` path, for [`EnvSource::Devcontainer`].
    pub config_path: Option<String>,
    pub devcontainer: Option<DevcontainerConfig>,
    /// `autopilot.sandbox.setup`, for [`EnvSource::SetupCommands`].
    pub setup_commands: Vec<String>,
    /// The files the hash covers, by path.
    pub inputs: BTreeMap<String, SnapshotEntry>,
}

impl Definition {
    /// The content hash of the definition and of `more` (the base images' ids, the rover layer,
    /// the CLI's version): 16 hex digits.
    pub fn hash(&self, more: &[String]) -> String {
        let mut text = format!("rover-env 1\nsource {:?}\n", self.source);
        for command in &self.setup_commands {
            let _ = writeln!(text, "setup {command:?}");
        }
        for (path, entry) in &self.inputs {
            let _ = writeln!(text, "file {path:?} {:o} {}", entry.mode, entry.blob);
        }
        for line in more {
            let _ = writeln!(text, "more {line:?}");
        }
        let digest = Sha256::digest(text.as_bytes());
        digest.iter().take(8).fold(String::new(), |mut hex, b| {
            let _ = write!(hex, "{b:02x}");
            hex
        })
    }
}

/// The environment the default branch of `ws` declares, or `None` when it declares none (or
/// `environment.fromRepository` is off): `autopilot.sandbox.image` is then used as it is.
pub async fn define(
    ws: &Workspace,
    settings: &SandboxSettings,
) -> Result<Option<Definition>, EnvironmentError> {
    if !settings.environment.from_repository {
        return Ok(None);
    }
    let Some(snapshot) = ws.default_branch_snapshot().await? else {
        return Ok(None);
    };
    let is_file = |path: &str| {
        snapshot
            .entries
            .get(path)
            .is_some_and(|e| e.mode & 0o170_000 == 0o100_000)
    };
    let mut definition = Definition {
        source: EnvSource::Image,
        commit: snapshot.commit.clone(),
        config_path: None,
        devcontainer: None,
        setup_commands: Vec::new(),
        inputs: BTreeMap::new(),
    };
    if let Some(path) = DEVCONTAINER_PATHS.iter().find(|p| is_file(p)) {
        let text = read(ws, &snapshot, path).await?;
        let config = parse_devcontainer(&text).map_err(|reason| EnvironmentError::Definition {
            path: (*path).to_owned(),
            reason,
        })?;
        let dir = parent(path);
        // `.devcontainer/` and all it holds; a root `.devcontainer.json` alone.
        add_under(
            &mut definition.inputs,
            &snapshot,
            if dir.is_empty() { path } else { &dir },
        );
        if let Some(dockerfile) = &config.dockerfile {
            let dockerfile_path =
                join(&dir, dockerfile).ok_or_else(|| outside(path, dockerfile))?;
            let context = config.context.clone().unwrap_or_else(|| ".".to_owned());
            let context_path = join(&dir, &context).ok_or_else(|| outside(path, &context))?;
            add_under(&mut definition.inputs, &snapshot, &dockerfile_path);
            let text = read(ws, &snapshot, &dockerfile_path).await?;
            for source in copy_sources(&text) {
                match join(&context_path, &source) {
                    Some(p) if !source.contains(['*', '?', '[']) => {
                        add_under(&mut definition.inputs, &snapshot, &p);
                    }
                    // A glob, or a path out of the context: the whole context defines it.
                    _ => add_under(&mut definition.inputs, &snapshot, &context_path),
                }
            }
        }
        definition.source = EnvSource::Devcontainer;
        definition.config_path = Some((*path).to_owned());
        definition.devcontainer = Some(config);
    } else if is_file(SETUP_SCRIPT) {
        definition.source = EnvSource::SetupScript;
        add_under(&mut definition.inputs, &snapshot, SETUP_SCRIPT);
    } else if !settings.setup.is_empty() {
        definition.source = EnvSource::SetupCommands;
        definition.setup_commands.clone_from(&settings.setup);
    } else {
        return Ok(None);
    }
    for (path, entry) in &snapshot.entries {
        let name = path.rsplit('/').next().unwrap_or(path);
        if LOCKFILES.contains(&name)
            || (name.starts_with("requirements")
                && std::path::Path::new(name)
                    .extension()
                    .is_some_and(|e| e.eq_ignore_ascii_case("txt")))
        {
            definition.inputs.insert(path.clone(), entry.clone());
        }
    }
    for input in &settings.environment.inputs {
        let input = input.trim_matches('/');
        add_under(&mut definition.inputs, &snapshot, input);
    }
    Ok(Some(definition))
}

async fn read(
    ws: &Workspace,
    snapshot: &DefaultBranchSnapshot,
    path: &str,
) -> Result<String, EnvironmentError> {
    let missing = || EnvironmentError::Definition {
        path: path.to_owned(),
        reason: "it is not a file on the default branch".to_owned(),
    };
    let entry = snapshot
        .entries
        .get(path)
        .filter(|e| e.mode & 0o170_000 == 0o100_000)
        .ok_or_else(missing)?;
    let bytes = ws
        .read_blob(&entry.blob, MAX_DEFINITION_BYTES)
        .await?
        .ok_or_else(missing)?;
    Ok(String::from_utf8_lossy(&bytes).into_owned())
}

fn outside(config: &str, path: &str) -> EnvironmentError {
    EnvironmentError::Definition {
        path: config.to_owned(),
        reason: format!("`{path}` is outside the repository"),
    }
}

/// Adds the entry at `path`, or every entry under it (`""`: all of them).
fn add_under(
    inputs: &mut BTreeMap<String, SnapshotEntry>,
    snapshot: &DefaultBranchSnapshot,
    path: &str,
) {
    let prefix = if path.is_empty() {
        String::new()
    } else {
        format!("{path}/")
    };
    for (p, entry) in &snapshot.entries {
        if p == path || p.starts_with(&prefix) {
            inputs.insert(p.clone(), entry.clone());
        }
    }
}

/// The directory of `path` (`""` for the root).
fn parent(path: &str) -> String {
    path.rsplit_once('/')
        .map_or_else(String::new, |(dir, _)| dir.to_owned())
}

/// `rel` resolved against directory `dir` without leaving the repository; `None` if it would.
fn join(dir: &str, rel: &str) -> Option<String> {
    let mut parts: Vec<&str> = if rel.starts_with('/') {
        Vec::new()
    } else {
        dir.split('/').filter(|p| !p.is_empty()).collect()
    };
    for part in rel.split('/') {
        match part {
            "" | "." => {}
            ".." => {
                parts.pop()?;
            }
            p => parts.push(p),
        }
    }
    Some(parts.join("/"))
}

/// The sources of a Dockerfile's `COPY` and `ADD` instructions that come from the build
/// context (not `--from` another stage or image).
fn copy_sources(dockerfile: &str) -> Vec<String> {
    let joined = dockerfile.replace("\\\r\n", " ").replace("\\\n", " ");
    let mut sources = Vec::new();
    for line in joined.lines() {
        let mut words = line.split_whitespace();
        let Some(keyword) = words.next() else {
            continue;
        };
        if !keyword.eq_ignore_ascii_case("COPY") && !keyword.eq_ignore_ascii_case("ADD") {
            continue;
        }
        let args: Vec<&str> = words.collect();
        if args.iter().any(|a| a.starts_with("--from")) {
            continue;
        }
        let args: Vec<String> = if args.first().is_some_and(|a| a.starts_with('[')) {
            serde_json::from_str::<Vec<String>>(&args.join(" ")).unwrap_or_default()
        } else {
            args.iter()
                .filter(|a| !a.starts_with("--"))
                .map(|a| (*a).to_owned())
                .collect()
        };
        if let Some((_, srcs)) = args.split_last() {
            sources.extend(srcs.iter().filter(|s| !s.contains("://")).cloned());
        }
    }
    sources
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_resolve_inside_the_repository_only() {
        assert_eq!(
            join(".devcontainer", "Dockerfile").as_deref(),
            Some(".devcontainer/Dockerfile")
        );
        assert_eq!(join(".devcontainer", "..").as_deref(), Some(""));
        assert_eq!(
            join(".devcontainer", "../tools/x").as_deref(),
            Some("tools/x")
        );
        assert_eq!(join("", ".."), None);
        assert_eq!(parent(".devcontainer/devcontainer.json"), ".devcontainer");
        assert_eq!(parent(".devcontainer.json"), "");
    }

    #[test]
    fn copy_sources_skip_other_stages_and_flags() {
        let text = "FROM x\nCOPY --chown=1:1 requirements.txt \\\n  tools/ /app/\nCOPY --from=build /a /b\nADD [\"a b\", \"/c\"]\nRUN echo COPY x y\n";
        assert_eq!(copy_sources(text), ["requirements.txt", "tools/", "a b"]);
    }

    #[test]
    fn the_hash_changes_with_any_input() {
        let mut d = Definition {
            source: EnvSource::Devcontainer,
            commit: "c".into(),
            config_path: None,
            devcontainer: None,
            setup_commands: Vec::new(),
            inputs: BTreeMap::from([(
                "a".to_owned(),
                SnapshotEntry {
                    mode: 0o100_644,
                    blob: "1".into(),
                },
            )]),
        };
        let first = d.hash(&["base 1".into()]);
        assert_eq!(first.len(), 16);
        assert_ne!(first, d.hash(&["base 2".into()]));
        // The commit alone does not change it: only what defines the image does.
        d.commit = "other".into();
        assert_eq!(first, d.hash(&["base 1".into()]));
        d.inputs.get_mut("a").expect("there").blob = "2".into();
        assert_ne!(first, d.hash(&["base 1".into()]));
    }
}
