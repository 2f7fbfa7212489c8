//! The lessons of rover's memory a prompt is given (`docs/memory.md`): retrieved by relevance to
//! the prompt's query within `autopilot.memory.promptBytes` (from the book as parsed and
//! tokenized once per version of its file), marked used (written together at most once a
//! minute, or with the next lesson learned), and noted as a world read of the run, so
//! `rover autopilot replay` gives a replayed run the same lessons. The caller renders them (`memory::render`, an untrusted block in the prompt's user part, below
//! the project's instructions) and records their ids (`meta::LessonsSpanMeta`).

use chrono::Utc;

use crate::memory::{flush_used, note_used, retrieve_in, LessonBook, Retrieved};
use crate::store::replay_record::{is_serving, note_world_read, recalled};
use crate::store::{blocking, AutopilotStore};

use super::meta::LessonsSpanMeta;
use super::Services;
use crate::orchestrator::{Outcome, StepError};

/// The world read's name in a replay record.
pub const LESSONS_READ: &str = "memory.lessons";

/// The lessons for a prompt whose task and event say `query` (none with memory off, or when
/// the book cannot be read: that is logged, the step goes on without them).
pub async fn lessons_for(services: &Services, store: &AutopilotStore, query: String) -> Retrieved {
    if let Some(recorded) = recalled::<Retrieved>(LESSONS_READ, "") {
        return recorded;
    }
    let settings = services.config.autopilot.memory.clone();
    if !settings.enabled || is_serving() {
        return Retrieved::default();
    }
    let got = blocking(store.clone(), move |s| {
        // The book as parsed and tokenized for its current version (read again only when the
        // file changed).
        let shelved = LessonBook::cached(s).map_err(|e| match e {
            crate::memory::MemoryError::Store(e) => e,
            other => crate::store::StoreError::Unreadable {
                path: LessonBook::path(s),
                reason: other.to_string(),
            },
        })?;
        let retrieved = retrieve_in(&shelved.book, &shelved.index, &query, settings.prompt_bytes);
        if !retrieved.is_empty() {
            note_used(s, &retrieved.ids(), Utc::now());
        }
        // Marking them used is bookkeeping, written together at most once a minute: a failure
        // costs the lessons' age, not the run.
        if let Err(e) = flush_used(s, false) {
            tracing::warn!(error = %crate::error::error_chain(&e), "memory: cannot mark lessons used");
        }
        Ok(retrieved)
    })
    .await;
    let retrieved = match got {
        Ok(retrieved) => retrieved,
        Err(e) => {
            tracing::warn!(
                error = %crate::error::error_chain(&e),
                "memory: cannot read the lessons; the prompt goes without them"
            );
            Retrieved::default()
        }
    };
    note_world_read(LESSONS_READ, "", &retrieved);
    retrieved
}

/// A prompt's `{{lessons}}`: the section of the lessons for `query` (empty when none), and the
/// record of their ids for the span.
pub async fn prompt_lessons(
    services: &Services,
    store: &AutopilotStore,
    query: String,
) -> (String, LessonsSpanMeta) {
    let retrieved = lessons_for(services, store, query).await;
    let section = crate::memory::render(&retrieved).unwrap_or_default();
    (
        section,
        LessonsSpanMeta {
            lessons: retrieved.ids(),
        },
    )
}

/// `outcome` with the lessons its prompt was given recorded on its span (a finished run's).
pub fn recorded(
    outcome: Result<Outcome, StepError>,
    used: &LessonsSpanMeta,
) -> Result<Outcome, StepError> {
    match outcome {
        Ok(Outcome::Finished(finished)) if !used.lessons.is_empty() => {
            Ok(Outcome::Finished(finished.with_meta_record(used)))
        }
        other => other,
    }
}
