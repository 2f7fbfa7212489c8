//! `autopilot/telemetry/state.json`: how far the exporter got in the outbox and what it counted
//! (exported, dropped and why), written by the daemon's exporter after each batch and read by
//! `rover autopilot status`.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::store::{outbox, AutopilotStore, Result};

/// The exporter's record.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ExportState {
    /// Whether the last daemon started with export on.
    #[serde(default)]
    pub enabled: bool,
    /// Where it sends (no credentials).
    #[serde(default)]
    pub endpoint: Option<String>,
    #[serde(default)]
    pub protocol: Option<String>,
    /// The outbox offset exported up to.
    #[serde(default)]
    pub offset: u64,
    /// Spans the collector accepted.
    #[serde(default)]
    pub exported: u64,
    /// Spans dropped, by cause.
    #[serde(default)]
    pub dropped: Dropped,
    #[serde(default)]
    pub last_export_at: Option<DateTime<Utc>>,
    /// The last export failure (redacted), and when.
    #[serde(default)]
    pub last_error: Option<String>,
    #[serde(default)]
    pub last_error_at: Option<DateTime<Utc>>,
}

/// Spans that were never exported, by cause.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Dropped {
    /// In a batch the collector refused, or did not answer in time (down, unreachable).
    #[serde(default)]
    pub failed: u64,
    /// Beyond the queue's bound: the oldest of a backlog longer than [`super::MAX_QUEUE`].
    #[serde(default)]
    pub queue_full: u64,
    /// Recorded but unreadable (a span file missing or damaged, a damaged outbox line).
    #[serde(default)]
    pub unreadable: u64,
}

impl Dropped {
    pub fn total(&self) -> u64 {
        self.failed + self.queue_full + self.unreadable
    }
}

pub fn path(store: &AutopilotStore) -> std::path::PathBuf {
    outbox::dir(store).join("state.json")
}

/// The record as last written (the default when there is none; a damaged one is an error
/// naming the file).
pub fn load(store: &AutopilotStore) -> Result<ExportState> {
    Ok(crate::store::fsio::read_json(&path(store))?.unwrap_or_default())
}

pub fn save(store: &AutopilotStore, state: &ExportState) -> Result<()> {
    crate::store::fsio::ensure_dir(&outbox::dir(store))?;
    crate::store::fsio::write_json_atomic(&path(store), state)
}

/// Spans recorded and not yet exported.
pub fn waiting(store: &AutopilotStore, state: &ExportState) -> u64 {
    outbox::len(store).saturating_sub(state.offset) / outbox::LINE
}
