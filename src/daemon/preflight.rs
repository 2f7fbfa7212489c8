//! What the daemon checks before it takes any work: the webhook secret when webhooks are
//! served, GitHub (unless `--local`), the agent CLI, the sandbox image and Docker, the dev
//! container CLI for a repository declaring its environment, the warnings of a setting that
//! will hurt; then the secrets it holds and the services the steps are given.

use std::sync::Arc;
use std::time::Duration;

use crate::agents::agent_from_settings;
use crate::config::RoverConfig;
use crate::github::{GitHub, NormalizeOptions, Redactor};
use crate::host_env::HostEnv;
use crate::project::Project;
use crate::sandbox::{Sandbox, SandboxError};
use crate::secrets::{HeldSecrets, LiveSecrets};
use crate::steps::Services;
use crate::store::AutopilotStore;

use super::{github, proxy, StartError, StartOptions};

/// What the checks found, for the components.
pub(super) struct Ready {
    /// The webhook's secret, when webhooks are served.
    pub webhook_secret: Option<String>,
    /// GitHub as the sources read it (the steps read it through `services.github`, recorded);
    /// `None` with `--local`.
    pub github: Option<Arc<dyn GitHub>>,
    pub normalize: Option<NormalizeOptions>,
    pub services: Arc<Services>,
}

/// Check what the daemon needs, in the order a new user meets it; a missing piece refuses the
/// start, saying what to do. `config` gets what the checks decide (rover's login, its image).
pub(super) async fn check(
    project: &Project,
    config: &mut RoverConfig,
    store: &AutopilotStore,
    options: StartOptions,
    host: HostEnv,
) -> Result<Ready, StartError> {
    // The webhook secret, when webhooks are served: checked first, it is the newest requirement.
    let webhook_secret = match options.webhook {
        Some(_) => Some(crate::github::webhook::secret_from_env(&host).ok_or_else(|| {
            StartError::Setting(format!(
                "--webhook needs the webhook's secret: set {} to the secret configured in the repository's webhook settings (docs/webhooks.md)",
                crate::github::webhook::SECRET_ENV
            ))
        })?),
        None => None,
    };
    // GitHub: required unless the daemon serves local requests only. The secrets rover holds
    // grow while it runs (a GitHub App's tokens), so the set is made first.
    let secrets = LiveSecrets::default();
    let mut normalize = None;
    let mut auth = None;
    let github: Option<Arc<dyn GitHub>> = if options.local {
        None
    } else {
        let connected = github::connect(project, config, &secrets, &host).await?;
        normalize = Some(connected.client.normalize_options().clone());
        auth = Some(connected.auth);
        Some(Arc::new(connected.client))
    };

    // The agent CLI must answer before rover takes any work.
    let agent = agent_from_settings(&config.autopilot.agent, &host);
    let version = agent.check().await?;
    tracing::info!(agent = %version, "agent ready");

    let sandbox = sandbox(project, config, store, &host).await?;
    hold_secrets(config, &secrets, &host);
    let services = Arc::new(Services {
        repo_root: project.root.clone(),
        repo: project.repo.clone(),
        project_id: project.id.clone(),
        agent,
        // Steps read GitHub through the recording client (kept for `rover autopilot replay`).
        github: github.clone().map(|g| {
            crate::github::recorded::RecordingGitHub::wrap(g, Redactor::from_live(secrets.clone()))
        }),
        sandbox,
        redactor: Redactor::from_live(secrets.clone()),
        github_token: auth,
        git_env: Vec::new(),
        store_root: Some(store.root().to_owned()),
        config: config.clone(),
        host,
    });
    Ok(Ready {
        webhook_secret,
        github,
        normalize,
        services,
    })
}

/// The sandbox: rover's own image named, Docker connected (or its absence said), the dev
/// container CLI checked, and the warnings of the sandbox settings.
async fn sandbox(
    project: &Project,
    config: &mut RoverConfig,
    store: &AutopilotStore,
    host: &HostEnv,
) -> Result<Option<Arc<dyn Sandbox>>, StartError> {
    // rover's own sandbox image when none is named: its name now (a hash of what goes into
    // it), built on first use.
    let own_image = own_image(config, store, host)?;
    // Docker is needed by workflows only: without it rover still answers, and workflows fail
    // with a clear reason.
    let sandbox: Option<Arc<dyn Sandbox>> =
        match crate::sandbox::connect(&config.autopilot.sandbox, own_image, host).await {
            Ok(s) => Some(s),
            Err(e @ (SandboxError::BackendUnavailable { .. } | SandboxError::Swarm { .. })) => {
                return Err(StartError::Sandbox(e));
            }
            Err(e) => {
                println!(
                    "warning: {}; workflows will fail until Docker answers",
                    crate::error::error_chain(&e)
                );
                tracing::warn!(error = &e as &dyn std::error::Error, "no Docker engine");
                None
            }
        };

    // A repository that declares its environment needs the dev container CLI: now, not at the
    // first trace.
    if let Some((source, version)) =
        crate::environment::preflight::check(&project.root, &config.autopilot.sandbox, host)
            .await
            .map_err(StartError::Setting)?
    {
        tracing::info!(?source, devcontainer = %version, "the repository declares its environment; the dev container CLI answers");
    }
    proxy::warn_without_proxy_key(config, host);
    if config.autopilot.sandbox.hooks == crate::git::HookMode::Host {
        let text = "autopilot.sandbox.hooks is \"host\": the repository's own git hooks run on this machine with the agent's worktree as their working directory, so a hook that runs a file from the worktree (./scripts/lint, make, npm, node_modules/.bin, a hook manager) runs code the agent wrote; remove the setting to run every hook in a sandbox";
        println!("warning: {text}");
        tracing::warn!(hooks = "host", "{text}");
    }
    Ok(sandbox)
}

/// rover's own sandbox image when `autopilot.sandbox.image` is left at its default: the config
/// then names it (`rover-sandbox:<hash>`), and the engine builds it on first use, its log in the
/// store's `images/`. A build setting rover cannot use stops `start`.
fn own_image(
    config: &mut RoverConfig,
    store: &AutopilotStore,
    host: &HostEnv,
) -> Result<Option<Arc<crate::sandbox::OwnImage>>, StartError> {
    let settings = &mut config.autopilot.sandbox;
    if settings.image != crate::sandbox::own_image::DEFAULT_IMAGE {
        return Ok(None);
    }
    let own = crate::sandbox::OwnImage::resolve(
        &settings.build,
        &store.root().join("images"),
        Duration::from_secs(settings.environment.build_timeout_secs),
        host,
    )
    .map_err(|e| StartError::Setting(crate::error::error_chain(&e)))?;
    own.reference().clone_into(&mut settings.image);
    tracing::info!(image = %settings.image, "the sandbox image is rover's own, built on first use");
    Ok(Some(Arc::new(own)))
}

/// Add the secrets rover was handed to `secrets` (see [`held_secrets`]), and log their names.
fn hold_secrets(config: &RoverConfig, secrets: &LiveSecrets, host: &HostEnv) {
    let held = held_secrets(
        crate::github::octo::held_tokens(host),
        crate::github::webhook::secret_from_env(host),
        config,
        host,
    );
    for secret in held.iter() {
        secrets.add(secret.name(), secret.value());
    }
    let held = secrets.snapshot();
    let names: Vec<&str> = held.iter().map(crate::secrets::HeldSecret::name).collect();
    tracing::info!(
        secrets = ?names,
        "secret values held: redacted from messages, refused in pushes"
    );
}

/// The secrets rover holds, for redaction and the push scan alike: the GitHub tokens (both
/// variables, taken out of the environment at start), the webhook secret (served or not), the
/// model keys, the value of every variable `envAllow` or `extraEnv` may hand an agent that looks
/// secret, and every variable of rover's environment whose name says it is a secret.
fn held_secrets(
    tokens: Vec<(&str, String)>,
    webhook_secret: Option<String>,
    config: &RoverConfig,
    host: &HostEnv,
) -> HeldSecrets {
    let mut held = HeldSecrets::new();
    for (name, token) in tokens {
        held.add(name, &token);
    }
    if let Some(secret) = webhook_secret {
        held.add(crate::github::webhook::SECRET_ENV, &secret);
    }
    for (name, value) in crate::telemetry::settings::header_values(host) {
        held.add(name, &value);
    }
    held.with_env(crate::secrets::MODEL_KEY_ENV, host)
        .with_env_if_secret(&config.autopilot.sandbox.env_allow, host)
        .with_env_if_secret(&config.autopilot.agent.extra_env, host)
        .with_secret_env(host)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::github::Visibility;

    /// Every secret rover was handed is held, so redaction and the push scan know it: both token
    /// variables, the webhook secret even when no webhook is served, and what `envAllow` lets
    /// into a sandbox when it looks secret (by name or by shape), not what does not.
    #[test]
    fn the_redactor_holds_every_secret_rover_was_handed() {
        let id = uuid::Uuid::new_v4()
            .simple()
            .to_string()
            .to_ascii_uppercase();
        let named = format!("ROVER_TEST_{id}_DEPLOY_KEY");
        let shaped = format!("ROVER_TEST_{id}_SHAPED");
        let plain = format!("ROVER_TEST_{id}_PLAIN");
        let host = HostEnv::from_pairs([
            (named.clone(), "deploy-key-value-1234".to_owned()),
            (shaped.clone(), "xoxb-1234567890-abcdefghij".to_owned()),
            (plain.clone(), "not-a-secret-value".to_owned()),
        ]);
        let mut config = RoverConfig::default();
        config.autopilot.sandbox.env_allow = vec![named.clone(), shaped.clone(), plain.clone()];
        let held = held_secrets(
            vec![
                ("GITHUB_TOKEN", "first-token-value-0001".into()),
                ("GH_TOKEN", "second-token-value-0002".into()),
            ],
            Some("webhook-secret-value-0003".into()),
            &config,
            &host,
        );
        let names: Vec<&str> = held.iter().map(crate::secrets::HeldSecret::name).collect();
        for name in [
            "GITHUB_TOKEN",
            "GH_TOKEN",
            "ROVER_WEBHOOK_SECRET",
            named.as_str(),
            shaped.as_str(),
        ] {
            assert!(names.contains(&name), "{name} not held: {names:?}");
        }
        assert!(!names.contains(&plain.as_str()), "{names:?}");
        let redactor = Redactor::from_held(held);
        let text = "t first-token-value-0001 second-token-value-0002 w webhook-secret-value-0003 k deploy-key-value-1234";
        for visibility in [Visibility::Public, Visibility::Private] {
            let out = redactor.redact(text, visibility);
            assert!(!out.contains("value-000"), "{out}");
            assert!(!out.contains("deploy-key-value"), "{out}");
        }
    }
}
