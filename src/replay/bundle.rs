//! A trace as replay reads it: its spans and actions with the replay record of each span's run
//! ([`crate::store::replay_record`]), taken from a store or from one exported file. The export
//! file (`<trace id>.json`, written by `rover autopilot replay --export <folder>`) is what a
//! maintainer commits to a folder and replays in CI with `--dir`.

use std::collections::BTreeMap;
use std::path::Path;

use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::store::replay_record::{read_record, ReplayRecord};
use crate::store::{Action, AutopilotStore, Span, StoreError};

/// The `format` of an export file.
pub const BUNDLE_FORMAT: &str = "rover-trace";
/// The export file's version.
pub const BUNDLE_VERSION: u32 = 1;

/// One trace with what replay needs.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TraceBundle {
    pub format: String,
    pub version: u32,
    pub trace_id: Uuid,
    /// `owner/name` the trace's GitHub reads were about, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub repo: Option<String>,
    /// In creation order.
    pub spans: Vec<Span>,
    pub actions: Vec<Action>,
    /// The replay record of each span run that has one, by span id.
    #[serde(default)]
    pub records: BTreeMap<Uuid, ReplayRecord>,
}

/// Why a bundle could not be read.
#[derive(Debug, thiserror::Error)]
pub enum BundleError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("cannot read {}: {source}", .path.display())]
    Io {
        path: std::path::PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{} is not a rover trace export: {reason}", .path.display())]
    Invalid {
        path: std::path::PathBuf,
        reason: String,
    },
}

impl crate::error::Kinded for BundleError {
    fn kind(&self) -> crate::error::ErrorKind {
        use crate::error::ErrorKind;
        match self {
            BundleError::Store(e) => e.kind(),
            BundleError::Io { source, .. } if source.kind() == std::io::ErrorKind::NotFound => {
                ErrorKind::NotFound
            }
            BundleError::Io { .. } => ErrorKind::Internal,
            BundleError::Invalid { .. } => ErrorKind::Corrupt,
        }
    }
}

impl TraceBundle {
    /// The trace `trace_id` from `store`, with the records of its spans.
    pub fn from_store(
        store: &AutopilotStore,
        trace_id: Uuid,
        repo: Option<String>,
    ) -> Result<TraceBundle, BundleError> {
        let view = store.load_trace(trace_id)?;
        let mut records = BTreeMap::new();
        for span in &view.spans {
            if let Some(record) = read_record(store, span.id)? {
                records.insert(span.id, record);
            }
        }
        Ok(TraceBundle {
            format: BUNDLE_FORMAT.to_owned(),
            version: BUNDLE_VERSION,
            trace_id,
            repo,
            spans: view.spans,
            actions: view.actions,
            records,
        })
    }

    /// An export file.
    pub fn read(path: &Path) -> Result<TraceBundle, BundleError> {
        let text = std::fs::read_to_string(path).map_err(|source| BundleError::Io {
            path: path.to_owned(),
            source,
        })?;
        let invalid = |reason: String| BundleError::Invalid {
            path: path.to_owned(),
            reason,
        };
        let value: serde_json::Value =
            serde_json::from_str(&text).map_err(|e| invalid(e.to_string()))?;
        let format = value.get("format").and_then(serde_json::Value::as_str);
        if format != Some(BUNDLE_FORMAT) {
            return Err(invalid(format!(
                "its `format` is {format:?}, not \"{BUNDLE_FORMAT}\" (make one with `rover autopilot replay --export`)"
            )));
        }
        let version = value.get("version").and_then(serde_json::Value::as_u64);
        if version != Some(u64::from(BUNDLE_VERSION)) {
            return Err(invalid(format!(
                "its `version` is {version:?}; this rover reads version {BUNDLE_VERSION}"
            )));
        }
        serde_json::from_value(value).map_err(|e| invalid(e.to_string()))
    }

    /// Write the export file `<dir>/<trace id>.json` (atomically); its path.
    pub fn write_to(&self, dir: &Path) -> Result<std::path::PathBuf, BundleError> {
        crate::store::fsio::ensure_dir(dir)?;
        let path = dir.join(format!("{}.json", self.trace_id));
        crate::store::fsio::write_json_atomic(&path, self)?;
        Ok(path)
    }

    /// The actions a span produced, in creation order.
    pub fn actions_of(&self, span_id: Uuid) -> impl Iterator<Item = &Action> {
        self.actions.iter().filter(move |a| a.span_id == span_id)
    }

    /// A short label of the trace's event (its root span's).
    pub fn label(&self) -> String {
        self.spans
            .iter()
            .find(|s| s.id == self.trace_id)
            .or_else(|| self.spans.iter().find(|s| s.parent_id.is_none()))
            .map_or_else(|| "(no root span)".to_owned(), crate::store::event_label)
    }
}
