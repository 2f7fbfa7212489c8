//! Shared plumbing of the deciding steps (coordinate, plan, notify, noop): one structured agent
//! call with its prompt rendered off the runtime and its transcript under the span's artifacts,
//! the trace rendered as text for a prompt, and agent errors turned into step errors.

use std::fmt::Write as _;
use std::path::PathBuf;
use std::sync::Arc;

use uuid::Uuid;

use super::meta::EventMeta;
use super::Services;
use crate::agents::{
    run_structured, step_request, untrusted_block, AgentError, AgentStep, CustomInstructions,
    PromptVars, StepResult, Structured,
};
use crate::orchestrator::{StepContext, StepError};
use crate::store::blocking;
use crate::store::{
    AgentFailure, AgentMeta, AgentUsage, AutopilotStore, ErrorMeta, Span, TaskMapping, TraceView,
};

/// Longest trace text handed to a prompt.
const MAX_TRACE_CHARS: usize = 12_000;

/// Where host-side agents run: an empty directory of rover's under the project's data dir,
/// never a worktree or the checkout, so the CLI finds no repository file to read as its
/// configuration. Made when missing; emptied when anything appeared in it.
pub(crate) fn host_workdir(store: &AutopilotStore) -> Result<PathBuf, AgentError> {
    let dir = host_workdir_path(store);
    let io = |source| AgentError::Io {
        path: dir.clone(),
        source,
    };
    if let Ok(mut entries) = std::fs::read_dir(&dir) {
        if entries.next().is_none() {
            return Ok(dir);
        }
        std::fs::remove_dir_all(&dir).map_err(io)?;
    }
    std::fs::create_dir_all(&dir).map_err(io)?;
    Ok(dir)
}

/// The directory [`host_workdir`] makes.
pub(crate) fn host_workdir_path(store: &AutopilotStore) -> PathBuf {
    store.root().join("agent-cwd")
}

/// The repository's custom instructions from its default branch (none when it cannot be read:
/// they refine prompts, a missing one must not stop the step).
pub(crate) async fn custom_instructions(services: &Services) -> CustomInstructions {
    let mut custom = CustomInstructions::default();
    let paths = CustomInstructions::paths();
    let read = match super::tasks::workspace(services).await {
        Ok(ws) => {
            ws.read_default_branch_files(
                paths.iter().map(|(_, p)| p.clone()).collect(),
                crate::agents::MAX_CUSTOM_BYTES,
            )
            .await
        }
        Err(e) => Err(e),
    };
    match read {
        Ok(files) => {
            for ((step, _), bytes) in paths.iter().zip(files) {
                if let Some(bytes) = bytes {
                    custom.set(*step, &bytes);
                }
            }
        }
        Err(e) => tracing::debug!(error = %e, "no custom instructions from the default branch"),
    }
    custom
}

/// The secrets rover holds taken out of an agent's prompts: a diff, an issue or an error can
/// quote one, and the prompt goes to the model's API and into the transcript on disk.
pub(crate) fn hide_held_secrets(
    redactor: &crate::github::Redactor,
    request: &mut crate::agents::AgentRequest,
) {
    request.prompt = redactor.redact_held(&request.prompt);
    request.system_prompt = redactor.redact_held(&request.system_prompt);
}

/// A request for `step` with `vars`, rendered off the runtime, to run in the host workdir (the
/// secrets rover holds taken out of its prompts); the transcript goes to the span's artifacts
/// dir under `transcript`.
pub(crate) async fn host_request(
    services: &Services,
    store: &AutopilotStore,
    span_id: Uuid,
    step: AgentStep,
    vars: PromptVars,
    transcript: String,
) -> Result<crate::agents::AgentRequest, AgentError> {
    let settings = services.agent_settings().clone();
    let attribution = services.config.attribution;
    let artifacts = store.artifacts_dir(span_id);
    let custom = custom_instructions(services).await;
    let store = store.clone();
    let redactor = services.redactor.clone();
    tokio::task::spawn_blocking(move || {
        let workdir = host_workdir(&store)?;
        let mut request = step_request(&settings, step, &workdir, &vars, attribution, &custom)?;
        hide_held_secrets(&redactor, &mut request);
        // Without a transcript the call still works; the dir is only for inspection.
        if std::fs::create_dir_all(&artifacts).is_ok() {
            request.transcript = Some(artifacts.join(transcript));
        }
        Ok::<_, AgentError>(request)
    })
    .await
    .map_err(|e| AgentError::Prompt {
        step: step.name().to_owned(),
        reason: format!("rendering panicked: {e}"),
    })?
}

/// Run `step`'s prompt with `vars` in the host workdir, asking for a `T`: the one agent call of
/// every AI step on the host. The transcript goes to the span's artifacts dir
/// (`<step>.transcript.jsonl`); a failure becomes a step error with [`agent_error`], and the
/// answer's figures go under `meta.agent` with [`usage_meta`].
pub(crate) async fn ask<T: StepResult + 'static>(
    services: &Arc<Services>,
    ctx: &StepContext,
    span_id: Uuid,
    step: AgentStep,
    vars: PromptVars,
) -> Result<Structured<T>, AgentError> {
    let request = host_request(
        services,
        &ctx.store,
        span_id,
        step,
        vars,
        format!("{}.transcript.jsonl", step.name()),
    )
    .await?;
    let (system, prompt) = (request.system_prompt.clone(), request.prompt.clone());
    let answer = run_structured::<T>(services.agent.as_ref(), request).await;
    // Kept for replay: the answer or the failure, and which prompt it was for; the held
    // secrets masked, as in the transcript (an answer can quote its prompt).
    if crate::store::replay_record::is_recording() {
        let redactor = &services.redactor;
        let recorded = match &answer {
            Ok(answer) => Ok(serde_json::to_string(&answer.value)
                .ok()
                .and_then(|json| serde_json::from_str(&redactor.redact_held(&json)).ok())
                .unwrap_or_default()),
            Err(e) => Err(crate::store::replay_record::RecordedError {
                message: redactor.redact_held(&crate::error::error_chain(e)),
                not_found: false,
                retryable: e.is_retryable(),
                ..crate::store::replay_record::RecordedError::default()
            }),
        };
        crate::store::replay_record::note_answer(step.name(), &system, &prompt, recorded);
    }
    answer
}

/// A step error for a failed agent call, with its step, its class and the raw answer when there
/// is one (the keys every AI step's `meta.error` uses).
pub(crate) fn agent_error(step: AgentStep, e: &AgentError) -> StepError {
    let mut err = StepError::from_error(e, e.is_retryable())
        .detail("agentStep", step.name())
        .detail("errorClass", e.class());
    if let AgentError::InvalidAnswer { reason, raw } = e {
        err = err
            .detail("invalidAnswer", reason)
            .detail("answer", crate::agents::truncate_marked(raw, 4096));
    }
    err
}

/// An agent call's figures as every step records them under the span's `meta.agent` (what
/// `budget::SpanUsage::of` reads): turns, cost, tokens.
pub(crate) fn response_usage(response: &crate::agents::AgentResponse) -> AgentMeta {
    AgentMeta::Used(AgentUsage {
        turns: response.turns,
        cost_usd: response.cost_usd,
        input_tokens: response.usage.input,
        output_tokens: response.usage.output,
        cached_tokens: response.usage.cached,
        attempts: None,
        first_error: None,
    })
}

/// [`response_usage`] of a structured answer, plus how many tries it took.
pub(crate) fn usage_meta<T>(answer: &Structured<T>) -> AgentMeta {
    match response_usage(&answer.response) {
        AgentMeta::Used(usage) => AgentMeta::Used(AgentUsage {
            attempts: Some(answer.attempts),
            first_error: answer.first_error.clone(),
            ..usage
        }),
        failed @ AgentMeta::Failed(_) => failed,
    }
}

/// `meta.agent` of a step that went on without the agent it called (a fallback, a plain
/// message): the error with its causes and its class.
pub(crate) fn failure_meta(e: &AgentError) -> AgentMeta {
    AgentMeta::Failed(AgentFailure {
        error: crate::error::error_chain(e),
        error_class: e.class().to_owned(),
    })
}

/// Load a trace off the runtime.
pub(crate) async fn load_trace(ctx: &StepContext, trace_id: Uuid) -> Result<TraceView, StepError> {
    blocking(ctx.store.clone(), move |s| s.load_trace(trace_id))
        .await
        .map_err(|e| StepError::from_error(&e, true).detail("traceId", trace_id.to_string()))
}

/// A task mapping with its key in `state.json`: the workflow action id, read once here.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct MappedTask {
    pub key: String,
    /// The key as a workflow action id (none for a key of another form: another
    /// implementation's).
    pub workflow_action_id: Option<Uuid>,
    pub mapping: TaskMapping,
}

impl MappedTask {
    pub fn new(key: String, mapping: TaskMapping) -> MappedTask {
        MappedTask {
            workflow_action_id: Uuid::parse_str(&key).ok(),
            key,
            mapping,
        }
    }
}

/// The task mappings, keyed by workflow action id.
pub(crate) async fn task_mappings(ctx: &StepContext) -> Result<Vec<MappedTask>, StepError> {
    let state = blocking(ctx.store.clone(), AutopilotStore::read_state)
        .await
        .map_err(|e| StepError::from_error(&e, true))?;
    crate::store::replay_record::note_mappings(&state.task_mappings);
    Ok(state
        .task_mappings
        .into_iter()
        .map(|(key, mapping)| MappedTask::new(key, mapping))
        .collect())
}

/// The labels the issue or pull request of trace `trace_id` carried when its event came (none
/// for a trace that cannot be read, or not about one): what the scheduler's score reads.
pub(crate) fn trace_labels(store: &AutopilotStore, trace_id: Uuid) -> Vec<String> {
    store
        .load_trace(trace_id)
        .ok()
        .and_then(|view| event_meta(&view).ok())
        .and_then(|e| e.event)
        .map(|e| e.labels)
        .unwrap_or_default()
}

/// The root span's event meta.
pub(crate) fn event_meta(view: &TraceView) -> Result<EventMeta, StepError> {
    let root = view.root().ok_or_else(|| {
        StepError::fatal(
            "the trace has no root event span: inspect it with `rover autopilot trace`",
        )
        .detail("traceId", view.trace_id().to_string())
    })?;
    EventMeta::of(root).map_err(|e| {
        StepError::fatal(format!(
            "the root event span's meta cannot be read: {e}; the trace cannot be answered"
        ))
        .detail("traceId", view.trace_id().to_string())
    })
}

fn span_line(out: &mut String, span: &Span, view: &TraceView) {
    let summary = span
        .summary
        .as_deref()
        .unwrap_or("(running)")
        .lines()
        .next()
        .unwrap_or_default();
    let _ = writeln!(out, "- {} [{}]: {}", span.step, span.status, summary);
    if let Some(error) = ErrorMeta::of(span) {
        let _ = writeln!(out, "  error: {}", error.message);
    }
    for action in view.actions_of(span.id) {
        let _ = writeln!(out, "  → {}: {}", action.action, action.reason);
    }
}

/// The trace as a list for a prompt: every span (step, status, summary, error) and the actions
/// it produced, bounded, as one untrusted block (summaries, errors and reasons quote agents,
/// events and command output).
pub(crate) fn render_trace(view: &TraceView) -> String {
    let mut out = String::new();
    for span in &view.spans {
        span_line(&mut out, span, view);
    }
    if out.is_empty() {
        out.push_str("(nothing recorded yet)\n");
    }
    untrusted_block(
        TRACE_SOURCE,
        &crate::github::context::truncate(&out, MAX_TRACE_CHARS),
    )
}

/// The source of a trace's block: what its lines quote.
pub(crate) const TRACE_SOURCE: &str =
    "rover's trace (its summaries quote agents, events and commands)";
