//! Running as a GitHub App: the app's JWT (RS256, made by octocrab's `create_jwt` from the
//! private key at each request), its bot login from `GET /app` (`<slug>[bot]`), the
//! installation on the watched repository (`GET /repos/{owner}/{repo}/installation`, or
//! `github.installationId`), and installation tokens (`POST /app/installations/{id}/access_tokens`)
//! minted by rover and renewed before they expire.
//!
//! rover mints the tokens itself rather than through octocrab's installation client, which
//! renews its cached token inside a request (and again after a 401) where rover cannot see it:
//! every token must be held by the redactor and the push scan from the moment it exists, and the
//! same token must reach `git push`. Each token is scoped to the one repository rover watches.

use std::path::{Path, PathBuf};
use std::time::Duration;

use chrono::{DateTime, TimeDelta, Utc};
use http::Method;
use octocrab::Octocrab;
use serde::Deserialize;
use serde_json::{json, Value};

use super::api::RepoRef;
use super::error::GitHubError;
use super::octo::check_status;
use super::poll::ResponseMeta;
use crate::host_env::HostEnv;
use crate::secrets::LiveSecrets;

/// The path of the app's private key (the `.pem` file GitHub generated).
pub const APP_KEY_ENV: &str = "ROVER_GITHUB_APP_KEY_FILE";
/// The name installation tokens are held under (redaction, push scan).
pub const INSTALLATION_TOKEN_NAME: &str = "GITHUB_APP_INSTALLATION_TOKEN";

/// A token is renewed this long before it expires at the most (GitHub's last an hour)...
const MAX_RENEW_MARGIN: TimeDelta = TimeDelta::minutes(5);
/// ...and at least this share of its life before (for short-lived tokens).
const RENEW_SHARE: i32 = 3;

/// How many of the latest installation tokens stay held (about two days of hourly tokens).
const HELD_TOKENS: usize = 48;

/// How long a token is kept when this machine's clock says it expired before it was minted.
const CLOCK_SKEW_REUSE: TimeDelta = TimeDelta::seconds(60);

/// The key file named by `ROVER_GITHUB_APP_KEY_FILE` in `host`, when set.
pub fn key_path_from_env(host: &HostEnv) -> Option<PathBuf> {
    host.var_os(APP_KEY_ENV)
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
}

/// The private key's text, read from `path`.
pub fn read_key(path: &Path) -> Result<String, GitHubError> {
    std::fs::read_to_string(path).map_err(|e| GitHubError::AppKey {
        path: path.to_owned(),
        detail: format!("cannot read it: {e}"),
    })
}

/// Holds the key (whole, and each line of its body, so a part of it is caught too).
pub fn hold_key(secrets: &LiveSecrets, pem: &str) {
    secrets.add(APP_KEY_ENV, pem);
    for line in pem.lines().map(str::trim) {
        if !line.starts_with("-----") && line.len() >= 16 {
            secrets.add(APP_KEY_ENV, line);
        }
    }
}

/// The app's signing key, from the PEM text of the file at `key_path`.
pub(super) fn encoding_key(
    key_path: &Path,
    pem: &str,
) -> Result<octocrab::EncodingKey, GitHubError> {
    octocrab::EncodingKey::from_rsa_pem(pem.as_bytes()).map_err(|e| GitHubError::AppKey {
        path: key_path.to_owned(),
        detail: format!("not an RSA private key in PEM form ({e})"),
    })
}

/// `GET /app`, as much as rover reads.
#[derive(Deserialize)]
struct RawApp {
    #[serde(default)]
    slug: String,
}

/// `GET /repos/{owner}/{repo}/installation`, as much as rover reads.
#[derive(Deserialize)]
struct RawInstallation {
    id: u64,
}

/// `POST /app/installations/{id}/access_tokens`, as much as rover reads.
#[derive(Deserialize)]
struct RawToken {
    token: String,
    expires_at: DateTime<Utc>,
}

/// When to replace a token that expires at `expires_at`, minted `now`: a third of its life
/// before it expires, at most [`MAX_RENEW_MARGIN`] before. A token already expired by this
/// machine's clock (the clock is off: GitHub's decides) is kept a minute rather than replaced
/// at every request.
fn renew_at(expires_at: DateTime<Utc>, now: DateTime<Utc>) -> DateTime<Utc> {
    let life = expires_at - now;
    if life > TimeDelta::zero() {
        expires_at - (life / RENEW_SHARE).min(MAX_RENEW_MARGIN)
    } else {
        tracing::warn!(
            %expires_at,
            "a new installation token is already expired by this machine's clock: is the clock right?"
        );
        now + CLOCK_SKEW_REUSE
    }
}

/// An installation token and when to replace it.
struct Minted {
    token: String,
    expires_at: DateTime<Utc>,
    renew_at: DateTime<Utc>,
}

/// The app, its installation on the repository, and its current installation token.
pub struct AppTokens {
    /// Authenticated with the app's JWT.
    app: Octocrab,
    app_id: u64,
    slug: String,
    installation_id: u64,
    repo: RepoRef,
    timeout: Duration,
    // tokio Mutex: held across the minting request, so concurrent callers wait for one mint.
    current: tokio::sync::Mutex<Option<Minted>>,
    // std Mutex: pushed to and read, never held across an await.
    minted: std::sync::Mutex<Vec<String>>,
    secrets: LiveSecrets,
}

impl std::fmt::Debug for AppTokens {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AppTokens")
            .field("app_id", &self.app_id)
            .field("slug", &self.slug)
            .field("installation_id", &self.installation_id)
            .finish_non_exhaustive()
    }
}

/// Where the app is, what it is, and how long to wait for GitHub.
#[derive(Debug, Clone)]
pub struct AppSettings<'a> {
    pub api_url: &'a str,
    pub app_id: u64,
    /// The installation, when configured (`github.installationId`); looked up otherwise.
    pub installation_id: Option<u64>,
    pub repo: &'a RepoRef,
    pub timeout: Duration,
}

impl AppTokens {
    /// Authenticate as the app with `pem`, learn its slug, find (or take) its installation on
    /// the repository and mint a first token: a wrong key, app id or installation fails here,
    /// with what to check. Every token minted is held by `secrets` from then on.
    pub async fn connect(
        settings: &AppSettings<'_>,
        key_path: &Path,
        pem: &str,
        secrets: LiveSecrets,
    ) -> Result<AppTokens, GitHubError> {
        let key = encoding_key(key_path, pem)?;
        let app = client(
            settings.api_url,
            settings.timeout,
            Auth::App(settings.app_id, key),
        )?;
        let mut tokens = AppTokens {
            app,
            app_id: settings.app_id,
            slug: String::new(),
            installation_id: settings.installation_id.unwrap_or_default(),
            repo: settings.repo.clone(),
            timeout: settings.timeout,
            current: tokio::sync::Mutex::new(None),
            minted: std::sync::Mutex::new(Vec::new()),
            secrets,
        };
        let about: RawApp = tokens
            .call("the app (GET /app)", Method::GET, "/app")
            .await?;
        if about.slug.trim().is_empty() {
            return Err(GitHubError::Malformed {
                what: "the app (GET /app)".into(),
                detail: "no slug".into(),
            });
        }
        tokens.slug = about.slug.trim().to_owned();
        if settings.installation_id.is_none() {
            let what = format!("the app's installation on {}", settings.repo);
            let path = format!(
                "/repos/{}/{}/installation",
                settings.repo.owner, settings.repo.name
            );
            let found: RawInstallation = match tokens.call(&what, Method::GET, &path).await {
                Err(GitHubError::NotFound { .. }) => {
                    return Err(GitHubError::NotInstalled {
                        app: tokens.slug.clone(),
                        repo: settings.repo.to_string(),
                    })
                }
                other => other?,
            };
            tokens.installation_id = found.id;
        }
        tokens.token().await?;
        Ok(tokens)
    }

    /// The bot's login: `<slug>[bot]`.
    pub fn bot_login(&self) -> String {
        format!("{}[bot]", self.slug)
    }

    pub fn app_id(&self) -> u64 {
        self.app_id
    }

    pub fn installation_id(&self) -> u64 {
        self.installation_id
    }

    /// An installation token with more than its renewal margin left: the current one, or a new
    /// one minted now.
    pub async fn token(&self) -> Result<String, GitHubError> {
        let mut current = self.current.lock().await;
        if let Some(m) = current.as_ref() {
            if Utc::now() < m.renew_at {
                return Ok(m.token.clone());
            }
        }
        let minted = self.mint().await?;
        let token = minted.token.clone();
        tracing::info!(
            installation = self.installation_id,
            expires_at = %minted.expires_at,
            renew_at = %minted.renew_at,
            "minted a GitHub App installation token"
        );
        *current = Some(minted);
        Ok(token)
    }

    /// GitHub refused `token` (401): forget it if it is the current one. Whether a new one may
    /// help (the refused one was current, or has already been replaced).
    pub async fn forget(&self, token: &str) -> bool {
        let mut current = self.current.lock().await;
        if current.as_ref().is_some_and(|m| m.token == token) {
            *current = None;
        }
        true
    }

    /// Every installation token minted so far.
    pub fn minted(&self) -> Vec<String> {
        self.minted
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    async fn mint(&self) -> Result<Minted, GitHubError> {
        let what = format!(
            "an installation token of installation {}",
            self.installation_id
        );
        let path = format!("/app/installations/{}/access_tokens", self.installation_id);
        let body = json!({"repositories": [self.repo.name]});
        let raw: RawToken = match self.call_with(&what, Method::POST, &path, Some(&body)).await {
            Err(GitHubError::NotFound { .. }) => {
                return Err(GitHubError::Config {
                    what: "github.installationId".into(),
                    detail: format!(
                        "installation {} is not one of app {}'s (404): use the id from the installation's settings page, or remove it to have it looked up",
                        self.installation_id, self.app_id
                    ),
                })
            }
            other => other?,
        };
        // Held before anything else sees it; the oldest, expired for a day or more, let go (a
        // daemon running for months would otherwise scan thousands of dead tokens in every
        // message).
        self.secrets.add(INSTALLATION_TOKEN_NAME, &raw.token);
        {
            let mut minted = self
                .minted
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            minted.push(raw.token.clone());
            while minted.len() > HELD_TOKENS {
                let old = minted.remove(0);
                self.secrets.remove(&old);
            }
        }
        let renew_at = renew_at(raw.expires_at, Utc::now());
        Ok(Minted {
            token: raw.token,
            expires_at: raw.expires_at,
            renew_at,
        })
    }

    async fn call<T: serde::de::DeserializeOwned>(
        &self,
        what: &str,
        method: Method,
        path: &str,
    ) -> Result<T, GitHubError> {
        self.call_with(what, method, path, None).await
    }

    /// One request with the app's JWT; a 401 means GitHub refused the JWT itself.
    async fn call_with<T: serde::de::DeserializeOwned>(
        &self,
        what: &str,
        method: Method,
        path: &str,
        body: Option<&Value>,
    ) -> Result<T, GitHubError> {
        let call = Call {
            client: &self.app,
            app_id: self.app_id,
            timeout: self.timeout,
        };
        call.send(what, method, path, body).await.map(|(v, _)| v)
    }
}

/// How a client made by [`client`] authenticates.
pub(super) enum Auth {
    /// As the app `id`, with a JWT signed by its key.
    App(u64, octocrab::EncodingKey),
    /// With an installation token.
    Installation(String),
}

/// A client for the REST API at `api_url` that never retries on its own.
pub(super) fn client(
    api_url: &str,
    timeout: Duration,
    auth: Auth,
) -> Result<Octocrab, GitHubError> {
    let config_err = |detail: String| GitHubError::Config {
        what: format!("api url {api_url}"),
        detail,
    };
    let builder = Octocrab::builder()
        .base_uri(api_url.trim_end_matches('/'))
        .map_err(|e| config_err(format!("not a url: {e}")))?;
    let builder = match auth {
        Auth::App(id, key) => builder.app(octocrab::models::AppId(id), key),
        Auth::Installation(token) => builder.personal_token(token),
    };
    builder
        .add_retry_config(octocrab::service::middleware::retry::RetryConfig::None)
        .set_connect_timeout(Some(timeout * 2))
        .set_read_timeout(Some(timeout * 2))
        .add_header(
            http::header::ACCEPT,
            "application/vnd.github+json".to_owned(),
        )
        .build()
        .map_err(|e| config_err(format!("could not build the http client: {e}")))
}

/// One request of the app's (with its JWT, or with a token it minted): a 401 means GitHub
/// refused the app's credentials.
pub(super) struct Call<'a> {
    pub client: &'a Octocrab,
    pub app_id: u64,
    pub timeout: Duration,
}

impl Call<'_> {
    /// The answer, read as `T`, and its headers (the `Link` of a page).
    pub(super) async fn send<T: serde::de::DeserializeOwned>(
        &self,
        what: &str,
        method: Method,
        path: &str,
        body: Option<&Value>,
    ) -> Result<(T, ResponseMeta), GitHubError> {
        let request = async {
            let response = if method == Method::POST {
                self.client._post(path, body).await
            } else {
                self.client._get(path).await
            }?;
            let meta = ResponseMeta::from_headers(response.status().as_u16(), response.headers());
            let text = self.client.body_to_string(response).await?;
            Ok::<_, octocrab::Error>((meta, text))
        };
        let (meta, text) = match tokio::time::timeout(self.timeout, request).await {
            Ok(Ok(pair)) => pair,
            Ok(Err(source)) => {
                return Err(GitHubError::Transport {
                    what: what.to_owned(),
                    source,
                })
            }
            Err(_) => {
                return Err(GitHubError::Timeout {
                    what: what.to_owned(),
                    secs: self.timeout.as_secs(),
                })
            }
        };
        if meta.status == 401 {
            return Err(GitHubError::AppRejected {
                what: what.to_owned(),
                app_id: self.app_id,
            });
        }
        check_status(what, &meta, &text, Utc::now())?;
        let value = serde_json::from_str(&text).map_err(|e| GitHubError::Malformed {
            what: what.to_owned(),
            detail: e.to_string(),
        })?;
        Ok((value, meta))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_is_renewed_a_third_of_its_life_before_it_expires_at_most_five_minutes() {
        let now = DateTime::parse_from_rfc3339("2026-11-25T10:00:00Z")
            .unwrap()
            .with_timezone(&Utc);
        let hour = now + TimeDelta::hours(1);
        assert_eq!(renew_at(hour, now), now + TimeDelta::minutes(55));
        let short = now + TimeDelta::seconds(6);
        assert_eq!(renew_at(short, now), now + TimeDelta::seconds(4));
        let expired = now - TimeDelta::seconds(1);
        assert_eq!(renew_at(expired, now), now + TimeDelta::seconds(60));
    }

    #[test]
    fn the_key_is_held_whole_and_line_by_line() {
        let pem = "-----BEGIN RSA PRIVATE KEY-----\nMIIEowIBAAKCAQEAxyz0123456789abcdefghij\nQWERTYUIOPasdfghjkl0987654321zxcvbnm\n-----END RSA PRIVATE KEY-----\n";
        let live = LiveSecrets::default();
        hold_key(&live, pem);
        let masked = live.mask_values("leaked QWERTYUIOPasdfghjkl0987654321zxcvbnm here");
        assert!(!masked.contains("QWERTYUIOP"), "{masked}");
        assert_eq!(live.snapshot().len(), 3);
    }
}
