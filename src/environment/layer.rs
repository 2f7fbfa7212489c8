//! What rover adds to a repository's environment: the agent CLIs copied from
//! `autopilot.sandbox.image`, git when the image lacks it, and the settings its containers
//! expect (`HOME=/tmp`, `IS_SANDBOX=1`, ...); and the dev container definition rover writes for
//! a setup script or setup commands, so every environment is built the same way.

use std::fmt::Write as _;

use super::definition::SETUP_SCRIPT;

/// The Dockerfile of rover's layer over `base` (the environment after its setup). With
/// `agents`, the agent CLIs are copied from that image (claude's executable, codex's directory
/// when it has one); without, `base` has them already. `labels` are set on the image.
pub fn rover_layer(base: &str, agents: Option<&str>, labels: &[(&str, &str)]) -> String {
    let mut text = String::from(
        "# rover's layer over a repository's environment (generated; see docs/sandbox.md)\n",
    );
    if let Some(agents) = agents {
        let _ = write!(
            text,
            "FROM {agents} AS rover-agents\n\
             RUN mkdir -p /rover-agents/bin /rover-agents/codex \\\n \
             && cp -L \"$(command -v claude)\" /rover-agents/bin/claude \\\n \
             && if [ -d /opt/codex ]; then cp -a /opt/codex/. /rover-agents/codex/; fi\n\n"
        );
    }
    let _ = writeln!(text, "FROM {base}\nUSER root");
    if agents.is_some() {
        text.push_str(
            "COPY --from=rover-agents /rover-agents/bin/claude /usr/local/bin/claude\n\
             COPY --from=rover-agents /rover-agents/codex /opt/codex\n\
             RUN if [ -x /opt/codex/bin/codex ]; then ln -sf /opt/codex/bin/codex /usr/local/bin/codex; fi\n",
        );
    }
    text.push_str(
        "RUN if ! command -v git >/dev/null 2>&1; then \\\n  \
         { apt-get update && apt-get install -y --no-install-recommends git && rm -rf /var/lib/apt/lists/*; } \\\n  \
         || echo 'rover: this image has no git and rover could not install it: git in the sandbox will fail' >&2; \\\n\
         fi\n\
         ENV HOME=/tmp IS_SANDBOX=1 DISABLE_AUTOUPDATER=1 CI=true PATH=$PATH:/opt/codex/codex-path\n\
         WORKDIR /workspace\n\
         ENTRYPOINT []\n\
         CMD [\"claude\", \"--version\"]\n",
    );
    let labels: Vec<String> = labels
        .iter()
        .map(|(k, v)| format!("{k}={}", serde_json::Value::String((*v).to_owned())))
        .collect();
    // The setup container's labels came with its commit: blanked, so no container of this
    // image is taken for a build of a store's (see `sandbox::leftovers`).
    let blank = [
        super::LABEL_ENV_BUILD,
        crate::sandbox::leftovers::LABEL_STORE,
        crate::sandbox::leftovers::LABEL_HOST,
    ]
    .map(|name| format!("{name}=\"\""))
    .join(" ");
    let _ = writeln!(
        text,
        "LABEL rover.image=\"env\" {blank} {}",
        labels.join(" ")
    );
    text
}

/// The dev container definition rover builds a setup script or setup commands with: `image`
/// (`autopilot.sandbox.image`), the setup as its `onCreateCommand`, run from the default
/// branch's files.
pub fn setup_config(image: &str, commands: &[String]) -> String {
    let script = if commands.is_empty() {
        format!("set -e\nsh {SETUP_SCRIPT}")
    } else {
        format!("set -e\n{}", commands.join("\n"))
    };
    serde_json::to_string_pretty(&serde_json::json!({
        "name": "rover-setup",
        "image": image,
        "onCreateCommand": script,
    }))
    .expect("a JSON value serializes")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_layer_copies_the_agents_only_from_another_image() {
        let with = rover_layer("env:1", Some("agents:1"), &[("rover.env.hash", "ab")]);
        assert!(with.starts_with("# rover's layer"));
        assert!(with.contains("FROM agents:1 AS rover-agents"));
        assert!(with
            .contains("COPY --from=rover-agents /rover-agents/bin/claude /usr/local/bin/claude"));
        assert!(with.contains("ENTRYPOINT []"));
        assert!(with.contains(
            "LABEL rover.image=\"env\" rover.env.build=\"\" rover.store=\"\" rover.host=\"\" rover.env.hash=\"ab\""
        ));
        let without = rover_layer("env:1", None, &[]);
        assert!(!without.contains("rover-agents"));
        assert!(without.contains("ENV HOME=/tmp IS_SANDBOX=1"));
    }

    #[test]
    fn setup_runs_the_script_or_the_commands() {
        let script: serde_json::Value =
            serde_json::from_str(&setup_config("sb:1", &[])).expect("json");
        assert_eq!(script["image"], "sb:1");
        assert_eq!(script["onCreateCommand"], "set -e\nsh .rover/setup.sh");
        let commands: serde_json::Value =
            serde_json::from_str(&setup_config("sb:1", &["a".into(), "b c".into()])).expect("json");
        assert_eq!(commands["onCreateCommand"], "set -e\na\nb c");
    }
}
