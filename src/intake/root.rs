//! The root span and first action of a new trace: a GitHub event's (deterministic ids) or a
//! local request's, and the one-line label lists show.

use chrono::Utc;
use uuid::Uuid;

use super::meta::{EventMeta, EventSource, Reverting, RED_MAIN_FIX, RED_MAIN_REVERT};
use super::Entry;
use crate::github::{Channel, NormalizedEvent, Visibility};
use crate::store::{Action, Meta, Span, SpanStatus, StepKind};

/// A one-line label: `IssuesEvent opened #12 by alice`.
pub fn label(event: &NormalizedEvent) -> String {
    let mut parts = vec![event.kind.as_str().to_owned()];
    if let Some(action) = event.action {
        parts.push(action.as_str().to_owned());
    }
    match (event.number, &event.git_ref) {
        (Some(n), _) => parts.push(format!("#{n}")),
        (None, Some(git_ref)) => {
            parts.push(format!("to {}", git_ref.trim_start_matches("refs/heads/")));
        }
        (None, None) => {}
    }
    parts.push(format!("by {}", event.actor));
    if let (None, Some(sha)) = (event.number, &event.commit_sha) {
        parts.push(format!("({})", &sha[..sha.len().min(7)]));
    }
    parts.join(" ")
}

/// The root span and first action of the trace for a GitHub event (deterministic ids).
pub fn github_trace(entry: &Entry, event: &NormalizedEvent) -> (Span, Action) {
    let root_id = Uuid::new_v5(
        &Uuid::NAMESPACE_URL,
        format!("rover:{}:github-event:{}", entry.project_id, event.id).as_bytes(),
    );
    let meta = EventMeta {
        source: EventSource::Github,
        label: label(event),
        kind: event.kind.as_str().to_owned(),
        action: action_str(event),
        channel: event.channel.clone(),
        visibility: event.visibility,
        event: Some(event.clone()),
        request: None,
        follows: None,
        reverts: None,
    };
    build(
        root_id,
        &meta,
        format!("new {} event", event.kind.as_str()),
        &entry.first_step,
    )
}

/// The root span and first action of the trace for a local request (private, answered in the
/// trace itself).
pub fn local_trace(first_step: &StepKind, request: &str, actor: &str) -> (Span, Action) {
    let first_line = request
        .lines()
        .find(|l| !l.trim().is_empty())
        .unwrap_or_default();
    let short: String = first_line.chars().take(80).collect();
    let meta = EventMeta {
        source: EventSource::Local,
        label: format!("local request by {actor}: {short}"),
        kind: "LocalRequest".into(),
        action: None,
        channel: Channel::Local,
        visibility: Visibility::Private,
        event: None,
        request: Some(request.to_owned()),
        follows: None,
        reverts: None,
    };
    build(
        Uuid::new_v4(),
        &meta,
        "new local request".into(),
        first_step,
    )
}

/// The trace rover starts itself when its merge commit `sha` left the base branch red,
/// following trace `origin`: a request of rover's own to fix it (`lifecycle.onRedMain: "fix"`),
/// or, with `reverts`, to revert the merge (`"revert"`); answered in the trace (its pull
/// request says the rest). Its id derives from `origin` and `sha`, so a look that runs again
/// after a crash starts no second one.
pub fn red_main_trace(
    entry: &Entry,
    origin: Uuid,
    sha: &str,
    request: &str,
    reverts: Option<Reverting>,
) -> (Span, Action) {
    let root_id = Uuid::new_v5(
        &Uuid::NAMESPACE_URL,
        format!("rover:{}:red-main:{origin}:{sha}", entry.project_id).as_bytes(),
    );
    let meta = EventMeta {
        source: EventSource::Local,
        label: format!(
            "red main after rover's merge {}: {} (follows trace {})",
            &sha[..sha.len().min(7)],
            if reverts.is_some() { "revert" } else { "fix" },
            &origin.to_string()[..8]
        ),
        kind: if reverts.is_some() {
            RED_MAIN_REVERT.into()
        } else {
            RED_MAIN_FIX.into()
        },
        reverts,
        action: None,
        channel: Channel::Local,
        visibility: Visibility::Private,
        event: None,
        request: Some(request.to_owned()),
        follows: Some(origin),
    };
    build(
        root_id,
        &meta,
        "rover's merge left the base branch red".into(),
        &entry.first_step,
    )
}

fn build(root_id: Uuid, meta: &EventMeta, reason: String, first_step: &StepKind) -> (Span, Action) {
    let now = Utc::now();
    let mut root = Span::root(root_id, now, meta.to_meta());
    root.finish(SpanStatus::Completed, meta.label.clone(), Meta::new(), now)
        .expect("a new span finishes");
    let mut first = Action::new(first_step.clone(), &root, reason, Meta::new(), now);
    // Derived from the trace and the step's name: the same first action on a rerun.
    first.id = Uuid::new_v5(&root_id, first_step.as_str().as_bytes());
    (root, first)
}

pub(super) fn action_str(event: &NormalizedEvent) -> Option<String> {
    event.action.map(|a| a.as_str().to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The store lists a trace by its root span's summary, where the root is finished with the
    /// event's label, the same line its meta keeps: the list shows the label without the store
    /// reading intake's meta.
    #[test]
    fn the_store_lists_a_trace_by_the_label_intake_writes() {
        let (root, _) = local_trace(
            &StepKind::Other("first".into()),
            "\nfix the flaky test\nin ci",
            "alice",
        );
        let label = "local request by alice: fix the flaky test";
        assert_eq!(EventMeta::of(&root).expect("its meta").label, label);
        assert_eq!(crate::store::event_label(&root), label);

        let mut event = NormalizedEvent::local("7", "bob", "x", Utc::now());
        event.number = Some(12);
        let (root, _) = github_trace(&Entry::new("p", StepKind::Other("first".into())), &event);
        let label = EventMeta::of(&root).expect("its meta").label;
        assert!(label.ends_with("#12 by bob"), "{label}");
        assert_eq!(crate::store::event_label(&root), label);

        // A root without a summary (written by another implementation) is listed as `event`.
        let mut bare = root.clone();
        bare.summary = None;
        assert_eq!(crate::store::event_label(&bare), "event");
    }
}
