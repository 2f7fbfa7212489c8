//! The environment an agent process gets: an allow-list, never the GitHub token.

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

/// Variables never passed, even when listed in the settings.
pub const ALWAYS_DENIED_ENV: &[&str] = &[
    "GITHUB_TOKEN",
    "GH_TOKEN",
    "GH_ENTERPRISE_TOKEN",
    "GITHUB_ENTERPRISE_TOKEN",
];

/// The `(name, value)` pairs from rover's environment an agent may see: the base allow-list
/// plus `extra` names, minus [`ALWAYS_DENIED_ENV`]. Values holding a GitHub token are dropped.
pub fn agent_env(extra: &[String]) -> Vec<(String, String)> {
    let secrets = github_secrets();
    let allowed = |name: &str| {
        !ALWAYS_DENIED_ENV.contains(&name)
            && (BASE_ALLOWED_ENV.contains(&name) || extra.iter().any(|e| e == name))
    };
    std::env::vars_os()
        .filter_map(|(name, value)| Some((name.into_string().ok()?, value.into_string().ok()?)))
        .filter(|(name, value)| {
            allowed(name) && !secrets.iter().any(|secret| value.contains(secret.as_str()))
        })
        .collect()
}

/// Values of the GitHub token variables, when long enough to be real secrets.
fn github_secrets() -> Vec<String> {
    ALWAYS_DENIED_ENV
        .iter()
        .filter_map(|name| std::env::var(name).ok())
        .filter(|value| value.len() >= 8)
        .collect()
}

/// Replaces any GitHub token value found in `text` (e.g. pasted into an issue) with a marker.
pub fn redact_secrets(text: &str) -> String {
    let mut out = text.to_owned();
    for secret in github_secrets() {
        if out.contains(&secret) {
            out = out.replace(&secret, "[redacted by rover]");
        }
    }
    out
}
