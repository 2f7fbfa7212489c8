//! Every repository a GitHub App is installed on: the app's installations
//! (`GET /app/installations`, with its JWT), and for each one the repositories it covers
//! (`GET /installation/repositories`, with a token minted for that installation by
//! `POST /app/installations/{id}/access_tokens`). Both lists are paged; the next page is the
//! one the `Link` header's `next` names, asked of the same API (never of the host the link
//! names: an answer is untrusted input).
//!
//! The tokens minted here only list; a served repository's own daemon mints its own, scoped to
//! that one repository (`github::app`).

use std::path::Path;
use std::time::Duration;

use http::Method;
use octocrab::Octocrab;
use serde::de::DeserializeOwned;
use serde::Deserialize;
use serde_json::json;

use super::app::{client, encoding_key, Auth, Call};
use super::error::GitHubError;
use super::poll::ResponseMeta;

/// GitHub's largest page.
pub const MAX_PER_PAGE: u32 = 100;
/// At most this many pages of one list are read (10 000 installations or repositories of
/// one installation at 100 a page).
const MAX_PAGES: u32 = 100;

/// One repository an installation covers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InstalledRepo {
    /// `owner/name`, as GitHub spells it.
    pub full_name: String,
    /// Where it is cloned from (`clone_url`).
    pub clone_url: Option<String>,
    pub installation_id: u64,
    /// Archived: read-only on GitHub, nothing rover could push or answer.
    pub archived: bool,
    /// Disabled by GitHub (for instance for a billing problem).
    pub disabled: bool,
}

/// What the app is installed on.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Installations {
    pub repositories: Vec<InstalledRepo>,
    /// Installations a suspension leaves out: id and the account it is on.
    pub suspended: Vec<(u64, String)>,
}

/// `GET /app/installations`, one installation as much as rover reads.
#[derive(Deserialize)]
struct RawInstallation {
    id: u64,
    #[serde(default)]
    account: Option<RawAccount>,
    #[serde(default)]
    suspended_at: Option<String>,
}

#[derive(Deserialize)]
struct RawAccount {
    #[serde(default)]
    login: String,
}

/// `GET /installation/repositories`, one page as much as rover reads.
#[derive(Deserialize)]
struct RawRepositories {
    total_count: u64,
    repositories: Vec<RawRepo>,
}

#[derive(Deserialize)]
struct RawRepo {
    full_name: String,
    #[serde(default)]
    clone_url: Option<String>,
    #[serde(default)]
    archived: bool,
    #[serde(default)]
    disabled: bool,
}

/// `POST /app/installations/{id}/access_tokens`, as much as rover reads.
#[derive(Deserialize)]
struct RawToken {
    token: String,
}

/// Lists what a GitHub App is installed on.
pub struct InstallationLister {
    app: Octocrab,
    app_id: u64,
    api_url: String,
    timeout: Duration,
    per_page: u32,
}

impl std::fmt::Debug for InstallationLister {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InstallationLister")
            .field("app_id", &self.app_id)
            .field("api_url", &self.api_url)
            .finish_non_exhaustive()
    }
}

impl InstallationLister {
    /// As the app `app_id` of the REST API at `api_url`, with the private key `pem` (read from
    /// `key_path`); a key that is not one fails here.
    pub fn new(
        api_url: &str,
        app_id: u64,
        key_path: &Path,
        pem: &str,
        timeout: Duration,
    ) -> Result<InstallationLister, GitHubError> {
        let key = encoding_key(key_path, pem)?;
        Ok(InstallationLister {
            app: client(api_url, timeout, Auth::App(app_id, key))?,
            app_id,
            api_url: api_url.to_owned(),
            timeout,
            per_page: MAX_PER_PAGE,
        })
    }

    /// Pages of `per_page` items (1 to 100) instead of 100.
    #[must_use]
    pub fn per_page(mut self, per_page: u32) -> Self {
        self.per_page = per_page.clamp(1, MAX_PER_PAGE);
        self
    }

    /// Every repository of every installation that is not suspended, in the order GitHub
    /// lists them.
    pub async fn list(&self) -> Result<Installations, GitHubError> {
        let as_app = Call {
            client: &self.app,
            app_id: self.app_id,
            timeout: self.timeout,
        };
        let installations: Vec<RawInstallation> = self
            .all_pages(&as_app, "the app's installations", "/app/installations", Ok)
            .await?;
        let mut found = Installations::default();
        for installation in installations {
            let account = installation.account.map(|a| a.login).unwrap_or_default();
            if installation.suspended_at.is_some() {
                found.suspended.push((installation.id, account));
                continue;
            }
            found
                .repositories
                .extend(self.repositories_of(&as_app, installation.id).await?);
        }
        Ok(found)
    }

    /// The repositories installation `id` covers, listed with a token minted for it.
    async fn repositories_of(
        &self,
        as_app: &Call<'_>,
        id: u64,
    ) -> Result<Vec<InstalledRepo>, GitHubError> {
        let what = format!("an installation token of installation {id}");
        let path = format!("/app/installations/{id}/access_tokens");
        let (token, _): (RawToken, _) = as_app
            .send(&what, Method::POST, &path, Some(&json!({})))
            .await?;
        let as_installation = client(&self.api_url, self.timeout, Auth::Installation(token.token))?;
        let call = Call {
            client: &as_installation,
            app_id: self.app_id,
            timeout: self.timeout,
        };
        let what = format!("the repositories of installation {id}");
        let mut total = None;
        let raw: Vec<RawRepo> = self
            .all_pages(&call, &what, "/installation/repositories", |page| {
                let page: RawRepositories = page;
                total = Some(page.total_count);
                Ok(page.repositories)
            })
            .await?;
        // A list shorter than GitHub says it is was cut (a page lost): not the whole set, so
        // not something to drop repositories by.
        if let Some(total) = total {
            if (raw.len() as u64) < total {
                return Err(GitHubError::Malformed {
                    what,
                    detail: format!("{} repositories listed of the {total} it counts", raw.len()),
                });
            }
        }
        Ok(raw
            .into_iter()
            .map(|r| InstalledRepo {
                full_name: r.full_name,
                clone_url: r.clone_url,
                installation_id: id,
                archived: r.archived,
                disabled: r.disabled,
            })
            .collect())
    }

    /// Every page of `path`, each read as `P` and turned into items by `items`, following the
    /// `Link` header's `next` page number on the same API.
    async fn all_pages<P: DeserializeOwned, T>(
        &self,
        call: &Call<'_>,
        what: &str,
        path: &str,
        mut items: impl FnMut(P) -> Result<Vec<T>, GitHubError>,
    ) -> Result<Vec<T>, GitHubError> {
        let mut all = Vec::new();
        let mut page = 1;
        loop {
            let url = format!("{path}?per_page={}&page={page}", self.per_page);
            let (body, meta): (P, ResponseMeta) = call.send(what, Method::GET, &url, None).await?;
            all.extend(items(body)?);
            let Some(next) = meta.next.as_deref().and_then(page_of) else {
                return Ok(all);
            };
            if next <= page || next > MAX_PAGES {
                return Err(GitHubError::Malformed {
                    what: what.to_owned(),
                    detail: format!("page {page} names page {next} as the next one"),
                });
            }
            page = next;
        }
    }
}

/// The `page` parameter of a `Link` URL.
fn page_of(url: &str) -> Option<u32> {
    let query = url.split_once('?')?.1;
    query
        .split('&')
        .find_map(|kv| kv.strip_prefix("page="))
        .and_then(|p| p.parse().ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_next_page_is_read_from_the_link_url() {
        assert_eq!(
            page_of("https://api.github.com/installation/repositories?per_page=2&page=3"),
            Some(3)
        );
        assert_eq!(
            page_of("https://api.github.com/app/installations?page=2&per_page=100"),
            Some(2)
        );
        assert_eq!(page_of("https://api.github.com/app/installations"), None);
        assert_eq!(page_of("https://x/y?per_page=2&page=x"), None);
    }
}
