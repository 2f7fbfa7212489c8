//! The agents part of `rover.json`: which CLI, which model per step, limits, extra env names.

use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;

use super::cli::AgentKind;
use super::pricing::CodexPrices;
use super::types::{AgentRequest, AgentStep};

/// Model overrides per step; unset steps use [`AgentSettings::model_for`]'s defaults.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "camelCase")]
pub struct StepModels {
    /// Coordinator.
    pub coordinate: Option<String>,
    /// Planner.
    pub plan: Option<String>,
    /// Commit message writer.
    pub commit: Option<String>,
    /// Resolver.
    pub resolve: Option<String>,
    /// Pusher.
    pub push: Option<String>,
    /// Notifier.
    pub notify: Option<String>,
    /// Noop summary.
    pub summarize: Option<String>,
    /// Sandboxed workflow agent.
    pub workflow: Option<String>,
    /// The self-review before a push (sandboxed, read-only tools).
    pub review: Option<String>,
}

impl StepModels {
    fn get(&self, step: AgentStep) -> Option<&String> {
        match step {
            AgentStep::Coordinate => self.coordinate.as_ref(),
            AgentStep::Plan => self.plan.as_ref(),
            AgentStep::Commit => self.commit.as_ref(),
            AgentStep::Resolve => self.resolve.as_ref(),
            AgentStep::Push => self.push.as_ref(),
            AgentStep::Notify => self.notify.as_ref(),
            AgentStep::Summarize => self.summarize.as_ref(),
            AgentStep::Workflow => self.workflow.as_ref(),
            AgentStep::Review => self.review.as_ref(),
        }
    }
}

/// Resolved agent settings (`rover.json` key `autopilot.agent`).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "camelCase")]
pub struct AgentSettings {
    /// Which CLI runs every step.
    pub agent: AgentKind,
    /// Model per step.
    pub models: StepModels,
    /// Absolute limit per call for the host-side steps, in seconds.
    pub timeout_secs: u64,
    /// Absolute limit for the workflow agent in its sandbox, in seconds.
    pub workflow_timeout_secs: u64,
    /// Silence limit per call, in seconds.
    pub inactivity_timeout_secs: u64,
    /// Seconds between SIGTERM and SIGKILL when stopping an agent.
    pub kill_grace_secs: u64,
    /// Turn limit for host-side steps (claude only).
    pub max_turns: u32,
    /// Turn limit for the workflow agent (claude only).
    pub workflow_max_turns: u32,
    /// Extra environment variable names passed to the agent (GitHub tokens are never passed).
    pub extra_env: Vec<String>,
    /// USD per million tokens by codex model, to price codex calls (codex reports tokens only).
    pub codex_prices: CodexPrices,
}

impl Default for AgentSettings {
    fn default() -> Self {
        Self {
            agent: AgentKind::Claude,
            models: StepModels::default(),
            timeout_secs: 15 * 60,
            workflow_timeout_secs: 60 * 60,
            inactivity_timeout_secs: 10 * 60,
            kill_grace_secs: 5,
            max_turns: 30,
            workflow_max_turns: 200,
            extra_env: Vec::new(),
            codex_prices: CodexPrices::default(),
        }
    }
}

impl AgentSettings {
    /// The model for a step: the configured one, else a small model for notify and summarize,
    /// a strong one for plan and resolve, the middle one elsewhere. Codex has no aliases, so
    /// without configuration it uses its own default model.
    pub fn model_for(&self, step: AgentStep) -> Option<String> {
        if let Some(model) = self.models.get(step) {
            return Some(model.clone());
        }
        self.agent.cli().default_model(step).map(str::to_owned)
    }

    /// Time between SIGTERM and SIGKILL.
    pub fn kill_grace(&self) -> Duration {
        Duration::from_secs(self.kill_grace_secs)
    }

    /// A request for `step` with its tools, model and limits filled in.
    pub fn request(
        &self,
        step: AgentStep,
        workdir: impl Into<PathBuf>,
        system_prompt: String,
        prompt: String,
    ) -> AgentRequest {
        let workflow = step == AgentStep::Workflow;
        let mut request = AgentRequest::new(workdir, prompt);
        request.system_prompt = system_prompt;
        request.tools = step.tools();
        request.model = self.model_for(step);
        request.max_turns = Some(if workflow {
            self.workflow_max_turns
        } else {
            self.max_turns
        });
        request.timeout = Duration::from_secs(if workflow {
            self.workflow_timeout_secs
        } else {
            self.timeout_secs
        });
        request.inactivity_timeout = Duration::from_secs(self.inactivity_timeout_secs);
        request
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_route_small_and_strong_models() {
        let settings = AgentSettings::default();
        assert_eq!(settings.agent, AgentKind::Claude);
        assert_eq!(
            settings.model_for(AgentStep::Summarize).as_deref(),
            Some("haiku")
        );
        assert_eq!(
            settings.model_for(AgentStep::Notify).as_deref(),
            Some("haiku")
        );
        assert_eq!(settings.model_for(AgentStep::Plan).as_deref(), Some("opus"));
        assert_eq!(
            settings.model_for(AgentStep::Resolve).as_deref(),
            Some("opus")
        );
        assert_eq!(
            settings.model_for(AgentStep::Commit).as_deref(),
            Some("sonnet")
        );
    }

    #[test]
    fn parses_camel_case_and_rejects_unknown_keys() {
        let settings: AgentSettings = serde_json::from_str(
            r#"{"agent":"codex","models":{"plan":"gpt-5"},"extraEnv":["FOO"],"timeoutSecs":60,
                "codexPrices":{"gpt-5":{"inputPerMTok":2,"outputPerMTok":20}}}"#,
        )
        .expect("valid settings");
        assert_eq!(settings.agent, AgentKind::Codex);
        assert_eq!(
            settings.model_for(AgentStep::Plan).as_deref(),
            Some("gpt-5")
        );
        assert_eq!(settings.model_for(AgentStep::Notify), None);
        assert_eq!(settings.extra_env, vec!["FOO".to_owned()]);
        assert!((settings.codex_prices.price(Some("gpt-5")).output_per_m_tok - 20.0).abs() < 1e-9);
        let err = serde_json::from_str::<AgentSettings>(
            r#"{"codexPrices":{"gpt-5":{"inputPerMTok":2,"outputPerMTok":20,"extra":1}}}"#,
        )
        .expect_err("unknown price key");
        assert!(err.to_string().contains("extra"), "{err}");
        let request = settings.request(AgentStep::Plan, "/tmp", String::new(), "p".into());
        assert_eq!(request.timeout, Duration::from_secs(60));
        assert_eq!(request.tools, super::super::ToolPolicy::None);
        let err = serde_json::from_str::<AgentSettings>(r#"{"agnet":"claude"}"#)
            .expect_err("unknown key");
        assert!(err.to_string().contains("agnet"), "{err}");
    }
}
