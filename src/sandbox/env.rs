//! Which environment variables may enter a sandbox: an allow-list, and names refused always.

use super::error::SandboxError;
use crate::host_env::HostEnv;

/// Never passed into a sandbox, even when allow-listed: GitHub and git credentials, and the
/// login of the registry sandbox images are pushed to.
pub const ALWAYS_REFUSED_ENV: [&str; 7] = [
    "GITHUB_TOKEN",
    "GH_TOKEN",
    "GH_ENTERPRISE_TOKEN",
    "GITHUB_ENTERPRISE_TOKEN",
    crate::git::GIT_TOKEN_ENV,
    super::swarm::registry::USERNAME_ENV,
    super::swarm::registry::PASSWORD_ENV,
];

/// Checks every name in `env` against `allow` (exact names); refused names are an error that
/// names the variable (never its value).
pub fn check_env(env: &[(String, String)], allow: &[String]) -> Result<(), SandboxError> {
    for (name, _) in env {
        if ALWAYS_REFUSED_ENV
            .iter()
            .any(|r| r.eq_ignore_ascii_case(name))
        {
            return Err(SandboxError::EnvRefused {
                name: name.clone(),
                reason: "GitHub, git and registry credentials never enter a sandbox; the host commits, pushes and publishes images",
            });
        }
        if !allow.iter().any(|a| a == name) {
            return Err(SandboxError::EnvRefused {
                name: name.clone(),
                reason: "not in `autopilot.sandbox.envAllow`; add it there if the agent needs it",
            });
        }
    }
    Ok(())
}

/// The variables of rover's environment an image build's programs (`docker build`, the dev
/// container CLI) get; nothing else: no model key, no token reaches a build.
pub const BUILD_ENV: &[&str] = &[
    "PATH",
    "HOME",
    "DOCKER_HOST",
    "DOCKER_CONFIG",
    "DOCKER_BUILDKIT",
    "LANG",
    "TMPDIR",
];

/// [`BUILD_ENV`]'s variables that are set in rover's environment (`host`), with their values.
pub fn build_env(host: &HostEnv) -> Vec<(&'static str, std::ffi::OsString)> {
    BUILD_ENV
        .iter()
        .filter_map(|name| Some((*name, host.var_os(name)?.to_owned())))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pairs(names: &[&str]) -> Vec<(String, String)> {
        names
            .iter()
            .map(|n| ((*n).to_string(), "v".to_string()))
            .collect()
    }

    #[test]
    fn github_tokens_are_refused_even_when_allow_listed() {
        let allow = vec!["GITHUB_TOKEN".to_string(), "gh_token".to_string()];
        let err = check_env(&pairs(&["GITHUB_TOKEN"]), &allow).expect_err("refused");
        assert!(matches!(err, SandboxError::EnvRefused { ref name, .. } if name == "GITHUB_TOKEN"));
        assert!(check_env(&pairs(&["gh_token"]), &allow).is_err());
        let allow = vec!["ROVER_REGISTRY_PASSWORD".to_string()];
        assert!(check_env(&pairs(&["ROVER_REGISTRY_PASSWORD"]), &allow).is_err());
    }

    #[test]
    fn only_allow_listed_names_pass() {
        let allow = vec!["ANTHROPIC_API_KEY".to_string()];
        check_env(&pairs(&["ANTHROPIC_API_KEY"]), &allow).expect("allowed");
        let err = check_env(&pairs(&["HOME"]), &allow).expect_err("not allowed");
        assert!(err.to_string().contains("`HOME`"));
        assert!(!err.to_string().contains("=v"));
    }
}
