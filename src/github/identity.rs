//! Who rover is on GitHub: the login its pushes, pull requests and comments carry, so that
//! they are never taken for new work.
//!
//! `github.botLogin` wins when configured. Running as a GitHub App (`github.appId`), it is the
//! app's `<slug>[bot]`, the slug read with the app's JWT (`GET /app`). Otherwise the login is
//! learned from the token at start (`GET /user`). An installation token of a GitHub App has no user (`GET /user` answers
//! 403, and `GET /app` needs the app's own JWT), so then `github.appSlug` names the bot as
//! `<slug>[bot]`. Whatever is decided is said on the console and in the log.

use super::error::GitHubError;

/// Where rover's own login came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BotIdentity {
    /// `github.botLogin` in `rover.json`.
    Configured(String),
    /// `GET /user` with the token.
    Learned(String),
    /// The token has no user (a GitHub App installation token): `<appSlug>[bot]`.
    App(String),
    /// rover runs as the GitHub App `github.appId`: `<slug>[bot]`, the slug from `GET /app`.
    FromApp(String),
    /// Not known: only rover's footer marker tells its posts apart. Says why.
    Unknown(String),
}

impl BotIdentity {
    /// The login, when known.
    pub fn login(&self) -> Option<&str> {
        match self {
            Self::Configured(l) | Self::Learned(l) | Self::App(l) | Self::FromApp(l) => Some(l),
            Self::Unknown(_) => None,
        }
    }

    /// One line for the console and the log.
    pub fn describe(&self) -> String {
        match self {
            Self::Configured(l) => format!("rover acts as {l} (github.botLogin)"),
            Self::Learned(l) => format!("rover acts as {l} (the token's user, from GET /user)"),
            Self::App(l) => format!(
                "rover acts as {l} (github.appSlug: the token has no user, as an app installation token)"
            ),
            Self::FromApp(l) => {
                format!("rover acts as {l} (the GitHub App github.appId, its slug from GET /app)")
            }
            Self::Unknown(why) => format!(
                "rover does not know its own login ({why}); only the marker in its posts tells them apart: set github.botLogin or github.appSlug in rover.json"
            ),
        }
    }
}

fn nonempty(s: Option<&str>) -> Option<&str> {
    s.map(str::trim).filter(|s| !s.is_empty())
}

/// Decide the identity from the configuration and, when `botLogin` is not configured, the
/// answer to `GET /user` (`learned`, `None` when it was not asked).
pub fn resolve(
    bot_login: Option<&str>,
    app_slug: Option<&str>,
    learned: Option<Result<String, GitHubError>>,
) -> BotIdentity {
    if let Some(login) = nonempty(bot_login) {
        return BotIdentity::Configured(login.to_owned());
    }
    let app = nonempty(app_slug).map(|slug| {
        let slug = slug.trim_end_matches("[bot]");
        format!("{slug}[bot]")
    });
    match learned {
        Some(Ok(login)) if !login.trim().is_empty() => {
            BotIdentity::Learned(login.trim().to_owned())
        }
        Some(Ok(_)) => app.map_or_else(
            || BotIdentity::Unknown("GET /user answered without a login".into()),
            BotIdentity::App,
        ),
        Some(Err(e)) => app.map_or_else(
            || {
                BotIdentity::Unknown(format!(
                    "{}{}",
                    crate::error::error_chain(&e),
                    if matches!(e, GitHubError::Forbidden { .. }) {
                        "; a GitHub App installation token has no user"
                    } else {
                        ""
                    }
                ))
            },
            BotIdentity::App,
        ),
        None => app.map_or_else(
            || BotIdentity::Unknown("it was not looked up".into()),
            BotIdentity::App,
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn forbidden() -> GitHubError {
        GitHubError::Forbidden {
            what: "the token's user".into(),
            message: "Resource not accessible by integration".into(),
        }
    }

    #[test]
    fn the_configured_login_wins_then_the_learned_one_then_the_app() {
        assert_eq!(
            resolve(Some("cfg-bot"), Some("app"), Some(Ok("me".into()))),
            BotIdentity::Configured("cfg-bot".into())
        );
        assert_eq!(
            resolve(Some("  "), Some("app"), Some(Ok("me".into()))),
            BotIdentity::Learned("me".into())
        );
        assert_eq!(
            resolve(None, Some("rover-app"), Some(Err(forbidden()))),
            BotIdentity::App("rover-app[bot]".into())
        );
        assert_eq!(
            resolve(None, Some("rover-app[bot]"), None).login(),
            Some("rover-app[bot]")
        );
    }

    #[test]
    fn an_unknown_identity_says_why_and_what_to_set() {
        let id = resolve(None, None, Some(Err(forbidden())));
        assert_eq!(id.login(), None);
        let text = id.describe();
        assert!(text.contains("installation token has no user"), "{text}");
        assert!(
            text.contains("set github.botLogin or github.appSlug"),
            "{text}"
        );
    }
}
