//! The lines of `intake.jsonl` (`store::IntakeRecord`) each source writes: what became of an
//! event, a skipped feed item or delivery, a local request.

use chrono::Utc;
use uuid::Uuid;

use super::root::action_str;
use super::{Ingested, Via};
use crate::github::{NormalizedEvent, SkippedEvent};
use crate::store::{IntakeOutcome, IntakeRecord};

/// The intake record of a local request (`submit`): `via: "local"`, ingested into `trace`.
pub fn local_record(trace: Uuid, actor: &str) -> IntakeRecord {
    let mut r = IntakeRecord::new(Via::Local.as_str(), IntakeOutcome::Ingested, Utc::now());
    r.kind = Some("LocalRequest".to_owned());
    r.actor = Some(actor.to_owned());
    r.trace_id = Some(trace);
    r
}

/// The intake record of an event rover normalized (`outcome` and `reason` to fill in).
pub fn event_record(event: &NormalizedEvent, via: Via, outcome: IntakeOutcome) -> IntakeRecord {
    let mut r = IntakeRecord::new(via.as_str(), outcome, Utc::now());
    r.event_id = Some(event.id.clone());
    r.kind = Some(event.kind.as_str().to_owned());
    r.action = action_str(event);
    r.number = event.number;
    r.actor = Some(event.actor.clone());
    r
}

/// The intake record of what [`super::ingest`] did with an event.
pub fn ingested_record(event: &NormalizedEvent, via: Via, ingested: Ingested) -> IntakeRecord {
    let (outcome, reason, trace) = match ingested {
        Ingested::New(t) => (IntakeOutcome::Ingested, None, t),
        Ingested::Duplicate(t) => (
            IntakeOutcome::Duplicate,
            Some("already ingested: this event started a trace before".to_owned()),
            t,
        ),
        Ingested::OtherPath(t) => (
            IntakeOutcome::Duplicate,
            Some("already ingested: the same event came by another path".to_owned()),
            t,
        ),
    };
    let mut r = event_record(event, via, outcome);
    r.reason = reason;
    r.trace_id = Some(trace);
    r
}

/// The intake record of a feed item skipped by normalization.
pub fn skipped_record(skipped: &SkippedEvent, via: Via) -> IntakeRecord {
    let mut r = IntakeRecord::new(via.as_str(), IntakeOutcome::Skipped, Utc::now())
        .reason(skipped.reason.to_string());
    r.event_id.clone_from(&skipped.id);
    r.kind.clone_from(&skipped.kind);
    r.action.clone_from(&skipped.action);
    r.number = skipped.number;
    r.actor.clone_from(&skipped.actor);
    r
}

/// The intake record of a verified webhook delivery rover does not act on, with what the
/// payload says about it (read leniently: it may be the reason it was skipped).
pub fn skipped_delivery(event: &str, delivery: &str, body: &[u8], reason: &str) -> IntakeRecord {
    let payload: serde_json::Value = serde_json::from_slice(body).unwrap_or_default();
    let text = |p: &str| {
        payload
            .pointer(p)
            .and_then(|v| v.as_str())
            .map(str::to_owned)
    };
    let mut r = IntakeRecord::new(
        Via::Webhook.as_str(),
        IntakeOutcome::Skipped,
        chrono::Utc::now(),
    )
    .reason(reason);
    r.event_id = Some(delivery.to_owned());
    r.kind = Some(event.to_owned());
    r.action = text("/action");
    r.actor = text("/sender/login");
    r.number = ["/issue/number", "/pull_request/number", "/number"]
        .iter()
        .find_map(|p| payload.pointer(p).and_then(serde_json::Value::as_u64));
    r
}
