//! What the budget reads of a `push` span: whether the push opened its pull request (the
//! hourly cap on pull requests counts them). The key is written by the push step's
//! `PushPullRequest` (`steps::meta`), whose tests read what it writes through this.

use serde::{Deserialize, Deserializer};
use serde_json::Value;

use crate::store::{from_meta, Span};

/// The part of a `push` span's meta the budget reads. A value of another type reads as `false`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PullRequestOpened {
    /// `prCreated`: this push opened the pull request (a push that found it open did not).
    #[serde(default, deserialize_with = "flag")]
    pub pr_created: bool,
}

/// `true` only for the JSON value `true`.
fn flag<'de, D: Deserializer<'de>>(d: D) -> Result<bool, D::Error> {
    Ok(matches!(Value::deserialize(d)?, Value::Bool(true)))
}

impl PullRequestOpened {
    /// Whether `span` opened its pull request (only a push writes the key).
    pub fn by(span: &Span) -> bool {
        from_meta::<PullRequestOpened>(&span.meta).is_ok_and(|m| m.pr_created)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::StepKind;
    use crate::store::{Meta, SpanStatus};
    use chrono::Utc;
    use uuid::Uuid;

    fn span(step: StepKind, meta: serde_json::Value) -> Span {
        let serde_json::Value::Object(meta) = meta else {
            panic!("an object")
        };
        let mut span = Span::root(Uuid::new_v4(), Utc::now(), Meta::new());
        span.step = step;
        span.finish(SpanStatus::Completed, "s", meta, Utc::now())
            .expect("finishes");
        span
    }

    #[test]
    fn only_a_span_that_says_it_created_its_pull_request_opened_one() {
        let created =
            serde_json::json!({"prUrl": "https://github.com/o/r/pull/3", "prCreated": true});
        assert!(PullRequestOpened::by(&span(
            StepKind::Push,
            created.clone()
        )));
        let answer =
            serde_json::json!({"purpose": "result", "prUrl": "https://github.com/o/r/pull/3"});
        assert!(!PullRequestOpened::by(&span(StepKind::Notify, answer)));
        for meta in [
            serde_json::json!({"prUrl": "https://github.com/o/r/pull/3", "prCreated": false}),
            serde_json::json!({"prUrl": null}),
            serde_json::json!({"prCreated": "yes"}),
        ] {
            assert!(!PullRequestOpened::by(&span(StepKind::Push, meta)));
        }
    }
}
