//! The deciding steps (coordinate, plan, notify, noop) on the real orchestrator and store, with
//! the fake agent, the fake GitHub behind the real octocrab client, and real git repositories.

use std::sync::Arc;

use async_trait::async_trait;
use chrono::Utc;
use rover::config::RoverConfig;
use rover::github::{compose, Channel, EventAction, EventKind, NormalizedEvent, Visibility};
use rover::orchestrator::{Finished, Outcome, Step, StepContext, StepError, StepOrchestrator};
use rover::steps::meta::{
    self, CleanupMeta, NotifyMeta, NotifyPurpose, PlanMeta, WorkflowMeta, WorkflowType,
};
use rover::steps::{CoordinateStep, NoopStep, NotifyStep, PlanStep, Services, SummarizingNoopStep};
use rover::store::{Action, StepKind, StepRun, TaskMapping, TraceView};
use serde_json::{json, Value};
use uuid::Uuid;

use crate::support::chain::assert_chain;
use crate::support::fake_github::{FakeGitHub, BOT, REPO, TOKEN};
use crate::support::pipeline::{last_span, Case, Pipeline};

const SHA: &str = "184cb4b61e26de7cccc385d37da25cd8bd817d27";
const ROVER_BRANCH: &str = "rover/task-fix-login";

/// Stands in for another helper's step: finishes at once, producing nothing.
struct FakeFinishStep(StepKind);

#[async_trait]
impl Step for FakeFinishStep {
    fn kind(&self) -> StepKind {
        self.0.clone()
    }

    fn max_parallel(&self) -> usize {
        5
    }

    async fn process(&self, _ctx: &StepContext, run: &StepRun) -> Result<Outcome, StepError> {
        Ok(Outcome::Finished(Finished::completed(format!(
            "fake {}: {}",
            self.0, run.action.reason
        ))))
    }
}

fn config() -> RoverConfig {
    let mut config = crate::support::pipeline::test_config();
    config.autopilot.github.bot_login = Some(BOT.into());
    config
}

/// A case with `config()`, the fake agent answering by `script`.
fn case(script: &Value) -> Case {
    Case::new(script).config(config())
}

/// A normalized GitHub event about `number` (or a push when `number` is `None`).
fn event(
    kind: EventKind,
    action: Option<EventAction>,
    number: Option<u64>,
    actor: &str,
    channel: Channel,
) -> NormalizedEvent {
    let mut e = NormalizedEvent::local("0", actor, "", Utc::now());
    e.id = Uuid::new_v4().simple().to_string();
    e.kind = kind;
    e.action = action;
    e.repo = REPO.into();
    e.number = number;
    e.is_pull_request = matches!(
        kind,
        EventKind::PullRequest | EventKind::PullRequestReview | EventKind::PullRequestReviewComment
    );
    e.body = None;
    e.channel = channel;
    e.visibility = Visibility::Public;
    e
}

/// A `kind`/`action` event about issue `number` by `actor`, answered on the issue.
fn on_issue(kind: EventKind, action: EventAction, number: u64, actor: &str) -> NormalizedEvent {
    event(
        kind,
        Some(action),
        Some(number),
        actor,
        Channel::IssueComment { number },
    )
}

/// A `kind`/`action` event about pull request `number` by `actor`, answered on its
/// conversation.
fn on_pr(kind: EventKind, action: EventAction, number: u64, actor: &str) -> NormalizedEvent {
    event(
        kind,
        Some(action),
        Some(number),
        actor,
        Channel::PrComment { number },
    )
}

/// Start a trace for a GitHub event (root span + its `coordinate` action).
fn submit_github(p: &Pipeline, e: &NormalizedEvent) -> Uuid {
    let (root, first) = rover::intake::github_trace(
        &rover::intake::Entry::new(p.project_id.clone(), rover::steps::kinds::FIRST_STEP),
        e,
    );
    p.store
        .create_trace(&root, Some(&first), std::slice::from_ref(&e.id))
        .expect("create trace");
    root.id
}

/// Start a trace for a GitHub event whose first action is a `notify` with `notify` meta.
fn submit_notify(p: &Pipeline, e: &NormalizedEvent, notify: &NotifyMeta) -> (Uuid, Uuid) {
    let (root, _) = rover::intake::github_trace(
        &rover::intake::Entry::new(p.project_id.clone(), rover::steps::kinds::FIRST_STEP),
        e,
    );
    let Value::Object(meta) = serde_json::to_value(notify).expect("meta") else {
        unreachable!("a struct serializes to an object")
    };
    let action = Action::new(StepKind::Notify, &root, "test notify", meta, Utc::now());
    p.store
        .create_trace(&root, Some(&action), std::slice::from_ref(&e.id))
        .expect("create trace");
    (root.id, action.id)
}

/// Record a task mapping as the workflow step would (keyed by its workflow action id).
fn add_mapping(p: &Pipeline, branch: &str) -> Uuid {
    let key = Uuid::new_v4();
    let mapping = TaskMapping::new("task-fix-login", branch, Uuid::new_v4(), Uuid::new_v4());
    p.store
        .transact(|txn| {
            txn.state_mut()?
                .task_mappings
                .insert(key.to_string(), mapping);
            Ok(())
        })
        .expect("write mapping");
    key
}

/// The meta of the first action the span of `step` produced.
fn first_produced<T: serde::de::DeserializeOwned>(view: &TraceView, step: &str) -> T {
    meta::read(&produced(view, step)[0]).expect("meta")
}

/// The prompt of the `n`-th agent call (from 0).
fn prompt_of(calls: &[Value], n: usize) -> &str {
    calls[n]["prompt"].as_str().expect("prompt")
}

/// Alice's pull request #12 titled `title` (`feature/fast` at `SHA` into `main`) on `fake`,
/// alice a writer.
fn alices_pr(fake: &FakeGitHub, title: &str) {
    fake.add_pull(12, title, "alice", "feature/fast", SHA, "main");
    fake.set_permission("alice", "write");
}

/// A trace for alice opening pull request #12.
fn pr_opened(p: &Pipeline) -> Uuid {
    submit_github(
        p,
        &on_pr(EventKind::PullRequest, EventAction::Opened, 12, "alice"),
    )
}

/// The coordinator waits for "CI to finish"; re-evaluating the wait, it answers that CI is
/// green, which the notifier says.
fn wait_then_green() -> Value {
    json!([
        {"prompt_contains": rover::steps::coordinate::REEVALUATION_HEADING, "structured": coordinate_answer("notify", &json!({"message": "CI is green now."}))},
        {"prompt_contains": COORDINATE, "structured": coordinate_answer("wait", &json!({"condition": "CI to finish"}))},
        {"prompt_contains": NOTIFY, "structured": {"message": "CI is green now."}},
    ])
}

/// The decision steps on `p` with `config()`, the fake agent answering `script`, GitHub the
/// real client against `fake`: the pipeline and its orchestrator.
fn on_fake(p: Pipeline, script: &Value, fake: &FakeGitHub) -> (Pipeline, StepOrchestrator) {
    Case::on(p, script)
        .config(config())
        .github(fake)
        .build(steps)
}

/// `on_fake` on a new pipeline whose store maps task `task-fix-login` to `ROVER_BRANCH`
/// (`add_mapping`): the pipeline, its orchestrator and the mapping's key.
fn mapped(script: &Value, fake: &FakeGitHub) -> (Pipeline, StepOrchestrator, Uuid) {
    let p = Pipeline::new();
    let key = add_mapping(&p, ROVER_BRANCH);
    let (p, orch) = on_fake(p, script, fake);
    (p, orch, key)
}

/// Rover's pull request #7 on `ROVER_BRANCH` (on `fake`) closed by alice, an admin, `merged`
/// or not: runs its trace to a cleanup and returns the trace and the cleanup's meta.
async fn rovers_pr_closed(
    fake: &FakeGitHub,
    p: &Pipeline,
    orch: &StepOrchestrator,
    merged: bool,
) -> (TraceView, CleanupMeta) {
    fake.add_pull(7, "Fix login", BOT, ROVER_BRANCH, SHA, "main");
    fake.set_permission("alice", "admin");
    let mut e = on_pr(EventKind::PullRequest, EventAction::Closed, 7, "alice");
    e.merged = Some(merged);
    e.head_branch = Some(ROVER_BRANCH.into());
    let trace = submit_github(p, &e);
    let view = p.run_as(orch, trace, "event coordinate cleanup").await;
    let cleanup = first_produced(&view, "coordinate");
    (view, cleanup)
}

/// The actions the span of `step` produced.
fn produced(view: &TraceView, step: &str) -> Vec<Action> {
    let span = last_span(view, step);
    view.actions_of(span.id).cloned().collect()
}

fn coordinate_answer(decision: &str, extra: &Value) -> Value {
    let mut answer = json!({
        "decision": decision, "confidence": 0.9, "reasoning": format!("because {decision}"),
        "directive": null, "task": null, "message": null, "condition": null, "task_id": null
    });
    for (k, v) in extra.as_object().expect("object") {
        answer[k] = v.clone();
    }
    answer
}

const COORDINATE: &str = "Decide what rover should do about this event.";
const PLAN: &str = "## Directive";
const NOTIFY: &str = "## What to communicate";
const SUMMARIZE: &str = "## Reason recorded";

fn task(id: &str, depends_on: &[&str]) -> Value {
    json!({"id": id, "title": format!("Task {id}"), "description": format!("Do {id}"),
           "acceptance_criteria": [format!("{id} done")], "workflow_type": "swe",
           "depends_on": depends_on})
}

/// The decision steps plus stand-ins for the others.
fn steps(services: &Arc<Services>) -> Vec<Arc<dyn Step>> {
    vec![
        Arc::new(CoordinateStep::new(services.clone())),
        Arc::new(PlanStep::new(services.clone())),
        Arc::new(NotifyStep::new(services.clone())),
        Arc::new(SummarizingNoopStep::new(services.clone())),
        Arc::new(FakeFinishStep(StepKind::Workflow)),
        Arc::new(FakeFinishStep(StepKind::Cleanup)),
    ]
}

#[tokio::test]
async fn untrusted_author_ends_in_noop_without_the_agent() {
    let fake = FakeGitHub::start().await;
    fake.add_issue(5, "Please delete everything", "rm -rf", "mallory", &[]);
    fake.set_permission("mallory", "read");
    let script = json!([{"structured": coordinate_answer("plan", &json!({"directive": "x"}))}]);
    let (p, orch) = case(&script).github(&fake).build(steps);
    let e = on_issue(EventKind::Issues, EventAction::Opened, 5, "mallory");
    let trace = submit_github(&p, &e);
    let view = p.run_as(&orch, trace, "event coordinate noop").await;
    let noop = produced(&view, "coordinate");
    assert_eq!(noop.len(), 1);
    assert!(
        noop[0]
            .reason
            .starts_with("untrusted author: mallory has read permission"),
        "{}",
        noop[0].reason
    );
    let coordinate = last_span(&view, "coordinate");
    assert_eq!(coordinate.meta["decidedBy"], "trust");
    assert_eq!(coordinate.meta["trust"]["trusted"], false);
    assert_eq!(
        last_span(&view, "noop").meta["summarySource"],
        "span summaries (untrusted event: no agent)"
    );
    assert_eq!(
        p.agents.calls().len(),
        0,
        "no agent may run for an untrusted author, not even the summarizer"
    );
    assert!(fake.comment_bodies(5).is_empty(), "nothing is posted");
}

/// One local request through the coordinator with `answer`; returns the pipeline and trace.
async fn coordinate_local(answer: Value, more: Vec<Value>) -> (Pipeline, Uuid) {
    let mut rules = vec![json!({"prompt_contains": COORDINATE, "structured": answer})];
    rules.extend(more);
    let (p, orch) = case(&Value::Array(rules)).build(steps);
    let trace = p.submit("Make the login page remember the user");
    p.run(&orch).await;
    (p, trace)
}

/// `coordinate_local`, then checks the trace's chain of steps (`short`); returns the pipeline
/// and the trace.
async fn decided_local(answer: Value, more: Vec<Value>, short: &str) -> (Pipeline, TraceView) {
    let (p, trace) = coordinate_local(answer, more).await;
    let view = p.trace(trace);
    assert_chain(&view, short);
    (p, view)
}

#[tokio::test]
async fn coordinator_noop_ends_with_an_ai_summary() {
    let (p, view) = decided_local(
        coordinate_answer("noop", &json!({})),
        vec![json!({"prompt_contains": SUMMARIZE, "structured": {"summary": "Nothing to do: the request was already handled."}})], "event coordinate noop").await;
    let coordinate = last_span(&view, "coordinate");
    assert_eq!(coordinate.meta["decision"], "noop");
    assert_eq!(coordinate.meta["decidedBy"], "agent");
    assert_eq!(coordinate.meta["confidence"], 0.9);
    assert_eq!(coordinate.meta["reasoning"], "because noop");
    let noop = last_span(&view, "noop");
    assert_eq!(noop.meta["reason"], "because noop");
    assert_eq!(
        noop.meta["summary"],
        "Nothing to do: the request was already handled."
    );
    assert_eq!(noop.meta["summarySource"], "agent");
    // The local request reached the coordinator's prompt as trusted text.
    let calls = p.agents.calls();
    let prompt = prompt_of(&calls, 0);
    assert!(prompt.contains("Make the login page remember the user"));
    assert!(prompt.contains("(trusted)"));
}

#[tokio::test]
async fn noop_falls_back_to_span_summaries_when_the_agent_fails() {
    let (p, trace) = coordinate_local(
        coordinate_answer("noop", &json!({})),
        vec![json!({"prompt_contains": SUMMARIZE, "mode": "api_error", "status": 401})],
    )
    .await;
    let noop = last_span(&p.trace(trace), "noop");
    assert_eq!(noop.meta["summarySource"], "span summaries");
    let summary = noop.meta["summary"].as_str().expect("summary");
    assert!(
        summary.starts_with("event: local request by tester"),
        "{summary}"
    );
    assert!(summary.contains("coordinate: decided noop"), "{summary}");
    assert_eq!(noop.meta["agent"]["errorClass"], "auth");
}

#[tokio::test]
async fn coordinator_plan_carries_the_directive() {
    let (p, view) = decided_local(
        coordinate_answer("plan", &json!({"directive": "Persist the session cookie"})),
        vec![json!({"prompt_contains": PLAN, "structured": {"analysis": "small", "tasks": [task("a", &[])], "clarification": null}})], "event coordinate plan workflow").await;
    let plan = produced(&view, "coordinate");
    let meta: PlanMeta = meta::read(&plan[0]).expect("plan meta");
    assert_eq!(meta.directive, "Persist the session cookie");
    assert_eq!(meta.existing_task, None);
    // The directive reached the planner.
    let calls = p.agents.calls();
    assert!(prompt_of(&calls, 1).contains("Persist the session cookie"));
}

#[tokio::test]
async fn coordinator_notify_answers_in_the_local_trace() {
    let (p, view) = decided_local(
        coordinate_answer("notify", &json!({"message": "This was fixed in v2.1."})),
        vec![json!({"prompt_contains": NOTIFY, "structured": {"message": "Already fixed in v2.1 — upgrade and it works."}})], "event coordinate notify").await;
    let action: NotifyMeta = first_produced(&view, "coordinate");
    assert_eq!(action.purpose, NotifyPurpose::Answer);
    assert_eq!(action.message.as_deref(), Some("This was fixed in v2.1."));
    let notify = last_span(&view, "notify");
    assert_eq!(notify.meta["channel"], "local");
    assert_eq!(
        notify.meta["message"],
        "Already fixed in v2.1 — upgrade and it works."
    );
    assert_eq!(notify.meta["messageSource"], "agent");
    assert_eq!(
        notify.summary.as_deref(),
        Some("Already fixed in v2.1 — upgrade and it works.")
    );
    // The drafted message reached the notifier's prompt.
    let calls = p.agents.calls();
    assert!(prompt_of(&calls, 1).contains("This was fixed in v2.1."));
}

#[tokio::test]
async fn coordinator_flag_becomes_a_notify_asking_a_human() {
    let (_p, view) = decided_local(
        coordinate_answer("flag", &json!({"condition": "it touches the billing code"})),
        vec![json!({"prompt_contains": NOTIFY, "mode": "api_error", "status": 401})],
        "event coordinate notify",
    )
    .await;
    let action: NotifyMeta = first_produced(&view, "coordinate");
    assert_eq!(action.purpose, NotifyPurpose::Flag);
    let notify = last_span(&view, "notify");
    // The agent failed: the deterministic message still asks a human to look.
    assert_eq!(notify.meta["messageSource"], "fallback");
    let message = notify.meta["message"].as_str().expect("message");
    assert!(
        message.contains("maintainer should take a look"),
        "{message}"
    );
    assert!(message.contains("billing code"), "{message}");
}

#[tokio::test]
async fn coordinator_wait_is_scheduled_and_the_next_event_takes_it_over() {
    let fake = FakeGitHub::start().await;
    alices_pr(&fake, "Speed up the build");
    fake.add_check_run(SHA, "ci / test", "in_progress", None);
    let script = json!([
        {"invocation": 1, "structured": coordinate_answer("wait", &json!({"condition": "CI on the PR to finish"}))},
        {"prompt_contains": SUMMARIZE, "structured": {"summary": "Waiting for CI."}},
        {"prompt_contains": NOTIFY, "structured": {"message": "CI passed."}},
        {"prompt_contains": COORDINATE, "structured": coordinate_answer("notify", &json!({"message": "CI passed, merging is up to you."}))},
    ]);
    let (p, orch) = case(&script).github(&fake).build(steps);
    let first = pr_opened(&p);
    let before = Utc::now();
    p.run(&orch).await;
    // The wait is a `coordinate` of the same trace, queued for its deadline (30 minutes).
    let view = p.trace(first);
    assert_chain(&view, "event coordinate");
    let wait_action = &produced(&view, "coordinate")[0];
    assert_eq!(wait_action.action, StepKind::Coordinate);
    assert!(
        wait_action
            .reason
            .starts_with("waiting: CI on the PR to finish (re-evaluated at "),
        "{}",
        wait_action.reason
    );
    let scheduled: meta::CoordinateMeta = meta::read(wait_action).expect("coordinate meta");
    let wait = scheduled.wait.expect("a wait");
    assert_eq!(wait.subject.as_deref(), Some("#12"));
    assert_eq!(wait.round, 1);
    let state = p.store.read_state().unwrap();
    assert_eq!(state.pending.len(), 1);
    let due = state.pending[0].not_before.expect("scheduled");
    assert!(due >= before + chrono::Duration::seconds(1800), "{due}");
    // The queue keeps milliseconds.
    assert_eq!(
        scheduled.not_before.map(|t| t.timestamp_millis()),
        Some(due.timestamp_millis())
    );

    // A trusted comment on the same PR: its trace decides now, with the wait among its open
    // waits, and the waiting action ends saying which trace took over.
    let second = submit_github(
        &p,
        &on_pr(EventKind::IssueComment, EventAction::Created, 12, "alice"),
    );
    p.run(&orch).await;
    let coordinate = last_span(&p.trace(second), "coordinate");
    assert_eq!(
        coordinate.meta["openWaits"][0]["condition"],
        "CI on the PR to finish"
    );
    assert_eq!(
        coordinate.meta["openWaits"][0]["traceId"],
        first.to_string()
    );
    assert_chain(&p.trace(second), "event coordinate notify");
    let calls = p.agents.calls();
    let prompt = calls
        .iter()
        .rev()
        .find_map(|c| c["prompt"].as_str().filter(|t| t.contains(COORDINATE)))
        .expect("second coordinator prompt");
    assert!(
        prompt.contains("waiting for CI on the PR to finish"),
        "{prompt}"
    );
    assert_chain(&p.trace(first), "event coordinate coordinate noop");
    let taken = last_span(&p.trace(first), "coordinate");
    assert_eq!(taken.meta["supersededBy"], second.to_string());
    assert_eq!(taken.meta["decidedBy"], "wait");
    assert!(p.store.read_state().unwrap().pending.is_empty());

    // Settled: the next event sees no open wait.
    let third = submit_github(
        &p,
        &on_pr(EventKind::IssueComment, EventAction::Created, 12, "alice"),
    );
    p.run(&orch).await;
    assert_eq!(
        last_span(&p.trace(third), "coordinate").meta["openWaits"],
        json!([])
    );
}

#[tokio::test]
async fn an_untrusted_event_does_not_take_over_a_wait() {
    let fake = FakeGitHub::start().await;
    alices_pr(&fake, "Speed up");
    fake.set_permission("mallory", "read");
    let script = json!([
        {"prompt_contains": COORDINATE, "structured": coordinate_answer("wait", &json!({"condition": "CI to finish"}))},
    ]);
    let (p, orch) = case(&script).github(&fake).build(steps);
    let pr = |who: &str| on_pr(EventKind::IssueComment, EventAction::Created, 12, who);
    let first = submit_github(&p, &pr("alice"));
    p.run(&orch).await;
    let mallory = submit_github(&p, &pr("mallory"));
    p.run_as(&orch, mallory, "event coordinate noop").await;
    assert_chain(&p.trace(first), "event coordinate");
    let state = p.store.read_state().unwrap();
    assert_eq!(state.pending.len(), 1);
    assert!(state.pending[0].not_before.is_some());
    assert!(state.pending[0].extra.is_empty(), "{:?}", state.pending[0]);
}

#[tokio::test]
async fn a_ci_outcome_for_the_prs_head_wakes_its_wait_before_the_deadline() {
    let fake = FakeGitHub::start().await;
    alices_pr(&fake, "Speed up");
    fake.add_check_run(SHA, "ci / test", "in_progress", None);
    let script = wait_then_green();
    // The wait lasts 30 minutes (the default).
    let (p, orch) = case(&script).github(&fake).build(steps);
    let trace = pr_opened(&p);
    p.run_as(&orch, trace, "event coordinate").await;
    let wait = &produced(&p.trace(trace), "coordinate")[0];
    assert_eq!(wait.meta["wait"]["headSha"], SHA);

    // A CI outcome for another commit wakes nothing; one for the PR's head wakes the wait. It
    // reaches the wait the way intake hands it on: to the orchestrator, which asks the step.
    let ci = |sha: &str| {
        rover::intake::Signal::Ci(rover::intake::CiOutcome::new(
            sha,
            "check_run completed (success)",
        ))
    };
    let other = "0123456789abcdef0123456789abcdef01234567";
    assert_eq!(
        rover::intake::Queue::signal(&orch, &ci(other))
            .await
            .unwrap(),
        0
    );
    fake.add_check_run(SHA, "ci / lint", "completed", Some("success"));
    assert_eq!(
        rover::intake::Queue::signal(&orch, &ci(&SHA.to_uppercase()))
            .await
            .unwrap(),
        1
    );
    assert_eq!(p.store.read_state().unwrap().pending[0].not_before, None);
    p.run_as(&orch, trace, "event coordinate coordinate notify")
        .await;
    assert_eq!(
        last_span(&p.trace(trace), "coordinate").meta["wait"]["condition"],
        "CI to finish"
    );
}

/// A coordinator that waits, then re-evaluates at the deadline (`waitSecs: 0`: due at once).
fn waiting_config(max_waits: u32) -> RoverConfig {
    let mut c = config();
    c.autopilot.pipeline.wait_secs = 0;
    c.autopilot.pipeline.max_waits = max_waits;
    c
}

#[tokio::test]
async fn a_wait_is_re_evaluated_at_its_deadline_with_what_it_waited_for() {
    let fake = FakeGitHub::start().await;
    alices_pr(&fake, "Speed up");
    let script = wait_then_green();
    let (p, orch) = Case::new(&script)
        .config(waiting_config(3))
        .github(&fake)
        .build(steps);
    let trace = pr_opened(&p);
    let view = p
        .run_as(&orch, trace, "event coordinate coordinate notify")
        .await;
    let again = last_span(&view, "coordinate");
    assert_eq!(again.meta["wait"]["condition"], "CI to finish");
    assert_eq!(again.meta["decision"], "notify");
    let calls = p.agents.calls();
    let prompt = calls
        .iter()
        .filter_map(|c| c["prompt"].as_str())
        .find(|t| t.contains(rover::steps::coordinate::REEVALUATION_HEADING))
        .expect("a re-evaluation prompt");
    assert!(
        prompt.contains("(wait 1 of at most 3)")
            && prompt.contains("for the condition below")
            && prompt.contains(">\nCI to finish\n</untrusted-data"),
        "{prompt}"
    );
}

#[tokio::test]
async fn waits_stop_at_max_waits_with_a_noop_that_says_so() {
    let fake = FakeGitHub::start().await;
    alices_pr(&fake, "Speed up");
    let script = json!([
        {"prompt_contains": COORDINATE, "structured": coordinate_answer("wait", &json!({"condition": "CI to finish"}))},
        {"prompt_contains": SUMMARIZE, "structured": {"summary": "Waited twice for CI."}},
    ]);
    let (p, orch) = Case::new(&script)
        .config(waiting_config(2))
        .github(&fake)
        .build(steps);
    let trace = pr_opened(&p);
    let view = p
        .run_as(&orch, trace, "event coordinate coordinate coordinate noop")
        .await;
    let noop = view.actions.last().unwrap();
    assert!(
        noop.reason.starts_with(
            "waiting: CI to finish (not re-evaluated again: this trace already waited 2 time(s)"
        ),
        "{}",
        noop.reason
    );
}

#[tokio::test]
async fn coordinator_workflow_decision_carries_the_task() {
    let (_p, view) = decided_local(
        coordinate_answer(
            "workflow",
            &json!({"task": {"id": "t1", "title": "Review the auth module",
                "description": "Look for injection", "acceptance_criteria": ["findings listed"],
                "workflow_type": "security-analyst", "depends_on": []}}),
        ),
        vec![],
        "event coordinate workflow",
    )
    .await;
    let workflow: WorkflowMeta = first_produced(&view, "coordinate");
    assert_eq!(workflow.title, "Review the auth module");
    assert_eq!(workflow.description, "Look for injection");
    assert_eq!(workflow.workflow_type, WorkflowType::SecurityAnalyst);
    assert_eq!(workflow.acceptance_criteria, ["findings listed"]);
    assert!(workflow.depends_on.is_empty());
    assert_eq!(workflow.iterate_on, None);
}

#[tokio::test]
async fn merged_rover_pr_is_cleaned_up_without_the_agent() {
    let fake = FakeGitHub::start().await;
    let (p, orch, key) = mapped(&json!([]), &fake);
    let (view, cleanup) = rovers_pr_closed(&fake, &p, &orch, true).await;
    assert_eq!(cleanup.tasks, vec![key]);
    assert_eq!(cleanup.branch.as_deref(), Some(ROVER_BRANCH));
    assert_eq!(last_span(&view, "coordinate").meta["decidedBy"], "rule");
    assert_eq!(p.agents.calls().len(), 0);
}

#[tokio::test]
async fn a_rover_pr_closed_without_merging_frees_every_task_of_its_trace() {
    let fake = FakeGitHub::start().await;
    let p = Pipeline::new();
    // A consolidated pull request: two tasks of one trace, each on its own branch.
    let trace = Uuid::new_v4();
    let (head, other) = (Uuid::new_v4(), Uuid::new_v4());
    p.store
        .transact(|txn| {
            let mappings = &mut txn.state_mut()?.task_mappings;
            let m = TaskMapping::new("task-fix-login", ROVER_BRANCH, trace, Uuid::new_v4());
            mappings.insert(head.to_string(), m);
            let m = TaskMapping::new("task-tests", "rover/task-tests", trace, Uuid::new_v4());
            mappings.insert(other.to_string(), m);
            Ok(())
        })
        .expect("write mappings");
    let unrelated = add_mapping(&p, "rover/elsewhere");
    let (p, orch) = on_fake(p, &json!([]), &fake);
    let (view, cleanup) = rovers_pr_closed(&fake, &p, &orch, false).await;
    assert_eq!(cleanup.tasks, vec![head, other]);
    let reasoning = last_span(&view, "coordinate").meta["reasoning"].to_string();
    assert!(reasoning.contains("closed without merging"), "{reasoning}");
    assert!(
        !cleanup.tasks.contains(&unrelated),
        "another trace's task is left alone"
    );
    assert_eq!(p.agents.calls().len(), 0, "no agent decides it");
}

#[tokio::test]
async fn coordinator_cleanup_decision_names_the_mapped_task() {
    let fake = FakeGitHub::start().await;
    fake.add_issue(3, "Done with the login fix", "", "alice", &[]);
    fake.set_permission("alice", "write");
    let script = json!([{"prompt_contains": COORDINATE,
        "structured": coordinate_answer("cleanup", &json!({"task_id": "task-fix-login"}))}]);
    let (p, orch, key) = mapped(&script, &fake);
    let trace = submit_github(
        &p,
        &on_issue(EventKind::IssueComment, EventAction::Created, 3, "alice"),
    );
    p.run_as(&orch, trace, "event coordinate cleanup").await;
    let cleanup: CleanupMeta = first_produced(&p.trace(trace), "coordinate");
    assert_eq!(cleanup.tasks, vec![key]);
    assert_eq!(cleanup.branch.as_deref(), Some(ROVER_BRANCH));
    // The mappings were in the prompt.
    let calls = p.agents.calls();
    let prompt = prompt_of(&calls, 0);
    assert!(
        prompt.contains("task `task-fix-login`: branch `rover/task-fix-login`"),
        "{prompt}"
    );
}

#[tokio::test]
async fn feedback_on_a_rover_pr_plans_an_iteration_of_its_task() {
    let fake = FakeGitHub::start().await;
    fake.add_pull(7, "Fix login", BOT, ROVER_BRANCH, SHA, "main");
    fake.add_review(
        7,
        "alice",
        "CHANGES_REQUESTED",
        "Please also handle logout.",
    );
    fake.set_permission("alice", "write");
    let script = json!([
        {"prompt_contains": COORDINATE,
         "structured": coordinate_answer("plan", &json!({"directive": "Handle logout as the review asks"}))},
        {"prompt_contains": PLAN, "structured": {"analysis": "one change", "tasks": [task("logout", &[])], "clarification": null}},
    ]);
    let (p, orch, key) = mapped(&script, &fake);
    let trace = submit_github(
        &p,
        &event(
            EventKind::PullRequestReview,
            Some(EventAction::Submitted),
            Some(7),
            "alice",
            Channel::PrReview { number: 7 },
        ),
    );
    let view = p
        .run_as(&orch, trace, "event coordinate plan workflow")
        .await;
    let plan: PlanMeta = first_produced(&view, "coordinate");
    assert_eq!(plan.existing_task, Some(key));
    assert_eq!(plan.branch.as_deref(), Some(ROVER_BRANCH));
    let workflow: WorkflowMeta = first_produced(&view, "plan");
    assert_eq!(workflow.iterate_on, Some(key));
    assert_eq!(workflow.branch.as_deref(), Some(ROVER_BRANCH));
    let calls = p.agents.calls();
    assert!(prompt_of(&calls, 0).contains("a pull request rover opened"));
    let plan_prompt = prompt_of(&calls, 1);
    assert!(plan_prompt.contains("Iterate on the rover task below"));
    assert!(plan_prompt.contains("task: task-fix-login"));
}

#[tokio::test]
async fn planner_wires_a_dependency_between_two_tasks() {
    let (_p, view) = decided_local(
        coordinate_answer("plan", &json!({"directive": "Add remember-me with tests"})),
        vec![json!({"prompt_contains": PLAN, "structured": {"analysis": "two steps",
            "tasks": [task("impl", &[]), {"id": "tests", "title": "Add tests", "description": "Test it",
                "acceptance_criteria": ["tests pass"], "workflow_type": "bug-finder", "depends_on": ["impl"]}],
            "clarification": null}})], "event coordinate plan workflow workflow").await;
    let actions = produced(&view, "plan");
    assert_eq!(actions.len(), 2);
    let first: WorkflowMeta = meta::read(&actions[0]).expect("meta");
    let second: WorkflowMeta = meta::read(&actions[1]).expect("meta");
    assert_eq!(first.title, "Task impl");
    assert!(first.depends_on.is_empty());
    assert_eq!(first.acceptance_criteria, ["impl done"]);
    assert_eq!(second.workflow_type, WorkflowType::BugFinder);
    assert_eq!(
        second.depends_on,
        vec![actions[0].id],
        "dependsOn names the action id"
    );
    let plan = last_span(&view, "plan");
    assert_eq!(plan.meta["tasks"][1]["actionId"], actions[1].id.to_string());
    assert_eq!(plan.meta["tasks"][1]["dependsOn"][0], "impl");
}

#[tokio::test]
async fn planner_cycle_is_rejected_and_reported() {
    let cyclic = json!({"analysis": "loops", "clarification": null,
        "tasks": [task("a", &["b"]), task("b", &["a"])]});
    let (_p, view) = decided_local(
        coordinate_answer("plan", &json!({"directive": "Do a and b"})),
        vec![
            json!({"prompt_contains": PLAN, "structured": cyclic}),
            json!({"prompt_contains": "rejected", "structured": cyclic}),
            json!({"prompt_contains": NOTIFY, "mode": "api_error", "status": 401}),
        ],
        "event coordinate plan:error notify",
    )
    .await;
    let plan = last_span(&view, "plan");
    let message = plan.meta["error"]["message"].as_str().expect("message");
    assert!(message.contains("cycle"), "{message}");
    let invalid = plan.meta["error"]["invalidAnswer"]
        .as_str()
        .expect("invalidAnswer");
    assert!(
        invalid.starts_with("task dependencies form a cycle among `"),
        "{invalid}"
    );
    assert!(view.actions.iter().all(|a| a.action != StepKind::Workflow));
    // Fail-forward: the failure is told on the (local, private) channel.
    let notify = last_span(&view, "notify");
    let told = notify.meta["message"].as_str().expect("message");
    assert!(told.contains("the plan step failed"), "{told}");
    assert!(
        told.contains("cycle"),
        "private channels get the error: {told}"
    );
}

#[tokio::test]
async fn planner_clarification_becomes_a_notify_with_the_question() {
    let (_p, view) = decided_local(
        coordinate_answer("plan", &json!({"directive": "Improve the login"})),
        vec![
            json!({"prompt_contains": PLAN, "structured": {"analysis": "vague", "tasks": [],
                "clarification": "Should remember-me last 7 or 30 days?"}}),
            json!({"prompt_contains": NOTIFY, "mode": "api_error", "status": 401}),
        ],
        "event coordinate plan notify",
    )
    .await;
    let ask: NotifyMeta = first_produced(&view, "plan");
    assert_eq!(ask.purpose, NotifyPurpose::Clarify);
    assert_eq!(
        ask.message.as_deref(),
        Some("Should remember-me last 7 or 30 days?")
    );
    assert_eq!(
        last_span(&view, "notify").meta["message"],
        "Should remember-me last 7 or 30 days?"
    );
}

/// Run one notify on a fake GitHub channel; returns the notify span's meta.
async fn notify_on(
    fake: &FakeGitHub,
    e: &NormalizedEvent,
    notify: &NotifyMeta,
    script: Value,
) -> (Pipeline, Uuid, Uuid) {
    let (p, orch) = case(&script)
        .github(fake)
        .build(|s| vec![Arc::new(NotifyStep::new(s.clone()))]);
    let (trace, action) = submit_notify(&p, e, notify);
    p.run_as(&orch, trace, "event notify").await;
    (p, trace, action)
}

fn answer_notify(message: &str) -> Value {
    json!([{"prompt_contains": NOTIFY, "structured": {"message": message}}])
}

#[tokio::test]
async fn notify_posts_on_each_github_channel() {
    let fake = FakeGitHub::start().await;
    fake.add_issue(5, "Login broken", "It fails", "alice", &[]);
    fake.add_pull(7, "Fix login", BOT, ROVER_BRANCH, SHA, "main");
    let thread = fake.add_review_comment(7, "alice", "Why this?", None);

    // Issue comment, after a push: the PR link.
    let pushed = NotifyMeta {
        purpose: NotifyPurpose::Pushed,
        pr_url: Some("https://github.com/octo-org/widgets/pull/7".into()),
        ..NotifyMeta::default()
    };
    let issue = on_issue(EventKind::Issues, EventAction::Opened, 5, "alice");
    let (p, trace, _) = notify_on(
        &fake,
        &issue,
        &pushed,
        answer_notify("Fixed in https://github.com/octo-org/widgets/pull/7"),
    )
    .await;
    let bodies = fake.comment_bodies(5);
    assert_eq!(bodies.len(), 1);
    assert!(bodies[0].starts_with("Fixed in https://github.com/octo-org/widgets/pull/7"));
    assert!(bodies[0].contains(&format!("rover:trace={trace}")));
    let span = last_span(&p.trace(trace), "notify");
    assert_eq!(span.meta["channel"]["kind"], "issueComment");
    assert!(span.meta["url"].as_str().expect("url").contains("issues/5"));
    assert_eq!(span.meta["alreadyPosted"], false);
    // The notifier was told about the PR.
    let prompt = prompt_of(&p.agents.calls(), 0).to_owned();
    assert!(prompt.contains("pull request: https://github.com/octo-org/widgets/pull/7"));

    // Review findings on a PR conversation go out as a PR review.
    let review = NotifyMeta {
        purpose: NotifyPurpose::Review,
        message: Some("Two findings.".into()),
        ..NotifyMeta::default()
    };
    let pr = on_pr(
        EventKind::PullRequest,
        EventAction::ReviewRequested,
        7,
        "alice",
    );
    let (p, trace, _) =
        notify_on(&fake, &pr, &review, answer_notify("1. null check\n2. typo")).await;
    let reviews = fake.review_bodies(7);
    assert_eq!(reviews.len(), 1);
    assert!(reviews[0].starts_with("1. null check\n2. typo"));
    assert_eq!(
        last_span(&p.trace(trace), "notify").meta["channel"]["kind"],
        "prReview"
    );
    assert!(fake.comment_bodies(7).is_empty());

    // A reply in the review thread.
    let reply = event(
        EventKind::PullRequestReviewComment,
        Some(EventAction::Created),
        Some(7),
        "alice",
        Channel::ReviewThreadReply {
            number: 7,
            comment_id: thread,
        },
    );
    let answer = NotifyMeta {
        message: Some("Because of X.".into()),
        ..NotifyMeta::default()
    };
    notify_on(
        &fake,
        &reply,
        &answer,
        answer_notify("Because of the retry loop."),
    )
    .await;
    let replies = fake.review_comment_bodies(7);
    assert_eq!(replies.len(), 2, "{replies:?}");
    assert!(replies[1].starts_with("Because of the retry loop."));

    // A comment on the pushed commit.
    let push = event(
        EventKind::Push,
        None,
        None,
        "alice",
        Channel::CommitComment { sha: SHA.into() },
    );
    notify_on(&fake, &push, &answer, answer_notify("CI is green again.")).await;
    let on_commit = fake.commit_comment_bodies(SHA);
    assert_eq!(on_commit.len(), 1);
    assert!(on_commit[0].starts_with("CI is green again."));
    assert!(
        fake.unknown_requests().is_empty(),
        "{:?}",
        fake.unknown_requests()
    );
}

#[tokio::test]
async fn notify_after_a_crash_finds_its_post_and_does_not_post_twice() {
    let fake = FakeGitHub::start().await;
    fake.add_issue(5, "Login broken", "It fails", "alice", &[]);
    let (p, orch) = case(&answer_notify("Fixed in #7."))
        .github(&fake)
        .build(|s| vec![Arc::new(NotifyStep::new(s.clone()))]);
    let e = on_issue(EventKind::Issues, EventAction::Opened, 5, "alice");
    let answer = NotifyMeta {
        message: Some("Fixed in #7.".into()),
        ..NotifyMeta::default()
    };
    let (trace, action) = submit_notify(&p, &e, &answer);
    // The earlier run posted, then the process died before recording its span.
    let earlier = fake.add_comment(
        5,
        BOT,
        &compose("Fixed in #7.", &trace.to_string(), &action.to_string()),
    );
    p.run_as(&orch, trace, "event notify").await;
    assert_eq!(fake.comment_bodies(5).len(), 1, "no second post");
    let span = last_span(&p.trace(trace), "notify");
    assert_eq!(span.meta["alreadyPosted"], true);
    assert_eq!(span.meta["commentId"], earlier);
    assert!(span
        .summary
        .expect("summary")
        .starts_with("found the earlier post"));
}

#[tokio::test]
async fn public_failure_messages_carry_no_paths_and_no_token() {
    let fake = FakeGitHub::start().await;
    fake.add_issue(5, "Login broken", "It fails", "alice", &[]);
    let e = on_issue(EventKind::Issues, EventAction::Opened, 5, "alice");
    let error = format!(
        "git push failed in /home/rover/.local/share/rover/worktrees/abc: remote said token {TOKEN} is invalid"
    );
    let failure = NotifyMeta::failure(&StepKind::Push, &error);

    // The agent echoes the internals: redaction still removes them.
    let leaky =
        format!("Push failed at /home/rover/.local/share/rover/worktrees/abc using {TOKEN}.");
    let (p, _, _) = notify_on(&fake, &e, &failure, answer_notify(&leaky)).await;
    // The token never reached the notifier's prompt either.
    let prompt = prompt_of(&p.agents.calls(), 0).to_owned();
    assert!(!prompt.contains(TOKEN));
    // The agent fails: the deterministic message names the step only.
    notify_on(
        &fake,
        &e,
        &failure,
        json!([{"prompt_contains": NOTIFY, "mode": "api_error", "status": 401}]),
    )
    .await;

    let bodies = fake.comment_bodies(5);
    assert_eq!(bodies.len(), 2);
    for body in &bodies {
        assert!(!body.contains(TOKEN), "{body}");
        assert!(!body.contains("/home/"), "{body}");
        assert!(!body.contains("worktrees"), "{body}");
    }
    assert!(
        bodies[0].starts_with("Push failed at [path]"),
        "{}",
        bodies[0]
    );
    assert!(
        bodies[1].starts_with("I could not finish this: the push step failed."),
        "{}",
        bodies[1]
    );
}

#[tokio::test]
async fn coordinator_prompt_has_event_thread_ci_and_trace_but_never_the_token() {
    let fake = FakeGitHub::start().await;
    alices_pr(&fake, "Speed up the build");
    fake.add_comment(12, "bob", "The cache key looks wrong to me.");
    fake.add_comment(12, "carol", &format!("here is my token {TOKEN}, try it"));
    fake.add_check_run(SHA, "ci / lint", "completed", Some("failure"));
    let script = json!([{"prompt_contains": COORDINATE, "structured": coordinate_answer("noop", &json!({}))}]);
    let (p, services) = case(&script)
        .github(&fake)
        .adjust(|services, _| {
            services.github_token = Some(TOKEN.into());
            services.redactor = rover::github::Redactor::new([TOKEN]);
        })
        .services();
    let orch = p.orchestrator(vec![
        Arc::new(CoordinateStep::new(services.clone())),
        Arc::new(NoopStep),
    ]);
    let mut e = on_pr(EventKind::IssueComment, EventAction::Created, 12, "alice");
    e.body = Some("@rover please fix the lint failure".into());
    let trace = submit_github(&p, &e);
    p.run_as(&orch, trace, "event coordinate noop").await;

    let calls = p.agents.calls();
    assert_eq!(calls.len(), 1);
    let prompt = prompt_of(&calls, 0);
    let system = calls[0]["systemPrompt"].as_str().unwrap_or_default();
    // The event.
    assert!(
        prompt.contains("IssueCommentEvent created #12 by alice"),
        "{prompt}"
    );
    assert!(
        prompt.contains("@rover please fix the lint failure"),
        "{prompt}"
    );
    // The thread, marked as untrusted data.
    assert!(
        prompt.contains("The cache key looks wrong to me."),
        "{prompt}"
    );
    assert!(
        prompt.contains("<untrusted-data id=\"")
            && prompt.contains("\" source=\"github octo-org/widgets\">"),
        "{prompt}"
    );
    // CI status.
    assert!(prompt.contains("## CI for"), "{prompt}");
    assert!(prompt.contains("failing: ci / lint"), "{prompt}");
    // The trace so far.
    assert!(prompt.contains("## Trace so far"), "{prompt}");
    assert!(
        prompt.contains("- event [completed]: IssueCommentEvent"),
        "{prompt}"
    );
    // Never the token, wherever it came from.
    assert!(!prompt.contains(TOKEN), "{prompt}");
    assert!(!system.contains(TOKEN));
    assert!(
        !calls[0].to_string().contains(TOKEN),
        "no token in argv or env"
    );
}

#[tokio::test]
async fn coordinator_agent_failure_fails_forward_to_notify() {
    let script = json!([
        {"prompt_contains": COORDINATE, "mode": "api_error", "status": 401},
        {"prompt_contains": NOTIFY, "structured": {"message": "Rover could not decide: the model API refused the key."}},
    ]);
    let (p, orch) = case(&script).build(steps);
    let trace = p.submit("Fix the flaky test");
    let view = p
        .run_as(&orch, trace, "event coordinate:error notify")
        .await;
    let coordinate = last_span(&view, "coordinate");
    assert_eq!(coordinate.meta["error"]["errorClass"], "auth");
    assert_eq!(coordinate.meta["error"]["agentStep"], "coordinate");
    assert_eq!(coordinate.meta["error"]["retryable"], false);
    let failure: NotifyMeta = first_produced(&view, "coordinate");
    assert_eq!(failure.purpose, NotifyPurpose::Failure);
    assert_eq!(failure.failed_step.as_deref(), Some("coordinate"));
    assert_eq!(
        last_span(&view, "notify").meta["message"],
        "Rover could not decide: the model API refused the key."
    );
}

#[tokio::test]
async fn clarification_is_asked_on_the_issue_and_the_reply_proceeds() {
    let fake = FakeGitHub::start().await;
    fake.add_issue(20, "Make login better", "It is bad.", "alice", &[]);
    fake.set_permission("alice", "write");
    // Invocations: 1 coordinate, 2 plan (asks), 3 notify; 4 coordinate, 5 plan (tasks).
    let script = json!([
        {"prompt_contains": COORDINATE, "structured": coordinate_answer("plan", &json!({"directive": "Improve login"}))},
        {"invocation": 2, "structured": {"analysis": "vague", "tasks": [], "clarification": "Which part: speed or remember-me?"}},
        {"prompt_contains": PLAN, "structured": {"analysis": "clear now", "tasks": [task("remember", &[])], "clarification": null}},
        {"prompt_contains": NOTIFY, "structured": {"message": "Which part should I improve: speed or remember-me?"}},
    ]);
    let (p, orch) = case(&script).github(&fake).build(steps);
    let opened = submit_github(
        &p,
        &on_issue(EventKind::Issues, EventAction::Opened, 20, "alice"),
    );
    p.run_as(&orch, opened, "event coordinate plan notify")
        .await;
    let asked = fake.comment_bodies(20);
    assert_eq!(asked.len(), 1);
    assert!(asked[0].starts_with("Which part should I improve"));

    fake.add_comment(20, "alice", "Remember-me, please.");
    let mut reply = on_issue(EventKind::IssueComment, EventAction::Created, 20, "alice");
    reply.body = Some("Remember-me, please.".into());
    let replied = submit_github(&p, &reply);
    p.run_as(&orch, replied, "event coordinate plan workflow")
        .await;
    // The second coordinator saw rover's question (marked as rover's) and the answer.
    let calls = p.agents.calls();
    let prompt = prompt_of(&calls, 3);
    assert!(prompt.contains(COORDINATE), "{prompt}");
    assert!(prompt.contains("(rover, earlier)"), "{prompt}");
    assert!(prompt.contains("Which part should I improve"), "{prompt}");
    assert!(prompt.contains("Remember-me, please."), "{prompt}");
    assert_eq!(fake.comment_bodies(20).len(), 2, "no further post");
}
