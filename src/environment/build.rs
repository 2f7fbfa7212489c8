//! Building a repository's environment image: the dev container CLI makes the image and runs
//! the setup (`onCreateCommand`, `updateContentCommand`, `postCreateCommand`) in a container
//! over a checkout of the default branch, with the network; rover commits that container and
//! builds its own layer on top (`rover-env:<hash>`). The output goes to a log file as it comes,
//! milestones to the daemon's log; a failed step leaves the command that runs it again.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use tokio::io::AsyncWriteExt;
use tokio::process::Command;

use super::build_log::Log;
use super::definition::Definition;
use super::error::EnvironmentError;
use super::layer::{rover_layer, setup_config};
use super::record::{EnvSource, EnvironmentMeta};
use super::{ENV_REPO, LABEL_ENV_BUILD, LABEL_ENV_CHECK, LABEL_ENV_HASH, LABEL_ENV_PROJECT};
use crate::git::Workspace;
use crate::host_env::HostEnv;
use crate::sandbox::EnvironmentSettings;

/// The log of a build, in its directory.
pub const BUILD_LOG: &str = "environment.log";

/// How many of a failed step's last output lines its error quotes.
pub(super) const ERROR_LINES: usize = 25;

/// The variables the build's programs get from rover's environment: the few of
/// [`crate::sandbox::BUILD_ENV`] (no model key, no token). The dev container CLI also gets
/// `autopilot.sandbox.environment.localEnv`, the only names a definition may read
/// (`${localEnv:...}` of any other is refused before the build), so what it substitutes is the
/// value rover checked.
pub(super) const PASSED_ENV: &[&str] = crate::sandbox::BUILD_ENV;

/// What to build and where.
pub struct BuildRequest<'a> {
    pub definition: &'a Definition,
    /// `autopilot.sandbox.image`: the agent CLIs come from it (the base of a setup script).
    pub agents_image: &'a str,
    pub settings: &'a EnvironmentSettings,
    pub project: &'a str,
    pub ws: &'a Workspace,
    /// A directory of rover's for the build's files (the checkout, rover's layer) and its log.
    pub dir: PathBuf,
    /// The store the build is for, labelled on the CLI's container (see
    /// [`crate::sandbox::leftovers`]).
    pub store: Option<&'a Path>,
    /// Where the build says how far it got (a line per step, then one every 30 s and at each
    /// milestone of its output), for the console.
    pub progress: Option<tokio::sync::mpsc::UnboundedSender<String>>,
    /// rover's environment, of which the build's programs get [`PASSED_ENV`].
    pub host: &'a HostEnv,
}

/// The image a definition resolves to, before anything is built.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BuildPlan {
    pub hash: String,
    pub image: String,
    /// Rover's layer with `{setup}` standing for the setup's image.
    layer: String,
    agents_id: String,
}

/// The environment image of `req`, built unless an image with its hash is there already. On
/// failure, the record (with the error and the command that reproduces it) comes with the error.
pub async fn build(
    req: &BuildRequest<'_>,
) -> Result<EnvironmentMeta, Box<(EnvironmentMeta, EnvironmentError)>> {
    let mut meta = EnvironmentMeta {
        source: req.definition.source,
        commit: Some(req.definition.commit.clone()),
        inputs: req.definition.inputs.keys().cloned().collect(),
        notes: req
            .definition
            .devcontainer
            .as_ref()
            .map(|d| d.notes.clone())
            .unwrap_or_default(),
        ..EnvironmentMeta::image(req.agents_image)
    };
    let fail = |meta: &EnvironmentMeta, e: EnvironmentError| {
        let mut meta = meta.clone();
        meta.error = Some(e.to_string());
        meta.reproduce = e.reproduce().map(str::to_owned);
        Box::new((meta, e))
    };
    let log_path = req.dir.join(BUILD_LOG);
    let plan = match plan(req, &log_path).await {
        Ok(plan) => plan,
        Err(e) => return Err(fail(&meta, e)),
    };
    meta.hash = Some(plan.hash.clone());
    meta.image.clone_from(&plan.image);
    if image_exists(&plan.image, req.host).await {
        return Ok(meta);
    }
    // One build per hash at a time in this process; the second waiter finds the image.
    let lock = build_lock(&plan.hash);
    let _held = lock.lock().await;
    if image_exists(&plan.image, req.host).await {
        return Ok(meta);
    }
    tracing::info!(image = %plan.image, source = ?req.definition.source, log = %log_path.display(), "building the repository's environment");
    let say = |line: String| {
        if let Some(progress) = &req.progress {
            let _ = progress.send(line);
        }
    };
    say(format!(
        "building {} (log: {})",
        plan.image,
        log_path.display()
    ));
    let started = Instant::now();
    meta.log = Some(log_path.clone());
    let result = run_build(req, &plan, &log_path).await;
    meta.duration_ms = Some(u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX));
    match result {
        Ok(()) => {
            meta.built = true;
            tracing::info!(image = %plan.image, secs = started.elapsed().as_secs(), "built the repository's environment");
            say(format!(
                "built {} in {} s",
                plan.image,
                started.elapsed().as_secs()
            ));
            Ok(meta)
        }
        Err(e) => {
            tracing::warn!(image = %plan.image, error = %e, "the repository's environment did not build");
            say(format!("{} did not build: {e}", plan.image));
            Err(fail(&meta, e))
        }
    }
}

/// The hash and image name of `req`: the definition, the agents image's id, the CLI's version
/// and rover's layer.
async fn plan(req: &BuildRequest<'_>, log: &Path) -> Result<BuildPlan, EnvironmentError> {
    let inspect = argv(&[
        "docker",
        "image",
        "inspect",
        "--format",
        "{{.Id}}",
        req.agents_image,
    ]);
    let agents_id =
        capture(&inspect, log, req.host)
            .await
            .map_err(|output| EnvironmentError::Build {
                step: "find autopilot.sandbox.image".to_owned(),
                output: format!(
                    "{output}; build it (docs/sandbox.md) or set `autopilot.sandbox.image`"
                ),
                log: log.to_path_buf(),
                reproduce: shell_line(&inspect),
            })?;
    let version = argv(&[&req.settings.devcontainer_cli, "--version"]);
    let cli_version = capture(&version, log, req.host)
        .await
        .map_err(|output| EnvironmentError::Build {
            step: "find the dev container CLI".to_owned(),
            output: format!("{output}; install it (`{}`) and set `autopilot.sandbox.environment.devcontainerCli` to its path", super::preflight::INSTALL_CLI),
            log: log.to_path_buf(),
            reproduce: shell_line(&version),
        })?;
    let agents = (req.definition.source == EnvSource::Devcontainer).then_some(req.agents_image);
    let layer = rover_layer("{setup}", agents, &[(LABEL_ENV_PROJECT, req.project)]);
    let hash = req.definition.hash(&[
        format!("project {}", req.project),
        format!("agents {}", agents_id.trim()),
        format!("devcontainer-cli {}", cli_version.trim()),
        format!("layer {layer}"),
    ]);
    Ok(BuildPlan {
        image: format!("{ENV_REPO}:{hash}"),
        hash,
        layer,
        agents_id: agents_id.trim().to_owned(),
    })
}

/// The dev container CLI's commands of a build and the time they have, made before any runs.
struct Commands {
    /// `read-configuration`: what the CLI would build, checked before anything starts.
    check: Vec<String>,
    /// `up`: the setup, in a container labelled with the build's id.
    up: Vec<String>,
    /// The label of the setup's container, to remove it after.
    id_label: String,
    /// The tag of the committed setup, under rover's layer.
    setup_image: String,
    deadline: Instant,
    limit: Duration,
}

async fn run_build(
    req: &BuildRequest<'_>,
    plan: &BuildPlan,
    log_path: &Path,
) -> Result<(), EnvironmentError> {
    let workspace = req.dir.join("workspace");
    let mut log = start_build(req, plan, log_path, &workspace).await?;
    let cmds = commands(req, plan, &workspace).await?;
    let result = async {
        check_definition(req, &mut log, &cmds, &workspace).await?;
        set_up(req, plan, &mut log, &cmds).await
    }
    .await;
    remove_setup(&log, &cmds, log_path, req.host).await;
    log.note(&format!(
        "rover: {}",
        match &result {
            Ok(()) => format!("built {}", plan.image),
            Err(e) => format!("failed: {e}"),
        }
    ))
    .await;
    result
}

/// The error of an I/O operation on `path`.
fn io(path: &Path) -> impl FnOnce(std::io::Error) -> EnvironmentError {
    let path = path.to_path_buf();
    move |source| EnvironmentError::Io { path, source }
}

/// A fresh export of the definition's commit into `workspace`, and the build's log, opened
/// with a line saying what is built.
async fn start_build(
    req: &BuildRequest<'_>,
    plan: &BuildPlan,
    log_path: &Path,
    workspace: &Path,
) -> Result<Log, EnvironmentError> {
    if workspace.exists() {
        tokio::fs::remove_dir_all(workspace)
            .await
            .map_err(io(workspace))?;
    }
    req.ws
        .export_commit(&req.definition.commit, workspace)
        .await?;
    let mut log = Log::create(log_path, req.host).await?;
    log.progress.clone_from(&req.progress);
    log.note(&format!(
        "rover: building {} from {} at {} (agents from {} {})",
        plan.image,
        req.definition
            .config_path
            .as_deref()
            .unwrap_or(match req.definition.source {
                EnvSource::SetupScript => super::definition::SETUP_SCRIPT,
                _ => "autopilot.sandbox.setup",
            }),
        req.definition.commit,
        req.agents_image,
        plan.agents_id,
    ))
    .await;
    Ok(log)
}

/// The CLI's commands over `workspace` (a setup script or `autopilot.sandbox.setup` gets a
/// definition of rover's, written here), and the build's deadline.
async fn commands(
    req: &BuildRequest<'_>,
    plan: &BuildPlan,
    workspace: &Path,
) -> Result<Commands, EnvironmentError> {
    let id_label = format!("{LABEL_ENV_BUILD}={}", plan.hash);
    // The workspace mount's source is the export itself, never the git repository the CLI
    // would look for around it (`git rev-parse` there reads files of the checkout: a committed
    // `HEAD`, `objects/`, `refs/` and a `config` naming `core.worktree` would make it any
    // directory of the host); GPUs are never requested.
    let mut target = argv(&[
        "--workspace-folder",
        &workspace.display().to_string(),
        "--mount-workspace-git-root=false",
    ]);
    if req.definition.source != EnvSource::Devcontainer {
        let config_dir = req.dir.join("setup");
        tokio::fs::create_dir_all(&config_dir)
            .await
            .map_err(io(&config_dir))?;
        let config = config_dir.join("devcontainer.json");
        tokio::fs::write(
            &config,
            setup_config(req.agents_image, &req.definition.setup_commands),
        )
        .await
        .map_err(io(&config))?;
        target.extend(["--config".to_owned(), config.display().to_string()]);
    } else if let Some(path) = &req.definition.config_path {
        target.extend([
            "--config".to_owned(),
            workspace.join(path).display().to_string(),
        ]);
    }
    let cli = &req.settings.devcontainer_cli;
    // No container has this label: what the CLI reads is the definition and its image.
    let check_label = format!("{LABEL_ENV_CHECK}={}", plan.hash);
    let mut check = argv(&[cli, "read-configuration", "--include-merged-configuration"]);
    check.extend(target.iter().cloned());
    check.extend(argv(&["--id-label", &check_label, "--log-format", "text"]));
    let mut up = argv(&[cli, "up"]);
    up.extend(target);
    up.extend(argv(&["--id-label", &id_label]));
    let owner = req.store.map(crate::sandbox::leftovers::owner_labels);
    for (name, value) in owner.iter().flatten() {
        up.extend(argv(&["--id-label", &format!("{name}={value}")]));
    }
    up.extend(argv(&[
        "--remove-existing-container",
        "--skip-post-attach",
        "--gpu-availability",
        "none",
        "--log-format",
        "text",
    ]));
    let limit = Duration::from_secs(req.settings.build_timeout_secs);
    Ok(Commands {
        check,
        up,
        id_label,
        setup_image: format!("{ENV_REPO}-setup:{}", plan.hash),
        deadline: Instant::now() + limit,
        limit,
    })
}

/// Refuse a definition that asks for the host. The image's `devcontainer.metadata` label is
/// merged into the definition by the CLI: what it asks for of the host is refused before any
/// container starts.
async fn check_definition(
    req: &BuildRequest<'_>,
    log: &mut Log,
    cmds: &Commands,
    workspace: &Path,
) -> Result<(), EnvironmentError> {
    let (check, cli_env) = (&cmds.check, &req.settings.local_env);
    let step = "check the definition (devcontainer read-configuration)";
    let out = log
        .run(step, check, cmds.deadline, cmds.limit, cli_env)
        .await?;
    let merged = read_configuration(&out).ok_or_else(|| EnvironmentError::Build {
        step: step.to_owned(),
        output: format!(
            "the dev container CLI did not say what it would build: {}",
            out.lines().last().unwrap_or_default()
        ),
        log: log.path.clone(),
        reproduce: shell_line(check),
    })?;
    if let Some(reason) = host_requests(&merged, workspace) {
        log.note(&format!("rover: refused: {reason}")).await;
        return Err(match &req.definition.config_path {
            Some(path) if req.definition.source == EnvSource::Devcontainer => {
                EnvironmentError::Definition {
                    path: path.clone(),
                    reason,
                }
            }
            _ => EnvironmentError::Build {
                step: step.to_owned(),
                output: reason,
                log: log.path.clone(),
                reproduce: shell_line(check),
            },
        });
    }
    Ok(())
}

/// Run the setup, commit its container and build rover's layer on top.
async fn set_up(
    req: &BuildRequest<'_>,
    plan: &BuildPlan,
    log: &mut Log,
    cmds: &Commands,
) -> Result<(), EnvironmentError> {
    let (up, deadline, limit) = (&cmds.up, cmds.deadline, cmds.limit);
    let setup_image = &cmds.setup_image;
    let cli_env = &req.settings.local_env;
    let out = log
        .run("set up (devcontainer up)", up, deadline, limit, cli_env)
        .await?;
    let container = outcome_container(&out).ok_or_else(|| EnvironmentError::Build {
        step: "set up (devcontainer up)".to_owned(),
        output: format!(
            "the dev container CLI did not say which container it set up: {}",
            out.lines().last().unwrap_or_default()
        ),
        log: log.path.clone(),
        reproduce: shell_line(up),
    })?;
    let commit = argv(&["docker", "commit", &container, setup_image]);
    log.run(
        "keep the setup (docker commit)",
        &commit,
        deadline,
        limit,
        &[],
    )
    .await?;
    let layer_dir = req.dir.join("layer");
    tokio::fs::create_dir_all(&layer_dir)
        .await
        .map_err(io(&layer_dir))?;
    let dockerfile = layer_dir.join("Dockerfile");
    let text = plan.layer.replace("{setup}", setup_image)
        + &format!("LABEL {LABEL_ENV_HASH}=\"{}\"\n", plan.hash);
    tokio::fs::write(&dockerfile, text)
        .await
        .map_err(io(&dockerfile))?;
    let layer = argv(&[
        "docker",
        "build",
        "-t",
        &plan.image,
        &layer_dir.display().to_string(),
    ]);
    log.run(
        "add rover's layer (docker build)",
        &layer,
        deadline,
        limit,
        &[],
    )
    .await
    .map(|_| ())
}

/// Remove the setup container and the setup's tags, whatever happened (the image keeps its
/// layers).
async fn remove_setup(log: &Log, cmds: &Commands, log_path: &Path, host: &HostEnv) {
    let leftovers = argv(&[
        "docker",
        "ps",
        "-aq",
        "--filter",
        &format!("label={}", cmds.id_label),
    ]);
    if let Ok(ids) = capture(&leftovers, log_path, host).await {
        for id in ids.split_whitespace() {
            let _ = capture(&argv(&["docker", "rm", "-f", "-v", id]), log_path, host).await;
        }
    }
    for image in log.tagged.iter().chain(std::iter::once(&cmds.setup_image)) {
        let _ = capture(&argv(&["docker", "image", "rm", image]), log_path, host).await;
    }
}

/// The container id in the dev container CLI's last JSON line, when it says `success`.
fn outcome_container(stdout: &str) -> Option<String> {
    let line = stdout
        .lines()
        .rev()
        .find(|l| l.trim_start().starts_with('{'))?;
    let value: serde_json::Value = serde_json::from_str(line.trim()).ok()?;
    (value["outcome"] == "success")
        .then(|| value["containerId"].as_str().map(str::to_owned))
        .flatten()
}

/// The JSON `devcontainer read-configuration` prints (its last line that is an object).
fn read_configuration(stdout: &str) -> Option<serde_json::Value> {
    if let Ok(value) = serde_json::from_str::<serde_json::Value>(stdout.trim()) {
        return value.is_object().then_some(value);
    }
    let line = stdout
        .lines()
        .rev()
        .find(|l| l.trim_start().starts_with('{'))?;
    serde_json::from_str(line.trim()).ok()
}

/// What the setup container would get of the engine's host, in words, from the CLI's
/// `read-configuration --include-merged-configuration` (the definition merged with its image's
/// `devcontainer.metadata` label): `None` when nothing, and the workspace mount is the export.
fn host_requests(read: &serde_json::Value, workspace: &Path) -> Option<String> {
    let merged = &read["mergedConfiguration"];
    let asked: Vec<&str> = [
        ("privileged", merged["privileged"] == true),
        ("init", merged["init"] == true),
        ("capAdd", non_empty(&merged["capAdd"])),
        ("securityOpt", non_empty(&merged["securityOpt"])),
        ("mounts", non_empty(&merged["mounts"])),
    ]
    .into_iter()
    .filter_map(|(key, set)| set.then_some(key))
    .collect();
    if !asked.is_empty() {
        let image = merged["image"]
            .as_str()
            .unwrap_or("the image it builds from");
        return Some(format!(
            "`{}` is not allowed: it reaches the engine's host configuration of the setup container, and `{image}` asks for it in its `devcontainer.metadata` label (which the dev container CLI merges into the definition); rover refuses keys it does not know to be safe: build from an image without them",
            asked.join("`, `")
        ));
    }
    let mount = read["workspace"]["workspaceMount"]
        .as_str()
        .unwrap_or_default();
    let source = workspace.display().to_string();
    if !mount.starts_with(&format!("type=bind,source={source},"))
        && !mount.starts_with(&format!("type=bind,\"source={source}\","))
    {
        return Some(format!(
            "the workspace mount would be `{mount}`, not rover's export of the default branch ({source})"
        ));
    }
    None
}

fn non_empty(value: &serde_json::Value) -> bool {
    match value {
        serde_json::Value::Array(items) => !items.is_empty(),
        serde_json::Value::Null | serde_json::Value::Bool(false) => false,
        serde_json::Value::String(s) => !s.is_empty(),
        _ => true,
    }
}

/// The dev container CLI's own words for a failure (`message` and `description`), if it gave them.
pub(super) fn outcome_error(stdout: &str) -> Option<String> {
    let line = stdout
        .lines()
        .rev()
        .find(|l| l.trim_start().starts_with('{'))?;
    let value: serde_json::Value = serde_json::from_str(line.trim()).ok()?;
    if value["outcome"] != "error" {
        return None;
    }
    Some(
        [value["description"].as_str(), value["message"].as_str()]
            .into_iter()
            .flatten()
            .collect::<Vec<_>>()
            .join(" "),
    )
}

fn build_lock(hash: &str) -> Arc<tokio::sync::Mutex<()>> {
    static LOCKS: OnceLock<Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>> = OnceLock::new();
    LOCKS
        .get_or_init(Mutex::default)
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .entry(hash.to_owned())
        .or_default()
        .clone()
}

async fn image_exists(image: &str, host: &HostEnv) -> bool {
    Command::new("docker")
        .args(["image", "inspect", "--format", "{{.Id}}", image])
        .env_clear()
        .envs(passed_env(host, &[]))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .await
        .is_ok_and(|s| s.success())
}

fn argv(words: &[&str]) -> Vec<String> {
    words.iter().map(|w| (*w).to_owned()).collect()
}

/// [`PASSED_ENV`] and the `extra` names, those of rover's environment that are set.
pub(super) fn passed_env(host: &HostEnv, extra: &[String]) -> Vec<(String, String)> {
    PASSED_ENV
        .iter()
        .copied()
        .chain(extra.iter().map(String::as_str))
        .filter_map(|name| host.var(name).map(|v| (name.to_owned(), v)))
        .collect()
}

/// A short command's stdout, or what went wrong in words (also appended to `log` when it exists).
async fn capture(argv: &[String], log: &Path, host: &HostEnv) -> Result<String, String> {
    let out = Command::new(&argv[0])
        .args(&argv[1..])
        .env_clear()
        .envs(passed_env(host, &[]))
        .stdin(Stdio::null())
        .kill_on_drop(true)
        .output()
        .await
        .map_err(|e| format!("`{}` cannot run: {e}", argv[0]))?;
    if out.status.success() {
        return Ok(String::from_utf8_lossy(&out.stdout).into_owned());
    }
    let stderr = String::from_utf8_lossy(&out.stderr).trim().to_owned();
    if log.exists() {
        if let Ok(mut file) = tokio::fs::OpenOptions::new().append(true).open(log).await {
            let _ = file
                .write_all(format!("$ {}\n{stderr}\n", shell_line(argv)).as_bytes())
                .await;
        }
    }
    Err(format!("`{}` failed: {stderr}", shell_line(argv)))
}

/// `argv` as one line a shell runs as the same command.
pub(crate) fn shell_line(argv: &[String]) -> String {
    argv.iter()
        .map(|a| {
            if !a.is_empty()
                && a.chars()
                    .all(|c| c.is_ascii_alphanumeric() || "_./:=@,+-{}".contains(c))
            {
                a.clone()
            } else {
                format!("'{}'", a.replace('\'', r"'\''"))
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_cli_outcome() {
        let ok =
            "noise\n{\"outcome\":\"success\",\"containerId\":\"abc\",\"remoteUser\":\"root\"}\n";
        assert_eq!(outcome_container(ok).as_deref(), Some("abc"));
        let bad = "{\"outcome\":\"error\",\"message\":\"Command failed: /bin/sh -c cargo fetch --locked\",\"description\":\"postCreateCommand from devcontainer.json failed.\",\"containerId\":\"x\"}";
        assert_eq!(outcome_container(bad), None);
        assert_eq!(
            outcome_error(bad).as_deref(),
            Some("postCreateCommand from devcontainer.json failed. Command failed: /bin/sh -c cargo fetch --locked")
        );
    }

    /// What `devcontainer read-configuration --include-merged-configuration` 0.89.0 printed for
    /// `{"image": "rover-dcx-meta:1"}`, an image labelled `devcontainer.metadata=[{"privileged":
    /// true, "mounts": [...], "capAdd": ["SYS_ADMIN"], "init": true}]` (trimmed).
    const READ_WITH_METADATA: &str = r#"{"configuration":{"image":"rover-dcx-meta:1","configFilePath":{"$mid":1,"fsPath":"/tmp/dcx/ws/.devcontainer/devcontainer.json","path":"/tmp/dcx/ws/.devcontainer/devcontainer.json","scheme":"vscode-fileHost"}},"workspace":{"workspaceFolder":"/workspaces/ws","workspaceMount":"type=bind,source=/tmp/dcx/ws,target=/workspaces/ws"},"mergedConfiguration":{"image":"rover-dcx-meta:1","init":true,"privileged":true,"capAdd":["SYS_ADMIN"],"mounts":["type=bind,source=/etc,target=/hostetc"],"onCreateCommands":[],"updateContentCommands":[],"postCreateCommands":[],"postStartCommands":[],"postAttachCommands":[],"remoteEnv":{},"portsAttributes":{}}}"#;

    #[test]
    fn an_image_whose_metadata_asks_for_the_host_is_refused() {
        let read = read_configuration(&format!("noise\n{READ_WITH_METADATA}\n")).expect("JSON");
        let reason = host_requests(&read, Path::new("/tmp/dcx/ws")).expect("refused");
        assert!(
            reason.starts_with("`privileged`, `init`, `capAdd`, `mounts` is not allowed: it reaches the engine's host configuration of the setup container, and `rover-dcx-meta:1` asks for it in its `devcontainer.metadata` label"),
            "{reason}"
        );
        // The same with none of it: nothing to refuse.
        let mut plain = read.clone();
        for key in ["init", "privileged", "capAdd", "mounts"] {
            plain["mergedConfiguration"]
                .as_object_mut()
                .expect("an object")
                .remove(key);
        }
        plain["mergedConfiguration"]["privileged"] = serde_json::json!(false);
        plain["mergedConfiguration"]["securityOpt"] = serde_json::json!([]);
        assert_eq!(host_requests(&plain, Path::new("/tmp/dcx/ws")), None);
        // A workspace mount of anything but the export is refused too.
        let reason = host_requests(&plain, Path::new("/tmp/dcx/other")).expect("refused");
        assert!(reason.contains("not rover's export"), "{reason}");
    }

    #[test]
    fn shell_lines_quote_what_a_shell_would_split() {
        let line = shell_line(&argv(&[
            "docker",
            "build",
            "-t",
            "rover-env:ab",
            "/tmp/a b",
            "it's",
        ]));
        assert_eq!(line, r"docker build -t rover-env:ab '/tmp/a b' 'it'\''s'");
    }
}
