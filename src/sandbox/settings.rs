//! `SandboxSettings` and `GateSettings`: the `autopilot.sandbox` part of `rover.json`.

use serde::Deserialize;

use super::egress::Egress;
use super::spec::ResourceLimits;

/// Names that would carry a model credential or endpoint into a container: the agent reaches
/// the model API through rover's proxy, which holds both outside it.
pub const MODEL_ENV_REFUSED: &[&str] = &[
    "ANTHROPIC_API_KEY",
    "ANTHROPIC_AUTH_TOKEN",
    "ANTHROPIC_BASE_URL",
    "CLAUDE_CODE_OAUTH_TOKEN",
    "OPENAI_API_KEY",
    "OPENAI_BASE_URL",
    "CODEX_API_KEY",
];

/// The sandbox configuration (`autopilot.sandbox` in `rover.json`); every field has a default.
#[derive(Debug, Clone, PartialEq, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct SandboxSettings {
    /// The image agents run in; never pulled. The default, `rover-sandbox:latest`, is rover's
    /// own image: built by rover on first use from the Dockerfile it carries, as `build` says,
    /// and tagged `rover-sandbox:<hash>` (see docs/sandbox.md). Any other name must be built
    /// locally.
    pub image: String,
    /// How rover builds its own image (used when `image` is left at its default).
    pub build: super::ImageBuildSettings,
    /// Memory limit in MiB.
    pub memory_mb: u64,
    /// CPU limit (fractions allowed).
    pub cpus: f64,
    /// Process limit.
    pub pids_limit: i64,
    /// The largest file a process in a sandbox may write, in MiB (`RLIMIT_FSIZE`, enforced by
    /// the kernel on every engine: a larger write or truncate fails with `EFBIG`).
    pub file_size_limit_mb: u64,
    /// Wall-clock limit of one agent run, in seconds.
    pub timeout_secs: u64,
    /// Most output rover keeps of one container stream (stdout, stderr) per run, in MiB: the
    /// head and the tail, the middle cut. A container that prints more is stopped. The engine's
    /// own log of a container is held to two files of this size.
    pub log_limit_mb: u64,
    /// What an agent container may reach: `model-only` (the default: the model API through
    /// rover's proxy, nothing else), `{"allow": [hosts]}`, `none` or `open` (see
    /// [`Egress`]). Gates, hooks and corrective commands run with no network unless `open`.
    pub egress: Egress,
    /// Replaced by `egress` (`none` reads as `"egress": "none"`, `bridge` as `"open"`).
    #[schemars(skip)]
    pub network: Option<String>,
    /// Read-only root filesystem with a tmpfs `/tmp`.
    pub readonly_rootfs: bool,
    /// With `readonlyRootfs` off: the size of the container's writable layer, in MiB (the
    /// engine's `--storage-opt size`, which overlay2 on xfs with `pquota`, btrfs, zfs and
    /// devicemapper support; on other engines rover says so once and runs without). 0: none.
    pub writable_layer_mb: u64,
    /// Environment variable names that may be passed into a sandbox. GitHub tokens are refused
    /// even when listed.
    pub env_allow: Vec<String>,
    /// Verification gates run after the agent, before the commit.
    pub gates: Vec<GateSettings>,
    /// Where the repository's git hooks run: `sandbox` (the default: every hook in a sandbox
    /// container) or `host` (hooks of the repository's own hooks dir run on the host, with the
    /// agent's worktree as their working directory; `start` warns).
    pub hooks: crate::git::HookMode,
    /// What one task may commit: the largest file, the total size and the number of files it
    /// adds or changes, checked before anything is staged.
    pub commit_limits: crate::git::CommitLimits,
    /// Commands that set up the repository's environment over `image` when its default branch
    /// has neither `.devcontainer/devcontainer.json` nor `.rover/setup.sh` (run once per
    /// definition, with the network; see docs/sandbox.md).
    pub setup: Vec<String>,
    /// How the repository's own environment image is built.
    pub environment: super::EnvironmentSettings,
    /// Which engine runs the sandboxes: `local` (the Docker engine rover talks to) or `swarm`
    /// (agent runs as Docker Swarm services, whose manager is at `ROVER_SWARM_HOST`; see
    /// docs/scale.md).
    pub backend: SandboxBackend,
    /// How the swarm backend places sandboxes (placement constraints).
    pub swarm: super::swarm::SwarmSettings,
    /// The registry the swarm backend pushes each sandbox image to and its nodes pull it from,
    /// as a registry host and a path images go under (`registry.example.com:5000/rover`); the
    /// login comes from `ROVER_REGISTRY_USERNAME` and `ROVER_REGISTRY_PASSWORD`. Unset: the
    /// images are loaded onto the nodes (`ROVER_SWARM_NODES`) or must be there. The local
    /// backend needs none and does not use it.
    pub registry: Option<String>,
    /// How a container gets the task's worktree: `shipped` (copied in through the engine's API,
    /// only what the agent produced taken back, checked, and applied) or `mounted` (the host's
    /// worktree bind-mounted; `local` only). Default: see [`SandboxBackend::default_workspace`].
    pub workspace: Option<WorkspaceMode>,
    /// The most a workspace taken back from a container may hold, in MiB (its tar as the engine
    /// sends it: every file's full size, a sparse one included). Past it the run fails and
    /// nothing of it reaches the worktree.
    pub workspace_limit_mb: u64,
    /// The most model requests one agent run may have in flight at once through rover's proxy;
    /// past it the proxy answers `429` (the CLIs retry).
    pub model_concurrency: u32,
}

/// Which engine runs the sandboxes (`autopilot.sandbox.backend`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum SandboxBackend {
    /// The Docker engine at `DOCKER_HOST` (or the local socket).
    #[default]
    Local,
    /// Docker Swarm: the sandbox runs as a service task on any node of the swarm.
    Swarm,
}

impl SandboxBackend {
    /// The name in `rover.json`.
    pub fn name(self) -> &'static str {
        match self {
            Self::Local => "local",
            Self::Swarm => "swarm",
        }
    }

    /// How the workspace reaches a container when `autopilot.sandbox.workspace` is not set:
    /// shipped on both (a sandbox on another node cannot see the host; on the local engine it
    /// measured 0.3 s more at start and 0.1 s back for a small repository, 0.6 s and 0.7 s for a
    /// 100 MB one: see docs/sandbox.md#the-workspace-travels).
    pub fn default_workspace(self) -> WorkspaceMode {
        match self {
            Self::Local | Self::Swarm => WorkspaceMode::Shipped,
        }
    }
}

/// How a container gets the task's worktree (`autopilot.sandbox.workspace`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum WorkspaceMode {
    /// Copied into the container through the engine's API before it starts; what the
    /// container leaves in `/workspace` is taken back, checked and applied to the worktree.
    Shipped,
    /// The host's worktree bind-mounted at `/workspace` (local engine only).
    Mounted,
}

impl Default for SandboxSettings {
    fn default() -> Self {
        Self {
            image: super::own_image::DEFAULT_IMAGE.to_string(),
            build: super::ImageBuildSettings::default(),
            memory_mb: 4096,
            cpus: 2.0,
            pids_limit: 1024,
            file_size_limit_mb: 4096,
            timeout_secs: 3600,
            log_limit_mb: 64,
            egress: Egress::default(),
            network: None,
            readonly_rootfs: true,
            writable_layer_mb: 10_240,
            env_allow: ["HOME", "IS_SANDBOX"].map(String::from).to_vec(),
            gates: Vec::new(),
            hooks: crate::git::HookMode::Sandbox,
            commit_limits: crate::git::CommitLimits::default(),
            setup: Vec::new(),
            environment: super::EnvironmentSettings::default(),
            backend: SandboxBackend::Local,
            swarm: super::swarm::SwarmSettings::default(),
            registry: None,
            workspace: None,
            workspace_limit_mb: 8192,
            model_concurrency: crate::proxy::DEFAULT_MAX_REQUESTS,
        }
    }
}

impl SandboxSettings {
    /// The limits as the engine wants them.
    pub fn limits(&self) -> ResourceLimits {
        ResourceLimits {
            memory_bytes: i64::try_from(self.memory_mb.saturating_mul(1024 * 1024))
                .unwrap_or(i64::MAX),
            cpus: self.cpus,
            pids: self.pids_limit,
            file_bytes: i64::try_from(self.file_size_limit_mb.saturating_mul(1024 * 1024))
                .unwrap_or(i64::MAX),
            writable_mb: self.writable_layer_mb,
            // At least a MiB: a zero limit would keep nothing of what went wrong.
            log_bytes: self.log_limit_mb.clamp(1, 1 << 20) * 1024 * 1024,
        }
    }

    /// How containers get the worktree: `workspace`, else the backend's default.
    pub fn workspace_mode(&self) -> WorkspaceMode {
        self.workspace
            .unwrap_or_else(|| self.backend.default_workspace())
    }

    /// The most bytes a workspace taken back from a container may hold.
    pub fn workspace_limit_bytes(&self) -> u64 {
        self.workspace_limit_mb.max(1).saturating_mul(1024 * 1024)
    }

    /// The egress in force: `egress`, or the replaced `network` key read as one.
    pub fn egress(&self) -> Egress {
        match self.network.as_deref() {
            Some("none") => Egress::Mode(super::egress::EgressMode::None),
            Some(_) => Egress::Mode(super::egress::EgressMode::Open),
            None => self.egress.clone(),
        }
    }

    /// What `rover.json` cannot say: a model key or endpoint in `envAllow`, a bad allow-list
    /// entry (`envAllow`, `environment.localEnv`), a `network` other than the two it still
    /// reads, or both keys at once.
    pub fn validate(&self) -> Result<(), String> {
        for name in &self.env_allow {
            if MODEL_ENV_REFUSED
                .iter()
                .any(|m| m.eq_ignore_ascii_case(name))
            {
                return Err(format!(
                    "autopilot.sandbox.envAllow: `{name}` would carry a model credential or endpoint into the sandbox, which rover no longer does: agents reach the model API through rover's proxy, which adds the key outside the container (see docs/sandbox.md#network-and-credentials). Remove `{name}` from envAllow and keep it in rover's own environment"
                ));
            }
        }
        match self.network.as_deref() {
            None | Some("none" | "bridge") => {}
            Some(other) => {
                return Err(format!(
                    "autopilot.sandbox.network: `{other}` is not supported any more; it is replaced by `egress` (\"model-only\", {{\"allow\": [hosts]}}, \"none\" or \"open\"): see docs/sandbox.md#network-and-credentials"
                ))
            }
        }
        self.swarm.validate()?;
        self.environment.validate()?;
        if let Some(registry) = &self.registry {
            super::swarm::registry::validate_prefix(registry)?;
        }
        if self.network.is_some() && self.egress != Egress::default() {
            return Err(
                "autopilot.sandbox: `network` and `egress` are both set; keep `egress` only".into(),
            );
        }
        self.egress.validate()
    }

    /// The wall-clock limit of one agent run.
    pub fn timeout(&self) -> std::time::Duration {
        std::time::Duration::from_secs(self.timeout_secs)
    }
}

/// One verification gate: a command run in the sandbox image with the worktree mounted.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct GateSettings {
    /// The command as argv, e.g. `["cargo", "test"]`.
    pub command: Vec<String>,
    /// Wall-clock limit in seconds.
    #[serde(default = "default_gate_timeout")]
    pub timeout_secs: u64,
    /// A required gate that fails or times out fails the workflow; an optional one warns.
    #[serde(default = "default_required")]
    pub required: bool,
}

fn default_gate_timeout() -> u64 {
    600
}

fn default_required() -> bool {
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_camel_case_and_fills_defaults() {
        let s: SandboxSettings = serde_json::from_str(
            r#"{"image":"me/sb:1","memoryMb":512,"network":"none","gates":[{"command":["make","test"],"timeoutSecs":30},{"command":["lint"],"required":false}]}"#,
        )
        .expect("valid settings");
        assert_eq!(s.image, "me/sb:1");
        assert_eq!(s.limits().memory_bytes, 512 * 1024 * 1024);
        assert_eq!(s.pids_limit, 1024);
        assert_eq!(s.limits().log_bytes, 64 * 1024 * 1024);
        let small: SandboxSettings = serde_json::from_str(r#"{"logLimitMb":8}"#).expect("valid");
        assert_eq!(small.limits().log_bytes, 8 * 1024 * 1024);
        assert_eq!(s.gates[0].timeout_secs, 30);
        assert!(s.gates[0].required);
        assert!(!s.gates[1].required);
        assert_eq!(s.gates[1].timeout_secs, 600);
    }

    #[test]
    fn backend_and_workspace_parse_and_default_per_backend() {
        let s = SandboxSettings::default();
        assert_eq!(s.backend, SandboxBackend::Local);
        assert_eq!(s.workspace_mode(), WorkspaceMode::Shipped);
        let s: SandboxSettings =
            serde_json::from_str(r#"{"backend":"local","workspace":"mounted"}"#).expect("valid");
        assert_eq!(s.workspace_mode(), WorkspaceMode::Mounted);
        assert!(s.validate().is_ok());
        let s: SandboxSettings = serde_json::from_str(r#"{"backend":"swarm"}"#).expect("valid");
        assert_eq!(s.backend, SandboxBackend::Swarm);
        assert_eq!(s.workspace_mode(), WorkspaceMode::Shipped);
        // A swarm whose nodes share rover's data dir at the same path may mount it.
        let s: SandboxSettings = serde_json::from_str(
            r#"{"backend":"swarm","workspace":"mounted","swarm":{"constraints":["node.role==worker"]}}"#,
        )
        .expect("parses");
        assert!(s.validate().is_ok());
        assert_eq!(s.swarm.constraints, ["node.role==worker"]);
        let err = serde_json::from_str::<SandboxSettings>(r#"{"backend":"k8s"}"#)
            .expect_err("unknown backend");
        assert!(err.to_string().contains("k8s"), "{err}");
    }

    #[test]
    fn a_registry_is_a_host_and_a_path() {
        let s: SandboxSettings = serde_json::from_str(
            r#"{"backend":"swarm","registry":"registry.example.com:5000/rover"}"#,
        )
        .expect("valid");
        assert_eq!(
            s.registry.as_deref(),
            Some("registry.example.com:5000/rover")
        );
        assert!(s.validate().is_ok());
        let s: SandboxSettings =
            serde_json::from_str(r#"{"backend":"swarm","registry":"acme/rover"}"#).expect("parses");
        let err = s.validate().expect_err("no registry host");
        assert!(
            err.contains("autopilot.sandbox.registry") && err.contains("Docker Hub"),
            "{err}"
        );
    }

    #[test]
    fn unknown_keys_are_errors() {
        let err = serde_json::from_str::<SandboxSettings>(r#"{"imag":"x"}"#).expect_err("typo");
        assert!(err.to_string().contains("imag"));
        assert!(serde_json::from_str::<GateSettings>(r#"{"command":[],"timeout":3}"#).is_err());
    }
}
