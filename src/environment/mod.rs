//! Per-repository environments: the image a repository's workflow agents, gates and sandboxed
//! hooks run in, built from what the repository declares on its default branch (a
//! `.devcontainer/devcontainer.json`, else `.rover/setup.sh` or `autopilot.sandbox.setup`), with
//! the agent CLIs and rover's settings layered on top, cached by a content hash of everything
//! that defines it. See docs/sandbox.md, "Per-repository environments".

mod build;
mod build_log;
mod definition;
mod devcontainer;
mod error;
pub mod gc;
mod layer;
pub mod preflight;
mod record;

pub use crate::sandbox::EnvironmentSettings;
pub use build::{build, BuildPlan, BuildRequest, BUILD_LOG};
pub use definition::{define, Definition, LOCKFILES, SETUP_SCRIPT};
pub use devcontainer::{
    parse_devcontainer, strip_jsonc, DefinitionPath, DevcontainerConfig, LocalEnv,
    DEVCONTAINER_PATHS, LOCAL_ENV_KEY,
};
pub use error::EnvironmentError;
pub use layer::{rover_layer, setup_config};
pub use record::{BuildingNote, EnvSource, EnvironmentMeta, EnvironmentSpanMeta};

/// The image repository of built environments (`rover-env:<hash>`).
pub const ENV_REPO: &str = "rover-env";
/// Label on a built environment image naming its project (what `gc` lists by).
pub const LABEL_ENV_PROJECT: &str = "rover.env.project";
/// Label on a built environment image holding its content hash.
pub const LABEL_ENV_HASH: &str = "rover.env.hash";
/// Label on the setup container of a build (kept with the sandbox's labels, which the leftovers'
/// sweep reads).
pub use crate::sandbox::LABEL_ENV_BUILD;
/// The id label of the build's `devcontainer read-configuration`, which no container has (so the
/// CLI reads the definition and its image, never a container's).
pub const LABEL_ENV_CHECK: &str = "rover.env.check";

/// The directory of the environment build of a workflow span whose artifacts are in
/// `artifacts` (its checkout, rover's layer and [`BUILD_LOG`]).
pub fn build_dir(artifacts: &std::path::Path) -> std::path::PathBuf {
    artifacts.join("environment")
}

/// The log of the environment build of a workflow span whose artifacts are in `artifacts`:
/// where the build writes it and where `trace` reads it while it runs.
pub fn build_log(artifacts: &std::path::Path) -> std::path::PathBuf {
    build_dir(artifacts).join(BUILD_LOG)
}
