//! Reading `devcontainer.json` (JSON with comments and trailing commas) for what rover must know
//! before the dev container CLI builds it: which files define the image (to hash them), that it
//! asks for nothing of the engine's host (an allow-list of keys, the variables of rover's
//! environment it reads, the paths it builds from), and what it builds but does not apply to
//! rover's own containers.

use std::collections::BTreeMap;

use serde_json::{Map, Value};

use crate::host_env::HostEnv;

/// Where rover looks for a dev container definition, first match wins.
pub const DEVCONTAINER_PATHS: &[&str] = &[".devcontainer/devcontainer.json", ".devcontainer.json"];

/// The `rover.json` key that lets definitions read variables of rover's environment.
pub const LOCAL_ENV_KEY: &str = "autopilot.sandbox.environment.localEnv";

/// The top-level keys rover knows cannot reach the engine's host configuration of the setup
/// container (checked against what the dev container CLI 0.89.0 does with each: it sets
/// something inside the container or its image, or `devcontainer up` does not read it). Every
/// other key is refused; `build` is checked key by key ([`BUILD_ALLOWED`]).
const ALLOWED: &[&str] = &[
    // Read by editors only.
    "$schema",
    "name",
    // What the image is built from; the paths are checked (`DefinitionPath`), and the image's
    // own `devcontainer.metadata` label by the build (`devcontainer read-configuration`).
    "image",
    "build",
    "dockerFile",
    "context",
    // `docker run -e` and `-u`, the lifecycle commands' environment and user: all inside the
    // container.
    "containerEnv",
    "remoteEnv",
    "remoteUser",
    "containerUser",
    // The CLI rebuilds the image with the host user's uid for the container user: an image.
    "updateRemoteUserUID",
    // A shell the CLI runs inside the container to read its environment.
    "userEnvProbe",
    // Commands run inside the container (`initializeCommand`, on the host, is refused).
    "onCreateCommand",
    "updateContentCommand",
    "postCreateCommand",
    "postStartCommand",
    "postAttachCommand",
    "waitFor",
    // What the container's first process is, and the directory inside it the commands run in.
    "overrideCommand",
    "workspaceFolder",
    // Ports an editor forwards; `devcontainer up` publishes none of them (that is `appPort`).
    "forwardPorts",
    "portsAttributes",
    "otherPortsAttributes",
    // Read by editors when a window closes; not by `devcontainer up`.
    "shutdownAction",
    // Tools' settings; the last three are the older spelling the CLI moves into
    // `customizations.vscode`.
    "customizations",
    "extensions",
    "settings",
    "devPort",
];

/// The keys of `build` rover allows: the Dockerfile and its context (paths, checked), and what
/// `docker build` gets as `--build-arg`, `--target` and `--cache-from` (images only).
const BUILD_ALLOWED: &[&str] = &["dockerfile", "context", "args", "target", "cacheFrom"];

/// Why a key reaches the engine's host configuration of the setup container.
const HOST: &str = "it reaches the engine's host configuration of the setup container";

/// Keys rover refuses for a reason of their own (every key not in [`ALLOWED`] is refused too).
const REFUSED: &[(&str, &str)] = &[
    (
        "runArgs",
        "any `docker run` flag: `--privileged`, `-v /:/host`, `--network=host`, `--pid=host`",
    ),
    (
        "mounts",
        "a host directory or volume mounted into a container that has the network",
    ),
    (
        "workspaceMount",
        "it chooses the host directory mounted as the workspace; rover mounts its own export of the default branch",
    ),
    (
        "privileged",
        "a privileged container has every capability and the host's devices",
    ),
    (
        "capAdd",
        "capabilities beyond the engine's default set, such as `SYS_ADMIN` or `SYS_PTRACE`",
    ),
    (
        "securityOpt",
        "it switches off seccomp, AppArmor or `no-new-privileges`",
    ),
    (
        "init",
        "`--init` runs the engine host's own `docker-init` as the container's first process",
    ),
    ("appPort", "it publishes the setup container's ports on the host"),
    (
        "hostRequirements",
        "a `gpu` request gives the container the host's GPUs (`--gpus all`)",
    ),
];

/// Keys rover refuses for what rover is, not for the host.
const UNSUPPORTED: &[(&str, &str)] = &[
    (
        "features",
        "features are fetched from OCI registries while the image builds, so their content is not part of the default branch and rover cannot hash or pin it; install those tools in the Dockerfile (`build.dockerfile`) instead",
    ),
    (
        "dockerComposeFile",
        "rover runs one container per task; Docker Compose definitions are not supported: use `image` or `build.dockerfile`",
    ),
    (
        "service",
        "a Docker Compose key; Docker Compose definitions are not supported: use `image` or `build.dockerfile`",
    ),
    (
        "runServices",
        "a Docker Compose key; Docker Compose definitions are not supported: use `image` or `build.dockerfile`",
    ),
    (
        "initializeCommand",
        "it runs on the host, and rover never runs a repository's commands on the host (docs/sandbox.md, the trust boundary); move it to `onCreateCommand`",
    ),
];

/// Keys of `build` rover refuses for a reason of their own.
const BUILD_REFUSED: &[(&str, &str)] = &[(
    "options",
    "extra `docker build` flags such as `--network=host`, `--add-host` or `--secret src=/host/file`",
)];

/// Keys the setup container gets (the dev container CLI applies them) but rover's own agent,
/// gate and hook containers do not, and what rover does instead.
const NOT_APPLIED: &[(&str, &str)] = &[
    ("postStartCommand", "runs once, in the setup container; rover's containers each run one command (the agent, a gate, a hook)"),
    ("postAttachCommand", "not run: nothing attaches to rover's containers"),
    ("remoteEnv", "not set in rover's containers; use `containerEnv` (kept in the image)"),
    ("remoteUser", "the setup runs as it; rover's containers run as the worktree's owner (or 10001), never root"),
    ("containerUser", "the setup runs as it; rover's containers run as the worktree's owner (or 10001), never root"),
    ("workspaceFolder", "the setup container only; rover's containers work in /workspace"),
    ("overrideCommand", "the setup container only; rover's containers each run one command"),
    ("forwardPorts", "no ports are forwarded from rover's containers"),
];

/// What rover reads of a `devcontainer.json` itself; the dev container CLI reads the rest.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct DevcontainerConfig {
    /// `image`: the image to start from (must be present locally or pullable by the engine).
    pub image: Option<String>,
    /// The Dockerfile the CLI builds: `dockerFile` when the definition has that older key, else
    /// `build.dockerfile` (the CLI's order).
    pub dockerfile: Option<DefinitionPath>,
    /// The build context, given with the Dockerfile (`context`, else `build.context`); the
    /// Dockerfile's directory when not given or empty.
    pub context: Option<DefinitionPath>,
    /// Every path the definition gives (`build.dockerfile`, `build.context`, `dockerFile`,
    /// `context`), used or not: each must stay inside the checkout.
    pub paths: Vec<DefinitionPath>,
    /// What of the definition rover builds but does not apply to its containers, in words.
    pub notes: Vec<String>,
}

/// A path of the definition after its variables are resolved: relative, with no variable left.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DefinitionPath {
    /// The key it is given under (`build.context`), for errors.
    pub key: String,
    /// Relative to the repository's root when `from_root` (it began with
    /// `${localWorkspaceFolder}`), else to the directory of the `devcontainer.json`.
    pub path: String,
    pub from_root: bool,
}

/// The variables of rover's environment a definition may read (`autopilot.sandbox.environment
/// .localEnv`), with their values (`None`: not set).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct LocalEnv(BTreeMap<String, Option<String>>);

impl LocalEnv {
    /// `names` with their values in rover's environment (`host`); a value that is not UTF-8
    /// counts as not set, as the build does not pass it to the CLI either.
    pub fn from_host(names: &[String], host: &HostEnv) -> Self {
        Self(names.iter().map(|n| (n.clone(), host.var(n))).collect())
    }

    /// These names and values (`None`: not set).
    pub fn new<I: IntoIterator<Item = (String, Option<String>)>>(vars: I) -> Self {
        Self(vars.into_iter().collect())
    }

    /// Whether definitions may read `name`.
    fn allows(&self, name: &str) -> bool {
        self.0.contains_key(name)
    }

    /// The value of `name` in rover's environment, when definitions may read it and it is set.
    fn value(&self, name: &str) -> Option<&str> {
        self.0.get(name).and_then(Option::as_deref)
    }
}

/// `text` without `//` and `/* */` comments and without trailing commas, as plain JSON (what
/// is inside strings is left alone).
pub fn strip_jsonc(text: &str) -> String {
    let chars: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    let mut in_string = false;
    while i < chars.len() {
        let c = chars[i];
        if in_string {
            out.push(c);
            if c == '\\' && i + 1 < chars.len() {
                out.push(chars[i + 1]);
                i += 1;
            } else if c == '"' {
                in_string = false;
            }
            i += 1;
            continue;
        }
        match (c, chars.get(i + 1)) {
            ('"', _) => {
                in_string = true;
                out.push(c);
                i += 1;
            }
            ('/', Some('/')) => {
                while i < chars.len() && chars[i] != '\n' {
                    i += 1;
                }
            }
            ('/', Some('*')) => {
                i += 2;
                while i < chars.len() && !(chars[i] == '*' && chars.get(i + 1) == Some(&'/')) {
                    i += 1;
                }
                i += 2;
            }
            (',', _) => {
                // A comma followed (past whitespace and comments) by `}` or `]` is dropped.
                if !matches!(next_significant(&chars, i + 1), Some('}' | ']')) {
                    out.push(',');
                }
                i += 1;
            }
            _ => {
                out.push(c);
                i += 1;
            }
        }
    }
    out
}

/// Reads a `devcontainer.json`: `Err(reason)` when it is not JSON (with comments), not an
/// object, has a key rover does not allow, reads a variable of rover's environment not in
/// `local_env`, gives a path that is absolute or keeps a variable rover cannot resolve, or names
/// neither `image` nor `build.dockerfile`. Every reason names the key.
pub fn parse_devcontainer(text: &str, local_env: &LocalEnv) -> Result<DevcontainerConfig, String> {
    let value: Value = serde_json::from_str(&strip_jsonc(text))
        .map_err(|e| format!("it is not JSON (comments and trailing commas allowed): {e}"))?;
    let Value::Object(map) = value else {
        return Err("it is not a JSON object".to_owned());
    };
    check_keys(&map)?;
    // The CLI substitutes variables in every value (the image's `devcontainer.metadata` label
    // too), so every string is checked, object keys included.
    check_variables(&Value::Object(map.clone()), "", local_env)?;
    let build = match map.get("build") {
        None | Some(Value::Null) => Map::new(),
        Some(Value::Object(build)) => build.clone(),
        Some(_) => return Err("`build` must be an object".to_owned()),
    };
    let image = match map.get("image") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) if s.starts_with('-') => {
            return Err(format!("`image` (`{s}`) is not an image name"))
        }
        Some(Value::String(s)) => Some(s.clone()),
        Some(_) => return Err("`image` must be a string".to_owned()),
    };
    check_cache_from(build.get("cacheFrom"), local_env)?;
    let path = |map: &Map<String, Value>, key: &str, label: &str| match map.get(key) {
        None => Ok(None),
        Some(Value::String(raw)) => resolve_path(label, raw, local_env).map(Some),
        Some(_) => Err(format!("`{label}` must be a string")),
    };
    let dockerfile_build = path(&build, "dockerfile", "build.dockerfile")?;
    let context_build = path(&build, "context", "build.context")?;
    let dockerfile_legacy = path(&map, "dockerFile", "dockerFile")?;
    let context_legacy = path(&map, "context", "context")?;
    let paths: Vec<DefinitionPath> = [
        &dockerfile_build,
        &context_build,
        &dockerfile_legacy,
        &context_legacy,
    ]
    .into_iter()
    .flatten()
    .cloned()
    .collect();
    // The CLI's order: with the older `dockerFile` key it builds that with the top-level
    // `context`, else `build.dockerfile` with `build.context`; an empty context is none.
    let (dockerfile, context) = if map.contains_key("dockerFile") {
        (dockerfile_legacy, context_legacy)
    } else {
        (dockerfile_build, context_build)
    };
    let context = context.filter(|c| c.from_root || !c.path.is_empty());
    let config = DevcontainerConfig {
        image,
        dockerfile,
        context,
        paths,
        notes: NOT_APPLIED
            .iter()
            .filter(|(key, _)| map.get(*key).is_some_and(|v| !is_empty(v)))
            .map(|(key, what)| format!("`{key}`: {what}"))
            .collect(),
    };
    if config.image.is_none() && config.dockerfile.is_none() {
        return Err("it names neither `image` nor `build.dockerfile`".to_owned());
    }
    Ok(config)
}

/// Every key of the definition (and of its `build`) is one rover allows; the first that is not
/// is the error, with why.
fn check_keys(map: &Map<String, Value>) -> Result<(), String> {
    let refuse = |key: &str, why: &str| {
        format!("`{key}` is not allowed: {why}; rover refuses keys it does not know to be safe")
    };
    for (key, value) in map {
        if let Some((_, why)) = REFUSED.iter().find(|(k, _)| k == key) {
            return Err(refuse(key, &format!("{HOST} ({why})")));
        }
        if let Some((_, why)) = UNSUPPORTED.iter().find(|(k, _)| k == key) {
            // An empty `features` asks for nothing (templates often have one).
            if key == "features" && is_empty(value) {
                continue;
            }
            return Err(refuse(key, why));
        }
        if !ALLOWED.contains(&key.as_str()) {
            return Err(refuse(key, "it is not one of the keys rover knows cannot reach the engine's host configuration of the setup container (docs/sandbox.md, \"Per-repository environments\", lists them)"));
        }
    }
    if let Some(Value::Object(build)) = map.get("build") {
        for key in build.keys() {
            let label = format!("build.{key}");
            if let Some((_, why)) = BUILD_REFUSED.iter().find(|(k, _)| k == key) {
                return Err(refuse(&label, &format!("{HOST} ({why})")));
            }
            if !BUILD_ALLOWED.contains(&key.as_str()) {
                return Err(refuse(&label, &format!("it is not one of the keys of `build` rover knows cannot reach the engine's host configuration (`{}`)", BUILD_ALLOWED.join("`, `"))));
            }
        }
    }
    Ok(())
}

/// Every `${env:NAME}` and `${localEnv:NAME}` (with or without a default) in `value`, at `at`,
/// names a variable in `local_env`.
fn check_variables(value: &Value, at: &str, local_env: &LocalEnv) -> Result<(), String> {
    let check_text = |text: &str, at: &str| -> Result<(), String> {
        for inner in references(text) {
            let mut parts = inner.split(':');
            let kind = parts.next().unwrap_or_default().trim();
            if !kind.eq_ignore_ascii_case("env") && !kind.eq_ignore_ascii_case("localEnv") {
                continue;
            }
            let at = if at.is_empty() { "the definition" } else { at };
            let Some(name) = parts.next().filter(|n| !n.is_empty()) else {
                return Err(format!(
                    "`{at}` has `${{{inner}}}`, which names no variable"
                ));
            };
            if !local_env.allows(name) {
                return Err(format!(
                    "`{at}` reads `${{{inner}}}`, a variable of rover's environment definitions may not read; to let them, add `{name}` to `{LOCAL_ENV_KEY}` in rover.json"
                ));
            }
        }
        Ok(())
    };
    match value {
        Value::String(text) => check_text(text, at),
        Value::Array(items) => items
            .iter()
            .enumerate()
            .try_for_each(|(i, item)| check_variables(item, &format!("{at}[{i}]"), local_env)),
        Value::Object(map) => map.iter().try_for_each(|(key, item)| {
            let at = if at.is_empty() {
                key.clone()
            } else {
                format!("{at}.{key}")
            };
            check_text(key, &at)?;
            check_variables(item, &at, local_env)
        }),
        _ => Ok(()),
    }
}

/// What is inside every `${...}` of `text` the dev container CLI substitutes (its pattern is
/// `/\$\{(.*?)\}/g`), and more: one for each `${`, up to the first `}` after it, also across
/// a line break (where the CLI's `.` stops).
fn references(text: &str) -> impl Iterator<Item = &str> {
    text.match_indices("${").filter_map(|(i, _)| {
        let rest = &text[i + 2..];
        rest.find('}').map(|end| &rest[..end])
    })
}

/// `raw`, the value of path key `key`, with its variables resolved as the CLI resolves them:
/// `${localWorkspaceFolder}` at its start is the repository's root (and must be all of it or be
/// followed by `/`), `${localEnv:NAME}` is the value rover has (and passes to the CLI); any other
/// variable, an absolute path or a `${` left is refused.
fn resolve_path(key: &str, raw: &str, local_env: &LocalEnv) -> Result<DefinitionPath, String> {
    const ROOT: &str = "${localWorkspaceFolder}";
    let (from_root, rest) = match raw.strip_prefix(ROOT) {
        Some(rest) => (true, rest),
        None => (false, raw),
    };
    let path = substitute_env(key, rest, local_env)?;
    if from_root && !path.is_empty() && !path.starts_with('/') {
        return Err(format!(
            "`{key}` (`{raw}`) names a path beside the checkout, not in it: `{ROOT}` must be followed by `/`"
        ));
    }
    if !from_root && path.starts_with('/') {
        return Err(format!(
            "`{key}` (`{raw}`) is an absolute path; give it relative to the `devcontainer.json` (or after `{ROOT}/`), inside the repository"
        ));
    }
    Ok(DefinitionPath {
        key: key.to_owned(),
        path,
        from_root,
    })
}

/// `text` with its `${env:...}` and `${localEnv:...}` replaced as the CLI replaces them (the
/// value, else the default after the name, else nothing); any other variable is refused, and so
/// is a `${` left after.
fn substitute_env(key: &str, text: &str, local_env: &LocalEnv) -> Result<String, String> {
    let mut out = String::new();
    let mut i = 0;
    while let Some(found) = text[i..].find("${") {
        let start = i + found;
        let after = &text[start + 2..];
        let Some(end) = after
            .find('}')
            .filter(|&end| !after[..end].contains(['\n', '\r', '\u{2028}', '\u{2029}']))
        else {
            // Not a variable to the CLI: kept as it is (and refused below).
            out.push_str(&text[i..start + 2]);
            i = start + 2;
            continue;
        };
        let inner = &after[..end];
        out.push_str(&text[i..start]);
        let parts: Vec<&str> = inner.split(':').collect();
        match parts.as_slice() {
            ["env" | "localEnv", name, more @ ..] if local_env.allows(name) => out.push_str(
                local_env
                    .value(name)
                    .or(more.first().copied())
                    .unwrap_or_default(),
            ),
            ["env" | "localEnv", name, ..] => {
                return Err(format!(
                    "`{key}` reads `${{{inner}}}`, a variable of rover's environment definitions may not read; to let them, add `{name}` to `{LOCAL_ENV_KEY}` in rover.json"
                ))
            }
            _ => {
                return Err(format!(
                    "`{key}` has `${{{inner}}}`: in a path rover resolves only `${{localWorkspaceFolder}}` at its start and `${{localEnv:NAME}}`"
                ))
            }
        }
        i = start + 2 + end + 1;
    }
    out.push_str(&text[i..]);
    if out.contains("${") {
        return Err(format!(
            "`{key}` keeps a `${{` rover cannot resolve (`{out}`)"
        ));
    }
    Ok(out)
}

/// `build.cacheFrom` names images only: with BuildKit a cache source such as
/// `type=local,src=/path` reads a directory of the host.
fn check_cache_from(value: Option<&Value>, local_env: &LocalEnv) -> Result<(), String> {
    let entries: Vec<&Value> = match value {
        None | Some(Value::Null) => return Ok(()),
        Some(Value::Array(items)) => items.iter().collect(),
        Some(one) => vec![one],
    };
    for entry in entries {
        let Value::String(raw) = entry else {
            return Err("`build.cacheFrom` must be a string or a list of strings".to_owned());
        };
        let image = substitute_env("build.cacheFrom", raw, local_env)?;
        if image.contains(['=', ',']) || image.starts_with('-') {
            return Err(format!(
                "`build.cacheFrom` is not allowed to be `{raw}`: {HOST} (a cache source such as `type=local,src=...` reads a directory of the host); name images only"
            ));
        }
    }
    Ok(())
}

/// The first character at or after `i` that is neither whitespace nor in a comment.
fn next_significant(chars: &[char], mut i: usize) -> Option<char> {
    while i < chars.len() {
        match (chars[i], chars.get(i + 1)) {
            (c, _) if c.is_whitespace() => i += 1,
            ('/', Some('/')) => {
                while i < chars.len() && chars[i] != '\n' {
                    i += 1;
                }
            }
            ('/', Some('*')) => {
                i += 2;
                while i < chars.len() && !(chars[i] == '*' && chars.get(i + 1) == Some(&'/')) {
                    i += 1;
                }
                i += 2;
            }
            (c, _) => return Some(c),
        }
    }
    None
}

fn is_empty(value: &Value) -> bool {
    match value {
        Value::Null => true,
        Value::Object(m) => m.is_empty(),
        Value::Array(a) => a.is_empty(),
        Value::String(s) => s.is_empty(),
        _ => false,
    }
}

#[cfg(test)]
#[path = "devcontainer_tests.rs"]
mod tests;
