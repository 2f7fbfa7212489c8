//! `rover autopilot replay`: a recorded trace run again through this build's deciding steps,
//! with every model answer and GitHub read served from the trace's record and nothing sent
//! anywhere, reporting step by step the recorded decision, the new one, and the first
//! divergence (docs/observability.md, "Replay").
//!
//! - `bundle`: a trace with its replay records, from a store or an export file.
//! - `world`: the temporary store a replayed run reads. `world_fakes`: its GitHub and agent.
//! - `compare`: what is compared. `run`: the replay of one trace. `report`: the text output.

pub mod bundle;
pub mod compare;
pub mod report;
pub mod run;
pub mod world;
pub mod world_fakes;

use std::path::{Path, PathBuf};

pub use bundle::{BundleError, TraceBundle};
pub use run::{replay_trace, ReplaySettings, TraceReplay, Verdict};

/// Exit code: every trace replayed and nothing diverged.
pub const EXIT_SAME: u8 = 0;
/// Exit code: a step decided otherwise (also any error of the command).
pub const EXIT_DIVERGED: u8 = 1;
/// Exit code: nothing diverged, but a trace (or one of its deciding steps) cannot be replayed.
pub const EXIT_NOT_REPLAYABLE: u8 = 3;

/// The exit code of a set of replays.
pub fn exit_code<'a>(replays: impl IntoIterator<Item = &'a TraceReplay>) -> u8 {
    let mut code = EXIT_SAME;
    for r in replays {
        match r.verdict {
            Verdict::Diverged => return EXIT_DIVERGED,
            Verdict::NotReplayable => code = EXIT_NOT_REPLAYABLE,
            Verdict::Same => {}
        }
    }
    code
}

/// The export files of a folder (`*.json`, by name).
pub fn folder_files(dir: &Path) -> Result<Vec<PathBuf>, BundleError> {
    let io = |source| BundleError::Io {
        path: dir.to_owned(),
        source,
    };
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(io)?
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.is_file() && p.extension().is_some_and(|e| e == "json"))
        .collect();
    files.sort();
    Ok(files)
}
