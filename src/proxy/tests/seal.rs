//! What a run token cannot do: call anything but the model calls its CLI makes, spend past a
//! stop limit with requests in parallel, hold more than its share of the proxy.

#![allow(
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss,
    clippy::cast_precision_loss,
    reason = "counts of ten requests and cents"
)]

#[allow(clippy::wildcard_imports, reason = "the harness of the parent module")]
use super::*;

/// `n` requests made at once by `run`, each on its own connection; their statuses and bodies.
async fn at_once(
    h: &Harness,
    run: &str,
    n: usize,
    request: impl Fn() -> Request<Full<Bytes>>,
) -> Vec<tokio::task::JoinHandle<(StatusCode, String)>> {
    let mut handles = Vec::new();
    for _ in 0..n {
        let mut c = client(h.relay(run).await).await;
        let request = request();
        handles.push(tokio::spawn(async move { send(&mut c, request).await }));
    }
    handles
}

/// Wait until `count` holds (the requests reached the proxy and were admitted or refused).
async fn until(what: &str, count: impl Fn() -> bool) {
    for _ in 0..500 {
        if count() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("never: {what}");
}

fn request(method: &str, path: &str, token: &str) -> Request<Full<Bytes>> {
    Request::builder()
        .method(method)
        .uri(path)
        .header("host", "relay:8080")
        .header("x-api-key", token)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from_static(b"{}")))
        .expect("request")
}

/// The worst case the proxy reserves for [`honest_anthropic_request`].
pub(super) async fn honest_worst_case() -> Worst {
    let body = honest_anthropic_request("x")
        .into_body()
        .collect()
        .await
        .expect("body")
        .to_bytes();
    worst_case(
        &ProxyPrices::default(),
        Provider::Anthropic,
        Some("claude-test"),
        &body,
    )
}

#[tokio::test]
async fn a_run_token_is_good_for_the_cli_calls_only() {
    let h = Harness::start().await;
    let token = h.grant("run-a", |_| {});
    let mut c = client(h.relay("run-a").await).await;
    for (method, path) in [
        ("GET", "/anthropic/v1/files"),
        ("GET", "/anthropic/v1/messages/batches"),
        ("POST", "/anthropic/v1/messages/batches"),
        ("GET", "/anthropic/v1/organizations/api_keys"),
        ("POST", "/anthropic/v1/messages/../files"),
        ("GET", "/anthropic/v1/models"),
    ] {
        let (status, body) = send(&mut c, request(method, path, &token)).await;
        assert_eq!(status, StatusCode::FORBIDDEN, "{method} {path}: {body}");
        let error: Value = serde_json::from_str(&body).expect("json");
        assert_eq!(error["error"]["type"], "permission_error", "{body}");
    }
    let bearer = format!("Bearer {token}");
    for path in [
        "/openai/files",
        "/openai/batches",
        "/openai/chat/completions",
    ] {
        let mut refused = openai_request(&token);
        *refused.uri_mut() = path.parse().expect("uri");
        refused
            .headers_mut()
            .insert("authorization", bearer.parse().expect("header"));
        let (status, body) = send(&mut c, refused).await;
        assert_eq!(status, StatusCode::FORBIDDEN, "{path}: {body}");
    }
    assert_eq!(
        h.anthropic.answered() + h.openai.answered(),
        0,
        "a refused call reached the API"
    );
    // The CLI's own calls still go through.
    let (status, body) = send(&mut c, anthropic_request(&token)).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let (status, _) = send(
        &mut c,
        post(
            "/anthropic/v1/messages/count_tokens?beta=true",
            &[("x-api-key", &token)],
            &json!({"model": "claude-test", "messages": []}),
        ),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    let ledger = h
        .ledger_when("run-a", |l| l.refused == 9 && l.requests >= 1)
        .await;
    let reasons: Vec<&str> = ledger.refusals.iter().map(|r| r.reason.as_str()).collect();
    assert!(
        reasons
            .iter()
            .any(|r| r.contains("not GET /anthropic/v1/files")),
        "{reasons:?}"
    );
    assert!(
        reasons
            .iter()
            .any(|r| r.contains("not GET /anthropic/v1/organizations/api_keys")),
        "{reasons:?}"
    );
}

#[tokio::test]
async fn ten_requests_at_once_never_pass_a_usd_limit_beyond_the_reservations() {
    let h = Harness::start().await;
    let stop = 0.10;
    let token = h.grant("run-a", |g| {
        g.budget = Some(GrantBudget {
            stop_usd: Some(stop),
            ..GrantBudget::default()
        });
        // Ten at once all get a request slot: the budget alone decides.
        g.max_requests = Some(16);
    });
    let worst = honest_worst_case().await;
    assert!(worst.usd >= ANTHROPIC_ANSWER_USD, "{worst:?}");
    // Admitted while there is room: whole worst cases, then what is left.
    let whole = (stop / worst.usd).floor() as usize;
    let admitted = whole + usize::from(stop - whole as f64 * worst.usd > 1e-9);

    let release = h.anthropic.hold_all();
    let handles = at_once(&h, "run-a", 10, || honest_anthropic_request(&token)).await;
    until("every request answered or refused", || {
        h.anthropic.answered() == admitted
            && Ledger::load(h.path(), "run-a")
                .ok()
                .flatten()
                .is_some_and(|l| l.refused as usize == 10 - admitted)
    })
    .await;
    release.send(true).expect("the fake waits");
    let mut statuses = Vec::new();
    for handle in handles {
        statuses.push(handle.await.expect("the request").0);
    }
    let ok = statuses.iter().filter(|s| **s == StatusCode::OK).count();
    let refused = statuses
        .iter()
        .filter(|s| **s == StatusCode::BAD_REQUEST)
        .count();
    assert_eq!((ok, refused), (admitted, 10 - admitted), "{statuses:?}");
    let ledger = h
        .ledger_when("run-a", |l| l.requests as usize == admitted)
        .await;
    eprintln!(
        "10 at once against ${stop}: {admitted} forwarded (worst case ${:.4} each, answer ${ANTHROPIC_ANSWER_USD}), spend ${:.4}",
        worst.usd, ledger.usd
    );
    assert!(ledger.usd <= stop + 1e-9, "{ledger:?}");
    let stopped = ledger.stopped.expect("the stop is recorded");
    assert_eq!(stopped.limit.as_deref(), Some("autopilot.budget.trace.usd"));
    assert!(
        ledger
            .refusals
            .iter()
            .any(|r| r.reason.contains("reserved by")),
        "the refusal says requests in flight held the rest: {:?}",
        ledger.refusals
    );
    // Settled: what is left is reserved by the next one, which may pass the limit by at most
    // its own answer.
    drop(release);
    let mut c = client(h.relay("run-a").await).await;
    let (status, _) = send(&mut c, honest_anthropic_request(&token)).await;
    let ledger = h
        .ledger_when("run-a", |l| l.refused as usize >= 10 - admitted)
        .await;
    if status == StatusCode::OK {
        let ledger = h
            .ledger_when("run-a", |l| l.requests as usize == admitted + 1)
            .await;
        assert!(
            ledger.usd <= stop + ANTHROPIC_ANSWER_USD + 1e-9,
            "{ledger:?}"
        );
    } else {
        assert!(ledger.usd <= stop + 1e-9);
    }
}

#[tokio::test]
async fn ten_requests_at_once_never_pass_a_token_limit_beyond_the_reservations() {
    let h = Harness::start().await;
    let stop: u64 = 5000;
    let token = h.grant("run-a", |g| {
        g.budget = Some(GrantBudget {
            stop_tokens: Some(stop),
            ..GrantBudget::default()
        });
        // Ten at once all get a request slot: the budget alone decides.
        g.max_requests = Some(16);
    });
    let worst = honest_worst_case().await;
    let answer_tokens = 2000;
    assert!(worst.tokens >= answer_tokens, "{worst:?}");
    let admitted = stop.div_ceil(worst.tokens) as usize;
    let release = h.anthropic.hold_all();
    let handles = at_once(&h, "run-a", 10, || honest_anthropic_request(&token)).await;
    until("every request answered or refused", || {
        h.anthropic.answered() == admitted
            && Ledger::load(h.path(), "run-a")
                .ok()
                .flatten()
                .is_some_and(|l| l.refused as usize == 10 - admitted)
    })
    .await;
    release.send(true).expect("the fake waits");
    for handle in handles {
        handle.await.expect("the request");
    }
    let ledger = h
        .ledger_when("run-a", |l| l.requests as usize == admitted)
        .await;
    let spent = ledger.usage.total();
    eprintln!("10 at once against {stop} tokens: {admitted} forwarded (worst case {} each), {spent} tokens", worst.tokens);
    // The last one admitted reserved what was left, and its answer may pass that.
    let reserved_last = stop - (admitted as u64 - 1) * worst.tokens;
    assert!(
        spent <= stop + (answer_tokens - reserved_last.min(answer_tokens)),
        "{spent}"
    );
    let stopped = ledger.stopped.expect("the stop is recorded");
    assert_eq!(
        stopped.limit.as_deref(),
        Some("autopilot.budget.trace.tokens")
    );
    assert_eq!(stopped.stop_tokens, Some(stop));
}

#[tokio::test]
async fn a_run_past_its_requests_in_flight_is_told_to_retry() {
    let h = Harness::start().await;
    let token = h.grant("run-a", |g| g.max_requests = Some(2));
    let other = h.grant("run-b", |_| {});
    let release = h.anthropic.hold_all();
    let held = at_once(&h, "run-a", 2, || anthropic_request(&token)).await;
    until("two requests in flight", || h.anthropic.answered() == 2).await;
    let mut c = client(h.relay("run-a").await).await;
    c.ready().await.expect("ready");
    let response = c
        .send_request(anthropic_request(&token))
        .await
        .expect("a response");
    assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(response.headers()["retry-after"], "1");
    let body = read_all(response).await;
    assert!(
        body.contains("rate_limit_error") && body.contains("autopilot.sandbox.modelConcurrency"),
        "{body}"
    );
    // Another run is not held back by it.
    let mut b = client(h.relay("run-b").await).await;
    b.ready().await.expect("ready");
    let response = b
        .send_request(anthropic_request(&other))
        .await
        .expect("a response");
    assert_eq!(response.status(), StatusCode::OK);
    release.send(true).expect("the fake waits");
    read_all(response).await;
    for handle in held {
        assert_eq!(handle.await.expect("the request").0, StatusCode::OK);
    }
    // The slots are back once the answers are in the ledger.
    let (status, _) = send(&mut c, anthropic_request(&token)).await;
    assert_eq!(status, StatusCode::OK);
}

#[tokio::test]
async fn one_runs_flood_of_large_bodies_leaves_another_runs_request_answered() {
    let h = Harness::start().await;
    let flooder = h.grant("run-a", |_| {});
    let other = h.grant("run-b", |_| {});
    let addr = h.relay("run-a").await;
    // 24 requests of just under 32 MiB each, their bodies started and held open.
    let head = format!(
        "POST /anthropic/v1/messages HTTP/1.1\r\nHost: relay\r\nx-api-key: {flooder}\r\nContent-Length: {}\r\n\r\n",
        MAX_REQUEST_BYTES - 1
    );
    let mut floods = Vec::new();
    for _ in 0..24 {
        let mut stream = TcpStream::connect(addr).await.expect("connect");
        stream.write_all(head.as_bytes()).await.expect("head");
        floods.push(stream);
    }
    // Those past the run's requests in flight are answered 429 at once, before their bodies.
    let mut too_many = 0;
    let mut admitted = Vec::new();
    for mut stream in floods {
        let mut first = [0u8; 12];
        let read = tokio::time::timeout(Duration::from_millis(300), stream.read(&mut first)).await;
        match read {
            Ok(Ok(n)) if first[..n].starts_with(b"HTTP/1.1 429") => too_many += 1,
            Err(_) => admitted.push(stream),
            other => panic!("{other:?}: {:?}", String::from_utf8_lossy(&first)),
        }
    }
    assert_eq!(too_many, 24 - DEFAULT_MAX_REQUESTS as usize);
    // The admitted ones send a MiB of their bodies each and hold the rest.
    let chunk = vec![b'x'; 1 << 20];
    for stream in &mut admitted {
        let _ = tokio::time::timeout(Duration::from_millis(100), stream.write_all(&chunk)).await;
    }
    // The other run's request is answered while the flood holds.
    let mut b = client(h.relay("run-b").await).await;
    let answered = tokio::time::timeout(
        Duration::from_secs(10),
        send(&mut b, anthropic_request(&other)),
    )
    .await
    .expect("the other run's request is answered during the flood");
    assert_eq!(answered.0, StatusCode::OK, "{}", answered.1);
    drop(admitted);
}

#[tokio::test]
async fn ten_requests_at_once_settling_while_others_arrive_never_pass_a_usd_limit_beyond_one_answer(
) {
    for _ in 0..5 {
        let h = Harness::start().await;
        let stop = 0.10;
        let token = h.grant("run-a", |g| {
            g.budget = Some(GrantBudget {
                stop_usd: Some(stop),
                ..GrantBudget::default()
            });
            g.max_requests = Some(16);
        });
        let handles = at_once(&h, "run-a", 10, || honest_anthropic_request(&token)).await;
        let mut ok = 0;
        for handle in handles {
            if handle.await.expect("the request").0 == StatusCode::OK {
                ok += 1;
            }
        }
        let ledger = h.ledger_when("run-a", |l| l.requests == ok).await;
        eprintln!("{ok} forwarded, ${:.4}", ledger.usd);
        assert!(
            ledger.usd <= stop + ANTHROPIC_ANSWER_USD + 1e-9,
            "{ok} forwarded: {ledger:?}"
        );
    }
}
