//! The records kept in the store, with the spec's field names: spans, actions, the state file
//! (pending queue and task mappings), the event cursor and the trace indexes.
//!
//! Fields the spec defines are typed and required; fields rover adds are optional on read so a
//! store written by another implementation still loads. Unknown fields of the shared files are
//! kept (`extra`) and written back unchanged.

use serde::{Deserialize, Deserializer};
use serde_json::{Map, Value};

/// The format version written on every record.
pub const VERSION: &str = "1.0";

/// How many processed event ids the cursor keeps (oldest evicted first).
pub const CURSOR_CAPACITY: usize = 200;

/// How many event content keys the cursor keeps (oldest evicted first): more than the 300 events
/// the feed serves, so an event the webhook brought is still known when the poller sees it.
pub const EVENT_KEYS_CAPACITY: usize = 1000;

/// Step-specific data of a span or an action.
pub type Meta = Map<String, Value>;

mod action;
mod cursor;
pub mod iso;
mod log_entry;
mod span;
mod span_meta;
mod state;
mod trace_index;

pub use action::*;
pub use cursor::*;
pub use log_entry::*;
pub use span::*;
pub use span_meta::*;
pub use state::*;
pub use trace_index::*;

/// Deserialize an `Option` that must be present (as `null` or a value), as the spec's nullable
/// fields are: serde would otherwise accept a missing field as `None`.
fn required<'de, D: Deserializer<'de>, T: Deserialize<'de>>(d: D) -> Result<Option<T>, D::Error> {
    Option::<T>::deserialize(d)
}

fn version() -> String {
    VERSION.to_owned()
}

pub(super) fn check_version<'de, D: Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    let v = String::deserialize(d)?;
    if v.split('.').next() == Some("1") {
        Ok(v)
    } else {
        Err(serde::de::Error::custom(format!(
            "unsupported record version {v:?} (this rover reads 1.x)"
        )))
    }
}

#[cfg(test)]
mod action_schedule_tests {
    use super::*;
    use chrono::Utc;
    use serde_json::json;
    use uuid::Uuid;

    #[test]
    fn an_action_is_queued_not_before_its_notbefore_and_a_bad_value_is_due_at_once() {
        let root = Span::root(Uuid::new_v4(), Utc::now(), Meta::new());
        let mut meta = Meta::new();
        meta.insert("notBefore".into(), json!("2026-01-02T03:34:05Z"));
        let now = Utc::now();
        let action = Action::new(StepKind::Resolve, &root, "wait", meta, now);
        assert_eq!(
            action.pending(root.id, now).not_before,
            Some("2026-01-02T03:34:05Z".parse().expect("time"))
        );
        let mut bad = action.clone();
        bad.meta.insert("notBefore".into(), json!(17));
        assert_eq!(bad.pending(root.id, now).not_before, None);
        bad.meta.insert("notBefore".into(), json!("tomorrow"));
        assert_eq!(bad.pending(root.id, now).not_before, None);
    }
}

#[cfg(test)]
mod intervention_span_tests {
    use super::*;

    use serde_json::json;
    use uuid::Uuid;

    #[test]
    fn an_intervention_is_a_finished_span_of_its_command_under_the_root_with_the_record() {
        let trace = Uuid::new_v4();
        let record = json!({"by": "alice", "reason": "not needed"});
        let span = Span::intervention(trace, "cancel", "cancelled".into(), &record);
        assert_eq!(span.step, StepKind::Other("cancel".into()));
        assert_eq!((span.parent_id, span.trace_id), (Some(trace), Some(trace)));
        assert_eq!(span.status, SpanStatus::Completed);
        assert_eq!(span.summary.as_deref(), Some("cancelled"));
        assert_eq!(Value::Object(span.meta), record);
    }
}

#[cfg(test)]
mod run_span_meta_tests {
    use super::*;
    use chrono::{DateTime, Utc};
    use serde_json::json;
    use uuid::Uuid;

    #[test]
    fn todays_keys_read_and_write_back_unchanged() {
        let written = [
            // Restart recovery of a run left running.
            json!({"interrupted": true, "attempt": 2}),
            // A shutdown cutting a run off.
            json!({"interrupted": true}),
            // A retryable error (next to the step's error).
            json!({"retryAt": "2026-11-23T17:10:00.123Z"}),
            // A budget warning, then the run closed by a budget and handed over.
            json!({
                "budgetWarnings": ["daily cost at 80% of $10.00", "trace turns at 80% of 50"],
                "budgetStopped": true,
                "actionIds": ["5f0c6a34-2d7e-4b55-9a63-0f1e2d3c4b5a"],
            }),
            // A run closed by a person, handing over nothing.
            json!({"closedByHand": true, "actionIds": []}),
            // A failure that tripped the circuit breaker.
            json!({"circuitBreakerTripped": true}),
            json!({}),
        ];
        for shape in written {
            let Value::Object(meta) = shape.clone() else {
                unreachable!()
            };
            let read = RunSpanMeta::read(&meta);
            assert_eq!(serde_json::to_value(&read).unwrap(), shape);
            let mut again = Meta::new();
            read.put_into(&mut again);
            assert_eq!(Value::Object(again), shape);
        }
    }

    #[test]
    fn a_record_round_trips_and_merges_over_the_step_keys() {
        let record = RunSpanMeta {
            interrupted: true,
            attempt: Some(3),
            retry_at: Some(
                DateTime::parse_from_rfc3339("2026-11-23T17:10:00.123Z")
                    .unwrap()
                    .with_timezone(&Utc),
            ),
            budget_warnings: vec!["w".into()],
            budget_stopped: true,
            closed_by_hand: false,
            circuit_breaker_tripped: true,
            action_ids: Some(vec![Uuid::new_v4()]),
            scheduled: Some(ScheduledMeta {
                score: 250,
                why: vec!["label critical: +300".into(), "retry 1: -50".into()],
                repository: "o/r".into(),
                slots_taken: 2,
                max_runs: 2,
                passed_over: 3,
            }),
        };
        let mut meta = Meta::new();
        meta.insert("stepKey".into(), json!("kept"));
        record.put_into(&mut meta);
        assert_eq!(meta["stepKey"], json!("kept"));
        assert!(meta.contains_key(crate::store::PRODUCED_KEY));
        assert_eq!(RunSpanMeta::read(&meta), record);
        assert!(record.stopped());
        assert_eq!(RunSpanMeta::read(&Meta::new()), RunSpanMeta::default());
    }

    #[test]
    fn a_key_of_another_type_reads_as_missing_and_spoils_nothing_else() {
        let Value::Object(meta) = json!({
            "interrupted": "yes", "attempt": -1, "retryAt": "soon", "budgetWarnings": ["w", 4],
            "budgetStopped": 1, "closedByHand": true, "actionIds": ["not an id"],
            "scheduled": {"score": "high"},
        }) else {
            unreachable!()
        };
        let read = RunSpanMeta::read(&meta);
        assert_eq!(
            read,
            RunSpanMeta {
                budget_warnings: vec!["w".into()],
                closed_by_hand: true,
                ..RunSpanMeta::default()
            }
        );
    }

    #[test]
    fn an_error_in_the_older_bare_message_shape_still_reads() {
        let mut span = Span::root(Uuid::new_v4(), Utc::now(), Meta::new());
        assert_eq!(ErrorMeta::of_any(&span), None);
        span.meta.insert(ErrorMeta::KEY.into(), json!("it broke"));
        assert_eq!(ErrorMeta::of(&span), None);
        let legacy = ErrorMeta::of_any(&span).unwrap();
        assert_eq!(legacy.message, "it broke");
        assert!(!legacy.retryable && !legacy.tampered && legacy.details.is_empty());
        let typed = ErrorMeta {
            message: "typed".into(),
            retryable: true,
            tampered: false,
            details: Map::new(),
        };
        typed.put_into(&mut span.meta);
        assert_eq!(ErrorMeta::of_any(&span), Some(typed));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::Utc;
    use uuid::Uuid;

    #[test]
    fn an_event_key_pairs_once_with_the_other_path_and_never_with_its_own() {
        let mut c = Cursor::new(Utc::now());
        let (t1, t2, t3) = (Uuid::new_v4(), Uuid::new_v4(), Uuid::new_v4());
        assert_eq!(c.match_event_key("k", "webhook", "d1", t1), KeyMatch::New);
        // The same delivery again.
        assert_eq!(
            c.match_event_key("k", "webhook", "d1", t2),
            KeyMatch::Same(t1)
        );
        // Another delivery with the same key is another event on the same path.
        assert_eq!(c.match_event_key("k", "webhook", "d2", t2), KeyMatch::New);
        // The poller sees both: each pairs with one.
        assert_eq!(
            c.match_event_key("k", "poll", "e1", t3),
            KeyMatch::OtherPath(t1)
        );
        assert_eq!(
            c.match_event_key("k", "poll", "e2", t3),
            KeyMatch::OtherPath(t2)
        );
        // The poller serving e1 again finds its own record.
        assert_eq!(c.match_event_key("k", "poll", "e1", t3), KeyMatch::Same(t1));
        // A third one by polling only is new.
        assert_eq!(c.match_event_key("k", "poll", "e3", t3), KeyMatch::New);
        let json = serde_json::to_value(&c).unwrap();
        assert_eq!(json["eventKeys"][0]["via"], "webhook");
        assert_eq!(json["eventKeys"][0]["paired"], true);
        let back: Cursor = serde_json::from_value(json).unwrap();
        assert_eq!(back.event_keys, c.event_keys);
    }

    #[test]
    fn an_event_seen_by_three_paths_is_one_trace() {
        let mut c = Cursor::new(Utc::now());
        let (t1, t2, t3) = (Uuid::new_v4(), Uuid::new_v4(), Uuid::new_v4());
        assert_eq!(c.match_event_key("k", "reconcile", "r1", t1), KeyMatch::New);
        assert_eq!(
            c.match_event_key("k", "poll", "e1", t2),
            KeyMatch::OtherPath(t1)
        );
        assert_eq!(
            c.match_event_key("k", "webhook", "d1", t3),
            KeyMatch::OtherPath(t1)
        );
        // A second event with the key, by any path, is another trace.
        assert_eq!(c.match_event_key("k", "poll", "e2", t2), KeyMatch::New);
        assert_eq!(
            c.match_event_key("k", "reconcile", "r1", t3),
            KeyMatch::Same(t1)
        );
    }

    #[test]
    fn event_keys_are_bounded() {
        let mut c = Cursor::new(Utc::now());
        for i in 0..EVENT_KEYS_CAPACITY + 5 {
            c.match_event_key(&format!("k{i}"), "poll", &i.to_string(), Uuid::nil());
        }
        assert_eq!(c.event_keys.len(), EVENT_KEYS_CAPACITY);
        assert_eq!(c.event_keys[0].key, "k5");
    }
}
