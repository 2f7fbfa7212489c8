//! The stop reaction: a trusted person's reaction (`github.reactions.stop`, 👎 `-1` by
//! default) on a pull request rover opened, or on a comment rover posted, stops the trace that
//! made it, as `rover autopilot cancel` does; on a comment rover posted on the thread of a
//! running trace (an earlier answer on the same issue or pull request), it stops that trace.
//!
//! Reactions are not in the events feed, so they are polled: every `reactions.pollSecs`, one
//! `GET .../reactions?content=<stop>` per post of a trace still running (its pull requests, and
//! rover's comments on its thread; ended traces cost nothing), each with the ETag of its last answer, so an unchanged
//! list is a `304` that GitHub does not count against the rate limit. The stop is recorded in
//! the trace (a `cancel` span naming who) and listed by `rover autopilot events`.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use crate::github::{GitHub, ReactionTarget, ReactionsFetch, TrustPolicy};
use crate::orchestrator::StepOrchestrator;
use crate::steps::meta::EventMeta;
use crate::store::{blocking, AutopilotStore, IntakeOutcome, IntakeRecord, StoreError};

use super::supervise::Policy;
use super::topology::Topology;

/// A post of a running trace: the trace, when it started, and the post.
type Watched = (Uuid, DateTime<Utc>, ReactionTarget);

/// How many recent traces are searched for rover's comments on a running trace's thread.
const LOOKBACK: usize = 100;

/// The issue or pull request number a trace's event is about.
fn number_of(view: &crate::store::TraceView) -> Option<u64> {
    EventMeta::of(view.root()?).ok()?.event?.number
}

/// What a span posted: the pull request a push opened, the comment a notify posted.
fn posted(span: &crate::store::Span) -> Option<ReactionTarget> {
    Some(match crate::steps::kinds::posted(span)? {
        crate::steps::kinds::Posted::PullRequest(number) => ReactionTarget::Issue { number },
        crate::steps::kinds::Posted::Comment(id) => ReactionTarget::IssueComment { id },
    })
}

/// The posts of the traces still running, each with the trace it stops and when that trace
/// started (an older reaction, left before the trace began, stops nothing): the pull requests
/// the trace opened and the comments it posted, and rover's comments on the thread the trace
/// works on (posted by any recent trace about the same issue or pull request).
fn watched(store: &AutopilotStore) -> Result<Vec<Watched>, StoreError> {
    let state = store.read_state()?;
    let mut running: Vec<Uuid> = state
        .pending
        .iter()
        .map(|p| p.trace_id)
        .filter(|t| !state.closed.contains_key(t))
        .collect();
    running.sort_unstable();
    running.dedup();
    if running.is_empty() {
        return Ok(Vec::new());
    }
    // rover's comments by thread, from the recent traces.
    let mut comments: HashMap<u64, Vec<ReactionTarget>> = HashMap::new();
    for entry in store.recent_traces(LOOKBACK)? {
        let Ok(view) = store.load_trace(entry.trace_id) else {
            continue;
        };
        let Some(number) = number_of(&view) else {
            continue;
        };
        for target in view.spans.iter().filter_map(posted) {
            if matches!(target, ReactionTarget::IssueComment { .. }) {
                comments.entry(number).or_default().push(target);
            }
        }
    }
    let mut out: Vec<Watched> = Vec::new();
    for trace in running {
        let Ok(view) = store.load_trace(trace) else {
            continue;
        };
        let started = view.root().map_or_else(Utc::now, |s| s.timestamp);
        let thread = number_of(&view)
            .and_then(|n| comments.get(&n))
            .cloned()
            .unwrap_or_default();
        for target in view.spans.iter().filter_map(posted).chain(thread) {
            if !out.iter().any(|(t, _, w)| *t == trace && *w == target) {
                out.push((trace, started, target));
            }
        }
    }
    Ok(out)
}

/// Polls the stop reaction on the posts of running traces until `shutdown` (once with `once`).
pub(super) struct StopWatch {
    pub store: AutopilotStore,
    pub github: Arc<dyn GitHub>,
    pub trust: TrustPolicy,
    pub stop: String,
    pub every: Duration,
    pub bot_login: Option<String>,
    pub orchestrator: StepOrchestrator,
}

impl StopWatch {
    pub(super) async fn run(self, shutdown: CancellationToken, once: bool) {
        let mut etags: HashMap<ReactionTarget, String> = HashMap::new();
        loop {
            if let Err(e) = self.pass(&mut etags).await {
                tracing::warn!(error = %e, "cannot look at the reactions on rover's posts");
            }
            if once {
                return;
            }
            tokio::select! {
                () = shutdown.cancelled() => return,
                () = tokio::time::sleep(self.every) => {}
            }
        }
    }

    /// One look at every watched post.
    async fn pass(&self, etags: &mut HashMap<ReactionTarget, String>) -> Result<(), String> {
        let targets = blocking(self.store.clone(), watched)
            .await
            .map_err(|e| e.to_string())?;
        etags.retain(|t, _| targets.iter().any(|(_, _, w)| w == t));
        let mut stopped: Vec<Uuid> = Vec::new();
        for (trace, started, target) in targets {
            if stopped.contains(&trace) {
                continue;
            }
            let fetch = self
                .github
                .reactions(target, &self.stop, etags.get(&target).map(String::as_str))
                .await
                .map_err(|e| crate::error::error_chain(&e))?;
            let ReactionsFetch::Logins { reactions, etag } = fetch else {
                continue;
            };
            if let Some(etag) = etag {
                etags.insert(target, etag);
            }
            let logins = reactions
                .into_iter()
                .filter(|r| r.created_at.is_none_or(|at| at >= started))
                .map(|r| r.login);
            for login in logins {
                if crate::github::events::is_bot_login(&login, self.bot_login.as_deref()) {
                    continue;
                }
                match self.trust.decide(self.github.as_ref(), &login).await {
                    Ok(d) if d.trusted => {
                        if self.stop_trace(trace, target, &login).await {
                            stopped.push(trace);
                        }
                        break;
                    }
                    Ok(_) => {}
                    Err(e) => {
                        tracing::warn!(error = %e, %login, "cannot tell whether a reaction's author is trusted");
                        // Asked again at the next pass.
                        etags.remove(&target);
                    }
                }
            }
        }
        if !stopped.is_empty() {
            self.orchestrator.wake();
        }
        Ok(())
    }

    /// Close `trace` for `login`'s reaction on `target`; whether it was closed now.
    async fn stop_trace(&self, trace: Uuid, target: ReactionTarget, login: &str) -> bool {
        let reason = format!("{login} reacted {} on {}", self.stop, target.describe());
        let by = login.to_owned();
        let done = blocking(self.store.clone(), move |s| {
            let outcome = crate::steps::intervene::close_trace(
                s,
                trace,
                crate::store::CloseCommand::Cancel,
                &reason,
                &by,
            );
            let (closed, text) = match outcome {
                Ok(c) => (true, format!("stopped: trace {}", c.what)),
                Err(crate::steps::intervene::InterveneError::Refused(why)) => (false, why),
                Err(crate::steps::intervene::InterveneError::Store(e)) => return Err(e),
            };
            let mut record = IntakeRecord::new("reaction", IntakeOutcome::Command, Utc::now())
                .reason(format!("{reason}: {text}"));
            record.actor = Some(by.clone());
            record.trace_id = Some(trace);
            if let ReactionTarget::Issue { number } = target {
                record.number = Some(number);
            }
            s.append_intake(&[record])?;
            Ok(closed)
        })
        .await;
        match done {
            Ok(closed) => {
                if closed {
                    println!(
                        "trace {} stopped: {login} reacted {} on {}",
                        crate::trace::short(trace),
                        self.stop,
                        target.describe()
                    );
                }
                closed
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot stop the trace a reaction asked to stop");
                false
            }
        }
    }
}

impl Topology {
    /// The stop reaction on the posts of running traces: a new watch for each run of the
    /// component, when rover reads GitHub and `github.reactions.stop` is set.
    pub(super) fn stop_watch(&self) -> Option<impl Fn() -> StopWatch + Send + 'static> {
        let (Some(gh), Some(stop)) = (&self.github, &self.config.autopilot.github.reactions.stop)
        else {
            return None;
        };
        let (gh, stop, store, orch) = (
            gh.clone(),
            stop.clone(),
            self.store.clone(),
            self.orchestrator.clone(),
        );
        let settings = self.config.autopilot.github.clone();
        Some(move || StopWatch {
            store: store.clone(),
            github: gh.clone(),
            trust: crate::github::TrustPolicy::new(&settings.trust),
            stop: stop.clone(),
            every: Duration::from_secs(settings.reactions.poll_secs.max(1)),
            bot_login: settings.bot_login.clone(),
            orchestrator: orch.clone(),
        })
    }

    /// The stop-reaction watch as a component, until the shutdown.
    pub(super) fn supervise_stop_watch(&mut self, watch: impl Fn() -> StopWatch + Send + 'static) {
        let stop = self.shutdown.clone();
        self.supervisor
            .spawn("stop-reaction watch", Policy::Restart, move || {
                let (watch, stop) = (watch(), stop.clone());
                async move {
                    watch.run(stop, false).await;
                    Ok(())
                }
            });
    }
}
