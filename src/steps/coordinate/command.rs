//! `/rover` commands on the thread: a comment (or review) whose first line starts with `/rover`
//! is a command for rover, never work for the coordinating agent. The `coordinate` step hands it
//! here by rule, after the same trust check as any event:
//!
//! - `/rover stop`: cancel the trace working on this issue or pull request (as `rover autopilot
//!   cancel`: its queued work is dropped, its running agents and containers are stopped, and it
//!   answers that it was cancelled);
//! - `/rover retry`: queue that trace's last failed action again (as `rover autopilot retry`);
//! - `/rover status`: answer with the trace's state, its spend and `rover autopilot trace <id>`;
//! - `/rover merge`: approve the merge rover waits to make of its pull request, at its current
//!   head (`autopilot.lifecycle`: in `prod`, or for a change to what steers rover): an
//!   `approve` span in the waiting trace, and the merge looks at once;
//! - `/rover help`: answer with the commands.
//!
//! The trace "working on" an issue or pull request is the newest trace whose event is about it
//! (its number), or whose push opened it. A command rover takes is acknowledged with a reaction.
//! An unknown command, or any command from an untrusted author, gets a short answer saying
//! why, at most one per author every `commands.refusalIntervalSecs` (the others are recorded
//! only). rover's own comments are never commands: they are skipped at intake (its login and
//! its marker). Every command is listed by `rover autopilot events` with its outcome.

use std::fmt::Write as _;

use chrono::{TimeDelta, Utc};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::github::{
    deliver, Channel, EventAction, EventKind, NormalizedEvent, Outgoing, ReactionTarget,
    TrustDecision,
};
use crate::orchestrator::{Finished, NextAction, Outcome, StepContext, StepError};
use crate::steps::agent_call::event_meta;
use crate::steps::history::{intervention_marked, pushed_pull_request, refusal_answered_since};
use crate::steps::meta::{
    CommandOutcome, CommandRecord, CoordinateSpanMeta, DecidedBy, Decision, EventMeta,
    Intervention, InterventionSpanMeta, MergeMeta, NoopMeta,
};
use crate::steps::Services;
use crate::store::{
    blocking, AutopilotStore, IntakeOutcome, IntakeRecord, Span, StepKind, StepRun, StoreError,
    TraceView,
};

/// What every command starts with.
pub const PREFIX: &str = "/rover";
/// How many recent traces are searched for the one a command is about.
const LOOKBACK: usize = 100;

/// A command on the thread.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum ThreadCommand {
    Stop,
    Retry,
    Status,
    Merge,
    Help,
    /// `/rover` followed by something rover does not know (kept, cut to 40 characters).
    Unknown(String),
}

impl ThreadCommand {
    pub fn as_str(&self) -> &str {
        match self {
            Self::Stop => "stop",
            Self::Retry => "retry",
            Self::Status => "status",
            Self::Merge => "merge",
            Self::Help => "help",
            Self::Unknown(word) => word,
        }
    }
}

/// The command in a comment's text: its first non-blank line is `/rover` followed by the
/// command word (or nothing, which asks for help). `None` when the text is not a command.
pub fn parse(body: &str) -> Option<ThreadCommand> {
    let line = body.lines().find(|l| !l.trim().is_empty())?.trim();
    let rest = line.strip_prefix(PREFIX)?;
    if !(rest.is_empty() || rest.starts_with(char::is_whitespace)) {
        return None;
    }
    let word: String = rest
        .split_whitespace()
        .next()
        .unwrap_or("help")
        .to_ascii_lowercase();
    Some(match word.as_str() {
        "stop" | "cancel" => ThreadCommand::Stop,
        "retry" => ThreadCommand::Retry,
        "status" => ThreadCommand::Status,
        "merge" => ThreadCommand::Merge,
        "help" => ThreadCommand::Help,
        // Echoed in the answer: only plain characters, so it can mention or format nothing.
        other => ThreadCommand::Unknown(
            other
                .chars()
                .take(40)
                .map(|c| {
                    if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                        c
                    } else {
                        '?'
                    }
                })
                .collect(),
        ),
    })
}

/// The command an event carries: a new comment, review comment or review whose text is one.
pub fn of_event(event: &NormalizedEvent) -> Option<ThreadCommand> {
    let kinds = matches!(
        event.kind,
        EventKind::IssueComment
            | EventKind::PullRequestReviewComment
            | EventKind::PullRequestReview
    );
    let new = matches!(
        event.action,
        Some(EventAction::Created | EventAction::Submitted)
    );
    if !(kinds && new && event.number.is_some()) {
        return None;
    }
    parse(event.body.as_deref()?)
}

/// The event and command of a trace's root, when it is a GitHub command and commands are on.
pub(super) fn of_meta<'a>(
    meta: &'a EventMeta,
    services: &Services,
) -> Option<(&'a NormalizedEvent, ThreadCommand)> {
    if meta.source != crate::steps::meta::EventSource::Github
        || !services.config.autopilot.github.commands.enabled
    {
        return None;
    }
    let event = meta.event.as_ref()?;
    Some((event, of_event(event)?))
}

/// React with `content` on what `event` is about (its comment, review comment, issue or pull
/// request): rover has picked it up. Best effort: a failure is logged, never fatal.
pub(super) async fn acknowledge(
    github: &dyn crate::github::GitHub,
    event: &NormalizedEvent,
    content: &str,
) -> bool {
    let Some(target) = ReactionTarget::of_event(event) else {
        return false;
    };
    match github.react(target, content).await {
        Ok(()) => true,
        Err(e) => {
            tracing::warn!(error = %e, target = %target.describe(), "cannot react to acknowledge the event");
            false
        }
    }
}

/// Where a command's answer goes: the thread it came from (a review's conversation, not a new
/// review).
fn answer_channel(root: &EventMeta) -> Channel {
    match &root.channel {
        Channel::PrReview { number } => Channel::PrComment { number: *number },
        other => other.clone(),
    }
}

/// The newest traces about issue or pull request `number` (its event's number, or a push that
/// opened it), commands excepted, newest first.
fn traces_about(
    store: &AutopilotStore,
    own: Uuid,
    number: u64,
) -> Result<Vec<TraceView>, StoreError> {
    let mut found = Vec::new();
    for entry in store.recent_traces(LOOKBACK)? {
        if entry.trace_id == own {
            continue;
        }
        let Ok(view) = store.load_trace(entry.trace_id) else {
            continue;
        };
        let event = event_meta(&view).ok().and_then(|m| m.event);
        let about = event
            .as_ref()
            .is_some_and(|e| e.number == Some(number) && of_event(e).is_none());
        let opened = pushed_pull_request(&view, number);
        if about || opened {
            found.push(view);
        }
    }
    Ok(found)
}

/// Whether `login` had a refusal answered within `interval` (the rate limit).
fn refusal_answered_recently(
    store: &AutopilotStore,
    own: Uuid,
    login: &str,
    interval: TimeDelta,
) -> Result<bool, StoreError> {
    let since = Utc::now() - interval;
    for entry in store.recent_traces(LOOKBACK)? {
        if entry.trace_id == own {
            continue;
        }
        let Ok(view) = store.load_trace(entry.trace_id) else {
            continue;
        };
        let by = event_meta(&view)
            .ok()
            .and_then(|m| m.event)
            .is_some_and(|e| e.actor.eq_ignore_ascii_case(login));
        if !by {
            continue;
        }
        if refusal_answered_since(&view, since) {
            return Ok(true);
        }
    }
    Ok(false)
}

/// The commands, for `/rover help` and refusals.
pub fn help_text() -> String {
    [
        "Commands (people with write access to this repository; start a comment with one):",
        "- `/rover stop`: stop the work rover is doing on this issue or pull request",
        "- `/rover retry`: run the last failed step of that work again",
        "- `/rover status`: what that work is doing and what it has spent",
        "- `/rover merge`: approve the merge rover waits to make of its pull request, at its current head",
        "- `/rover help`: this list",
    ]
    .join("\n")
}

/// The state of a trace for `/rover status`.
fn status_text(view: &TraceView) -> String {
    let id = crate::trace::short(view.trace_id());
    let outcome = crate::steps::kinds::trace_outcome(view);
    let doing: Vec<String> = view
        .pending
        .iter()
        .map(|p| {
            if p.running_span_id.is_some() {
                format!("{} (running)", p.action)
            } else {
                format!("{} (queued)", p.action)
            }
        })
        .collect();
    let usage = crate::budget::trace_usage(view);
    let mut text = format!("Trace `{id}` ({}): {}", view.index.event, outcome.label());
    if !doing.is_empty() {
        let _ = write!(text, ", now {}", doing.join(", "));
    }
    let _ = write!(
        text,
        ". Spent {} over {} agent call(s), {} tokens. Details: `rover autopilot trace {id}` where rover runs.",
        crate::budget::usd(usage.cost_usd),
        usage.calls,
        usage.tokens()
    );
    text
}

/// Take `command` from the event of this `coordinate` run, decided by `trust`.
pub(super) async fn take(
    services: &Services,
    ctx: &StepContext,
    run: &StepRun,
    root: &EventMeta,
    event: &NormalizedEvent,
    command: &ThreadCommand,
    trust: TrustDecision,
) -> Result<Outcome, StepError> {
    let trace_id = run.pending.trace_id;
    let number = event.number.unwrap_or_default();
    let actor = event.actor.clone();
    let settings = &services.config.autopilot.github;
    let store_error = |what: &'static str| {
        move |e: StoreError| StepError::from_error(&e, true).detail("what", what)
    };
    let github = services
        .github
        .as_ref()
        .ok_or_else(|| StepError::fatal("a command from GitHub but rover has no GitHub client"))?;
    // Acknowledged before anything else: the person sees at once that rover took it.
    let mut acknowledged = false;
    if let (true, Some(content)) = (trust.trusted, settings.reactions.acknowledge.as_deref()) {
        acknowledged = acknowledge(github.as_ref(), event, content).await;
    }
    let (outcome, detail, target, answer): (CommandOutcome, String, Option<Uuid>, Option<String>) =
        if trust.trusted {
            trusted_command(github.as_ref(), ctx, trace_id, number, &actor, command).await?
        } else {
            let why = format!("untrusted author: {}", trust.reason);
            let text = format!(
                "@{actor} rover takes commands only from people with write access to this repository; nothing was done."
            );
            (CommandOutcome::Refused, why, None, Some(text))
        };
    // A refusal is answered once per author per interval: never a loop, never a flood.
    let mut answer = answer;
    if outcome == CommandOutcome::Refused {
        let interval = TimeDelta::seconds(
            i64::try_from(settings.commands.refusal_interval_secs).unwrap_or(i64::MAX / 1000),
        );
        let login = actor.clone();
        let recent = blocking(ctx.store.clone(), move |s| {
            refusal_answered_recently(s, trace_id, &login, interval)
        })
        .await
        .map_err(store_error("reading the refusals answered"))?;
        if recent {
            answer = None;
        }
    }
    let mut answered = false;
    if let Some(message) = &answer {
        let channel = answer_channel(root);
        deliver(
            github.as_ref(),
            &services.redactor,
            &Outgoing {
                channel: &channel,
                visibility: root.visibility,
                message,
                trace_id: &trace_id.to_string(),
                action_id: &run.action.id.to_string(),
                review: None,
            },
        )
        .await
        .map_err(|e| {
            StepError::from_error(&e, e.is_retryable()).detail("what", "answering the command")
        })?;
        answered = true;
    }
    let record = CommandRecord {
        command: command.as_str().to_owned(),
        outcome,
        detail: detail.clone(),
        target,
        answered,
        acknowledged,
    };
    let mut intake =
        IntakeRecord::new("thread", IntakeOutcome::Command, Utc::now()).reason(format!(
            "{PREFIX} {} by {actor}: {} ({detail})",
            record.command,
            outcome.as_str()
        ));
    intake.event_id = Some(event.id.clone());
    intake.kind = Some(event.kind.as_str().to_owned());
    intake.number = event.number;
    intake.actor = Some(actor.clone());
    intake.trace_id = target.or(Some(trace_id));
    blocking(ctx.store.clone(), move |s| s.append_intake(&[intake]))
        .await
        .map_err(store_error("recording the command"))?;
    let summary = format!(
        "{PREFIX} {} by {actor}: {} ({detail})",
        record.command,
        outcome.as_str()
    );
    Ok(Outcome::Finished(
        Finished::completed(format!("decided command: {summary}"))
            .with_meta_record(&CoordinateSpanMeta {
                trust: Some(Some(trust)),
                command: Some(record),
                ..CoordinateSpanMeta::decided(Decision::Command, DecidedBy::Command)
            })
            .then(
                NextAction::new(StepKind::Noop, summary).with_meta(&NoopMeta {
                    command: true,
                    ..NoopMeta::default()
                }),
            ),
    ))
}

/// What a trusted person's `command` does (see the module docs).
async fn trusted_command(
    github: &dyn crate::github::GitHub,
    ctx: &StepContext,
    trace_id: Uuid,
    number: u64,
    actor: &str,
    command: &ThreadCommand,
) -> Result<Acted, StepError> {
    let store_error = |what: &'static str| {
        move |e: StoreError| StepError::from_error(&e, true).detail("what", what)
    };
    Ok(match command {
        ThreadCommand::Unknown(word) => (
            CommandOutcome::Refused,
            format!("unknown command `{PREFIX} {word}`"),
            None,
            Some(format!(
                "@{actor} rover does not know `{PREFIX} {word}`; nothing was done.\n\n{}",
                help_text()
            )),
        ),
        ThreadCommand::Help => (
            CommandOutcome::Done,
            "listed the commands".into(),
            None,
            Some(help_text()),
        ),
        ThreadCommand::Merge => {
            let head = github
                .get_pull_request(number)
                .await
                .map_err(|e| {
                    StepError::from_error(&e, e.is_retryable())
                        .not_before(e.retry_at())
                        .detail("what", "reading the pull request to approve its merge")
                })?
                .head_sha;
            let actor = actor.to_owned();
            blocking(ctx.store.clone(), move |s| {
                approve_merge(s, trace_id, number, &head, &actor)
            })
            .await
            .map_err(store_error("approving the merge"))?
        }
        ThreadCommand::Stop | ThreadCommand::Retry | ThreadCommand::Status => {
            let command = command.clone();
            let actor = actor.to_owned();
            blocking(ctx.store.clone(), move |s| {
                act(s, trace_id, number, &command, &actor)
            })
            .await
            .map_err(store_error("reading the traces about the thread"))?
        }
    })
}

type Acted = (CommandOutcome, String, Option<Uuid>, Option<String>);

/// `/rover merge` on pull request `number` at `head`: an `approve` span in the trace whose merge
/// of it waits, and that merge made due now. Marked like `stop`: a run cut off after approving
/// and run again does not approve twice.
fn approve_merge(
    store: &AutopilotStore,
    own: Uuid,
    number: u64,
    head: &str,
    actor: &str,
) -> Result<Acted, StoreError> {
    let mark = format!("command trace {}", crate::trace::short(own));
    let short_head = &head[..head.len().min(12)];
    let state = store.read_state()?;
    let waiting = state.pending.iter().find(|p| {
        p.action == StepKind::Merge
            && p.running_span_id.is_none()
            && store
                .read_action(p.action_id)
                .ok()
                .and_then(|a| crate::steps::meta::read::<MergeMeta>(&a).ok())
                .is_some_and(|m| m.pr_number == number)
    });
    let Some(pending) = waiting else {
        let why = format!("rover has no merge of #{number} waiting: nothing to approve");
        return Ok((
            CommandOutcome::Nothing,
            why.clone(),
            None,
            Some(format!("@{actor} {why}.")),
        ));
    };
    let target = pending.trace_id;
    let view = store.load_trace(target)?;
    let done = |id: Uuid| {
        (
            CommandOutcome::Done,
            format!("approved the merge of #{number} at {short_head}"),
            Some(id),
            Some(format!(
                "Approved by @{actor}: rover merges #{number} at {short_head} once its rules allow (trace `{}`).",
                crate::trace::short(id)
            )),
        )
    };
    if intervention_marked(&view, &mark).is_none() {
        let record = InterventionSpanMeta {
            by: actor.to_owned(),
            reason: Some(format!("{PREFIX} merge on #{number} ({mark})")),
            head_sha: Some(head.to_owned()),
            ..InterventionSpanMeta::default()
        };
        let span = Span::intervention(
            target,
            Intervention::Approve.as_str(),
            format!("merge of #{number} at {short_head} approved by {actor}"),
            &record,
        );
        store.intervene(&span, &[], |_| false, None)?;
    }
    store.wake_pending(pending.action_id)?;
    Ok(done(target))
}

/// `stop`, `retry` or `status` on the trace working on `number`, in the store.
fn act(
    store: &AutopilotStore,
    own: Uuid,
    number: u64,
    command: &ThreadCommand,
    actor: &str,
) -> Result<Acted, StoreError> {
    let traces = traces_about(store, own, number)?;
    // This command's own mark on what it did: a run cut off after acting and run again finds
    // it and does not act twice.
    let mark = format!("command trace {}", crate::trace::short(own));
    for view in &traces {
        if let Some(span) = intervention_marked(view, &mark) {
            let summary = span.summary.clone().unwrap_or_default();
            let answer = (Intervention::of(span) == Some(Intervention::Retry)).then(|| {
                format!(
                    "Retrying: {summary} (trace `{}`).",
                    crate::trace::short(view.trace_id())
                )
            });
            return Ok((
                CommandOutcome::Done,
                format!("trace {}: {summary}", crate::trace::short(view.trace_id())),
                Some(view.trace_id()),
                answer,
            ));
        }
    }
    let closed = store.read_state()?.closed;
    let nothing = |what: &str| {
        (
            CommandOutcome::Nothing,
            what.to_owned(),
            None,
            Some(format!("@{actor} {what}.")),
        )
    };
    Ok(match command {
        ThreadCommand::Stop => {
            let Some(view) = traces
                .iter()
                .find(|v| !v.pending.is_empty() && !closed.contains_key(&v.trace_id()))
            else {
                return Ok(nothing(&format!(
                    "rover is doing nothing on #{number}: nothing to stop"
                )));
            };
            let id = view.trace_id();
            match crate::steps::intervene::close_trace(
                store,
                id,
                crate::store::CloseCommand::Cancel,
                &format!("{PREFIX} stop on #{number} ({mark})"),
                actor,
            ) {
                // The stopped trace answers on the thread itself (that it was cancelled).
                Ok(closed) => (
                    CommandOutcome::Done,
                    format!("trace {} {}", crate::trace::short(id), closed.what),
                    Some(id),
                    None,
                ),
                Err(crate::steps::intervene::InterveneError::Refused(why)) => (
                    CommandOutcome::Nothing,
                    why.clone(),
                    Some(id),
                    Some(format!("@{actor} {why}")),
                ),
                Err(crate::steps::intervene::InterveneError::Store(e)) => return Err(e),
            }
        }
        ThreadCommand::Retry => {
            let Some(view) = traces.first() else {
                return Ok(nothing(&format!("rover has no work on #{number} to retry")));
            };
            let id = view.trace_id();
            let reason = format!("{PREFIX} retry on #{number} ({mark})");
            match crate::steps::intervene::retry_trace(store, id, None, actor, Some(&reason)) {
                Ok(retried) => (
                    CommandOutcome::Done,
                    format!("trace {}: {}", crate::trace::short(id), retried.summary),
                    Some(id),
                    Some(format!(
                        "Retrying: {} (trace `{}`).",
                        retried.summary,
                        crate::trace::short(id)
                    )),
                ),
                Err(crate::steps::intervene::InterveneError::Refused(why)) => (
                    CommandOutcome::Nothing,
                    why.clone(),
                    Some(id),
                    Some(format!("@{actor} {why}")),
                ),
                Err(crate::steps::intervene::InterveneError::Store(e)) => return Err(e),
            }
        }
        ThreadCommand::Status => {
            let Some(view) = traces.first() else {
                return Ok(nothing(&format!("rover has no work on #{number}")));
            };
            (
                CommandOutcome::Done,
                format!("status of trace {}", crate::trace::short(view.trace_id())),
                Some(view.trace_id()),
                Some(status_text(view)),
            )
        }
        ThreadCommand::Help | ThreadCommand::Unknown(_) | ThreadCommand::Merge => {
            unreachable!("answered without the store, or by approve_merge")
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::github::{Channel, EventKind, Visibility};

    /// Issue #`number` opened by alice, ingested as the poller does: a trace with its
    /// `coordinate` queued.
    fn work_on(store: &AutopilotStore, number: u64) -> Uuid {
        let mut event = NormalizedEvent::local("40000000001", "alice", "", Utc::now());
        event.kind = EventKind::Issues;
        event.action = Some(EventAction::Opened);
        event.repo = "octo-org/widgets".into();
        event.number = Some(number);
        event.body = None;
        event.channel = Channel::IssueComment { number };
        event.visibility = Visibility::Public;
        let arrival = crate::intake::Arrival::Github {
            event: &event,
            via: crate::intake::Via::Poll,
        };
        match crate::intake::ingest(
            store,
            &crate::intake::Entry::new("p", crate::steps::kinds::FIRST_STEP),
            arrival,
        )
        .expect("ingest")
        {
            crate::intake::Ingested::New(t) => t,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_stop_run_again_after_a_crash_finds_its_mark_and_does_not_act_twice() {
        let dir = tempfile::tempdir().unwrap();
        let store = AutopilotStore::open(dir.path(), "p").unwrap();
        let work = work_on(&store, 12);
        let own = Uuid::new_v4();
        let first = act(&store, own, 12, &ThreadCommand::Stop, "alice").unwrap();
        assert_eq!((first.0, first.2), (CommandOutcome::Done, Some(work)));
        assert!(store.read_state().unwrap().closed.contains_key(&work));
        // The same command again (its coordinate cut off after acting): done, nothing more.
        let again = act(&store, own, 12, &ThreadCommand::Stop, "alice").unwrap();
        assert_eq!((again.0, again.2), (CommandOutcome::Done, Some(work)));
        let cancels = store
            .load_trace(work)
            .unwrap()
            .spans
            .iter()
            .filter(|s| Intervention::of(s) == Some(Intervention::Cancel))
            .count();
        assert_eq!(cancels, 1);
        // Another command finds nothing left to stop, and says so.
        let other = act(&store, Uuid::new_v4(), 12, &ThreadCommand::Stop, "bob").unwrap();
        assert_eq!(other.0, CommandOutcome::Nothing);
        assert!(other.3.unwrap().contains("nothing to stop"));
        // Status names the trace and the command to see it.
        let status = act(&store, Uuid::new_v4(), 12, &ThreadCommand::Status, "bob").unwrap();
        let text = status.3.unwrap();
        assert!(
            text.contains(&format!(
                "`rover autopilot trace {}`",
                crate::trace::short(work)
            )),
            "{text}"
        );
    }

    #[test]
    fn only_a_first_line_starting_with_the_prefix_is_a_command() {
        assert_eq!(parse("/rover stop"), Some(ThreadCommand::Stop));
        assert_eq!(
            parse("\n  /rover   Status please\nmore"),
            Some(ThreadCommand::Status)
        );
        assert_eq!(parse("/rover"), Some(ThreadCommand::Help));
        assert_eq!(
            parse("/rover frobnicate"),
            Some(ThreadCommand::Unknown("frobnicate".into()))
        );
        assert_eq!(
            parse("/rover @org/team`x`"),
            Some(ThreadCommand::Unknown("?org?team?x?".into()))
        );
        assert_eq!(parse("/roverstop"), None);
        assert_eq!(parse("please /rover stop"), None);
        assert_eq!(parse("Thanks!\n/rover stop"), None);
        assert_eq!(parse(""), None);
    }
}
