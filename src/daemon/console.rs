//! What `rover autopilot start` prints. Not a terminal (a service, cron, a pipe): one plain line
//! per step transition. A terminal: the same lines scroll above a live view of the traces in
//! progress and their current step, redrawn in place. Local answers (notify on a local request)
//! are printed in full.

use std::collections::BTreeMap;
use std::io::{IsTerminal, Write};
use std::time::{Duration, Instant};

use tokio::sync::broadcast::error::RecvError;
use tokio::sync::broadcast::{Receiver, WeakSender};
use tracing::Instrument as _;
use uuid::Uuid;

use crate::orchestrator::{Progress, StepOrchestrator};
use crate::project::Project;
use crate::steps::meta::NotifySpanMeta;
use crate::store::{AutopilotStore, SpanStatus, StepKind};
use crate::trace::short;

use super::StartOptions;

struct Active {
    label: String,
    step: StepKind,
    since: Instant,
}

/// The console (a view: it holds no work) as a component of its own: it restarts after a
/// panic, saying so (see [`supervised`]), and ends with the orchestrator.
pub(super) fn spawn(
    orchestrator: &StepOrchestrator,
    store: &AutopilotStore,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(supervised(
        orchestrator.subscribe(),
        orchestrator.progress_feed(),
        store.clone(),
    ))
}

/// The line that says the daemon runs: how, for which repository, project and store.
pub(super) fn started(project: &Project, store: &AutopilotStore, options: StartOptions) {
    println!(
        "rover autopilot {} for {} (project {}, store {})",
        if options.once {
            "running once"
        } else {
            "started"
        },
        project
            .repo
            .as_ref()
            .map_or_else(|| project.root.display().to_string(), ToString::to_string),
        project.id,
        store.root().display()
    );
}

/// The console as a component: [`run`] in the `component` span `console`, on `first` (taken
/// when the daemon starts, so nothing is missed). After a panic it says so and starts again on
/// a new subscription to `feed` (after 1 s, doubling to 60 s; the events in between are missed
/// here, the traces have them). Ends with the orchestrator (its feed gone). `ROVER_TEST_PANIC=console[:<runs>]` (debug builds) makes
/// it panic at the start of its first runs.
pub async fn supervised(
    first: Receiver<Progress>,
    feed: WeakSender<Progress>,
    store: AutopilotStore,
) {
    let mut backoff = Duration::from_secs(1);
    let mut runs = 0u32;
    let mut first = Some(first);
    loop {
        // Only a subscription is held while it runs: the feed closes with the orchestrator.
        let Some(progress) = first
            .take()
            .or_else(|| feed.upgrade().map(|sender| sender.subscribe()))
        else {
            return;
        };
        runs += 1;
        let fault = super::supervise::injected_fault("console", runs);
        let view = run(progress, store.clone());
        let joined = tokio::spawn(
            async move {
                if let Some(fault) = fault {
                    panic!("{fault}");
                }
                view.await;
            }
            .instrument(tracing::info_span!("component", name = "console")),
        )
        .await;
        match joined {
            Err(e) if e.is_panic() => {
                let text = super::supervise::panic_text(&e.into_panic());
                tracing::error!(component = "console", error = %text, "the console panicked; restarting it");
                println!("warning: the console panicked: {text}; restarting it in {}s (work goes on; `rover autopilot traces` shows it)", backoff.as_secs());
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(60));
            }
            // Its feed closed (the orchestrator is gone), or cancelled with the runtime.
            Ok(()) | Err(_) => return,
        }
    }
}

/// Print progress until the channel closes.
pub async fn run(mut progress: Receiver<Progress>, store: AutopilotStore) {
    let live = std::io::stdout().is_terminal();
    let mut active: BTreeMap<Uuid, Active> = BTreeMap::new();
    let mut drawn = 0usize;
    let mut tick = tokio::time::interval(Duration::from_millis(500));
    loop {
        let event = tokio::select! {
            e = progress.recv() => e,
            _ = tick.tick(), if live => { redraw(&active, &mut drawn); continue; }
        };
        let event = match event {
            Ok(e) => e,
            Err(RecvError::Lagged(n)) => {
                line(live, &mut drawn, &format!("({n} progress events skipped)"));
                continue;
            }
            Err(RecvError::Closed) => break,
        };
        match event {
            Progress::Started { trace_id, step, .. } => {
                let label = active
                    .get(&trace_id)
                    .map_or_else(|| trace_label(&store, trace_id), |a| a.label.clone());
                line(
                    live,
                    &mut drawn,
                    &format!("{} {} {step} started  {label}", stamp(), short(trace_id)),
                );
                active.insert(
                    trace_id,
                    Active {
                        label,
                        step,
                        since: Instant::now(),
                    },
                );
            }
            Progress::Finished {
                trace_id,
                step,
                span_id,
                status,
                summary,
            } => {
                line(
                    live,
                    &mut drawn,
                    &format!(
                        "{} {} {step} {status}: {}",
                        stamp(),
                        short(trace_id),
                        first_line(&summary)
                    ),
                );
                if crate::steps::kinds::answers(&step) && status == SpanStatus::Completed {
                    if let Some(message) = local_answer(&store, span_id) {
                        line(
                            live,
                            &mut drawn,
                            &format!("answer for {}:\n{message}", short(trace_id)),
                        );
                    }
                }
                if crate::steps::kinds::ends_trace(&step) || status != SpanStatus::Completed {
                    active.remove(&trace_id);
                }
            }
            Progress::Notice(text) => line(live, &mut drawn, &format!("{} {text}", stamp())),
        }
        if live {
            redraw(&active, &mut drawn);
        }
    }
    if live {
        clear(&mut drawn);
    }
}

fn stamp() -> String {
    chrono::Utc::now().format("%H:%M:%S").to_string()
}

fn first_line(text: &str) -> &str {
    text.lines().next().unwrap_or_default()
}

fn trace_label(store: &AutopilotStore, trace_id: Uuid) -> String {
    store
        .load_trace(trace_id)
        .map(|v| v.index.event)
        .unwrap_or_default()
}

/// The message of a notify span that answered on the local channel.
fn local_answer(store: &AutopilotStore, span_id: Uuid) -> Option<String> {
    let span = store.read_span(span_id).ok()?;
    NotifySpanMeta::of(&span)?.local_answer().map(str::to_owned)
}

/// Print a log line: above the live view on a terminal, plainly otherwise.
fn line(live: bool, drawn: &mut usize, text: &str) {
    let mut out = std::io::stdout().lock();
    if live {
        clear_locked(&mut out, drawn);
    }
    let _ = writeln!(out, "{text}");
    let _ = out.flush();
}

fn clear(drawn: &mut usize) {
    let mut out = std::io::stdout().lock();
    clear_locked(&mut out, drawn);
}

fn clear_locked(out: &mut impl Write, drawn: &mut usize) {
    for _ in 0..*drawn {
        let _ = write!(out, "\x1b[1A\x1b[2K");
    }
    *drawn = 0;
}

fn redraw(active: &BTreeMap<Uuid, Active>, drawn: &mut usize) {
    let mut out = std::io::stdout().lock();
    clear_locked(&mut out, drawn);
    let _ = writeln!(out, "── {} trace(s) in progress ──", active.len());
    *drawn += 1;
    for (id, a) in active {
        let _ = writeln!(
            out,
            "  {} {:<10} {:>5}s  {}",
            short(*id),
            a.step.as_str(),
            a.since.elapsed().as_secs(),
            a.label
        );
        *drawn += 1;
    }
    let _ = out.flush();
}
