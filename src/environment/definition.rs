//! Which environment a repository declares on its default branch, and the files that define it
//! (what the image's content hash covers).

use std::collections::BTreeMap;
use std::fmt::Write as _;

use sha2::{Digest, Sha256};

use super::devcontainer::{
    parse_devcontainer, DefinitionPath, DevcontainerConfig, LocalEnv, DEVCONTAINER_PATHS,
};
use super::error::EnvironmentError;
use super::record::EnvSource;
use crate::git::{DefaultBranchSnapshot, SnapshotEntry, Workspace};
use crate::host_env::HostEnv;
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
/// `host` is rover's environment, of which a definition may read the `localEnv` names.
pub async fn define(
    ws: &Workspace,
    settings: &SandboxSettings,
    host: &HostEnv,
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
    // A link on the way to the definition would have the CLI read it from outside the checkout.
    for path in DEVCONTAINER_PATHS {
        if let Some(link) = link_on(&snapshot, path) {
            return Err(EnvironmentError::Definition {
                path: (*path).to_owned(),
                reason: format!("`{link}` is a link on the default branch; rover builds from inside the checkout and follows no link out of it: make it a plain directory or file"),
            });
        }
    }
    if let Some(path) = DEVCONTAINER_PATHS.iter().find(|p| is_file(p)) {
        let text = read(ws, &snapshot, path).await?;
        let local_env = LocalEnv::from_host(&settings.environment.local_env, host);
        let refused = |reason| EnvironmentError::Definition {
            path: (*path).to_owned(),
            reason,
        };
        let config = parse_devcontainer(&text, &local_env).map_err(refused)?;
        let dir = parent(path);
        // Every path it gives, used or not, stays inside the checkout, through no link.
        for given in &config.paths {
            locate(&dir, given, &snapshot).map_err(refused)?;
        }
        // `.devcontainer/` and all it holds; a root `.devcontainer.json` alone.
        add_under(
            &mut definition.inputs,
            &snapshot,
            if dir.is_empty() { path } else { &dir },
        );
        if let Some(dockerfile) = &config.dockerfile {
            let dockerfile_path = locate(&dir, dockerfile, &snapshot).map_err(refused)?;
            // Without a context the CLI builds in the Dockerfile's directory.
            let context_path = match &config.context {
                Some(context) => locate(&dir, context, &snapshot).map_err(refused)?,
                None => parent(&dockerfile_path),
            };
            add_under(&mut definition.inputs, &snapshot, &dockerfile_path);
            let text = read(ws, &snapshot, &dockerfile_path).await?;
            for source in copy_sources(&text) {
                // A source is relative to the context, even with a leading `/`.
                match join(&context_path, source.trim_start_matches('/')) {
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

/// The path in the repository `given` names (relative to the definition's directory `dir`,
/// or to the root): `Err(reason)` when it leaves the checkout or goes through a link of the
/// default branch's tree (the CLI and `docker build` would follow it out).
fn locate(
    dir: &str,
    given: &DefinitionPath,
    snapshot: &DefaultBranchSnapshot,
) -> Result<String, String> {
    let base = if given.from_root { "" } else { dir };
    let path = join(base, &given.path).ok_or_else(|| {
        format!(
            "`{}` (`{}`) is outside the repository",
            given.key, given.path
        )
    })?;
    if let Some(link) = link_on(snapshot, &path) {
        return Err(format!(
            "`{}` (`{path}`) goes through `{link}`, a link on the default branch; rover builds from inside the checkout and follows no link out of it",
            given.key
        ));
    }
    Ok(path)
}

/// The first of `path` and the directories above it (in the repository) that is a symbolic
/// link in the snapshot, if any.
fn link_on(snapshot: &DefaultBranchSnapshot, path: &str) -> Option<String> {
    let mut prefix = String::new();
    for part in path.split('/').filter(|p| !p.is_empty()) {
        if !prefix.is_empty() {
            prefix.push('/');
        }
        prefix.push_str(part);
        if snapshot
            .entries
            .get(&prefix)
            .is_some_and(|e| e.mode & 0o170_000 == 0o120_000)
        {
            return Some(prefix);
        }
    }
    None
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

    /// A repository whose `main` holds `files` and the links `links` (path, target).
    fn repository(files: &[(&str, &str)], links: &[(&str, &str)]) -> tempfile::TempDir {
        let dir = tempfile::tempdir().expect("a temp dir");
        let git = |args: &[&str]| {
            let out = std::process::Command::new("git")
                .args(["-c", "user.name=t", "-c", "user.email=t@t"])
                .args(args)
                .current_dir(dir.path())
                .env("GIT_CONFIG_GLOBAL", "/dev/null")
                .env("GIT_CONFIG_NOSYSTEM", "1")
                .output()
                .expect("git runs");
            assert!(out.status.success(), "git {args:?}: {out:?}");
        };
        git(&["init", "-q", "-b", "main"]);
        for (path, text) in files {
            let path = dir.path().join(path);
            std::fs::create_dir_all(path.parent().expect("a parent")).expect("dirs");
            std::fs::write(path, text).expect("write");
        }
        for (path, target) in links {
            let path = dir.path().join(path);
            std::fs::create_dir_all(path.parent().expect("a parent")).expect("dirs");
            std::os::unix::fs::symlink(target, path).expect("a link");
        }
        git(&["add", "-A"]);
        git(&["commit", "-q", "-m", "environment"]);
        dir
    }

    async fn define_in(
        files: &[(&str, &str)],
        links: &[(&str, &str)],
        local_env: &[&str],
    ) -> Result<Option<Definition>, EnvironmentError> {
        let repo = repository(files, links);
        let ws = Workspace::open(repo.path())
            .await
            .expect("a repository")
            .with_env("GIT_CONFIG_GLOBAL", "/dev/null");
        let mut settings = SandboxSettings::default();
        settings.environment.local_env = local_env.iter().map(|n| (*n).to_owned()).collect();
        define(
            &ws,
            &settings,
            &HostEnv::from_pairs([("HOME", "/home/rover")]),
        )
        .await
    }

    fn refused(result: Result<Option<Definition>, EnvironmentError>) -> (String, String) {
        match result {
            Err(EnvironmentError::Definition { path, reason }) => (path, reason),
            other => panic!("not refused: {other:?}"),
        }
    }

    const DOCKERFILE: &str = "FROM debian\nCOPY req.txt /r/\n";

    #[tokio::test]
    async fn a_context_through_a_linked_directory_is_refused() {
        let config = r#"{"build": {"dockerfile": "Dockerfile", "context": "../tools"}}"#;
        let (path, reason) = refused(
            define_in(
                &[
                    (".devcontainer/devcontainer.json", config),
                    (".devcontainer/Dockerfile", DOCKERFILE),
                ],
                &[("tools", "/root")],
                &[],
            )
            .await,
        );
        assert_eq!(path, ".devcontainer/devcontainer.json");
        assert!(
            reason.starts_with("`build.context` (`tools`) goes through `tools`, a link"),
            "{reason}"
        );
        // Below a linked directory, and a Dockerfile that is a link, likewise.
        let config = r#"{"build": {"dockerfile": "../docker/Dockerfile"}}"#;
        let (_, reason) = refused(
            define_in(
                &[(".devcontainer/devcontainer.json", config)],
                &[("docker", "/etc")],
                &[],
            )
            .await,
        );
        assert!(reason.contains("goes through `docker`"), "{reason}");
        let config = r#"{"build": {"dockerfile": "Dockerfile"}}"#;
        let (_, reason) = refused(
            define_in(
                &[(".devcontainer/devcontainer.json", config)],
                &[(".devcontainer/Dockerfile", "/etc/hostname")],
                &[],
            )
            .await,
        );
        assert!(
            reason.contains("goes through `.devcontainer/Dockerfile`"),
            "{reason}"
        );
    }

    #[tokio::test]
    async fn a_linked_devcontainer_directory_or_file_is_refused() {
        let (path, reason) =
            refused(define_in(&[("README", "x")], &[(".devcontainer", "/home")], &[]).await);
        assert_eq!(path, ".devcontainer/devcontainer.json");
        assert!(reason.starts_with("`.devcontainer` is a link"), "{reason}");
        let (path, reason) = refused(
            define_in(
                &[("README", "x")],
                &[(".devcontainer.json", "/etc/x.json")],
                &[],
            )
            .await,
        );
        assert_eq!(path, ".devcontainer.json");
        assert!(
            reason.starts_with("`.devcontainer.json` is a link"),
            "{reason}"
        );
    }

    #[tokio::test]
    async fn local_workspace_folder_is_the_root_and_the_context_must_stay_inside_it() {
        let files = |config: &'static str| {
            [
                (".devcontainer/devcontainer.json", config),
                ("tools/Dockerfile", DOCKERFILE),
                ("tools/req.txt", "x==1\n"),
            ]
        };
        let escape = r#"{"build": {"dockerfile": "${localWorkspaceFolder}/tools/Dockerfile", "context": "${localWorkspaceFolder}/.."}}"#;
        let (_, reason) = refused(define_in(&files(escape), &[], &[]).await);
        assert!(
            reason.starts_with("`build.context` (`/..`) is outside the repository"),
            "{reason}"
        );
        let tools = r#"{"build": {"dockerfile": "${localWorkspaceFolder}/tools/Dockerfile", "context": "${localWorkspaceFolder}/tools"}}"#;
        let definition = define_in(&files(tools), &[], &[])
            .await
            .expect("inside")
            .expect("a definition");
        assert!(definition.inputs.contains_key("tools/Dockerfile"));
        assert!(definition.inputs.contains_key("tools/req.txt"));
        // Without a context the CLI builds in the Dockerfile's directory.
        let no_context = r#"{"build": {"dockerfile": "../tools/Dockerfile"}}"#;
        let definition = define_in(&files(no_context), &[], &[])
            .await
            .expect("inside")
            .expect("a definition");
        assert!(definition.inputs.contains_key("tools/req.txt"));
    }

    #[tokio::test]
    async fn local_env_is_read_only_when_rover_json_allows_it() {
        let config = r#"{"image": "debian", "containerEnv": {"H": "${localEnv:HOME}"}}"#;
        let files = [(".devcontainer/devcontainer.json", config)];
        let (_, reason) = refused(define_in(&files, &[], &[]).await);
        assert!(
            reason.contains("add `HOME` to `autopilot.sandbox.environment.localEnv`"),
            "{reason}"
        );
        let definition = define_in(&files, &[], &["HOME"]).await.expect("allowed");
        assert!(definition.is_some());
        // The host's home as the build context stays refused: it is an absolute path.
        let config = r#"{"build": {"dockerfile": "Dockerfile", "context": "${localEnv:HOME}"}}"#;
        let files = [
            (".devcontainer/devcontainer.json", config),
            (".devcontainer/Dockerfile", DOCKERFILE),
        ];
        let (_, reason) = refused(define_in(&files, &[], &[]).await);
        assert!(
            reason.starts_with("`build.context` reads `${localEnv:HOME}`"),
            "{reason}"
        );
        let (_, reason) = refused(define_in(&files, &[], &["HOME"]).await);
        assert!(reason.contains("is an absolute path"), "{reason}");
    }

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
