//! One rover span as one OpenTelemetry span: ids derived from rover's (`store::otel`), the
//! parent as in the store, the GenAI semantic conventions on the spans that called an agent,
//! and rover's own attributes under `rover.`. Without `telemetry.content` no free text leaves
//! (no summary, reason, error message, event title or agent output); every string that does
//! leave is redacted first.

use std::borrow::Cow;
use std::time::SystemTime;

use opentelemetry::trace::{
    SpanContext, SpanId, SpanKind, Status, TraceFlags, TraceId, TraceState,
};
use opentelemetry::{InstrumentationScope, KeyValue, Value};
use opentelemetry_sdk::trace::{SpanData, SpanEvents, SpanLinks};
use serde_json::Value as Json;

use crate::agents::{AgentKind, AgentSettings, AgentStep};
use crate::github::{Channel, Redactor, Visibility};
use crate::intake::{EventMeta, EventSource};
use crate::steps::meta::{DecisionSpanMeta, LabelsSpanMeta, PushPullRequest};
use crate::store::otel::{span_id_bytes, trace_id_bytes};
use crate::store::{AgentMeta, ErrorMeta, RunSpanMeta, Span, SpanStatus, StepKind};

/// The longest text attribute exported with `telemetry.content` (longer text is cut, marked).
const MAX_TEXT: usize = 4096;

/// What the conversion needs besides the span.
#[derive(Debug, Clone)]
pub struct Convert {
    pub agent: AgentSettings,
    pub content: bool,
    pub redactor: Redactor,
    pub scope: InstrumentationScope,
    /// The repository the spans are of (`owner/name`), on every span as `rover.repo`: one
    /// daemon serving many repositories exports them all under one service.
    pub repo: Option<String>,
    /// The project's id (its store), on every span as `rover.project_id`.
    pub project_id: String,
}

/// The GenAI role of a step that called an agent: its operation and the agent's name (the
/// steps' table says).
fn genai_role(step: &StepKind) -> Option<(&'static str, &'static str, AgentStep)> {
    crate::steps::kinds::telemetry_role(step)
}

/// `gen_ai.provider.name` of an agent CLI.
fn provider(kind: AgentKind) -> &'static str {
    kind.provider().name()
}

struct Attrs<'a> {
    out: Vec<KeyValue>,
    convert: &'a Convert,
}

impl Attrs<'_> {
    /// A string from rover's records that is no free text (an id, a name, a branch): still
    /// redacted of secrets, in case one got in.
    fn str(&mut self, key: &'static str, value: &str) {
        let v = self.convert.redactor.redact(value, Visibility::Private);
        self.out.push(KeyValue::new(key, v));
    }
    /// Free text: only with `telemetry.content`, redacted as a public comment is.
    fn text(&mut self, key: &'static str, value: &str) {
        if !self.convert.content || value.is_empty() {
            return;
        }
        let v = cut(&self.convert.redactor.redact(value, Visibility::Public));
        self.out.push(KeyValue::new(key, v));
    }
    fn int(&mut self, key: &'static str, value: u64) {
        self.out
            .push(KeyValue::new(key, i64::try_from(value).unwrap_or(i64::MAX)));
    }
    fn push(&mut self, key: &'static str, value: impl Into<Value>) {
        self.out.push(KeyValue::new(key, value));
    }
}

fn cut(text: &str) -> String {
    if text.len() <= MAX_TEXT {
        return text.to_owned();
    }
    let mut end = MAX_TEXT;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}… [cut]", &text[..end])
}

fn time(t: chrono::DateTime<chrono::Utc>) -> SystemTime {
    t.into()
}

/// The OpenTelemetry span of a closed rover span (`None` for a span of no trace).
pub fn to_span_data(span: &Span, convert: &Convert) -> Option<SpanData> {
    let trace = span.trace()?;
    let mut a = Attrs {
        out: Vec::new(),
        convert,
    };
    a.str("rover.trace_id", &trace.to_string());
    a.str("rover.span_id", &span.id.to_string());
    if let Some(action) = span.action_id {
        a.str("rover.action_id", &action.to_string());
    }
    a.str("rover.step", span.step.as_str());
    a.push("rover.status", span.status.as_str());
    if let Some(repo) = &convert.repo {
        a.str("rover.repo", repo);
    }
    a.str("rover.project_id", &convert.project_id);
    let (name, kind) = if span.step == StepKind::Event && span.parent_id.is_none() {
        (root_attrs(span, &mut a), SpanKind::Consumer)
    } else {
        (step_attrs(span, &mut a), SpanKind::Internal)
    };
    if let Some(summary) = &span.summary {
        a.text("rover.summary", summary);
    }
    let status = status(span, &mut a);
    let parent = span
        .parent_id
        .map_or(SpanId::INVALID, |p| SpanId::from_bytes(span_id_bytes(p)));
    Some(SpanData {
        span_context: SpanContext::new(
            TraceId::from_bytes(trace_id_bytes(trace)),
            SpanId::from_bytes(span_id_bytes(span.id)),
            TraceFlags::SAMPLED,
            false,
            TraceState::NONE,
        ),
        parent_span_id: parent,
        parent_span_is_remote: false,
        span_kind: kind,
        name: Cow::Owned(name),
        start_time: time(span.timestamp),
        end_time: time(span.completed.unwrap_or(span.timestamp)),
        attributes: a.out,
        dropped_attributes_count: 0,
        events: SpanEvents::default(),
        links: SpanLinks::default(),
        status,
        instrumentation_scope: convert.scope.clone(),
    })
}

/// The root `event` span: the trace's workflow. Named after the event's type and action.
fn root_attrs(span: &Span, a: &mut Attrs<'_>) -> String {
    a.push("gen_ai.operation.name", "invoke_workflow");
    a.push("gen_ai.agent.name", "rover autopilot");
    a.str("gen_ai.conversation.id", &span.id.to_string());
    let Ok(event) = EventMeta::of(span) else {
        return "invoke_workflow event".to_owned();
    };
    a.str("rover.event.type", &event.kind);
    if let Some(action) = &event.action {
        a.str("rover.event.action", action);
    }
    a.push(
        "rover.event.source",
        match event.source {
            EventSource::Github => "github",
            EventSource::Local => "local",
        },
    );
    a.push(
        "rover.event.visibility",
        match event.visibility {
            Visibility::Public => "public",
            Visibility::Private => "private",
        },
    );
    match &event.channel {
        Channel::IssueComment { number } => a.int("rover.issue.number", *number),
        Channel::PrComment { number } | Channel::PrReview { number } => {
            a.int("rover.pr.number", *number);
        }
        Channel::ReviewThreadReply { number, .. } => a.int("rover.pr.number", *number),
        Channel::CommitComment { sha } => a.str("rover.commit.sha", sha),
        Channel::Local => {}
    }
    a.text("rover.event.label", &event.label);
    if let Some(request) = &event.request {
        a.text("rover.event.request", request);
    }
    match &event.action {
        Some(action) => format!("invoke_workflow {} {action}", event.kind),
        None => format!("invoke_workflow {}", event.kind),
    }
}

/// A step's span: its decision, branch and pull request, and the GenAI attributes of its agent
/// call. Named `{operation} {agent}` when it called one, else after the step.
fn step_attrs(span: &Span, a: &mut Attrs<'_>) -> String {
    if let Some(trace) = span.trace() {
        a.str("gen_ai.conversation.id", &trace.to_string());
    }
    let decided = DecisionSpanMeta::of(span);
    if let Some(d) = &decided.decision {
        a.str("rover.decision", d.as_str());
    }
    if let Some(by) = decided.decided_by {
        let by = serde_json::to_value(by).ok();
        if let Some(by) = by.as_ref().and_then(Json::as_str) {
            a.str("rover.decided_by", by);
        }
    }
    let labels = LabelsSpanMeta::of(span);
    if let Some(b) = labels.branch() {
        a.str("rover.branch", b);
    }
    let names: Vec<String> = labels
        .branch_names()
        .into_iter()
        .map(|b| a.convert.redactor.redact(b, Visibility::Private))
        .collect();
    if !names.is_empty() {
        a.push(
            "rover.branches",
            Value::Array(opentelemetry::Array::String(
                names.into_iter().map(Into::into).collect(),
            )),
        );
    }
    let pr = PushPullRequest::of(span);
    let rover_pr = labels.rover_pr.and_then(|p| p.pr_number);
    if let Some(n) = pr.pr_number.or(rover_pr) {
        a.int("rover.pr.number", n);
    }
    if let Some(Some(url)) = &pr.pr_url {
        a.str("rover.pr.url", url);
    }
    if let Some(created) = pr.pr_created {
        a.push("rover.pr.created", created);
    }
    let run = RunSpanMeta::of(span);
    if let Some(attempt) = run.attempt {
        a.int("rover.attempt", u64::from(attempt));
    }
    if run.interrupted {
        a.push("rover.interrupted", true);
    }
    if let Some(ids) = &run.action_ids {
        a.int("rover.actions_produced", ids.len() as u64);
    }
    if let Some(reason) = labels.why() {
        a.text("rover.reason", reason);
    }
    let agent = AgentMeta::of(span);
    let role = genai_role(&span.step).filter(|(op, _, _)| *op == "plan" || agent.is_some());
    let Some((operation, agent_name, agent_step)) = role else {
        return span.step.as_str().to_owned();
    };
    let kind = a.convert.agent.agent;
    a.push("gen_ai.operation.name", operation);
    a.push("gen_ai.agent.name", agent_name);
    a.push("gen_ai.provider.name", provider(kind));
    a.push("gen_ai.system", provider(kind));
    if let Some(model) = a.convert.agent.model_for(agent_step) {
        a.str("gen_ai.request.model", &model);
    }
    match &agent {
        Some(AgentMeta::Used(usage)) => {
            a.int("gen_ai.usage.input_tokens", usage.input_tokens);
            a.int("gen_ai.usage.output_tokens", usage.output_tokens);
            a.int("gen_ai.usage.cache_read.input_tokens", usage.cached_tokens);
            if let Some(cost) = usage.cost_usd {
                a.push("rover.cost_usd", cost);
            }
            if let Some(turns) = usage.turns {
                a.int("rover.agent.turns", u64::from(turns));
            }
            if let Some(attempts) = usage.attempts {
                a.int("rover.agent.attempts", u64::from(attempts));
            }
        }
        Some(AgentMeta::Failed(failure)) => {
            a.str("rover.agent.error_class", &failure.error_class);
            a.text("rover.agent.error", &failure.error);
        }
        None => {}
    }
    format!("{operation} {agent_name}")
}

/// The span's status: completed is `Ok`, failed and error are `Error`, described by the error
/// message only with `telemetry.content` (else by the status word), with `error.type`.
fn status(span: &Span, a: &mut Attrs<'_>) -> Status {
    match span.status {
        SpanStatus::Completed => Status::Ok,
        SpanStatus::Running => Status::Unset,
        SpanStatus::Failed | SpanStatus::Error => {
            let error = ErrorMeta::of_any(span);
            let class = error
                .as_ref()
                .and_then(|e| e.detail("errorClass"))
                .and_then(Json::as_str)
                .map_or_else(|| span.status.as_str().to_owned(), str::to_owned);
            a.str("error.type", &class);
            if let Some(e) = &error {
                a.push("rover.error.retryable", e.retryable);
            }
            let description = match (&error, a.convert.content) {
                (Some(e), true) => cut(&a.convert.redactor.redact(&e.message, Visibility::Public)),
                (None, true) => span
                    .summary
                    .as_deref()
                    .map(|s| cut(&a.convert.redactor.redact(s, Visibility::Public)))
                    .unwrap_or_default(),
                (_, false) => span.status.as_str().to_owned(),
            };
            Status::Error {
                description: description.into(),
            }
        }
    }
}
