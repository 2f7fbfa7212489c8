//! The environment an agent process gets: an allow-list, never the GitHub token.

use crate::host_env::HostEnv;

/// Variables passed to every agent when set in rover's environment.
pub const BASE_ALLOWED_ENV: &[&str] = &[
    "PATH",
    "HOME",
    "USER",
    "LANG",
    "LC_ALL",
    "TERM",
    "TMPDIR",
    "TZ",
    "ANTHROPIC_API_KEY",
    "ANTHROPIC_BASE_URL",
    "CLAUDE_CODE_MAX_RETRIES",
    "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC",
    "DISABLE_AUTOUPDATER",
    "OPENAI_API_KEY",
    "OPENAI_BASE_URL",
    "CODEX_API_KEY",
    "CODEX_HOME",
];

/// Variables never passed, even when listed in the settings: GitHub's tokens, and the login of
/// the registry the swarm backend pushes sandbox images to (`autopilot.sandbox.registry`). Also
/// taken out of the environment of every git command and host-side hook rover runs.
pub const ALWAYS_DENIED_ENV: &[&str] = &[
    "GITHUB_TOKEN",
    "GH_TOKEN",
    "GH_ENTERPRISE_TOKEN",
    "GITHUB_ENTERPRISE_TOKEN",
    "ROVER_REGISTRY_USERNAME",
    "ROVER_REGISTRY_PASSWORD",
];

/// The `(name, value)` pairs from rover's environment (`host`) an agent may see: the base
/// allow-list plus `extra` names, minus [`ALWAYS_DENIED_ENV`]. Values holding a GitHub token
/// are dropped.
pub fn agent_env(extra: &[String], host: &HostEnv) -> Vec<(String, String)> {
    let secrets = github_secrets(host);
    let allowed = |name: &str| {
        !ALWAYS_DENIED_ENV.contains(&name)
            && (BASE_ALLOWED_ENV.contains(&name) || extra.iter().any(|e| e == name))
    };
    host.vars()
        .filter(|(name, value)| {
            allowed(name) && !secrets.iter().any(|secret| value.contains(secret.as_str()))
        })
        .map(|(name, value)| (name.to_owned(), value.to_owned()))
        .collect()
}

/// Values of the denied variables in `host`, when long enough to be real secrets.
fn github_secrets(host: &HostEnv) -> Vec<String> {
    ALWAYS_DENIED_ENV
        .iter()
        .filter_map(|name| host.var(name))
        .filter(|value| value.len() >= 8)
        .collect()
}

/// Replaces any value of a denied variable of `host` (a GitHub token, the registry's login)
/// found in `text` (e.g. pasted into an issue) with a marker.
pub fn redact_secrets(text: &str, host: &HostEnv) -> String {
    let mut out = text.to_owned();
    for secret in github_secrets(host) {
        if out.contains(&secret) {
            out = out.replace(&secret, "[redacted by rover]");
        }
    }
    out
}

/// The key variable `codex exec` reads (0.169 ignores `OPENAI_API_KEY`).
pub const CODEX_API_KEY: &str = "CODEX_API_KEY";
/// The usual OpenAI key variable; rover passes its value to codex as [`CODEX_API_KEY`].
pub const OPENAI_API_KEY: &str = "OPENAI_API_KEY";
/// A base URL for the OpenAI API; codex ignores it as a variable, so rover hands it to codex
/// as the `openai_base_url` config value.
pub const OPENAI_BASE_URL: &str = "OPENAI_BASE_URL";

/// The non-empty value of `name` in an env list.
pub fn env_value<'a>(env: &'a [(String, String)], name: &str) -> Option<&'a str> {
    env.iter()
        .rev()
        .find(|(n, _)| n == name)
        .map(|(_, v)| v.as_str())
        .filter(|v| !v.trim().is_empty())
}

/// Gives codex its key the way it reads it: when `CODEX_API_KEY` is unset (or empty) and
/// `OPENAI_API_KEY` is set, its value is added as `CODEX_API_KEY`. Returns whether it did.
pub fn map_codex_key(env: &mut Vec<(String, String)>) -> bool {
    if env_value(env, CODEX_API_KEY).is_some() {
        return false;
    }
    let Some(key) = env_value(env, OPENAI_API_KEY).map(str::to_owned) else {
        return false;
    };
    env.retain(|(n, _)| n != CODEX_API_KEY);
    env.push((CODEX_API_KEY.to_owned(), key));
    true
}

/// Where codex keeps its login and config: `CODEX_HOME`, else `~/.codex`.
pub fn codex_home(env: &[(String, String)]) -> Option<std::path::PathBuf> {
    env_value(env, "CODEX_HOME")
        .map(std::path::PathBuf::from)
        .or_else(|| env_value(env, "HOME").map(|home| std::path::Path::new(home).join(".codex")))
}

/// What codex will authenticate with, given the env it gets (before [`map_codex_key`]), or
/// why it has nothing. Costs no model call: it looks at variables and files only (blocking).
///
/// A `model_provider` named in `$CODEX_HOME/config.toml` brings its own key variable, which
/// rover does not know: that counts as configured.
pub fn codex_credentials(env: &[(String, String)]) -> Result<String, String> {
    if env_value(env, CODEX_API_KEY).is_some() {
        return Ok(CODEX_API_KEY.to_owned());
    }
    if env_value(env, OPENAI_API_KEY).is_some() {
        return Ok(format!(
            "{OPENAI_API_KEY} (passed to codex as {CODEX_API_KEY})"
        ));
    }
    let Some(home) = codex_home(env) else {
        return Err(format!(
            "{CODEX_API_KEY} and {OPENAI_API_KEY} are unset, and neither CODEX_HOME nor HOME is set to find a `codex login`"
        ));
    };
    let auth = home.join("auth.json");
    if auth.is_file() {
        return Ok(format!("the codex login in {}", auth.display()));
    }
    let config = home.join("config.toml");
    if let Some(provider) = std::fs::read_to_string(&config)
        .ok()
        .and_then(|text| top_level_value(&text, "model_provider"))
    {
        return Ok(format!(
            "model_provider {provider} from {} (its key is not checked by rover)",
            config.display()
        ));
    }
    Err(format!(
        "{CODEX_API_KEY} and {OPENAI_API_KEY} are unset and {} does not exist",
        auth.display()
    ))
}

/// The raw value of a top-level `key = value` line of a TOML text (before any `[table]`).
fn top_level_value(text: &str, key: &str) -> Option<String> {
    for line in text.lines() {
        let line = line.trim();
        if line.starts_with('[') {
            return None;
        }
        let Some((name, value)) = line.split_once('=') else {
            continue;
        };
        if name.trim() == key {
            return Some(value.trim().to_owned());
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pairs(list: &[(&str, &str)]) -> Vec<(String, String)> {
        list.iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn openai_key_alone_is_passed_as_codex_key() {
        let mut env = pairs(&[("PATH", "/bin"), ("OPENAI_API_KEY", "sk-openai")]);
        assert!(map_codex_key(&mut env));
        assert_eq!(env_value(&env, CODEX_API_KEY), Some("sk-openai"));
        assert_eq!(env_value(&env, OPENAI_API_KEY), Some("sk-openai"));
    }

    #[test]
    fn an_own_codex_key_wins_and_empty_values_count_as_unset() {
        let mut env = pairs(&[
            ("OPENAI_API_KEY", "sk-openai"),
            ("CODEX_API_KEY", "sk-codex"),
        ]);
        assert!(!map_codex_key(&mut env));
        assert_eq!(env_value(&env, CODEX_API_KEY), Some("sk-codex"));
        let mut empty = pairs(&[("OPENAI_API_KEY", "sk-openai"), ("CODEX_API_KEY", "")]);
        assert!(map_codex_key(&mut empty));
        assert_eq!(
            empty.iter().filter(|(n, _)| n == CODEX_API_KEY).count(),
            1,
            "{empty:?}"
        );
        assert_eq!(env_value(&empty, CODEX_API_KEY), Some("sk-openai"));
        let mut none = pairs(&[("OPENAI_API_KEY", " ")]);
        assert!(!map_codex_key(&mut none));
    }

    #[test]
    fn codex_credentials_name_what_is_used_or_what_to_set() {
        let dir = tempfile::tempdir().expect("tempdir");
        let home = dir.path().display().to_string();
        assert_eq!(
            codex_credentials(&pairs(&[("CODEX_API_KEY", "k"), ("OPENAI_API_KEY", "o")])),
            Ok("CODEX_API_KEY".to_owned())
        );
        assert!(codex_credentials(&pairs(&[("OPENAI_API_KEY", "o")]))
            .expect("key")
            .contains("passed to codex as CODEX_API_KEY"));
        let missing = codex_credentials(&pairs(&[("CODEX_HOME", &home)])).expect_err("none");
        assert!(missing.contains("auth.json does not exist"), "{missing}");
        // `HOME` alone means `~/.codex`.
        let codex_dir = dir.path().join(".codex");
        std::fs::create_dir_all(&codex_dir).expect("mkdir");
        std::fs::write(codex_dir.join("auth.json"), "{}").expect("write");
        let login = codex_credentials(&pairs(&[("HOME", &home)])).expect("login");
        assert!(login.contains(".codex/auth.json"), "{login}");
        // A custom provider brings its own key.
        std::fs::write(
            dir.path().join("config.toml"),
            "model = \"m\"\nmodel_provider = \"local\"\n[model_providers.local]\nenv_key = \"X\"\n",
        )
        .expect("write");
        let provider = codex_credentials(&pairs(&[("CODEX_HOME", &home)])).expect("provider");
        assert!(provider.contains("model_provider \"local\""), "{provider}");
        std::fs::write(
            dir.path().join("config.toml"),
            "[profiles.x]\nmodel_provider = \"local\"\n",
        )
        .expect("write");
        assert!(codex_credentials(&pairs(&[("CODEX_HOME", &home)])).is_err());
    }
}
