//! One daemon for every repository a GitHub App is installed on: the real `rover` binary started
//! outside any checkout with a daemon file saying `"repositories": "installed"`, against one
//! GitHub API (`FakeAppFront`) that lists the app's installations and forwards each repository's
//! routes to that repository's own fake. Repositories the installation gains (told by an
//! `installation_repositories` delivery to the one webhook endpoint) are served without a
//! restart; those it loses (a SIGUSR1 lists again) are stopped and said `removed`; each
//! repository's tokens are scoped to it alone.

use std::path::Path;
use std::time::Duration;

use serde_json::{json, Value};

use crate::fleet::{answers, open_issue, repo, rover, script, standing, wait_for, Daemon, Repo};
use crate::github_app::key_pair;
use crate::support::env::TestEnv;
use crate::support::fake_app_front::FakeAppFront;

const APP_ID: u64 = 515_151;
const SLUG: &str = "rover-fleet";
const ORG: u64 = 61_001;
const OTHER: u64 = 61_002;

/// The `rover.json` of each repository: no `botLogin` (the app's `<slug>[bot]` is rover).
fn config() -> String {
    serde_json::to_string_pretty(&json!({
        "autopilot": {
            "agent": {"extraEnv": ["ROVER_FAKE_AGENT_SCRIPT", "ROVER_FAKE_AGENT_LOG"]},
            "github": {"poll": {"minIntervalSecs": 0, "skipBacklog": false, "reconcileIntervalSecs": 0}},
            "pipeline": {"fallbackIntervalSecs": 1, "followCi": false, "selfReview": false}
        }
    }))
    .unwrap()
}

/// A repository `name` with its checkout at the daemon's default place
/// (`<data dir>/checkouts/<owner>/<name>`), its fake posting as the app's bot.
async fn installed_repo(env: &TestEnv, name: &'static str) -> Repo {
    let owner = name.split('/').next().unwrap();
    let root = env.path().join("data").join("checkouts").join(owner);
    std::fs::create_dir_all(&root).unwrap();
    let r = repo(&root, name, &config()).await;
    r.github.use_installation_token(SLUG);
    r
}

fn signal(daemon: &Daemon, sig: nix::sys::signal::Signal) {
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(i32::try_from(daemon.0.id()).unwrap()),
        sig,
    )
    .unwrap();
}

fn state(env: &TestEnv, home: &Path, name: &str) -> Value {
    standing(env, home)[name]["state"].clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_daemon_serves_every_repository_the_app_is_installed_on_and_follows_its_changes() {
    let env = TestEnv::new();
    env.repo(); // the fake agent as `claude`
    let home = env.path().join("home");
    let config_dir = home.join(".config/rover");
    std::fs::create_dir_all(&config_dir).unwrap();
    let (key, public) = key_pair(&config_dir, "app");
    assert!(key.starts_with(&config_dir));
    let front = FakeAppFront::start(APP_ID, SLUG, &public, Duration::from_secs(3600)).await;
    let alpha = installed_repo(&env, "octo-org/alpha").await;
    let beta = installed_repo(&env, "octo-org/beta").await;
    let gamma = installed_repo(&env, "octo-org/gamma").await;
    let attic = installed_repo(&env, "tools/attic").await;
    front.add_installation(ORG, "octo-org");
    front.add_installation(OTHER, "tools");
    front.install(ORG, alpha.name, &alpha.github.url);
    front.install(ORG, beta.name, &beta.github.url);
    front.install(OTHER, attic.name, &attic.github.url);
    front.archive(attic.name);
    // No repository list: the app, its key beside the file (a relative path), its API.
    std::fs::write(
        config_dir.join("daemon.json"),
        serde_json::to_string_pretty(&json!({
            "repositories": "installed",
            "app": {"id": APP_ID, "privateKeyFile": "app.pem"},
            "apiUrl": front.url,
        }))
        .unwrap(),
    )
    .unwrap();
    let script = script(&["alpha", "beta", "gamma"]);
    open_issue(&alpha, 1, "Question for alpha");
    open_issue(&beta, 1, "Question for beta");

    // With the one webhook endpoint: an installation delivery lists the installations again.
    let (daemon, addr) = crate::fleet::webhook::start(&env, &home, &script);
    wait_for("both installed repositories answered", || {
        answers(&alpha, 1) == ["Here is the answer for alpha."]
            && answers(&beta, 1) == ["Here is the answer for beta."]
    });
    let now = standing(&env, &home);
    assert_eq!(now["daemon"]["running"], json!(true), "{now}");
    assert_eq!(now["octo-org/alpha"]["state"], "serving", "{now}");
    assert_eq!(now["octo-org/beta"]["state"], "serving", "{now}");
    assert_eq!(now["tools/attic"]["state"], "skipped", "{now}");
    assert!(
        now["tools/attic"]["reason"]
            .as_str()
            .unwrap()
            .contains("archived"),
        "{now}"
    );
    assert_eq!(now["lastListing"]["repositories"], json!(2), "{now}");
    assert!(now["lastListing"]["error"].is_null(), "{now}");
    // rover answered as the app, on each repository's own thread.
    assert_eq!(alpha.github.comments_of(1)[0].1, format!("{SLUG}[bot]"));

    // A third repository added to the installation: GitHub's `installation_repositories`
    // delivery to the endpoint lists at once, and its first issue is answered without a restart.
    front.install(ORG, gamma.name, &gamma.github.url);
    open_issue(&gamma, 1, "Question for gamma");
    let (status, body) = crate::fleet::webhook::deliver(
        addr,
        "installation_repositories",
        "delivery-added-gamma",
        &json!({"action": "added", "installation": {"id": ORG},
                "repository_selection": "selected",
                "repositories_added": [{"id": 3, "full_name": gamma.name, "private": false}],
                "repositories_removed": [],
                "sender": {"login": "octo-admin", "id": 9, "type": "User"}}),
        crate::fleet::webhook::SECRET,
    );
    assert_eq!(status, 202, "{body}");
    wait_for("the added repository served and answered", || {
        answers(&gamma, 1) == ["Here is the answer for gamma."]
    });
    assert_eq!(state(&env, &home, "octo-org/gamma"), "serving");

    // A listing that fails keeps every repository served and says why.
    front.fail_listings(1);
    signal(&daemon, nix::sys::signal::Signal::SIGUSR1);
    wait_for("the failed listing recorded", || {
        standing(&env, &home)["lastListing"]["error"].is_string()
    });
    let now = standing(&env, &home);
    for name in ["octo-org/alpha", "octo-org/beta", "octo-org/gamma"] {
        assert_eq!(now[name]["state"], "serving", "{now}");
    }
    let text = crate::support::env::stdout(&crate::fleet::output(rover(
        &env,
        &home,
        &["status"],
        &json!({}),
    )));
    assert!(
        text.contains("listing  failed") && text.contains("stay served"),
        "{text}"
    );

    // beta removed from the installation: stopped, said `removed`, its polling over.
    let uninstalled = std::time::Instant::now();
    front.uninstall(ORG, beta.name);
    signal(&daemon, nix::sys::signal::Signal::SIGUSR1);
    wait_for("the removed repository stopped", || {
        state(&env, &home, "octo-org/beta") == "removed"
    });
    let now = standing(&env, &home);
    assert!(now["lastListing"]["error"].is_null(), "{now}");
    assert_eq!(now["lastListing"]["repositories"], json!(2), "{now}");
    let text = crate::support::env::stdout(&crate::fleet::output(rover(
        &env,
        &home,
        &["status"],
        &json!({}),
    )));
    let line = text
        .lines()
        .find(|l| l.starts_with("octo-org/beta "))
        .unwrap_or_else(|| panic!("a line for beta:\n{text}"));
    assert!(line.contains("removed"), "{text}");
    let beta_requests = front.requests_for(beta.name);
    let alpha_requests = front.requests_for(alpha.name);
    // While alpha polls on several more times, beta is asked nothing more.
    wait_for("alpha polled on", || {
        front.requests_for(alpha.name) >= alpha_requests + 3
    });
    assert_eq!(front.requests_for(beta.name), beta_requests);
    assert_eq!(state(&env, &home, "octo-org/alpha"), "serving");

    // Each repository's requests came with a token scoped to it alone; the tokens that list
    // were the whole installation's and were never used on a repository.
    let minted = front.minted();
    // Refused only as GitHub would: beta's, between its removal and its daemon's stop.
    for r in front.repo_requests() {
        assert!(
            r.status != 404 || (r.repo == beta.name && r.at >= uninstalled),
            "a request refused: {r:?}"
        );
    }
    for name in ["alpha", "beta", "gamma"] {
        assert!(
            minted
                .iter()
                .any(|m| m.installation == ORG && m.scope == Some(vec![name.to_owned()])),
            "a token for {name} alone: {minted:?}"
        );
    }
    for m in &minted {
        if let Some(scope) = &m.scope {
            assert_eq!(scope.len(), 1, "{m:?}");
            assert_ne!(scope[0], "attic", "the archived one is not served");
        }
    }
    assert!(
        front.jwts_refused().is_empty(),
        "{:?}",
        front.jwts_refused()
    );
    assert!(front.unknown().is_empty(), "{:?}", front.unknown());

    // One SIGTERM stops them all; the removed one stays removed.
    let mut daemon = daemon;
    signal(&daemon, nix::sys::signal::Signal::SIGTERM);
    assert_eq!(daemon.0.wait().expect("the daemon stops").code(), Some(0));
    let now = standing(&env, &home);
    assert_eq!(now["octo-org/alpha"]["state"], "stopped", "{now}");
    assert_eq!(now["octo-org/beta"]["state"], "removed", "{now}");
    // Each store kept its own thread's trace.
    assert_eq!(answers(&beta, 1), ["Here is the answer for beta."]);
}

/// The listing follows every page GitHub's `Link` header names, for the installations and for
/// each installation's repositories, and leaves a suspended installation out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_listing_reads_every_page_of_installations_and_repositories() {
    let dir = tempfile::tempdir().unwrap();
    let (key, public) = key_pair(dir.path(), "app");
    let front = FakeAppFront::start(APP_ID, SLUG, &public, Duration::from_secs(3600)).await;
    front.add_installation(ORG, "octo-org");
    front.add_installation(OTHER, "tools");
    for name in ["octo-org/a", "octo-org/b", "octo-org/c"] {
        front.install(ORG, name, "http://127.0.0.1:9");
    }
    front.install(OTHER, "tools/d", "http://127.0.0.1:9");
    front.archive("octo-org/b");
    let pem = std::fs::read_to_string(&key).unwrap();
    let lister = rover::github::installations::InstallationLister::new(
        &front.url,
        APP_ID,
        &key,
        &pem,
        Duration::from_secs(10),
    )
    .unwrap()
    .per_page(1);
    let found = lister.list().await.expect("listed");
    let names: Vec<(String, u64, bool)> = found
        .repositories
        .iter()
        .map(|r| (r.full_name.clone(), r.installation_id, r.archived))
        .collect();
    assert_eq!(
        names,
        [
            ("octo-org/a".to_owned(), ORG, false),
            ("octo-org/b".to_owned(), ORG, true),
            ("octo-org/c".to_owned(), ORG, false),
            ("tools/d".to_owned(), OTHER, false),
        ]
    );
    assert_eq!(
        found.repositories[0].clone_url.as_deref(),
        Some("https://github.com/octo-org/a.git")
    );
    let pages: Vec<String> = front
        .listings()
        .iter()
        .map(|(path, query)| format!("{path}?{query}"))
        .collect();
    assert_eq!(
        pages,
        [
            "/app/installations?per_page=1&page=1",
            "/app/installations?per_page=1&page=2",
            "/installation/repositories?per_page=1&page=1",
            "/installation/repositories?per_page=1&page=2",
            "/installation/repositories?per_page=1&page=3",
            "/installation/repositories?per_page=1&page=1",
        ]
    );
    // The listing's tokens are the whole installation's (one per installation).
    let minted = front.minted();
    assert_eq!(minted.len(), 2);
    assert!(minted.iter().all(|m| m.scope.is_none()), "{minted:?}");
}

/// A repository the app is installed on, with no checkout and no `GITHUB_TOKEN` in rover's
/// environment: rover clones it over HTTP as GitHub serves a private repository, with an
/// installation token minted for that repository alone, then serves it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_installed_repository_without_a_checkout_is_cloned_with_an_installation_token() {
    let env = TestEnv::new();
    env.repo(); // the fake agent as `claude`
    let home = env.path().join("home");
    let config_dir = home.join(".config/rover");
    std::fs::create_dir_all(&config_dir).unwrap();
    let (_key, public) = key_pair(&config_dir, "app");
    let front = FakeAppFront::start(APP_ID, SLUG, &public, Duration::from_secs(3600)).await;
    let delta = installed_repo(&env, "octo-org/delta").await;
    // Its origin holds everything; its checkout is gone.
    std::fs::remove_dir_all(&delta.checkout).unwrap();
    let root = delta.checkout.parent().unwrap().to_owned();
    let server =
        crate::support::git_http::GitHttp::start(root, front.token_checker(delta.name)).await;
    let origin = format!("{}/delta.git", server.url);
    front.add_installation(ORG, "octo-org");
    front.install(ORG, delta.name, &delta.github.url);
    front.clone_from(delta.name, &origin);
    std::fs::write(
        config_dir.join("daemon.json"),
        json!({"repositories": "installed", "app": {"id": APP_ID, "privateKeyFile": "app.pem"},
            "apiUrl": front.url})
        .to_string(),
    )
    .unwrap();
    open_issue(&delta, 1, "Question for delta");

    let mut once = rover(&env, &home, &["start", "--once"], &script(&["delta"]));
    once.env_remove("GITHUB_TOKEN");
    let once = crate::fleet::output(once);
    let said = format!(
        "{}\n{}",
        crate::support::env::stdout(&once),
        crate::support::env::stderr(&once)
    );
    assert_eq!(once.status.code(), Some(0), "{said}");
    assert_eq!(
        answers(&delta, 1),
        ["Here is the answer for delta."],
        "{said}"
    );
    assert!(
        delta.checkout.join("rover.json").is_file(),
        "cloned: {said}"
    );
    let config = std::fs::read_to_string(delta.checkout.join(".git/config")).unwrap();
    assert!(config.contains(&origin), "{config}");
    // Fetched with a token minted for delta alone, which lands nowhere on disk or in the output.
    let scoped: Vec<String> = front
        .minted()
        .into_iter()
        .filter(|m| m.scope.as_deref() == Some(&["delta".to_owned()][..]))
        .map(|m| m.token)
        .collect();
    let fetched: Vec<_> = server
        .requests()
        .into_iter()
        .filter(|r| r.accepted == Some(true))
        .collect();
    assert!(!fetched.is_empty(), "{:?}", server.requests());
    for r in &fetched {
        let token = r.password.clone().unwrap_or_default();
        assert!(scoped.contains(&token), "a token scoped to delta: {r:?}");
        assert!(!config.contains(&token) && !said.contains(&token));
    }
}
