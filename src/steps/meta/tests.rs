//! The meta records' format: today's JSON reads in and writes back unchanged.

use super::*;
use crate::agents::CoordinateDecision;
use crate::github::{Channel, EventAction, Visibility};
use crate::store::{Meta, Span, StepKind};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

fn serialized<T: Serialize>(v: T) -> String {
    serde_json::to_value(v)
        .expect("serializes")
        .as_str()
        .expect("a string")
        .to_owned()
}

#[test]
fn as_str_names_each_variant_as_serialized() {
    use CoordinateDecision as C;
    use EventAction as A;
    use NotifyPurpose as P;
    for d in [
        C::Noop,
        C::Plan,
        C::Workflow,
        C::Notify,
        C::Wait,
        C::Flag,
        C::Cleanup,
    ] {
        assert_eq!(d.as_str(), serialized(d));
    }
    for p in [
        P::Answer,
        P::Clarify,
        P::Flag,
        P::Pushed,
        P::Review,
        P::Failure,
        P::Budget,
        P::Ready,
    ] {
        assert_eq!(p.as_str(), serialized(p));
    }
    for a in [
        A::Opened,
        A::Closed,
        A::Reopened,
        A::Labeled,
        A::ReadyForReview,
        A::ReviewRequested,
        A::Created,
        A::Submitted,
    ] {
        assert_eq!(a.as_str(), serialized(a));
    }
}

#[test]
fn a_task_mapping_keeps_unknown_keys_and_reads_the_legacy_worktree_key() {
    let legacy = serde_json::json!({
        "taskId": "t1",
        "branchName": "rover/abc-x",
        "traceId": Uuid::nil(),
        "workflowSpanId": Uuid::nil(),
        "worktree": "/data/worktrees/abc",
        "otherTool": {"x": 1}
    });
    let m: crate::store::TaskMapping = serde_json::from_value(legacy).expect("parses");
    assert_eq!(
        m.worktree_path.as_deref(),
        Some(std::path::Path::new("/data/worktrees/abc"))
    );
    let back = serde_json::to_value(&m).expect("serializes");
    assert_eq!(back["otherTool"], serde_json::json!({"x": 1}));
    assert_eq!(back["worktreePath"], "/data/worktrees/abc");
    assert!(back.get("containerId").is_none(), "{back}");
}

#[test]
fn the_pull_request_a_push_opened_is_what_the_budget_counts() {
    let opened = |created: Option<bool>| {
        let meta = to_meta(&PushSpanMeta {
            status: Some(PushStatus::Pushed),
            pull_request: PushPullRequest {
                pr_url: Some(Some("https://github.com/o/r/pull/3".into())),
                pr_number: Some(3),
                pr_created: created,
                head_sha: Some(Some("abc".into())),
            },
            ..PushSpanMeta::default()
        });
        let mut span = Span::root(Uuid::nil(), chrono::Utc::now(), Meta::new());
        span.step = StepKind::Push;
        span.meta = meta;
        crate::budget::PullRequestOpened::by(&span)
    };
    assert!(opened(Some(true)));
    assert!(!opened(Some(false)));
    assert!(!opened(None));
}

#[test]
fn the_push_span_meta_keeps_its_keys_and_a_null_pr_url() {
    let local = PushSpanMeta {
        status: Some(PushStatus::Pushed),
        branch: Some("rover/a".into()),
        pull_request: PushPullRequest {
            pr_url: Some(None),
            ..Default::default()
        },
        pull_request_note: Some("none: local event".into()),
        ..PushSpanMeta::default()
    };
    let value = serde_json::to_value(&local).expect("serializes");
    assert_eq!(
        value,
        serde_json::json!({
            "status": "pushed", "branch": "rover/a", "prUrl": null,
            "pullRequest": "none: local event"
        })
    );
    let span = Span::root(Uuid::nil(), chrono::Utc::now(), to_meta(&local));
    let pr = PushPullRequest::of(&span);
    assert_eq!(pr.pr_url, Some(None));
    assert!(!pr.exists());
    let conflict = PushSpanMeta {
        status: Some(PushStatus::Conflict),
        conflict: Some(PushConflict {
            source_branch: "rover/b".into(),
            target: "rover/a".into(),
            files: vec!["x.rs".into()],
            base: false,
        }),
        ..PushSpanMeta::default()
    };
    let span = Span::root(Uuid::nil(), chrono::Utc::now(), to_meta(&conflict));
    assert_eq!(span.meta["conflict"]["sourceBranch"], "rover/b");
    assert!(
        span.meta["conflict"].get("base").is_none(),
        "written only when true"
    );
    assert_eq!(ConflictSpanMeta::of(&span), conflict.conflict);
    // A merge's conflict with its base reads back the same way.
    let merge = crate::steps::meta::MergeSpanMeta {
        merge_outcome: Some(crate::steps::meta::MergeOutcome::Conflict),
        conflict: Some(PushConflict {
            source_branch: "rover/a".into(),
            target: "origin/main".into(),
            files: vec!["x.rs".into()],
            base: true,
        }),
        ..Default::default()
    };
    let span = Span::root(Uuid::nil(), chrono::Utc::now(), to_meta(&merge));
    assert_eq!(span.meta["mergeOutcome"], "conflict");
    assert_eq!(ConflictSpanMeta::of(&span), merge.conflict);
}

#[test]
fn the_push_span_meta_records_the_secrets_it_refused_to_send() {
    let sha = "0123456789abcdef0123456789abcdef01234567";
    let refused = serde_json::json!({
        "status": "secrets", "branch": "rover/a", "branches": ["rover/a"], "merged": [],
        "worktree": "/data/worktrees/a",
        "secretsFound": {"findings": [
            {"commit": sha, "in": "content", "path": "settings.env", "line": 1,
                "kind": "held", "name": "ANTHROPIC_API_KEY"},
            {"commit": sha, "in": "content", "path": "notes.md", "line": 3,
                "kind": "shape", "shape": "githubToken", "hint": "…6789"},
            {"in": "branchName", "kind": "shape", "shape": "jwt"}
        ], "more": 2}
    });
    let read: PushSpanMeta = round_trips(&refused);
    assert_eq!(read.status, Some(PushStatus::Secrets));
    let found = read.secrets_found.clone().expect("found");
    assert_eq!(found.findings.len(), 3);
    assert_eq!(
        found.findings[1].what,
        crate::git::SecretWhat::Shape {
            shape: crate::secrets::KeyShape::GithubToken
        }
    );
    assert_eq!(
        found.describe(),
        "the value of ANTHROPIC_API_KEY in `settings.env` line 1 of commit 0123456; a GitHub token shape (…6789) in `notes.md` line 3 of commit 0123456; a JWT shape in the branch name; and 2 more"
    );
    // What the resolver reads back; a pushed span or another step's has none.
    let span = span_with(&read);
    assert_eq!(
        SecretsSpanMeta::of(&span),
        Some(("rover/a".to_owned(), found))
    );
    let pushed = span_with(&PushSpanMeta {
        status: Some(PushStatus::Pushed),
        branch: Some("rover/a".into()),
        ..PushSpanMeta::default()
    });
    assert_eq!(SecretsSpanMeta::of(&pushed), None);
    // Without `more`, the key is left out.
    round_trips::<SecretsFound>(&serde_json::json!({"findings": []}));
}

#[test]
fn the_budget_reads_the_purpose_and_breaker_mark_the_notify_step_writes() {
    let own = NotifyMeta {
        purpose: NotifyPurpose::Failure,
        circuit_breaker: true,
        ..NotifyMeta::default()
    };
    let meta = to_meta(&own);
    assert_eq!(meta["circuitBreaker"], serde_json::json!(true));
    let header = crate::budget::NotifyHeader::of(&meta);
    assert!(header.purpose == Some(NotifyPurpose::Failure) && header.circuit_breaker);
    assert_eq!(NotifyMeta::purpose_of(&meta), Some(NotifyPurpose::Failure));
    let plain = to_meta(&NotifyMeta::failure(&StepKind::Push, "x"));
    assert!(!plain.contains_key("circuitBreaker"), "{plain:?}");
    assert!(!crate::budget::NotifyHeader::of(&plain).circuit_breaker);
}

// The span metas: today's JSON reads in and writes back unchanged.

/// `json` reads into `T` and serializes back to the same JSON.
fn round_trips<T>(json: &serde_json::Value) -> T
where
    T: Serialize + for<'de> Deserialize<'de>,
{
    let record = T::deserialize(json).expect("reads");
    assert_eq!(&serde_json::to_value(&record).expect("serializes"), json);
    record
}

fn span_with<T: Serialize>(record: &T) -> Span {
    Span::root(Uuid::nil(), chrono::Utc::now(), to_meta(record))
}

#[test]
fn the_coordinate_span_meta_keeps_its_keys_and_nulls() {
    // An agent's decision about a local request: trust, roverPr and wait written as null.
    let agent = round_trips::<CoordinateSpanMeta>(&serde_json::json!({
        "decision": "noop", "decidedBy": "agent", "confidence": 0.9, "reasoning": "why",
        "answer": {"decision": "noop", "confidence": 0.9, "reasoning": "why",
            "directive": null, "task": null, "message": null, "condition": null,
            "task_id": null},
        "trust": null, "roverPr": null, "wait": null,
        "openWaits": [{"traceId": Uuid::nil(), "at": "2026-01-02T03:04:05Z",
            "condition": "CI to finish"}],
        "agent": {"turns": 2, "costUsd": null, "inputTokens": 10, "outputTokens": 5,
            "cachedTokens": 0, "attempts": 1}
    }));
    assert_eq!(agent.trust, Some(None));
    assert_eq!(agent.rover_pr, Some(None));
    assert_eq!(agent.wait, Some(None));
    assert_eq!(agent.decided.decided_by, Some(DecidedBy::Agent));
    // A rule's cleanup of a rover pull request, with the trust verdict.
    let rule = round_trips::<CoordinateSpanMeta>(&serde_json::json!({
        "decision": "cleanup", "decidedBy": "rule", "confidence": 1.0, "reasoning": "merged",
        "roverPr": {"branch": "rover/a", "tasks": [[Uuid::nil(), "t-1"]]},
        "trust": {"trusted": true, "reason": "write access"}
    }));
    assert_eq!(
        rule.rover_pr,
        Some(Some(RoverPrMeta {
            branch: "rover/a".into(),
            tasks: vec![(Uuid::nil().to_string(), "t-1".into())],
        }))
    );
    // A wait a newer trace took over.
    round_trips::<CoordinateSpanMeta>(&serde_json::json!({
        "decision": "noop", "decidedBy": "wait", "supersededBy": "t2",
        "wait": {"condition": "CI", "subject": "#4", "since": "2026-01-02T03:04:05Z",
            "round": 1}
    }));
    // A red look at CI: its error is `ErrorMeta`, not part of the record.
    let mut red = serde_json::json!({
        "decision": "resolve", "decidedBy": "ci", "redLooks": 2,
        "ci": {"prNumber": 7, "prUrl": "u", "branch": "rover/a", "sha": "abc", "round": 1},
        "ciStatus": {"sha": "abc", "state": "failure", "failing": ["test"],
            "pending": [], "total": 2}
    });
    let look = round_trips::<CoordinateSpanMeta>(&red);
    red["error"] = serde_json::json!({"message": "CI failed", "retryable": false});
    let span = Span::root(
        Uuid::nil(),
        chrono::Utc::now(),
        red.as_object().unwrap().clone(),
    );
    assert_eq!(CoordinateSpanMeta::of(&span), look);
    assert!(DecisionSpanMeta::of(&span).decided_by == Some(DecidedBy::Ci));
    // Written, read back.
    let written = CoordinateSpanMeta {
        trust: Some(None),
        wait: Some(Some(WaitMeta {
            condition: "CI".into(),
            round: 2,
            ..WaitMeta::default()
        })),
        open_waits: Some(Vec::new()),
        ..CoordinateSpanMeta::decided(Decision::Wait, DecidedBy::Agent)
    };
    let span = span_with(&written);
    assert_eq!(span.meta["trust"], serde_json::Value::Null);
    assert!(!span.meta.contains_key("roverPr"), "{:?}", span.meta);
    assert_eq!(CoordinateSpanMeta::of(&span), written);
    assert_eq!(DecisionSpanMeta::of(&span), written.decided);
}

#[test]
fn the_noop_span_meta_keeps_its_keys_and_a_wait_without_subject() {
    let wait = round_trips::<NoopSpanMeta>(&serde_json::json!({
        "reason": "waiting: CI", "summary": "s", "summarySource": "span summaries",
        "waitingFor": "CI", "subject": null
    }));
    assert_eq!(wait.subject, Some(None));
    let failed = round_trips::<NoopSpanMeta>(&serde_json::json!({
        "reason": "r", "summary": "s", "summarySource": "span summaries",
        "agent": {"error": "refused", "errorClass": "auth"}
    }));
    assert!(matches!(
        failed.agent,
        Some(crate::store::AgentMeta::Failed(_))
    ));
    for (source, json) in [
        (SummarySource::Agent, "agent"),
        (SummarySource::SpanSummaries, "span summaries"),
        (
            SummarySource::SpanSummariesUntrusted,
            "span summaries (untrusted event: no agent)",
        ),
    ] {
        assert_eq!(serde_json::to_value(source).expect("serializes"), json);
    }
    let written = NoopSpanMeta {
        reason: "r".into(),
        summary: "s".into(),
        summary_source: SummarySource::SpanSummariesUntrusted,
        ..NoopSpanMeta::default()
    };
    let span = span_with(&written);
    assert!(!span.meta.contains_key("subject"), "{:?}", span.meta);
    assert!(!span.meta.contains_key("waitingFor"), "{:?}", span.meta);
    assert_eq!(NoopSpanMeta::of(&span), written);
}

#[test]
fn the_plan_span_meta_keeps_its_keys() {
    let tasks = round_trips::<PlanSpanMeta>(&serde_json::json!({
        "decision": "tasks", "analysis": "two steps",
        "tasks": [
            {"taskId": "impl", "actionId": Uuid::nil(), "title": " Impl ",
                "workflowType": "swe", "dependsOn": []},
            {"taskId": "review", "actionId": null, "title": "Review",
                "workflowType": "code-review", "dependsOn": ["impl"]}
        ],
        "agent": {"turns": null, "costUsd": 0.1, "inputTokens": 1, "outputTokens": 2,
            "cachedTokens": 3}
    }));
    assert_eq!(tasks.decided.decision, Some(Decision::Tasks));
    round_trips::<PlanSpanMeta>(&serde_json::json!({
        "decision": "clarify", "analysis": "vague", "clarification": "Which one?"
    }));
    let written = PlanSpanMeta {
        decided: DecisionSpanMeta {
            decision: Some(Decision::Empty),
            ..DecisionSpanMeta::default()
        },
        analysis: "nothing".into(),
        ..PlanSpanMeta::default()
    };
    let span = span_with(&written);
    assert_eq!(PlanSpanMeta::of(&span), written);
    assert_eq!(PlanSpanMeta::of(&span_with(&tasks)), tasks);
}

/// A span whose meta is `meta` (an object).
fn span_of(meta: serde_json::Value) -> Span {
    let serde_json::Value::Object(map) = meta else {
        panic!("an object")
    };
    Span::root(Uuid::nil(), chrono::Utc::now(), map)
}

#[test]
fn the_notify_span_meta_keeps_its_keys_and_the_delivery_nulls() {
    let local: NotifySpanMeta = round_trips(&serde_json::json!({
        "purpose": "answer", "visibility": "private", "message": "It is 42.",
        "messageSource": "agent", "channel": "local",
        "agent": {"turns": 1, "costUsd": 0.01, "inputTokens": 5, "outputTokens": 7, "cachedTokens": 0}
    }));
    assert_eq!(local.delivery, None);
    assert_eq!(local.local_answer(), Some("It is 42."));
    let posted: NotifySpanMeta = round_trips(&serde_json::json!({
        "purpose": "review", "visibility": "public", "message": "Findings.",
        "messageSource": "fallback", "agent": {"error": "no key", "errorClass": "auth"},
        "channel": {"kind": "prReview", "number": 4},
        "url": null, "commentId": null, "alreadyPosted": false
    }));
    assert_eq!(
        posted.channel,
        Some(NotifyChannel::Github(Channel::PrReview { number: 4 }))
    );
    assert_eq!(posted.delivery, Some(NotifyDelivery::default()));
    assert_eq!(posted.local_answer(), None);
    let found: NotifySpanMeta = round_trips(&serde_json::json!({
        "purpose": "answer", "visibility": "public", "message": "m", "messageSource": "agent",
        "agent": {"turns": null, "costUsd": null, "inputTokens": 0, "outputTokens": 0, "cachedTokens": 0},
        "channel": {"kind": "reviewThreadReply", "number": 2, "commentId": 5},
        "url": "https://github.com/o/r/pull/2#discussion_r9", "commentId": 9, "alreadyPosted": true
    }));
    let delivery = found.delivery.expect("a delivery");
    assert_eq!(
        (delivery.comment_id, delivery.already_posted),
        (Some(9), true)
    );
}

#[test]
fn a_written_notify_span_meta_reads_back_equal_and_local_takes_every_shape() {
    let written = NotifySpanMeta {
        purpose: NotifyPurpose::Pushed,
        visibility: Visibility::Public,
        message: Some("Pushed.".into()),
        message_source: Some(MessageSource::Agent),
        agent: Some(crate::store::AgentMeta::Used(crate::store::AgentUsage {
            turns: Some(2),
            ..crate::store::AgentUsage::default()
        })),
        channel: Some(NotifyChannel::Github(Channel::IssueComment { number: 3 })),
        delivery: Some(NotifyDelivery {
            url: Some("https://github.com/o/r/issues/3#issuecomment-1".into()),
            comment_id: Some(1),
            already_posted: false,
        }),
        also_delivered: Some(NotifyDelivery {
            url: Some("https://github.com/o/r/pull/4#issuecomment-2".into()),
            comment_id: Some(2),
            already_posted: false,
        }),
    };
    let span = span_of(serde_json::to_value(&written).expect("serializes"));
    assert_eq!(span.meta["channel"]["kind"], "issueComment");
    assert_eq!(span.meta["commentId"], 1);
    assert_eq!(NotifySpanMeta::of(&span), Some(written));
    let local = NotifySpanMeta {
        message: Some("hi".into()),
        channel: Some(NotifyChannel::local()),
        ..NotifySpanMeta::default()
    };
    let span = span_of(serde_json::to_value(&local).expect("serializes"));
    assert_eq!(span.meta["channel"], "local");
    assert!(!span.meta.contains_key("alreadyPosted"), "{:?}", span.meta);
    assert_eq!(NotifySpanMeta::of(&span), Some(local));
    // Another implementation's local channel, and the local channel as `Channel` writes it.
    for channel in [
        serde_json::json!({"type": "local"}),
        serde_json::json!({"kind": "local"}),
    ] {
        let span = span_of(serde_json::json!({"message": "hi", "channel": channel}));
        let read = NotifySpanMeta::of(&span).expect("reads");
        assert_eq!(read.local_answer(), Some("hi"), "{channel}");
    }
    let github = span_of(
        serde_json::json!({"message": "hi", "channel": {"kind": "prComment", "number": 1}}),
    );
    assert_eq!(
        NotifySpanMeta::of(&github).expect("reads").local_answer(),
        None
    );
}

#[test]
fn the_cleanup_span_meta_keeps_its_keys() {
    let read: CleanupSpanMeta = round_trips(&serde_json::json!({
        "tasks": [{
            "workflowActionId": "00000000-0000-0000-0000-000000000001",
            "branch": "rover/a",
            "containers": {"result": "notApplicable"},
            "worktree": {"result": "removed"},
            "branchRemoval": {"result": "failed", "detail": "the branch is checked out"},
            "mapping": {"result": "alreadyGone"}
        }, {
            "workflowActionId": null, "branch": null,
            "containers": {"result": "alreadyGone"}, "worktree": {"result": "alreadyGone"},
            "branchRemoval": {"result": "notApplicable"}, "mapping": {"result": "notApplicable"}
        }],
        "notes": ["cannot open the repository: gone"]
    }));
    assert_eq!(
        read.tasks[0].branch_removal,
        Piece::Failed("the branch is checked out".into())
    );
    let written = CleanupSpanMeta {
        tasks: vec![TaskCleanup {
            workflow_action_id: Some(Uuid::nil()),
            branch: Some("rover/b".into()),
            containers: Piece::Removed,
            worktree: Piece::AlreadyGone,
            branch_removal: Piece::Removed,
            mapping: Piece::Removed,
        }],
        notes: Vec::new(),
    };
    let span = span_of(serde_json::to_value(&written).expect("serializes"));
    assert_eq!(span.meta["notes"], serde_json::json!([]));
    assert_eq!(CleanupSpanMeta::of(&span), Some(written));
}

#[test]
fn the_commit_span_meta_keeps_its_keys_and_nulls() {
    use serde_json::json;
    let workflow = Uuid::new_v4();
    let agent = json!({"turns": 1, "costUsd": 0.01, "inputTokens": 10, "outputTokens": 5,
        "cachedTokens": 0, "attempts": 1});
    // A commit made, its hooks on the host.
    let committed = json!({
        "committed": true, "workflowActionId": workflow, "branchName": "rover/a",
        "worktreePath": "/data/worktrees/a",
        "diff": {"filesChanged": 1, "insertions": 2, "deletions": 0, "files": ["a.rs"]},
        "skippedNestedRepositories": ["vendor/x"], "messageSource": "agent",
        "agent": agent, "hooks": {"runs": "host", "dir": "/data/hooks"},
        "message": "Add a\n\nbody", "sha": "0123456789abcdef"
    });
    let read: CommitSpanMeta = round_trips(&committed);
    assert!(read.committed);
    assert_eq!(read.workflow_action_id, Some(Some(workflow)));
    assert_eq!(read.message_source, Some(MessageSource::Agent));
    assert_eq!(
        read.agent
            .as_ref()
            .and_then(|a| a.usage())
            .map(|u| u.input_tokens),
        Some(10)
    );
    assert_eq!(read.diff.as_ref().map(|d| d.files_changed), Some(1));
    // A task that did not complete and named no workflow nor summary: the nulls stay.
    let failed_task = json!({"committed": false, "taskStatus": "failed",
        "workflowActionId": null, "taskSummary": null});
    let read: CommitSpanMeta = round_trips(&failed_task);
    assert_eq!(read.task_status, Some(TaskStatus::Failed));
    assert_eq!(read.workflow_action_id, Some(None));
    assert_eq!(read.task_summary, Some(None));
    // Nothing to commit; a tampered worktree whose hooks would run in a sandbox, the
    // fallback message (its error is `ErrorMeta`'s, not read here).
    let nothing = json!({"committed": false, "noChanges": true, "workflowActionId": workflow,
        "branchName": "rover/a", "worktreePath": "/w", "skippedNestedRepositories": [],
        "diff": {"filesChanged": 0, "insertions": 0, "deletions": 0, "files": []}});
    assert!(round_trips::<CommitSpanMeta>(&nothing).no_changes);
    let tampered = json!({"committed": false, "tampered": true, "workflowActionId": workflow,
        "messageSource": "fallback",
        "agent": {"error": "auth failed", "errorClass": "auth"},
        "hooks": {"runs": "sandbox", "location": {"in": "worktree", "relative": ".husky"},
            "reason": "the hooks are in the worktree"},
        "message": "m"});
    let read: CommitSpanMeta = round_trips(&tampered);
    assert!(read.outcome.tampered);
    assert!(matches!(
        read.agent,
        Some(crate::store::AgentMeta::Failed(_))
    ));
    let mut with_error = tampered.as_object().cloned().expect("an object");
    with_error.insert("error".into(), json!({"message": "x", "retryable": false}));
    assert_eq!(CommitSpanMeta::read(&with_error).expect("reads"), read);
    // A record written reads back equal, absent keys staying absent.
    let written = CommitSpanMeta {
        committed: true,
        workflow_action_id: Some(Some(workflow)),
        branch_name: Some("rover/b".into()),
        sha: Some("abc".into()),
        hooks: Some(crate::git::HookPlan::Host {
            dir: "/h".into(),
            hooks: vec!["pre-commit".into()],
        }),
        ..CommitSpanMeta::default()
    };
    let meta = to_meta(&written);
    assert!(!meta.contains_key("taskSummary") && !meta.contains_key("noChanges"));
    assert!(!meta.contains_key("tampered"), "{meta:?}");
    assert_eq!(CommitSpanMeta::read(&meta).expect("reads"), written);
}

#[test]
fn the_resolve_span_meta_keeps_its_keys_and_nulls() {
    use crate::agents::{CorrectiveCommand, ResolveDecision, RetryStep};
    use serde_json::json;
    let agent = json!({"turns": null, "costUsd": null, "inputTokens": 3, "outputTokens": 4,
        "cachedTokens": 1});
    // An agent's retry, its corrective command run in the sandbox.
    let retry = json!({
        "decision": "retry", "agentDecision": "retry", "reasoning": "npm was missing",
        "correctiveCommands": [{"command": "npm ci", "purpose": "install"}],
        "correctiveRuns": {"ran": true, "runs": [{"command": "npm ci", "exitCode": 0,
            "timedOut": false, "output": "ok"}]},
        "instructions": null, "retryStep": "commit", "message": null,
        "retries": 1, "maxRetries": 3, "workdir": "/data/agent-cwd", "agent": agent
    });
    let read: ResolveSpanMeta = round_trips(&retry);
    assert_eq!(read.decision.decision, Some(Decision::Retry));
    assert_eq!(read.agent_decision, Some(ResolveDecision::Retry));
    assert_eq!(read.retry_step, Some(Some(RetryStep::Commit)));
    assert_eq!(read.instructions, Some(None));
    assert_eq!(
        read.corrective_runs
            .as_ref()
            .and_then(|r| r.runs.as_ref())
            .map(|runs| runs[0].succeeded()),
        Some(true)
    );
    // The commands could not run; a timed-out run has no exit code.
    let not_run = json!({"decision": "retry", "correctiveRuns": {"ran": false,
        "reason": "the trace has no task worktree to run them in", "commands": ["make"]}});
    let read: ResolveSpanMeta = round_trips(&not_run);
    assert_eq!(
        read.corrective_runs,
        Some(CorrectiveRuns::not_run(
            "the trace has no task worktree to run them in".into(),
            vec!["make".into()]
        ))
    );
    round_trips::<ResolveSpanMeta>(&json!({"correctiveRuns": {"ran": true, "runs": [
        {"command": "sleep 9", "exitCode": null, "timedOut": true, "output": ""}]}}));
    // An iterate on a conflict, as the push span records the conflict.
    let workflow = Uuid::new_v4();
    let conflict = json!({"decision": "iterate", "agentDecision": "iterate",
        "iterateOn": workflow,
        "conflict": {"sourceBranch": "rover/b", "target": "rover/a", "files": ["x.rs"]}});
    let read: ResolveSpanMeta = round_trips(&conflict);
    assert_eq!(read.iterate_on, Some(workflow));
    let span = Span::root(Uuid::nil(), chrono::Utc::now(), to_meta(&read));
    assert_eq!(ConflictSpanMeta::of(&span), read.conflict);
    // The quick exits and a wait.
    let span_id = Uuid::new_v4();
    for quick in [
        json!({"decision": "fail", "reasoning": "r", "retries": 3, "maxRetries": 3,
            "quickExit": "maxRetries", "correctiveCommands": []}),
        json!({"decision": "fail", "reasoning": "r", "quickExit": "tampered",
            "tamperedSpan": span_id}),
        json!({"decision": "fail", "reasoning": "r", "quickExit": "maxWaits", "agent": agent}),
        json!({"decision": "fail", "quickExit": "conflictUnchanged", "agentDecision": "push"}),
        json!({"decision": "fail", "reasoning": "r", "quickExit": "secretsInPush",
            "secretsSpan": span_id}),
        json!({"supersededBy": span_id}),
        json!({"decision": "wait", "reasoning": "CI runs",
            "wait": {"round": 1, "max": 3, "notBefore": "2026-01-02T03:04:05Z"},
            "correctiveCommands": [], "agent": agent}),
    ] {
        let read: ResolveSpanMeta = round_trips(&quick);
        assert_eq!(
            serde_json::to_value(read.quick_exit).expect("serializes"),
            quick
                .get("quickExit")
                .cloned()
                .unwrap_or(serde_json::Value::Null)
        );
    }
    let span = Span::root(
        Uuid::nil(),
        chrono::Utc::now(),
        to_meta(&json!({"supersededBy": span_id})),
    );
    assert_eq!(
        DecisionSpanMeta::of(&span).superseded_by,
        Some(span_id.to_string())
    );
    // A record written reads back equal, and what it leaves out stays out.
    let written = ResolveSpanMeta {
        decision: DecisionSpanMeta {
            decision: Some(Decision::Push),
            ..DecisionSpanMeta::default()
        },
        agent_decision: Some(ResolveDecision::Push),
        corrective_commands: Some(vec![CorrectiveCommand {
            command: "true".into(),
            purpose: "p".into(),
        }]),
        message: Some(Some("done".into())),
        retry_step: Some(None),
        ..ResolveSpanMeta::default()
    };
    let meta = to_meta(&written);
    assert_eq!(meta["retryStep"], serde_json::Value::Null);
    assert!(!meta.contains_key("instructions") && !meta.contains_key("quickExit"));
    assert_eq!(ResolveSpanMeta::read(&meta).expect("reads"), written);
}
