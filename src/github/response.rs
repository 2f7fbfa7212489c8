//! What a GitHub response says besides its body: the ETag, `X-Poll-Interval`, `Retry-After`,
//! the rate-limit headers and the `Link` pagination.

use std::time::Duration;

use chrono::{DateTime, TimeDelta, Utc};
use http::HeaderMap;
use serde::{Deserialize, Serialize};

/// GitHub's rate-limit headers.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RateLimit {
    pub limit: Option<u64>,
    pub remaining: Option<u64>,
    pub used: Option<u64>,
    pub reset: Option<DateTime<Utc>>,
    pub resource: Option<String>,
}

/// What a response said about polling, independent of its body.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ResponseMeta {
    pub status: u16,
    /// The ETag exactly as sent (quotes kept).
    pub etag: Option<String>,
    pub poll_interval: Option<Duration>,
    pub retry_after: Option<Duration>,
    /// The `page` of the `Link` header's `rel="last"`, when there are more pages.
    pub last_page: Option<u32>,
    /// The URL of the `Link` header's `rel="next"`, when there are more pages.
    pub next: Option<String>,
    pub rate: RateLimit,
}

fn header_str<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers.get(name)?.to_str().ok().map(str::trim)
}

fn header_u64(headers: &HeaderMap, name: &str) -> Option<u64> {
    header_str(headers, name)?.parse().ok()
}

impl ResponseMeta {
    /// Read status, ETag, poll interval, retry-after and rate-limit headers.
    pub fn from_headers(status: u16, headers: &HeaderMap) -> Self {
        Self {
            status,
            etag: header_str(headers, "etag").map(str::to_owned),
            poll_interval: header_u64(headers, "x-poll-interval").map(Duration::from_secs),
            retry_after: header_u64(headers, "retry-after").map(Duration::from_secs),
            last_page: header_str(headers, "link").and_then(last_page),
            next: header_str(headers, "link")
                .and_then(|l| link_url(l, "next"))
                .map(str::to_owned),
            rate: RateLimit {
                limit: header_u64(headers, "x-ratelimit-limit"),
                remaining: header_u64(headers, "x-ratelimit-remaining"),
                used: header_u64(headers, "x-ratelimit-used"),
                reset: header_u64(headers, "x-ratelimit-reset")
                    .and_then(|s| i64::try_from(s).ok())
                    .and_then(|s| DateTime::from_timestamp(s, 0)),
                resource: header_str(headers, "x-ratelimit-resource").map(str::to_owned),
            },
        }
    }

    /// When a rate-limited response says to try again, if it is one.
    pub fn rate_limited_until(&self, now: DateTime<Utc>) -> Option<DateTime<Utc>> {
        if let Some(after) = self.retry_after {
            return Some(now + delta(after));
        }
        if self.rate.remaining == Some(0) {
            return Some(self.rate.reset.unwrap_or(now + TimeDelta::seconds(60)));
        }
        None
    }
}

/// The URL of the link with relation `rel` in a `Link` header (RFC 8288, as GitHub writes it:
/// `<url>; rel="next", <url>; rel="last"`).
pub fn link_url<'a>(link: &'a str, rel: &str) -> Option<&'a str> {
    let mut rest = link;
    loop {
        let start = rest.find('<')?;
        let end = start + rest[start..].find('>')?;
        let url = &rest[start + 1..end];
        let params_end = rest[end..].find('<').map_or(rest.len(), |i| end + i);
        let params = rest[end + 1..params_end].trim().trim_end_matches(',');
        let matches = params.split(';').any(|p| {
            p.trim()
                .strip_prefix("rel=")
                .map(|v| v.trim().trim_matches('"'))
                .is_some_and(|v| v.split_ascii_whitespace().any(|r| r == rel))
        });
        if matches {
            return Some(url);
        }
        rest = &rest[params_end..];
    }
}

/// The page number of `rel="last"` in a `Link` header.
fn last_page(link: &str) -> Option<u32> {
    let url = link_url(link, "last")?;
    let query = url.split_once('?')?.1;
    query
        .split('&')
        .find_map(|kv| kv.strip_prefix("page="))
        .and_then(|n| n.parse().ok())
}

/// The path and query of a link, without scheme and host: a further page is asked of the
/// configured API (the token never goes to a host a header names).
pub fn link_path(url: &str) -> Option<String> {
    let rest = match url.split_once("://") {
        Some((_, rest)) => &rest[rest.find('/')?..],
        None => url,
    };
    rest.starts_with('/').then(|| rest.to_owned())
}

pub(super) fn delta(d: Duration) -> TimeDelta {
    TimeDelta::from_std(d).unwrap_or(TimeDelta::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t0() -> DateTime<Utc> {
        DateTime::from_timestamp(1_800_000_000, 0).expect("valid")
    }

    #[test]
    fn headers_are_read() {
        let mut h = HeaderMap::new();
        h.insert("etag", "\"abc\"".parse().expect("hv"));
        h.insert("x-poll-interval", "90".parse().expect("hv"));
        h.insert("x-ratelimit-remaining", "0".parse().expect("hv"));
        h.insert("x-ratelimit-reset", "1800000100".parse().expect("hv"));
        h.insert(
            "link",
            "<https://api.github.com/repositories/1/events?per_page=100&page=2>; rel=\"next\", <https://api.github.com/repositories/1/events?page=3&per_page=100>; rel=\"last\""
                .parse()
                .expect("hv"),
        );
        let m = ResponseMeta::from_headers(200, &h);
        assert_eq!(m.etag.as_deref(), Some("\"abc\""));
        assert_eq!(m.poll_interval, Some(Duration::from_secs(90)));
        assert_eq!(
            m.rate_limited_until(t0()),
            Some(t0() + TimeDelta::seconds(100))
        );
    }

    #[test]
    fn link_header_relations_are_found_as_github_writes_them() {
        let link = "<https://api.github.com/repositories/1/events?per_page=100&page=1>; rel=\"prev\", <https://api.github.com/repositories/1/events?per_page=100&page=3>; rel=\"next\", <https://api.github.com/repositories/1/events?per_page=100&page=3>; rel=\"last\", <https://api.github.com/repositories/1/events?per_page=100&page=1>; rel=\"first\"";
        assert_eq!(
            link_url(link, "next"),
            Some("https://api.github.com/repositories/1/events?per_page=100&page=3")
        );
        assert_eq!(
            link_url(link, "prev"),
            Some("https://api.github.com/repositories/1/events?per_page=100&page=1")
        );
        assert_eq!(last_page(link), Some(3));
        let last_only = "<https://api.github.com/x?page=1>; rel=\"prev\", <https://api.github.com/x?page=1>; rel=\"first\"";
        assert_eq!(link_url(last_only, "next"), None);
        assert_eq!(link_url("", "next"), None);
        assert_eq!(link_url("garbage <no end", "next"), None);
    }

    #[test]
    fn a_link_is_followed_by_its_path_only() {
        assert_eq!(
            link_path("https://api.github.com/repositories/1/events?per_page=100&page=2")
                .as_deref(),
            Some("/repositories/1/events?per_page=100&page=2")
        );
        assert_eq!(
            link_path("https://ghe.example/api/v3/repositories/1/events?page=2").as_deref(),
            Some("/api/v3/repositories/1/events?page=2")
        );
        assert_eq!(link_path("/x?page=2").as_deref(), Some("/x?page=2"));
        assert_eq!(link_path("https://evil.example"), None);
        assert_eq!(link_path("x?page=2"), None);
    }
}
