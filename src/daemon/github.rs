//! The daemon's GitHub connection: a GitHub App (`github.appId` and the private key named by
//! `ROVER_GITHUB_APP_KEY_FILE`) or a token (`GITHUB_TOKEN`/`GH_TOKEN`), the client built on it,
//! and rover's own login. Anything wrong is a start error that says what to set.

use std::sync::Arc;

use crate::config::RoverConfig;
use crate::github::app::{self, AppSettings, AppTokens, APP_KEY_ENV};
use crate::github::{BotIdentity, GitHubAuth, GitHubError, GitHubSettings, OctoGitHub, RepoRef};
use crate::host_env::HostEnv;
use crate::project::Project;
use crate::secrets::LiveSecrets;

use super::StartError;

/// The client and the credential behind it (for `git push` too).
pub(super) struct Connected {
    pub client: OctoGitHub,
    pub auth: GitHubAuth,
}

/// Connect as configured; sets `github.botLogin` to the login decided (see `identity`). The
/// app's key and every token it mints are held by `secrets`.
pub(super) async fn connect(
    project: &Project,
    config: &mut RoverConfig,
    secrets: &LiveSecrets,
    host: &HostEnv,
) -> Result<Connected, StartError> {
    let settings = &config.autopilot.github;
    // Credentials first (the first thing a new user is missing), then the repository.
    let token = match settings.app_id {
        Some(_) => None,
        None => Some(token_auth(host)?),
    };
    let repo = project.repo.clone().ok_or_else(|| StartError::Setting(
        "cannot tell which GitHub repository to watch: the `origin` remote is not a GitHub URL; pass --repo OWNER/NAME".into(),
    ))?;
    let repo = RepoRef::parse(&repo.to_string())?;
    settings.reactions.validate().map_err(StartError::Setting)?;
    let api_url = crate::github::octo::api_url_from_env(host);
    let auth = match (settings.app_id, token) {
        (Some(app_id), _) => app_auth(app_id, settings, &api_url, &repo, secrets, host).await?,
        (None, Some(token)) => token,
        (None, None) => unreachable!("a token is read when there is no app"),
    };
    let mut client = OctoGitHub::with_auth(&api_url, auth.clone(), repo, settings)?;
    let identity = identity(&client, &auth, settings).await?;
    config.autopilot.github.bot_login = identity.login().map(str::to_owned);
    client.set_bot_login(config.autopilot.github.bot_login.clone());
    Ok(Connected { client, auth })
}

/// As the GitHub App `app_id`: its key from the file `ROVER_GITHUB_APP_KEY_FILE` names (held as
/// a secret), its installation, a first token.
async fn app_auth(
    app_id: u64,
    settings: &GitHubSettings,
    api_url: &str,
    repo: &RepoRef,
    secrets: &LiveSecrets,
    host: &HostEnv,
) -> Result<GitHubAuth, StartError> {
    let path = app::key_path_from_env(host).ok_or_else(|| StartError::Setting(format!(
        "github.appId is {app_id} in rover.json: set {APP_KEY_ENV} to the path of the app's private key (the .pem file from the app's settings, Private keys)"
    )))?;
    let pem = app::read_key(&path)?;
    app::hold_key(secrets, &pem);
    let app_settings = AppSettings {
        api_url,
        app_id,
        installation_id: settings.installation_id,
        repo,
        timeout: std::time::Duration::from_secs(settings.request_timeout_secs.max(1)),
    };
    let tokens = AppTokens::connect(&app_settings, &path, &pem, secrets.clone()).await?;
    let text = format!(
        "github: as the GitHub App {} (app {app_id}, installation {}); installation tokens minted and renewed by rover",
        tokens.bot_login(),
        tokens.installation_id()
    );
    println!("{text}");
    tracing::info!("{text}");
    Ok(GitHubAuth::App(Arc::new(tokens)))
}

/// With the token of `GITHUB_TOKEN` (or `GH_TOKEN`).
fn token_auth(host: &HostEnv) -> Result<GitHubAuth, StartError> {
    if app::key_path_from_env(host).is_some() {
        let text = format!(
            "{APP_KEY_ENV} is set but github.appId is not in rover.json: using GITHUB_TOKEN, not the app"
        );
        println!("warning: {text}");
        tracing::warn!("{text}");
    }
    let token = crate::github::token_from_env(host).map_err(|_| StartError::Setting(
        "no GitHub credentials: set github.appId in rover.json and ROVER_GITHUB_APP_KEY_FILE to the app's private key (a GitHub App, recommended), or GITHUB_TOKEN (or GH_TOKEN) to a token that can read the repository and write issues and pull requests; or run `rover autopilot start --local` for local requests only".into(),
    ))?;
    Ok(GitHubAuth::from(token))
}

/// Rover's own login (see `github::identity`): configured, else the app's, else learned from
/// the token. A token GitHub rejects stops the start; any other failure falls back and says so.
async fn identity(
    client: &OctoGitHub,
    auth: &GitHubAuth,
    settings: &GitHubSettings,
) -> Result<BotIdentity, StartError> {
    let configured = settings
        .bot_login
        .as_deref()
        .filter(|l| !l.trim().is_empty());
    let identity = if let (None, Some(app)) = (configured, auth.app()) {
        BotIdentity::FromApp(app.bot_login())
    } else {
        let learned = match configured {
            Some(_) => None,
            None => Some(client.token_login().await),
        };
        if let Some(Err(GitHubError::BadCredentials { what })) = &learned {
            return Err(StartError::GitHub(GitHubError::BadCredentials {
                what: what.clone(),
            }));
        }
        crate::github::identity::resolve(configured, settings.app_slug.as_deref(), learned)
    };
    let text = identity.describe();
    if identity.login().is_some() {
        println!("identity: {text}");
        tracing::info!(identity = %text, "own login");
    } else {
        println!("warning: {text}");
        tracing::warn!(identity = %text, "own login unknown");
    }
    Ok(identity)
}
