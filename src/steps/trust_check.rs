//! When the trust check has no answer: what the `coordinate` step does about an author whose
//! permission could not be looked up (for an event and a `/rover` command alike).

use super::meta::{CoordinateSpanMeta, DecidedBy, Decision, NoopMeta};
use super::Services;
use crate::orchestrator::{Finished, NextAction, StepError};
use crate::store::StepKind;

/// The permission lookup gave no definite answer. A transient failure (rate limit, 5xx,
/// network) is a retryable error: the orchestrator keeps the action queued and runs it again
/// after its backoff (not before a rate limit's reset), the error recorded in this span.
/// When the attempts are spent, or the failure is not transient (a token GitHub refuses),
/// the trace ends in a failed span and a `noop` that says so: an author rover could not
/// verify never makes it act, not even by a notify.
pub(super) fn trust_unknown(
    services: &Services,
    login: &str,
    error: &crate::github::GitHubError,
    attempt: u32,
) -> Result<Finished, StepError> {
    let max = services
        .config
        .autopilot
        .pipeline
        .orchestrator()
        .max_attempts;
    if error.is_retryable() && attempt < max {
        return Err(StepError::from_error(error, true)
            .not_before(error.retry_at())
            .detail("what", format!("looking up the permission of {login}"))
            .detail("login", login)
            .detail("decidedBy", DecidedBy::Trust));
    }
    let why = if error.is_retryable() {
        format!("after {attempt} attempts")
    } else {
        "and the failure is not transient".to_owned()
    };
    let reason = format!(
        "could not verify that {login} may make rover work ({why}): {}; nothing was done",
        crate::error::error_chain(error)
    );
    tracing::error!(%login, %reason, "trust lookup failed for good");
    let mut finished = Finished::failed(format!("decided noop: {reason}")).with_meta_record(
        &CoordinateSpanMeta::decided(Decision::Noop, DecidedBy::Trust),
    );
    StepError::from_error(error, error.is_retryable())
        .detail("login", login)
        .to_meta()
        .put_into(&mut finished.meta);
    Ok(finished.then(
        NextAction::new(StepKind::Noop, reason).with_meta(&NoopMeta {
            untrusted: true,
            ..NoopMeta::default()
        }),
    ))
}
