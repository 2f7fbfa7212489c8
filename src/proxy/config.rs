//! What the proxy server is given: its folder, the real model APIs with their credentials, and
//! the prices it counts spend with.

use std::fmt;
use std::path::PathBuf;

use http::Uri;

use super::error::ProxyError;
use super::grant::Provider;
use super::usage::SeenUsage;
use crate::agents::{
    ClaudePrices, CodexPrices, CLAUDE_CACHE_WRITE_1H_FACTOR, CLAUDE_CACHE_WRITE_FACTOR,
};

/// The proxy server's configuration.
#[derive(Debug, Clone)]
pub struct ProxyConfig {
    /// The proxy dir: `runs/<run>/grant.json` and `ledger.json` live under it.
    pub dir: PathBuf,
    /// The Anthropic API; none refuses `/anthropic/...` requests.
    pub anthropic: Option<Upstream>,
    /// The OpenAI API; none refuses `/openai/...` requests.
    pub openai: Option<Upstream>,
    pub prices: ProxyPrices,
    /// The daemon's wire dir, shared by the proxies of every repository a daemon file serves
    /// (its day's and month's stop limits, [`super::daemon_wide`]); none for a daemon serving
    /// one checkout.
    pub daemon_dir: Option<PathBuf>,
}

/// One real model API.
#[derive(Clone)]
pub struct Upstream {
    /// Where `/<provider>/<rest>` goes: `<base_url>/<rest>`, e.g. `https://api.anthropic.com`
    /// (so an agent's `ANTHROPIC_BASE_URL=http://relay:8080/anthropic` reaches `/v1/messages`)
    /// or `https://api.openai.com` (codex's `openai_base_url=http://relay:8080/openai/v1`).
    pub base_url: String,
    pub credential: Credential,
}

impl fmt::Debug for Upstream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Upstream")
            .field("base_url", &self.base_url)
            .field("credential", &self.credential)
            .finish()
    }
}

/// The real credential the proxy adds to forwarded requests.
#[derive(Clone)]
pub enum Credential {
    /// An API key: Anthropic `x-api-key`, OpenAI `Authorization: Bearer`.
    ApiKey(String),
    /// An OAuth access token (a Claude subscription): `Authorization: Bearer` and the
    /// `anthropic-beta: oauth-2025-04-20` flag; for OpenAI the same as a key.
    OAuthToken(String),
}

impl fmt::Debug for Credential {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Credential::ApiKey(_) => "ApiKey(<redacted>)",
            Credential::OAuthToken(_) => "OAuthToken(<redacted>)",
        })
    }
}

/// The prices the proxy turns tokens into USD with.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ProxyPrices {
    pub anthropic: ClaudePrices,
    pub openai: CodexPrices,
}

impl ProxyPrices {
    /// The USD of `seen` for a `provider` request for `model` (the request's, else the one the
    /// response named, else the table's default).
    #[allow(clippy::cast_precision_loss)] // token counts stay far below 2^52
    pub fn usd(&self, provider: Provider, model: Option<&str>, seen: &SeenUsage) -> f64 {
        let model = model.or(seen.model.as_deref());
        let usage = crate::agents::Usage {
            input: seen.usage.input,
            output: seen.usage.output,
            cached: seen.usage.cached,
        };
        match provider {
            Provider::Openai => self.openai.price(model).cost_usd(&usage),
            Provider::Anthropic => {
                let price = self.anthropic.price(model);
                let one_hour = seen.cache_write_1h.min(seen.usage.cache_write);
                let five_minutes = seen.usage.cache_write - one_hour;
                let writes = five_minutes as f64 * CLAUDE_CACHE_WRITE_FACTOR
                    + one_hour as f64 * CLAUDE_CACHE_WRITE_1H_FACTOR;
                price.cost_usd(&usage) + writes * price.input_per_m_tok / 1_000_000.0
            }
        }
    }
}

impl ProxyConfig {
    /// The upstream of `provider`, if configured.
    pub fn upstream(&self, provider: Provider) -> Option<&Upstream> {
        match provider {
            Provider::Anthropic => self.anthropic.as_ref(),
            Provider::Openai => self.openai.as_ref(),
        }
    }

    /// Check the upstream URLs before serving.
    pub(crate) fn validate(&self) -> Result<(), ProxyError> {
        for provider in [Provider::Anthropic, Provider::Openai] {
            if let Some(upstream) = self.upstream(provider) {
                upstream.base_uri(provider)?;
                let (Credential::ApiKey(secret) | Credential::OAuthToken(secret)) =
                    &upstream.credential;
                if secret.is_empty()
                    || http::HeaderValue::from_str(&format!("Bearer {secret}")).is_err()
                {
                    return Err(ProxyError::BadCredential {
                        provider: provider.name(),
                    });
                }
            }
        }
        Ok(())
    }

    /// Whether any upstream needs TLS.
    pub(crate) fn any_https(&self) -> bool {
        [&self.anthropic, &self.openai]
            .into_iter()
            .flatten()
            .any(|u| u.base_url.starts_with("https://"))
    }
}

impl Upstream {
    /// The base URL parsed, checked to be http(s) with a host and no query.
    pub(crate) fn base_uri(&self, provider: Provider) -> Result<Uri, ProxyError> {
        let bad = |reason: &str| ProxyError::BadUpstream {
            provider: provider.name(),
            url: self.base_url.clone(),
            reason: reason.to_owned(),
        };
        let uri: Uri = self
            .base_url
            .parse()
            .map_err(|e: http::uri::InvalidUri| bad(&e.to_string()))?;
        if !matches!(uri.scheme_str(), Some("http" | "https")) {
            return Err(bad("the scheme must be http or https"));
        }
        if uri.host().is_none() {
            return Err(bad("it has no host"));
        }
        if uri.query().is_some() {
            return Err(bad("it must not have a query"));
        }
        Ok(uri)
    }

    /// The upstream URL of `rest` (the path after `/<provider>`, with its query).
    pub(crate) fn target(&self, rest_path_and_query: &str) -> String {
        format!(
            "{}{}",
            self.base_url.trim_end_matches('/'),
            rest_path_and_query
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proxy::ledger::TokenUsage;

    #[test]
    fn anthropic_cache_writes_cost_more_than_input() {
        let prices = ProxyPrices::default();
        let seen = SeenUsage {
            usage: TokenUsage {
                input: 1_000_000,
                cached: 1_000_000,
                cache_write: 1_000_000,
                output: 1_000_000,
            },
            cache_write_1h: 0,
            model: None,
        };
        let usd = prices.usd(Provider::Anthropic, Some("claude-sonnet-4-5"), &seen);
        assert!((usd - (3.0 + 0.3 + 3.75 + 15.0)).abs() < 1e-9, "{usd}");
        let one_hour = SeenUsage {
            cache_write_1h: 1_000_000,
            ..seen.clone()
        };
        let usd = prices.usd(Provider::Anthropic, Some("claude-sonnet-4-5"), &one_hour);
        assert!((usd - (3.0 + 0.3 + 6.0 + 15.0)).abs() < 1e-9, "{usd}");
        let gpt = prices.usd(Provider::Openai, Some("gpt-5"), &seen);
        assert!((gpt - (1.25 + 0.125 + 10.0)).abs() < 1e-9, "{gpt}");
    }

    #[test]
    fn targets_join_the_base_and_the_rest() {
        let upstream = Upstream {
            base_url: "http://127.0.0.1:9/".into(),
            credential: Credential::ApiKey("k".into()),
        };
        assert_eq!(
            upstream.target("/v1/messages?beta=true"),
            "http://127.0.0.1:9/v1/messages?beta=true"
        );
        assert!(format!("{upstream:?}").contains("redacted"));
        let bad = Upstream {
            base_url: "ftp://x".into(),
            ..upstream
        };
        assert!(bad.base_uri(Provider::Openai).is_err());
    }
}
