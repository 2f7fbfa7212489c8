//! The daemon-wide budget at the wire: two proxy servers (two repositories' stores) sharing a
//! daemon's wire dir, with requests at once from runs of both, never pass its stop limit beyond
//! the reservations.

#![allow(
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss,
    clippy::cast_precision_loss,
    reason = "counts of ten requests"
)]

#[allow(clippy::wildcard_imports, reason = "the harness of the parent module")]
use super::*;
use crate::proxy::{DaemonSpend, WireStops};

#[tokio::test]
async fn requests_at_once_from_two_repositories_never_pass_the_daemons_limit_beyond_the_reservations(
) {
    let wire = tempfile::tempdir().expect("tempdir");
    let stop = 0.10;
    DaemonSpend::update(wire.path(), Utc::now(), |s| {
        s.stops = WireStops {
            day_usd: Some(stop),
            ..WireStops::default()
        };
    })
    .expect("the daemon's limits");
    let api = Harness::start_with(Some(wire.path().to_owned())).await;
    let web = Harness::start_with(Some(wire.path().to_owned())).await;
    // No limit of their own: the daemon's alone decides.
    let tokens = [
        api.grant("run-api", |g| g.max_requests = Some(16)),
        web.grant("run-web", |g| g.max_requests = Some(16)),
    ];
    let worst = super::seal::honest_worst_case().await;
    let whole = (stop / worst.usd).floor() as usize;
    let admitted = whole + usize::from(stop - whole as f64 * worst.usd > 1e-9);
    assert!(admitted < 10, "{worst:?}");

    let holds = [api.anthropic.hold_all(), web.anthropic.hold_all()];
    let mut handles = Vec::new();
    for n in 0..10 {
        let (h, run, token) = if n % 2 == 0 {
            (&api, "run-api", &tokens[0])
        } else {
            (&web, "run-web", &tokens[1])
        };
        let mut c = client(h.relay(run).await).await;
        let request = honest_anthropic_request(token);
        handles.push(tokio::spawn(async move { send(&mut c, request).await }));
    }
    let refused = |h: &Harness, run: &str| {
        Ledger::load(h.path(), run)
            .ok()
            .flatten()
            .map_or(0, |l| l.refused as usize)
    };
    let mut settled = false;
    for _ in 0..500 {
        let forwarded = api.anthropic.answered() + web.anthropic.answered();
        if forwarded == admitted
            && refused(&api, "run-api") + refused(&web, "run-web") == 10 - admitted
        {
            settled = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(
        settled,
        "forwarded {} + {}, refused {} + {}, {admitted} admitted expected",
        api.anthropic.answered(),
        web.anthropic.answered(),
        refused(&api, "run-api"),
        refused(&web, "run-web")
    );
    for hold in &holds {
        hold.send(true).expect("the fake waits");
    }
    let mut ok = 0;
    for handle in handles {
        if handle.await.expect("the request").0 == StatusCode::OK {
            ok += 1;
        }
    }
    assert_eq!(ok, admitted);
    // Their answers are the daemon's live spend, no reservation left; within the limit.
    let mut spend = DaemonSpend::load(wire.path()).expect("read");
    for _ in 0..200 {
        if spend.held.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
        spend = DaemonSpend::load(wire.path()).expect("read");
    }
    assert!(spend.held.is_empty(), "{spend:?}");
    let live: f64 = spend.live.values().map(|l| l.usd).sum();
    assert!(
        (live - admitted as f64 * ANTHROPIC_ANSWER_USD).abs() < 1e-9,
        "{spend:?}"
    );
    assert!(live <= stop + 1e-9, "{spend:?}");
    // The refusals name the daemon's limit, in each run's own ledger.
    let stopped: Vec<String> = [(&api, "run-api"), (&web, "run-web")]
        .iter()
        .filter_map(|(h, run)| Ledger::load(h.path(), run).ok().flatten()?.stopped)
        .filter_map(|s| s.limit)
        .collect();
    assert!(
        !stopped.is_empty() && stopped.iter().all(|l| l == "daemon.budget.day.usd"),
        "{stopped:?}"
    );
    eprintln!(
        "10 at once from two repositories against the daemon's ${stop}: {admitted} forwarded (worst case ${:.4} each), spend ${live:.4}",
        worst.usd
    );
}
