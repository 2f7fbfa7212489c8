//! `SwarmSettings`: the `autopilot.sandbox.swarm` part of `rover.json`.

use serde::Deserialize;

/// How the swarm backend places sandboxes (`autopilot.sandbox.swarm`); every field has a default.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct SwarmSettings {
    /// Placement constraints every sandbox service gets, in Swarm's syntax
    /// (`node.labels.pool==agents`, `node.role==worker`); none: any node with room for the
    /// run's `cpus` and `memoryMb`.
    pub constraints: Vec<String>,
}

impl SwarmSettings {
    /// A constraint Swarm would refuse, in words; checked when `rover.json` is read.
    pub fn validate(&self) -> Result<(), String> {
        for c in &self.constraints {
            let ok = ["==", "!="].iter().any(|op| {
                c.split_once(op)
                    .is_some_and(|(k, v)| !k.trim().is_empty() && !v.trim().is_empty())
            });
            if !ok {
                return Err(format!(
                    "autopilot.sandbox.swarm.constraints: `{c}` is not a placement constraint; write `<attribute>==<value>` or `<attribute>!=<value>` (e.g. `node.labels.pool==agents`)"
                ));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn constraints_parse_and_are_checked() {
        let s: SwarmSettings =
            serde_json::from_str(r#"{"constraints":["node.labels.pool==agents"]}"#).expect("valid");
        assert!(s.validate().is_ok());
        let bad = SwarmSettings {
            constraints: vec!["node.labels.pool".into()],
        };
        let err = bad.validate().expect_err("no operator");
        assert!(err.contains("node.labels.pool"), "{err}");
        assert!(serde_json::from_str::<SwarmSettings>(r#"{"constrains":[]}"#).is_err());
    }
}
