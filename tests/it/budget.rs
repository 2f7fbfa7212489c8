//! Budgets, the circuit breaker, hourly caps and stuck detection on the real orchestrator and
//! steps (the fake agent reports its cost, `total_cost_usd` 0.000235 per call), the real
//! `rover` binary for `status`, `resume` and `trace`, and a real Docker engine for a workflow
//! container that sleeps silently.

use std::sync::Arc;
use std::time::Duration;

use rover::budget::{Budget, Ledger};
use rover::orchestrator::StepOrchestrator;
use rover::sandbox::Sandbox;
use rover::steps::workflow::WorkflowStep;
use rover::steps::NoopStep;
use rover::store::{Action, Meta, Span, SpanStatus, StepKind};
use serde_json::{json, Value};
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use crate::support::chain::assert_chain;
use crate::support::docker::{connect, fake_agent_image};
use crate::support::env::{stderr, stdout};
use crate::support::pipeline::{
    first_span, notify_action, sandbox_config, Sandboxed, StepsWorld, SCRIPT_ENV,
};

#[tokio::test]
async fn trace_shows_per_step_cost_and_the_total_and_status_shows_the_spend() {
    let w = StepsWorld::new(&json!({"day": {"usd": 5.0}, "month": {"usd": 50.0}}));
    let trace = w.p.submit("what is the export format?");
    w.settle().await;
    assert_chain(&w.p.trace(trace), "event coordinate notify");

    let text = w.rover_ok(&["trace", &trace.to_string()]);
    let cost_lines: Vec<&str> = text.lines().filter(|l| l.contains(" tok")).collect();
    // The total line and one line per agent call (coordinate, notify).
    assert!(text.contains("cost     $0.0005 · "), "{text}");
    assert!(text.contains("in 2 agent call(s)"), "{text}");
    assert_eq!(cost_lines.len(), 3, "{text}");
    assert!(
        cost_lines
            .iter()
            .any(|l| l.contains("coordinate") && l.contains("$0.0002")),
        "{text}"
    );

    let json: Value =
        serde_json::from_str(&w.rover_ok(&["trace", &trace.to_string(), "--json"])).unwrap();
    let total = json["cost"]["total"]["costUsd"].as_f64().unwrap();
    assert!((total - 0.000_47).abs() < 1e-9, "{json}");
    assert_eq!(json["cost"]["steps"].as_array().unwrap().len(), 2);
    assert!(json["cost"]["total"]["inputTokens"].as_u64().unwrap() > 0);

    let status = w.rover_ok(&["status"]);
    assert!(
        status.contains("spend    today $0.0005 of $5.00"),
        "{status}"
    );
    assert!(status.contains("this month $0.0005 of $50.00"), "{status}");
    assert!(
        status.contains("breaker  closed (0 failed trace(s) in a row)"),
        "{status}"
    );
    let status: Value = serde_json::from_str(&w.rover_ok(&["status", "--json"])).unwrap();
    assert!((status["budget"]["today"]["costUsd"].as_f64().unwrap() - 0.000_47).abs() < 1e-9);

    // The ledger is a cache: rebuilt from the spans it says the same.
    let ledger = Ledger::load(&w.p.store).unwrap();
    let rebuilt = Ledger::rebuild(&w.p.store).unwrap();
    assert_eq!(ledger.days, rebuilt.days);
    let usage = |l: &Ledger| l.traces.values().map(|t| t.usage).collect::<Vec<_>>();
    assert_eq!(usage(&ledger), usage(&rebuilt));
}

#[tokio::test]
async fn codex_calls_are_priced_from_the_price_table_so_a_usd_limit_stops_the_trace() {
    // The fake codex reports 100 input tokens (40 cached) and 20 output per call, no USD.
    let w = StepsWorld::with(&json!({"autopilot": {
        "agent": {"agent": "codex", "codexPrices": {
            "default": {"inputPerMTok": 1000, "cachedInputPerMTok": 100, "outputPerMTok": 10000}}},
        "budget": {"trace": {"usd": 0.1, "action": "stop"}}}}));
    let trace = w.p.submit("a question");
    w.settle().await;
    let view = w.p.trace(trace);
    let coordinate = first_span(&view, "coordinate");
    // (60 × 1000 + 40 × 100 + 20 × 10000) / 1e6 = 0.264.
    let cost = coordinate.meta["agent"]["costUsd"]
        .as_f64()
        .expect("a USD cost");
    assert!((cost - 0.264).abs() < 1e-9, "{:?}", coordinate.meta);
    assert_eq!(coordinate.meta["budgetStopped"], json!(true));
    let notify = notify_action(&view).expect("a notify");
    assert_eq!(notify.meta["purpose"], json!("budget"), "{:?}", notify.meta);
    assert!(
        notify.reason.contains("autopilot.budget.trace.usd"),
        "{}",
        notify.reason
    );
    let json: Value =
        serde_json::from_str(&w.rover_ok(&["trace", &trace.to_string(), "--json"])).unwrap();
    let total = json["cost"]["total"]["costUsd"].as_f64().unwrap();
    assert!(total >= 0.264 - 1e-9, "{json}");
    // Every call went to codex with the mapped key.
    let calls = w.p.agents.calls();
    assert!(!calls.is_empty());
    assert!(calls.iter().all(|c| c["personality"] == "codex"));
}

#[tokio::test]
async fn a_daily_warn_notes_the_trace_and_work_goes_on() {
    let w = StepsWorld::new(&json!({"day": {"usd": 0.0003, "action": "warn"}}));
    let trace = w.p.submit("first question");
    w.settle().await;
    let view = w.p.trace(trace);
    // The notify's call crossed the limit: noted in its span; the trace ended normally.
    let notify = first_span(&view, "notify");
    let warnings = notify.meta["budgetWarnings"].to_string();
    assert!(warnings.contains("daily budget"), "{warnings}");
    let tree = w.rover_ok(&["trace", &trace.to_string()]);
    assert!(
        tree.contains("budget warning: the daily budget is spent"),
        "{tree}"
    );
    let second = w.p.submit("second question");
    w.settle().await;
    assert_chain(&w.p.trace(second), "event coordinate notify");
    assert!(w.waiting_reasons().is_empty());
}

#[tokio::test]
async fn a_daily_pause_holds_new_traces_in_the_queue_and_status_says_why() {
    let w = StepsWorld::new(&json!({"day": {"usd": 0.0003, "action": "pause"}}));
    let first = w.p.submit("first question");
    w.settle().await;
    // Running work finished although it crossed the limit.
    assert_chain(&w.p.trace(first), "event coordinate notify");
    let second = w.p.submit("second question");
    w.settle().await;
    // The new event has its span and a queued coordinate that does not start.
    assert_chain(&w.p.trace(second), "event");
    let pending = w.p.store.read_state().unwrap().pending;
    assert_eq!(pending.len(), 1);
    assert_eq!(pending[0].action, StepKind::Coordinate);
    let reasons = w.waiting_reasons();
    assert!(
        reasons.iter().any(|r| r.contains("daily budget")),
        "{reasons:?}"
    );
    let status = w.rover_ok(&["status"]);
    assert!(
        status.contains("paused   new traces wait: the daily budget is spent"),
        "{status}"
    );
}

#[tokio::test]
async fn a_trace_token_limit_stops_the_trace_with_a_budget_notify() {
    let w = StepsWorld::new(&json!({"trace": {"tokens": 1, "action": "stop"}}));
    let trace = w.p.submit("a question");
    w.settle().await;
    let view = w.p.trace(trace);
    assert_chain(&w.p.trace(trace), "event coordinate notify");
    let coordinate = first_span(&view, "coordinate");
    assert_eq!(coordinate.meta["budgetStopped"], json!(true));
    let notify = notify_action(&view).expect("a notify");
    assert_eq!(notify.meta["purpose"], json!("budget"), "{:?}", notify.meta);
    assert!(notify.reason.contains("tokens"), "{}", notify.reason);
}

/// The trace answered once: after a restart, a late action of a trace a budget stopped is
/// closed without a second budget notify (the first is in the store).
#[tokio::test]
async fn a_stopped_trace_gets_no_second_budget_notify_after_a_restart() {
    let budget = json!({"trace": {"tokens": 1, "action": "stop"}});
    let w = StepsWorld::new(&budget);
    let trace = w.p.submit("a question");
    w.settle().await;
    let view = w.p.trace(trace);
    let coordinate = first_span(&view, "coordinate");
    assert_eq!(coordinate.meta["budgetStopped"], json!(true));
    // A late action of the stopped trace (e.g. a detached run's result) is still queued when
    // rover restarts.
    let late = Action::new(
        StepKind::Plan,
        coordinate,
        "a late plan".to_owned(),
        Meta::new(),
        chrono::Utc::now(),
    );
    w.p.store.enqueue(&late, trace).unwrap();
    let w = w.restart(&json!({"autopilot": {"budget": budget}}));
    w.settle().await;
    let view = w.p.trace(trace);
    let notifies: Vec<_> = view
        .actions
        .iter()
        .filter(|a| a.action == StepKind::Notify)
        .collect();
    assert_eq!(notifies.len(), 1, "{:?}", w.chain(trace));
    let plan = first_span(&view, "plan");
    assert_eq!(plan.status, SpanStatus::Error);
    assert_eq!(plan.meta["budgetStopped"], json!(true));
    assert!(view.pending.is_empty(), "{:?}", view.pending);
}

#[tokio::test]
async fn a_daily_stop_cancels_a_running_agent_and_its_trace_ends_with_a_budget_notify() {
    let w = StepsWorld::new(&json!({"day": {"usd": 0.0001, "action": "stop"}}));
    let slow = w.p.submit("SLOWME please");
    // Start the slow trace's coordinator (its agent hangs), then a fast one that spends.
    w.orch.drain().await.unwrap();
    let fast = w.p.submit("a quick question");
    w.settle().await;
    let view = w.p.trace(slow);
    let coordinate = first_span(&view, "coordinate");
    assert_eq!(coordinate.status, SpanStatus::Error);
    assert_eq!(coordinate.meta["budgetStopped"], json!(true));
    assert!(coordinate
        .summary
        .as_deref()
        .unwrap_or_default()
        .contains("stopped by a budget"));
    assert_eq!(
        notify_action(&view).unwrap().meta["purpose"],
        json!("budget")
    );
    assert_eq!(w.chain(slow).last().unwrap(), "notify:completed");
    // The fast trace crossed the limit with its own call: it ends with a budget notify too.
    let fast_view = w.p.trace(fast);
    assert_eq!(
        notify_action(&fast_view).unwrap().meta["purpose"],
        json!("budget")
    );
    // And nothing new starts.
    let third = w.p.submit("another");
    w.settle().await;
    assert_chain(&w.p.trace(third), "event");
}

#[tokio::test]
async fn a_trace_wall_time_limit_stops_a_hanging_agent() {
    let w = StepsWorld::new(&json!({"trace": {"wallSecs": 1, "action": "stop"}}));
    let trace = w.p.submit("SLOWME please");
    tokio::time::timeout(
        Duration::from_secs(60),
        w.orch.run_until_idle(CancellationToken::new()),
    )
    .await
    .expect("the stop ends the hanging run")
    .unwrap();
    let view = w.p.trace(trace);
    let coordinate = first_span(&view, "coordinate");
    assert_eq!(coordinate.meta["budgetStopped"], json!(true));
    assert!(
        coordinate.summary.as_deref().unwrap().contains("wallSecs"),
        "{:?}",
        coordinate.summary
    );
    assert_eq!(
        notify_action(&view).unwrap().meta["purpose"],
        json!("budget")
    );
}

#[tokio::test]
async fn the_circuit_breaker_trips_after_n_failed_traces_and_resume_lifts_it() {
    let w =
        StepsWorld::new(&json!({"circuitBreaker": {"maxConsecutiveFailures": 2, "notify": true}}));
    let a = w.p.submit("FAILME one");
    w.settle().await;
    let b = w.p.submit("FAILME two");
    w.settle().await;
    for t in [a, b] {
        let view = w.p.trace(t);
        assert_eq!(first_span(&view, "coordinate").status, SpanStatus::Error);
    }
    // The second failure tripped it, and its failure answer said so: one answer per trace.
    let view = w.p.trace(b);
    let notifies: Vec<_> = view
        .spans
        .iter()
        .filter(|s| s.step == StepKind::Notify)
        .collect();
    assert_eq!(notifies.len(), 1, "{:?}", w.chain(b));
    let message = notifies[0].meta["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("rover paused itself: circuit breaker open: 2 traces failed in a row")
            && message.contains("rover autopilot resume"),
        "{message}"
    );
    assert_eq!(notifies[0].meta["circuitBreakerTripped"], json!(true));
    assert!(rover::store::RunSpanMeta::of(notifies[0]).circuit_breaker_tripped);
    let first = w.p.trace(a);
    let message = first_span(&first, "notify").meta["message"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    assert!(!message.contains("paused itself"), "{message}");
    let status = w.rover_ok(&["status"]);
    assert!(status.contains("breaker  OPEN since"), "{status}");
    assert!(status.contains("2 traces failed in a row"), "{status}");

    let c = w.p.submit("a fine question");
    w.settle().await;
    assert_eq!(
        w.chain(c),
        ["event:completed"],
        "held while the breaker is open"
    );
    assert!(w
        .waiting_reasons()
        .iter()
        .any(|r| r.contains("circuit breaker")));

    // Another process lifts it; the daemon sees it at its next drain.
    let out = w.rover_ok(&["resume"]);
    assert!(out.contains("circuit breaker closed"), "{out}");
    w.settle().await;
    assert_chain(&w.p.trace(c), "event coordinate notify");
    let status = w.rover_ok(&["status"]);
    assert!(
        status.contains("breaker  closed (0 failed trace(s) in a row)"),
        "{status}"
    );
    assert!(w.rover_ok(&["resume"]).contains("was not open"));
}

#[tokio::test]
async fn a_success_between_failures_keeps_the_breaker_closed() {
    let w = StepsWorld::new(&json!({"circuitBreaker": {"maxConsecutiveFailures": 2}}));
    for request in ["FAILME one", "fine", "FAILME two"] {
        w.p.submit(request);
        w.settle().await;
    }
    let ledger = Ledger::load(&w.p.store).unwrap();
    assert_eq!(ledger.breaker.consecutive_failures, 1);
    assert!(ledger.breaker.tripped.is_none());
}

#[tokio::test]
async fn the_traces_per_hour_cap_holds_work_with_the_reason_in_status() {
    let w = StepsWorld::new(&json!({"caps": {"tracesPerHour": 1}}));
    let a = w.p.submit("one");
    let b = w.p.submit("two");
    w.settle().await;
    let done = [a, b].iter().filter(|t| w.chain(**t).len() == 3).count();
    assert_eq!(done, 1, "one trace ran, the other waits");
    assert!(w
        .waiting_reasons()
        .iter()
        .any(|r| r.contains("tracesPerHour")));
    let status = w.rover_ok(&["status"]);
    assert!(status.contains("hourly   1 trace(s) started"), "{status}");
    assert!(
        status.contains("cap 1, autopilot.budget.caps.tracesPerHour"),
        "{status}"
    );
    let json: Value = serde_json::from_str(&w.rover_ok(&["status", "--json"])).unwrap();
    assert_eq!(json["budget"]["tracesLastHour"], json!(1));
}

#[tokio::test]
async fn the_prs_per_hour_cap_holds_pushes() {
    let w = StepsWorld::new(&json!({"caps": {"prsPerHour": 1}}));
    // A PR opened a minute ago (as the push step records it) fills the cap.
    Ledger::update(&w.p.store, |l| l.prs_opened.push(chrono::Utc::now())).unwrap();
    let (root, _) =
        rover::intake::local_trace(&rover::steps::kinds::FIRST_STEP, "push it", "tester");
    let push = Action::new(
        StepKind::Push,
        &root,
        "push the branch",
        rover::store::Meta::new(),
        chrono::Utc::now(),
    );
    w.p.store.create_trace(&root, Some(&push), &[]).unwrap();
    w.settle().await;
    assert_eq!(w.chain(root.id), ["event:completed"]);
    assert!(
        w.waiting_reasons().iter().any(|r| r.contains("prsPerHour")),
        "{:?}",
        w.waiting_reasons()
    );
    assert!(w
        .rover_ok(&["status"])
        .contains("paused   pushes wait: 1 pull requests opened"));
}

// ---- stuck detection ------------------------------------------------------------------------

/// A pipeline with the workflow step over a real engine whose container agent hangs silently
/// (it prints its init line, then sleeps: no output, no file change), and one workflow queued.
struct WorkflowWorld {
    s: Sandboxed,
    orch: StepOrchestrator,
    trace: Uuid,
    workflow: Uuid,
}

impl std::ops::Deref for WorkflowWorld {
    type Target = Sandboxed;
    fn deref(&self) -> &Sandboxed {
        &self.s
    }
}

impl WorkflowWorld {
    async fn new(budget: rover::budget::BudgetSettings) -> WorkflowWorld {
        let env_allow = vec![SCRIPT_ENV.to_owned(), "IS_SANDBOX".to_owned()];
        let docker = Arc::new(connect(env_allow.clone()).await);
        let image = fake_agent_image(&docker).await;
        let s = Sandboxed::new("budget-wf");
        let mut config = sandbox_config(&image, 300, env_allow, Vec::new());
        config.autopilot.budget = budget;
        let services = s.services(
            &json!([]),
            config.clone(),
            Some(docker.clone() as Arc<dyn Sandbox>),
        );
        let sandbox_script = json!([{"prompt_contains": "## Task: Silent", "mode": "hang"}]);
        let steps: Vec<Arc<dyn rover::orchestrator::Step>> = vec![
            Arc::new(
                WorkflowStep::new(services.clone())
                    .with_sandbox_env(SCRIPT_ENV, sandbox_script.to_string()),
            ),
            Arc::new(NoopStep),
        ];
        let orch =
            s.p.orchestrator(steps)
                .with_budget(Budget::new(config.autopilot.budget));
        let meta = serde_json::to_value(rover::steps::meta::WorkflowMeta {
            title: "Silent".into(),
            description: "do it".into(),
            acceptance_criteria: vec!["done".into()],
            ..rover::steps::meta::WorkflowMeta::default()
        })
        .unwrap();
        let (trace, wf) =
            s.p.trace_with("workflow budget test", StepKind::Workflow, &meta);
        WorkflowWorld {
            s,
            orch,
            trace,
            workflow: wf.id,
        }
    }

    /// Drain until the workflow span is final (no commit step here: its next action stays
    /// queued, to be looked at).
    async fn workflow_span(&self) -> Span {
        tokio::time::timeout(Duration::from_secs(120), async {
            loop {
                self.orch.drain().await.expect("drain");
                if let Some(s) = self
                    .p
                    .trace(self.trace)
                    .spans
                    .into_iter()
                    .find(|s| s.action_id == Some(self.workflow) && s.status.is_final())
                {
                    break s;
                }
                tokio::time::sleep(Duration::from_millis(300)).await;
            }
        })
        .await
        .expect("the agent is stopped well before its 300s limit")
    }
}

#[tokio::test]
async fn a_silent_workflow_container_is_stopped_and_reported_stuck() {
    let w = WorkflowWorld::new(rover::budget::BudgetSettings {
        stuck_after_secs: 2,
        ..rover::budget::BudgetSettings::default()
    })
    .await;
    let span = w.workflow_span().await;
    assert_eq!(span.status, SpanStatus::Failed, "{:?}", span.summary);
    assert_eq!(span.meta["stuck"], json!(true));
    assert_eq!(span.meta["timedOut"], json!(false));
    assert!(
        span.summary.as_deref().unwrap().starts_with("stuck:"),
        "{:?}",
        span.summary
    );
    assert_eq!(span.meta["taskStatus"], json!("failed"));
    // Handed over as a failed task (commit, then the resolver iterates), not as a budget stop.
    let next: Vec<StepKind> =
        w.p.trace(w.trace)
            .actions
            .iter()
            .map(|a| a.action.clone())
            .collect();
    assert!(next.contains(&StepKind::Commit), "{next:?}");
}

#[tokio::test]
async fn a_trace_wall_time_stop_kills_its_workflow_container() {
    let mut budget = rover::budget::BudgetSettings {
        stuck_after_secs: 0,
        ..rover::budget::BudgetSettings::default()
    };
    budget.trace.wall_secs = Some(2);
    budget.trace.action = rover::budget::BudgetAction::Stop;
    let w = WorkflowWorld::new(budget).await;
    let span = w.workflow_span().await;
    assert_eq!(span.meta["stuck"], json!(false));
    assert_eq!(
        span.meta["exitCode"],
        json!(137),
        "the container was killed"
    );
    assert_eq!(span.meta["budgetStopped"], json!(true));
    let view = w.p.trace(w.trace);
    let notify = notify_action(&view).expect("the budget notify");
    assert_eq!(notify.meta["purpose"], json!("budget"));
    assert!(
        !view.actions.iter().any(|a| a.action == StepKind::Commit),
        "no further steps"
    );
}

#[test]
fn the_daemon_says_why_it_holds_new_work_and_resume_from_another_process_lifts_it() {
    let env = crate::support::env::TestEnv::new();
    let repo = env.repo();
    std::fs::write(
        repo.join("rover.json"),
        json!({"autopilot": {"budget": {"circuitBreaker": {"maxConsecutiveFailures": 2}}}})
            .to_string(),
    )
    .unwrap();
    let store = env.store();
    // Two failed traces tripped the breaker in an earlier run.
    Ledger::update(&store, |l| {
        for _ in 0..2 {
            l.trace_ended(Uuid::new_v4(), true, 2, chrono::Utc::now());
        }
    })
    .unwrap();
    let submitted = env.rover(&["autopilot", "submit", "hello"]);
    assert!(submitted.status.success(), "{}", stderr(&submitted));
    let out = env.rover(&["autopilot", "start", "--once", "--local"]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}{}",
        stdout(&out),
        stderr(&out)
    );
    let text = stdout(&out);
    assert!(
        text.contains("paused: new traces wait: the circuit breaker is open"),
        "{text}"
    );
    let pending = store.read_state().unwrap().pending;
    assert_eq!(pending.len(), 1, "the event's coordinate stays queued");
    assert_eq!(pending[0].action, StepKind::Coordinate);
    assert_eq!(pending[0].attempts, 0, "never started");

    let resumed = env.rover(&["autopilot", "resume"]);
    assert!(
        stdout(&resumed).contains("circuit breaker closed"),
        "{}",
        stdout(&resumed)
    );
    let status = env.rover(&["autopilot", "status"]);
    assert!(
        stdout(&status).contains("breaker  closed"),
        "{}",
        stdout(&status)
    );
    assert!(Ledger::load(&store).unwrap().breaker.tripped.is_none());
}
