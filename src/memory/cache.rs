//! The book as the prompts read it: parsed and tokenized once per version of the file, kept in
//! the process keyed by the file's identity (its length, modification time and inode: the store
//! replaces the file by a rename, so a new version is a new inode), read again when it changed.
//! A file that does not parse is an error naming it every time, never cached. And the uses the
//! prompts make of lessons (`lastUsed`), noted here and written together: one locked write at
//! most every [`USED_FLUSH`], or with the next lesson learned, instead of a write per prompt
//! (each of which would also make the next prompt read the file again).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant, SystemTime};

use chrono::{DateTime, Utc};

use super::rank::Index;
use super::{LessonBook, MemoryError};
use crate::store::{AutopilotStore, StoreError};

/// How long the uses noted may wait for their write.
pub const USED_FLUSH: Duration = Duration::from_secs(60);

/// What tells one version of the file from another.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Identity {
    len: u64,
    modified: Option<SystemTime>,
    inode: u64,
}

/// The identity of the file at `path` (none: there is no file).
fn identity(path: &Path) -> Result<Option<Identity>, StoreError> {
    match std::fs::metadata(path) {
        Ok(meta) => Ok(Some(Identity {
            len: meta.len(),
            modified: meta.modified().ok(),
            inode: inode(&meta),
        })),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(StoreError::io("read the metadata of", path)(e)),
    }
}

#[cfg(unix)]
fn inode(meta: &std::fs::Metadata) -> u64 {
    std::os::unix::fs::MetadataExt::ino(meta)
}

#[cfg(not(unix))]
fn inode(_meta: &std::fs::Metadata) -> u64 {
    0
}

/// One version of the book with its retrieval index.
#[derive(Debug)]
pub struct Shelved {
    pub book: LessonBook,
    pub index: Index,
}

/// The uses noted of one book: each lesson's latest, and when they were last written.
#[derive(Debug, Default)]
struct Used {
    at: HashMap<String, DateTime<Utc>>,
    written: Option<Instant>,
}

#[derive(Debug, Default)]
struct Shelf {
    books: HashMap<PathBuf, (Option<Identity>, Arc<Shelved>)>,
    used: HashMap<PathBuf, Used>,
}

fn shelf() -> std::sync::MutexGuard<'static, Shelf> {
    static SHELF: OnceLock<Mutex<Shelf>> = OnceLock::new();
    SHELF
        .get_or_init(Mutex::default)
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl LessonBook {
    /// The book of `store` with its index, as the file is now: read and tokenized again only
    /// when the file changed since the last call (an error naming the file when it does not
    /// parse, as [`LessonBook::load`]).
    pub fn cached(store: &AutopilotStore) -> Result<Arc<Shelved>, MemoryError> {
        let path = LessonBook::path(store);
        let before = identity(&path)?;
        if let Some((known, shelved)) = shelf().books.get(&path) {
            if *known == before {
                return Ok(Arc::clone(shelved));
            }
        }
        let book = LessonBook::load(store)?;
        let shelved = Arc::new(Shelved {
            index: Index::new(&book),
            book,
        });
        // A file replaced while it was read is read again next time.
        if identity(&path)? == before {
            shelf().books.insert(path, (before, Arc::clone(&shelved)));
        }
        Ok(shelved)
    }
}

/// Note that a prompt used lessons `ids` of `store`'s book at `now` (written by
/// [`flush_used`] or with the next lesson learned, [`take_used`]).
pub fn note_used(store: &AutopilotStore, ids: &[String], now: DateTime<Utc>) {
    let mut shelf = shelf();
    let used = shelf.used.entry(LessonBook::path(store)).or_default();
    for id in ids {
        used.at.insert(id.clone(), now);
    }
}

/// The uses noted of `store`'s book, taken to be written now by the caller (under the store
/// lock, in the same write as its change).
pub fn take_used(store: &AutopilotStore) -> Vec<(String, DateTime<Utc>)> {
    let mut shelf = shelf();
    let Some(used) = shelf.used.get_mut(&LessonBook::path(store)) else {
        return Vec::new();
    };
    used.written = Some(Instant::now());
    used.at.drain().collect()
}

/// Write the uses noted of `store`'s book in one locked write, when there are some and the
/// last write is [`USED_FLUSH`] old or more (or `now`). Returns how many lessons were marked.
pub fn flush_used(store: &AutopilotStore, now: bool) -> Result<usize, MemoryError> {
    {
        let shelf = shelf();
        let Some(used) = shelf.used.get(&LessonBook::path(store)) else {
            return Ok(0);
        };
        let due = now || used.written.is_none_or(|w| w.elapsed() >= USED_FLUSH);
        if used.at.is_empty() || !due {
            return Ok(0);
        }
    }
    let marks = take_used(store);
    let n = marks.len();
    LessonBook::update(store, |book| book.mark_all_used(&marks))?;
    Ok(n)
}

impl LessonBook {
    /// Note each lesson's use at its time (a later use wins).
    pub fn mark_all_used(&mut self, marks: &[(String, DateTime<Utc>)]) {
        for (id, at) in marks {
            if let Some(lesson) = self.lessons.iter_mut().find(|l| &l.id == id) {
                if lesson.last_used.is_none_or(|u| u < *at) {
                    lesson.last_used = Some(*at);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::testing::gate_lesson;
    use uuid::Uuid;

    fn store() -> (tempfile::TempDir, AutopilotStore) {
        let dir = tempfile::tempdir().unwrap();
        let store = AutopilotStore::open(dir.path(), "p").unwrap();
        (dir, store)
    }

    #[test]
    fn the_book_is_read_once_per_version_of_the_file_and_a_torn_one_is_still_named() {
        let (_dir, store) = store();
        assert!(LessonBook::cached(&store).unwrap().book.lessons.is_empty());
        LessonBook::update(&store, |b| {
            b.learn(gate_lesson(Uuid::new_v4(), "make test", "x", "t"), 200)
        })
        .unwrap();
        let first = LessonBook::cached(&store).unwrap();
        assert_eq!(first.book.lessons.len(), 1);
        let again = LessonBook::cached(&store).unwrap();
        assert!(Arc::ptr_eq(&first, &again), "not read again");
        // A new version (the store's atomic replace): read again.
        LessonBook::update(&store, |b| {
            b.learn(gate_lesson(Uuid::new_v4(), "make lint", "y", "t"), 200)
        })
        .unwrap();
        let second = LessonBook::cached(&store).unwrap();
        assert_eq!(second.book.lessons.len(), 2);
        // A torn file: an error naming it, every time.
        let path = LessonBook::path(&store);
        let text = std::fs::read_to_string(&path).unwrap();
        std::fs::write(&path, &text.as_bytes()[..text.len() / 2]).unwrap();
        for _ in 0..2 {
            let err = LessonBook::cached(&store).unwrap_err().to_string();
            assert!(err.contains("lessons.json"), "{err}");
        }
    }

    #[test]
    fn uses_are_written_together_and_the_file_is_not_rewritten_per_prompt() {
        let (_dir, store) = store();
        LessonBook::update(&store, |b| {
            b.learn(gate_lesson(Uuid::new_v4(), "make test", "x", "t"), 200);
            b.learn(gate_lesson(Uuid::new_v4(), "make lint", "y", "t"), 200);
        })
        .unwrap();
        let ids: Vec<String> = LessonBook::load(&store)
            .unwrap()
            .lessons
            .iter()
            .map(|l| l.id.clone())
            .collect();
        let path = LessonBook::path(&store);
        let before = identity(&path).unwrap();
        let now = Utc::now();
        note_used(&store, &ids[..1], now);
        // The first flush writes (nothing written yet); the next use waits for the interval.
        assert_eq!(flush_used(&store, false).unwrap(), 1);
        let written = identity(&path).unwrap();
        assert_ne!(written, before);
        note_used(&store, &ids[1..], now);
        assert_eq!(flush_used(&store, false).unwrap(), 0, "not due yet");
        assert_eq!(identity(&path).unwrap(), written, "the file is as it was");
        let book = LessonBook::load(&store).unwrap();
        assert!(book.lessons[0].last_used.is_some());
        assert!(book.lessons[1].last_used.is_none());
        // Taken by a learn (or forced): written.
        assert_eq!(flush_used(&store, true).unwrap(), 1);
        let book = LessonBook::load(&store).unwrap();
        assert!(book.lessons.iter().all(|l| l.last_used.is_some()));
    }
}
