//! The lines `trace` prints under an agent run that went through rover's proxy: its egress,
//! what it sent to the model API and what that cost, each destination it tried (allowed or
//! denied, how many times) and a stop at the budget.

use std::fmt::Write as _;

use crate::agent_run::RunNetworkMeta;
use crate::store::Meta;

/// Most destinations listed per kind (allowed, denied); the rest are counted.
const MAX_LISTED: usize = 8;

/// The lines for a span's `meta`, each starting with `lead`; empty when it has no egress.
pub fn network_lines(meta: &Meta, lead: &str) -> String {
    let mut out = String::new();
    let recorded = RunNetworkMeta::of(meta);
    let egress = recorded.egress.as_deref();
    let Some(ledger) = recorded.network else {
        if let Some(egress) = egress {
            let _ = writeln!(out, "{lead}network: {egress}");
        }
        return out;
    };
    let _ = writeln!(
        out,
        "{lead}network: {}; {} model request(s) through rover's proxy ({} up, {} down, {}){}",
        egress.unwrap_or("model-only"),
        ledger.requests,
        bytes(ledger.bytes_up),
        bytes(ledger.bytes_down),
        crate::budget::usd(ledger.usd),
        if ledger.refused > 0 {
            format!(", {} refused", ledger.refused)
        } else {
            String::new()
        }
    );
    for allowed in [false, true] {
        let rows: Vec<_> = ledger
            .connections
            .iter()
            .filter(|c| c.allowed == allowed)
            .collect();
        if rows.is_empty() {
            continue;
        }
        let listed: Vec<String> = rows
            .iter()
            .take(MAX_LISTED)
            .map(|c| format!("{}:{} ×{}", c.host, c.port, c.count))
            .collect();
        let more = rows.len().saturating_sub(MAX_LISTED);
        let _ = writeln!(
            out,
            "{lead}  {}: {}{}",
            if allowed { "allowed" } else { "denied" },
            listed.join(", "),
            if more > 0 {
                format!(" and {more} more (trace --json lists them)")
            } else {
                String::new()
            }
        );
    }
    if let Some(stop) = &ledger.stopped {
        let _ = writeln!(
            out,
            "{lead}  stopped by budget at the wire: {} at {}",
            stop.describe(),
            stop.at.format("%H:%M:%S UTC")
        );
    }
    out
}

/// `bytes` for people: `812 B`, `3.1 KiB`, `2.4 MiB`.
#[allow(
    clippy::cast_precision_loss,
    reason = "a figure for people, one decimal"
)]
fn bytes(n: u64) -> String {
    const KIB: f64 = 1024.0;
    let v = n as f64;
    if v < KIB {
        format!("{n} B")
    } else if v < KIB * KIB {
        format!("{:.1} KiB", v / KIB)
    } else {
        format!("{:.1} MiB", v / KIB / KIB)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_run_with_a_proxy_record_shows_its_traffic_its_destinations_and_its_stop() {
        let meta: Meta = serde_json::from_value(serde_json::json!({
            "egress": "model-only", "network": {
                "run": "rover-x", "traceId": "6b0c9e9c-6c43-4c2b-9d4c-1f7f1a0a0a02",
                "requests": 3, "refused": 2, "bytesUp": 2048, "bytesDown": 900,
                "usage": {"input": 10, "cached": 0, "cacheWrite": 0, "output": 5}, "usd": 0.0312,
                "connections": [
                    {"host": "example.com", "port": 443, "allowed": false, "count": 2, "reason": "r"},
                    {"host": "pypi.org", "port": 443, "allowed": true, "count": 5}],
                "refusals": [], "updatedAt": "2026-11-25T18:01:00Z",
                "stopped": {"at": "2026-11-25T18:01:00Z", "spendUsd": 0.0312, "stopUsd": 0.005}}
        }))
        .expect("a meta");
        let text = network_lines(&meta, "  ");
        assert!(text.contains("network: model-only; 3 model request(s) through rover's proxy (2.0 KiB up, 900 B down, $0.0312), 2 refused"), "{text}");
        assert!(text.contains("denied: example.com:443 ×2"), "{text}");
        assert!(text.contains("allowed: pypi.org:443 ×5"), "{text}");
        assert!(
            text.contains("stopped by budget at the wire: $0.0312 of $0.0050"),
            "{text}"
        );
        assert_eq!(network_lines(&Meta::new(), "  "), "");
        let mut none = Meta::new();
        none.insert("egress".into(), "none".into());
        assert_eq!(network_lines(&none, "  "), "  network: none\n");
    }
}
