//! rover's memory of a repository: lessons learned from ended traces (`autopilot/memory/lessons.json`
//! in the store), each a short statement with the evidence it came from, bounded, strengthened
//! when another trace says the same, weakened when a later trace contradicts it, expired when
//! unused, and retrieved into the agents' prompts by relevance within a byte budget. See
//! `docs/memory.md`.
//!
//! What a lesson is made of is decided by the steps (`steps::history::lessons` reads a trace's
//! typed spans, `steps::learn` files what it found); this module owns the file and its rules,
//! the ranking and the text a prompt shows. A lesson's text was written by an agent, an event or
//! a container: it is shown to a model only inside an untrusted block ([`render`]) and never
//! read as a command or a setting.

mod book;
mod cache;
mod rank;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

pub use book::{Learned, LessonBook, BOOK_VERSION};
pub use cache::{flush_used, note_used, take_used, Shelved, USED_FLUSH};
pub use rank::{render, retrieve, retrieve_in, Index, Retrieved, RetrievedLesson, BLOCK_SOURCE};

/// `autopilot.memory`: whether rover learns and recalls, and its bounds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "camelCase")]
pub struct MemorySettings {
    /// Learn from ended traces and show lessons to the agents (default on).
    pub enabled: bool,
    /// The most lessons kept (the weakest unpinned one goes first).
    pub max_entries: usize,
    /// Days a lesson may go unused before `gc` removes it (a pinned one stays).
    pub ttl_days: u32,
    /// The most bytes of lessons one prompt is given.
    pub prompt_bytes: usize,
}

impl Default for MemorySettings {
    fn default() -> MemorySettings {
        MemorySettings {
            enabled: true,
            max_entries: 200,
            ttl_days: 90,
            prompt_bytes: 2048,
        }
    }
}

/// What a lesson is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum LessonKind {
    /// A required verification gate failed, and passed after the fix the trace made.
    Gate,
    /// A review (the self-review, or a trusted person's) asked for changes, and approved (or
    /// the pull request merged) after them.
    Review,
    /// The planner had to ask for a clarification, and the answer let it plan.
    Clarification,
    /// A CI check of a pull request failed, and passed after the fix the trace pushed.
    Ci,
    /// A commit's hooks failed, and the commit passed after a retry or an iterate.
    Hook,
    /// The repository's environment image did not build, and built in a later run.
    Environment,
}

impl LessonKind {
    pub fn as_str(self) -> &'static str {
        match self {
            LessonKind::Gate => "gate",
            LessonKind::Review => "review",
            LessonKind::Clarification => "clarification",
            LessonKind::Ci => "ci",
            LessonKind::Hook => "hook",
            LessonKind::Environment => "environment",
        }
    }
}

/// Where a lesson comes from: one trace, its spans, and the command with the exit codes that
/// show the failure and the pass.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Evidence {
    pub trace_id: Uuid,
    /// The failed run, the run that decided the fix, the run that passed (in that order).
    pub span_ids: Vec<Uuid>,
    /// The gate's command (argv), when the lesson is about one.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub command: Vec<String>,
    /// The exit codes, failure first, then the pass (0).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub exit_codes: Vec<i64>,
    /// The CI check, when the lesson is about one (its name as the repository's CI gave it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub check: Option<String>,
    /// What the check or the review concluded, failure first, then the pass (`failure`,
    /// `success`; `changes_requested`, `approved`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conclusions: Vec<String>,
    pub at: DateTime<Utc>,
}

impl Evidence {
    /// Evidence of trace `trace` from `span_ids`, at `at`, with no command, check or
    /// conclusions yet.
    pub fn new(trace_id: Uuid, span_ids: Vec<Uuid>, at: DateTime<Utc>) -> Evidence {
        Evidence {
            trace_id,
            span_ids,
            command: Vec::new(),
            exit_codes: Vec::new(),
            check: None,
            conclusions: Vec::new(),
            at,
        }
    }
}

/// A later trace that used a lesson and failed the same way anyway.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Contradiction {
    pub trace_id: Uuid,
    pub span_id: Uuid,
    pub at: DateTime<Utc>,
}

/// What a trace teaches, before it is filed: the book merges it into an entry with the same
/// [`NewLesson::key`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewLesson {
    pub kind: LessonKind,
    /// The one-line statement shown to the agents.
    pub statement: String,
    /// The files or commands it concerns.
    pub concerns: Vec<String>,
    /// What the trace was about (its task's title), for relevance.
    pub topic: String,
    pub evidence: Evidence,
}

impl NewLesson {
    /// What makes two lessons the same: the kind, what they concern and the statement, with
    /// case and spacing folded.
    pub fn key(&self) -> String {
        let fold = |s: &str| {
            s.split_whitespace()
                .map(str::to_lowercase)
                .collect::<Vec<_>>()
                .join(" ")
        };
        format!(
            "{}\u{1f}{}\u{1f}{}",
            self.kind.as_str(),
            fold(&self.concerns.join(" ")),
            fold(&self.statement)
        )
    }
}

/// One entry of the book.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Lesson {
    /// `l-` and 10 hex digits of the SHA-256 of its key: the same lesson has the same id in
    /// every store.
    pub id: String,
    pub kind: LessonKind,
    pub statement: String,
    #[serde(default)]
    pub concerns: Vec<String>,
    /// The titles of the tasks it was learned on (bounded).
    #[serde(default)]
    pub topics: Vec<String>,
    pub evidence: Vec<Evidence>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub contradictions: Vec<Contradiction>,
    /// Kept whatever its weight and age (`rover autopilot memory pin`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub pinned: bool,
    pub created: DateTime<Utc>,
    /// When a prompt last used it (absent: never).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_used: Option<DateTime<Utc>>,
}

impl Lesson {
    /// Its weight: one per piece of evidence, two off per contradiction. A lesson is retrieved
    /// only above zero (or pinned).
    pub fn weight(&self) -> i64 {
        let evidence = i64::try_from(self.evidence.len()).unwrap_or(i64::MAX);
        let against = i64::try_from(self.contradictions.len()).unwrap_or(i64::MAX);
        evidence.saturating_sub(against.saturating_mul(2))
    }

    /// Whether retrieval may show it.
    pub fn above_cut(&self) -> bool {
        self.pinned || self.weight() > 0
    }

    /// When it was last of use: last used, else learned (the newest evidence).
    pub fn last_touched(&self) -> DateTime<Utc> {
        let newest = self.evidence.iter().map(|e| e.at).max();
        [Some(self.created), newest, self.last_used]
            .into_iter()
            .flatten()
            .max()
            .unwrap_or(self.created)
    }

    /// The text ranked against a prompt's query: statement, concerns and topics.
    pub fn searchable(&self) -> String {
        let mut text = self.statement.clone();
        for part in self.concerns.iter().chain(&self.topics) {
            text.push(' ');
            text.push_str(part);
        }
        text
    }
}

/// The id of a lesson of `key`.
pub fn lesson_id(key: &str) -> String {
    use sha2::{Digest, Sha256};
    use std::fmt::Write as _;
    let digest = Sha256::digest(key.as_bytes());
    let mut id = String::from("l-");
    for b in digest.iter().take(5) {
        let _ = write!(id, "{b:02x}");
    }
    id
}

/// A failure of the memory's file or of a command on it.
#[derive(Debug, thiserror::Error)]
pub enum MemoryError {
    #[error(transparent)]
    Store(#[from] crate::store::StoreError),
    #[error("no lesson matches {id:?}: list them with `rover autopilot memory list`")]
    UnknownLesson { id: String },
    #[error("{id:?} matches several lessons ({}); give more of its id", .matches.join(", "))]
    AmbiguousLesson { id: String, matches: Vec<String> },
}

impl crate::error::Kinded for MemoryError {
    fn kind(&self) -> crate::error::ErrorKind {
        match self {
            MemoryError::Store(e) => e.kind(),
            MemoryError::UnknownLesson { .. } => crate::error::ErrorKind::NotFound,
            MemoryError::AmbiguousLesson { .. } => crate::error::ErrorKind::Usage,
        }
    }
}

#[cfg(test)]
pub(crate) mod testing {
    use super::*;

    /// A gate lesson of `trace` about `command`, fixed by `fix`, on task `topic`.
    pub(crate) fn gate_lesson(trace: Uuid, command: &str, fix: &str, topic: &str) -> NewLesson {
        NewLesson {
            kind: LessonKind::Gate,
            statement: format!("The gate `{command}` failed until: {fix}"),
            concerns: vec![command.to_owned()],
            topic: topic.to_owned(),
            evidence: Evidence {
                command: command.split(' ').map(str::to_owned).collect(),
                exit_codes: vec![2, 0],
                ..Evidence::new(
                    trace,
                    vec![Uuid::new_v4(), Uuid::new_v4(), Uuid::new_v4()],
                    Utc::now(),
                )
            },
        }
    }
}
