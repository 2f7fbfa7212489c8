//! Tests of the octocrab client's parts: paths, error mapping, pages.

#[derive(Debug, thiserror::Error)]
#[error("sending the request failed")]
struct Wrapper(#[source] std::io::Error);

#[test]
fn a_timeout_deep_in_the_chain_is_a_timeout() {
    let deep = Wrapper(std::io::Error::new(
        std::io::ErrorKind::TimedOut,
        "read timed out",
    ));
    assert!(timed_out(&deep));
    let refused = Wrapper(std::io::Error::new(
        std::io::ErrorKind::ConnectionRefused,
        "refused",
    ));
    assert!(!timed_out(&refused));
}

use super::*;

fn meta(status: u16) -> ResponseMeta {
    ResponseMeta {
        status,
        ..ResponseMeta::default()
    }
}

#[test]
fn statuses_map_to_typed_errors() {
    let now = Utc::now();
    assert!(check_status("x", &meta(201), "", now).is_ok());
    assert!(matches!(
        check_status("x", &meta(401), "{\"message\":\"Bad credentials\"}", now),
        Err(GitHubError::BadCredentials { .. })
    ));
    assert!(matches!(
        check_status("x", &meta(404), "{}", now),
        Err(GitHubError::NotFound { .. })
    ));
    assert!(matches!(
        check_status(
            "x",
            &meta(403),
            "{\"message\":\"Resource not accessible\"}",
            now
        ),
        Err(GitHubError::Forbidden { .. })
    ));
    assert!(matches!(
        check_status("x", &meta(429), "{}", now),
        Err(GitHubError::RateLimited { .. })
    ));
    let mut m = meta(403);
    m.retry_after = Some(Duration::from_secs(30));
    match check_status("x", &m, "{}", now) {
        Err(GitHubError::RateLimited { until, .. }) => {
            assert_eq!(until, now + TimeDelta::seconds(30));
        }
        other => panic!("expected rate limited, got {other:?}"),
    }
    let body = r#"{"message":"Validation Failed","errors":[{"resource":"PullRequest","code":"custom","message":"A pull request already exists for o:b."}]}"#;
    match check_status("x", &meta(422), body, now) {
        Err(GitHubError::Validation { errors, .. }) => assert_eq!(
            errors,
            vec!["A pull request already exists for o:b.".to_owned()]
        ),
        other => panic!("expected validation, got {other:?}"),
    }
    assert!(matches!(
        check_status("x", &meta(502), "", now),
        Err(GitHubError::Server { status: 502, .. })
    ));
}

#[test]
fn urls_and_encoding() {
    assert_eq!(web_url_for("https://api.github.com/"), "https://github.com");
    assert_eq!(
        web_url_for("https://ghe.example/api/v3"),
        "https://ghe.example"
    );
    assert_eq!(encode("o:feat/x y&z", false), "o%3Afeat%2Fx%20y%26z");
    assert_eq!(encode("feat/x", true), "feat/x");
}
