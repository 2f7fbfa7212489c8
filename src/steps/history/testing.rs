//! A trace built span by span for the history's tests and the steps' (each span a minute after
//! the one before).

use chrono::{DateTime, TimeDelta, Utc};
use uuid::Uuid;

use crate::agents::{ReviewFinding, ReviewVerdict};
use crate::steps::meta::{self, CommitMeta, Decision, ReviewSpanMeta, TaskReview};
use crate::store::{Action, Meta, Span, SpanStatus, StepKind, TraceIndex, TraceView};

pub(crate) struct Builder {
    pub(crate) view: TraceView,
    pub(crate) clock: DateTime<Utc>,
}

impl Builder {
    pub(crate) fn new() -> Builder {
        let clock = Utc::now();
        let mut root = Span::root(Uuid::new_v4(), clock, Meta::new());
        root.finish(SpanStatus::Completed, "event", Meta::new(), clock)
            .expect("finish");
        let index = TraceIndex::new(&root, "test".into());
        Builder {
            view: TraceView {
                index,
                spans: vec![root],
                actions: Vec::new(),
                pending: Vec::new(),
                missing: Vec::new(),
            },
            clock,
        }
    }

    /// Adds a finished span of `step` for a new action with `meta`; returns the action id.
    pub(crate) fn span(
        &mut self,
        step: StepKind,
        status: SpanStatus,
        meta: Meta,
        out: Meta,
    ) -> Uuid {
        let parent = self.view.spans.last().expect("root").clone();
        let action = Action::new(step.clone(), &parent, "test", meta, self.clock);
        let mut span = Span::start(step, &action, self.view.trace_id(), self.clock);
        self.clock += TimeDelta::minutes(1);
        span.finish(status, "done", out, self.clock)
            .expect("finish");
        self.clock += TimeDelta::minutes(1);
        let id = action.id;
        self.view.actions.push(action);
        self.view.spans.push(span);
        id
    }

    /// A finished span of `step` with no meta either way.
    pub(crate) fn bare(&mut self, step: StepKind, status: SpanStatus) -> Uuid {
        self.span(step, status, Meta::new(), Meta::new())
    }

    /// A workflow run whose action has `meta`.
    pub(crate) fn workflow(&mut self, meta: &meta::WorkflowMeta, status: SpanStatus) -> Uuid {
        self.span(
            StepKind::Workflow,
            status,
            crate::store::to_meta(meta),
            Meta::new(),
        )
    }

    pub(crate) fn commit(&mut self, workflow: Uuid, status: SpanStatus) -> Uuid {
        let meta = CommitMeta {
            workflow_action_id: Some(workflow),
            task_status: meta::TaskStatus::Completed,
            summary: None,
        };
        self.span(
            StepKind::Commit,
            status,
            crate::store::to_meta(&meta),
            Meta::new(),
        )
    }

    /// A completed resolve that decided `decision`.
    pub(crate) fn resolve(&mut self, decision: Decision) -> Uuid {
        let mut out = Meta::new();
        out.insert(
            "decision".into(),
            serde_json::to_value(decision).expect("a word"),
        );
        self.span(StepKind::Resolve, SpanStatus::Completed, Meta::new(), out)
    }

    /// The span of action `action`.
    pub(crate) fn span_of(&self, action: Uuid) -> Uuid {
        self.view
            .spans
            .iter()
            .find(|s| s.action_id == Some(action))
            .expect("span")
            .id
    }
}

/// A self-review's word on the task of `branch` at `head`: its criteria, and for `changes` one
/// finding.
pub(crate) fn task_review(branch: &str, head: &str, verdict: ReviewVerdict) -> TaskReview {
    TaskReview {
        workflow_action_id: Uuid::new_v4(),
        title: format!("task on {branch}"),
        branch: branch.to_owned(),
        head: head.to_owned(),
        criteria: vec!["prints --json".into(), "has a test".into()],
        verdict,
        summary: "read it".into(),
        findings: if verdict == ReviewVerdict::Changes {
            vec![ReviewFinding {
                file: "src/main.rs".into(),
                line: Some(12),
                what: "no test for --json".into(),
                why: "criterion: has a test".into(),
            }]
        } else {
            Vec::new()
        },
        container: Some("rover-x-review-0".into()),
        agent: None,
        carried: false,
    }
}

impl Builder {
    /// A `review` span that said `reviews`.
    pub(crate) fn review(&mut self, status: SpanStatus, reviews: Vec<TaskReview>) -> Uuid {
        let meta = ReviewSpanMeta {
            reviews,
            agent: None,
        };
        self.span(StepKind::Review, status, Meta::new(), meta.to_meta())
    }
}

impl Builder {
    /// A coordinator's look at the CI of pull request #7 at `sha` that found `state`, with
    /// `failing` checks (2 in all): a red look fails its span.
    pub(crate) fn ci_look(
        &mut self,
        sha: &str,
        state: crate::github::CiState,
        failing: &[&str],
    ) -> Uuid {
        use crate::steps::meta::{CiWatchMeta, CoordinateSpanMeta, DecidedBy};
        let meta = CoordinateSpanMeta {
            ci: Some(CiWatchMeta {
                pr_number: 7,
                pr_url: "https://github.test/o/r/pull/7".into(),
                branch: "rover/csv".into(),
                sha: sha.into(),
                round: 1,
                ..CiWatchMeta::default()
            }),
            ci_status: Some(crate::github::CiStatus {
                sha: sha.into(),
                state,
                failing: failing.iter().map(|f| (*f).to_owned()).collect(),
                pending: Vec::new(),
                total: 2,
            }),
            ..CoordinateSpanMeta::decided(Decision::Resolve, DecidedBy::Ci)
        };
        let status = if state == crate::github::CiState::Failure {
            SpanStatus::Failed
        } else {
            SpanStatus::Completed
        };
        let meta = crate::store::to_meta(&meta);
        self.span(StepKind::Coordinate, status, meta.clone(), meta)
    }

    /// A resolve that decided an `iterate` on workflow action `on` with `instructions`.
    pub(crate) fn iterate(&mut self, on: Option<Uuid>, instructions: &str) -> Uuid {
        let mut out = crate::store::to_meta(&meta::ResolveSpanMeta {
            instructions: Some(Some(instructions.into())),
            iterate_on: on,
            ..meta::ResolveSpanMeta::default()
        });
        out.insert("decision".into(), "iterate".into());
        self.span(StepKind::Resolve, SpanStatus::Completed, Meta::new(), out)
    }

    /// A coordinate span whose trust check said `trusted` about the event's author.
    pub(crate) fn trust(&mut self, trusted: bool) -> Uuid {
        let meta = crate::store::to_meta(&meta::CoordinateSpanMeta {
            trust: Some(Some(crate::github::TrustDecision {
                trusted,
                reason: "test".into(),
            })),
            ..meta::CoordinateSpanMeta::default()
        });
        self.span(
            StepKind::Coordinate,
            SpanStatus::Completed,
            Meta::new(),
            meta,
        )
    }
}

impl Builder {
    fn hook_plan() -> crate::git::HookPlan {
        crate::git::HookPlan::Sandbox {
            location: crate::git::HookLocation::Worktree {
                relative: ".githooks".into(),
            },
            reason: "test".into(),
            hooks: vec!["pre-commit".into()],
        }
    }

    /// A commit of `workflow` on `rover/a` whose `pre-commit` hook failed: `git commit` exited
    /// 1 with `stderr` (after an empty line, before another).
    pub(crate) fn hook_failed_commit(&mut self, workflow: Uuid, stderr: &str) -> Uuid {
        let mut out = crate::store::to_meta(&meta::CommitSpanMeta {
            workflow_action_id: Some(Some(workflow)),
            branch_name: Some("rover/a".into()),
            hooks: Some(Builder::hook_plan()),
            ..meta::CommitSpanMeta::default()
        });
        out.insert(
            "error".into(),
            serde_json::json!({"message": "the commit failed: git commit exited 1",
                "command": ["git", "commit", "-F", "-"], "exitCode": 1,
                "stdout": "", "stderr": format!("\n{stderr}\nmore\n"), "truncated": false}),
        );
        self.span(StepKind::Commit, SpanStatus::Error, Meta::new(), out)
    }

    /// A commit of `workflow` on `branch` that passed its hooks and committed.
    pub(crate) fn passed_commit(&mut self, workflow: Uuid, branch: &str) -> Uuid {
        let out = crate::store::to_meta(&meta::CommitSpanMeta {
            committed: true,
            workflow_action_id: Some(Some(workflow)),
            branch_name: Some(branch.into()),
            hooks: Some(Builder::hook_plan()),
            sha: Some("abc".into()),
            ..meta::CommitSpanMeta::default()
        });
        self.span(StepKind::Commit, SpanStatus::Completed, Meta::new(), out)
    }
}

impl Builder {
    /// The trace's root event: `login`'s review of pull request `number` in `state`
    /// (`changes_requested`, `approved`, `commented`) saying `body`, at the builder's clock.
    pub(crate) fn review_event(&mut self, number: u64, login: &str, state: &str, body: &str) {
        use crate::github::EventKind;
        self.root_event(
            EventKind::PullRequestReview,
            number,
            login,
            body,
            Some(state),
        );
    }

    /// The trace's root event: `login`'s `kind` event (an issue, a comment) on issue `number`
    /// saying `body`, at the builder's clock.
    pub(crate) fn comment_event(
        &mut self,
        kind: crate::github::EventKind,
        number: u64,
        login: &str,
        body: &str,
    ) {
        self.root_event(kind, number, login, body, None);
    }

    fn root_event(
        &mut self,
        kind: crate::github::EventKind,
        number: u64,
        login: &str,
        body: &str,
        state: Option<&str>,
    ) {
        use crate::github::{Channel, EventAction, EventKind, NormalizedEvent, Visibility};
        let mut event = NormalizedEvent::local("1", login, body, self.clock);
        let review = kind == EventKind::PullRequestReview;
        event.kind = kind;
        event.action = Some(if review {
            EventAction::Submitted
        } else {
            EventAction::Created
        });
        event.number = Some(number);
        event.is_pull_request = review;
        event.review_state = state.map(str::to_owned);
        event.channel = if review {
            Channel::PrReview { number }
        } else {
            Channel::IssueComment { number }
        };
        event.visibility = Visibility::Public;
        let meta = meta::EventMeta {
            source: meta::EventSource::Github,
            label: format!("{} #{number} by {login}", kind.as_str()),
            kind: kind.as_str().to_owned(),
            action: event.action.map(|a| a.as_str().to_owned()),
            channel: event.channel.clone(),
            visibility: Visibility::Public,
            event: Some(event),
            request: None,
            follows: None,
            reverts: None,
        };
        let clock = self.clock;
        let root = self.view.spans.first_mut().expect("root");
        root.meta = meta.to_meta();
        root.timestamp = clock;
        root.completed = Some(clock);
        self.clock += TimeDelta::minutes(1);
    }
}
