//! The daemon's agent slots and the scheduler's score: `autopilot.daemon` in `rover.json` for a
//! daemon serving one checkout, `"daemon"` in the daemon file for one serving many (there, a
//! repository's own `rover.json` cannot raise its share: its `autopilot.daemon` is not read).
//!
//! ```json
//! {"maxRuns": 4, "maxRunsPerRepository": 2,
//!  "score": {"labels": {"critical": 300, "quick-win": 50, "chore": -100}, "perMinuteWaited": 2}}
//! ```

use std::collections::BTreeMap;

use serde::Deserialize;

use crate::budget::DaemonBudgetSettings;
use crate::orchestrator::{ScoreWeights, SlotSettings};

/// The most a weight may be, either way (a score is a sum of a few of them).
const MAX_WEIGHT: i64 = 1_000_000;

/// `autopilot.daemon` / the daemon file's `"daemon"`.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "camelCase")]
pub struct DaemonConfig {
    /// Agent runs at once across every repository (default: what the machine holds, a run per
    /// core and per 2 GiB of memory, at least 2).
    pub max_runs: Option<usize>,
    /// Agent runs at once for one repository (default: `maxRuns`).
    pub max_runs_per_repository: Option<usize>,
    pub score: ScoreConfig,
    /// The daemon-wide budget (the daemon file only: a daemon of one checkout has its
    /// `autopilot.budget`).
    pub budget: DaemonBudgetSettings,
}

/// The weights of the scheduler's score; each left out keeps its default.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "camelCase")]
pub struct ScoreConfig {
    pub per_unblocked_task: Option<i64>,
    /// Label → weight, over the defaults (`critical` 300, `quick-win` 50; 0 turns one off).
    pub labels: BTreeMap<String, i64>,
    pub per_minute_waited: Option<i64>,
    pub per_retry: Option<i64>,
    pub per_run_of_repository: Option<i64>,
}

impl DaemonConfig {
    /// The board's settings, or what is wrong (named by its key under `at`).
    pub fn slots(&self, at: &str) -> Result<SlotSettings, String> {
        let defaults = SlotSettings::default();
        let max_runs = self.max_runs.unwrap_or(defaults.max_runs);
        if max_runs == 0 {
            return Err(format!(
                "{at}.maxRuns is 0: no agent could ever run; give at least 1"
            ));
        }
        let per_repo = self.max_runs_per_repository.unwrap_or(max_runs);
        if per_repo == 0 {
            return Err(format!(
                "{at}.maxRunsPerRepository is 0: no agent could ever run; give at least 1"
            ));
        }
        let mut weights = ScoreWeights::default();
        let s = &self.score;
        for (value, into, key) in [
            (
                s.per_unblocked_task,
                &mut weights.per_unblocked_task,
                "perUnblockedTask",
            ),
            (
                s.per_minute_waited,
                &mut weights.per_minute_waited,
                "perMinuteWaited",
            ),
            (s.per_retry, &mut weights.per_retry, "perRetry"),
            (
                s.per_run_of_repository,
                &mut weights.per_run_of_repository,
                "perRunOfRepository",
            ),
        ] {
            if let Some(value) = value {
                *into = weight(value, &format!("{at}.score.{key}"))?;
            }
        }
        for (label, value) in &s.labels {
            if label.trim().is_empty() || label.chars().count() > 50 {
                return Err(format!(
                    "{at}.score.labels: {label:?} is not a label name (1 to 50 characters)"
                ));
            }
            let value = weight(*value, &format!("{at}.score.labels.{label}"))?;
            weights
                .labels
                .retain(|name, _| !name.eq_ignore_ascii_case(label));
            weights.labels.insert(label.clone(), value);
        }
        Ok(SlotSettings {
            max_runs,
            max_runs_per_repository: per_repo.min(max_runs),
            weights,
        })
    }
}

fn weight(value: i64, key: &str) -> Result<i64, String> {
    if value.abs() > MAX_WEIGHT {
        return Err(format!(
            "{key} is {value}: a weight is between -{MAX_WEIGHT} and {MAX_WEIGHT}"
        ));
    }
    Ok(value)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_and_overrides_make_the_boards_settings() {
        let d = DaemonConfig::default().slots("autopilot.daemon").unwrap();
        assert!(d.max_runs >= 2);
        assert_eq!(d.max_runs_per_repository, d.max_runs);
        assert_eq!(d.weights, ScoreWeights::default());
        let c: DaemonConfig = serde_json::from_str(
            r#"{"maxRuns": 3, "maxRunsPerRepository": 5,
                "score": {"labels": {"Critical": 1000, "chore": -100}, "perRetry": 10}}"#,
        )
        .unwrap();
        let s = c.slots("autopilot.daemon").unwrap();
        assert_eq!((s.max_runs, s.max_runs_per_repository), (3, 3));
        assert_eq!(s.weights.per_retry, 10);
        assert_eq!(s.weights.per_minute_waited, 2);
        assert_eq!(
            s.weights.labels,
            BTreeMap::from([
                ("Critical".to_owned(), 1000),
                ("chore".to_owned(), -100),
                ("quick-win".to_owned(), 50)
            ])
        );
    }

    #[test]
    fn a_setting_that_cannot_work_is_an_error_naming_its_key() {
        for (text, says) in [
            (r#"{"maxRuns": 0}"#, "daemon.maxRuns is 0"),
            (
                r#"{"maxRunsPerRepository": 0}"#,
                "daemon.maxRunsPerRepository is 0",
            ),
            (
                r#"{"score": {"perRetry": 5000000}}"#,
                "daemon.score.perRetry is 5000000",
            ),
            (r#"{"score": {"labels": {" ": 1}}}"#, "is not a label name"),
        ] {
            let c: DaemonConfig = serde_json::from_str(text).unwrap();
            let err = c.slots("daemon").unwrap_err();
            assert!(err.contains(says), "{text}: {err}");
        }
        assert!(serde_json::from_str::<DaemonConfig>(r#"{"maxRun": 2}"#).is_err());
    }

    #[test]
    fn the_daemon_budget_is_read_from_the_daemon_file_and_a_mistake_named() {
        use crate::budget::BudgetAction;
        use crate::config::{DaemonFile, DaemonFileError};
        let path = std::path::Path::new("/etc/rover/daemon.json");
        let file = DaemonFile::parse(
            path,
            r#"{"repositories": ["a/b", "a/c"], "daemon": {"budget": {
                "day": {"usd": 5, "tokens": 2000000, "action": "stop"},
                "month": {"usd": 80, "action": "pause"},
                "circuitBreaker": {"maxTrippedRepositories": 2}}}}"#,
        )
        .expect("valid");
        assert_eq!(file.budget.day.usd, Some(5.0));
        assert_eq!(file.budget.day.tokens, Some(2_000_000));
        assert_eq!(file.budget.month.action, BudgetAction::Pause);
        assert_eq!(file.budget.circuit_breaker.max_tripped_repositories, 2);
        let stops = file.budget.wire_stops();
        assert_eq!((stops.day_usd, stops.month_usd), (Some(5.0), None));
        // An unknown key: its line.
        let text = "{\"repositories\": [\"a/b\"],\n \"daemon\": {\"budget\":\n {\"day\": {\"usd\": 5, \"action\": \"stop\", \"token\": 1}}}}";
        match DaemonFile::parse(path, text) {
            Err(DaemonFileError::Invalid { line, reason, .. }) => {
                assert_eq!(line, 3);
                assert!(reason.contains("unknown field `token`"), "{reason}");
            }
            other => panic!("{other:?}"),
        }
        let shown = DaemonFile::parse(
            path,
            r#"{"repositories": ["a/b"], "daemon": {"budget": {"month": {"usd": -1}}}}"#,
        )
        .expect_err("refused")
        .to_string();
        assert!(shown.contains("daemon.budget.month.usd is -1"), "{shown}");
        // In a repository's rover.json there is no daemon-wide budget.
        let err = crate::config::RoverConfig::parse(
            r#"{"autopilot": {"daemon": {"budget": {"day": {"usd": 1}}}}}"#,
        )
        .expect_err("refused");
        assert!(err.contains("autopilot.daemon.budget"), "{err}");
    }
}
