//! What a run's span records of its network, as readers (`trace`, telemetry) take it: the
//! egress the run was given (`launched.egress`, flattened into the workflow span) and what the
//! proxy saw of it (`collected.network`).

use serde::{Deserialize, Serialize};

use super::WireLedger;
use crate::store::Meta;

/// A run's network as its span recorded it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RunNetworkMeta {
    /// `autopilot.sandbox.egress` as written when the run started.
    #[serde(default, deserialize_with = "lenient")]
    pub egress: Option<String>,
    /// What rover's proxy saw of the run, once collected.
    #[serde(default, deserialize_with = "lenient")]
    pub network: Option<WireLedger>,
}

impl RunNetworkMeta {
    /// What `meta` says (nothing, for keys that are absent or do not read as their record).
    pub fn of(meta: &Meta) -> RunNetworkMeta {
        crate::store::from_meta(meta).unwrap_or_default()
    }
}

/// A value that does not read as its record reads as none (an older or foreign writer's).
fn lenient<'de, D, T>(d: D) -> Result<Option<T>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: serde::de::DeserializeOwned,
{
    let value = serde_json::Value::deserialize(d)?;
    Ok(serde_json::from_value(value).ok())
}
