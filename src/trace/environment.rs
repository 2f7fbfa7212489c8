//! What `trace` says under a workflow about the image it ran in: the repository's environment
//! (built now or found cached, from which definition), a build that failed, or, while the
//! build still runs, how far it got (the last line of its log, read when `trace` runs).

use std::fmt::Write as _;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

use uuid::Uuid;

use crate::environment::{BuildingNote, EnvSource, EnvironmentSpanMeta};
use crate::store::{Meta, SpanStatus, TraceView};

/// The key a running workflow span gets in the view (never stored) while its environment builds.
pub const BUILDING_KEY: &str = EnvironmentSpanMeta::BUILDING_KEY;
/// How much of the log's end is read for its last line.
const TAIL_BYTES: u64 = 4096;

/// Marks the running spans of `view` whose environment build has a log but no record
/// yet (`artifacts` gives a span's artifacts dir): the log's path and its last line.
pub fn note_building(view: &mut TraceView, artifacts: impl Fn(Uuid) -> PathBuf) {
    for span in &mut view.spans {
        // Only a workflow run builds an environment (its log is in the run's artifacts).
        if span.status != SpanStatus::Running
            || EnvironmentSpanMeta::of(&span.meta).environment.is_some()
        {
            continue;
        }
        let log = crate::environment::build_log(&artifacts(span.id));
        if log.is_file() {
            EnvironmentSpanMeta {
                environment: None,
                environment_building: Some(BuildingNote {
                    last_line: last_line(&log),
                    log,
                }),
            }
            .put_into(&mut span.meta);
        }
    }
}

/// The last non-empty line of the end of `path` (bounded read).
fn last_line(path: &Path) -> String {
    let Ok(mut file) = std::fs::File::open(path) else {
        return String::new();
    };
    let len = file.metadata().map_or(0, |m| m.len());
    let _ = file.seek(SeekFrom::Start(len.saturating_sub(TAIL_BYTES)));
    let mut tail = Vec::new();
    let _ = file.take(TAIL_BYTES).read_to_end(&mut tail);
    String::from_utf8_lossy(&tail)
        .lines()
        .rev()
        .map(str::trim)
        .find(|l| !l.is_empty())
        .unwrap_or_default()
        .chars()
        // Build output printed on a terminal: no escape sequence of it gets through.
        .filter(|c| !c.is_control())
        .take(160)
        .collect()
}

/// The lines for a span's `meta`, each starting with `lead`; empty without an environment.
pub fn environment_lines(meta: &Meta, lead: &str) -> String {
    let mut out = String::new();
    let recorded = EnvironmentSpanMeta::of(meta);
    if let Some(building) = recorded.environment_building {
        let _ = writeln!(
            out,
            "{lead}environment: building (log {}): {}",
            building.log.display(),
            building.last_line
        );
        return out;
    }
    let Some(env) = recorded.environment else {
        return out;
    };
    let source = match env.source {
        EnvSource::Image => return out,
        other => serde_json::to_value(other)
            .ok()
            .and_then(|v| v.as_str().map(str::to_owned))
            .unwrap_or_default(),
    };
    let how = match (&env.error, env.built, env.duration_ms) {
        (Some(error), _, _) => format!("did not build: {}", error.lines().next().unwrap_or("")),
        (None, true, Some(ms)) => format!("built in {:.1} s", Duration(ms).secs()),
        (None, true, None) => "built".to_owned(),
        (None, false, _) => "cached".to_owned(),
    };
    let _ = writeln!(out, "{lead}environment: {} ({source}), {how}", env.image);
    if let Some(reproduce) = &env.reproduce {
        let _ = writeln!(out, "{lead}  reproduce: {reproduce}");
    }
    out
}

struct Duration(u64);

impl Duration {
    #[allow(
        clippy::cast_precision_loss,
        reason = "a figure for people, one decimal"
    )]
    fn secs(&self) -> f64 {
        self.0 as f64 / 1000.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{json, Value};

    #[test]
    fn a_built_a_cached_a_failed_and_a_building_environment_each_say_so() {
        let meta = |v: Value| -> Meta { serde_json::from_value(v).expect("meta") };
        let built = meta(
            json!({"environment": {"source": "devcontainer", "image": "rover-env:ab", "built": true, "durationMs": 12345}}),
        );
        assert_eq!(
            environment_lines(&built, "  "),
            "  environment: rover-env:ab (devcontainer), built in 12.3 s\n"
        );
        let cached = meta(
            json!({"environment": {"source": "setupScript", "image": "rover-env:cd", "built": false}}),
        );
        assert!(environment_lines(&cached, "").contains("(setupScript), cached"));
        let failed = meta(
            json!({"environment": {"source": "devcontainer", "image": "rover-env:ef", "built": false,
            "error": "the build failed at docker build\\nmore", "reproduce": "docker build ."}}),
        );
        let text = environment_lines(&failed, "");
        assert!(
            text.contains("did not build: the build failed at docker build"),
            "{text}"
        );
        assert!(text.contains("reproduce: docker build ."), "{text}");
        let plain = meta(
            json!({"environment": {"source": "image", "image": "rover-sandbox:latest", "built": false}}),
        );
        assert_eq!(environment_lines(&plain, ""), "");

        let dir = tempfile::tempdir().expect("tempdir");
        let log = crate::environment::build_log(dir.path());
        std::fs::create_dir_all(log.parent().unwrap()).unwrap();
        std::fs::write(
            &log,
            "rover: building\nStep 3/7 : RUN \u{1b}[31mpip install\n\n",
        )
        .unwrap();
        assert_eq!(last_line(&log), "Step 3/7 : RUN [31mpip install");
        let building = meta(json!({BUILDING_KEY: {"log": log, "lastLine": last_line(&log)}}));
        assert!(environment_lines(&building, "").starts_with("environment: building (log "));
    }
}
