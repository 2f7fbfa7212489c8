//! Reading `devcontainer.json` (JSON with comments and trailing commas) for what rover must know
//! before the dev container CLI builds it: which files define the image (to hash them), what
//! rover refuses, and what it builds but does not apply to its own containers.

use serde_json::{Map, Value};

/// Where rover looks for a dev container definition, first match wins.
pub const DEVCONTAINER_PATHS: &[&str] = &[".devcontainer/devcontainer.json", ".devcontainer.json"];

/// Keys rover refuses, and why.
const REFUSED: &[(&str, &str)] = &[
    (
        "features",
        "features are fetched from OCI registries while the image builds, so their content is not part of the default branch and rover cannot hash or pin it; install those tools in the Dockerfile (`build.dockerfile`) instead",
    ),
    (
        "dockerComposeFile",
        "rover runs one container per task; Docker Compose definitions are not supported: use `image` or `build.dockerfile`",
    ),
    (
        "initializeCommand",
        "it runs on the host, and rover never runs a repository's commands on the host (docs/sandbox.md, the trust boundary); move it to `onCreateCommand`",
    ),
];

/// Keys the setup container gets (the dev container CLI applies them) but rover's own agent,
/// gate and hook containers do not, and what rover does instead.
const NOT_APPLIED: &[(&str, &str)] = &[
    ("postStartCommand", "runs once, in the setup container; rover's containers each run one command (the agent, a gate, a hook)"),
    ("postAttachCommand", "not run: nothing attaches to rover's containers"),
    ("remoteEnv", "not set in rover's containers; use `containerEnv` (kept in the image)"),
    ("remoteUser", "the setup runs as it; rover's containers run as the worktree's owner (or 10001), never root"),
    ("containerUser", "the setup runs as it; rover's containers run as the worktree's owner (or 10001), never root"),
    ("runArgs", "the setup container only; rover's containers get rover's limits (autopilot.sandbox)"),
    ("mounts", "the setup container only; rover's containers mount the worktree at /workspace and nothing else of the host"),
    ("workspaceMount", "the setup container only; rover mounts the worktree at /workspace"),
    ("workspaceFolder", "the setup container only; rover's containers work in /workspace"),
    ("privileged", "the setup container only; rover's containers drop every capability"),
    ("capAdd", "the setup container only; rover's containers drop every capability"),
    ("securityOpt", "the setup container only; rover's containers run with no-new-privileges"),
    ("forwardPorts", "no ports are forwarded from rover's containers"),
    ("appPort", "no ports are published from rover's containers"),
];

/// What rover reads of a `devcontainer.json` itself; the dev container CLI reads the rest.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct DevcontainerConfig {
    /// `image`: the image to start from (must be present locally or pullable by the engine).
    pub image: Option<String>,
    /// `build.dockerfile` (or the older top-level `dockerFile`), relative to the config file.
    pub dockerfile: Option<String>,
    /// `build.context` (or `context`), relative to the config file; `.` when not given.
    pub context: Option<String>,
    /// What of the definition rover builds but does not apply to its containers, in words.
    pub notes: Vec<String>,
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
/// object, uses something rover refuses, or names neither `image` nor `build.dockerfile`.
pub fn parse_devcontainer(text: &str) -> Result<DevcontainerConfig, String> {
    let value: Value = serde_json::from_str(&strip_jsonc(text))
        .map_err(|e| format!("it is not JSON (comments and trailing commas allowed): {e}"))?;
    let Value::Object(map) = value else {
        return Err("it is not a JSON object".to_owned());
    };
    for (key, why) in REFUSED {
        if map.get(*key).is_some_and(|v| !is_empty(v)) {
            return Err(format!("`{key}` is not supported: {why}"));
        }
    }
    let text_of = |map: &Map<String, Value>, key: &str| -> Result<Option<String>, String> {
        match map.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.clone())),
            Some(_) => Err(format!("`{key}` must be a string")),
        }
    };
    let build = match map.get("build") {
        None | Some(Value::Null) => Map::new(),
        Some(Value::Object(build)) => build.clone(),
        Some(_) => return Err("`build` must be an object".to_owned()),
    };
    let config = DevcontainerConfig {
        image: text_of(&map, "image")?,
        dockerfile: text_of(&build, "dockerfile")?.or(text_of(&map, "dockerFile")?),
        context: text_of(&build, "context")?.or(text_of(&map, "context")?),
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
mod tests {
    use super::*;

    #[test]
    fn comments_and_trailing_commas_are_dropped_but_not_inside_strings() {
        let text = "// top\n{\n  \"a\": \"http://x/*y*/\", /* c */\n  \"b\": [1, 2,],\n}\n";
        let value: Value = serde_json::from_str(&strip_jsonc(text)).expect("plain JSON");
        assert_eq!(value["a"], "http://x/*y*/");
        assert_eq!(value["b"], serde_json::json!([1, 2]));
    }

    #[test]
    fn reads_the_build_and_notes_what_rover_does_not_apply() {
        let config = parse_devcontainer(
            r#"{ "build": { "dockerfile": "Dockerfile", "context": ".." },
                 "postCreateCommand": "pip install -r requirements.txt",
                 "postStartCommand": "echo hi", "forwardPorts": [8000] }"#,
        )
        .expect("supported");
        assert_eq!(config.dockerfile.as_deref(), Some("Dockerfile"));
        assert_eq!(config.context.as_deref(), Some(".."));
        assert_eq!(config.notes.len(), 2, "{:?}", config.notes);
        assert!(config.notes[0].starts_with("`postStartCommand`"));
        let legacy = parse_devcontainer(r#"{"dockerFile": "D"}"#).expect("older key");
        assert_eq!(legacy.dockerfile.as_deref(), Some("D"));
    }

    #[test]
    fn refuses_features_compose_host_commands_and_nothing_to_build() {
        for (text, word) in [
            (
                r#"{"image":"x","features":{"ghcr.io/devcontainers/features/node:1":{}}}"#,
                "features",
            ),
            (
                r#"{"dockerComposeFile":"c.yml","service":"app"}"#,
                "dockerComposeFile",
            ),
            (
                r#"{"image":"x","initializeCommand":"make"}"#,
                "initializeCommand",
            ),
            (r#"{"name":"nothing"}"#, "neither"),
            ("[1]", "object"),
            ("{", "not JSON"),
        ] {
            let err = parse_devcontainer(text).expect_err(text);
            assert!(err.contains(word), "{text}: {err}");
        }
        // An empty `features` is nothing to refuse.
        assert!(parse_devcontainer(r#"{"image":"x","features":{}}"#).is_ok());
    }
}
