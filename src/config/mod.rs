//! `rover.json`: the project's configuration, at the repository root, optional. Without it every
//! default applies. Unknown keys are an error that names the key, so a typo never silently
//! falls back to a default.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

use crate::agents::AgentSettings;
use crate::budget::BudgetSettings;
use crate::github::GitHubSettings;
use crate::orchestrator::OrchestratorSettings;
use crate::sandbox::SandboxSettings;

mod daemon_file;
mod daemon_section;
mod release;

pub use daemon_file::{DaemonFile, DaemonFileError, InstalledConfig, ServedAsApp, ServedRepo};
pub use daemon_section::{DaemonConfig, ScoreConfig};
pub use release::{Bump, ReleaseConfig, TagTemplate, Version};

/// The file name, at the repository root.
pub const FILE_NAME: &str = "rover.json";

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read {path}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path} is not valid: {reason} (see docs/configuration.md)")]
    Invalid { path: PathBuf, reason: String },
}

/// The whole file.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "camelCase")]
pub struct RoverConfig {
    /// Add `Co-Authored-By: Rover <noreply@endor.dev>` to rover's commits.
    pub attribution: bool,
    pub autopilot: AutopilotConfig,
    /// Reserved for other rover features; accepted and ignored here.
    #[serde(rename = "$schema")]
    pub schema: Option<String>,
}

/// The `autopilot` section.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "camelCase")]
pub struct AutopilotConfig {
    /// Which agent CLI (claude | codex), models per step, timeouts.
    pub agent: AgentSettings,
    pub github: GitHubSettings,
    pub sandbox: SandboxSettings,
    pub pipeline: PipelineConfig,
    /// Spending limits, the circuit breaker, hourly caps, stuck detection.
    pub budget: BudgetSettings,
    /// OpenTelemetry export of the traces (docs/observability.md).
    pub telemetry: TelemetryConfig,
    /// What happens after rover's pull request is green: a person merges (`pr`), or rover
    /// merges within the mode's rules (`dev`, `stage`, `prod`).
    pub lifecycle: LifecycleConfig,
    /// The daemon's agent slots and the scheduler's score (read only by a daemon serving this
    /// checkout alone; a daemon file has its own).
    pub daemon: DaemonConfig,
    /// What rover learns from ended traces and shows the agents (docs/memory.md).
    pub memory: crate::memory::MemorySettings,
}

/// `autopilot.lifecycle.mode`: how far rover carries its own pull request.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum LifecycleMode {
    /// rover opens the pull request and follows its CI; a person merges.
    #[default]
    Pr,
    /// rover merges its pull request once the required checks are green, no review needed.
    Dev,
    /// As `dev`, with a longer CI wait; the repository's branch protection applies in full.
    Stage,
    /// rover merges only after a trusted person approved the current head.
    Prod,
}

impl LifecycleMode {
    pub fn as_str(self) -> &'static str {
        match self {
            LifecycleMode::Pr => "pr",
            LifecycleMode::Dev => "dev",
            LifecycleMode::Stage => "stage",
            LifecycleMode::Prod => "prod",
        }
    }

    /// Whether rover merges its own pull requests in this mode.
    pub fn merges(self) -> bool {
        self != LifecycleMode::Pr
    }
}

/// `autopilot.lifecycle.mergeMethod`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum MergeMethod {
    #[default]
    Squash,
    Merge,
    Rebase,
}

impl MergeMethod {
    /// GitHub's `merge_method`.
    pub fn as_str(self) -> &'static str {
        match self {
            MergeMethod::Squash => "squash",
            MergeMethod::Merge => "merge",
            MergeMethod::Rebase => "rebase",
        }
    }
}

/// `autopilot.lifecycle`: from pull request to merged (docs/configuration.md).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "camelCase")]
pub struct LifecycleConfig {
    pub mode: LifecycleMode,
    pub merge_method: MergeMethod,
    /// How long rover waits for the required checks of its pull request before it stops
    /// following it, minutes (default: 5 in `dev`, 30 in `stage` and `prod`; `0`: checks not
    /// done at the first look are not waited for).
    pub ci_timeout_mins: Option<u64>,
    /// How long rover waits for a trusted approval (`prod`, or a change to what steers rover)
    /// before it says so on the thread (once), minutes; it goes on waiting (default 60).
    pub approval_timeout_mins: Option<u64>,
    /// Merges across the repository in any hour, at most (default 10); past it a merge waits.
    pub max_merges_per_hour: Option<u32>,
    /// After a merge, follow the checks of the merge commit on the base branch before the
    /// trace answers (default: on in a mode that merges).
    pub post_merge_ci: Option<bool>,
    /// What rover does when the checks are red on the base branch after its merge.
    pub on_red_main: OnRedMain,
    /// After the merge commit's checks passed on the base branch: `"none"`, or the next
    /// version's tag and a GitHub release of the merge commit (`{"tag": "v{major}.{minor}.{patch}",
    /// "bump": "patch"}`).
    pub release: ReleaseConfig,
}

/// `autopilot.lifecycle.onRedMain`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum OnRedMain {
    /// Answer on the original thread that the merge left the base branch red, with the
    /// failing checks.
    #[default]
    Notify,
    /// The same answer, and a new trace of rover's own that fixes the base branch (its pull
    /// request goes through the same mode's rules); a fix that leaves it red again is answered,
    /// not fixed again.
    Fix,
    /// The same answer, and a new trace of rover's own that reverts the merge commit (no agent
    /// writes it: git reverts it) in a pull request merged under the same mode's rules; a revert
    /// that leaves it red again is answered, not reverted again.
    Revert,
}

impl LifecycleConfig {
    pub fn ci_timeout(&self) -> Duration {
        let default = match self.mode {
            LifecycleMode::Pr | LifecycleMode::Dev => 5,
            LifecycleMode::Stage | LifecycleMode::Prod => 30,
        };
        Duration::from_secs(60 * self.ci_timeout_mins.unwrap_or(default))
    }

    /// `0`: said at the first look that waits.
    pub fn approval_timeout(&self) -> Duration {
        Duration::from_secs(60 * self.approval_timeout_mins.unwrap_or(60))
    }

    pub fn max_merges_per_hour(&self) -> u32 {
        self.max_merges_per_hour.unwrap_or(10)
    }

    /// Whether rover follows the checks of its merge commit on the base branch.
    pub fn post_merge_ci(&self) -> bool {
        self.mode.merges() && self.post_merge_ci.unwrap_or(true)
    }

    /// A release is made from a merge rover made, after its checks passed on the base branch.
    fn validate(&self) -> Result<(), String> {
        if self.release.tagged().is_none() {
            return Ok(());
        }
        if !self.mode.merges() {
            return Err("autopilot.lifecycle.release: rover releases only what it merged; set `mode` to dev, stage or prod".into());
        }
        if !self.post_merge_ci() {
            return Err("autopilot.lifecycle.release: a release is made only after the merge commit's checks passed on the base branch; `postMergeCi` cannot be false".into());
        }
        Ok(())
    }
}

/// `autopilot.telemetry`: `true`, `false`, or an object. Off by default; the standard
/// `OTEL_EXPORTER_OTLP_*` variables switch it on too and win over what is written here.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(try_from = "serde_json::Value")]
pub struct TelemetryConfig {
    pub enabled: bool,
    /// The collector's base URL (as `OTEL_EXPORTER_OTLP_ENDPOINT`).
    pub endpoint: Option<String>,
    /// `http/protobuf` (the default) or `grpc` (as `OTEL_EXPORTER_OTLP_PROTOCOL`).
    pub protocol: Option<String>,
    /// `service.name` (as `OTEL_SERVICE_NAME`; default `rover`).
    pub service_name: Option<String>,
    /// Export the text of spans too (summaries, reasons, errors), redacted as public comments
    /// are. Off: only ids, names, times, figures and rover's fixed vocabulary leave.
    pub content: bool,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct TelemetryObject {
    #[serde(default = "yes")]
    enabled: bool,
    #[serde(default)]
    endpoint: Option<String>,
    #[serde(default)]
    protocol: Option<String>,
    #[serde(default)]
    service_name: Option<String>,
    #[serde(default)]
    content: bool,
}

fn yes() -> bool {
    true
}

impl TryFrom<serde_json::Value> for TelemetryConfig {
    type Error = String;

    fn try_from(value: serde_json::Value) -> Result<TelemetryConfig, String> {
        if let serde_json::Value::Bool(enabled) = value {
            return Ok(TelemetryConfig {
                enabled,
                ..TelemetryConfig::default()
            });
        }
        let o: TelemetryObject =
            serde_json::from_value(value).map_err(|e| format!("{e} (true, false or an object)"))?;
        Ok(TelemetryConfig {
            enabled: o.enabled,
            endpoint: o.endpoint,
            protocol: o.protocol,
            service_name: o.service_name,
            content: o.content,
        })
    }
}

/// Limits of the pipeline itself.
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "camelCase")]
pub struct PipelineConfig {
    /// Runs started on one action (interruptions, retryable errors) before it is given up.
    pub max_attempts: u32,
    /// How many times the resolver may iterate or retry within one trace.
    pub max_retries: u32,
    /// The safety-net drain interval, seconds.
    pub fallback_interval_secs: u64,
    /// First backoff after a retryable error, seconds; doubled each attempt (at most five
    /// minutes), later when GitHub names a rate limit's reset.
    pub retry_backoff_secs: u64,
    /// How long running steps get at shutdown, seconds.
    pub shutdown_grace_secs: u64,
    /// How long a coordinator `wait` lasts before the trace is re-evaluated, seconds (a newer
    /// event about the same issue or pull request takes it over earlier).
    pub wait_secs: u64,
    /// How many waits one trace may decide; one more ends it in `noop`.
    pub max_waits: u32,
    /// Follow the CI of the pull requests rover pushes: red → the resolver, green → a notify.
    pub follow_ci: bool,
    /// How often rover looks at the CI of a pull request it pushed, seconds (a check run or
    /// status delivered by webhook for its head looks at once).
    pub ci_poll_secs: u64,
    /// How many looks at a pull request's CI before rover stops following it.
    pub ci_max_polls: u32,
    /// How long the worktrees, branches, containers and task mappings of an ended trace are
    /// kept (for a person to look, or `retry`) before they are reclaimed, days. Traces with a
    /// pushed pull request keep theirs until it is merged or closed.
    pub retain_days: u64,
    /// Key-shaped strings that are known fakes (test fixtures) a push may carry: the secret
    /// scan before a push does not count them. The exact value of a secret rover holds is
    /// refused whatever this says.
    pub allowed_key_shapes: Vec<String>,
    /// Before every push, a reviewer agent reads each task's diff against its acceptance
    /// criteria in the sandbox with read-only tools; `changes` goes back to the task as an
    /// iterate (bounded by `maxRetries`).
    pub self_review: bool,
}

impl Default for PipelineConfig {
    fn default() -> PipelineConfig {
        PipelineConfig {
            max_attempts: 3,
            max_retries: 3,
            fallback_interval_secs: 30,
            retry_backoff_secs: 5,
            shutdown_grace_secs: 20,
            wait_secs: 1800,
            max_waits: 6,
            follow_ci: true,
            ci_poll_secs: 300,
            ci_max_polls: 36,
            retain_days: 7,
            allowed_key_shapes: Vec::new(),
            self_review: true,
        }
    }
}

impl PipelineConfig {
    pub fn orchestrator(&self) -> OrchestratorSettings {
        OrchestratorSettings {
            fallback_interval: Duration::from_secs(self.fallback_interval_secs.max(1)),
            max_attempts: self.max_attempts.max(1),
            shutdown_grace: Duration::from_secs(self.shutdown_grace_secs),
            retry_backoff: Duration::from_secs(self.retry_backoff_secs),
        }
    }
}

impl RoverConfig {
    /// Load `rover.json` from the repository root; a missing file is the defaults.
    pub fn load(repo_root: &Path) -> Result<RoverConfig, ConfigError> {
        let path = repo_root.join(FILE_NAME);
        let text = match std::fs::read_to_string(&path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(RoverConfig::default()),
            Err(source) => return Err(ConfigError::Read { path, source }),
        };
        RoverConfig::parse(&text).map_err(|reason| ConfigError::Invalid { path, reason })
    }

    /// Errors name the key path of a wrong value (`autopilot.pipeline.maxRetries: invalid
    /// type ...`), not only its line and column.
    pub fn parse(text: &str) -> Result<RoverConfig, String> {
        let mut de = serde_json::Deserializer::from_str(text);
        let config: RoverConfig = serde_path_to_error::deserialize(&mut de).map_err(|e| {
            let path = e.path().to_string();
            if path == "." {
                e.into_inner().to_string()
            } else {
                format!("{path}: {}", e.into_inner())
            }
        })?;
        de.end().map_err(|e| e.to_string())?;
        config.autopilot.sandbox.validate()?;
        config.autopilot.lifecycle.validate()?;
        config.autopilot.daemon.slots("autopilot.daemon")?;
        if config.autopilot.daemon.budget != crate::budget::DaemonBudgetSettings::default() {
            return Err("autopilot.daemon.budget: a daemon serving one checkout has its budget in autopilot.budget; a daemon-wide budget goes in the daemon file's \"daemon\" (docs/configuration.md, \"The daemon file\")".into());
        }
        Ok(config)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_empty_file_is_every_default() {
        let c = RoverConfig::parse("{}").unwrap();
        assert!(!c.attribution);
        assert_eq!(c.autopilot.pipeline.max_attempts, 3);
        let m = &c.autopilot.memory;
        assert!(m.enabled);
        assert_eq!((m.max_entries, m.ttl_days, m.prompt_bytes), (200, 90, 2048));
        let off = RoverConfig::parse(
            r#"{"autopilot": {"memory": {"enabled": false, "promptBytes": 512}}}"#,
        )
        .unwrap()
        .autopilot
        .memory;
        assert!(!off.enabled);
        assert_eq!((off.max_entries, off.prompt_bytes), (200, 512));
    }

    #[test]
    fn unknown_keys_are_errors_that_name_the_key() {
        for (text, key) in [
            (r#"{"atribution": true}"#, "atribution"),
            (r#"{"autopilot": {"pipline": {}}}"#, "pipline"),
            (
                r#"{"autopilot": {"pipeline": {"maxAttempt": 2}}}"#,
                "maxAttempt",
            ),
            (r#"{"autopilot": {"memory": {"maxEntry": 2}}}"#, "maxEntry"),
        ] {
            let err = RoverConfig::parse(text).unwrap_err();
            assert!(err.contains(key), "{err}");
        }
    }

    #[test]
    fn poll_backlog_and_reconcile_keys_are_read_and_misspellings_refused() {
        let c = RoverConfig::parse(
            r#"{"autopilot": {"github": {"poll": {"backlog": 2, "reconcileIntervalSecs": 0}}}}"#,
        )
        .unwrap();
        assert_eq!(c.autopilot.github.poll.backlog, 2);
        assert_eq!(c.autopilot.github.poll.reconcile_interval_secs, 0);
        assert!(c.autopilot.github.poll.skip_backlog);
        let d = RoverConfig::parse("{}").unwrap();
        assert_eq!(
            (
                d.autopilot.github.poll.backlog,
                d.autopilot.github.poll.reconcile_interval_secs
            ),
            (0, 900)
        );
        let err = RoverConfig::parse(r#"{"autopilot": {"github": {"poll": {"backLog": 2}}}}"#)
            .unwrap_err();
        assert!(err.contains("backLog"), "{err}");
    }

    #[test]
    fn telemetry_is_a_switch_or_an_object_and_misspellings_are_refused() {
        assert!(
            !RoverConfig::parse("{}")
                .unwrap()
                .autopilot
                .telemetry
                .enabled
        );
        let on = RoverConfig::parse(r#"{"autopilot": {"telemetry": true}}"#).unwrap();
        assert!(on.autopilot.telemetry.enabled && !on.autopilot.telemetry.content);
        let c = RoverConfig::parse(
            r#"{"autopilot": {"telemetry": {"endpoint": "http://otel:4318", "content": true}}}"#,
        )
        .unwrap()
        .autopilot
        .telemetry;
        assert!(c.enabled && c.content);
        assert_eq!(c.endpoint.as_deref(), Some("http://otel:4318"));
        let err =
            RoverConfig::parse(r#"{"autopilot": {"telemetry": {"contents": true}}}"#).unwrap_err();
        assert!(err.contains("contents"), "{err}");
    }

    #[test]
    fn lifecycle_modes_have_their_defaults_and_misspellings_are_refused() {
        let d = RoverConfig::parse("{}").unwrap().autopilot.lifecycle;
        assert_eq!(d.mode, LifecycleMode::Pr);
        assert!(!d.mode.merges());
        assert_eq!(d.merge_method, MergeMethod::Squash);
        assert_eq!(d.max_merges_per_hour(), 10);
        let dev = RoverConfig::parse(r#"{"autopilot": {"lifecycle": {"mode": "dev"}}}"#)
            .unwrap()
            .autopilot
            .lifecycle;
        assert_eq!(dev.ci_timeout(), Duration::from_secs(300));
        let prod = RoverConfig::parse(
            r#"{"autopilot": {"lifecycle": {"mode": "prod", "mergeMethod": "rebase", "approvalTimeoutMins": 5}}}"#,
        )
        .unwrap()
        .autopilot
        .lifecycle;
        assert_eq!(prod.ci_timeout(), Duration::from_secs(1800));
        assert_eq!(prod.approval_timeout(), Duration::from_secs(300));
        assert_eq!(prod.merge_method.as_str(), "rebase");
        for (text, key) in [
            (
                r#"{"autopilot": {"lifecycle": {"mode": "production"}}}"#,
                "mode",
            ),
            (
                r#"{"autopilot": {"lifecycle": {"mergemethod": "squash"}}}"#,
                "mergemethod",
            ),
            (
                r#"{"autopilot": {"lifecycle": {"release": {"tag": "v{major}"}}}}"#,
                "autopilot.lifecycle.release",
            ),
            (
                r#"{"autopilot": {"lifecycle": {"release": {}}}}"#,
                "set `mode`",
            ),
            (
                r#"{"autopilot": {"lifecycle": {"mode": "dev", "postMergeCi": false, "release": {}}}}"#,
                "postMergeCi",
            ),
        ] {
            let err = RoverConfig::parse(text).unwrap_err();
            assert!(err.contains(key), "{err}");
        }
    }

    #[test]
    fn a_wrong_type_names_its_key_path() {
        let err = RoverConfig::parse(r#"{"autopilot": {"pipeline": {"maxRetries": "three"}}}"#)
            .unwrap_err();
        assert!(
            err.starts_with("autopilot.pipeline.maxRetries: invalid type"),
            "{err}"
        );
        assert!(RoverConfig::parse("{} trailing").is_err());
    }
}
