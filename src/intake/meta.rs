//! The root `event` span's meta, written by intake: the normalized event and its channel.

use serde::{Deserialize, Serialize};

use crate::github::{Channel, NormalizedEvent, Visibility};
use crate::store::{Meta, Span};

/// Where a trace's event came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum EventSource {
    Github,
    Local,
}

/// The root `event` span's meta: the normalized event and everything notify needs to answer on
/// the right channel with the right visibility.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EventMeta {
    pub source: EventSource,
    /// One line for lists: `IssuesEvent opened #12 by alice: title`.
    pub label: String,
    /// `IssuesEvent`, ..., or `LocalRequest`.
    #[serde(rename = "type")]
    pub kind: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub action: Option<String>,
    pub channel: Channel,
    pub visibility: Visibility,
    /// The GitHub event, normalized (GitHub events only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub event: Option<NormalizedEvent>,
    /// The request text (local events only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request: Option<String>,
    /// The trace this one follows: rover started it itself from there (a fix of the base
    /// branch its merge left red).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub follows: Option<uuid::Uuid>,
    /// What a revert trace reverts: rover's merge commit that left the base branch red
    /// (`lifecycle.onRedMain: "revert"`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reverts: Option<Reverting>,
}

/// The merge a revert trace takes back.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Reverting {
    /// The merge commit on the base branch.
    pub sha: String,
    /// The pull request it merged.
    pub pr_number: u64,
    pub pr_url: String,
    /// The base branch.
    pub branch: String,
}

/// The `type` of the trace rover starts itself to fix the base branch its merge left red.
pub const RED_MAIN_FIX: &str = "RedMainFix";
/// The `type` of the trace rover starts itself to revert its merge that left the base branch
/// red.
pub const RED_MAIN_REVERT: &str = "RedMainRevert";

impl EventMeta {
    /// Whether this trace is rover's own answer to a base branch its merge left red: a fix, or
    /// a revert of the merge. Such a trace's own merge that leaves it red again is not answered
    /// by another one.
    pub fn is_red_main_fix(&self) -> bool {
        self.source == EventSource::Local
            && (self.kind == RED_MAIN_FIX || self.kind == RED_MAIN_REVERT)
            && self.follows.is_some()
    }

    /// The merge this trace reverts, when it is rover's revert of a merge that left the base
    /// branch red.
    pub fn reverting(&self) -> Option<&Reverting> {
        self.reverts
            .as_ref()
            .filter(|_| self.is_red_main_fix() && self.kind == RED_MAIN_REVERT)
    }
}

impl EventMeta {
    pub fn to_meta(&self) -> Meta {
        crate::store::to_meta(self)
    }

    /// Read the root span's meta back.
    pub fn of(root: &Span) -> Result<EventMeta, serde_json::Error> {
        crate::store::from_meta(&root.meta)
    }
}
