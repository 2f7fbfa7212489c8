//! The telemetry part of `rover autopilot status`: whether the last daemon exports traces,
//! where, and what it counted (exported, dropped by cause, waiting).

use std::fmt::Write as _;

use serde_json::{json, Value};

use crate::store::AutopilotStore;
use crate::telemetry::state::{self, ExportState};

/// The exporter's record and the spans waiting, for `status`.
pub fn standing(store: &AutopilotStore) -> Result<(ExportState, u64), crate::store::StoreError> {
    let st = state::load(store)?;
    let waiting = if crate::store::outbox::is_armed(store) {
        state::waiting(store, &st)
    } else {
        0
    };
    Ok((st, waiting))
}

pub fn to_json(st: &ExportState, waiting: u64) -> Value {
    json!({
        "enabled": st.enabled,
        "endpoint": st.endpoint,
        "protocol": st.protocol,
        "exported": st.exported,
        "dropped": st.dropped.total(),
        "droppedBy": st.dropped,
        "waiting": waiting,
        "queueLimit": crate::telemetry::MAX_QUEUE,
        "lastExportAt": st.last_export_at,
        "lastError": st.last_error,
        "lastErrorAt": st.last_error_at,
    })
}

pub fn to_text(st: &ExportState, waiting: u64) -> String {
    let mut text = String::new();
    if !st.enabled {
        let _ = writeln!(
            text,
            "telemetry off (OTEL_EXPORTER_OTLP_ENDPOINT or autopilot.telemetry turns it on)"
        );
        return text;
    }
    let d = st.dropped;
    let _ = writeln!(
        text,
        "telemetry {} ({}): {} span(s) exported, {} dropped ({} failed, {} queue full, {} unreadable), {} waiting",
        st.endpoint.as_deref().unwrap_or("?"),
        st.protocol.as_deref().unwrap_or("?"),
        st.exported,
        d.total(),
        d.failed,
        d.queue_full,
        d.unreadable,
        waiting
    );
    if let (Some(e), Some(at)) = (&st.last_error, st.last_error_at) {
        let _ = writeln!(
            text,
            "          last error {}: {e}",
            at.format("%Y-%m-%d %H:%M:%S UTC")
        );
    }
    text
}
