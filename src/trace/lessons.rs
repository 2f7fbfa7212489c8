//! The line `trace` prints under a span whose prompt was given lessons of rover's memory: their
//! ids, best first (`rover autopilot memory show ID` shows one with its evidence).
//!
//! The span's record is the steps' (`steps::meta::LessonsSpanMeta`, a layer above); this reads
//! the key it shows.

use serde::Deserialize;

use crate::store::Meta;

/// What `trace` shows of a span's lessons.
#[derive(Debug, Default, Deserialize)]
struct Shown {
    #[serde(default)]
    lessons: Vec<String>,
}

/// The line for a span's `meta`, starting with `lead`; empty when it was given no lesson.
pub fn lessons_line(meta: &Meta, lead: &str) -> String {
    let shown: Shown = crate::store::from_meta(meta).unwrap_or_default();
    if shown.lessons.is_empty() {
        return String::new();
    }
    format!("{lead}lessons given: {}\n", shown.lessons.join(", "))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_span_given_lessons_lists_their_ids_and_one_without_says_nothing() {
        let mut meta = Meta::new();
        assert_eq!(lessons_line(&meta, "  "), "");
        meta.insert("lessons".into(), serde_json::json!(["l-1", "l-2"]));
        assert_eq!(lessons_line(&meta, "  "), "  lessons given: l-1, l-2\n");
    }
}
