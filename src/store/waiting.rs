//! `waiting.json`: why queued actions wait (a step's slots taken, the daemon's agent slots, a
//! budget, unmet dependencies), as the daemon's orchestrator last said. The orchestrator keeps
//! its reasons in memory and writes them here when they change, so that `status`, another
//! process, can say them. Written whole and atomically; a missing file is no reason.

use std::collections::BTreeMap;
use std::path::PathBuf;

use uuid::Uuid;

use super::error::Result;
use super::fsio::{read_json, write_json_atomic};
use super::AutopilotStore;

impl AutopilotStore {
    pub fn waiting_path(&self) -> PathBuf {
        self.autopilot_dir().join("waiting.json")
    }

    /// Records why each of these queued actions waits (replacing what was recorded).
    pub fn write_waiting(&self, waiting: &BTreeMap<Uuid, String>) -> Result<()> {
        write_json_atomic(&self.waiting_path(), waiting)
    }

    /// Why queued actions waited when the daemon last said; none without the file. A file
    /// that does not parse is an error naming it.
    pub fn read_waiting(&self) -> Result<BTreeMap<Uuid, String>> {
        Ok(read_json(&self.waiting_path())?.unwrap_or_default())
    }
}
