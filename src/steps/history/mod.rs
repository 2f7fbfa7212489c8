//! What the steps ask of a trace's past, answered in one place from its typed span and action
//! metas: every question is a named query here, with its tests, and no step reads the spans of
//! its trace on its own. (Steps never ask another step: they ask the trace.)
//!
//! - `decisions`: what the deciding spans decided (whether the coordinator acted, red looks at
//!   CI, the resolver's retries and waits, a resolve that already decided).
//! - `failures`: what went wrong (the failed runs, the last failure, the workflow behind it, a
//!   conflict, a push refused for secrets, a tampered worktree, an environment that did not
//!   build).
//! - `work`: where the work stands (what is busy, the tasks in plan order, what was committed
//!   and pushed, what a retry or a conflict goes back to, the image the runs used).
//! - `deps`: where a task's dependencies stand.
//! - `reviews`: what its self-reviews said (an approval of a head, a review without verdict,
//!   what a pull request body says was checked).
//! - `threads`: what the trace did on its thread and for people (its subject, its pull request,
//!   when it ended, a refusal it answered, an intervention a command marked).

mod decisions;
mod deps;
mod failures;
mod lessons;
mod lessons_ci;
mod lessons_clarify;
mod lessons_commit;
mod lessons_review;
mod reviews;
#[cfg(test)]
pub(crate) mod testing;
mod threads;
mod work;

pub use decisions::{
    coordinator_acted, decision_of, recorded_waits, red_ci_looks, resolver_waits, retries_so_far,
    superseding_resolve,
};
pub use deps::{dependency_state, Dependency};
pub use failures::{
    conflict_unchanged, environment_failed, environment_failure, failed_runs, failed_workflow,
    last_errored_run, last_failure, last_unsuccessful, latest_conflict, refused_for_secrets,
    tampered_span,
};
pub use lessons::{
    failed_despite_lessons, gate_fixes, review_fixes, trusted_author, FailedDespite, GateFix,
    ReviewFix,
};
pub use lessons_ci::{ci_fixes, CiFix};
pub use lessons_clarify::{clarified, planned_after_comment, Clarified};
pub use lessons_commit::{environment_fixes, hook_fixes, EnvironmentFix, HookFix};
pub use lessons_review::{confirms_pull_request, person_review_fix, PersonReviewFix};
pub use reviews::{approved_before, review_failed_since_last_commit, self_review_section};
pub use threads::{
    ended_at, intervention_marked, merge_approvals, merges_since, open_pull_request,
    pushed_pull_request, refusal_answered_since, subject_of, waiting_on,
};
pub use work::{
    action_named, action_of, busy, committed_branches, has_review_workflow, image_of, latest_image,
    latest_workflow_on_branch, recorded_task, retry_target, task_worktree, tasks_in_plan_order,
    unpushed_commit, waits_for_the_resolver, workflow_of_commit,
};
