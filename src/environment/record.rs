//! `EnvironmentMeta`: what the workflow span records about the image its task ran in.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// Where a task's environment came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum EnvSource {
    /// `.devcontainer/devcontainer.json` (or `.devcontainer.json`) on the default branch.
    Devcontainer,
    /// `.rover/setup.sh` on the default branch, run over `autopilot.sandbox.image`.
    SetupScript,
    /// `autopilot.sandbox.setup` commands, run over `autopilot.sandbox.image`.
    SetupCommands,
    /// Nothing declared: `autopilot.sandbox.image` as it is.
    Image,
}

/// The environment of one workflow run: the image, how it was defined, and whether this run
/// built it (its log, duration and the command that reproduces a failure) or found it cached.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EnvironmentMeta {
    pub source: EnvSource,
    /// The image the agent, the gates and the sandboxed hooks run in.
    pub image: String,
    /// The content hash naming the image (`rover-env:<hash>`); none for [`EnvSource::Image`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hash: Option<String>,
    /// The default branch's commit the definition was read from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub commit: Option<String>,
    /// The files of that commit the hash covers.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub inputs: Vec<String>,
    /// `true` when this run built the image, `false` when it was there already.
    pub built: bool,
    /// How long the build took.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duration_ms: Option<u64>,
    /// The build's log (the setup's output included).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub log: Option<PathBuf>,
    /// Parts of the definition rover does not apply to its containers, in words.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<String>,
    /// Why the build failed: the failing command's last output lines.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// The shell command that runs the failed part of the build again, by hand.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reproduce: Option<String>,
}

impl EnvironmentMeta {
    /// The configured image, used as it is.
    pub fn image(image: &str) -> Self {
        Self {
            source: EnvSource::Image,
            image: image.to_owned(),
            hash: None,
            commit: None,
            inputs: Vec::new(),
            built: false,
            duration_ms: None,
            log: None,
            notes: Vec::new(),
            error: None,
            reproduce: None,
        }
    }
}

/// What a workflow span says of its environment, as readers (`trace`) take it from the span's
/// meta: the record once the image is known, or, in a view while the build still runs, where
/// its log is and its last line (never stored: `trace` adds it to the view it prints).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EnvironmentSpanMeta {
    #[serde(
        default,
        deserialize_with = "lenient",
        skip_serializing_if = "Option::is_none"
    )]
    pub environment: Option<EnvironmentMeta>,
    #[serde(
        default,
        deserialize_with = "lenient",
        skip_serializing_if = "Option::is_none"
    )]
    pub environment_building: Option<BuildingNote>,
}

/// A build still running: its log and the last line in it when `trace` looked.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BuildingNote {
    pub log: PathBuf,
    pub last_line: String,
}

impl EnvironmentSpanMeta {
    /// The key of [`EnvironmentSpanMeta::environment_building`].
    pub const BUILDING_KEY: &'static str = "environmentBuilding";

    /// What `meta` says (nothing, for keys that are absent or do not read as their record).
    pub fn of(meta: &crate::store::Meta) -> EnvironmentSpanMeta {
        crate::store::from_meta(meta).unwrap_or_default()
    }

    /// Merges its keys into a span's meta (in a view).
    pub fn put_into(&self, meta: &mut crate::store::Meta) {
        if let Ok(serde_json::Value::Object(map)) = serde_json::to_value(self) {
            meta.extend(map);
        }
    }
}

/// A value that does not read as its record reads as none (an older or foreign writer's).
fn lenient<'de, D, T>(d: D) -> Result<Option<T>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: serde::de::DeserializeOwned,
{
    let value = serde_json::Value::deserialize(d)?;
    Ok(serde_json::from_value(value).ok())
}
