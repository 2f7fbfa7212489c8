//! The egress proxy: CONNECT tunnels and absolute-form requests, allowed and refused, and
//! connections without a valid preamble or grant.

#[allow(clippy::wildcard_imports, reason = "the harness of the parent module")]
use super::*;

#[tokio::test]
async fn connect_tunnels_to_an_allowed_ip_and_refuses_the_rest() {
    let h = Harness::start().await;
    let echo = echo_server().await;
    let token = h.grant("run-a", |g| {
        g.egress = Egress::Allow {
            hosts: vec![format!("127.0.0.1:{}", echo.port()), "pypi.org".into()],
        };
    });
    let relay = h.relay("run-a").await;
    let auth = proxy_auth(&token);

    let target = format!("127.0.0.1:{}", echo.port());
    let (head, mut tunnel) = raw(
        relay,
        &format!("CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n{auth}\r\n"),
    )
    .await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    tunnel
        .write_all(b"ping through the tunnel")
        .await
        .expect("write");
    let mut echoed = [0u8; 23];
    tunnel.read_exact(&mut echoed).await.expect("echo");
    assert_eq!(&echoed, b"ping through the tunnel");

    for _ in 0..2 {
        let (head, mut stream) = raw(
            relay,
            &format!(
                "CONNECT example.com:443 HTTP/1.1\r\nHost: example.com:443\r\n{auth}Connection: close\r\n\r\n"
            ),
        )
        .await;
        assert!(head.starts_with("HTTP/1.1 403"), "{head}");
        let mut body = String::new();
        let _ = stream.read_to_string(&mut body).await;
        assert!(
            body.contains("refused example.com:443") && body.contains("autopilot.sandbox.egress"),
            "{body}"
        );
    }
    let (head, _) = raw(
        relay,
        &format!("GET http://example.com/simple/ HTTP/1.1\r\nHost: example.com\r\n{auth}\r\n"),
    )
    .await;
    assert!(head.starts_with("HTTP/1.1 403"), "{head}");
    // Loopback by any other port than the listed one is refused, even by literal IP.
    let other = format!(
        "127.0.0.1:{}",
        h.anthropic.url.rsplit(':').next().expect("port")
    );
    let (head, _) = raw(
        relay,
        &format!("CONNECT {other} HTTP/1.1\r\nHost: {other}\r\n{auth}\r\n"),
    )
    .await;
    assert!(head.starts_with("HTTP/1.1 403"), "{head}");
    // No or a wrong proxy password: 407 with a challenge.
    for auth in [String::new(), proxy_auth("rover-run-wrong")] {
        let (head, _) = raw(
            relay,
            &format!("CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n{auth}\r\n"),
        )
        .await;
        assert!(head.starts_with("HTTP/1.1 407"), "{head}");
        assert!(
            head.to_ascii_lowercase()
                .contains("proxy-authenticate: basic"),
            "{head}"
        );
    }

    let ledger = h.ledger_when("run-a", |l| l.connections.len() == 4).await;
    let row = |host: &str, port: u16| {
        ledger
            .connections
            .iter()
            .find(|r| r.host == host && r.port == port)
            .unwrap_or_else(|| panic!("no row for {host}:{port}: {:?}", ledger.connections))
            .clone()
    };
    let allowed = row("127.0.0.1", echo.port());
    assert!(allowed.allowed && allowed.count == 1 && allowed.reason.is_none());
    let denied = row("example.com", 443);
    assert!(!denied.allowed);
    assert_eq!(denied.count, 2);
    assert!(
        denied
            .reason
            .as_deref()
            .is_some_and(|r| r.contains("allow list")),
        "{denied:?}"
    );
    let absolute = row("example.com", 80);
    assert!(!absolute.allowed && absolute.count == 1);
    assert_eq!(ledger.requests, 0);
}

#[tokio::test]
async fn absolute_form_http_is_forwarded_to_an_allowed_host() {
    let h = Harness::start().await;
    let app = Router::new().fallback(|headers: HeaderMap, uri: http::Uri| async move {
        format!(
            "path={} host={} proxy-auth={}",
            uri,
            headers
                .get("host")
                .and_then(|v| v.to_str().ok())
                .unwrap_or(""),
            headers.contains_key("proxy-authorization")
        )
    });
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let web = listener.local_addr().expect("addr");
    tokio::spawn(async move { axum::serve(listener, app).await });
    let token = h.grant("run-a", |g| {
        g.egress = Egress::Allow {
            hosts: vec![format!("127.0.0.1:{}", web.port())],
        };
    });
    let (head, mut stream) = raw(
        h.relay("run-a").await,
        &format!(
            "GET http://{web}/simple/x?q=1 HTTP/1.1\r\nHost: {web}\r\n{}Connection: close\r\n\r\n",
            proxy_auth(&token)
        ),
    )
    .await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    let mut body = String::new();
    let _ = stream.read_to_string(&mut body).await;
    assert!(
        body.contains(&format!("path=/simple/x?q=1 host={web} proxy-auth=false")),
        "{body}"
    );
}

#[tokio::test]
async fn model_only_egress_refuses_connect_to_the_model_host() {
    let h = Harness::start().await;
    let token = h.grant("run-a", |_| {});
    let model_host = h.anthropic.url.trim_start_matches("http://").to_owned();
    let (head, _) = raw(
        h.relay("run-a").await,
        &format!(
            "CONNECT {model_host} HTTP/1.1\r\nHost: {model_host}\r\n{}\r\n",
            proxy_auth(&token)
        ),
    )
    .await;
    assert!(head.starts_with("HTTP/1.1 403"), "{head}");
    let ledger = h.ledger_when("run-a", |l| !l.connections.is_empty()).await;
    let row = &ledger.connections[0];
    assert!(!row.allowed);
    assert!(
        row.reason
            .as_deref()
            .is_some_and(|r| r.contains("modelOnly")),
        "{row:?}"
    );
    assert!(h.anthropic.credentials().is_empty());
}

#[tokio::test]
async fn connections_without_a_valid_preamble_or_grant_are_refused() {
    let h = Harness::start().await;
    let token = h.grant("run-a", |_| {});
    for preamble in [
        "GET /anthropic/v1/messages HTTP/1.1\r\n\r\n".to_owned(),
        "ROVER-RUN ../etc\n".to_owned(),
        "ROVER-RUN no-such-run\n".to_owned(),
        "x".repeat(300),
    ] {
        let mut stream = UnixStream::connect(h.socket()).await.expect("connect");
        stream.write_all(preamble.as_bytes()).await.expect("write");
        let head = read_head(&mut stream).await;
        assert!(head.starts_with("HTTP/1.1 403"), "{preamble:?}: {head}");
        let mut rest = String::new();
        let _ = stream.read_to_string(&mut rest).await;
        assert!(rest.contains("refused this connection"), "{rest}");
    }
    // The server still serves good connections.
    let mut c = client(h.relay("run-a").await).await;
    let (status, _) = send(&mut c, anthropic_request(&token)).await;
    assert_eq!(status, StatusCode::OK);
}
