//! What the coordinator gathers before asking the agent: trust, the GitHub context, rover's
//! pull request, and the event as the prompt shows it.

use chrono::{DateTime, Utc};
use serde::Serialize;

use super::rover_pr::RoverPr;
use super::{CoordinateStep, Gathered};
use crate::agents::untrusted_block;
use crate::github::{build_context, EventAction, EventKind, NormalizedEvent, Visibility};
use crate::orchestrator::{Finished, NextAction, StepError};
use crate::steps::agent_call::MappedTask;
use crate::steps::meta::{
    subject_key, CoordinateSpanMeta, DecidedBy, Decision, EventMeta, NoopMeta,
};
use crate::steps::trust_check::trust_unknown;
use crate::store::StepKind;

impl CoordinateStep {
    /// Trust, context and rover-PR detection for a GitHub event; `Err(finished)` when the
    /// author is not trusted (the run ends there, without AI).
    pub(super) async fn gather_github(
        &self,
        meta: &EventMeta,
        event: &NormalizedEvent,
        mappings: &[MappedTask],
        attempt: u32,
    ) -> Result<Result<Gathered, Finished>, StepError> {
        let github = self.services.github.as_ref().ok_or_else(|| {
            StepError::fatal(
                "this trace is a GitHub event but rover has no GitHub client: set GITHUB_TOKEN and the repository",
            )
        })?;
        let trust = match self.trust.decide(github.as_ref(), &event.actor).await {
            Ok(trust) => trust,
            Err(e) => {
                return trust_unknown(&self.services, &event.actor, &e, attempt).map(Err);
            }
        };
        if !trust.trusted {
            let reason = format!("untrusted author: {}", trust.reason);
            return Ok(Err(Finished::completed(format!("decided noop: {reason}"))
                .with_meta_record(&CoordinateSpanMeta {
                    trust: Some(Some(trust)),
                    ..CoordinateSpanMeta::decided(Decision::Noop, DecidedBy::Trust)
                })
                .then(NextAction::new(StepKind::Noop, reason).with_meta(
                    &NoopMeta {
                        untrusted: true,
                        ..NoopMeta::default()
                    },
                ))));
        }
        let settings = &self.services.config.autopilot.github;
        // Picked up: a trusted author's issue, comment or review is acknowledged at once.
        if let Some(content) = settings.reactions.acknowledge.as_deref() {
            super::command::acknowledge(github.as_ref(), event, content).await;
        }
        let context = build_context(
            github.as_ref(),
            event,
            &settings.context,
            settings.bot_login.as_deref(),
        )
        .await
        .map_err(|e| {
            StepError::from_error(&e, e.is_retryable())
                .detail("eventId", &event.id)
                .detail("what", "fetching the event's context from GitHub")
        })?;
        let pull = context.subject.as_ref().and_then(|s| s.pull.as_ref());
        let head = event
            .head_branch
            .clone()
            .or_else(|| pull.map(|p| p.head_branch.clone()));
        let merged = event.merged == Some(true) || pull.is_some_and(|p| p.merged);
        Ok(Ok(Gathered {
            // Branch and label names come from GitHub users (the one-line label quotes a ref):
            // data, not instructions.
            event: untrusted_block(
                "github event",
                &format!("{}\n\n{}", meta.label, event_json(event)),
            ),
            context: untrusted_block(&format!("github {}", event.repo), &context.render()),
            subject: subject_key(event),
            rover_pr: RoverPr::find(head.as_deref(), mappings),
            merged,
            open_waits: Vec::new(),
            trust: Some(trust),
            wait_round: 0,
            head_sha: pull
                .map(|p| p.head_sha.clone())
                .or_else(|| event.commit_sha.clone())
                .filter(|s| !s.is_empty()),
        }))
    }
}

/// The event as the coordinator's prompt shows it: every field but the body, which is in the
/// context (as untrusted data), so the event itself stays small. The keys come in the order
/// the prompt always showed them (alphabetical).
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct PromptEvent<'a> {
    action: &'a Option<EventAction>,
    actor: &'a str,
    base_branch: &'a Option<String>,
    before_sha: &'a Option<String>,
    channel: &'a crate::github::Channel,
    comment_id: &'a Option<u64>,
    commit_sha: &'a Option<String>,
    created_at: &'a Option<DateTime<Utc>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    dedupe_key: &'a Option<String>,
    git_ref: &'a Option<String>,
    head_branch: &'a Option<String>,
    html_url: &'a Option<String>,
    id: &'a str,
    is_pull_request: bool,
    kind: EventKind,
    label: &'a Option<String>,
    merged: &'a Option<bool>,
    number: &'a Option<u64>,
    repo: &'a str,
    review_comment_id: &'a Option<u64>,
    review_id: &'a Option<u64>,
    visibility: Visibility,
}

impl<'a> PromptEvent<'a> {
    pub(super) fn of(event: &'a NormalizedEvent) -> PromptEvent<'a> {
        // No `..`: a new event field must be placed here (or left out on purpose, as the body).
        let NormalizedEvent {
            id,
            kind,
            action,
            actor,
            repo,
            number,
            is_pull_request,
            comment_id,
            review_id,
            review_comment_id,
            commit_sha,
            git_ref,
            before_sha,
            head_branch,
            base_branch,
            merged,
            label,
            // In the context already (the labels, fetched for the prompt).
            labels: _,
            body: _,
            // Left out of the prompt as it was: read by rover's memory only (a person's review
            // that asked for changes, and the approval that confirms it).
            review_state: _,
            html_url,
            created_at,
            channel,
            visibility,
            dedupe_key,
        } = event;
        PromptEvent {
            action,
            actor,
            base_branch,
            before_sha,
            channel,
            comment_id,
            commit_sha,
            created_at,
            dedupe_key,
            git_ref,
            head_branch,
            html_url,
            id,
            is_pull_request: *is_pull_request,
            kind: *kind,
            label,
            merged,
            number,
            repo,
            review_comment_id,
            review_id,
            visibility: *visibility,
        }
    }
}

pub(super) fn event_json(event: &NormalizedEvent) -> String {
    serde_json::to_string_pretty(&PromptEvent::of(event)).unwrap_or_default()
}
