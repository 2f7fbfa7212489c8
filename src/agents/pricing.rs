//! Model prices: codex reports tokens only, so rover turns them into USD with a price table
//! (`autopilot.agent.codexPrices` in `rover.json`) for the budgets; the model proxy prices the
//! tokens it sees on the wire with the same table and with [`ClaudePrices`] for Anthropic.

use std::collections::BTreeMap;

use serde::{Deserialize, Deserializer};

use super::types::{AgentResponse, Usage};

/// USD for people: four decimals under a dollar (`$0.0312`), two from there (`$3.20`).
pub fn usd(v: f64) -> String {
    if v.abs() < 1.0 {
        format!("${v:.4}")
    } else {
        format!("${v:.2}")
    }
}

/// The entry used for a model the table does not name, or when no model is configured.
pub const DEFAULT_PRICE_KEY: &str = "default";

/// USD per million tokens of one model.
#[derive(Debug, Clone, Copy, PartialEq, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ModelPrice {
    /// Input tokens not served from the prompt cache.
    pub input_per_m_tok: f64,
    /// Input tokens served from the prompt cache; left out, the input price.
    #[serde(default)]
    pub cached_input_per_m_tok: Option<f64>,
    /// Output tokens (reasoning tokens included, as the API counts them).
    pub output_per_m_tok: f64,
}

impl ModelPrice {
    const fn new(input: f64, cached: f64, output: f64) -> ModelPrice {
        ModelPrice {
            input_per_m_tok: input,
            cached_input_per_m_tok: Some(cached),
            output_per_m_tok: output,
        }
    }

    /// The USD of `usage` (whose `input` excludes the cached tokens).
    #[allow(clippy::cast_precision_loss)] // token counts stay far below 2^52
    pub fn cost_usd(&self, usage: &Usage) -> f64 {
        let cached = self.cached_input_per_m_tok.unwrap_or(self.input_per_m_tok);
        (usage.input as f64 * self.input_per_m_tok
            + usage.cached as f64 * cached
            + usage.output as f64 * self.output_per_m_tok)
            / 1_000_000.0
    }

    fn check(&self, table: &str, model: &str) -> Result<(), String> {
        let prices = [
            self.input_per_m_tok,
            self.cached_input_per_m_tok.unwrap_or(0.0),
            self.output_per_m_tok,
        ];
        if prices.iter().all(|p| p.is_finite() && *p >= 0.0) {
            Ok(())
        } else {
            Err(format!(
                "{table}.{model}: prices must be zero or more USD per million tokens"
            ))
        }
    }
}

/// The built-in table: OpenAI's list prices (USD per million tokens) as of late 2025. They are
/// assumptions, not looked up: override or extend them in `rover.json`.
const BUILT_IN: &[(&str, ModelPrice)] = &[
    (DEFAULT_PRICE_KEY, ModelPrice::new(1.25, 0.125, 10.0)),
    ("gpt-5", ModelPrice::new(1.25, 0.125, 10.0)),
    ("gpt-5-codex", ModelPrice::new(1.25, 0.125, 10.0)),
    ("gpt-5.1", ModelPrice::new(1.25, 0.125, 10.0)),
    ("gpt-5.1-codex", ModelPrice::new(1.25, 0.125, 10.0)),
    ("gpt-5-mini", ModelPrice::new(0.25, 0.025, 2.0)),
    ("gpt-5.1-codex-mini", ModelPrice::new(0.25, 0.025, 2.0)),
    ("gpt-5-nano", ModelPrice::new(0.05, 0.005, 0.4)),
    ("o4-mini", ModelPrice::new(1.1, 0.275, 4.4)),
    ("gpt-4.1", ModelPrice::new(2.0, 0.5, 8.0)),
];

/// Model name → price. Entries given in `rover.json` replace or add to the built-in ones.
/// Written out whole (for rover's proxy, which has no `rover.json`), it reads back the same.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct CodexPrices(BTreeMap<String, ModelPrice>);

impl Default for CodexPrices {
    fn default() -> CodexPrices {
        CodexPrices(
            BUILT_IN
                .iter()
                .map(|(model, price)| ((*model).to_owned(), *price))
                .collect(),
        )
    }
}

impl<'de> Deserialize<'de> for CodexPrices {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<CodexPrices, D::Error> {
        let given = BTreeMap::<String, ModelPrice>::deserialize(deserializer)?;
        let mut prices = CodexPrices::default();
        for (model, price) in given {
            price
                .check("codexPrices", &model)
                .map_err(serde::de::Error::custom)?;
            prices.0.insert(model, price);
        }
        Ok(prices)
    }
}

impl CodexPrices {
    /// The price of `model` (exact name), else the `default` entry.
    pub fn price(&self, model: Option<&str>) -> ModelPrice {
        model
            .and_then(|m| self.0.get(m))
            .or_else(|| self.0.get(DEFAULT_PRICE_KEY))
            .copied()
            .unwrap_or(BUILT_IN[0].1)
    }

    /// Fills in the USD of a response that came without one (codex) from its tokens; a cost
    /// the CLI reported (claude) is kept.
    pub fn fill_cost(&self, model: Option<&str>, response: &mut AgentResponse) {
        if response.cost_usd.is_none() {
            response.cost_usd = Some(self.price(model).cost_usd(&response.usage));
        }
    }
}

/// Anthropic's list prices (USD per million tokens; cache reads at a tenth of the input price)
/// as of early 2026, keyed by model-id prefix. They are assumptions, not looked up. Prompts over
/// 200k tokens (billed higher on Sonnet's long context) are priced at the base rate. The default
/// is the current Opus price, the dearest current model, so an unknown model is not undercounted
/// against a budget.
const CLAUDE_BUILT_IN: &[(&str, ModelPrice)] = &[
    (DEFAULT_PRICE_KEY, ModelPrice::new(5.0, 0.5, 25.0)),
    ("claude-opus", ModelPrice::new(5.0, 0.5, 25.0)),
    ("claude-opus-4-0", ModelPrice::new(15.0, 1.5, 75.0)),
    ("claude-opus-4-1", ModelPrice::new(15.0, 1.5, 75.0)),
    ("claude-opus-4-2025", ModelPrice::new(15.0, 1.5, 75.0)),
    ("claude-3-opus", ModelPrice::new(15.0, 1.5, 75.0)),
    ("claude-sonnet", ModelPrice::new(3.0, 0.3, 15.0)),
    ("claude-3-7-sonnet", ModelPrice::new(3.0, 0.3, 15.0)),
    ("claude-3-5-sonnet", ModelPrice::new(3.0, 0.3, 15.0)),
    ("claude-haiku", ModelPrice::new(1.0, 0.1, 5.0)),
    ("claude-3-5-haiku", ModelPrice::new(0.8, 0.08, 4.0)),
    ("claude-3-haiku", ModelPrice::new(0.25, 0.03, 1.25)),
];

/// Anthropic bills a 5-minute prompt-cache write at this many times the input price.
pub const CLAUDE_CACHE_WRITE_FACTOR: f64 = 1.25;
/// Anthropic bills a 1-hour prompt-cache write at this many times the input price.
pub const CLAUDE_CACHE_WRITE_1H_FACTOR: f64 = 2.0;

/// Model-id prefix → price, for the Anthropic models (`claude-sonnet-4-5-20250929` takes the
/// longest key it starts with). Entries given in a configuration replace or add to the built-in
/// ones.
#[derive(Debug, Clone, PartialEq)]
pub struct ClaudePrices(BTreeMap<String, ModelPrice>);

impl Default for ClaudePrices {
    fn default() -> ClaudePrices {
        ClaudePrices(
            CLAUDE_BUILT_IN
                .iter()
                .map(|(model, price)| ((*model).to_owned(), *price))
                .collect(),
        )
    }
}

impl<'de> Deserialize<'de> for ClaudePrices {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<ClaudePrices, D::Error> {
        let given = BTreeMap::<String, ModelPrice>::deserialize(deserializer)?;
        let mut prices = ClaudePrices::default();
        for (model, price) in given {
            price
                .check("claudePrices", &model)
                .map_err(serde::de::Error::custom)?;
            prices.0.insert(model, price);
        }
        Ok(prices)
    }
}

impl ClaudePrices {
    /// The price of `model`: the entry with the longest key `model` starts with, else the
    /// `default` entry.
    pub fn price(&self, model: Option<&str>) -> ModelPrice {
        model
            .and_then(|m| {
                self.0
                    .iter()
                    .filter(|(key, _)| {
                        key.as_str() != DEFAULT_PRICE_KEY && m.starts_with(key.as_str())
                    })
                    .max_by_key(|(key, _)| key.len())
                    .map(|(_, price)| price)
            })
            .or_else(|| self.0.get(DEFAULT_PRICE_KEY))
            .copied()
            .unwrap_or(CLAUDE_BUILT_IN[0].1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn usage() -> Usage {
        // What the fake and the real capture report: 100 input of which 40 cached, 20 output.
        Usage {
            input: 60,
            output: 20,
            cached: 40,
        }
    }

    #[test]
    fn cost_is_tokens_times_price_per_million() {
        let price = ModelPrice::new(1.25, 0.125, 10.0);
        let expected = (60.0 * 1.25 + 40.0 * 0.125 + 20.0 * 10.0) / 1e6;
        assert!((price.cost_usd(&usage()) - expected).abs() < 1e-12);
        assert!((expected - 0.000_28).abs() < 1e-12);
        let no_cache_price = ModelPrice {
            cached_input_per_m_tok: None,
            ..price
        };
        let uncached = (100.0 * 1.25 + 20.0 * 10.0) / 1e6;
        assert!((no_cache_price.cost_usd(&usage()) - uncached).abs() < 1e-12);
    }

    #[test]
    fn unknown_or_unset_models_use_the_default_entry() {
        let prices = CodexPrices::default();
        assert_eq!(
            prices.price(Some("gpt-5-mini")),
            ModelPrice::new(0.25, 0.025, 2.0)
        );
        assert_eq!(prices.price(Some("no-such-model")), prices.price(None));
        assert_eq!(prices.price(None), ModelPrice::new(1.25, 0.125, 10.0));
    }

    #[test]
    fn configured_entries_replace_and_extend_the_built_in_table() {
        let prices: CodexPrices = serde_json::from_str(
            r#"{"default": {"inputPerMTok": 1000, "cachedInputPerMTok": 100, "outputPerMTok": 10000},
                "my-model": {"inputPerMTok": 2, "outputPerMTok": 4}}"#,
        )
        .expect("valid table");
        let mut response = AgentResponse {
            usage: usage(),
            ..AgentResponse::default()
        };
        prices.fill_cost(Some("unknown"), &mut response);
        assert!((response.cost_usd.expect("filled") - 0.264).abs() < 1e-12);
        assert_eq!(
            prices.price(Some("my-model")).cached_input_per_m_tok,
            None,
            "cached input left out costs the input price"
        );
        assert_eq!(
            prices.price(Some("gpt-5")),
            ModelPrice::new(1.25, 0.125, 10.0),
            "built-in entries stay"
        );
        // A reported cost is kept.
        let mut claude = AgentResponse {
            usage: usage(),
            cost_usd: Some(0.5),
            ..AgentResponse::default()
        };
        prices.fill_cost(None, &mut claude);
        assert_eq!(claude.cost_usd, Some(0.5));
    }

    #[test]
    fn bad_entries_are_errors() {
        for (text, needle) in [
            (
                r#"{"m": {"inputPerMTok": 1, "outputPerMTok": 2, "cachedPerMTok": 1}}"#,
                "cachedPerMTok",
            ),
            (r#"{"m": {"inputPerMTok": 1}}"#, "outputPerMTok"),
            (
                r#"{"m": {"inputPerMTok": -1, "outputPerMTok": 2}}"#,
                "zero or more",
            ),
        ] {
            let err = serde_json::from_str::<CodexPrices>(text).expect_err(text);
            assert!(err.to_string().contains(needle), "{text}: {err}");
        }
    }

    #[test]
    fn claude_models_take_the_longest_matching_prefix() {
        let prices = ClaudePrices::default();
        let sonnet = ModelPrice::new(3.0, 0.3, 15.0);
        assert_eq!(prices.price(Some("claude-sonnet-4-5-20250929")), sonnet);
        assert_eq!(
            prices.price(Some("claude-opus-4-1-20250805")),
            ModelPrice::new(15.0, 1.5, 75.0)
        );
        assert_eq!(
            prices.price(Some("claude-opus-4-5-20251101")),
            ModelPrice::new(5.0, 0.5, 25.0)
        );
        assert_eq!(
            prices.price(Some("claude-haiku-4-5")),
            ModelPrice::new(1.0, 0.1, 5.0)
        );
        assert_eq!(prices.price(Some("gpt-5")), prices.price(None));
        let configured: ClaudePrices =
            serde_json::from_str(r#"{"claude-fake": {"inputPerMTok": 1, "outputPerMTok": 2}}"#)
                .expect("valid table");
        assert_eq!(
            configured.price(Some("claude-fake-1")),
            ModelPrice {
                input_per_m_tok: 1.0,
                cached_input_per_m_tok: None,
                output_per_m_tok: 2.0,
            }
        );
        let err = serde_json::from_str::<ClaudePrices>(
            r#"{"m": {"inputPerMTok": -1, "outputPerMTok": 2}}"#,
        )
        .expect_err("negative");
        assert!(err.to_string().contains("claudePrices.m"), "{err}");
    }
}
