//! Agent usage as one typed shape: tokens and USD of the agent calls a span recorded. Every step
//! that calls an agent records it under `meta.agent` ([`AgentMeta`]); [`SpanUsage::of`] reads it.

use std::ops::AddAssign;

use crate::store::{AgentMeta, Span, TraceView};
use serde::{Deserialize, Serialize};

/// Tokens and USD of one or more agent calls.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SpanUsage {
    pub input_tokens: u64,
    pub output_tokens: u64,
    /// USD as claude reports it, or codex's tokens priced by `autopilot.agent.codexPrices`.
    pub cost_usd: f64,
    /// Agent calls counted.
    pub calls: u32,
}

impl SpanUsage {
    /// The usage a span recorded, if it recorded an agent call.
    pub fn of(span: &Span) -> Option<SpanUsage> {
        let agent = AgentMeta::of(span)?;
        let usage = agent.usage().cloned().unwrap_or_default();
        Some(SpanUsage {
            input_tokens: usage.input_tokens,
            output_tokens: usage.output_tokens,
            cost_usd: usage.cost_usd.unwrap_or(0.0),
            calls: 1,
        })
    }

    pub fn tokens(&self) -> u64 {
        self.input_tokens + self.output_tokens
    }

    /// `$0.0123 · 1,234 tok`.
    pub fn label(&self) -> String {
        format!("{} · {} tok", usd(self.cost_usd), self.tokens())
    }
}

impl AddAssign for SpanUsage {
    fn add_assign(&mut self, other: SpanUsage) {
        self.input_tokens += other.input_tokens;
        self.output_tokens += other.output_tokens;
        self.cost_usd += other.cost_usd;
        self.calls += other.calls;
    }
}

pub use crate::agents::usd;

/// The usage of every span of a trace and their total.
pub fn trace_usage(view: &TraceView) -> SpanUsage {
    let mut total = SpanUsage::default();
    for span in &view.spans {
        if let Some(u) = SpanUsage::of(span) {
            total += u;
        }
    }
    total
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::Meta;
    use chrono::Utc;
    use serde_json::{json, Value};

    fn span(meta: Value) -> Span {
        let Value::Object(m) = meta else { panic!() };
        Span::root(uuid::Uuid::new_v4(), Utc::now(), m)
    }

    #[test]
    fn reads_every_shape_the_steps_write() {
        let a = SpanUsage::of(&span(
            json!({"agent": {"turns": 2, "costUsd": 0.5, "inputTokens": 10, "outputTokens": 5, "cachedTokens": 0, "attempts": 1, "firstError": null}}),
        ))
        .unwrap();
        assert_eq!((a.tokens(), a.cost_usd, a.calls), (15, 0.5, 1));
        // A call that failed counts as a call that cost nothing.
        let f = SpanUsage::of(&span(
            json!({"agent": {"error": "auth: not logged in", "errorClass": "auth"}}),
        ))
        .unwrap();
        assert_eq!((f.tokens(), f.cost_usd, f.calls), (0, 0.0, 1));
        // No agent call: no usage (a top-level `costUsd` is no shape any step writes).
        let r = SpanUsage::of(&span(json!({"costUsd": 0.25, "agent": null})));
        assert!(r.is_none());
        assert!(SpanUsage::of(&Span::root(uuid::Uuid::nil(), Utc::now(), Meta::new())).is_none());
        assert_eq!(usd(0.000_235), "$0.0002");
        assert_eq!(usd(12.5), "$12.50");
    }
}
