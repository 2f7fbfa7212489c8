//! Who may make rover work: an allow-list plus write access looked up on GitHub, cached.
//!
//! Since late 2025 event payloads carry no `author_association`, so trust is decided from the
//! collaborator permission endpoint. Only a definite answer decides: a permission, or 404 (not a
//! collaborator). A lookup that fails otherwise (rate limit, 5xx, network, a refused token) is
//! no decision: the error goes back to the caller, which retries a transient one later.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use super::api::{GitHub, Permission};
use super::error::GitHubError;

/// Trust settings, part of the GitHub settings in `rover.json`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "camelCase")]
pub struct TrustSettings {
    /// Logins always trusted, without a lookup.
    pub allow_logins: Vec<String>,
    /// Roles trusted: `owner`, `member`, `collaborator` (each meaning write access), or the
    /// permission names `admin`, `maintain`, `write`, `triage`, `read`.
    pub trusted_roles: Vec<String>,
    /// How long a looked-up permission is reused (seconds).
    pub cache_ttl_secs: u64,
}

impl Default for TrustSettings {
    fn default() -> Self {
        Self {
            allow_logins: Vec::new(),
            trusted_roles: vec!["owner".into(), "member".into(), "collaborator".into()],
            cache_ttl_secs: 600,
        }
    }
}

/// Whether an author may lead to work, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TrustDecision {
    pub trusted: bool,
    pub reason: String,
}

impl TrustDecision {
    fn yes(reason: String) -> Self {
        Self {
            trusted: true,
            reason,
        }
    }

    fn no(reason: String) -> Self {
        Self {
            trusted: false,
            reason,
        }
    }
}

/// Decides trust from settings and cached permission lookups.
#[derive(Debug)]
pub struct TrustPolicy {
    allow: Vec<String>,
    accepted: Vec<Permission>,
    ttl: Duration,
    // std Mutex: held only for map access, never across an await.
    cache: Mutex<HashMap<String, (Instant, Permission)>>,
}

impl TrustPolicy {
    /// Build from settings.
    pub fn new(settings: &TrustSettings) -> Self {
        let mut accepted: Vec<Permission> = Vec::new();
        for role in &settings.trusted_roles {
            let perms = match role.to_ascii_lowercase().as_str() {
                "owner" | "member" | "collaborator" => {
                    vec![Permission::Admin, Permission::Maintain, Permission::Write]
                }
                other => match Permission::parse(other) {
                    Permission::None => Vec::new(),
                    p => vec![p],
                },
            };
            for p in perms {
                if !accepted.contains(&p) {
                    accepted.push(p);
                }
            }
        }
        Self {
            allow: settings
                .allow_logins
                .iter()
                .map(|l| l.to_ascii_lowercase())
                .collect(),
            accepted,
            ttl: Duration::from_secs(settings.cache_ttl_secs),
            cache: Mutex::new(HashMap::new()),
        }
    }

    /// Decide for `login` now; `Err` when GitHub gave no definite answer (see the module docs).
    pub async fn decide(
        &self,
        github: &dyn GitHub,
        login: &str,
    ) -> Result<TrustDecision, GitHubError> {
        self.decide_at(github, login, Instant::now()).await
    }

    /// Decide for `login` as of `now` (the cache's clock).
    pub async fn decide_at(
        &self,
        github: &dyn GitHub,
        login: &str,
        now: Instant,
    ) -> Result<TrustDecision, GitHubError> {
        let key = login.to_ascii_lowercase();
        if key.is_empty() {
            return Ok(TrustDecision::no("the event has no author".into()));
        }
        if self.allow.contains(&key) {
            return Ok(TrustDecision::yes(format!("{login} is on the allow-list")));
        }
        let cached = self
            .cache
            .lock()
            .expect("trust cache lock is never poisoned: no panics while held")
            .get(&key)
            .filter(|(at, _)| now.saturating_duration_since(*at) < self.ttl)
            .map(|(_, p)| *p);
        let permission = if let Some(p) = cached {
            // A replay asks again: the cached answer is what this run read.
            super::recorded::note("permission", login, &Ok::<_, GitHubError>(p));
            p
        } else {
            match github.permission(login).await {
                Ok(p) => {
                    self.cache
                        .lock()
                        .expect("trust cache lock is never poisoned: no panics while held")
                        .insert(key, (now, p));
                    p
                }
                // A definite answer: GitHub knows no such collaborator. Not cached, so an
                // invitation accepted meanwhile counts at the next event.
                Err(GitHubError::NotFound { .. }) => {
                    return Ok(TrustDecision::no(format!(
                        "{login} is not a collaborator on {} (the permission lookup answered 404); rover only works for authors with write access or on the allow-list",
                        github.repo()
                    )))
                }
                Err(e) => return Err(e),
            }
        };
        Ok(if self.accepted.contains(&permission) {
            TrustDecision::yes(format!(
                "{login} has {} permission on {}",
                permission.as_str(),
                github.repo()
            ))
        } else {
            TrustDecision::no(format!(
                "{login} has {} permission on {}; rover only works for authors with write access or on the allow-list",
                permission.as_str(),
                github.repo()
            ))
        })
    }
}
