//! GitHub: a narrow interface shaped around what the steps need, implemented with octocrab.

pub mod error;
pub mod events;

pub use error::GitHubError;
pub use events::{
    parse_events_page, Channel, EventAction, EventKind, EventPage, NormalizeOptions,
    NormalizedEvent, SkipReason, SkippedEvent, Visibility,
};
