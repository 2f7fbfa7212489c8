//! GitHub webhook deliveries as pure logic: the `X-Hub-Signature-256` check, and a delivery
//! turned into the events-feed envelope `normalize_event` reads, so a webhook event and a polled
//! one become the same `NormalizedEvent`.

use chrono::{DateTime, SecondsFormat, Utc};
use hmac::{Hmac, Mac};
use serde_json::{json, Value};
use sha2::Sha256;

use super::events::{normalize_event, NormalizeOptions, NormalizedEvent, SkipReason};
use crate::host_env::HostEnv;

/// The webhook secret (required by `rover autopilot start --webhook`).
pub const SECRET_ENV: &str = "ROVER_WEBHOOK_SECRET";

static SEALED: std::sync::OnceLock<Option<String>> = std::sync::OnceLock::new();

/// Takes the webhook secret out of the environment (kept in memory) so no child process (hooks,
/// agents) inherits it. Call it first thing in `main`, before any thread exists, as
/// `seal_token` is, with the environment as the process started (`host`).
pub fn seal_secret(host: &HostEnv) {
    let secret = env_secret(host);
    std::env::remove_var(SECRET_ENV);
    let _ = SEALED.set(secret);
}

/// The webhook secret from `ROVER_WEBHOOK_SECRET` (as [`seal_secret`] kept it, when it ran,
/// else in `host`); an empty value does not count.
pub fn secret_from_env(host: &HostEnv) -> Option<String> {
    match SEALED.get() {
        Some(sealed) => sealed.clone(),
        None => env_secret(host),
    }
}

fn env_secret(host: &HostEnv) -> Option<String> {
    host.non_empty(SECRET_ENV)
}

/// The largest body GitHub delivers (25 MB); anything larger is refused.
pub const MAX_BODY_BYTES: usize = 25 * 1024 * 1024;

/// Why a delivery's signature was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SignatureError {
    #[error("no X-Hub-Signature-256 header")]
    Missing,
    #[error("X-Hub-Signature-256 is not `sha256=<64 hex digits>`")]
    Malformed,
    #[error("X-Hub-Signature-256 does not match the body (is ROVER_WEBHOOK_SECRET the webhook's secret?)")]
    Mismatch,
}

/// Check `X-Hub-Signature-256: sha256=<hex HMAC-SHA256 of the raw body>` in constant time.
pub fn verify_signature(
    secret: &[u8],
    body: &[u8],
    header: Option<&str>,
) -> Result<(), SignatureError> {
    let header = header.ok_or(SignatureError::Missing)?;
    let hex = header
        .trim()
        .strip_prefix("sha256=")
        .ok_or(SignatureError::Malformed)?;
    let expected = decode_hex(hex).ok_or(SignatureError::Malformed)?;
    if expected.len() != 32 {
        return Err(SignatureError::Malformed);
    }
    let mut mac = Hmac::<Sha256>::new_from_slice(secret).expect("hmac takes keys of any length");
    mac.update(body);
    mac.verify_slice(&expected)
        .map_err(|_| SignatureError::Mismatch)
}

/// The signature header value GitHub would send for `body` (for tests and tools).
pub fn sign(secret: &[u8], body: &[u8]) -> String {
    let mut mac = Hmac::<Sha256>::new_from_slice(secret).expect("hmac takes keys of any length");
    mac.update(body);
    let digest = mac.finalize().into_bytes();
    let mut out = String::from("sha256=");
    for b in digest {
        out.push(char::from_digit(u32::from(b >> 4), 16).expect("a nibble"));
        out.push(char::from_digit(u32::from(b & 0xf), 16).expect("a nibble"));
    }
    out
}

fn decode_hex(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok())
        .collect()
}

/// The events-feed `type` of a webhook's `X-GitHub-Event`, for the events rover reacts to.
pub fn feed_type(github_event: &str) -> Option<&'static str> {
    Some(match github_event {
        "issues" => "IssuesEvent",
        "issue_comment" => "IssueCommentEvent",
        "pull_request" => "PullRequestEvent",
        "pull_request_review" => "PullRequestReviewEvent",
        "pull_request_review_comment" => "PullRequestReviewCommentEvent",
        "push" => "PushEvent",
        _ => return None,
    })
}

/// What a verified delivery is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Delivery {
    /// GitHub's hello when a webhook is created.
    Ping,
    /// An event rover reacts to, normalized as the poller would.
    Event(Box<NormalizedEvent>),
    /// Not for rover: another event type, an action it ignores, its own doing, another repo.
    Skipped(String),
    /// A CI outcome (`check_run`, `check_suite` or `workflow_run` completed, a final `status`)
    /// for commit `sha` of the watched repository: no work by itself, intake hands it to the
    /// queue and the runs waiting on that commit look now (they read GitHub, not this payload).
    Ci { sha: String, what: String },
}

/// The commit a CI delivery reports an outcome for; `None` when it is not a final outcome.
pub fn ci_outcome_sha(github_event: &str, payload: &Value) -> Option<(String, String)> {
    let text = |p: &str| payload.pointer(p).and_then(Value::as_str);
    let (sha, what) = match github_event {
        "check_run" | "check_suite" | "workflow_run" => {
            let object = github_event;
            if text("/action") != Some("completed") {
                return None;
            }
            let conclusion = text(&format!("/{object}/conclusion")).unwrap_or("none");
            (
                text(&format!("/{object}/head_sha"))?,
                format!("{github_event} completed ({conclusion})"),
            )
        }
        "status" => {
            let state = text("/state")?;
            if state == "pending" {
                return None;
            }
            (text("/sha")?, format!("status {state}"))
        }
        _ => return None,
    };
    let valid = sha.len() >= 7 && sha.chars().all(|c| c.is_ascii_hexdigit());
    valid.then(|| (sha.to_ascii_lowercase(), what))
}

/// Turn a verified delivery into what rover does with it.
///
/// The webhook body is the event's payload itself (`action`, `sender`, `repository` and the
/// object); it is wrapped in the feed's envelope (`id` = the delivery id, `type`, `actor`,
/// `repo`, `payload`) and normalized by the same code as a polled event. A push says `after`
/// where the feed says `head`.
pub fn parse_delivery(
    github_event: &str,
    delivery_id: &str,
    body: &[u8],
    repo: Option<&str>,
    options: &NormalizeOptions,
    now: DateTime<Utc>,
) -> Result<Delivery, String> {
    if github_event == "ping" {
        return Ok(Delivery::Ping);
    }
    if matches!(
        github_event,
        "check_run" | "check_suite" | "workflow_run" | "status"
    ) {
        let payload: Value =
            serde_json::from_slice(body).map_err(|e| format!("the body is not JSON: {e}"))?;
        let full_name = payload
            .pointer("/repository/full_name")
            .and_then(Value::as_str)
            .ok_or("no repository.full_name")?;
        if let Some(repo) = repo.filter(|r| !full_name.eq_ignore_ascii_case(r)) {
            return Ok(Delivery::Skipped(format!(
                "repository {full_name} is not the watched {repo}"
            )));
        }
        return Ok(match ci_outcome_sha(github_event, &payload) {
            Some((sha, what)) => Delivery::Ci { sha, what },
            None => Delivery::Skipped(format!("`{github_event}` without a final outcome")),
        });
    }
    let Some(kind) = feed_type(github_event) else {
        return Ok(Delivery::Skipped(format!(
            "event type `{github_event}` is not one rover reacts to"
        )));
    };
    let mut payload: Value =
        serde_json::from_slice(body).map_err(|e| format!("the body is not JSON: {e}"))?;
    if !payload.is_object() {
        return Err("the body is not a JSON object".into());
    }
    let full_name = payload
        .pointer("/repository/full_name")
        .and_then(Value::as_str)
        .ok_or("no repository.full_name")?
        .to_owned();
    if let Some(repo) = repo {
        if !full_name.eq_ignore_ascii_case(repo) {
            return Ok(Delivery::Skipped(format!(
                "repository {full_name} is not the watched {repo}"
            )));
        }
    }
    let sender = payload
        .pointer("/sender/login")
        .and_then(Value::as_str)
        .ok_or("no sender.login")?
        .to_owned();
    if kind == "PushEvent" && payload.get("head").is_none() {
        if let Some(after) = payload.get("after").cloned() {
            payload["head"] = after;
        }
    }
    let public = payload
        .pointer("/repository/private")
        .and_then(Value::as_bool)
        .is_none_or(|private| !private);
    let envelope = json!({
        "id": delivery_id,
        "type": kind,
        "actor": {"login": sender},
        "repo": {"name": full_name},
        "payload": payload,
        "public": public,
        "created_at": now.to_rfc3339_opts(SecondsFormat::Secs, true),
    });
    match normalize_event(&envelope, options) {
        Ok(event) => Ok(Delivery::Event(Box::new(event))),
        Err(SkipReason::Malformed(why)) => Err(why),
        Err(reason) => Ok(Delivery::Skipped(skip_text(&reason))),
    }
}

fn skip_text(reason: &SkipReason) -> String {
    match reason {
        SkipReason::UnknownType(t) => format!("event type `{t}` is not one rover reacts to"),
        SkipReason::IgnoredAction(a) => format!("action `{a}` is not one rover reacts to"),
        SkipReason::Own => "rover's own doing".into(),
        SkipReason::Malformed(why) => format!("malformed: {why}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::github::{Channel, EventAction, EventKind};

    const SECRET: &[u8] = b"It's a Secret to Everybody";

    #[test]
    fn a_completed_check_run_or_a_final_status_names_its_commit() {
        let sha = "6dcb09b5b57875f334f61aebed695e2e4193db5e";
        let run = serde_json::json!({"action": "completed",
            "check_run": {"id": 4, "head_sha": sha, "status": "completed", "conclusion": "failure", "name": "ci / test"},
            "repository": {"full_name": "octo-org/widgets"}, "sender": {"login": "github-actions[bot]"}});
        let body = serde_json::to_vec(&run).unwrap();
        let options = NormalizeOptions::default();
        match parse_delivery(
            "check_run",
            "d1",
            &body,
            Some("octo-org/widgets"),
            &options,
            Utc::now(),
        ) {
            Ok(Delivery::Ci { sha: got, what }) => {
                assert_eq!(got, sha);
                assert_eq!(what, "check_run completed (failure)");
            }
            other => panic!("expected a ci delivery, got {other:?}"),
        }
        // Not yet an outcome, or another repository: skipped.
        let mut created = run.clone();
        created["action"] = "created".into();
        let body = serde_json::to_vec(&created).unwrap();
        assert!(matches!(
            parse_delivery(
                "check_run",
                "d2",
                &body,
                Some("octo-org/widgets"),
                &options,
                Utc::now()
            ),
            Ok(Delivery::Skipped(_))
        ));
        let body = serde_json::to_vec(&run).unwrap();
        assert!(matches!(
            parse_delivery(
                "check_run",
                "d3",
                &body,
                Some("octo-org/other"),
                &options,
                Utc::now()
            ),
            Ok(Delivery::Skipped(_))
        ));
        let status = serde_json::json!({"sha": sha, "state": "success", "context": "ci/build"});
        assert_eq!(
            ci_outcome_sha("status", &status),
            Some((sha.to_owned(), "status success".to_owned()))
        );
        // A GitHub Actions workflow run, completed or not yet.
        let mut workflow = serde_json::json!({"action": "completed",
            "workflow_run": {"id": 30_433_642, "name": "Build", "head_sha": sha, "status": "completed", "conclusion": "success"}});
        assert_eq!(
            ci_outcome_sha("workflow_run", &workflow),
            Some((
                sha.to_owned(),
                "workflow_run completed (success)".to_owned()
            ))
        );
        workflow["action"] = "in_progress".into();
        assert_eq!(ci_outcome_sha("workflow_run", &workflow), None);
        let pending = serde_json::json!({"sha": sha, "state": "pending"});
        assert_eq!(ci_outcome_sha("status", &pending), None);
        let bogus = serde_json::json!({"sha": "../../etc", "state": "failure"});
        assert_eq!(ci_outcome_sha("status", &bogus), None);
    }

    #[test]
    fn github_documented_signature_verifies() {
        // The example in GitHub's "Validating webhook deliveries" docs.
        let body = b"Hello, World!";
        let header = "sha256=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17";
        assert_eq!(sign(SECRET, body), header);
        assert_eq!(verify_signature(SECRET, body, Some(header)), Ok(()));
    }

    #[test]
    fn bad_missing_and_malformed_signatures_are_refused() {
        let body = b"{}";
        let good = sign(SECRET, body);
        assert_eq!(
            verify_signature(b"other", body, Some(&good)),
            Err(SignatureError::Mismatch)
        );
        assert_eq!(
            verify_signature(SECRET, b"{} ", Some(&good)),
            Err(SignatureError::Mismatch)
        );
        assert_eq!(
            verify_signature(SECRET, body, None),
            Err(SignatureError::Missing)
        );
        for bad in ["sha1=00", "sha256=zz", "sha256=abc", "sha256=00"] {
            assert_eq!(
                verify_signature(SECRET, body, Some(bad)),
                Err(SignatureError::Malformed),
                "{bad}"
            );
        }
    }

    #[allow(
        clippy::needless_pass_by_value,
        reason = "call sites build the payload inline"
    )]
    fn webhook_body(extra: Value) -> Vec<u8> {
        let mut body = json!({
            "sender": {"login": "alice", "id": 1},
            "repository": {"full_name": "octo-org/widgets", "private": false},
        });
        for (k, v) in extra.as_object().expect("an object") {
            body[k] = v.clone();
        }
        serde_json::to_vec(&body).expect("json")
    }

    #[test]
    fn webhook_and_feed_shapes_normalize_to_the_same_event_and_key() {
        let opts = NormalizeOptions::default();
        let body = webhook_body(json!({"action": "created",
            "issue": {"number": 5, "updated_at": "2026-01-01T00:00:00Z"},
            "comment": {"id": 77, "body": "why?", "html_url": "h"}}));
        let Delivery::Event(hook) = parse_delivery(
            "issue_comment",
            "d-1",
            &body,
            Some("octo-org/widgets"),
            &opts,
            Utc::now(),
        )
        .expect("parses") else {
            panic!("an event")
        };
        let feed = json!({"id": "123", "type": "IssueCommentEvent", "actor": {"login": "alice"},
            "repo": {"name": "octo-org/widgets"}, "created_at": "2026-01-01T00:00:00Z",
            "payload": {"action": "created", "issue": {"number": 5},
                        "comment": {"id": 77, "body": "why?", "html_url": "h"}}});
        let polled = normalize_event(&feed, &opts).expect("kept");
        assert_eq!(hook.id, "d-1");
        assert_eq!(hook.kind, EventKind::IssueComment);
        assert_eq!(hook.channel, Channel::IssueComment { number: 5 });
        assert_eq!(hook.dedupe_key, polled.dedupe_key);
        assert_eq!(
            hook.dedupe_key.as_deref(),
            Some("IssueCommentEvent:comment:77")
        );
    }

    #[test]
    fn push_after_is_the_head_and_review_submitted_matches_the_feeds_created() {
        let opts = NormalizeOptions::default();
        let body = webhook_body(json!({"ref": "refs/heads/main", "before": "a", "after": "b"}));
        let Ok(Delivery::Event(push)) =
            parse_delivery("push", "d-2", &body, None, &opts, Utc::now())
        else {
            panic!("a push event")
        };
        assert_eq!(push.commit_sha.as_deref(), Some("b"));
        assert_eq!(
            push.dedupe_key.as_deref(),
            Some("PushEvent:refs/heads/main:b")
        );
        let body = webhook_body(json!({"action": "submitted",
            "pull_request": {"number": 8}, "review": {"id": 900, "body": "ok", "state": "CHANGES_REQUESTED"}}));
        let Ok(Delivery::Event(review)) =
            parse_delivery("pull_request_review", "d-3", &body, None, &opts, Utc::now())
        else {
            panic!("a review event")
        };
        assert_eq!(review.action, Some(EventAction::Submitted));
        assert_eq!(review.review_state.as_deref(), Some("changes_requested"));
        assert_eq!(
            review.dedupe_key.as_deref(),
            Some("PullRequestReviewEvent:review:900")
        );
    }

    #[test]
    fn ping_other_types_actions_and_repos_are_not_events() {
        let opts = NormalizeOptions::default();
        let now = Utc::now();
        let body = webhook_body(json!({"zen": "Keep it simple."}));
        assert_eq!(
            parse_delivery("ping", "d", &body, None, &opts, now),
            Ok(Delivery::Ping)
        );
        assert!(matches!(
            parse_delivery("star", "d", &body, None, &opts, now),
            Ok(Delivery::Skipped(_))
        ));
        let body = webhook_body(json!({"action": "edited", "issue": {"number": 1}}));
        assert!(matches!(
            parse_delivery("issues", "d", &body, None, &opts, now),
            Ok(Delivery::Skipped(why)) if why.contains("edited")
        ));
        let body = webhook_body(json!({"action": "opened", "issue": {"number": 1}}));
        assert!(matches!(
            parse_delivery("issues", "d", &body, Some("other/repo"), &opts, now),
            Ok(Delivery::Skipped(why)) if why.contains("other/repo")
        ));
        assert!(parse_delivery("issues", "d", b"not json", None, &opts, now).is_err());
    }
}
