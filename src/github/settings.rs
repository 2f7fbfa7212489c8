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
    /// The slug of the GitHub App whose installation token rover is given in `GITHUB_TOKEN`:
    /// its login is `<slug>[bot]` (such a token cannot learn it from `GET /user`). Not needed
    /// with `appId`, which learns it from `GET /app`.
    pub app_slug: Option<String>,
    /// The GitHub App rover runs as: with its private key (a file named by
    /// `ROVER_GITHUB_APP_KEY_FILE`), rover mints and renews installation tokens itself.
    pub app_id: Option<u64>,
    /// The app's installation on the repository; looked up with the app's JWT when unset.
    pub installation_id: Option<u64>,
    /// Reactions: 👀 on what rover picks up, and a stop reaction on rover's posts.
    pub reactions: ReactionSettings,
    /// `/rover` commands on the thread.
    pub commands: CommandSettings,
    /// What rover does with its change when the work is about someone else's pull request.
    pub contributor_prs: ContributorPrs,
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
            app_id: None,
            installation_id: None,
            reactions: ReactionSettings::default(),
            commands: CommandSettings::default(),
            contributor_prs: ContributorPrs::default(),
            visibility: Visibility::Public,
            web_url: None,
            request_timeout_secs: 30,
            poll: PollSettings::default(),
            trust: TrustSettings::default(),
            context: ContextSettings::default(),
        }
    }
}

/// Where rover's change goes when a trace works on a person's pull request (a review asking
/// for changes, a comment asking rover to fix something on it). Never a second pull request
/// into the default branch carrying the person's commits.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum ContributorPrs {
    /// A pull request from rover's branch whose base is the person's head branch (a branch of
    /// this repository); the person merges it into theirs.
    #[default]
    Propose,
    /// rover's commits pushed onto the person's head branch (a branch of this repository),
    /// never forced; the person's pull request then carries them.
    Push,
}

/// What reactions rover leaves and heeds (`content` names: `+1 -1 laugh confused heart
/// hooray rocket eyes`).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "camelCase")]
pub struct ReactionSettings {
    /// Left on an issue, comment or review rover picks up and on a command it takes; `null`:
    /// none.
    pub acknowledge: Option<String>,
    /// Left by a trusted person on rover's pull request or comment, it stops the trace that
    /// made it; `null`: reactions stop nothing (and nothing is polled).
    pub stop: Option<String>,
    /// How often the posts of running traces are looked at for the stop reaction (seconds).
    pub poll_secs: u64,
}

impl Default for ReactionSettings {
    fn default() -> Self {
        Self {
            acknowledge: Some("eyes".into()),
            stop: Some("-1".into()),
            poll_secs: 60,
        }
    }
}

impl ReactionSettings {
    /// Each configured reaction is one GitHub knows.
    pub fn validate(&self) -> Result<(), String> {
        for (key, value) in [("acknowledge", &self.acknowledge), ("stop", &self.stop)] {
            if let Some(v) = value {
                if !super::reactions::CONTENTS.contains(&v.as_str()) {
                    return Err(format!(
                        "autopilot.github.reactions.{key} is {v:?}: use one of {} (or null for none)",
                        super::reactions::CONTENTS.join(" ")
                    ));
                }
            }
        }
        Ok(())
    }
}

/// `/rover` commands.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "camelCase")]
pub struct CommandSettings {
    /// Whether comments starting with `/rover` are commands (otherwise they are events like
    /// any comment).
    pub enabled: bool,
    /// At most one refusal (an unknown command, an untrusted author) is answered per author in
    /// this many seconds; the others are recorded only.
    pub refusal_interval_secs: u64,
}

impl Default for CommandSettings {
    fn default() -> Self {
        Self {
            enabled: true,
            refusal_interval_secs: 3600,
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
