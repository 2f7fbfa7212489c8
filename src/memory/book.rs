//! `autopilot/memory/lessons.json`: the lessons of one repository, read whole and replaced
//! atomically under the store lock. A file that does not parse (a torn write by hand, a disk
//! fault) is an error naming it, with a copy kept aside (`lessons.json.corrupt-<time>`): it is
//! never silently replaced by an empty book.

use std::path::PathBuf;

use chrono::{DateTime, Duration, Utc};
use serde::{Deserialize, Serialize};

use super::{lesson_id, Contradiction, Lesson, MemoryError, NewLesson};
use crate::store::fsio::{ensure_dir, quarantine, read_json, write_json_atomic};
use crate::store::{AutopilotStore, StoreError, StoreLock};

/// The file format's version.
pub const BOOK_VERSION: u32 = 1;

/// Titles of tasks kept per lesson (for relevance).
const TOPICS_KEPT: usize = 8;
/// Pieces of evidence kept per lesson (the newest).
const EVIDENCE_KEPT: usize = 20;

/// The whole file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LessonBook {
    pub version: u32,
    #[serde(default)]
    pub lessons: Vec<Lesson>,
}

impl Default for LessonBook {
    fn default() -> LessonBook {
        LessonBook {
            version: BOOK_VERSION,
            lessons: Vec::new(),
        }
    }
}

/// What filing a lesson did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Learned {
    /// A new entry, with its id.
    Added(String),
    /// An entry that said the same got this evidence too.
    Strengthened(String),
    /// The entry has this trace's evidence already (a trace learned from twice).
    Known(String),
}

impl LessonBook {
    /// Where the book lives in `store`.
    pub fn path(store: &AutopilotStore) -> PathBuf {
        store.autopilot_dir().join("memory").join("lessons.json")
    }

    /// The book as it is on disk (empty when there is none); no lock needed, the file is
    /// replaced atomically.
    pub fn load(store: &AutopilotStore) -> Result<LessonBook, MemoryError> {
        let path = LessonBook::path(store);
        match read_json::<LessonBook>(&path) {
            Ok(book) => Ok(book.unwrap_or_default()),
            Err(StoreError::Unreadable { path, reason }) => {
                Err(MemoryError::Store(quarantine(&path, reason)))
            }
            Err(e) => Err(e.into()),
        }
    }

    /// Change the book under the store lock; written back only when `f` changed it.
    pub fn update<R>(
        store: &AutopilotStore,
        f: impl FnOnce(&mut LessonBook) -> R,
    ) -> Result<R, MemoryError> {
        let _lock = StoreLock::acquire(&store.lock_path())?;
        let mut book = LessonBook::load(store)?;
        let before = book.clone();
        let out = f(&mut book);
        if book != before {
            let path = LessonBook::path(store);
            if let Some(dir) = path.parent() {
                ensure_dir(dir)?;
            }
            write_json_atomic(&path, &book)?;
        }
        Ok(out)
    }

    /// File `new`: a lesson with the same key gets its evidence (once per trace), otherwise a
    /// new entry; then the book is cut to `max` entries.
    pub fn learn(&mut self, new: NewLesson, max: usize) -> Learned {
        let id = lesson_id(&new.key());
        let learned = if let Some(lesson) = self.lessons.iter_mut().find(|l| l.id == id) {
            if lesson
                .evidence
                .iter()
                .any(|e| e.trace_id == new.evidence.trace_id)
            {
                return Learned::Known(id);
            }
            lesson.evidence.push(new.evidence);
            if lesson.evidence.len() > EVIDENCE_KEPT {
                lesson.evidence.remove(0);
            }
            if !new.topic.is_empty() && !lesson.topics.contains(&new.topic) {
                lesson.topics.push(new.topic);
                if lesson.topics.len() > TOPICS_KEPT {
                    lesson.topics.remove(0);
                }
            }
            Learned::Strengthened(id.clone())
        } else {
            let created = new.evidence.at;
            self.lessons.push(Lesson {
                id: id.clone(),
                kind: new.kind,
                statement: new.statement,
                concerns: new.concerns,
                topics: if new.topic.is_empty() {
                    Vec::new()
                } else {
                    vec![new.topic]
                },
                evidence: vec![new.evidence],
                contradictions: Vec::new(),
                pinned: false,
                created,
                last_used: None,
            });
            Learned::Added(id.clone())
        };
        self.bound(max, Some(&id));
        learned
    }

    /// A later trace used lesson `id` and failed the same way: it weakens the lesson (once per
    /// trace). False when there is no such lesson or the trace was counted already.
    pub fn contradict(&mut self, id: &str, against: Contradiction) -> bool {
        let Some(lesson) = self.lessons.iter_mut().find(|l| l.id == id) else {
            return false;
        };
        if lesson
            .contradictions
            .iter()
            .any(|c| c.trace_id == against.trace_id)
        {
            return false;
        }
        lesson.contradictions.push(against);
        true
    }

    /// Keep at most `max` lessons: the unpinned ones of least weight go first, the least
    /// recently touched among equals (`keep` is not dropped while another can be).
    fn bound(&mut self, max: usize, keep: Option<&str>) {
        while self.lessons.len() > max {
            let victim = self
                .lessons
                .iter()
                .enumerate()
                .filter(|(_, l)| !l.pinned && Some(l.id.as_str()) != keep)
                .min_by_key(|(_, l)| (l.weight(), l.last_touched()))
                .map(|(i, _)| i);
            match victim {
                Some(i) => {
                    self.lessons.remove(i);
                }
                None => break,
            }
        }
    }

    /// Remove the unpinned lessons not touched for `ttl_days`; returns their ids.
    pub fn expire(&mut self, ttl_days: u32, now: DateTime<Utc>) -> Vec<String> {
        let cutoff = now - Duration::days(i64::from(ttl_days));
        let mut gone = Vec::new();
        self.lessons.retain(|l| {
            let keep = l.pinned || l.last_touched() >= cutoff;
            if !keep {
                gone.push(l.id.clone());
            }
            keep
        });
        gone
    }

    /// Note that a prompt used `ids` at `now`.
    pub fn mark_used(&mut self, ids: &[String], now: DateTime<Utc>) {
        for lesson in &mut self.lessons {
            if ids.contains(&lesson.id) {
                lesson.last_used = Some(now);
            }
        }
    }

    /// The index of the one lesson whose id starts with `prefix`.
    fn position(&self, prefix: &str) -> Result<usize, MemoryError> {
        let matches: Vec<usize> = self
            .lessons
            .iter()
            .enumerate()
            .filter(|(_, l)| l.id.starts_with(prefix))
            .map(|(i, _)| i)
            .collect();
        match matches.as_slice() {
            [] => Err(MemoryError::UnknownLesson {
                id: prefix.to_owned(),
            }),
            [one] => Ok(*one),
            _ if prefix.is_empty() => Err(MemoryError::UnknownLesson { id: String::new() }),
            many => Err(MemoryError::AmbiguousLesson {
                id: prefix.to_owned(),
                matches: many.iter().map(|i| self.lessons[*i].id.clone()).collect(),
            }),
        }
    }

    /// The lesson whose id starts with `prefix`.
    pub fn find(&self, prefix: &str) -> Result<&Lesson, MemoryError> {
        self.position(prefix).map(|i| &self.lessons[i])
    }

    /// Remove the lesson whose id starts with `prefix`; returns it.
    pub fn forget(&mut self, prefix: &str) -> Result<Lesson, MemoryError> {
        let i = self.position(prefix)?;
        Ok(self.lessons.remove(i))
    }

    /// Pin (or unpin) the lesson whose id starts with `prefix`; returns its id.
    pub fn pin(&mut self, prefix: &str, pinned: bool) -> Result<String, MemoryError> {
        let i = self.position(prefix)?;
        self.lessons[i].pinned = pinned;
        Ok(self.lessons[i].id.clone())
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
    fn the_same_lesson_from_three_traces_is_one_entry_with_three_pieces_of_evidence() {
        let mut book = LessonBook::default();
        let mut ids = Vec::new();
        for _ in 0..3 {
            let lesson = gate_lesson(Uuid::new_v4(), "make test", "run `make gen`", "Add a");
            ids.push(book.learn(lesson, 200));
        }
        assert!(matches!(ids[0], Learned::Added(_)));
        assert!(matches!(ids[2], Learned::Strengthened(_)));
        assert_eq!(book.lessons.len(), 1);
        assert_eq!(book.lessons[0].evidence.len(), 3);
        assert_eq!(book.lessons[0].weight(), 3);
        // The same trace again adds nothing.
        let trace = book.lessons[0].evidence[0].trace_id;
        let again = gate_lesson(trace, "make test", "run `make gen`", "Add a");
        assert!(matches!(book.learn(again, 200), Learned::Known(_)));
        assert_eq!(book.lessons[0].evidence.len(), 3);
        // Case and spacing do not make another lesson.
        let folded = gate_lesson(Uuid::new_v4(), "make  test", "Run `make gen`", "Add b");
        assert!(matches!(book.learn(folded, 200), Learned::Strengthened(_)));
        assert_eq!(book.lessons[0].topics, vec!["Add a", "Add b"]);
    }

    #[test]
    fn a_contradiction_weakens_a_lesson_below_the_cut_once_per_trace() {
        let mut book = LessonBook::default();
        book.learn(gate_lesson(Uuid::new_v4(), "make test", "x", "t"), 200);
        let id = book.lessons[0].id.clone();
        assert!(book.lessons[0].above_cut());
        let against = Contradiction {
            trace_id: Uuid::new_v4(),
            span_id: Uuid::new_v4(),
            at: Utc::now(),
        };
        assert!(book.contradict(&id, against.clone()));
        assert!(!book.contradict(&id, against));
        assert_eq!(book.lessons[0].weight(), -1);
        assert!(!book.lessons[0].above_cut());
        book.pin(&id, true).unwrap();
        assert!(book.lessons[0].above_cut());
    }

    #[test]
    fn the_book_keeps_at_most_max_entries_dropping_the_weakest_unpinned() {
        let mut book = LessonBook::default();
        let strong = gate_lesson(Uuid::new_v4(), "make lint", "a", "t");
        book.learn(strong.clone(), 2);
        let mut again = strong;
        again.evidence.trace_id = Uuid::new_v4();
        book.learn(again, 2);
        book.learn(gate_lesson(Uuid::new_v4(), "make one", "b", "t"), 2);
        let pinned = book.lessons[1].id.clone();
        book.pin(&pinned, true).unwrap();
        book.learn(gate_lesson(Uuid::new_v4(), "make two", "c", "t"), 2);
        assert_eq!(book.lessons.len(), 2);
        // The new one is kept, the pinned one too: the strong unpinned one had to go.
        assert!(book.lessons.iter().any(|l| l.id == pinned));
        assert!(book
            .lessons
            .iter()
            .any(|l| l.statement.contains("make two")));
    }

    #[test]
    fn an_unused_lesson_expires_and_a_pinned_one_stays() {
        let mut book = LessonBook::default();
        let mut old = gate_lesson(Uuid::new_v4(), "make old", "a", "t");
        old.evidence.at = Utc::now() - Duration::days(100);
        book.learn(old, 200);
        let mut kept = gate_lesson(Uuid::new_v4(), "make kept", "a", "t");
        kept.evidence.at = Utc::now() - Duration::days(100);
        book.learn(kept, 200);
        book.pin(&book.lessons[1].id.clone(), true).unwrap();
        book.learn(gate_lesson(Uuid::new_v4(), "make new", "a", "t"), 200);
        let gone = book.expire(90, Utc::now());
        assert_eq!(gone.len(), 1);
        assert_eq!(book.lessons.len(), 2);
        assert!(book
            .lessons
            .iter()
            .all(|l| !l.statement.contains("make old")));
        // Used recently, an old lesson stays.
        let mut used = gate_lesson(Uuid::new_v4(), "make used", "a", "t");
        used.evidence.at = Utc::now() - Duration::days(100);
        book.learn(used, 200);
        let id = book.lessons.last().unwrap().id.clone();
        book.mark_used(&[id], Utc::now());
        assert!(book.expire(90, Utc::now()).is_empty());
    }

    #[test]
    fn the_file_is_written_under_the_lock_and_a_torn_one_is_named_and_kept_aside() {
        let (_dir, store) = store();
        assert!(LessonBook::load(&store).unwrap().lessons.is_empty());
        LessonBook::update(&store, |b| {
            b.learn(gate_lesson(Uuid::new_v4(), "make test", "x", "t"), 200)
        })
        .unwrap();
        let path = LessonBook::path(&store);
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(text.contains("\"version\": 1") || text.contains("\"version\":1"));
        assert_eq!(LessonBook::load(&store).unwrap().lessons.len(), 1);
        // A torn write: half the file.
        std::fs::write(&path, &text.as_bytes()[..text.len() / 2]).unwrap();
        let err = LessonBook::update(&store, |b| b.lessons.clear()).unwrap_err();
        let message = err.to_string();
        assert!(message.contains("lessons.json"), "{message}");
        assert!(message.contains("moved aside"), "{message}");
        // Nothing was overwritten, and the copy is beside it.
        assert_eq!(
            std::fs::read_to_string(&path).unwrap(),
            text[..text.len() / 2]
        );
        let kept = std::fs::read_dir(path.parent().unwrap())
            .unwrap()
            .filter_map(Result::ok)
            .any(|e| {
                e.file_name()
                    .to_string_lossy()
                    .starts_with("lessons.json.corrupt-")
            });
        assert!(kept);
        assert_eq!(
            crate::error::Kinded::kind(&err),
            crate::error::ErrorKind::Corrupt
        );
    }

    #[test]
    fn forget_and_pin_take_an_id_prefix() {
        let mut book = LessonBook::default();
        book.learn(gate_lesson(Uuid::new_v4(), "make test", "x", "t"), 200);
        let id = book.lessons[0].id.clone();
        assert!(matches!(
            book.forget("l-zz"),
            Err(MemoryError::UnknownLesson { .. })
        ));
        assert_eq!(book.pin(&id[..5], true).unwrap(), id);
        assert!(book.lessons[0].pinned);
        assert_eq!(book.forget(&id[..6]).unwrap().id, id);
        assert!(book.lessons.is_empty());
    }
}
