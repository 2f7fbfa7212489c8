//! Images onto the nodes through a registry (`autopilot.sandbox.registry`): rover pushes a task's
//! image from its own engine before each run, and names it in the service by the digest it pushed
//! (`<registry>/<name>@sha256:…`), which each node pulls. A digest names exactly the image rover
//! built: no node can be handed another under the same name, as it could under a tag.

use bollard::auth::DockerCredentials;
use futures_util::StreamExt;

use crate::host_env::HostEnv;
use crate::sandbox::error::SandboxError;
use crate::sandbox::DockerSandbox;

/// The variables holding the registry's user and password (or token), read from rover's own
/// environment, never from `rover.json`; never passed into a sandbox, an agent, a git command
/// or a host-side hook (`agents::ALWAYS_DENIED_ENV`).
pub const USERNAME_ENV: &str = "ROVER_REGISTRY_USERNAME";
/// See [`USERNAME_ENV`].
pub const PASSWORD_ENV: &str = "ROVER_REGISTRY_PASSWORD";

/// A registry rover pushes sandbox images to, and the nodes pull them from.
#[derive(Debug)]
pub struct Registry {
    /// Where images go, without a trailing `/`: `registry.example.com:5000/rover`.
    prefix: String,
    credentials: Option<DockerCredentials>,
    /// One push at a time: two runs of one new image upload its layers once. There is no
    /// memory of earlier pushes: a registry emptied meanwhile gets the image again, and a push
    /// of an image the registry holds only checks its layers (about a second).
    pushing: tokio::sync::Mutex<()>,
}

impl Registry {
    /// The registry at `prefix` (checked by [`validate_prefix`]), with the user and password of
    /// [`USERNAME_ENV`] and [`PASSWORD_ENV`] when they are set in rover's environment (`host`).
    pub fn from_env(prefix: &str, host: &HostEnv) -> Result<Self, SandboxError> {
        let var = |name: &str| host.var(name).filter(|v| !v.is_empty());
        let credentials = match (var(USERNAME_ENV), var(PASSWORD_ENV)) {
            (None, None) => None,
            (Some(username), Some(password)) => Some((username, password)),
            _ => {
                return Err(SandboxError::Swarm {
                    reason: format!(
                        "only one of {USERNAME_ENV} and {PASSWORD_ENV} is set; set both for a registry that wants a login, or neither"
                    ),
                })
            }
        };
        Self::new(prefix, credentials)
    }

    /// The registry at `prefix`, logged in as `credentials` (user, password) when given.
    pub fn new(prefix: &str, credentials: Option<(String, String)>) -> Result<Self, SandboxError> {
        validate_prefix(prefix).map_err(|reason| SandboxError::Swarm { reason })?;
        let prefix = prefix.trim_end_matches('/').to_owned();
        let host = prefix.split('/').next().unwrap_or_default().to_owned();
        Ok(Self {
            credentials: credentials.map(|(username, password)| DockerCredentials {
                username: Some(username),
                password: Some(password),
                serveraddress: Some(host),
                ..DockerCredentials::default()
            }),
            prefix,
            pushing: tokio::sync::Mutex::default(),
        })
    }

    /// The prefix images are pushed under.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// The login the nodes pull with (sent with the service, as `docker service create
    /// --with-registry-auth` does); `None` for a registry without one.
    pub fn credentials(&self) -> Option<DockerCredentials> {
        self.credentials.clone()
    }

    /// The reference the nodes pull `image` (whose id on `engine` is `id`) by, pushed from
    /// `engine` now.
    pub async fn publish(
        &self,
        engine: &DockerSandbox,
        image: &str,
        id: &str,
    ) -> Result<String, SandboxError> {
        let _one = self.pushing.lock().await;
        let repository = format!("{}/{}", self.prefix, repository_name(image));
        // The tag only carries the push; the service names the digest. It is the id's start,
        // so two images never share a tag.
        let tag = id
            .trim_start_matches("sha256:")
            .chars()
            .take(16)
            .collect::<String>();
        let failed = |reason: String| SandboxError::Registry {
            image: image.to_owned(),
            registry: self.prefix.clone(),
            reason,
        };
        engine
            .client()
            .tag_image(
                id,
                Some(
                    bollard::query_parameters::TagImageOptionsBuilder::default()
                        .repo(&repository)
                        .tag(&tag)
                        .build(),
                ),
            )
            .await
            .map_err(|e| engine.err("tag image", &repository, e))?;
        let started = std::time::Instant::now();
        let mut stream = engine.client().push_image(
            &repository,
            Some(
                bollard::query_parameters::PushImageOptionsBuilder::default()
                    .tag(&tag)
                    .build(),
            ),
            self.credentials(),
        );
        let mut digest = None;
        while let Some(step) = stream.next().await {
            let step = step.map_err(|e| failed(push_error(&e)))?;
            if let Some(found) = step.status.as_deref().and_then(pushed_digest) {
                digest = Some(found);
            }
        }
        let digest = match digest {
            Some(d) => d,
            None => recorded_digest(engine, id, &repository)
                .await?
                .ok_or_else(|| {
                    failed(format!(
                        "the engine at {} pushed {repository}:{tag} but named no digest for it",
                        engine.host()
                    ))
                })?,
        };
        let reference = format!("{repository}@{digest}");
        tracing::info!(%image, %reference, secs = started.elapsed().as_secs_f64(), "pushed the sandbox image to the registry");
        Ok(reference)
    }
}

/// What a registry prefix must be: a registry host (with a `.` or a `:`, or `localhost`, so that
/// no engine reads it as a Docker Hub account) and optionally a path, in the characters image
/// names allow, with no tag or digest.
pub fn validate_prefix(prefix: &str) -> Result<(), String> {
    let wrong = |why: &str| {
        Err(format!(
            "autopilot.sandbox.registry: `{prefix}` {why}; write the registry's host and a path images go under, e.g. `registry.example.com:5000/rover`"
        ))
    };
    let prefix = prefix.trim_end_matches('/');
    let mut parts = prefix.split('/');
    let host = parts.next().unwrap_or_default();
    if host.is_empty() {
        return wrong("names no registry");
    }
    if !(host.contains('.') || host.contains(':') || host == "localhost") {
        return wrong("does not start with a registry host (a name with a `.` or a port, or `localhost`): Docker would read it as an account on Docker Hub");
    }
    let host_ok = host
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | ':' | '[' | ']'));
    if !host_ok {
        return wrong("has a registry host with characters a host cannot have");
    }
    for part in parts {
        let ok = !part.is_empty()
            && part.chars().all(|c| {
                c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, '.' | '_' | '-')
            })
            && part.starts_with(|c: char| c.is_ascii_alphanumeric())
            && part.ends_with(|c: char| c.is_ascii_alphanumeric());
        if !ok {
            return wrong(&format!(
                "has the path part `{part}`, which is no image name part (lowercase letters, digits and `.`, `_`, `-` between them; no tag or digest)"
            ));
        }
    }
    Ok(())
}

/// The last path part of `image`'s name without its tag or digest (`ghcr.io/org/env:1` →
/// `env`), in the characters a repository allows; `sandbox` for an image named by id.
pub fn repository_name(image: &str) -> String {
    if image.starts_with("sha256:") {
        return "sandbox".to_owned();
    }
    let name = image.split('@').next().unwrap_or_default();
    let last = name.rsplit('/').next().unwrap_or_default();
    let last = last.split(':').next().unwrap_or_default();
    let clean: String = last
        .chars()
        .map(|c| {
            let c = c.to_ascii_lowercase();
            if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') {
                c
            } else {
                '-'
            }
        })
        .collect();
    let clean = clean.trim_matches(|c: char| !c.is_ascii_alphanumeric());
    if clean.is_empty() {
        "sandbox".to_owned()
    } else {
        clean.to_owned()
    }
}

/// The digest in the engine's last line of a push (`<tag>: digest: sha256:<hex> size: <n>`).
fn pushed_digest(status: &str) -> Option<String> {
    let rest = status.split_once("digest: ")?.1;
    let digest = rest.split_whitespace().next()?;
    let hex = digest.strip_prefix("sha256:")?;
    (hex.len() == 64 && hex.chars().all(|c| c.is_ascii_hexdigit())).then(|| digest.to_owned())
}

/// The digest `engine` recorded for image `id` in `repository` after a push, when it has one.
async fn recorded_digest(
    engine: &DockerSandbox,
    id: &str,
    repository: &str,
) -> Result<Option<String>, SandboxError> {
    let info = engine
        .client()
        .inspect_image(id)
        .await
        .map_err(|e| engine.err("inspect image", id, e))?;
    let prefix = format!("{repository}@");
    Ok(info
        .repo_digests
        .unwrap_or_default()
        .iter()
        .find_map(|d| d.strip_prefix(&prefix).map(str::to_owned)))
}

/// A push's failure in the engine's words (the registry's, passed on).
fn push_error(e: &bollard::errors::Error) -> String {
    match e {
        bollard::errors::Error::DockerStreamError { error } => error.clone(),
        bollard::errors::Error::DockerResponseServerError { message, .. } => message.clone(),
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_login_is_denied_to_every_process_rover_starts_on_the_host() {
        for name in [USERNAME_ENV, PASSWORD_ENV] {
            assert!(crate::agents::ALWAYS_DENIED_ENV.contains(&name), "{name}");
            assert!(crate::sandbox::ALWAYS_REFUSED_ENV.contains(&name), "{name}");
        }
    }

    #[test]
    fn a_prefix_names_a_registry_host_and_image_name_parts() {
        for good in [
            "registry.example.com:5000/rover",
            "127.0.0.1:5415/rover/sandboxes",
            "localhost/rover",
            "ghcr.io/acme",
            "registry.example.com/",
        ] {
            assert!(validate_prefix(good).is_ok(), "{good}");
        }
        for (bad, says) in [
            ("", "names no registry"),
            ("acme/rover", "Docker Hub"),
            ("rover", "Docker Hub"),
            ("registry.example.com/Rover", "`Rover`"),
            ("registry.example.com/rover:1", "`rover:1`"),
            ("registry.example.com/rover@sha256:00", "`rover@sha256:00`"),
            ("registry.example.com//rover", "``"),
            ("reg istry.example.com/rover", "characters a host"),
        ] {
            let err = validate_prefix(bad).expect_err(bad);
            assert!(err.contains(says), "{bad}: {err}");
        }
    }

    #[test]
    fn an_images_repository_is_its_names_last_part() {
        assert_eq!(repository_name("rover-sandbox:latest"), "rover-sandbox");
        assert_eq!(repository_name("ghcr.io/org/env:1.2"), "env");
        assert_eq!(repository_name("localhost:5000/env@sha256:ab"), "env");
        assert_eq!(repository_name("sha256:0123"), "sandbox");
        assert_eq!(repository_name("Rover_Env"), "rover_env");
        assert_eq!(repository_name("--"), "sandbox");
    }

    #[test]
    fn the_digest_comes_from_the_push_s_last_line() {
        let hex = "2c53269904506222f530e17e2fa8b0d599200e99a4b047d20c67ac1594363a78";
        assert_eq!(
            pushed_digest(&format!("t1: digest: sha256:{hex} size: 527")),
            Some(format!("sha256:{hex}"))
        );
        assert_eq!(pushed_digest("Pushed"), None);
        assert_eq!(pushed_digest("t1: digest: sha256:abc size: 1"), None);
    }

    #[test]
    fn a_login_is_both_or_neither() {
        let r =
            Registry::new("127.0.0.1:5415/rover", Some(("u".into(), "p".into()))).expect("valid");
        let c = r.credentials().expect("a login");
        assert_eq!(c.serveraddress.as_deref(), Some("127.0.0.1:5415"));
        assert_eq!(r.prefix(), "127.0.0.1:5415/rover");
        assert!(Registry::new("rover", None).is_err());
    }
}
