//! Writing `state.json`: the bytes `serde_json::to_vec_pretty` gives, with the queue entries
//! written directly. A compaction rewrites every entry (a cron `--once` that folds the journal
//! pays it), and serde's general path costs several times more per entry than these few fixed
//! fields need. An entry with keys rover does not know (`extra`) is written by serde.

use chrono::{DateTime, Utc};
use uuid::Uuid;

use super::records::{iso, PendingAction, State};

/// `state` as `serde_json::to_vec_pretty(state)` writes it (the queue is taken out of `state`
/// while the rest is written by serde, and put back).
pub(super) fn state_to_vec_pretty(state: &mut State) -> Vec<u8> {
    let pending = std::mem::take(&mut state.pending);
    let text = serde_json::to_vec_pretty(&*state);
    state.pending = pending;
    let text = text.expect("store records always serialize");
    let pending = &state.pending;
    if pending.is_empty() {
        return text;
    }
    // The top-level key: `version` and `updatedAt` before it are strings, one line each.
    let marker: &[u8] = b"\n  \"pending\": []";
    let at = text
        .windows(marker.len())
        .position(|w| w == marker)
        .expect("the state's pending key")
        + marker.len()
        - 2;
    let mut out = Vec::with_capacity(text.len() + pending.len() * 400);
    out.extend_from_slice(&text[..at]);
    out.extend_from_slice(b"[");
    for (i, p) in pending.iter().enumerate() {
        out.extend_from_slice(if i == 0 { b"\n    " } else { b",\n    " });
        entry(&mut out, p);
    }
    out.extend_from_slice(b"\n  ]");
    out.extend_from_slice(&text[at + 2..]);
    out
}

/// One queue entry at the depth of `pending`'s items (its lines indented by 4, then 6).
fn entry(out: &mut Vec<u8>, p: &PendingAction) {
    if !p.extra.is_empty() {
        let own = serde_json::to_vec_pretty(p).expect("store records always serialize");
        for b in own {
            out.push(b);
            if b == b'\n' {
                out.extend_from_slice(b"    ");
            }
        }
        return;
    }
    out.extend_from_slice(b"{");
    field(out, "traceId", true);
    uuid(out, p.trace_id);
    field(out, "actionId", false);
    uuid(out, p.action_id);
    field(out, "spanId", false);
    uuid(out, p.span_id);
    field(out, "action", false);
    string(out, p.action.as_str());
    field(out, "summary", false);
    string(out, &p.summary);
    field(out, "createdAt", false);
    time(out, &p.created_at);
    if p.attempts != 0 {
        field(out, "attempts", false);
        out.extend_from_slice(p.attempts.to_string().as_bytes());
    }
    if let Some(id) = p.running_span_id {
        field(out, "runningSpanId", false);
        uuid(out, id);
    }
    if let Some(t) = &p.not_before {
        field(out, "notBefore", false);
        time(out, t);
    }
    if let Some(id) = p.superseded_by {
        field(out, "supersededBy", false);
        uuid(out, id);
    }
    out.extend_from_slice(b"\n    }");
}

fn field(out: &mut Vec<u8>, key: &str, first: bool) {
    out.extend_from_slice(if first { b"\n      \"" } else { b",\n      \"" });
    out.extend_from_slice(key.as_bytes());
    out.extend_from_slice(b"\": ");
}

fn uuid(out: &mut Vec<u8>, id: Uuid) {
    out.push(b'"');
    out.extend_from_slice(
        id.hyphenated()
            .encode_lower(&mut Uuid::encode_buffer())
            .as_bytes(),
    );
    out.push(b'"');
}

/// A JSON string as serde writes it (its escapes).
fn string(out: &mut Vec<u8>, s: &str) {
    serde_json::to_writer(&mut *out, s).expect("a string always serializes");
}

fn time(out: &mut Vec<u8>, t: &DateTime<Utc>) {
    let mut buf = [0u8; 24];
    out.push(b'"');
    match iso::format_ours(t, &mut buf) {
        Some(text) => out.extend_from_slice(text.as_bytes()),
        None => out.extend_from_slice(
            t.to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
                .as_bytes(),
        ),
    }
    out.push(b'"');
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::records::{ClosedTrace, StepKind, TaskMapping};
    use serde_json::json;

    fn entry(i: u32) -> PendingAction {
        let t = DateTime::from_timestamp_millis(1_764_064_800_123 + i64::from(i) * 7_777).unwrap();
        PendingAction {
            trace_id: Uuid::new_v4(),
            action_id: Uuid::new_v4(),
            span_id: Uuid::new_v4(),
            action: StepKind::Coordinate,
            summary: "wait for CI".into(),
            created_at: t,
            attempts: 0,
            running_span_id: None,
            not_before: None,
            superseded_by: None,
            extra: serde_json::Map::new(),
        }
    }

    #[test]
    fn state_json_is_written_byte_for_byte_as_serde_writes_it() {
        let mut state = State::new(Utc::now());
        let same = |state: &mut State| {
            let want = serde_json::to_vec_pretty(&*state).unwrap();
            let got = state_to_vec_pretty(state);
            assert_eq!(
                String::from_utf8(got).unwrap(),
                String::from_utf8(want).unwrap()
            );
        };
        same(&mut state);
        for i in 0..40 {
            let mut p = entry(i);
            match i % 8 {
                1 => p.attempts = i,
                2 => p.running_span_id = Some(Uuid::new_v4()),
                3 => p.not_before = Some(Utc::now()),
                4 => p.superseded_by = Some(Uuid::new_v4()),
                5 => {
                    p.summary = "a \"quoted\"\nline, ünïcode \\ \u{1} \u{7f} tab\t".into();
                    p.action = StepKind::Other("frob\"nicate".into());
                }
                6 => {
                    p.extra.insert(
                        "otherImpl".into(),
                        json!({"nested": [1, {"a": []}], "e": {}}),
                    );
                    p.attempts = 2;
                }
                7 => {
                    // Times chrono writes otherwise: a year past 9999, a leap second.
                    p.created_at = DateTime::from_timestamp(253_402_300_800, 0).unwrap();
                    p.not_before = DateTime::from_timestamp(1_483_228_799, 1_500_000_000);
                }
                _ => {}
            }
            state.pending.push(p);
            same(&mut state);
        }
        state.task_mappings.insert(
            "k".into(),
            TaskMapping::new("t", "rover/t", Uuid::new_v4(), Uuid::new_v4()),
        );
        state.closed.insert(
            Uuid::new_v4(),
            ClosedTrace {
                command: crate::store::records::CloseCommand::Cancel,
                by: "alice".into(),
                reason: "no".into(),
                at: Utc::now(),
            },
        );
        state.extra.insert("journalSeq".into(), json!(12));
        state.extra.insert("aFirst".into(), json!({"pending": []}));
        let before = state.clone();
        same(&mut state);
        assert_eq!(state, before, "the queue is put back");
    }
}
