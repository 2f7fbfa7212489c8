//! The `notify` step (terminal): answers on the channel the root event came from. A small model
//! writes the message from the trace and the notify meta; when it fails a deterministic message
//! is used. The message is redacted for the channel's visibility; GitHub channels get it through
//! `github::deliver` (idempotent by the trace/action marker, so a retry after a crash finds its
//! earlier post); the local channel keeps it in the span.

use std::fmt::Write as _;
use std::sync::Arc;

use async_trait::async_trait;

use super::agent_call::{ask, event_meta, failure_meta, load_trace, render_trace, usage_meta};
use super::meta::{
    self, MessageSource, NotifyChannel, NotifyDelivery, NotifyMeta, NotifyPurpose, NotifySpanMeta,
};
use super::Services;
use crate::agents::{untrusted_block, AgentStep, NotifyResult, PromptVars};
use crate::github::{deliver, Channel, Outgoing, ReviewEvent, Visibility};
use crate::orchestrator::{Finished, Outcome, Step, StepContext, StepError};
use crate::store::{StepKind, StepRun};

/// Where the message goes: the root event's channel, except that review findings on a pull
/// request are posted as a PR review.
pub fn channel_for(purpose: NotifyPurpose, root: &Channel) -> Channel {
    match (purpose, root) {
        (
            NotifyPurpose::Review,
            Channel::PrComment { number }
            | Channel::PrReview { number }
            | Channel::ReviewThreadReply { number, .. },
        ) => Channel::PrReview { number: *number },
        _ => root.clone(),
    }
}

/// The channel in words, for the prompt and the span summary.
pub fn describe(channel: &Channel) -> String {
    match channel {
        Channel::IssueComment { number } => format!("a comment on issue #{number}"),
        Channel::PrComment { number } => format!("a comment on pull request #{number}"),
        Channel::PrReview { number } => format!("a review on pull request #{number}"),
        Channel::ReviewThreadReply { number, comment_id } => {
            format!("a reply in review thread {comment_id} of pull request #{number}")
        }
        Channel::CommitComment { sha } => {
            let short: String = sha.chars().take(12).collect();
            format!("a comment on commit {short}")
        }
        Channel::Local => "the local trace (the user reads it with `rover autopilot trace`)".into(),
    }
}

/// What the message must say, for the prompt.
pub fn intent(meta: &NotifyMeta) -> String {
    let mut out = match meta.purpose {
        NotifyPurpose::Answer => "Answer or acknowledge directly.".to_owned(),
        NotifyPurpose::Clarify => {
            "Ask the question below, so the people in the thread can answer it.".to_owned()
        }
        NotifyPurpose::Flag => {
            "Ask a maintainer to look at this before rover does anything.".to_owned()
        }
        NotifyPurpose::Pushed => {
            "Work was pushed: link the pull request and summarize the change.".to_owned()
        }
        NotifyPurpose::Review => "Post the review findings.".to_owned(),
        NotifyPurpose::Failure => {
            "Rover could not finish: say what went wrong and what would help.".to_owned()
        }
        NotifyPurpose::Budget => "A budget limit stopped the work: say so.".to_owned(),
        NotifyPurpose::Ready => {
            "CI passed on rover's pull request: say it is ready for review, with the link."
                .to_owned()
        }
        NotifyPurpose::Merged => {
            "rover merged its pull request after its checks passed: say so, with the link."
                .to_owned()
        }
    };
    let _ = write!(out, "\n\n- purpose: {}", meta.purpose.as_str());
    // The drafted message and the error are an agent's words and a step's error output: data.
    if let Some(message) = &meta.message {
        let _ = write!(
            out,
            "\n- drafted message:\n\n{}\n",
            untrusted_block("the drafted message", message)
        );
    }
    if let Some(step) = &meta.failed_step {
        let _ = write!(out, "\n- failed step: {step}");
    }
    if let Some(error) = &meta.error {
        let _ = write!(
            out,
            "\n- error:\n{}",
            untrusted_block("the failed step's error", error)
        );
    }
    if let Some(url) = &meta.pr_url {
        let _ = write!(out, "\n- pull request: {url}");
    }
    if let Some(note) = &meta.note {
        let _ = write!(
            out,
            "\n- rover adds this after your message, word for word (do not repeat it): {note}"
        );
    }
    out
}

/// The message when the agent cannot write one: built from the meta alone. On a public channel
/// a failure names the step but not its error output.
pub fn fallback_message(meta: &NotifyMeta, visibility: Visibility, trace_id: &str) -> String {
    let drafted = meta
        .message
        .as_deref()
        .map(str::trim)
        .filter(|m| !m.is_empty());
    match meta.purpose {
        NotifyPurpose::Answer | NotifyPurpose::Clarify | NotifyPurpose::Flag => drafted
            .map_or_else(
                || "Rover looked at this and has nothing to add.".to_owned(),
                str::to_owned,
            ),
        NotifyPurpose::Pushed => {
            let mut out = match &meta.pr_url {
                Some(url) => format!("I pushed the changes: {url}"),
                None => "I pushed the changes.".to_owned(),
            };
            if let Some(m) = drafted {
                let _ = write!(out, "\n\n{m}");
            }
            out
        }
        NotifyPurpose::Review => drafted.map_or_else(
            || "The review finished without findings to report.".to_owned(),
            str::to_owned,
        ),
        NotifyPurpose::Failure => {
            let step = meta.failed_step.as_deref().unwrap_or("a pipeline");
            let mut out = format!("I could not finish this: the {step} step failed.");
            match visibility {
                Visibility::Public => {
                    let _ = write!(
                        out,
                        " A maintainer can see the details in rover trace `{trace_id}`."
                    );
                }
                Visibility::Private => {
                    if let Some(error) = &meta.error {
                        let _ = write!(out, "\n\nError: {error}");
                    }
                }
            }
            out
        }
        NotifyPurpose::Ready => {
            let mut out = match &meta.pr_url {
                Some(url) => format!("CI passed: the pull request is ready for review: {url}"),
                None => "CI passed: the pull request is ready for review.".to_owned(),
            };
            if let Some(m) = drafted {
                let _ = write!(out, "\n\n{m}");
            }
            out
        }
        NotifyPurpose::Merged => {
            let mut out = match &meta.pr_url {
                Some(url) => format!("Merged: {url}"),
                None => "Merged.".to_owned(),
            };
            if let Some(m) = drafted {
                let _ = write!(out, "\n\n{m}");
            }
            out
        }
        NotifyPurpose::Budget => {
            let mut out = "I stopped because a budget limit was reached.".to_owned();
            if let Some(m) = drafted {
                let _ = write!(out, "\n\n{m}");
            }
            out
        }
    }
}

/// After a push the answer always links the pull request, whatever the model wrote.
pub fn with_pr_link(message: String, meta: &NotifyMeta) -> String {
    match &meta.pr_url {
        Some(url) if !message.contains(url.as_str()) => format!("{message}\n\nPull request: {url}"),
        _ => message,
    }
}

pub struct NotifyStep {
    services: Arc<Services>,
}

impl NotifyStep {
    /// The same answer on the pull request `notify.also_on_pull` names (the one rover merged),
    /// unless that is the trace's channel already: delivered once (its own marker).
    async fn post_also(
        &self,
        notify: &NotifyMeta,
        channel: &Channel,
        visibility: Visibility,
        message: &str,
        (trace, action): (&str, &str),
    ) -> Result<Option<NotifyDelivery>, StepError> {
        let Some(pull) = notify
            .also_on_pull
            .map(|number| Channel::IssueComment { number })
            .filter(|pull| pull != channel)
        else {
            return Ok(None);
        };
        let github = self.services.github.as_ref().ok_or_else(|| {
            StepError::fatal(format!(
                "cannot post to {}: rover has no GitHub client (set GITHUB_TOKEN)",
                describe(&pull)
            ))
        })?;
        let also_action = format!("{action}-also");
        let posted = deliver(
            github.as_ref(),
            &self.services.redactor,
            &Outgoing {
                channel: &pull,
                visibility,
                message,
                trace_id: trace,
                action_id: &also_action,
                review: None,
            },
        )
        .await
        .map_err(|e| {
            StepError::from_error(&e, e.is_retryable())
                .detail("channel", &pull)
                .detail("message", message)
        })?;
        Ok(Some(NotifyDelivery {
            url: posted.url,
            comment_id: posted.comment_id,
            already_posted: posted.already_posted,
        }))
    }

    pub fn new(services: Arc<Services>) -> NotifyStep {
        NotifyStep { services }
    }
}

#[async_trait]
impl Step for NotifyStep {
    fn kind(&self) -> StepKind {
        StepKind::Notify
    }

    fn max_parallel(&self) -> usize {
        5
    }

    async fn process(&self, ctx: &StepContext, run: &StepRun) -> Result<Outcome, StepError> {
        let notify: NotifyMeta = meta::read(&run.action).map_err(|e| {
            StepError::fatal(format!("the notify action's meta cannot be read: {e}"))
                .detail("actionId", run.action.id.to_string())
        })?;
        let trace_id = run.pending.trace_id;
        let view = load_trace(ctx, trace_id).await?;
        let root = event_meta(&view)?;
        let channel = channel_for(notify.purpose, &root.channel);
        let visibility = root.visibility;
        let redactor = &self.services.redactor;

        let mut vars = PromptVars::new();
        vars.insert("channel".into(), describe(&channel));
        vars.insert(
            "visibility".into(),
            match visibility {
                Visibility::Public => "public",
                Visibility::Private => "private",
            }
            .into(),
        );
        // Secrets never reach a prompt, whatever the channel.
        vars.insert(
            "intent".into(),
            redactor.redact(&intent(&notify), Visibility::Private),
        );
        vars.insert(
            "trace".into(),
            redactor.redact(&render_trace(&view), Visibility::Private),
        );
        let (draft, source, agent_meta) =
            match ask::<NotifyResult>(&self.services, ctx, run.span.id, AgentStep::Notify, vars)
                .await
            {
                Ok(answer) => (
                    answer.value.message.clone(),
                    MessageSource::Agent,
                    usage_meta(&answer),
                ),
                Err(e) => (
                    fallback_message(&notify, visibility, &trace_id.to_string()),
                    MessageSource::Fallback,
                    failure_meta(&e),
                ),
            };
        let mut message = with_pr_link(redactor.redact(&draft, visibility), &notify);
        if let Some(note) = &notify.note {
            message = format!("{message}\n\n{}", redactor.redact(note, visibility));
        }
        if let Some(note) = &notify.breaker_note {
            message = format!("{message}\n\nrover paused itself: {note}.");
        }
        let mut span_meta = NotifySpanMeta {
            purpose: notify.purpose,
            visibility,
            message: Some(message.clone()),
            message_source: Some(source),
            agent: Some(agent_meta),
            channel: None,
            delivery: None,
            also_delivered: None,
        };

        if channel == Channel::Local {
            span_meta.channel = Some(NotifyChannel::local());
            // rover's own fix trace is local, but its merged pull request is on GitHub: what
            // goes there is redacted as for a public channel (the local answer keeps more).
            if self.services.github.is_some() && notify.also_on_pull.is_some() {
                let ids = (trace_id.to_string(), run.action.id.to_string());
                let public = redactor.redact(&message, Visibility::Public);
                span_meta.also_delivered = self
                    .post_also(
                        &notify,
                        &channel,
                        Visibility::Public,
                        &public,
                        (&ids.0, &ids.1),
                    )
                    .await?;
            }
            return Ok(Outcome::Finished(
                Finished::completed(message).with_meta_record(&span_meta),
            ));
        }
        let github = self.services.github.as_ref().ok_or_else(|| {
            StepError::fatal(format!(
                "cannot post to {}: rover has no GitHub client (set GITHUB_TOKEN)",
                describe(&channel)
            ))
            .detail("message", &message)
        })?;
        let trace = trace_id.to_string();
        let action = run.action.id.to_string();
        let review = (notify.purpose == NotifyPurpose::Review).then_some(ReviewEvent::Comment);
        let delivery = deliver(
            github.as_ref(),
            redactor,
            &Outgoing {
                channel: &channel,
                visibility,
                message: &message,
                trace_id: &trace,
                action_id: &action,
                review,
            },
        )
        .await
        .map_err(|e| {
            StepError::from_error(&e, e.is_retryable())
                .detail("channel", &channel)
                .detail("message", &message)
        })?;
        span_meta.also_delivered = self
            .post_also(&notify, &channel, visibility, &message, (&trace, &action))
            .await?;
        let url = delivery.url.clone().unwrap_or_default();
        let summary = if delivery.already_posted {
            format!("found the earlier post as {}: {url}", describe(&channel))
        } else {
            format!("posted {}: {url}", describe(&channel))
        };
        span_meta.channel = Some(NotifyChannel::Github(channel));
        span_meta.delivery = Some(NotifyDelivery {
            url: delivery.url,
            comment_id: delivery.comment_id,
            already_posted: delivery.already_posted,
        });
        Ok(Outcome::Finished(
            Finished::completed(summary).with_meta_record(&span_meta),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::github::Redactor;

    #[test]
    fn the_pr_link_is_added_when_the_message_lacks_it() {
        let meta = NotifyMeta {
            pr_url: Some("https://github.com/o/r/pull/3".into()),
            breaker_note: None,
            circuit_breaker: false,
            ..NotifyMeta::default()
        };
        assert_eq!(
            with_pr_link("Done.".into(), &meta),
            "Done.\n\nPull request: https://github.com/o/r/pull/3"
        );
        let linked = "See https://github.com/o/r/pull/3.".to_owned();
        assert_eq!(with_pr_link(linked.clone(), &meta), linked);
        assert_eq!(
            with_pr_link("Done.".into(), &NotifyMeta::default()),
            "Done."
        );
    }

    #[test]
    fn review_findings_on_a_pull_request_become_a_review() {
        let pr = Channel::PrComment { number: 4 };
        assert_eq!(
            channel_for(NotifyPurpose::Review, &pr),
            Channel::PrReview { number: 4 }
        );
        assert_eq!(channel_for(NotifyPurpose::Answer, &pr), pr);
        let issue = Channel::IssueComment { number: 4 };
        assert_eq!(channel_for(NotifyPurpose::Review, &issue), issue);
        assert_eq!(
            channel_for(NotifyPurpose::Review, &Channel::Local),
            Channel::Local
        );
    }

    #[test]
    fn fallback_failure_message_hides_the_error_in_public() {
        let meta = NotifyMeta::failure(
            &StepKind::Commit,
            "gpg: skipped \"dev@example.com\": No secret key (/home/dev/.gnupg)",
        );
        let public = fallback_message(&meta, Visibility::Public, "t-1");
        assert_eq!(
            public,
            "I could not finish this: the commit step failed. A maintainer can see the details in rover trace `t-1`."
        );
        let private = fallback_message(&meta, Visibility::Private, "t-1");
        assert!(private.contains("No secret key"), "{private}");
        // Whatever the message, delivery redacts it for the channel.
        let redacted = Redactor::new(Vec::<String>::new()).redact(&private, Visibility::Public);
        assert!(!redacted.contains("/home/dev"), "{redacted}");
    }

    #[test]
    fn fallback_messages_follow_the_purpose() {
        let pushed = NotifyMeta {
            purpose: NotifyPurpose::Pushed,
            pr_url: Some("https://github.com/o/r/pull/3".into()),
            breaker_note: None,
            circuit_breaker: false,
            message: Some("Adds retries.".into()),
            ..NotifyMeta::default()
        };
        assert_eq!(
            fallback_message(&pushed, Visibility::Public, "t"),
            "I pushed the changes: https://github.com/o/r/pull/3\n\nAdds retries."
        );
        let ask = NotifyMeta {
            purpose: NotifyPurpose::Clarify,
            message: Some("7 or 30 days?".into()),
            ..NotifyMeta::default()
        };
        assert_eq!(
            fallback_message(&ask, Visibility::Public, "t"),
            "7 or 30 days?"
        );
        let intent = intent(&pushed);
        assert!(intent.contains("- purpose: pushed"), "{intent}");
        assert!(intent.contains("https://github.com/o/r/pull/3"), "{intent}");
    }
}
