//! Settings of the GitHub subsystem (a section of `rover.json`) and its environment variables.

use serde::Deserialize;

use super::context::ContextSettings;
use super::events::Visibility;
use super::poll::PollSettings;
use super::trust::TrustSettings;

/// The GitHub token.
pub const TOKEN_ENV: &str = "GITHUB_TOKEN";
/// The GitHub token when `GITHUB_TOKEN` is unset.
pub const TOKEN_ENV_FALLBACK: &str = "GH_TOKEN";
/// The REST API base URL (GitHub Enterprise, tests).
pub const API_URL_ENV: &str = "ROVER_GITHUB_API_URL";
/// The REST API base URL when `ROVER_GITHUB_API_URL` is unset.
pub const DEFAULT_API_URL: &str = "https://api.github.com";

/// Everything the GitHub subsystem can be told in `rover.json`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "camelCase")]
pub struct GitHubSettings {
    /// The bot's login: its events are ignored so rover never answers itself. Learned from the
    /// token at start (`GET /user`) when unset.
    pub bot_login: Option<String>,
    /// The slug of the GitHub App whose installation token rover uses: its login is
    /// `<slug>[bot]` (such a token cannot learn it from `GET /user`).
    pub app_slug: Option<String>,
    /// Visibility recorded on GitHub events (public unless configured).
    pub visibility: Visibility,
    /// Human-facing base URL; derived from the API URL when unset.
    pub web_url: Option<String>,
    /// Give up on one request after this many seconds.
    pub request_timeout_secs: u64,
    pub poll: PollSettings,
    pub trust: TrustSettings,
    pub context: ContextSettings,
}

impl Default for GitHubSettings {
    fn default() -> Self {
        Self {
            bot_login: None,
            app_slug: None,
            visibility: Visibility::Public,
            web_url: None,
            request_timeout_secs: 30,
            poll: PollSettings::default(),
            trust: TrustSettings::default(),
            context: ContextSettings::default(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_and_unknown_fields() {
        let s: GitHubSettings =
            serde_json::from_str(r#"{"botLogin":"rover-bot","trust":{"allowLogins":["alice"]}}"#)
                .expect("valid");
        assert_eq!(s.bot_login.as_deref(), Some("rover-bot"));
        assert_eq!(s.visibility, Visibility::Public);
        assert_eq!(s.trust.allow_logins, vec!["alice".to_owned()]);
        assert!(serde_json::from_str::<GitHubSettings>(r#"{"botlogin":"x"}"#).is_err());
    }
}
