//! The OpenTelemetry ids of rover's records, derived so that anyone can go from one to the
//! other: a trace's id is the rover trace id's 16 bytes (its 32 hex digits without hyphens);
//! a span's id is the last 8 bytes of the rover span id (its last 16 hex digits). The exporter
//! (`telemetry`) and the log lines (`orchestrator::run`) use the same ids, so a backend joins
//! logs to spans.

use uuid::Uuid;

/// The OpenTelemetry trace id of rover trace `trace_id`.
pub fn trace_id_bytes(trace_id: Uuid) -> [u8; 16] {
    *trace_id.as_bytes()
}

/// The OpenTelemetry span id of rover span `span_id`: its last 8 bytes, or its first 8 should
/// those all be zero (an all-zero span id is invalid in OpenTelemetry).
pub fn span_id_bytes(span_id: Uuid) -> [u8; 8] {
    let b = span_id.as_bytes();
    let mut out = [0u8; 8];
    out.copy_from_slice(&b[8..]);
    if out == [0u8; 8] {
        out.copy_from_slice(&b[..8]);
    }
    out
}

/// [`trace_id_bytes`] as 32 lowercase hex digits (as OpenTelemetry prints it).
pub fn trace_id_hex(trace_id: Uuid) -> String {
    trace_id.simple().to_string()
}

/// [`span_id_bytes`] as 16 lowercase hex digits.
pub fn span_id_hex(span_id: Uuid) -> String {
    span_id_bytes(span_id)
        .iter()
        .fold(String::new(), |mut s, b| {
            use std::fmt::Write as _;
            let _ = write!(s, "{b:02x}");
            s
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_read_off_the_rover_ids() {
        let id = Uuid::parse_str("0b4f9c1e-2d3a-4b5c-8d6e-7f8091a2b3c4").unwrap();
        assert_eq!(trace_id_hex(id), "0b4f9c1e2d3a4b5c8d6e7f8091a2b3c4");
        assert_eq!(span_id_hex(id), "8d6e7f8091a2b3c4");
        let low_zero = Uuid::from_bytes([1, 2, 3, 4, 5, 6, 7, 8, 0, 0, 0, 0, 0, 0, 0, 0]);
        assert_eq!(span_id_bytes(low_zero), [1, 2, 3, 4, 5, 6, 7, 8]);
    }
}
