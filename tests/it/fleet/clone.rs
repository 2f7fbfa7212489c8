//! rover clones a served repository that has no checkout: from its `cloneUrl` (here its bare
//! origin served over HTTP as GitHub serves a private repository, asking for the token) to the
//! default `<data dir>/checkouts/<owner>/<name>`, then serves it as any other (an
//! issue answered on its own fake GitHub). A clone that fails is a `failing` repository naming
//! the URL and git's words, and a path that holds something else is never cloned over.

use serde_json::{json, Value};

use super::{answers, good_config, open_issue, output, repo, rover, script, standing};
use crate::support::env::{stderr, stdout, TestEnv};
use crate::support::fake_github::TOKEN;
use crate::support::git_http::GitHttp;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_repository_without_a_checkout_is_cloned_and_served_and_a_failed_clone_is_reported() {
    let env = TestEnv::new();
    env.repo(); // the fake agent as `claude`
    let home = env.path().join("home");
    std::fs::create_dir_all(&home).unwrap();
    let good = serde_json::to_string_pretty(&good_config()).unwrap();
    let gamma = repo(env.path(), "octo-org/gamma", &good).await;
    // Its origin holds everything; its checkout is gone.
    std::fs::remove_dir_all(&gamma.checkout).unwrap();
    let server = GitHttp::start(env.path().to_owned(), gamma.github.token_checker()).await;
    let origin = format!("{}/gamma.git", server.url);
    // Something that is not a checkout, where a checkout is named: kept as it is.
    let occupied = env.path().join("occupied");
    std::fs::create_dir_all(&occupied).unwrap();
    std::fs::write(occupied.join("notes.txt"), "mine\n").unwrap();
    let file = json!({"repositories": [
        {"repo": gamma.name, "apiUrl": gamma.github.url, "cloneUrl": origin},
        {"repo": "octo-org/lost", "apiUrl": gamma.github.url, "cloneUrl": "/nowhere/lost.git"},
        {"repo": "octo-org/occupied", "apiUrl": gamma.github.url, "checkout": occupied},
    ]});
    let path = home.join(".config/rover/daemon.json");
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(&path, serde_json::to_string_pretty(&file).unwrap()).unwrap();
    open_issue(&gamma, 1, "Question for gamma");

    let once = output(rover(
        &env,
        &home,
        &["start", "--once"],
        &script(&["gamma"]),
    ));
    let said = format!("{}\n{}", stdout(&once), stderr(&once));
    assert_ne!(
        once.status.code(),
        Some(0),
        "two repositories failed: {said}"
    );
    assert_eq!(
        answers(&gamma, 1),
        ["Here is the answer for gamma."],
        "{said}"
    );

    // Cloned whole to its default place, from its cloneUrl, the token nowhere in it.
    let clone = env.path().join("data/checkouts/octo-org/gamma");
    assert!(clone.join("rover.json").is_file(), "{said}");
    let config = std::fs::read_to_string(clone.join(".git/config")).unwrap();
    assert!(config.contains(&origin), "{config}");
    assert!(!config.contains(TOKEN), "{config}");
    // With rover's token, handed to git's credential helper.
    assert!(
        server
            .requests()
            .iter()
            .any(|r| r.accepted == Some(true) && r.password.as_deref() == Some(TOKEN)),
        "{:?}",
        server.requests()
    );
    assert!(!env
        .path()
        .join("data/checkouts/octo-org/.gamma.rover-clone")
        .exists());
    assert!(!said.contains(TOKEN), "{said}");

    let now = standing(&env, &home);
    assert_eq!(now["octo-org/gamma"]["state"], "stopped", "{now}");
    let lost = &now["octo-org/lost"];
    assert_eq!(lost["state"], "failing", "{now}");
    let reason = lost["reason"].as_str().unwrap_or_default();
    assert!(
        reason.contains("cannot clone octo-org/lost from /nowhere/lost.git")
            && reason.contains("does not exist"),
        "names the URL and git's words: {reason}"
    );
    assert!(!env.path().join("data/checkouts/octo-org/lost").exists());
    let occupied_now: &Value = &now["octo-org/occupied"];
    assert_eq!(occupied_now["state"], "failing", "{now}");
    let reason = occupied_now["reason"].as_str().unwrap_or_default();
    assert!(reason.contains("is not a git checkout"), "{reason}");
    assert_eq!(
        std::fs::read_to_string(occupied.join("notes.txt")).unwrap(),
        "mine\n"
    );
    assert!(!occupied.join(".git").exists());
}
