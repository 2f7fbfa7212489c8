//! The model reverse proxy: the key swap, refused tokens, streaming, usage and spend, the
//! cost cap, a client gone mid-stream, a body over the limit, https upstreams.

#[allow(clippy::wildcard_imports, reason = "the harness of the parent module")]
use super::*;

#[tokio::test]
async fn the_agent_token_is_swapped_for_the_real_key_on_one_kept_alive_connection() {
    let h = Harness::start().await;
    let token = h.grant("run-a", |_| {});
    let mut c = client(h.relay("run-a").await).await;
    let (status, body) = send(&mut c, anthropic_request(&token)).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert!(body.contains("message_stop"), "{body}");
    // Same connection, a Bearer token this time, and the other provider.
    let bearer = format!("Bearer {token}");
    let mut second = anthropic_request("unused");
    second.headers_mut().remove("x-api-key");
    second
        .headers_mut()
        .insert("authorization", bearer.parse().expect("header"));
    let (status, _) = send(&mut c, second).await;
    assert_eq!(status, StatusCode::OK);
    let (status, body) = send(&mut c, openai_request(&token)).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert!(body.contains("response.completed"));

    let seen = [h.anthropic.credentials(), h.openai.credentials()].concat();
    assert_eq!(seen.len(), 3, "{seen:?}");
    assert!(
        seen.iter().all(|c| !c.contains("rover-run-")),
        "the upstream saw the run token: {seen:?}"
    );
    assert!(seen.contains(&format!("x-api-key: {ANTHROPIC_KEY}")));
    assert!(seen.contains(&format!("authorization: Bearer {OPENAI_KEY}")));
    let ledger = h.ledger_when("run-a", |l| l.requests == 3).await;
    assert!(ledger.bytes_up > 0 && ledger.bytes_down > 0);

    // codex's WebSocket attempt gets the 426 that makes it fall back to SSE at once.
    let upgrade = Request::get("/openai/v1/responses")
        .header("host", "relay:8080")
        .header("connection", "Upgrade")
        .header("upgrade", "websocket")
        .header("authorization", &bearer)
        .body(Full::new(Bytes::new()))
        .expect("request");
    let mut fresh = client(h.relay("run-a").await).await;
    let (status, _) = send(&mut fresh, upgrade).await;
    assert_eq!(status, StatusCode::UPGRADE_REQUIRED);
}

#[tokio::test]
async fn unknown_ended_and_other_runs_tokens_are_refused() {
    let h = Harness::start().await;
    let token_a = h.grant("run-a", |_| {});
    let token_b = h.grant("run-b", |_| {});
    let token_e = h.grant("run-ended", |g| g.ended = true);
    let token_o = h.grant("run-openai-only", |g| g.providers = vec![Provider::Openai]);
    let mut clients = [
        client(h.relay("run-a").await).await,
        client(h.relay("run-ended").await).await,
        client(h.relay("run-openai-only").await).await,
    ];
    for (which, request, needle) in [
        (0, anthropic_request("rover-run-0123"), "not run run-a's"),
        (0, anthropic_request(&token_b), "not run run-a's"),
        (0, openai_request(&token_b), "not run run-a's"),
        (1, anthropic_request(&token_e), "has ended"),
        (
            2,
            anthropic_request(&token_o),
            "may not use the anthropic API",
        ),
    ] {
        let client = &mut clients[which];
        let openai = request.uri().path().starts_with("/openai");
        let (status, body) = send(client, request).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED, "{body}");
        let body: Value = serde_json::from_str(&body).expect("a JSON error");
        if openai {
            assert_eq!(body["error"]["code"], "invalid_api_key", "{body}");
            assert_eq!(body["error"]["type"], "invalid_request_error");
        } else {
            assert_eq!(body["type"], "error");
            assert_eq!(body["error"]["type"], "authentication_error", "{body}");
        }
        let message = body["error"]["message"].as_str().expect("message");
        assert!(message.contains(needle), "{message}");
    }
    // The refused requests never reached an upstream.
    assert!(h.anthropic.credentials().is_empty());
    assert!(h.openai.credentials().is_empty());
    let ledger = h.ledger_when("run-a", |l| l.refused == 3).await;
    assert_eq!(ledger.requests, 0);
    // The right token still works on the same connection.
    let (status, _) = send(&mut clients[0], anthropic_request(&token_a)).await;
    assert_eq!(status, StatusCode::OK);
}

#[tokio::test]
async fn the_stream_flows_event_by_event() {
    let h = Harness::start().await;
    let token = h.grant("run-a", |_| {});
    let mut c = client(h.relay("run-a").await).await;
    let release = h.anthropic.hold_next();
    c.ready().await.expect("ready");
    let response = c
        .send_request(anthropic_request(&token))
        .await
        .expect("response");
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(response.headers()["content-type"], "text/event-stream");
    let mut body = response.into_body();
    let mut got = String::new();
    while !got.contains("\n\n") {
        let frame = tokio::time::timeout(Duration::from_secs(5), body.frame())
            .await
            .expect("the first event arrives while the upstream waits")
            .expect("a frame")
            .expect("no error");
        if let Some(data) = frame.data_ref() {
            got.push_str(&String::from_utf8_lossy(data));
        }
    }
    assert!(got.contains("message_start"), "{got}");
    assert!(
        !h.anthropic.state.last_sent.load(Ordering::SeqCst),
        "the first event came only after the last was sent"
    );
    release.send(()).expect("the fake waits");
    let rest = body.collect().await.expect("the rest").to_bytes();
    assert!(String::from_utf8_lossy(&rest).contains("message_stop"));
    assert!(h.anthropic.state.last_sent.load(Ordering::SeqCst));
}

#[tokio::test]
async fn usage_read_from_split_chunks_lands_in_the_ledger() {
    let h = Harness::start().await;
    let token = h.grant("run-a", |_| {});
    let mut c = client(h.relay("run-a").await).await;
    let (status, _) = send(&mut c, anthropic_request(&token)).await;
    assert_eq!(status, StatusCode::OK);
    let (status, _) = send(&mut c, openai_request(&token)).await;
    assert_eq!(status, StatusCode::OK);
    let ledger = h.ledger_when("run-a", |l| l.requests == 2).await;
    assert_eq!(
        ledger.usage,
        TokenUsage {
            input: 1000 + 60,
            cached: 40,
            cache_write: 0,
            output: 1000 + 20,
        }
    );
    let expected = ANTHROPIC_ANSWER_USD + OPENAI_ANSWER_USD;
    assert!(
        (ledger.usd - expected).abs() < 1e-12,
        "{} vs {expected}",
        ledger.usd
    );
    assert_eq!(ledger.trace_id, h.trace);
}

#[tokio::test]
async fn a_trace_at_its_stop_limit_is_refused_while_the_request_in_flight_finishes() {
    let h = Harness::start().await;
    let budget = Some(GrantBudget {
        stop_usd: Some(0.05),
        baseline_usd: 0.01,
        ..GrantBudget::default()
    });
    let token_a = h.grant("run-a", |g| g.budget = budget.clone());
    let token_b = h.grant("run-b", |g| g.budget = budget.clone());
    // An ended run of the trace: its spend is in the baselines, its ledger is not counted.
    let ended = Grant::load(h.path(), "run-a")
        .expect("load")
        .expect("grant");
    let ended = Grant {
        run: "run-old".into(),
        ended: true,
        ..ended
    };
    ended.save(h.path()).expect("save");
    Ledger::update(h.path(), &ended, |l| l.usd = 100.0).expect("ledger");
    // A run of another trace does not count either.
    let other = Grant {
        run: "run-other-trace".into(),
        trace_id: Uuid::new_v4(),
        ended: false,
        ..ended.clone()
    };
    other.save(h.path()).expect("save");
    Ledger::update(h.path(), &other, |l| l.usd = 100.0).expect("ledger");

    let mut a = client(h.relay("run-a").await).await;
    let mut b = client(h.relay("run-b").await).await;
    // run-a's request streams, held after its first event.
    let release = h.anthropic.hold_next();
    a.ready().await.expect("ready");
    let in_flight = a
        .send_request(anthropic_request(&token_a))
        .await
        .expect("response");
    assert_eq!(in_flight.status(), StatusCode::OK);
    // run-b spends $0.03 (0.01 + 0.03 < 0.05), then $0.03 more: the trace is at $0.07.
    for _ in 0..2 {
        let (status, body) = send(&mut b, anthropic_request(&token_b)).await;
        assert_eq!(status, StatusCode::OK, "{body}");
    }
    h.ledger_when("run-b", |l| l.requests == 2).await;
    let (status, body) = send(&mut b, anthropic_request(&token_b)).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    let error: Value = serde_json::from_str(&body).expect("json");
    assert_eq!(error["error"]["type"], "invalid_request_error");
    let message = error["error"]["message"].as_str().expect("message");
    // run-a's request in flight holds its worst case: it counts.
    let held = worst_case(
        &ProxyPrices::default(),
        Provider::Anthropic,
        Some("claude-test"),
        &anthropic_request("x")
            .into_body()
            .collect()
            .await
            .expect("body")
            .to_bytes(),
    );
    let spend = 0.01 + 2.0 * ANTHROPIC_ANSWER_USD + held.usd;
    assert!(
        message.contains(&format!(
            "reached its budget stop limit ({} of $0.0500, autopilot.budget.trace.usd",
            crate::agents::usd(spend)
        )) && message.contains("reserved by 1 request(s) in flight"),
        "{message}"
    );
    let mut c = client(h.relay("run-b").await).await;
    let (status, body) = send(&mut c, openai_request(&token_b)).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    let error: Value = serde_json::from_str(&body).expect("json");
    assert_eq!(error["error"]["code"], "budget_exceeded", "{body}");

    let ledger = h.ledger_when("run-b", |l| l.refused == 2).await;
    let stopped = ledger.stopped.expect("stopped recorded");
    assert!((stopped.spend_usd - spend).abs() < 1e-9, "{stopped:?}");
    assert!((stopped.stop_usd - 0.05).abs() < 1e-12);
    assert_eq!(ledger.requests, 2);

    // The request in flight was not cut: it ends normally and is counted.
    release.send(()).expect("the fake waits");
    let body = read_all(in_flight).await;
    assert!(body.contains("message_stop"), "{body}");
    let ledger = h.ledger_when("run-a", |l| l.requests == 1).await;
    assert!((ledger.usd - ANTHROPIC_ANSWER_USD).abs() < 1e-12);
    assert!(ledger.stopped.is_none());
    // And run-a's next one is refused too: the trace is over its limit.
    let (status, _) = send(&mut a, anthropic_request(&token_a)).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
}

#[tokio::test]
async fn a_client_gone_mid_stream_is_counted_with_what_was_seen() {
    let h = Harness::start().await;
    let token = h.grant("run-a", |_| {});
    let release = h.anthropic.hold_next();
    let mut c = client(h.relay("run-a").await).await;
    c.ready().await.expect("ready");
    let response = c
        .send_request(anthropic_request(&token))
        .await
        .expect("response");
    let mut body = response.into_body();
    let first = body.frame().await.expect("a frame").expect("no error");
    assert!(first.data_ref().is_some_and(|d| !d.is_empty()));
    drop(body);
    drop(c);
    let ledger = h.ledger_when("run-a", |l| l.requests == 1).await;
    // message_start said 1000 in and 1 out so far.
    assert_eq!((ledger.usage.input, ledger.usage.output), (1000, 1));
    assert!(ledger.bytes_down > 0);
    drop(release);
}

#[tokio::test]
async fn a_body_over_the_limit_is_refused_unread() {
    let h = Harness::start().await;
    let token = h.grant("run-a", |_| {});
    let (head, mut stream) = raw(
        h.relay("run-a").await,
        &format!(
            "POST /openai/responses HTTP/1.1\r\nHost: relay\r\nAuthorization: Bearer {token}\r\nContent-Length: {}\r\n\r\n",
            MAX_REQUEST_BYTES + 1
        ),
    )
    .await;
    assert!(head.starts_with("HTTP/1.1 413"), "{head}");
    let mut buf = vec![0u8; 512];
    let n = stream.read(&mut buf).await.expect("the body");
    let body = String::from_utf8_lossy(&buf[..n]);
    assert!(body.contains("request_too_large"), "{body}");
    assert!(h.openai.credentials().is_empty());
}

#[tokio::test]
async fn an_https_upstream_starts_with_the_system_roots() {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = ProxyConfig {
        dir: dir.path().to_owned(),
        anthropic: Some(Upstream {
            base_url: "https://api.anthropic.com".into(),
            credential: Credential::OAuthToken("oat".into()),
        }),
        openai: None,
        prices: ProxyPrices::default(),
        daemon_dir: None,
    };
    let listener = UnixListener::bind(dir.path().join(SOCKET_FILE)).expect("bind");
    let shutdown = CancellationToken::new();
    shutdown.cancel();
    serve(config.clone(), listener, shutdown.clone())
        .await
        .expect("native roots load here");
    let bad = ProxyConfig {
        anthropic: Some(Upstream {
            base_url: "https://api.anthropic.com".into(),
            credential: Credential::ApiKey("bad\nkey".into()),
        }),
        ..config
    };
    let listener = UnixListener::bind(dir.path().join("other.sock")).expect("bind");
    let err = serve(bad, listener, shutdown).await.expect_err("bad key");
    assert!(err.to_string().contains("anthropic credential"), "{err}");
}
