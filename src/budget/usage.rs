//! Agent usage as one typed shape: tokens and USD of the agent calls a span recorded. The steps
//! write it in three places (`meta.agent` of the deciding steps, `meta.usage` + `meta.costUsd`
//! of workflows, `meta.costUsd` of the resolver); [`SpanUsage::of`] reads all of them.

use std::ops::AddAssign;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::store::{Span, TraceView};

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

fn num(v: Option<&Value>) -> Option<u64> {
    v.and_then(Value::as_u64)
}

impl SpanUsage {
    /// The usage a span recorded, if it recorded an agent call.
    pub fn of(span: &Span) -> Option<SpanUsage> {
        let meta = &span.meta;
        if let Some(agent) = meta.get("agent").filter(|v| v.is_object()) {
            return Some(SpanUsage {
                input_tokens: num(agent.get("inputTokens")).unwrap_or(0),
                output_tokens: num(agent.get("outputTokens")).unwrap_or(0),
                cost_usd: agent.get("costUsd").and_then(Value::as_f64).unwrap_or(0.0),
                calls: 1,
            });
        }
        let cost = meta.get("costUsd").and_then(Value::as_f64);
        let usage = meta.get("usage").filter(|v| v.is_object());
        if cost.is_none() && usage.is_none() {
            return None;
        }
        Some(SpanUsage {
            input_tokens: num(usage.and_then(|u| u.get("input"))).unwrap_or(0),
            output_tokens: num(usage.and_then(|u| u.get("output"))).unwrap_or(0),
            cost_usd: cost.unwrap_or(0.0),
            calls: 1,
        })
    }

    /// One agent call's usage, as the steps should write it (under `meta.agent`, the shape
    /// [`SpanUsage::of`] reads first).
    pub fn from_response(response: &crate::agents::AgentResponse) -> SpanUsage {
        SpanUsage {
            input_tokens: response.usage.input,
            output_tokens: response.usage.output,
            cost_usd: response.cost_usd.unwrap_or(0.0),
            calls: 1,
        }
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

/// USD for people: four decimals under a dollar, two above.
pub fn usd(v: f64) -> String {
    if v.abs() < 1.0 {
        format!("${v:.4}")
    } else {
        format!("${v:.2}")
    }
}

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
    use serde_json::json;

    fn span(meta: Value) -> Span {
        let Value::Object(m) = meta else { panic!() };
        Span::root(uuid::Uuid::new_v4(), Utc::now(), m)
    }

    #[test]
    fn reads_every_shape_the_steps_write() {
        let a = SpanUsage::of(&span(
            json!({"agent": {"costUsd": 0.5, "inputTokens": 10, "outputTokens": 5}}),
        ))
        .unwrap();
        assert_eq!((a.tokens(), a.cost_usd), (15, 0.5));
        let w = SpanUsage::of(&span(
            json!({"usage": {"input": 3, "output": 4, "cached": 1}, "costUsd": 0.25}),
        ))
        .unwrap();
        assert_eq!((w.tokens(), w.cost_usd), (7, 0.25));
        let r = SpanUsage::of(&span(json!({"costUsd": null, "other": 1})));
        assert!(r.is_none());
        assert!(SpanUsage::of(&Span::root(uuid::Uuid::nil(), Utc::now(), Meta::new())).is_none());
        assert_eq!(usd(0.000_235), "$0.0002");
        assert_eq!(usd(12.5), "$12.50");
    }
}
