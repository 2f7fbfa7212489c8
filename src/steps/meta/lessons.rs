//! `lessons`: the ids of the lessons of rover's memory a step's prompt was given (see
//! `docs/memory.md`), written by the coordinate, plan, workflow and resolve spans and read by
//! `trace` and by the learner (a run given a lesson that failed the same way contradicts it).

use serde::{Deserialize, Serialize};

use crate::store::Span;

/// See the module documentation.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LessonsSpanMeta {
    /// Best first; absent when the prompt was given none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub lessons: Vec<String>,
}

impl LessonsSpanMeta {
    /// What a span recorded (nothing, for a span whose meta has another shape under the key).
    pub fn of(span: &Span) -> LessonsSpanMeta {
        crate::store::from_meta(&span.meta).unwrap_or_default()
    }
}

/// What the learner reads of a run's gates: the `gates` key a collected workflow span (and its
/// `collect` span) carries, written by `CollectedMeta` and `CollectSpanMeta`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GatesSpanMeta {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gates: Option<super::GatesMeta>,
}

impl GatesSpanMeta {
    /// What a span recorded of its gates (nothing, for a span whose meta has another shape).
    pub fn of(span: &Span) -> GatesSpanMeta {
        crate::store::from_meta(&span.meta).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_record_reads_back_as_written_and_says_nothing_when_empty() {
        let record = LessonsSpanMeta {
            lessons: vec!["l-0123456789".into()],
        };
        let meta = crate::store::to_meta(&record);
        assert_eq!(
            serde_json::Value::Object(meta.clone()),
            serde_json::json!({"lessons": ["l-0123456789"]})
        );
        let back: LessonsSpanMeta = crate::store::from_meta(&meta).unwrap();
        assert_eq!(back, record);
        assert!(crate::store::to_meta(&LessonsSpanMeta::default()).is_empty());
    }
}
