//! One proxy server shared by the repositories of a daemon file: each run's files are in its
//! store's dir under the server's (`<key>/runs/<run>/`), named by the relay's preamble; a run
//! token is good for its own store's run only, and a store's day and month limits count that
//! store's runs only.

use super::*;

/// The grant of `run` in `dir` as the harness wrote it.
fn grant_of(dir: &Path, run: &str) -> Grant {
    Grant::load(dir, run).expect("load").expect("a grant")
}

#[tokio::test]
async fn a_run_token_of_one_repository_is_refused_on_anothers_run() {
    let h = Harness::start().await;
    let (a, b) = (h.path().join("repo-a"), h.path().join("repo-b"));
    let token_a = h.grant_in(&a, "run-a", |_| {});
    let token_b = h.grant_in(&b, "run-b", |_| {});

    let mut on_a = client(h.relay_keyed(Some("repo-a"), "run-a").await).await;
    let (status, body) = send(&mut on_a, anthropic_request(&token_a)).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    // Recorded in A's store only.
    for _ in 0..200 {
        if Ledger::load(&a, "run-a")
            .expect("ledger")
            .is_some_and(|l| l.requests == 1)
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let ledger = Ledger::load(&a, "run-a")
        .expect("ledger")
        .expect("a ledger");
    assert_eq!(ledger.requests, 1);
    assert!(ledger.usd > 0.0, "{ledger:?}");
    assert!(Ledger::load(h.path(), "run-a").expect("ledger").is_none());
    assert!(Ledger::load(&b, "run-a").expect("ledger").is_none());
    let answered = h.anthropic.answered();

    // A's token on B's run, through B's relay.
    let mut on_b = client(h.relay_keyed(Some("repo-b"), "run-b").await).await;
    let (status, body) = send(&mut on_b, anthropic_request(&token_a)).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "{body}");
    let refused = Ledger::load(&b, "run-b")
        .expect("ledger")
        .expect("a ledger");
    assert_eq!((refused.requests, refused.refused), (0, 1), "{refused:?}");
    // A's run named under B's key has no grant there; nor under the server's own dir.
    for key in [Some("repo-b"), None] {
        let (head, _) = raw(
            h.relay_keyed(key, "run-a").await,
            "GET /anthropic/v1/messages HTTP/1.1\r\nhost: relay\r\n\r\n",
        )
        .await;
        assert!(head.starts_with("HTTP/1.1 403"), "{key:?}: {head}");
    }
    assert_eq!(
        h.anthropic.answered(),
        answered,
        "a refused call reached the API"
    );
    // B's own token on B's run goes through.
    let (status, body) = send(&mut on_b, anthropic_request(&token_b)).await;
    assert_eq!(status, StatusCode::OK, "{body}");
}

#[tokio::test]
async fn a_stores_day_limit_counts_its_own_runs_and_not_another_repositorys() {
    let h = Harness::start().await;
    let (a, b) = (h.path().join("repo-a"), h.path().join("repo-b"));
    let today = Utc::now().format("%Y-%m-%d").to_string();
    let day = |grant: &mut Grant| {
        grant.budget = Some(GrantBudget {
            day: Some(PeriodBudget {
                period: today.clone(),
                stop_usd: 1.0,
                baseline_usd: 0.0,
            }),
            ..GrantBudget::default()
        });
    };
    let token = h.grant_in(&a, "run-a", day);
    // Another repository's live run spent far past A's day limit: not A's.
    h.grant_in(&b, "run-b", |_| {});
    Ledger::update(&b, &grant_of(&b, "run-b"), |l| l.usd = 50.0).expect("ledger");
    let spend = live_spend(&a, &grant_of(&a, "run-a"), true).expect("spend");
    assert!(spend.all_usd.abs() < 1e-9, "{spend:?}");
    let mut c = client(h.relay_keyed(Some("repo-a"), "run-a").await).await;
    let (status, body) = send(&mut c, anthropic_request(&token)).await;
    assert_eq!(status, StatusCode::OK, "{body}");

    // A live run of A's own store that did: A's day is spent.
    h.grant_in(&a, "run-a2", |_| {});
    Ledger::update(&a, &grant_of(&a, "run-a2"), |l| l.usd = 50.0).expect("ledger");
    let answered = h.anthropic.answered();
    let (status, body) = send(&mut c, anthropic_request(&token)).await;
    assert_ne!(status, StatusCode::OK, "{body}");
    assert!(body.contains("autopilot.budget.day.usd"), "{body}");
    assert_eq!(h.anthropic.answered(), answered);
    let stopped = Ledger::load(&a, "run-a")
        .expect("ledger")
        .expect("a ledger");
    assert!(stopped.stopped.is_some(), "{stopped:?}");
}

#[tokio::test]
async fn a_repositorys_grant_prices_its_codex_requests() {
    let h = Harness::start().await;
    let a = h.path().join("repo-a");
    let prices: crate::agents::CodexPrices = serde_json::from_value(json!({
        "gpt-test": {"inputPerMTok": 1000.0, "cachedInputPerMTok": 100.0, "outputPerMTok": 1000.0}
    }))
    .expect("prices");
    let token = h.grant_in(&a, "run-a", |g| g.codex_prices = Some(prices));
    let mut c = client(h.relay_keyed(Some("repo-a"), "run-a").await).await;
    let (status, body) = send(&mut c, openai_request(&token)).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let mut ledger = None;
    for _ in 0..200 {
        ledger = Ledger::load(&a, "run-a")
            .expect("ledger")
            .filter(|l| l.requests == 1);
        if ledger.is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let ledger = ledger.expect("the request recorded");
    // The fake's answer (60 tokens in, 40 cached, 20 out) at the grant's prices, not the
    // server's built-in table (a thousandth of that).
    let usage = ledger.usage;
    assert_eq!(
        (usage.input, usage.cached, usage.output),
        (60, 40, 20),
        "{ledger:?}"
    );
    assert!((ledger.usd - 0.084).abs() < 1e-9, "{ledger:?}");
}
