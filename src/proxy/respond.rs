//! The responses the proxy makes itself: plain-text refusals for the egress side and the preamble,
//! and model-API errors in each provider's own JSON shape so the CLIs show the message and know
//! whether to retry.

use http::{header, Response, StatusCode};
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Empty, Full};
use hyper::body::Bytes;
use serde_json::json;

use super::grant::Provider;

/// Errors of a proxied body.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;
/// The body of every response the proxy sends.
pub type ProxyBody = UnsyncBoxBody<Bytes, BoxError>;

/// Why the proxy answers a model request itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ModelRefusal {
    /// The token is missing or not this run's, the run ended, or the provider is not granted.
    Auth,
    /// A budget stop limit has no room left: not retryable.
    Budget,
    /// Not a call the run token is good for ([`super::routes`]).
    Forbidden,
    /// The run has all its requests in flight, or the proxy no room for the body: retry.
    Busy,
    /// The request body did not arrive whole, or in time.
    Incomplete,
    /// The request body is larger than the proxy reads.
    TooLarge,
    /// The proxy has no such upstream or could not reach it.
    Upstream,
}

/// An empty body.
pub fn empty() -> ProxyBody {
    Empty::new().map_err(|never| match never {}).boxed_unsync()
}

/// A body of `bytes`.
pub fn full(bytes: impl Into<Bytes>) -> ProxyBody {
    Full::new(bytes.into())
        .map_err(|never| match never {})
        .boxed_unsync()
}

/// A plain-text response of one line.
pub fn text(status: StatusCode, line: &str) -> Response<ProxyBody> {
    let mut response = Response::new(full(format!("{line}\n")));
    *response.status_mut() = status;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    response
}

/// A model-API error as `provider` would send it.
pub fn model_error(
    provider: Provider,
    refusal: ModelRefusal,
    message: &str,
) -> Response<ProxyBody> {
    let (status, body) = match provider {
        Provider::Anthropic => {
            let (status, kind) = match refusal {
                ModelRefusal::Auth => (StatusCode::UNAUTHORIZED, "authentication_error"),
                ModelRefusal::Budget | ModelRefusal::Incomplete => {
                    (StatusCode::BAD_REQUEST, "invalid_request_error")
                }
                ModelRefusal::Forbidden => (StatusCode::FORBIDDEN, "permission_error"),
                ModelRefusal::Busy => (StatusCode::TOO_MANY_REQUESTS, "rate_limit_error"),
                ModelRefusal::TooLarge => (StatusCode::PAYLOAD_TOO_LARGE, "request_too_large"),
                ModelRefusal::Upstream => (StatusCode::BAD_GATEWAY, "api_error"),
            };
            (
                status,
                json!({"type": "error", "error": {"type": kind, "message": message}}),
            )
        }
        Provider::Openai => {
            let (status, kind, code) = match refusal {
                ModelRefusal::Auth => (
                    StatusCode::UNAUTHORIZED,
                    "invalid_request_error",
                    "invalid_api_key",
                ),
                ModelRefusal::Budget => (
                    StatusCode::BAD_REQUEST,
                    "invalid_request_error",
                    "budget_exceeded",
                ),
                ModelRefusal::TooLarge => (
                    StatusCode::PAYLOAD_TOO_LARGE,
                    "invalid_request_error",
                    "request_too_large",
                ),
                ModelRefusal::Forbidden => (
                    StatusCode::FORBIDDEN,
                    "invalid_request_error",
                    "forbidden_by_rover",
                ),
                ModelRefusal::Busy => (
                    StatusCode::TOO_MANY_REQUESTS,
                    "requests",
                    "rate_limit_exceeded",
                ),
                ModelRefusal::Incomplete => (
                    StatusCode::BAD_REQUEST,
                    "invalid_request_error",
                    "incomplete_body",
                ),
                ModelRefusal::Upstream => (
                    StatusCode::BAD_GATEWAY,
                    "server_error",
                    "upstream_unreachable",
                ),
            };
            (
                status,
                json!({"error": {"message": message, "type": kind, "param": null, "code": code}}),
            )
        }
    };
    let mut response = Response::new(full(body.to_string()));
    *response.status_mut() = status;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("application/json"),
    );
    if refusal == ModelRefusal::Busy {
        response
            .headers_mut()
            .insert(header::RETRY_AFTER, header::HeaderValue::from_static("1"));
    }
    response
}
