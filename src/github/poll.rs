//! When to poll the events feed next, and which events are new: ETag, `X-Poll-Interval`,
//! rate-limit headers and backoff, as pure logic plus one `poll_once` helper.

use std::collections::{HashSet, VecDeque};
use std::time::Duration;

use chrono::{DateTime, TimeDelta, Utc};
use http::HeaderMap;
use serde::{Deserialize, Serialize};

use super::api::{EventsFetch, GitHub};
use super::error::GitHubError;
use super::events::NormalizedEvent;

/// How many event ids the cursor remembers; the feed never serves more than 300.
pub const SEEN_CAPACITY: usize = 1000;

/// Polling knobs, part of the GitHub settings in `rover.json`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "camelCase")]
pub struct PollSettings {
    /// Never poll more often than this, whatever GitHub says (seconds).
    pub min_interval_secs: u64,
    /// Longest wait after repeated failures (seconds).
    pub max_backoff_secs: u64,
    /// On the very first poll (no cursor yet), mark the served backlog as seen instead of
    /// reacting to up to 300 old events.
    pub skip_backlog: bool,
}

impl Default for PollSettings {
    fn default() -> Self {
        Self {
            min_interval_secs: 60,
            max_backoff_secs: 900,
            skip_backlog: true,
        }
    }
}

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

/// The page number of `rel="last"` in a `Link` header.
fn last_page(link: &str) -> Option<u32> {
    link.split(',')
        .find(|part| part.contains("rel=\"last\""))
        .and_then(|part| {
            let url = part.split(['<', '>']).nth(1)?;
            let query = url.split_once('?')?.1;
            query
                .split('&')
                .find_map(|kv| kv.strip_prefix("page="))
                .and_then(|n| n.parse().ok())
        })
}

fn delta(d: Duration) -> TimeDelta {
    TimeDelta::from_std(d).unwrap_or(TimeDelta::MAX)
}

/// What the poller persists between runs: the ETag and the ids already ingested.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct PollCursor {
    pub etag: Option<String>,
    /// Most recent last.
    pub seen: VecDeque<String>,
    /// Whether a first page was ever taken (the backlog was dealt with).
    pub primed: bool,
}

impl PollCursor {
    fn remember(&mut self, id: &str) {
        self.seen.push_back(id.to_owned());
        while self.seen.len() > SEEN_CAPACITY {
            self.seen.pop_front();
        }
    }
}

/// The outcome of one poll that reached GitHub.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PollResult {
    /// New relevant events, oldest first.
    pub new_events: Vec<NormalizedEvent>,
    /// Whether GitHub answered 304 (nothing new, no rate cost).
    pub not_modified: bool,
    /// Events of the page skipped for being irrelevant or rover's own.
    pub skipped: usize,
    /// Old events already ingested before, served again.
    pub duplicates: usize,
}

/// Pure: when to poll next after a success (`failures == 0`) or after failures.
///
/// The wait is never shorter than `X-Poll-Interval` nor `min_interval_secs`, stays until the
/// rate limit resets when none is left, doubles per consecutive failure up to
/// `max_backoff_secs`, and never ends before a rate-limit error's reset time.
pub fn next_poll_at(
    now: DateTime<Utc>,
    meta: Option<&ResponseMeta>,
    last_interval: Option<Duration>,
    failures: u32,
    error_until: Option<DateTime<Utc>>,
    settings: &PollSettings,
) -> DateTime<Utc> {
    let min = Duration::from_secs(settings.min_interval_secs);
    let interval = meta
        .and_then(|m| m.poll_interval)
        .or(last_interval)
        .unwrap_or(min)
        .max(min);
    let mut wait = interval;
    if failures > 0 {
        let factor = 2u32.saturating_pow(failures.min(16));
        wait = interval
            .saturating_mul(factor)
            .min(Duration::from_secs(settings.max_backoff_secs).max(interval));
    }
    let mut at = now + delta(wait);
    if let Some(meta) = meta {
        if let Some(until) = meta.rate_limited_until(now) {
            at = at.max(until);
        }
    }
    if let Some(until) = error_until {
        at = at.max(until);
    }
    at
}

/// Polling state of the event step: cursor, schedule and failure count.
#[derive(Debug, Clone)]
pub struct Poller {
    settings: PollSettings,
    cursor: PollCursor,
    next_at: Option<DateTime<Utc>>,
    interval: Option<Duration>,
    failures: u32,
}

impl Poller {
    /// Start from a persisted cursor (or `PollCursor::default()` for a fresh start).
    pub fn new(settings: PollSettings, cursor: PollCursor) -> Self {
        Self {
            settings,
            cursor,
            next_at: None,
            interval: None,
            failures: 0,
        }
    }

    /// The state to persist.
    pub fn cursor(&self) -> &PollCursor {
        &self.cursor
    }

    /// When the next request may be made; `None` means now.
    pub fn next_poll_at(&self) -> Option<DateTime<Utc>> {
        self.next_at
    }

    /// Whether a poll is allowed at `now`.
    pub fn is_due(&self, now: DateTime<Utc>) -> bool {
        self.next_at.is_none_or(|at| now >= at)
    }

    /// Consecutive failures so far.
    pub fn failures(&self) -> u32 {
        self.failures
    }

    /// Record a 304.
    pub fn on_not_modified(&mut self, now: DateTime<Utc>, meta: &ResponseMeta) {
        self.failures = 0;
        self.schedule(now, meta, None);
    }

    /// Record a page: remember its ETag and return the events not seen before, oldest first.
    pub fn on_page(
        &mut self,
        now: DateTime<Utc>,
        events: Vec<NormalizedEvent>,
        skipped_ids: &[String],
        meta: &ResponseMeta,
    ) -> (Vec<NormalizedEvent>, usize) {
        self.failures = 0;
        if meta.etag.is_some() {
            self.cursor.etag.clone_from(&meta.etag);
        }
        let seen: HashSet<String> = self.cursor.seen.iter().cloned().collect();
        let backlog = !self.cursor.primed && self.settings.skip_backlog;
        let mut fresh = Vec::new();
        let mut duplicates = 0;
        // The feed is newest first; ingest oldest first.
        for event in events.into_iter().rev() {
            if seen.contains(&event.id) {
                duplicates += 1;
                continue;
            }
            self.cursor.remember(&event.id);
            if !backlog {
                fresh.push(event);
            }
        }
        for id in skipped_ids.iter().rev() {
            if !seen.contains(id) {
                self.cursor.remember(id);
            }
        }
        self.cursor.primed = true;
        self.schedule(now, meta, None);
        (fresh, duplicates)
    }

    /// Record a failed poll: back off, longer for each failure in a row.
    pub fn on_error(&mut self, now: DateTime<Utc>, error: &GitHubError) {
        self.failures = self.failures.saturating_add(1);
        let failures = if error.is_retryable() {
            self.failures
        } else {
            // Not retryable (credentials, not found): wait the longest, a human must act.
            32
        };
        self.next_at = Some(next_poll_at(
            now,
            None,
            self.interval,
            failures,
            error.retry_at(),
            &self.settings,
        ));
    }

    fn schedule(&mut self, now: DateTime<Utc>, meta: &ResponseMeta, until: Option<DateTime<Utc>>) {
        if let Some(interval) = meta.poll_interval {
            self.interval = Some(interval);
        }
        self.next_at = Some(next_poll_at(
            now,
            Some(meta),
            self.interval,
            0,
            until,
            &self.settings,
        ));
    }
}

/// Poll once if due: fetch with the stored ETag, dedupe, schedule the next poll.
///
/// Returns `Ok(None)` when it is not time yet. Errors are recorded in the poller (backoff)
/// and returned so the caller can log them; the poller stays usable.
pub async fn poll_once(
    github: &dyn GitHub,
    poller: &mut Poller,
    now: DateTime<Utc>,
) -> Result<Option<PollResult>, GitHubError> {
    if !poller.is_due(now) {
        return Ok(None);
    }
    let etag = poller.cursor.etag.clone();
    match github.list_events(etag.as_deref()).await {
        Ok(EventsFetch::NotModified { meta }) => {
            poller.on_not_modified(now, &meta);
            Ok(Some(PollResult {
                new_events: Vec::new(),
                not_modified: true,
                skipped: 0,
                duplicates: 0,
            }))
        }
        Ok(EventsFetch::Page { page, meta }) => {
            let skipped_ids: Vec<String> =
                page.skipped.iter().filter_map(|s| s.id.clone()).collect();
            let skipped = page.skipped.len();
            let (new_events, duplicates) = poller.on_page(now, page.events, &skipped_ids, &meta);
            Ok(Some(PollResult {
                new_events,
                not_modified: false,
                skipped,
                duplicates,
            }))
        }
        Err(error) => {
            poller.on_error(now, &error);
            Err(error)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t0() -> DateTime<Utc> {
        DateTime::from_timestamp(1_800_000_000, 0).expect("valid")
    }

    fn meta(interval: Option<u64>) -> ResponseMeta {
        ResponseMeta {
            status: 200,
            poll_interval: interval.map(Duration::from_secs),
            ..ResponseMeta::default()
        }
    }

    #[test]
    fn obeys_poll_interval_but_never_below_minimum() {
        let s = PollSettings {
            min_interval_secs: 10,
            ..PollSettings::default()
        };
        assert_eq!(
            next_poll_at(t0(), Some(&meta(Some(60))), None, 0, None, &s),
            t0() + TimeDelta::seconds(60)
        );
        assert_eq!(
            next_poll_at(t0(), Some(&meta(Some(2))), None, 0, None, &s),
            t0() + TimeDelta::seconds(10)
        );
        assert_eq!(
            next_poll_at(
                t0(),
                Some(&meta(None)),
                Some(Duration::from_secs(120)),
                0,
                None,
                &s
            ),
            t0() + TimeDelta::seconds(120)
        );
    }

    #[test]
    fn exhausted_rate_limit_waits_until_reset() {
        let s = PollSettings::default();
        let mut m = meta(Some(60));
        m.rate.remaining = Some(0);
        m.rate.reset = Some(t0() + TimeDelta::seconds(3000));
        assert_eq!(
            next_poll_at(t0(), Some(&m), None, 0, None, &s),
            t0() + TimeDelta::seconds(3000)
        );
        let mut m = meta(Some(60));
        m.retry_after = Some(Duration::from_secs(500));
        assert_eq!(
            next_poll_at(t0(), Some(&m), None, 0, None, &s),
            t0() + TimeDelta::seconds(500)
        );
    }

    #[test]
    fn failures_double_up_to_the_cap_and_respect_error_reset() {
        let s = PollSettings {
            min_interval_secs: 60,
            max_backoff_secs: 300,
            skip_backlog: true,
        };
        assert_eq!(
            next_poll_at(t0(), None, None, 1, None, &s),
            t0() + TimeDelta::seconds(120)
        );
        assert_eq!(
            next_poll_at(t0(), None, None, 2, None, &s),
            t0() + TimeDelta::seconds(240)
        );
        assert_eq!(
            next_poll_at(t0(), None, None, 9, None, &s),
            t0() + TimeDelta::seconds(300)
        );
        let until = t0() + TimeDelta::seconds(4000);
        assert_eq!(next_poll_at(t0(), None, None, 1, Some(until), &s), until);
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
    fn non_retryable_error_backs_off_longest() {
        let s = PollSettings::default();
        let mut p = Poller::new(s.clone(), PollCursor::default());
        p.on_error(
            t0(),
            &GitHubError::BadCredentials {
                what: "events".into(),
            },
        );
        assert_eq!(p.next_poll_at(), Some(t0() + TimeDelta::seconds(900)));
        assert!(!p.is_due(t0() + TimeDelta::seconds(899)));
        assert!(p.is_due(t0() + TimeDelta::seconds(900)));
    }
}
