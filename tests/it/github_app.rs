//! rover as a GitHub App: the real binary with `github.appId` and a private key, against the
//! fake GitHub that verifies the app's JWT (RS256, with the app's public key) and expires its
//! installation tokens after a few seconds, and a real git remote over HTTP that takes only a
//! token the fake accepts at that moment.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::json;

use crate::support::env::{stderr, stdout};
use crate::support::fake_github::FakeApp;
use crate::support::scenario::{chain, coordinate, csv_issue, one_task_issue, Scenario, NOTIFY};

const APP_ID: u64 = 424_242;
const SLUG: &str = "rover-app";
const INSTALLATION: u64 = 77_001;

/// `openssl <args> <more>`, which must succeed.
fn openssl(args: &[&str], more: &[&Path]) {
    let ok = std::process::Command::new("openssl")
        .args(args)
        .args(more)
        .output()
        .expect("openssl");
    assert!(
        ok.status.success(),
        "{}",
        String::from_utf8_lossy(&ok.stderr)
    );
}

/// A 2048-bit RSA key pair made with `openssl` (PKCS#1, as GitHub hands out): the private
/// key's path and the public key's PEM.
pub(crate) fn key_pair(dir: &Path, name: &str) -> (PathBuf, String) {
    let key = dir.join(format!("{name}.pem"));
    let public = dir.join(format!("{name}.pub.pem"));
    openssl(
        &["genrsa", "-traditional", "-out"],
        &[&key, Path::new("2048")],
    );
    openssl(
        &["rsa", "-pubout", "-in"],
        &[&key, Path::new("-out"), &public],
    );
    (key, std::fs::read_to_string(public).expect("public key"))
}

/// Every file under `dir`, with its bytes.
fn files_under(dir: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_owned()];
    while let Some(d) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in entries.flatten() {
            let path = e.path();
            let Ok(meta) = std::fs::symlink_metadata(&path) else {
                continue;
            };
            if meta.is_dir() {
                stack.push(path);
            } else if meta.is_file() {
                if let Ok(bytes) = std::fs::read(&path) {
                    out.push((path, bytes));
                }
            }
        }
    }
    out
}

fn contains(hay: &[u8], needle: &str) -> bool {
    hay.windows(needle.len()).any(|w| w == needle.as_bytes())
}

async fn app_scenario(dir: &Path, ttl: Duration) -> (Scenario, PathBuf) {
    let (key, public) = key_pair(dir, "app");
    let mut s = Scenario::new().await;
    s.github
        .use_app(FakeApp::new(APP_ID, SLUG, INSTALLATION, &public, ttl));
    s.as_app(APP_ID, key.clone());
    (s, key)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_github_app_daemon_keeps_polling_commenting_and_pushing_across_token_expiries() {
    let keys = tempfile::tempdir().unwrap();
    let (mut s, key) = app_scenario(keys.path(), Duration::from_secs(4)).await;
    let git_server = s.serve_origin_over_http().await;
    s.with_sandbox().await;
    // Phase 2's question is answered directly (its rule comes first: only its prompt has it).
    s.answer(
        "Does it quote fields?",
        coordinate("notify", json!({"message": "It does."})),
    );
    // The task takes a few seconds in its container, so the push comes after a renewal.
    s.rules.push(json!({"prompt_contains": "## Task: Add the csv flag", "run": ["sleep 6"],
        "write": {"csv.txt": "Add the csv flag\n"},
        "structured": {"status": "completed", "summary": "Add the csv flag: completed", "files_changed": []}}));
    csv_issue(&mut s, 30);
    s.answer(NOTIFY, json!({"message": "Opened a PR for --csv."}));
    let out_path = s.env.path().join("daemon.out");
    let log = std::fs::File::create(&out_path).unwrap();
    let mut child = s
        .start_command(&[])
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .expect("start rover");
    let wait_settled = |s: &Scenario, limit: Duration| {
        let start = Instant::now();
        while !s.settled() || s.traces().is_empty() {
            let out = std::fs::read_to_string(s.env.path().join("daemon.out")).unwrap_or_default();
            assert!(
                start.elapsed() < limit && !out.contains("error: "),
                "not settled: {:?} (JWTs refused: {:?})\n{out}",
                s.traces().iter().map(chain).collect::<Vec<_>>(),
                s.github.app().jwts_refused,
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    };
    tokio::task::block_in_place(|| wait_settled(&s, Duration::from_secs(180)));
    let pulls = s.github.pulls();
    assert_eq!(pulls.len(), 1, "one pull request: {pulls:?}");
    let phase1_tokens = s.github.app().tokens.len();

    // The daemon goes on polling while tokens expire at least twice (each lives 4 s: on a
    // loaded machine a poll may come late, so this waits for the renewals, not for a time)...
    // The feed is read with the token valid at the time: waited for until it was read with four
    // of them (a poll may come late on a loaded machine, and then skip a token's short life).
    let poll_tokens = |s: &Scenario| -> usize {
        s.github
            .requests()
            .iter()
            .filter(|r| r.path.ends_with("/events"))
            .filter_map(|r| r.headers.get("authorization").cloned())
            .collect::<std::collections::BTreeSet<String>>()
            .len()
    };
    let start = Instant::now();
    let idle_tokens = loop {
        let idle_tokens = s.github.app().tokens.len();
        if idle_tokens >= phase1_tokens + 2 && poll_tokens(&s) >= 4 {
            break idle_tokens;
        }
        assert!(
            start.elapsed() < Duration::from_secs(90),
            "polling renewed the token while idle: {phase1_tokens} then {idle_tokens}, the feed read with {} tokens",
            poll_tokens(&s)
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    // ...and still answers a comment.
    let question = s.github.add_comment(30, "alice", "Does it quote fields?");
    s.github.seed_event("IssueCommentEvent", "alice", json!({"action": "created", "issue": {"number": 30},
        "comment": {"id": question, "body": "Does it quote fields?", "user": {"login": "alice"},
            "html_url": format!("https://github.com/octo-org/widgets/issues/30#issuecomment-{question}")}}));
    tokio::task::block_in_place(|| {
        let start = Instant::now();
        while s.traces().len() < 2 || !s.settled() {
            assert!(
                start.elapsed() < Duration::from_secs(60),
                "the comment was not answered:\n{}",
                std::fs::read_to_string(&out_path).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    });
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(i32::try_from(child.id()).unwrap()),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let status = tokio::task::block_in_place(|| child.wait()).unwrap();
    let out = std::fs::read_to_string(&out_path).unwrap_or_default();
    assert!(status.success(), "{out}");
    assert!(
        out.contains("as the GitHub App rover-app[bot] (app 424242, installation 77001)"),
        "{out}"
    );

    // Picked up, as the app: 👀 on the issue and on the question.
    let reactions = s.github.reactions();
    for target in ["issue:30".to_owned(), format!("comment:{question}")] {
        assert!(
            reactions.contains(&(target.clone(), "rover-app[bot]".into(), "eyes".into())),
            "{target}: {reactions:?}"
        );
    }
    let app = s.github.app();
    let tokens: Vec<String> = app.tokens.iter().map(|(t, _)| t.clone()).collect();
    assert!(app.jwts_refused.is_empty(), "{:?}", app.jwts_refused);
    // Never a request with an expired token: each was renewed before it expired.
    assert_eq!(app.expired_uses, 0, "requests made with an expired token");
    let requests = s.github.requests();
    let refused: Vec<_> = requests.iter().filter(|r| r.status == 401).collect();
    assert!(refused.is_empty(), "requests refused: {refused:?}");
    // The installation was looked up with the JWT; the events feed was read with many tokens.
    assert_eq!(
        s.github.count(
            &axum::http::Method::GET,
            "/repos/octo-org/widgets/installation"
        ),
        1
    );
    let poll_tokens: std::collections::BTreeSet<String> = requests
        .iter()
        .filter(|r| r.path.ends_with("/events"))
        .filter_map(|r| r.headers.get("authorization").cloned())
        .collect();
    assert!(
        poll_tokens.len() >= 4,
        "the feed was polled with {} tokens",
        poll_tokens.len()
    );
    // Commenting: both answers by the app's bot, the second with a token minted after the
    // first phase.
    let ours: Vec<(u64, String, String)> = s
        .github
        .comments_of(30)
        .into_iter()
        .filter(|(_, author, _)| author == "rover-app[bot]")
        .collect();
    assert_eq!(ours.len(), 2, "{ours:?}");
    let comment_posts: Vec<String> = requests
        .iter()
        .filter(|r| r.method == axum::http::Method::POST && r.path.ends_with("/issues/30/comments"))
        .filter_map(|r| r.headers.get("authorization").cloned())
        .collect();
    let last_comment_token = comment_posts.last().expect("a comment post");
    let index = tokens
        .iter()
        .position(|t| last_comment_token == &format!("Bearer {t}"))
        .expect("the comment's token was minted by the app");
    assert!(index >= idle_tokens - 1, "{index} < {idle_tokens}");
    // Pushing: through the HTTP remote, with a token that had been renewed at least once.
    let pushes = git_server.accepted_pushes();
    assert!(!pushes.is_empty(), "{:?}", git_server.requests());
    for token in &pushes {
        let at = tokens
            .iter()
            .position(|t| t == token)
            .expect("an app token");
        assert!(
            at >= 1,
            "the push used the first token: no renewal reached git"
        );
    }
    assert!(
        git_server
            .requests()
            .iter()
            .all(|r| r.accepted != Some(false) && r.user.as_deref() != Some("")),
        "git was given a token the remote refused"
    );
    assert!(git_server
        .requests()
        .iter()
        .filter(|r| r.accepted == Some(true))
        .all(|r| r.user.as_deref() == Some("x-access-token") && !r.query.contains("token")));
    // Nothing under the data dir holds a token or a piece of the key.
    let pem = std::fs::read_to_string(&key).unwrap();
    let key_lines: Vec<&str> = pem
        .lines()
        .filter(|l| !l.starts_with("-----") && l.len() >= 16)
        .collect();
    for (path, bytes) in files_under(&s.env.data_dir) {
        for t in &tokens {
            assert!(!contains(&bytes, t), "{} holds a token", path.display());
        }
        for l in &key_lines {
            assert!(!contains(&bytes, l), "{} holds the key", path.display());
        }
    }
    for t in &tokens {
        assert!(!out.contains(t.as_str()), "the console showed a token");
    }
}

#[tokio::test]
async fn a_key_that_is_not_the_apps_is_a_clear_start_error() {
    let keys = tempfile::tempdir().unwrap();
    let (mut s, _) = app_scenario(keys.path(), Duration::from_secs(60)).await;
    let (other, _) = key_pair(keys.path(), "other");
    s.as_app(APP_ID, other);
    let out = s.run_once_raw().await;
    assert_eq!(out.status.code(), Some(78), "{}", stdout(&out));
    let err = stderr(&out);
    assert!(
        err.contains("github rejected the app's JWT")
            && err.contains("ROVER_GITHUB_APP_KEY_FILE")
            && err.contains("app 424242"),
        "{err}"
    );
    let app = s.github.app();
    assert!(!app.jwts_refused.is_empty());
    assert!(app.tokens.is_empty(), "no token for a wrong key");
    assert_eq!(
        s.github.count(&axum::http::Method::GET, "/events"),
        0,
        "nothing is polled"
    );

    // A key file that is missing or not a key says so, naming it.
    s.as_app(APP_ID, keys.path().join("missing.pem"));
    let out = s.run_once_raw().await;
    assert_eq!(out.status.code(), Some(78));
    assert!(
        stderr(&out).contains("missing.pem") && stderr(&out).contains("cannot read it"),
        "{}",
        stderr(&out)
    );
    let junk = keys.path().join("junk.pem");
    std::fs::write(&junk, "not a key").unwrap();
    s.as_app(APP_ID, junk);
    let out = s.run_once_raw().await;
    assert_eq!(out.status.code(), Some(78));
    assert!(
        stderr(&out).contains("not an RSA private key"),
        "{}",
        stderr(&out)
    );
}

#[tokio::test]
async fn a_personal_token_keeps_working_and_pushes_over_http_with_it() {
    // The same remote over HTTP, with the personal token: the credential helper hands it over.
    let mut s = Scenario::new().await;
    let git_server = s.serve_origin_over_http().await;
    s.with_sandbox().await;
    one_task_issue(
        &mut s,
        31,
        "Add a --tsv flag",
        "Please add --tsv.",
        "Add the tsv flag",
        "tsv.txt",
    );
    s.answer(NOTIFY, json!({"message": "Opened a PR for --tsv."}));
    s.run_until_settled(12).await;
    assert_eq!(s.github.pulls().len(), 1);
    let pushes = git_server.accepted_pushes();
    assert!(
        !pushes.is_empty()
            && pushes
                .iter()
                .all(|p| p == crate::support::fake_github::TOKEN),
        "{pushes:?}"
    );
}

#[tokio::test]
async fn a_configured_installation_is_used_without_a_lookup_and_a_wrong_one_is_named() {
    let keys = tempfile::tempdir().unwrap();
    let (mut s, _) = app_scenario(keys.path(), Duration::from_secs(60)).await;
    s.extra_config = json!({"autopilot": {"github": {"installationId": INSTALLATION}}});
    let out = s.run_once().await;
    assert!(
        stdout(&out).contains("identity: rover acts as rover-app[bot]"),
        "{}",
        stdout(&out)
    );
    assert_eq!(
        s.github.count(
            &axum::http::Method::GET,
            "/repos/octo-org/widgets/installation"
        ),
        0,
        "no lookup"
    );
    assert_eq!(s.github.app().tokens.len(), 1);
    assert_eq!(
        s.github.count(&axum::http::Method::GET, "/user"),
        0,
        "an app's login comes from GET /app"
    );

    s.extra_config = json!({"autopilot": {"github": {"installationId": 5}}});
    let out = s.run_once_raw().await;
    assert_eq!(out.status.code(), Some(78));
    assert!(
        stderr(&out).contains("github.installationId")
            && stderr(&out).contains("installation 5 is not one of app 424242's"),
        "{}",
        stderr(&out)
    );
}
