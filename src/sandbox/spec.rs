//! What to run in a sandbox: image, argv, env, mounts, user, limits, network, labels.

use std::collections::BTreeMap;
use std::path::PathBuf;

use super::settings::{SandboxSettings, WorkspaceMode};

/// Label naming the rover project a container belongs to.
pub const LABEL_PROJECT: &str = "rover.project";
/// Label on the setup container of an environment build (see [`crate::environment`]): what a
/// failed or cut-off build leaves is found by it, here and by the leftovers' sweep.
pub const LABEL_ENV_BUILD: &str = "rover.env.build";
/// Label naming the trace a container works for.
pub const LABEL_TRACE: &str = "rover.trace";
/// Label naming the workflow action a container runs; one container per value.
pub const LABEL_ACTION: &str = "rover.action";
/// Where the worktree appears inside the container (read-write).
pub const WORKSPACE_MOUNT: &str = "/workspace";
/// Where the optional input dir (prompt, dependency outputs) appears (read-only).
pub const INPUT_MOUNT: &str = "/rover";

/// One more bind mount.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BindMount {
    pub host: PathBuf,
    /// Absolute path inside the container.
    pub target: String,
    pub read_only: bool,
}

/// The three labels every rover container carries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SandboxLabels {
    pub project: String,
    pub trace: String,
    pub action: String,
}

/// Resource limits of one container.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ResourceLimits {
    /// Memory limit in bytes (swap is not added on top).
    pub memory_bytes: i64,
    /// CPUs (fractions allowed).
    pub cpus: f64,
    /// Maximum number of processes.
    pub pids: i64,
    /// The largest file any process of the container may write, in bytes (`RLIMIT_FSIZE`: the
    /// kernel refuses a write or a truncate past it with `EFBIG`, a sparse file included).
    pub file_bytes: i64,
    /// The size of the writable layer in MiB when the root filesystem is writable (0: none).
    pub writable_mb: u64,
    /// Most bytes of one output stream kept per run (rover's files, and each of the engine's
    /// two log files).
    pub log_bytes: u64,
}

/// Everything needed to start one sandbox container.
#[derive(Debug, Clone)]
pub struct SandboxSpec {
    /// The image (must be present locally).
    pub image: String,
    /// The command as argv (no shell involved unless the argv itself names one).
    pub cmd: Vec<String>,
    /// Environment pairs from the caller; every name must be allow-listed (see `check_env`).
    pub env: Vec<(String, String)>,
    /// The worktree: its content appears at [`WORKSPACE_MOUNT`] (also the working dir), shipped
    /// or bind-mounted as [`SandboxSpec::workspace`] says.
    pub worktree: PathBuf,
    /// How the worktree and every other host path of the spec (`input_dir`, `extra_mounts`)
    /// reach the container. [`WorkspaceMode::Shipped`]: each is copied into a volume of the
    /// container through the engine's API before it starts (links as links, the worktree's
    /// `.git` left out unless a mount puts rover's git file there), nothing of the host is
    /// mounted, and nothing comes back unless rover takes `/workspace` back
    /// ([`super::Sandbox::fetch_workspace`]). [`WorkspaceMode::Mounted`]: bind mounts.
    pub workspace: WorkspaceMode,
    /// The most bytes a shipped `/workspace` taken back may hold
    /// (`autopilot.sandbox.workspaceLimitMb`).
    pub workspace_limit: u64,
    /// Take `/workspace` back and apply it to the worktree when the container has run to its
    /// end ([`super::gates::run_to_end`]; corrective commands); a gate's changes are not kept.
    pub take_back: bool,
    /// The worktree is only read: bind-mounted read-only ([`WorkspaceMode::Mounted`]); a
    /// shipped copy is never taken back whatever the container does to it (the reviewer).
    pub workspace_read_only: bool,
    /// An optional directory bind-mounted read-only at [`INPUT_MOUNT`].
    pub input_dir: Option<PathBuf>,
    /// `uid:gid` to run as; `None` means the owner of the worktree, so files the agent writes
    /// belong to whoever owns the checkout.
    pub user: Option<String>,
    pub limits: ResourceLimits,
    /// Docker network mode (`none`, `bridge`) or the name of the run's own network.
    pub network: String,
    /// The servers the engine's resolver forwards the container's name lookups to; empty: the
    /// engine's own (the host's). A closed run network gets [`DNS_SINK`].
    pub dns: Vec<String>,
    /// Rover's proxy dir, when `network` is the run's own network through rover's proxy: a
    /// backend whose containers cannot be filled through an engine on this machine (the swarm)
    /// ships the workspace over that network, leaving it in the run's dir there.
    pub proxy_dir: Option<PathBuf>,
    /// Variables rover sets itself (the proxy's address and the run's token): not subject to
    /// `envAllow`, and never a credential of the host.
    pub rover_env: Vec<(String, String)>,
    /// Read-only root filesystem with a tmpfs `/tmp` (HOME points there).
    pub readonly_rootfs: bool,
    pub labels: SandboxLabels,
    /// More labels (tests add `rover.test`, gates add `rover.gate`).
    pub extra_labels: BTreeMap<String, String>,
    /// More bind mounts (e.g. the git metadata from [`SandboxSpec::mount_git`]).
    pub extra_mounts: Vec<BindMount>,
    /// Container name; `None` derives `rover-<action>` so a second container for the same action
    /// is refused by the engine itself.
    pub name: Option<String>,
}

/// The DNS server of a container on a closed run network: an address of TEST-NET-1 (RFC 5737,
/// never routed). Engines without the fix for CVE-2024-29018 forward the name lookups of an
/// `--internal` network to the host's own resolver when that is on the host's loopback; a
/// server the container names is asked from the container's own namespace, where this one is
/// unreachable (no route). Names on the run's network (`rover-proxy`) are answered by the
/// engine itself and never forwarded.
pub const DNS_SINK: &str = "192.0.2.1";

impl SandboxSpec {
    /// A spec with the image, limits, network and rootfs mode from `settings`.
    pub fn from_settings(
        settings: &SandboxSettings,
        cmd: Vec<String>,
        worktree: impl Into<PathBuf>,
        labels: SandboxLabels,
    ) -> Self {
        Self {
            image: settings.image.clone(),
            cmd,
            env: Vec::new(),
            worktree: worktree.into(),
            workspace: settings.workspace_mode(),
            workspace_limit: settings.workspace_limit_bytes(),
            take_back: false,
            workspace_read_only: false,
            input_dir: None,
            user: None,
            limits: settings.limits(),
            // Gates, hooks and corrective commands: offline unless the egress is `open`. An agent
            // container gets its run's network when it is launched.
            dns: Vec::new(),
            network: if settings.egress().is_open() {
                "bridge".to_owned()
            } else {
                "none".to_owned()
            },
            proxy_dir: None,
            rover_env: Vec::new(),
            readonly_rootfs: settings.readonly_rootfs,
            labels,
            extra_labels: BTreeMap::new(),
            extra_mounts: Vec::new(),
            name: None,
        }
    }

    /// Labels the spec's containers (and their volumes) with the store they work for, so
    /// `gc` can tell them once that store is gone (see [`super::leftovers`]).
    pub fn owned_by(&mut self, store: &std::path::Path) {
        self.extra_labels
            .extend(super::leftovers::owner_labels(store));
    }

    /// Mounts a scratch git for the container (see [`crate::git::SandboxGit`]): the scratch
    /// repository read-write, the repository's objects read-only, and a git file naming the
    /// scratch repository read-only over the worktree's `.git`, which the container can then
    /// neither edit, remove nor replace.
    pub fn mount_git(&mut self, git: &crate::git::SandboxGit) {
        self.extra_mounts.push(BindMount {
            host: git.repo_dir.clone(),
            target: crate::git::SANDBOX_GIT_DIR.to_owned(),
            read_only: false,
        });
        self.extra_mounts.push(BindMount {
            host: git.objects_dir.clone(),
            target: crate::git::SANDBOX_OBJECTS_DIR.to_owned(),
            read_only: true,
        });
        self.extra_mounts.push(BindMount {
            host: git.gitfile.clone(),
            target: format!("{WORKSPACE_MOUNT}/.git"),
            read_only: true,
        });
    }

    /// Whether the worktree is shipped rather than mounted.
    pub fn shipped(&self) -> bool {
        self.workspace == WorkspaceMode::Shipped
    }

    /// All labels as a map.
    pub fn all_labels(&self) -> BTreeMap<String, String> {
        let mut labels = self.extra_labels.clone();
        labels.insert(LABEL_PROJECT.to_string(), self.labels.project.clone());
        labels.insert(LABEL_TRACE.to_string(), self.labels.trace.clone());
        labels.insert(LABEL_ACTION.to_string(), self.labels.action.clone());
        labels
    }

    /// The container name: given, or `rover-<action>` with only `[a-zA-Z0-9_.-]` kept.
    pub fn container_name(&self) -> String {
        let raw = self
            .name
            .clone()
            .unwrap_or_else(|| format!("rover-{}", self.labels.action));
        let cleaned: String = raw
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-') {
                    c
                } else {
                    '-'
                }
            })
            .take(120)
            .collect();
        if cleaned
            .chars()
            .next()
            .is_some_and(|c| c.is_ascii_alphanumeric())
        {
            cleaned
        } else {
            format!("rover{cleaned}")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_derive_from_the_action_and_are_safe() {
        let mut spec = SandboxSpec::from_settings(
            &SandboxSettings::default(),
            vec!["true".into()],
            "/tmp",
            SandboxLabels {
                project: "p".into(),
                trace: "t".into(),
                action: "a1/../x y".into(),
            },
        );
        assert_eq!(spec.container_name(), "rover-a1-..-x-y");
        spec.name = Some("_x".into());
        assert_eq!(spec.container_name(), "rover_x");
        let labels = spec.all_labels();
        assert_eq!(labels[LABEL_ACTION], "a1/../x y");
        assert_eq!(labels.len(), 3);
    }
}
