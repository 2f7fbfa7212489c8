//! `rover autopilot dashboard` without a browser: the real binary on stores built by the test,
//! asked over HTTP as a browser would ask it. Every page, the live stream, the token on an
//! address other than loopback, the actions and their CSRF check, hostile text escaped.

use std::fmt::Write as _;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use rover::store::{AutopilotStore, SpanStatus, StepKind};
use serde_json::json;

use crate::support::env::TestEnv;
use crate::support::storegen::{example_store, Gen, TraceWriter};

/// An issue title and a summary written to break out of the page.
pub const HOSTILE_TITLE: &str = "<img src=x onerror=\"document.title='pwned'\">";
pub const HOSTILE_SUMMARY: &str = "done </script><script>document.title='pwned'</script>";

/// A dashboard process serving `env`'s store, and where it answers.
pub struct Dashboard {
    child: Child,
    pub addr: SocketAddr,
}

impl Dashboard {
    /// `rover autopilot dashboard --addr 127.0.0.1:0 <args>`, once it says its address.
    pub fn start(env: &TestEnv, args: &[&str], vars: &[(&str, &str)]) -> Dashboard {
        let mut cmd = env.command(&["autopilot", "dashboard", "--addr", "127.0.0.1:0"]);
        cmd.args(args);
        for (k, v) in vars {
            cmd.env(k, v);
        }
        Dashboard::spawn(cmd)
    }

    /// Runs `cmd` (a `rover autopilot dashboard` on a free port) and waits for its address.
    pub fn spawn(mut cmd: Command) -> Dashboard {
        cmd.env_remove("ROVER_DASHBOARD_TOKEN")
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        let mut child = cmd.spawn().expect("run rover autopilot dashboard");
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let addr = line
            .split("http://")
            .nth(1)
            .and_then(|rest| rest.split('/').next())
            .and_then(|a| a.parse().ok())
            .unwrap_or_else(|| panic!("the dashboard said {line:?}"));
        Dashboard { child, addr }
    }

    /// `GET /live`, read as a browser's `EventSource` reads it.
    pub fn live(&self) -> BufReader<TcpStream> {
        let mut conn = TcpStream::connect(self.addr).unwrap();
        conn.set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        write!(
            conn,
            "GET /live HTTP/1.1\r\nHost: {}\r\nAccept: text/event-stream\r\n\r\n",
            self.addr
        )
        .unwrap();
        BufReader::new(conn)
    }

    /// `GET path` with `headers` (each `Name: value`).
    pub fn get(&self, path: &str, headers: &[&str]) -> Answer {
        exchange(self.addr, "GET", path, headers, "")
    }

    pub fn post(&self, path: &str, headers: &[&str], form: &str) -> Answer {
        let mut all = vec!["Content-Type: application/x-www-form-urlencoded"];
        all.extend_from_slice(headers);
        exchange(self.addr, "POST", path, &all, form)
    }
}

impl Drop for Dashboard {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// An HTTP answer: status, headers (lowercase names) and body.
pub struct Answer {
    pub status: u16,
    pub head: String,
    pub body: String,
}

impl Answer {
    pub fn header(&self, name: &str) -> Option<String> {
        self.head.lines().find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.eq_ignore_ascii_case(name).then(|| v.trim().to_owned())
        })
    }
}

fn exchange(addr: SocketAddr, method: &str, path: &str, headers: &[&str], body: &str) -> Answer {
    let mut conn = TcpStream::connect(addr).unwrap();
    conn.set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let mut req = format!("{method} {path} HTTP/1.1\r\nConnection: close\r\n");
    if !headers
        .iter()
        .any(|h| h.to_ascii_lowercase().starts_with("host:"))
    {
        let _ = write!(req, "Host: {addr}\r\n");
    }
    for h in headers {
        req.push_str(h);
        req.push_str("\r\n");
    }
    let _ = write!(req, "Content-Length: {}\r\n\r\n{body}", body.len());
    conn.write_all(req.as_bytes()).unwrap();
    let mut raw = Vec::new();
    let _ = conn.read_to_end(&mut raw);
    let text = String::from_utf8_lossy(&raw).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("not an HTTP answer: {text:?}"));
    Answer {
        status,
        head: head.to_owned(),
        body: body.to_owned(),
    }
}

/// A finished trace whose title and summary try to inject markup, with a known cost.
pub fn hostile_trace(store: &AutopilotStore) -> uuid::Uuid {
    let mut gen = Gen::new(7);
    let mut t = TraceWriter::start(
        store,
        &mut gen,
        60_000,
        &format!("IssuesEvent opened #13 by mallory: {HOSTILE_TITLE}"),
    );
    let root = t.trace_id;
    let a = t.act(root, StepKind::Coordinate, "new issue", json!({}));
    let c = t.run(
        &a,
        1_500,
        SpanStatus::Completed,
        HOSTILE_SUMMARY,
        json!({"decision": "notify", "agent": {"costUsd": 0.0421, "inputTokens": 1200, "outputTokens": 300}}),
    );
    let n = t.act(c.id, StepKind::Notify, "answer the issue", json!({}));
    t.run(&n, 400, SpanStatus::Completed, "answered", json!({}));
    root
}

/// The value of `name="csrf"` in a page.
pub fn csrf_of(page: &str) -> String {
    let at = page.find("name=\"csrf\" value=\"").expect("a CSRF field") + 19;
    page[at..at + 64].to_owned()
}

#[test]
fn every_page_shows_the_store_and_escapes_what_events_and_agents_wrote() {
    let env = TestEnv::new();
    let store = env.store();
    let example = example_store(&store);
    let hostile = hostile_trace(&store);
    let dash = Dashboard::start(&env, &[], &[]);

    let now = dash.get("/", &[]);
    assert_eq!(now.status, 200, "{}", now.body);
    // Another site's name rebound to 127.0.0.1 (DNS rebinding) reads nothing, by any name
    // that is not loopback's; `localhost` is answered.
    for path in ["/", "/traces", &format!("/trace/{hostile}")] {
        let rebound = dash.get(path, &["Host: rebind.attacker.example:8790"]);
        assert_eq!(rebound.status, 403, "{path}: {}", rebound.body);
        assert!(!rebound.body.contains("csrf"), "{}", rebound.body);
    }
    let port = dash.addr.port();
    assert_eq!(
        dash.get("/", &[&format!("Host: localhost:{port}")]).status,
        200
    );
    let csp = now.header("content-security-policy").expect("a CSP");
    assert!(
        csp.contains("script-src 'self'") && !csp.contains("unsafe-inline"),
        "{csp}"
    );
    assert!(now.body.contains("<script src=\"/assets/dashboard.js\""));
    let view = store.load_trace(example).unwrap();
    let running = view
        .spans
        .iter()
        .find(|s| s.status == SpanStatus::Running)
        .unwrap();
    assert!(
        now.body.contains(&format!("data-span=\"{}\"", running.id)),
        "{}",
        now.body
    );
    assert!(now.body.contains("<td class=\"step\">workflow</td>"));
    assert!(
        now.body.contains("<td>resolve</td><td>1</td>"),
        "the queue by step: {}",
        now.body
    );

    let list = dash.get("/traces", &[]);
    assert_eq!(list.status, 200);
    assert!(list.body.contains(&format!("data-trace=\"{example}\"")));
    assert!(list.body.contains(&format!("data-trace=\"{hostile}\"")));
    // Newest first.
    assert!(list.body.find(&hostile.to_string()) < list.body.find(&example.to_string()));

    let page = dash.get(&format!("/trace/{example}"), &[]);
    assert_eq!(page.status, 200);
    for span in &view.spans {
        assert!(page
            .body
            .contains(&format!("<tr class=\"span\" data-span=\"{}\"", span.id)));
        assert!(page.body.contains(&format!(
            "<g class=\"bar st-{}\" data-span=\"{}\"",
            span.status.as_str(),
            span.id
        )));
    }
    // The same error detail `trace` prints.
    assert!(page
        .body
        .contains("error: git commit failed: the pre-commit hook exited with 127"));
    assert!(page.body.contains("command: git commit -F -"));
    assert!(page
        .body
        .contains("husky - pre-commit hook exited with code 127 (error)"));
    assert!(!page.body.contains("id=\"cancel\""), "read-only by default");

    let page = dash.get(&format!("/trace/{}", &hostile.to_string()[..8]), &[]);
    assert_eq!(page.status, 200);
    for raw in [HOSTILE_TITLE, "</script><script>", "<img"] {
        assert!(!page.body.contains(raw), "{raw} must be escaped");
        assert!(
            !list.body.contains(raw),
            "{raw} must be escaped in the list"
        );
    }
    assert!(page
        .body
        .contains("&lt;img src=x onerror=&quot;document.title=&#39;pwned&#39;&quot;&gt;"));
    assert!(page.body.contains("done &lt;/script&gt;&lt;script&gt;"));
    assert!(
        page.body.contains("<td class=\"cost\">$0.0421</td>"),
        "the span's cost"
    );
    assert!(page.body.contains("1200 in, 300 out"));
    assert!(
        page.body.contains("<b>notify</b>: answer the issue"),
        "the action and its reason"
    );

    assert_eq!(dash.get("/trace/ffffffffffff", &[]).status, 404);
    let css = dash.get("/assets/dashboard.css", &[]);
    assert_eq!(css.status, 200);
    assert!(css.header("content-type").unwrap().starts_with("text/css"));
}

#[test]
fn the_list_filters_sorts_and_pages() {
    let env = TestEnv::new();
    let store = env.store();
    let example = example_store(&store);
    let hostile = hostile_trace(&store);
    let dash = Dashboard::start(&env, &[], &[]);
    let rows = |path: &str| {
        let a = dash.get(path, &[]);
        assert_eq!(a.status, 200, "{path}: {}", a.body);
        a.body.matches("<tr class=\"trace\"").count()
    };
    assert_eq!(rows("/traces"), 2);
    let running = dash.get("/traces?outcome=running", &[]).body;
    assert!(running.contains(&example.to_string()) && !running.contains(&hostile.to_string()));
    let done = dash.get("/traces?outcome=completed", &[]).body;
    assert!(done.contains(&hostile.to_string()) && !done.contains(&example.to_string()));
    assert_eq!(rows("/traces?author=mallory"), 1);
    assert_eq!(rows("/traces?author=alice"), 1);
    assert_eq!(rows("/traces?step=plan"), 1);
    assert_eq!(rows("/traces?from=2026-11-20&to=2026-11-20"), 2);
    assert_eq!(rows("/traces?from=2026-11-21"), 0);
    let by_cost = dash.get("/traces?sort=cost&order=desc", &[]).body;
    assert!(by_cost.find(&hostile.to_string()) < by_cost.find(&example.to_string()));
    let by_spans = dash.get("/traces?sort=spans&order=desc", &[]).body;
    assert!(by_spans.find(&example.to_string()) < by_spans.find(&hostile.to_string()));
    // 60 more traces: two pages of 50.
    let mut gen = Gen::new(9);
    for i in 0..60 {
        TraceWriter::start(&store, &mut gen, 120_000 + i, &format!("LocalRequest {i}"));
    }
    assert_eq!(rows("/traces"), 50);
    let first = dash.get("/traces", &[]).body;
    assert!(first.contains("rel=\"next\" href=\"/traces?page=2\""));
    assert_eq!(rows("/traces?page=2"), 12);
}

/// Reads server-sent events from `/live` until one's data contains `needle`.
pub fn read_until(stream: &mut BufReader<TcpStream>, needle: &str) -> String {
    let start = Instant::now();
    let mut event = String::new();
    loop {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "no event with {needle}"
        );
        let mut line = String::new();
        stream.read_line(&mut line).expect("the stream");
        if line.trim().is_empty() && event.contains(needle) {
            return event;
        }
        if line.trim().is_empty() {
            event.clear();
        }
        event.push_str(&line);
    }
}

#[test]
fn the_live_stream_sends_a_span_opening_and_closing() {
    let env = TestEnv::new();
    let store = env.store();
    example_store(&store);
    let dash = Dashboard::start(&env, &[], &[]);
    let mut stream = dash.live();
    let first = read_until(&mut stream, "event: now");
    assert!(first.contains("running-count\">1<"), "{first}");
    // A new trace's coordinate opens, then closes.
    let mut gen = Gen::new(11);
    let mut t = TraceWriter::start(&store, &mut gen, 500_000, "LocalRequest live");
    let a = t.act(t.trace_id, StepKind::Coordinate, "look", json!({}));
    let span = t.run(&a, 10, SpanStatus::Running, "", json!({}));
    let opened = read_until(&mut stream, &format!("data-span=\"{}\"", span.id));
    assert!(opened.contains("running-count\">2<"), "{opened}");
    let mut done = span.clone();
    done.finish(
        SpanStatus::Completed,
        "looked",
        rover::store::Meta::new(),
        gen.at(500_100),
    )
    .unwrap();
    store.write_span(&done).unwrap();
    store
        .transact(|txn| txn.remove_pending(a.id).map(|_| ()))
        .unwrap();
    let closed = read_until(&mut stream, "running-count\">1<");
    assert!(!closed.contains(&span.id.to_string()), "{closed}");
}

#[test]
fn an_address_other_than_loopback_needs_the_token_and_every_page_asks_for_it() {
    let env = TestEnv::new();
    example_store(&env.store());
    let out = env
        .command(&["autopilot", "dashboard", "--addr", "0.0.0.0:0"])
        .env_remove("ROVER_DASHBOARD_TOKEN")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(78));
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(
        said.contains("refuses to serve 0.0.0.0:0 without a token")
            && said.contains("ROVER_DASHBOARD_TOKEN"),
        "{said}"
    );

    let token = "t0ken-for-the-test-0123456789";
    let mut cmd = env.command(&["autopilot", "dashboard", "--addr", "0.0.0.0:0"]);
    cmd.env("ROVER_DASHBOARD_TOKEN", token)
        .stdout(Stdio::piped());
    let mut child = cmd.spawn().unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let port: u16 = line
        .split(':')
        .nth(2)
        .and_then(|p| p.split('/').next())
        .and_then(|p| p.parse().ok())
        .unwrap();
    let dash = Dashboard {
        child,
        addr: SocketAddr::from(([127, 0, 0, 1], port)),
    };
    for path in ["/", "/traces", "/live", "/trace/whatever"] {
        let a = dash.get(path, &[]);
        assert_eq!(a.status, 401, "{path}");
        assert!(a.body.contains("action=\"/login\""));
        assert_eq!(dash.get(path, &["Authorization: Bearer wrong"]).status, 401);
    }
    assert_eq!(
        dash.get("/", &[&format!("Authorization: Bearer {token}")])
            .status,
        200
    );
    assert_eq!(
        dash.get(
            "/traces",
            &["Cookie: rover_dashboard=t0ken-for-the-test-0123456789"]
        )
        .status,
        401
    );
    assert_eq!(dash.post("/login", &[], "token=nope").status, 401);
    let login = dash.post("/login", &[], &format!("token={token}"));
    assert_eq!(login.status, 303);
    let cookie = login.header("set-cookie").unwrap();
    assert!(
        cookie.contains("HttpOnly") && cookie.contains("SameSite=Strict"),
        "{cookie}"
    );
    let session = cookie.split(';').next().unwrap().to_owned();
    assert!(!session.contains(token), "the cookie is not the token");
    assert_eq!(
        dash.get("/traces", &[&format!("Cookie: {session}")]).status,
        200
    );
}

#[test]
fn cancel_from_the_page_needs_actions_allowed_and_the_csrf_token() {
    let env = TestEnv::new();
    let store = env.store();
    let example = example_store(&store);
    let path = format!("/trace/{example}/cancel");
    {
        let ro = Dashboard::start(&env, &[], &[]);
        assert_eq!(ro.post(&path, &[], "csrf=x").status, 403);
    }
    let dash = Dashboard::start(&env, &["--allow-actions"], &[]);
    let page = dash.get(&format!("/trace/{example}"), &[]).body;
    assert!(page.contains("id=\"cancel\""));
    let csrf = csrf_of(&page);
    let origin = format!("Origin: http://{}", dash.addr);
    assert_eq!(
        dash.post(&path, &[&origin], "reason=x").status,
        403,
        "no CSRF token"
    );
    assert_eq!(
        dash.post(&path, &[&origin], "csrf=0000&reason=x").status,
        403
    );
    assert_eq!(
        dash.post(
            &path,
            &["Origin: http://evil.example"],
            &format!("csrf={csrf}")
        )
        .status,
        403,
        "another origin"
    );
    assert!(store
        .load_trace(example)
        .unwrap()
        .spans
        .iter()
        .all(|s| s.step.as_str() != "cancel"));
    let done = dash.post(
        &path,
        &[&origin],
        &format!("csrf={csrf}&reason=from+the+page"),
    );
    assert_eq!(done.status, 303, "{}", done.body);
    let view = store.load_trace(example).unwrap();
    let cancel = view
        .spans
        .iter()
        .find(|s| s.step.as_str() == "cancel")
        .expect("a cancel span");
    assert_eq!(cancel.meta["by"], "dashboard");
    assert_eq!(cancel.meta["reason"], "from the page");
    assert!(
        view.pending.iter().all(|p| p.action != StepKind::Resolve),
        "its queued work is off the queue: {:?}",
        view.pending
    );
}

#[test]
fn start_dashboard_serves_the_same_pages_beside_the_daemon_and_refuses_before_it_starts() {
    let env = TestEnv::new();
    env.repo();
    let store = env.store();
    let hostile = hostile_trace(&store);
    // Refused before the daemon takes the project: no token for an address other than loopback.
    let out = env
        .command(&["autopilot", "start", "--local", "--dashboard", "0.0.0.0:0"])
        .env_remove("ROVER_DASHBOARD_TOKEN")
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(78),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stderr).contains("ROVER_DASHBOARD_TOKEN"));
    assert!(store.daemon_pid().is_none());

    let mut child = env
        .command(&[
            "autopilot",
            "start",
            "--local",
            "--dashboard",
            "127.0.0.1:0",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let banner = lines
        .by_ref()
        .map(Result::unwrap)
        .find(|l| l.starts_with("dashboard on "))
        .expect("the dashboard's address");
    let addr: SocketAddr = banner
        .split("http://")
        .nth(1)
        .and_then(|r| r.split('/').next())
        .and_then(|a| a.parse().ok())
        .unwrap();
    let dash = Dashboard { child, addr };
    let start = Instant::now();
    let now = loop {
        let now = dash.get("/", &[]);
        if now.body.contains("daemon running (pid") {
            break now;
        }
        assert!(start.elapsed() < Duration::from_secs(30), "{}", now.body);
        std::thread::sleep(Duration::from_millis(100));
    };
    assert_eq!(now.status, 200);
    let list = dash.get("/traces", &[]);
    assert!(list.body.contains(&format!("data-trace=\"{hostile}\"")));
    let page = dash.get(&format!("/trace/{hostile}"), &[]);
    assert!(page.body.contains("<td class=\"cost\">$0.0421</td>"));
}

/// A trace that opened a pull request 90 s after its event and merged it.
fn merged_trace(store: &AutopilotStore) {
    let mut gen = Gen::new(31);
    let mut t = TraceWriter::start(
        store,
        &mut gen,
        86_400_000,
        "IssuesEvent opened #50 by bob: CSV",
    );
    let a = t.act(t.trace_id, StepKind::Workflow, "do it", json!({}));
    let w = t.run(
        &a,
        89_000,
        SpanStatus::Completed,
        "done",
        json!({"agent": {"costUsd": 0.5, "inputTokens": 1000, "outputTokens": 100}}),
    );
    let p = t.act(w.id, StepKind::Push, "push", json!({}));
    let pushed = t.run(
        &p,
        994,
        SpanStatus::Completed,
        "opened #51",
        json!({"prCreated": true, "prNumber": 51, "prUrl": "https://github.com/o/w/pull/51"}),
    );
    let m = t.act(pushed.id, StepKind::Merge, "merge", json!({}));
    let merged = t.run(
        &m,
        500,
        SpanStatus::Completed,
        "merged",
        json!({"mergeOutcome": "merged", "prNumber": 51}),
    );
    let n = t.act(merged.id, StepKind::Notify, "say so", json!({}));
    t.run(&n, 100, SpanStatus::Completed, "answered", json!({}));
}

#[test]
fn outcomes_count_what_the_store_holds() {
    let env = TestEnv::new();
    let store = env.store();
    let example = example_store(&store);
    let hostile = hostile_trace(&store);
    merged_trace(&store);
    let dash = Dashboard::start(&env, &[], &[]);
    let page = dash.get("/outcomes", &[]);
    assert_eq!(page.status, 200, "{}", page.body);
    let row = |table: &str, key: &str| -> Vec<String> {
        let at = page.body.find(&format!("id=\"{table}\"")).expect(table);
        let rest = &page.body[at..];
        let at = rest
            .find(&format!("<tr data-key=\"{key}\">"))
            .unwrap_or_else(|| panic!("{table} {key}"));
        let rest = &rest[at..rest[at..].find("</tr>").unwrap() + at];
        rest.split("<td>")
            .skip(1)
            .map(|c| c.trim_end_matches("</td>").to_owned())
            .collect()
    };
    // The store's own figures: the two traces of 2026-11-20 and the one of the next day.
    let cost = |id| rover::budget::trace_usage(&store.load_trace(id).unwrap());
    let day1 = cost(example).cost_usd + cost(hostile).cost_usd;
    assert_eq!(
        row("days", "2026-11-20"),
        [
            "2026-11-20",
            "2",
            "1",
            "0",
            "0",
            "1",
            "0",
            "0",
            "—",
            "—",
            "0.50",
            &rover::budget::usd(day1),
            "1500"
        ]
    );
    assert_eq!(
        row("days", "2026-11-21"),
        [
            "2026-11-21",
            "1",
            "1",
            "0",
            "0",
            "0",
            "1",
            "1",
            "1m 30s",
            "1m 30s",
            "0.00",
            "$0.5000",
            "1100"
        ]
    );
    let week = row("weeks", "2026-W47");
    assert_eq!(&week[1..4], ["3", "2", "0"]);
    assert_eq!(
        row("steps", "coordinate"),
        ["coordinate", "1", "$0.0421", "1200", "300"]
    );
    assert_eq!(
        row("steps", "workflow"),
        ["workflow", "1", "$0.5000", "1000", "100"]
    );
    assert!(page.body.contains("id=\"outcome-chart\"") && page.body.contains("id=\"step-chart\""));
}
