//! What a step run read from the world, kept beside its span so that `rover autopilot replay`
//! can run the same decision again without the world: every GitHub read with its answer, the
//! task mappings the step saw, and each agent answer with the SHA-256 of the prompt that asked
//! for it.
//!
//! The orchestrator runs every step's `process` inside [`recording`]; the GitHub client, the
//! trust check and the agent call note what they read with the `note_*` functions (no-ops
//! outside a recording). When the run noted anything, the record is written once, at its end,
//! to `artifacts/<span id>/replay.json` ([`REPLAY_FILE`]). Bounded: GitHub answers beyond
//! [`MAX_READ_BYTES`] in one run are dropped and the record says `truncated` (replay then
//! reports that step as not replayable); a run keeps at most [`MAX_ANSWERS`] agent answers of
//! at most [`MAX_ANSWER_BYTES`] each.

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};
use serde_json::Value;
use uuid::Uuid;

use super::error::Result;
use super::fsio::{ensure_dir, read_json, write_json_atomic};
use super::records::TaskMapping;
use super::AutopilotStore;

/// The record's file name in the span's artifacts directory.
pub const REPLAY_FILE: &str = "replay.json";
/// The record format's version.
pub const REPLAY_RECORD_VERSION: u32 = 1;
/// The most bytes of GitHub answers one run keeps (serialized JSON).
pub const MAX_READ_BYTES: usize = 512 * 1024;
/// The most agent answers one run keeps.
pub const MAX_ANSWERS: usize = 4;
/// The longest agent answer kept (serialized JSON); a longer one is dropped (`truncated`).
pub const MAX_ANSWER_BYTES: usize = 256 * 1024;
/// The most task mappings kept (a store with more: `truncated`).
pub const MAX_MAPPINGS: usize = 500;

/// Everything one step run read, as replay needs it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ReplayRecord {
    pub version: u32,
    /// GitHub reads in the order they were made.
    #[serde(default)]
    pub github_reads: Vec<RecordedRead>,
    /// The task mappings the step read from `state.json` (all of them, as it saw them).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub task_mappings: Option<BTreeMap<String, TaskMapping>>,
    /// Agent answers in the order they came.
    #[serde(default)]
    pub answers: Vec<RecordedAnswer>,
    /// What the step read of the world besides GitHub and its agent, under names the step
    /// chose (the clock, what other traces of the store hold, what git computed): a replay
    /// serves them back instead of reading them again.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub world_reads: Vec<RecordedRead>,
    /// Something was left out for the bounds: the run cannot be replayed faithfully.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub truncated: bool,
}

/// One GitHub read: which call, its argument, and what GitHub answered.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RecordedRead {
    /// The `GitHub` trait method (`get_issue`, `permission`, `ci_status`, ...).
    pub call: String,
    /// Its argument as text (a number, a login, a sha).
    pub key: String,
    /// The answer, as the method returned it (absent for an error).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ok: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<RecordedError>,
}

/// A GitHub read that failed.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RecordedError {
    pub message: String,
    /// GitHub answered 404.
    #[serde(default)]
    pub not_found: bool,
    #[serde(default)]
    pub retryable: bool,
    /// When GitHub said to try again (a rate limit's reset).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_at: Option<chrono::DateTime<chrono::Utc>>,
    /// The HTTP status GitHub answered, when a step tells its refusals apart by it (405, 409,
    /// 422 of a merge).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<u16>,
    /// GitHub's own words (its `message`, then each of its `errors`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub said: Vec<String>,
}

/// One structured agent answer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RecordedAnswer {
    /// The agent step (`coordinate`, `plan`, `resolve`, ...).
    pub step: String,
    /// SHA-256 (hex) of the system prompt, a NUL, and the prompt: a changed prompt shows.
    pub prompt_sha256: String,
    /// The structured answer as the step parsed it (absent when the call failed).
    #[serde(default, skip_serializing_if = "Value::is_null")]
    pub answer: Value,
    /// The call failed: its error (message and whether it was retryable).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<RecordedError>,
}

tokio::task_local! {
    static RECORDER: Arc<Mutex<ReplayRecord>>;
    static SERVING: Arc<Served>;
}

/// A record a replayed run is served from, with how often each world read was asked.
struct Served {
    record: ReplayRecord,
    asked: Asked,
}

fn with_recorder(f: impl FnOnce(&mut ReplayRecord)) {
    let _ = RECORDER.try_with(|r| {
        let mut record = r.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        f(&mut record);
    });
}

/// Run `fut` (a step's `process`) recording what it reads; the record goes to the span's
/// artifacts when anything was noted, or `always` (a step that declares every run recorded:
/// replay then knows a run that read nothing needed nothing). A failed
/// write loses only the replay of this run (logged).
pub async fn recording<F: Future>(
    store: &AutopilotStore,
    span_id: Uuid,
    always: bool,
    fut: F,
) -> F::Output {
    let recorder = Arc::new(Mutex::new(ReplayRecord {
        version: REPLAY_RECORD_VERSION,
        ..ReplayRecord::default()
    }));
    let out = RECORDER.scope(recorder.clone(), fut).await;
    let record = recorder
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .clone();
    let empty = record.github_reads.is_empty()
        && record.answers.is_empty()
        && record.world_reads.is_empty()
        && record.task_mappings.is_none()
        && !record.truncated;
    if empty && !always {
        return out;
    }
    let store = store.clone();
    let written = tokio::task::spawn_blocking(move || write_record(&store, span_id, &record)).await;
    match written {
        Ok(Ok(())) => {}
        Ok(Err(e)) => {
            tracing::warn!(error = &e as &dyn std::error::Error, %span_id, "cannot keep the replay record of a step run");
        }
        Err(e) => tracing::warn!(error = %e, %span_id, "writing the replay record panicked"),
    }
    out
}

/// Whether this task runs inside [`recording`] (callers skip serializing answers otherwise).
pub fn is_recording() -> bool {
    RECORDER.try_with(|_| ()).is_ok()
}

/// Note a GitHub read and its answer (no-op outside a recording).
pub fn note_read(call: &str, key: &str, answer: std::result::Result<Value, RecordedError>) {
    with_recorder(|record| {
        let read = match answer {
            Ok(value) => RecordedRead {
                call: call.to_owned(),
                key: key.to_owned(),
                ok: Some(value),
                error: None,
            },
            Err(error) => RecordedRead {
                call: call.to_owned(),
                key: key.to_owned(),
                ok: None,
                error: Some(error),
            },
        };
        let used: usize = record.github_reads.iter().map(read_bytes).sum();
        if used + read_bytes(&read) > MAX_READ_BYTES {
            record.truncated = true;
        } else {
            record.github_reads.push(read);
        }
    });
}

fn read_bytes(read: &RecordedRead) -> usize {
    serde_json::to_vec(read).map_or(0, |v| v.len())
}

/// Note a read of the world besides GitHub (`call(key)` and its answer; no-op outside a
/// recording), for [`recalled`] to serve back in a replay.
pub fn note_world_read<T: Serialize>(call: &str, key: &str, value: &T) {
    with_recorder(|record| {
        let Ok(value) = serde_json::to_value(value) else {
            record.truncated = true;
            return;
        };
        let read = RecordedRead {
            call: call.to_owned(),
            key: key.to_owned(),
            ok: Some(value),
            error: None,
        };
        let used: usize = record
            .github_reads
            .iter()
            .chain(&record.world_reads)
            .map(read_bytes)
            .sum();
        if used + read_bytes(&read) > MAX_READ_BYTES {
            record.truncated = true;
        } else {
            record.world_reads.push(read);
        }
    });
}

/// Run `fut` (a replayed step's `process`) served from `record`: [`recalled`] answers from
/// its world reads.
pub async fn serving<F: Future>(record: ReplayRecord, fut: F) -> F::Output {
    let served = Arc::new(Served {
        record,
        asked: Mutex::new(BTreeMap::new()),
    });
    SERVING.scope(served, fut).await
}

/// Whether this task is a replayed run ([`serving`]): it must not read the world itself.
pub fn is_serving() -> bool {
    SERVING.try_with(|_| ()).is_ok()
}

/// In a replayed run, the recorded answer of the world read `call(key)` (the n-th asking
/// gets the n-th recorded answer, the last again past the end); `None` outside a replay or
/// when the recording has none (a record of an older rover).
pub fn recalled<T: serde::de::DeserializeOwned>(call: &str, key: &str) -> Option<T> {
    SERVING
        .try_with(|served| {
            next_read(&served.record.world_reads, &served.asked, call, key)?
                .ok
                .clone()
                .and_then(|v| serde_json::from_value(v).ok())
        })
        .ok()
        .flatten()
}

/// How often a replay asked each read, by call and key.
pub type Asked = Mutex<BTreeMap<(String, String), usize>>;

/// The recorded read a replay serves when it asks `call(key)` again: the n-th asking gets the
/// n-th recorded answer, the last again past the end; `None` when none was recorded.
pub fn next_read<'r>(
    reads: &'r [RecordedRead],
    asked: &Asked,
    call: &str,
    key: &str,
) -> Option<&'r RecordedRead> {
    let matching: Vec<&RecordedRead> = reads
        .iter()
        .filter(|r| r.call == call && r.key == key)
        .collect();
    if matching.is_empty() {
        return None;
    }
    let mut asked = asked
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let next = asked.entry((call.to_owned(), key.to_owned())).or_insert(0);
    let index = (*next).min(matching.len() - 1);
    *next += 1;
    Some(matching[index])
}

/// The world read `call(key)`: its recorded answer in a replay, otherwise `live()`, noted for
/// a later replay when recording.
pub fn recall<T: Serialize + serde::de::DeserializeOwned>(
    call: &str,
    key: &str,
    live: impl FnOnce() -> T,
) -> T {
    if let Some(value) = recalled(call, key) {
        return value;
    }
    let value = live();
    note_world_read(call, key, &value);
    value
}

/// Note the task mappings the step read (the last note wins).
pub fn note_mappings(mappings: &BTreeMap<String, TaskMapping>) {
    with_recorder(|record| {
        if mappings.len() > MAX_MAPPINGS {
            record.truncated = true;
            return;
        }
        record.task_mappings = Some(mappings.clone());
    });
}

/// Note an agent answer (or the call's failure) with its prompt.
pub fn note_answer(
    step: &str,
    system_prompt: &str,
    prompt: &str,
    answer: std::result::Result<Value, RecordedError>,
) {
    with_recorder(|record| {
        let (answer, error) = match answer {
            Ok(value) => (value, None),
            Err(e) => (Value::Null, Some(e)),
        };
        let size = serde_json::to_vec(&answer).map_or(usize::MAX, |v| v.len());
        if record.answers.len() >= MAX_ANSWERS || size > MAX_ANSWER_BYTES {
            record.truncated = true;
            return;
        }
        record.answers.push(RecordedAnswer {
            step: step.to_owned(),
            prompt_sha256: prompt_sha256(system_prompt, prompt),
            answer,
            error,
        });
    });
}

/// The hash a recorded answer carries of the prompt that asked for it.
pub fn prompt_sha256(system_prompt: &str, prompt: &str) -> String {
    use sha2::{Digest, Sha256};
    let mut hasher = Sha256::new();
    hasher.update(system_prompt.as_bytes());
    hasher.update([0u8]);
    hasher.update(prompt.as_bytes());
    hasher
        .finalize()
        .iter()
        .fold(String::with_capacity(64), |mut s, b| {
            use std::fmt::Write as _;
            let _ = write!(s, "{b:02x}");
            s
        })
}

fn write_record(store: &AutopilotStore, span_id: Uuid, record: &ReplayRecord) -> Result<()> {
    let dir = store.artifacts_dir(span_id);
    ensure_dir(&dir)?;
    write_json_atomic(&dir.join(REPLAY_FILE), record)
}

/// The replay record of a span's run, if it has one (an unreadable one is an error naming it).
pub fn read_record(store: &AutopilotStore, span_id: Uuid) -> Result<Option<ReplayRecord>> {
    read_json(&store.artifacts_dir(span_id).join(REPLAY_FILE))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn world_reads_are_noted_when_recording_and_served_back_in_a_replay() {
        let dir = tempfile::tempdir().unwrap();
        let store = AutopilotStore::open(dir.path(), "p").unwrap();
        let span = Uuid::new_v4();
        // Outside a recording and a replay: live, noted nowhere.
        assert_eq!(recall("clock", "", || 1_u64), 1);
        assert!(!is_serving());
        recording(&store, span, false, async {
            assert_eq!(recall("clock", "", || 7_u64), 7);
            assert_eq!(recall("clock", "", || 8_u64), 8);
            note_world_read("merges", "", &vec!["a".to_owned()]);
        })
        .await;
        let record = read_record(&store, span).unwrap().unwrap();
        assert_eq!(record.world_reads.len(), 3);
        let served = serving(record, async {
            assert!(is_serving());
            // In order per call and key, the last again past the end; live only when absent.
            let clocks = [
                recall("clock", "", || 0_u64),
                recall("clock", "", || 0_u64),
                recall("clock", "", || 0_u64),
            ];
            let merges: Option<Vec<String>> = recalled("merges", "");
            let other: Option<u64> = recalled("clock", "another key");
            (clocks, merges, other)
        })
        .await;
        assert_eq!(served, ([7, 8, 8], Some(vec!["a".to_owned()]), None));
    }

    #[tokio::test]
    async fn a_recording_keeps_reads_and_answers_and_bounds_them() {
        let dir = tempfile::tempdir().unwrap();
        let store = AutopilotStore::open(dir.path(), "p").unwrap();
        let span = Uuid::new_v4();
        recording(&store, span, false, async {
            note_read("get_issue", "7", Ok(serde_json::json!({"number": 7})));
            note_read(
                "permission",
                "bob",
                Err(RecordedError {
                    message: "404".into(),
                    not_found: true,
                    ..RecordedError::default()
                }),
            );
            note_answer(
                "coordinate",
                "sys",
                "prompt",
                Ok(serde_json::json!({"a": 1})),
            );
        })
        .await;
        let record = read_record(&store, span).unwrap().unwrap();
        assert_eq!(record.github_reads.len(), 2);
        assert_eq!(
            record.answers[0].prompt_sha256,
            prompt_sha256("sys", "prompt")
        );
        assert_ne!(
            prompt_sha256("sys", "prompt"),
            prompt_sha256("sy", "sprompt")
        );
        assert!(!record.truncated);

        let big = Uuid::new_v4();
        recording(&store, big, false, async {
            let blob = "x".repeat(MAX_READ_BYTES / 2);
            for n in 0..3 {
                note_read("get_issue", &n.to_string(), Ok(Value::String(blob.clone())));
            }
        })
        .await;
        let record = read_record(&store, big).unwrap().unwrap();
        assert!(record.truncated);
        assert_eq!(record.github_reads.len(), 1);

        // Nothing noted: no file; outside a recording a note is a no-op.
        let quiet = Uuid::new_v4();
        recording(&store, quiet, false, async {}).await;
        note_read("get_issue", "1", Ok(Value::Null));
        assert!(read_record(&store, quiet).unwrap().is_none());
        // A deciding step's run keeps its (empty) record all the same.
        recording(&store, quiet, true, async {}).await;
        let empty = read_record(&store, quiet).unwrap().unwrap();
        assert!(empty.github_reads.is_empty() && empty.answers.is_empty());
    }
}
