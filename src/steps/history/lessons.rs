//! What an ended trace teaches, read from its typed spans (never from a model): a required gate
//! that failed and the fix after which it passed, a self-review that asked for changes and
//! approved after them, and the runs that were given lessons and failed the same way anyway
//! (they contradict those lessons). Whether a trace may teach at all is [`trusted_author`].

use uuid::Uuid;

use crate::agents::ReviewVerdict;
use crate::sandbox::gates::{GateOutcome, GatesReport};
use crate::steps::meta::{
    self, CoordinateSpanMeta, Decision, EventMeta, EventSource, GatesMeta, GatesSpanMeta,
    LessonsSpanMeta, ResolveSpanMeta, ReviewSpanMeta, WorkflowMeta,
};
use crate::store::{Span, StepKind, TraceView};

/// The longest fix a lesson quotes.
const MAX_FIX_CHARS: usize = 300;

/// A required gate that failed in one run of a task and passed in a later one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GateFix {
    /// The gate's argv.
    pub command: Vec<String>,
    /// Its exit code when it failed (`None`: it timed out).
    pub exit_code: Option<i64>,
    /// The run whose gate failed, the resolve that decided the fix (when one did), the run
    /// whose gate passed.
    pub failed: Uuid,
    pub decided: Option<Uuid>,
    pub passed: Uuid,
    /// What the fix was, as the trace recorded it (the resolver's instructions, its corrective
    /// commands, or the task's instructions of the passing run): untrusted text.
    pub fix: String,
    /// The task's title.
    pub task: String,
}

/// A self-review that asked for changes on a branch, and a later one that approved it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReviewFix {
    pub asked: Uuid,
    pub approved: Uuid,
    /// What the review asked for (`file: what`), untrusted text.
    pub findings: Vec<String>,
    pub files: Vec<String>,
    pub task: String,
}

/// A run given lessons whose required gate still failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FailedDespite {
    pub span: Uuid,
    pub command: Vec<String>,
    pub lessons: Vec<String>,
}

/// Whether the trace's event came from someone rover trusts: a GitHub event whose author the
/// coordinator's trust check accepted, or a local request (rover's own user).
pub fn trusted_author(view: &TraceView) -> bool {
    let local = view
        .root()
        .and_then(|r| EventMeta::of(r).ok())
        .is_some_and(|m| m.source == EventSource::Local);
    let checked = view
        .spans
        .iter()
        .filter(|s| s.step == StepKind::Coordinate)
        .find_map(|s| CoordinateSpanMeta::of(s).trust.flatten());
    match checked {
        Some(decision) => decision.trusted,
        None => local,
    }
}

/// A workflow run, its action's task and its gates, in the order the runs finished.
struct Run<'v> {
    span: &'v Span,
    task: WorkflowMeta,
    action: Uuid,
    gates: Option<GatesReport>,
}

fn runs(view: &TraceView) -> Vec<Run<'_>> {
    let mut runs: Vec<Run<'_>> = view
        .spans
        .iter()
        .filter(|s| s.step == StepKind::Workflow && s.status.is_final())
        .filter_map(|span| {
            let action_id = span.action_id?;
            let action = view.actions.iter().find(|a| a.id == action_id)?;
            let task: WorkflowMeta = meta::read(action).ok()?;
            let gates = match GatesSpanMeta::of(span).gates {
                Some(GatesMeta::Report(report)) => Some(report),
                _ => None,
            };
            Some(Run {
                span,
                task,
                action: action_id,
                gates,
            })
        })
        .collect();
    runs.sort_by_key(|r| r.span.completed.unwrap_or(r.span.timestamp));
    runs
}

/// The required gates of a run that failed: argv and exit code.
fn failed_gates(run: &Run<'_>) -> Vec<(Vec<String>, Option<i64>)> {
    run.gates
        .iter()
        .flat_map(GatesReport::results)
        .filter(|g| g.required && !g.passed())
        .map(|g| {
            let code = match g.outcome {
                GateOutcome::Failed { exit_code } => Some(exit_code),
                _ => None,
            };
            (g.command.clone(), code)
        })
        .collect()
}

fn passed_gate(run: &Run<'_>, command: &[String]) -> bool {
    run.gates
        .iter()
        .flat_map(GatesReport::results)
        .any(|g| g.command == command && g.passed())
}

/// `text` on one line, at most [`MAX_FIX_CHARS`] characters, without control characters (a
/// resolver's words: no escape sequence of theirs is kept).
pub(super) fn one_line(text: &str) -> String {
    let line = text
        .split(|c: char| c.is_whitespace() || c.is_control())
        .filter(|w| !w.is_empty())
        .collect::<Vec<_>>()
        .join(" ");
    if line.chars().count() <= MAX_FIX_CHARS {
        return line;
    }
    let mut cut: String = line.chars().take(MAX_FIX_CHARS).collect();
    cut.push('…');
    cut
}

/// What the resolve between two runs decided to change, as it recorded it.
pub(super) fn fix_of(resolve: &Span) -> Option<String> {
    let meta = ResolveSpanMeta::read(&resolve.meta).ok()?;
    let mut parts = Vec::new();
    if let Some(Some(text)) = meta
        .instructions
        .filter(|t| t.as_ref().is_some_and(|t| !t.trim().is_empty()))
    {
        parts.push(text);
    }
    let commands: Vec<String> = meta
        .corrective_commands
        .unwrap_or_default()
        .into_iter()
        .map(|c| format!("`{}`", c.command))
        .collect();
    if !commands.is_empty() {
        parts.push(format!("ran {}", commands.join(", ")));
    }
    (!parts.is_empty()).then(|| one_line(&parts.join("; ")))
}

/// The latest resolve that decided an `iterate` or a `retry` after span `failed` ended and
/// before span `passed` started: the decision that made the fix.
pub(super) fn fix_between<'v>(
    view: &'v TraceView,
    failed: &Span,
    passed: &Span,
) -> Option<&'v Span> {
    let failed_at = failed.completed.unwrap_or(failed.timestamp);
    view.spans
        .iter()
        .filter(|s| s.step == StepKind::Resolve)
        .filter(|s| s.timestamp >= failed_at && s.timestamp <= passed.timestamp)
        .rev()
        .find(|s| {
            matches!(
                super::decision_of(s),
                Some(Decision::Iterate | Decision::Retry)
            )
        })
}

/// Every required gate that failed in a run and passed in a later run of the same task, with
/// the fix between them. A gate that never passed teaches nothing.
pub fn gate_fixes(view: &TraceView) -> Vec<GateFix> {
    let runs = runs(view);
    let mut fixes = Vec::new();
    for (i, failed) in runs.iter().enumerate() {
        for (command, exit_code) in failed_gates(failed) {
            let same_task = |r: &&Run<'_>| {
                r.task.iterate_on == Some(failed.action) || r.task.title == failed.task.title
            };
            let Some(passed) = runs[i + 1..]
                .iter()
                .filter(same_task)
                .find(|r| passed_gate(r, &command))
            else {
                continue;
            };
            let resolve = fix_between(view, failed.span, passed.span);
            let fix = resolve
                .and_then(fix_of)
                .or_else(|| passed.task.instructions.as_deref().map(one_line))
                .filter(|f| !f.is_empty());
            let Some(fix) = fix else { continue };
            fixes.push(GateFix {
                command,
                exit_code,
                failed: failed.span.id,
                decided: resolve.map(|s| s.id),
                passed: passed.span.id,
                fix,
                task: failed.task.title.clone(),
            });
        }
    }
    fixes
}

/// Every review that asked for changes on a branch a later review of the trace approved.
pub fn review_fixes(view: &TraceView) -> Vec<ReviewFix> {
    let reviews: Vec<(&Span, ReviewSpanMeta)> = view
        .spans
        .iter()
        .filter_map(|s| ReviewSpanMeta::of(s).map(|m| (s, m)))
        .collect();
    let mut fixes = Vec::new();
    for (i, (span, meta)) in reviews.iter().enumerate() {
        for asked in meta
            .reviews
            .iter()
            .filter(|r| r.verdict == ReviewVerdict::Changes)
        {
            let approved = reviews[i + 1..].iter().find(|(_, later)| {
                later
                    .reviews
                    .iter()
                    .any(|r| r.branch == asked.branch && r.verdict == ReviewVerdict::Approve)
            });
            let Some((approved, _)) = approved else {
                continue;
            };
            if asked.findings.is_empty() {
                continue;
            }
            fixes.push(ReviewFix {
                asked: span.id,
                approved: approved.id,
                findings: asked
                    .findings
                    .iter()
                    .map(|f| one_line(&format!("{}: {}", f.file, f.what)))
                    .collect(),
                files: asked.findings.iter().map(|f| f.file.clone()).collect(),
                task: asked.title.clone(),
            });
        }
    }
    fixes
}

/// Every run that was given lessons and whose required gate failed anyway.
pub fn failed_despite_lessons(view: &TraceView) -> Vec<FailedDespite> {
    runs(view)
        .iter()
        .flat_map(|run| {
            let lessons = LessonsSpanMeta::of(run.span).lessons;
            failed_gates(run)
                .into_iter()
                .filter(move |_| !lessons.is_empty())
                .map(move |(command, _)| FailedDespite {
                    span: run.span.id,
                    command,
                    lessons: LessonsSpanMeta::of(run.span).lessons,
                })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sandbox::gates::GateResult;
    use crate::steps::history::testing::Builder;
    use crate::store::SpanStatus;

    fn gates(command: &str, outcome: GateOutcome) -> crate::store::Meta {
        let report = GatesReport::Ran {
            results: vec![GateResult {
                command: vec!["make".into(), command.into()],
                required: true,
                outcome,
                output: String::new(),
                output_over_limit: false,
            }],
        };
        crate::store::to_meta(&GatesSpanMeta {
            gates: Some(GatesMeta::Report(report)),
        })
    }

    fn task(title: &str) -> crate::store::Meta {
        crate::store::to_meta(&WorkflowMeta {
            title: title.into(),
            ..WorkflowMeta::default()
        })
    }

    fn iterate(b: &mut Builder, instructions: &str) -> Uuid {
        let mut out = crate::store::to_meta(&ResolveSpanMeta {
            instructions: Some(Some(instructions.into())),
            ..ResolveSpanMeta::default()
        });
        out.insert("decision".into(), "iterate".into());
        b.span(
            StepKind::Resolve,
            SpanStatus::Completed,
            crate::store::Meta::new(),
            out,
        )
    }

    #[test]
    fn a_gate_that_failed_then_passed_after_an_iterate_is_a_fix_with_its_evidence() {
        let mut b = Builder::new();
        let failed = b.span(
            StepKind::Workflow,
            SpanStatus::Failed,
            task("Add a"),
            gates("test", GateOutcome::Failed { exit_code: 2 }),
        );
        let resolve = iterate(&mut b, "Run `make gen` before `make test`.");
        let passed = b.span(
            StepKind::Workflow,
            SpanStatus::Completed,
            task("Add a"),
            gates("test", GateOutcome::Passed),
        );
        let fixes = gate_fixes(&b.view);
        assert_eq!(fixes.len(), 1, "{fixes:?}");
        let fix = &fixes[0];
        assert_eq!(fix.command, vec!["make", "test"]);
        assert_eq!(fix.exit_code, Some(2));
        assert_eq!(fix.failed, b.span_of(failed));
        assert_eq!(fix.decided, Some(b.span_of(resolve)));
        assert_eq!(fix.passed, b.span_of(passed));
        assert_eq!(fix.fix, "Run `make gen` before `make test`.");
        assert_eq!(fix.task, "Add a");
    }

    #[test]
    fn a_fix_that_never_passed_teaches_nothing() {
        let mut b = Builder::new();
        b.span(
            StepKind::Workflow,
            SpanStatus::Failed,
            task("Add a"),
            gates("test", GateOutcome::Failed { exit_code: 2 }),
        );
        iterate(&mut b, "Try harder.");
        b.span(
            StepKind::Workflow,
            SpanStatus::Failed,
            task("Add a"),
            gates("test", GateOutcome::Failed { exit_code: 2 }),
        );
        assert!(gate_fixes(&b.view).is_empty());
    }

    #[test]
    fn a_review_that_asked_for_changes_and_then_approved_is_a_fix() {
        use crate::steps::history::testing::task_review;
        let mut b = Builder::new();
        let asked = b.review(
            SpanStatus::Completed,
            vec![task_review("rover/a", "h1", ReviewVerdict::Changes)],
        );
        assert!(review_fixes(&b.view).is_empty(), "not approved yet");
        let approved = b.review(
            SpanStatus::Completed,
            vec![task_review("rover/a", "h2", ReviewVerdict::Approve)],
        );
        let fixes = review_fixes(&b.view);
        assert_eq!(fixes.len(), 1);
        assert_eq!(fixes[0].asked, b.span_of(asked));
        assert_eq!(fixes[0].approved, b.span_of(approved));
        assert_eq!(fixes[0].findings, vec!["src/main.rs: no test for --json"]);
        assert_eq!(fixes[0].files, vec!["src/main.rs"]);
    }

    #[test]
    fn a_run_given_lessons_that_failed_anyway_is_found() {
        let mut b = Builder::new();
        let mut out = gates("test", GateOutcome::Failed { exit_code: 2 });
        out.extend(crate::store::to_meta(&LessonsSpanMeta {
            lessons: vec!["l-1".into()],
        }));
        let span = b.span(StepKind::Workflow, SpanStatus::Failed, task("Add a"), out);
        let found = failed_despite_lessons(&b.view);
        assert_eq!(found.len(), 1);
        assert_eq!(found[0].span, b.span_of(span));
        assert_eq!(found[0].lessons, vec!["l-1"]);
        assert_eq!(found[0].command, vec!["make", "test"]);
    }

    #[test]
    fn only_a_trusted_author_or_a_local_request_may_teach() {
        let mut b = Builder::new();
        let trust = |trusted| {
            crate::store::to_meta(&CoordinateSpanMeta {
                trust: Some(Some(crate::github::TrustDecision {
                    trusted,
                    reason: "test".into(),
                })),
                ..CoordinateSpanMeta::default()
            })
        };
        assert!(!trusted_author(&b.view), "no event, no trust");
        b.span(
            StepKind::Coordinate,
            SpanStatus::Completed,
            crate::store::Meta::new(),
            trust(false),
        );
        assert!(!trusted_author(&b.view));
        let mut t = Builder::new();
        t.span(
            StepKind::Coordinate,
            SpanStatus::Completed,
            crate::store::Meta::new(),
            trust(true),
        );
        assert!(trusted_author(&t.view));
    }
}

#[cfg(test)]
mod one_line_tests {
    #[test]
    fn a_fix_keeps_no_control_character_and_stays_on_one_line() {
        let fix = super::one_line("run \u{1b}[2J\u{1b}]0;owned\u{7}make gen\nthen\ttest\r\n");
        assert!(!fix.chars().any(char::is_control), "{fix:?}");
        assert_eq!(fix, "run [2J ]0;owned make gen then test");
    }
}
