//! GitHub: a narrow interface shaped around what the steps need, implemented with octocrab.
//!
//! - `events`: lenient parsing of the events feed into `NormalizedEvent` with its `Channel`.
//! - `poll`: ETag, `X-Poll-Interval`, rate limits, backoff, `Link` pages and gap detection;
//!   `poll_once` for the event step.
//! - `reconcile`: the list APIs swept for what the feed missed.
//! - `api`: the `GitHub` trait and its records; `octo`: its octocrab implementation.
//! - `trust`: who may make rover work. `context`: what the coordinator reads.
//! - `deliver`: posting answers once, with the footer marker. `redact`: what may leave.
//! - `auth`: the token behind requests and pushes; `app`: a GitHub App's installation tokens.
//! - `recorded`: the client noting each read a step run makes, for replay.
//! - `identity`: rover's own login (configured, or learned from the token at start).
//! - `webhook`: webhook deliveries: the signature check and the events-feed envelope.

pub mod api;
pub mod app;
pub mod auth;
pub mod context;
pub mod deliver;
pub mod error;
pub mod events;
pub mod identity;
pub mod installations;
pub mod octo;
pub mod poll;
pub mod reactions;
pub mod reconcile;
pub mod recorded;
pub mod redact;
mod response;
pub mod settings;
pub mod trust;
pub mod webhook;
mod wire;

pub use api::{
    CiState, CiStatus, Comment, EventsFetch, GitHub, Issue, IssueState, MergeRequest, Merged,
    MergedPull, NewPullRequest, NewRelease, Permission, Posted, PullRequest, Release, RepoRef,
    Review, ReviewComment, ReviewEvent,
};
pub use auth::GitHubAuth;
pub use context::{build_context, ContextSettings, EventContext};
pub use deliver::{compose, deliver, marker, Delivery, Outgoing};
pub use error::GitHubError;
pub use events::{
    parse_events_page, Channel, EventAction, EventKind, EventPage, NormalizeOptions,
    NormalizedEvent, SkipReason, SkippedEvent, Visibility,
};
pub use identity::BotIdentity;
pub use octo::{token_from_env, OctoGitHub};
pub use poll::{
    next_poll_at, poll_once, PollCursor, PollResult, PollSettings, Poller, ResponseMeta,
};
pub use reactions::{Reaction, ReactionTarget, ReactionsFetch};
pub use redact::Redactor;
pub use settings::{
    ContributorPrs, GitHubSettings, API_URL_ENV, DEFAULT_API_URL, TOKEN_ENV, TOKEN_ENV_FALLBACK,
};
pub use trust::{TrustDecision, TrustPolicy, TrustSettings};
