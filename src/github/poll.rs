//! When to poll the events feed next, and which events are new: ETag, `X-Poll-Interval`,
//! rate-limit headers and backoff, `Link` pagination and gap detection, as pure logic plus one
//! `poll_once` helper.
//!
//! The feed serves at most 300 events, newest first, in pages of 100. A poll reads page 1 (with
//! the ETag, so an unchanged feed is a free 304) and follows `rel="next"` until it meets an
//! event it has seen, the pages run out, or the rate limit runs low. When the cursor had seen
//! ids and none of them is served any more, events may have been missed: the result says so
//! (a gap) and the caller sweeps the list APIs (reconcile).

use std::collections::HashSet;
use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::Deserialize;

use super::api::{EventsFetch, GitHub};
use super::error::GitHubError;
use super::events::{EventPage, NormalizedEvent, SkippedEvent};
use super::response::delta;
pub use super::response::{link_path, link_url, RateLimit, ResponseMeta};

/// How many event ids the cursor remembers; the feed never serves more than 300.
pub const SEEN_CAPACITY: usize = 1000;

/// The most pages of the events feed one poll reads (GitHub serves 3 pages of 100).
pub const MAX_EVENT_PAGES: usize = 3;

/// Below this many requests left in the rate limit, a poll reads no further page (the rest of
/// the budget is for answering).
pub const MIN_RATE_FOR_PAGES: u64 = 100;

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
    /// With `skip_backlog`, still process this many of the most recent backlog events on the
    /// very first poll (`rover autopilot start --backlog N`).
    pub backlog: usize,
    /// How often to sweep the list APIs for events the feed may have missed (seconds); they are
    /// swept after a restart and after a gap too. 0 turns reconcile off.
    pub reconcile_interval_secs: u64,
}

impl Default for PollSettings {
    fn default() -> Self {
        Self {
            min_interval_secs: 60,
            max_backoff_secs: 900,
            skip_backlog: true,
            backlog: 0,
            reconcile_interval_secs: 900,
        }
    }
}

/// What the poller persists between runs (`cursor.json` `poll`): a store record.
pub use crate::store::PollCursor;

/// Remember an ingested event id, the oldest forgotten past [`SEEN_CAPACITY`].
fn remember(cursor: &mut PollCursor, id: &str) {
    cursor.seen.push_back(id.to_owned());
    while cursor.seen.len() > SEEN_CAPACITY {
        cursor.seen.pop_front();
    }
}

/// The outcome of one poll that reached GitHub.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PollResult {
    /// New relevant events, oldest first.
    pub new_events: Vec<NormalizedEvent>,
    /// Whether GitHub answered 304 (nothing new, no rate cost).
    pub not_modified: bool,
    /// Events of the pages skipped for being irrelevant or rover's own.
    pub skipped: usize,
    /// Those of them not seen before (each is recorded once, with its reason).
    pub new_skipped: Vec<SkippedEvent>,
    /// Old events already ingested before, served again.
    pub duplicates: usize,
    /// Relevant events of the backlog not processed on the very first poll, oldest first.
    pub backlog: Vec<NormalizedEvent>,
    /// How many pages were read.
    pub pages: usize,
    /// Why events may have been missed, when they may have been.
    pub gap: Option<String>,
}

impl PollResult {
    fn not_modified() -> Self {
        Self {
            new_events: Vec::new(),
            not_modified: true,
            skipped: 0,
            new_skipped: Vec::new(),
            duplicates: 0,
            backlog: Vec::new(),
            pages: 0,
            gap: None,
        }
    }
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
    /// `--backlog N`: the next poll processes the N most recent events, seen or not.
    replay: Option<usize>,
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
            replay: None,
        }
    }

    /// Make the next poll process the `n` most recent relevant events of the feed, whether the
    /// cursor has seen them or not (`rover autopilot start --backlog N`): on a first start they
    /// are the backlog's newest; later, events skipped as backlog then are ingested now, and
    /// events already ingested are recognised as duplicates by their ids.
    #[must_use]
    pub fn with_backlog(mut self, n: usize) -> Self {
        self.replay = Some(n);
        self
    }

    pub fn settings(&self) -> &PollSettings {
        &self.settings
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

    /// Allows the next poll now, whatever the backoff says: a `--once` run retries a transient
    /// failure within itself, on its own shorter schedule (its caller never does so before a
    /// rate limit's reset).
    pub fn retry_now(&mut self) {
        self.next_at = None;
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

    /// Whether a poll that read `pages` so far should read the next one: until an event seen
    /// before shows up; on the very first poll, only as far as the backlog to process needs.
    /// (GitHub's cap of [`MAX_EVENT_PAGES`] is the caller's to obey.)
    pub fn wants_next_page(&self, pages: &[EventPage]) -> bool {
        let relevant: usize = pages.iter().map(|p| p.events.len()).sum();
        if self.replay.is_some_and(|n| relevant < n) {
            return true;
        }
        if !self.cursor.primed {
            if !self.settings.skip_backlog {
                return true;
            }
            return relevant < self.settings.backlog;
        }
        let seen: HashSet<&str> = self.cursor.seen.iter().map(String::as_str).collect();
        !pages.iter().any(|p| page_has_seen(p, &seen))
    }

    /// Record the pages of one poll (newest first, as served; the ETag is page 1's): return
    /// the events not seen before, oldest first, and whether some may have been missed.
    /// `cut_short` says why no further page was read although one was wanted.
    pub fn on_pages(
        &mut self,
        now: DateTime<Utc>,
        pages: Vec<EventPage>,
        meta: &ResponseMeta,
        cut_short: Option<String>,
    ) -> PollResult {
        self.failures = 0;
        if meta.etag.is_some() {
            self.cursor.etag.clone_from(&meta.etag);
        }
        let seen: HashSet<String> = self.cursor.seen.iter().cloned().collect();
        let had_seen = self.cursor.primed && !seen.is_empty();
        let found_seen = {
            let seen: HashSet<&str> = seen.iter().map(String::as_str).collect();
            pages.iter().any(|p| page_has_seen(p, &seen))
        };
        let first_poll = !self.cursor.primed;
        let skipping_backlog = first_poll && self.settings.skip_backlog;
        let replay = self.replay.take();
        let mut served = 0;
        let mut skipped = 0;
        let mut events = Vec::new();
        let mut skipped_events = Vec::new();
        for page in pages {
            served += page.events.len() + page.skipped.len();
            skipped += page.skipped.len();
            events.extend(page.events);
            skipped_events.extend(page.skipped);
        }
        // The feed is newest first; ingest oldest first. An event can show up on two pages
        // when the feed moved between requests: it counts once.
        let mut taken: HashSet<String> = HashSet::new();
        let all: Vec<NormalizedEvent> = events
            .into_iter()
            .rev()
            .filter(|e| taken.insert(e.id.clone()))
            .collect();
        // The most recent events to process whether seen or not (`--backlog N`), or of the
        // backlog on the first poll.
        let keep_recent = replay.or(skipping_backlog.then_some(self.settings.backlog));
        let recent: HashSet<String> = all
            .iter()
            .rev()
            .take(keep_recent.unwrap_or(0))
            .map(|e| e.id.clone())
            .collect();
        let mut fresh = Vec::new();
        let mut backlog = Vec::new();
        let mut duplicates = 0;
        for event in all {
            let was_seen = seen.contains(&event.id);
            if was_seen {
                duplicates += 1;
            } else {
                remember(&mut self.cursor, &event.id);
            }
            if recent.contains(&event.id) {
                fresh.push(event);
            } else if skipping_backlog {
                backlog.push(event);
            } else if !was_seen {
                fresh.push(event);
            }
        }
        let mut new_skipped = Vec::new();
        for s in skipped_events.into_iter().rev() {
            match &s.id {
                Some(id) if seen.contains(id) => {}
                Some(id) => {
                    if taken.insert(id.clone()) {
                        remember(&mut self.cursor, id);
                        new_skipped.push(s);
                    }
                }
                None => new_skipped.push(s),
            }
        }
        let gap = (had_seen && !found_seen).then(|| {
            let why = cut_short.unwrap_or_else(|| "the feed has no more pages".into());
            format!(
                "none of the {} event ids seen before is among the {served} events served ({why}): events may have been missed",
                seen.len()
            )
        });
        self.cursor.primed = true;
        self.schedule(now, meta, None);
        PollResult {
            new_events: fresh,
            not_modified: false,
            skipped,
            new_skipped,
            duplicates,
            backlog,
            pages: 0,
            gap,
        }
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

fn page_has_seen(page: &EventPage, seen: &HashSet<&str>) -> bool {
    page.events.iter().any(|e| seen.contains(e.id.as_str()))
        || page
            .skipped
            .iter()
            .any(|s| s.id.as_deref().is_some_and(|id| seen.contains(id)))
}

/// Poll once if due: page 1 with the stored ETag, further pages as [`Poller::wants_next_page`]
/// says and the rate limit allows, dedupe, schedule the next poll.
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
    // A replay must see the feed even when it has not changed.
    let etag = poller
        .cursor
        .etag
        .clone()
        .filter(|_| poller.replay.is_none());
    let (first, meta) = match github.list_events(etag.as_deref()).await {
        Ok(EventsFetch::NotModified { meta }) => {
            poller.on_not_modified(now, &meta);
            return Ok(Some(PollResult::not_modified()));
        }
        Ok(EventsFetch::Page { page, meta }) => (page, meta),
        Err(error) => {
            poller.on_error(now, &error);
            return Err(error);
        }
    };
    let mut pages = vec![first];
    let mut next = meta.next.clone();
    let mut rate = meta.rate.clone();
    let mut cut_short = None;
    while poller.wants_next_page(&pages) {
        let Some(url) = next.take() else { break };
        if pages.len() >= MAX_EVENT_PAGES {
            cut_short = Some(format!("GitHub serves at most {MAX_EVENT_PAGES} pages"));
            break;
        }
        if let Some(left) = rate.remaining.filter(|r| *r < MIN_RATE_FOR_PAGES) {
            cut_short = Some(format!(
                "stopped after page {}: {left} requests left in the rate limit",
                pages.len()
            ));
            break;
        }
        match github.list_events_page(&url).await {
            Ok(EventsFetch::Page { page, meta }) => {
                pages.push(page);
                next = meta.next;
                rate = meta.rate;
            }
            Ok(EventsFetch::NotModified { .. }) => break,
            Err(error) => {
                // Nothing is recorded: the next poll reads all pages again.
                poller.on_error(now, &error);
                return Err(error);
            }
        }
    }
    let count = pages.len();
    // The schedule obeys the last answer's rate limit and the first one's poll interval.
    let meta = ResponseMeta { rate, ..meta };
    let mut result = poller.on_pages(now, pages, &meta, cut_short);
    result.pages = count;
    Ok(Some(result))
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeDelta;

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
            ..PollSettings::default()
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

    fn ev(id: u64) -> NormalizedEvent {
        NormalizedEvent::local(&id.to_string(), "alice", "x", t0())
    }

    /// A page of the feed: ids newest first.
    fn page(ids: std::ops::RangeInclusive<u64>) -> EventPage {
        EventPage {
            events: ids.rev().map(ev).collect(),
            skipped: Vec::new(),
        }
    }

    fn primed(seen: std::ops::RangeInclusive<u64>) -> Poller {
        Poller::new(
            PollSettings::default(),
            PollCursor {
                etag: None,
                seen: seen.map(|i| i.to_string()).collect(),
                primed: true,
            },
        )
    }

    fn ids(events: &[NormalizedEvent]) -> Vec<u64> {
        events
            .iter()
            .map(|e| e.id.parse().expect("numeric"))
            .collect()
    }

    #[test]
    fn pages_are_followed_until_a_seen_id_and_ingested_oldest_first_once() {
        let mut p = primed(1..=10);
        let newest = page(111..=210);
        assert!(p.wants_next_page(std::slice::from_ref(&newest)));
        // The feed moved between requests: 111 shows up again on page 2.
        let older = page(5..=111);
        assert!(!p.wants_next_page(&[newest.clone(), older.clone()]));
        let r = p.on_pages(t0(), vec![newest, older], &meta(None), None);
        assert_eq!(ids(&r.new_events), (11..=210).collect::<Vec<_>>());
        assert_eq!(r.duplicates, 6);
        assert_eq!(r.gap, None);
        assert!(p.cursor().seen.contains(&"210".to_owned()));
    }

    #[test]
    fn a_gap_is_reported_when_no_seen_id_is_served_any_more() {
        let mut p = primed(1..=10);
        let r = p.on_pages(
            t0(),
            vec![page(201..=300), page(101..=200), page(20..=100)],
            &meta(None),
            Some("GitHub serves at most 3 pages".into()),
        );
        assert_eq!(r.new_events.len(), 281);
        let gap = r.gap.expect("a gap");
        assert!(
            gap.contains("none of the 10 event ids") && gap.contains("at most 3 pages"),
            "{gap}"
        );
        // Once the new ids are seen, the next poll finds them again: no gap.
        let r = p.on_pages(t0(), vec![page(250..=301)], &meta(None), None);
        assert_eq!(ids(&r.new_events), vec![301]);
        assert_eq!(r.gap, None);
    }

    #[test]
    fn no_gap_on_a_first_poll_and_the_backlog_keeps_the_most_recent() {
        let mut p = Poller::new(
            PollSettings {
                backlog: 2,
                ..PollSettings::default()
            },
            PollCursor::default(),
        );
        assert!(!p.wants_next_page(&[page(1..=5)]), "2 relevant are in");
        let r = p.on_pages(t0(), vec![page(1..=5)], &meta(None), None);
        assert_eq!(ids(&r.new_events), vec![4, 5]);
        assert_eq!(ids(&r.backlog), vec![1, 2, 3]);
        assert_eq!(r.gap, None);
        assert!(p.cursor().primed);
    }

    #[test]
    fn a_replay_processes_the_most_recent_events_even_when_seen() {
        let mut p = primed(1..=5).with_backlog(3);
        assert!(p.wants_next_page(&[page(5..=6)]), "3 are wanted");
        let r = p.on_pages(t0(), vec![page(1..=6)], &meta(None), None);
        assert_eq!(ids(&r.new_events), vec![4, 5, 6]);
        assert!(r.backlog.is_empty());
        // Only once.
        let r = p.on_pages(t0(), vec![page(1..=6)], &meta(None), None);
        assert!(r.new_events.is_empty());
    }
}
