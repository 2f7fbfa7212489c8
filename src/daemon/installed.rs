//! `"repositories": "installed"` in the daemon file: every repository a GitHub App is installed
//! on, served as the fleet serves a listed one (`super::fleet`). The set is the app's
//! installations as listed at start (`github::installations`), and again every
//! `relistIntervalSecs`, on SIGUSR1 and when the webhook endpoint is told of an
//! `installation` or `installation_repositories` change (`Fleet::relist`). A repository that
//! appears is started; one that disappears is stopped (its store is kept) and its status says
//! `removed`. A listing that fails keeps the set as it is and says so in the log and in
//! `status` (`lastListing`): a GitHub outage never drops every repository.
//!
//! Each repository is served as the app: its daemon mints its own installation tokens, for the
//! installation the listing names, scoped to that one repository.

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::time::Duration;

use chrono::Utc;
use tokio_util::sync::CancellationToken;

use super::fleet::{join_all, Ended, Fleet, ListingStatus, RepoState};
use super::StartError;
use crate::config::{InstalledConfig, RoverConfig, ServedAsApp, ServedRepo};
use crate::github::app::{self, APP_KEY_ENV};
use crate::github::installations::{InstallationLister, Installations, InstalledRepo};
use crate::project::RepoSlug;

/// How long one request of a listing may take.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// Serves what the app is installed on until the daemon stops (once each, with `--once`).
pub(super) async fn serve_installed(config: &InstalledConfig, fleet: &Fleet) -> Vec<Ended> {
    let (lister, key) = match lister(config, fleet) {
        Ok(found) => found,
        Err(e) => return vec![Err(e)],
    };
    let mut set = Served {
        config,
        key,
        fleet,
        tasks: tokio::task::JoinSet::new(),
        running: HashMap::new(),
        skipped: HashSet::new(),
        ended: Vec::new(),
    };
    let mut first = true;
    loop {
        match lister.list().await {
            Ok(found) => {
                set.follow(found);
                if first {
                    fleet.expect_at_start(set.running.keys().cloned().collect());
                }
            }
            Err(e) => {
                let why = crate::error::error_chain(&e);
                tracing::error!(error = %why, "cannot list the repositories the GitHub App is installed on; those served stay served");
                println!("rover: cannot list the repositories the GitHub App is installed on: {why} (those served stay served; listed again in {} s, or at once on SIGUSR1)", config.relist_interval.as_secs());
                fleet.board.listed(ListingStatus {
                    at: Utc::now(),
                    error: Some(why),
                    repositories: set.running.len(),
                });
                // A first listing that cannot work (a wrong app id or key) stops the start.
                if first && (fleet.options.once || !e.is_retryable()) {
                    return vec![Err(StartError::GitHub(e))];
                }
            }
        }
        first = false;
        if fleet.options.once || !set.wait(config.relist_interval).await {
            break;
        }
    }
    let mut ended = std::mem::take(&mut set.ended);
    ended.extend(join_all(set.tasks).await);
    ended
}

/// The app's lister and the path of its key: the daemon file's `app.privateKeyFile`, else
/// `ROVER_GITHUB_APP_KEY_FILE`.
fn lister(
    config: &InstalledConfig,
    fleet: &Fleet,
) -> Result<(InstallationLister, PathBuf), StartError> {
    let key = config
        .private_key_file
        .clone()
        .or_else(|| app::key_path_from_env(&fleet.host))
        .ok_or_else(|| StartError::Setting(format!(
            "\"repositories\": \"installed\" serves as GitHub App {}: name its private key in the daemon file (\"app\": {{\"id\": {}, \"privateKeyFile\": \"/path/to/key.pem\"}}) or set {APP_KEY_ENV} to its path",
            config.app_id, config.app_id
        )))?;
    let pem = app::read_key(&key)?;
    let api_url = config
        .api_url
        .clone()
        .unwrap_or_else(|| crate::github::octo::api_url_from_env(&fleet.host));
    let lister = InstallationLister::new(&api_url, config.app_id, &key, &pem, REQUEST_TIMEOUT)?;
    Ok((lister, key))
}

/// A repository's `rover.json` as served for the app: its tokens minted for the installation
/// the listing named (no lookup), whatever `github.appId` it sets.
pub(super) fn serve_as_app(repo: &ServedRepo, config: &mut RoverConfig) {
    if let Some(app) = &repo.app {
        let github = &mut config.autopilot.github;
        github.app_id = Some(app.app_id);
        github.installation_id = Some(app.installation_id);
    }
}

/// A served repository's task, stopped alone by `stop`.
struct Running {
    name: String,
    stop: CancellationToken,
    installation_id: u64,
}

/// The repositories served, as the latest listing has them.
struct Served<'a> {
    config: &'a InstalledConfig,
    key: PathBuf,
    fleet: &'a Fleet,
    tasks: tokio::task::JoinSet<Ended>,
    /// By name in lower case (GitHub's names are not case-sensitive).
    running: HashMap<String, Running>,
    /// Said once each: listed but not served.
    skipped: HashSet<String>,
    /// The tasks that ended before the daemon did (removed repositories).
    ended: Vec<Ended>,
}

impl Served<'_> {
    /// Starts what the listing adds, stops what it no longer has.
    fn follow(&mut self, found: Installations) {
        for (id, account) in &found.suspended {
            tracing::warn!(installation = id, %account, "the GitHub App's installation is suspended: its repositories are not served");
        }
        let mut listed = HashSet::new();
        for repo in found.repositories {
            // The listing is GitHub's answer: a name that is not one is left out.
            let Ok(slug) = RepoSlug::parse(&repo.full_name) else {
                tracing::warn!(name = %repo.full_name, "the listing names a repository that is not owner/name; left out");
                continue;
            };
            if self.config.excludes(&slug) {
                continue;
            }
            let key = repo.full_name.to_ascii_lowercase();
            if let Some(why) = not_served(&repo) {
                self.skip(&repo.full_name, key, why);
                continue;
            }
            self.skipped.remove(&key);
            if !listed.insert(key.clone()) {
                continue;
            }
            let moved = self
                .running
                .get(&key)
                .is_some_and(|r| r.installation_id != repo.installation_id);
            if moved {
                // Its tokens are minted for an installation that no longer has it.
                self.stop(&key);
            }
            if !self.running.contains_key(&key) {
                self.start(slug, repo, key);
            }
        }
        let gone: Vec<String> = self
            .running
            .keys()
            .filter(|k| !listed.contains(*k))
            .cloned()
            .collect();
        for key in gone {
            self.stop(&key);
        }
        self.fleet.board.listed(ListingStatus {
            at: Utc::now(),
            error: None,
            repositories: self.running.len(),
        });
    }

    fn start(&mut self, slug: RepoSlug, repo: InstalledRepo, key: String) {
        let stop = self.fleet.shutdown.child_token();
        let text = format!(
            "rover: serving {} (installation {})",
            repo.full_name, repo.installation_id
        );
        println!("{text}");
        tracing::info!("{text}");
        self.running.insert(
            key,
            Running {
                name: repo.full_name.clone(),
                stop: stop.clone(),
                installation_id: repo.installation_id,
            },
        );
        let served = ServedRepo {
            slug,
            checkout: None,
            api_url: self.config.api_url.clone(),
            clone_url: repo.clone_url,
            app: Some(ServedAsApp {
                app_id: self.config.app_id,
                installation_id: repo.installation_id,
                private_key_file: self.key.clone(),
            }),
        };
        self.fleet.spawn(&mut self.tasks, served, stop);
    }

    /// Stops the repository `key` (its task ends as at a shutdown; the board then says
    /// `removed`).
    fn stop(&mut self, key: &str) {
        if let Some(running) = self.running.remove(key) {
            let text = format!(
                "rover: {} is no longer served: the GitHub App's installations no longer cover it",
                running.name
            );
            println!("{text}");
            tracing::info!("{text}");
            running.stop.cancel();
        }
    }

    /// Listed but not served: said once, and on the board.
    fn skip(&mut self, name: &str, key: String, why: &str) {
        self.stop(&key);
        if self.skipped.insert(key) {
            println!("rover: {name} is not served: {why}");
            tracing::info!(repo = %name, "not served: {why}");
            let index = self.fleet.board.entry(name);
            self.fleet.board.update(index, |s| {
                s.state = RepoState::Skipped;
                s.reason = Some(why.to_owned());
            });
        }
    }

    /// Until the next listing is due (`true`) or the daemon stops (`false`); a task that ends
    /// meanwhile is collected.
    async fn wait(&mut self, interval: Duration) -> bool {
        let due = tokio::time::Instant::now() + interval;
        loop {
            tokio::select! {
                () = tokio::time::sleep_until(due) => return true,
                () = self.fleet.relist.notified() => return true,
                () = self.fleet.shutdown.cancelled() => return false,
                Some(ended) = self.tasks.join_next(), if !self.tasks.is_empty() => {
                    self.ended.push(ended.unwrap_or_else(|e| Err(StartError::Internal(format!("a served repository's task ended abnormally: {e}")))));
                }
            }
        }
    }
}

/// Why a listed repository is not served, if it is not.
fn not_served(repo: &InstalledRepo) -> Option<&'static str> {
    if repo.archived {
        Some("it is archived on GitHub (read-only): unarchive it to have it served")
    } else if repo.disabled {
        Some("GitHub has disabled it: once enabled again it is served")
    } else {
        None
    }
}

/// The token a clone of `repo` is made with: as the app it is served as, an installation token
/// minted for that installation and scoped to the repository (a private repository of an app
/// with no `GITHUB_TOKEN` is cloned too); otherwise rover's token, if it has one.
pub(super) async fn clone_token(
    repo: &ServedRepo,
    api_url: &str,
    host: &crate::host_env::HostEnv,
) -> Result<Option<String>, StartError> {
    let Some(served) = &repo.app else {
        return Ok(crate::github::token_from_env(host).ok());
    };
    let pem = app::read_key(&served.private_key_file)?;
    let secrets = crate::secrets::LiveSecrets::default();
    app::hold_key(&secrets, &pem);
    let slug = &repo.slug;
    let settings = app::AppSettings {
        api_url,
        app_id: served.app_id,
        installation_id: Some(served.installation_id),
        repo: &crate::github::RepoRef {
            owner: slug.owner.clone(),
            name: slug.name.clone(),
        },
        timeout: REQUEST_TIMEOUT,
    };
    let tokens =
        app::AppTokens::connect(&settings, &served.private_key_file, &pem, secrets).await?;
    Ok(Some(tokens.token().await?))
}
