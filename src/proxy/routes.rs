//! The model API calls a run token is good for: the requests the agent CLIs make to do their
//! work, by provider, method and exact path (and query), and nothing else. A token is the key's
//! power on these calls only: not the files, batches, models, organization or admin APIs that
//! the same key would open upstream. Every other request is refused and recorded in the run's
//! ledger.
//!
//! The list is what the real CLIs were seen to call through the proxy (`tests/it/network.rs`
//! records every request claude 2.1.197 and codex 0.169.0 sent and checks each is here).

use http::Method;

use super::grant::Provider;

/// One model API call the proxy forwards.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Route {
    pub provider: Provider,
    pub method: &'static str,
    /// The path after `/<provider>`, exactly (no normalization: `..`, `//` and percent-escapes
    /// make another path, which is refused).
    pub path: &'static str,
    /// The query strings allowed, exactly (`""`: none).
    pub queries: &'static [&'static str],
    /// Whether the call spends (a reservation is made against the budget before it is sent).
    pub metered: bool,
}

/// Every call a run token is good for.
pub const MODEL_ROUTES: &[Route] = &[
    // claude: one request a model turn (`?beta=true` since the CLI uses the beta client).
    Route {
        provider: Provider::Anthropic,
        method: "POST",
        path: "/v1/messages",
        queries: &["", "beta=true"],
        metered: true,
    },
    // claude: counting a prompt's tokens before sending it (free).
    Route {
        provider: Provider::Anthropic,
        method: "POST",
        path: "/v1/messages/count_tokens",
        queries: &["", "beta=true"],
        metered: false,
    },
    // codex: one Responses call a model turn (its base URL is `/openai`, the upstream's ends in
    // `/v1`).
    Route {
        provider: Provider::Openai,
        method: "POST",
        path: "/responses",
        queries: &[""],
        metered: true,
    },
];

/// The route of a `provider` request with `method` and `path_and_query` (after `/<provider>`),
/// or why it is refused.
pub fn route(provider: Provider, method: &Method, path_and_query: &str) -> Result<Route, String> {
    let (path, query) = path_and_query
        .split_once('?')
        .unwrap_or((path_and_query, ""));
    let found = MODEL_ROUTES
        .iter()
        .find(|r| r.provider == provider && r.method == method.as_str() && r.path == path);
    match found {
        Some(route) if route.queries.contains(&query) => Ok(*route),
        Some(_) => Err(format!(
            "rover: the query of {method} /{}{path} is not one the agent CLI sends; the request was not sent",
            provider.name()
        )),
        None => Err(format!(
            "rover: a run token is good for the model calls the agent CLI makes ({}), not {method} /{}{}; the request was not sent",
            allowed(provider),
            provider.name(),
            shown(path),
        )),
    }
}

/// The calls allowed for `provider`, for messages: `POST /v1/messages, …`.
fn allowed(provider: Provider) -> String {
    MODEL_ROUTES
        .iter()
        .filter(|r| r.provider == provider)
        .map(|r| format!("{} /{}{}", r.method, provider.name(), r.path))
        .collect::<Vec<_>>()
        .join(", ")
}

/// A path as a refusal shows it: printable ASCII, at most 200 characters.
fn shown(path: &str) -> String {
    let clean: String = path
        .chars()
        .map(|c| if c.is_ascii_graphic() { c } else { '?' })
        .take(200)
        .collect();
    if path.len() > 200 {
        format!("{clean}…")
    } else {
        clean
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cli_calls_pass_and_everything_else_is_refused() {
        let post = Method::POST;
        for (provider, path) in [
            (Provider::Anthropic, "/v1/messages?beta=true"),
            (Provider::Anthropic, "/v1/messages"),
            (Provider::Anthropic, "/v1/messages/count_tokens?beta=true"),
            (Provider::Openai, "/responses"),
        ] {
            assert!(route(provider, &post, path).is_ok(), "{path}");
        }
        let refused = [
            (Provider::Anthropic, Method::GET, "/v1/files"),
            (Provider::Anthropic, Method::POST, "/v1/files"),
            (Provider::Anthropic, Method::GET, "/v1/messages/batches"),
            (Provider::Anthropic, Method::POST, "/v1/messages/batches"),
            (
                Provider::Anthropic,
                Method::GET,
                "/v1/organizations/api_keys",
            ),
            (Provider::Anthropic, Method::GET, "/v1/models"),
            (Provider::Anthropic, Method::GET, "/v1/messages"),
            (Provider::Anthropic, Method::POST, "/v1/messages/"),
            (Provider::Anthropic, Method::POST, "/v1//messages"),
            (Provider::Anthropic, Method::POST, "/v1/messages/../files"),
            (Provider::Anthropic, Method::POST, "/v1/%6Dessages"),
            (
                Provider::Anthropic,
                Method::POST,
                "/v1/messages?beta=true&x=1",
            ),
            (Provider::Anthropic, Method::POST, "/v1/responses"),
            (Provider::Openai, Method::POST, "/messages"),
            (Provider::Openai, Method::GET, "/responses"),
            (Provider::Openai, Method::POST, "/v1/responses"),
            (Provider::Openai, Method::POST, "/files"),
            (Provider::Openai, Method::POST, "/batches"),
            (Provider::Openai, Method::GET, "/models"),
            (Provider::Openai, Method::POST, "/chat/completions"),
            (Provider::Openai, Method::POST, "/responses?stream=true"),
        ];
        for (provider, method, path) in refused {
            let reason = route(provider, &method, path).expect_err(path);
            assert!(reason.contains("was not sent"), "{reason}");
        }
        let reason = route(Provider::Anthropic, &Method::GET, "/v1/files").expect_err("refused");
        assert!(
            reason.contains("POST /anthropic/v1/messages")
                && reason.contains("not GET /anthropic/v1/files"),
            "{reason}"
        );
    }
}
