//! The proxy server's environment: what the daemon starts its container with (the upstreams,
//! the real credentials, the price table) and how `rover autopilot proxy serve` reads it back.
//! One list of names for both sides.

use std::path::Path;

use super::config::{Credential, ProxyConfig, ProxyPrices, Upstream};
use super::error::ProxyError;

/// The Anthropic API the proxy forwards to (default [`ANTHROPIC_DEFAULT`]).
pub const ANTHROPIC_URL: &str = "ROVER_PROXY_ANTHROPIC_URL";
/// An Anthropic API key the proxy adds as `x-api-key`.
pub const ANTHROPIC_KEY: &str = "ROVER_PROXY_ANTHROPIC_KEY";
/// A Claude subscription's OAuth token, when there is no API key.
pub const ANTHROPIC_OAUTH: &str = "ROVER_PROXY_ANTHROPIC_OAUTH";
/// The OpenAI API (default [`OPENAI_DEFAULT`]).
pub const OPENAI_URL: &str = "ROVER_PROXY_OPENAI_URL";
/// The OpenAI key the proxy adds as a bearer token.
pub const OPENAI_KEY: &str = "ROVER_PROXY_OPENAI_KEY";
/// `autopilot.agent.codexPrices` as JSON (the proxy has no `rover.json`).
pub const CODEX_PRICES: &str = "ROVER_PROXY_CODEX_PRICES";
/// The daemon's wire dir (`<data dir>/daemon/wire`), shared by the proxies of every repository
/// a daemon file serves: set by the daemon in each repository's environment; the sandbox mounts
/// it into the proxy's container at [`DAEMON_DIR_MOUNT`] and names that here.
pub const DAEMON_DIR: &str = "ROVER_PROXY_DAEMON_DIR";
/// Where the proxy's container sees the daemon's wire dir.
pub const DAEMON_DIR_MOUNT: &str = "/rover-daemon";

pub const ANTHROPIC_DEFAULT: &str = "https://api.anthropic.com";
pub const OPENAI_DEFAULT: &str = "https://api.openai.com/v1";

fn non_empty(value: Option<String>) -> Option<String> {
    value.filter(|v| !v.trim().is_empty())
}

/// The proxy server's variables, from `get` (rover's own environment: the same variables its
/// host-side agents read): each provider's base URL and the credential the proxy adds.
pub fn server_env(
    get: impl Fn(&str) -> Option<String>,
    codex_prices: &serde_json::Value,
) -> Vec<(String, String)> {
    let get = |name: &str| non_empty(get(name));
    let mut env = vec![
        (
            ANTHROPIC_URL.to_owned(),
            get("ANTHROPIC_BASE_URL").unwrap_or_else(|| ANTHROPIC_DEFAULT.to_owned()),
        ),
        (
            OPENAI_URL.to_owned(),
            get("OPENAI_BASE_URL").unwrap_or_else(|| OPENAI_DEFAULT.to_owned()),
        ),
        (CODEX_PRICES.to_owned(), codex_prices.to_string()),
    ];
    if let Some(key) = get("ANTHROPIC_API_KEY") {
        env.push((ANTHROPIC_KEY.to_owned(), key));
    } else if let Some(token) = get("CLAUDE_CODE_OAUTH_TOKEN") {
        env.push((ANTHROPIC_OAUTH.to_owned(), token));
    }
    if let Some(key) = get("CODEX_API_KEY").or_else(|| get("OPENAI_API_KEY")) {
        env.push((OPENAI_KEY.to_owned(), key));
    }
    if let Some(dir) = get(DAEMON_DIR) {
        env.push((DAEMON_DIR.to_owned(), dir));
    }
    env
}

impl ProxyConfig {
    /// The configuration of a proxy serving `dir`, from the variables of [`server_env`] as
    /// `get` gives them. A provider without a credential is not served.
    pub fn from_env(
        dir: &Path,
        get: impl Fn(&str) -> Option<String>,
    ) -> Result<ProxyConfig, ProxyError> {
        let get = |name: &str| non_empty(get(name));
        let anthropic = get(ANTHROPIC_URL).and_then(|base_url| {
            let credential = get(ANTHROPIC_KEY)
                .map(Credential::ApiKey)
                .or_else(|| get(ANTHROPIC_OAUTH).map(Credential::OAuthToken))?;
            Some(Upstream {
                base_url,
                credential,
            })
        });
        let openai = get(OPENAI_URL).and_then(|base_url| {
            Some(Upstream {
                base_url,
                credential: Credential::ApiKey(get(OPENAI_KEY)?),
            })
        });
        let mut prices = ProxyPrices::default();
        if let Some(table) = get(CODEX_PRICES) {
            prices.openai = serde_json::from_str(&table).map_err(|e| ProxyError::Config {
                reason: format!("{CODEX_PRICES} is not a price table: {e}"),
            })?;
        }
        let config = ProxyConfig {
            dir: dir.to_path_buf(),
            anthropic,
            openai,
            prices,
            daemon_dir: get(DAEMON_DIR).map(std::path::PathBuf::from),
        };
        config.validate()?;
        Ok(config)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_the_daemon_writes_the_proxy_reads_back() {
        let host = |name: &str| match name {
            "ANTHROPIC_BASE_URL" => Some("http://127.0.0.1:9/".to_owned()),
            "CLAUDE_CODE_OAUTH_TOKEN" => Some("oauth-token".to_owned()),
            "OPENAI_API_KEY" => Some("sk-o".to_owned()),
            "CODEX_API_KEY" => Some(" ".to_owned()),
            _ => None,
        };
        let env = server_env(
            host,
            &serde_json::json!({"m": {"inputPerMTok": 1.0, "outputPerMTok": 2.0}}),
        );
        let config = ProxyConfig::from_env(Path::new("/p"), |n| {
            env.iter().find(|(k, _)| k == n).map(|(_, v)| v.clone())
        })
        .expect("valid");
        let anthropic = config.anthropic.expect("anthropic");
        assert_eq!(anthropic.base_url, "http://127.0.0.1:9/");
        assert!(
            matches!(anthropic.credential, Credential::OAuthToken(ref t) if t == "oauth-token")
        );
        let openai = config.openai.expect("openai");
        assert_eq!(openai.base_url, OPENAI_DEFAULT);
        assert!(matches!(openai.credential, Credential::ApiKey(ref k) if k == "sk-o"));
        // No key: the provider is not served.
        let bare = ProxyConfig::from_env(Path::new("/p"), |n| {
            (n == ANTHROPIC_URL).then(|| ANTHROPIC_DEFAULT.to_owned())
        })
        .expect("valid");
        assert!(bare.anthropic.is_none() && bare.openai.is_none());
    }
}
