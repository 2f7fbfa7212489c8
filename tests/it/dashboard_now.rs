//! The Now page's newer parts over HTTP, against the real binary: each running agent's last
//! output line, read from its log's tail and escaped.

use std::io::{BufReader, Write};
use std::net::TcpStream;
use std::time::Duration;

use rover::store::SpanStatus;
use serde_json::json;

use crate::dashboard::{read_until, Dashboard};
use crate::support::env::TestEnv;
use crate::support::storegen::example_store;

/// An agent's text written to break out of the page and steer a terminal.
const HOSTILE_SAID: &str =
    "<script>document.title='pwned'</script> \u{1b}[31mall red\u{1b}[0m\u{7}";

/// Claude's stream-json lines: a long first stretch (the tail read skips it), a tool call,
/// then the hostile text.
fn agent_log() -> String {
    let assistant = |block: serde_json::Value| {
        json!({"type": "assistant", "message": {"role": "assistant", "content": [block]}})
            .to_string()
    };
    let mut log = String::new();
    for i in 0..2_000 {
        log.push_str(&assistant(
            json!({"type": "text", "text": format!("early line {i}")}),
        ));
        log.push('\n');
    }
    log.push_str(&assistant(
        json!({"type": "tool_use", "name": "Bash", "input": {"command": "cargo test"}}),
    ));
    log.push('\n');
    log.push_str(&assistant(json!({"type": "text", "text": HOSTILE_SAID})));
    log.push('\n');
    log
}

#[test]
fn now_shows_each_running_agents_last_output_line_escaped() {
    let env = TestEnv::new();
    let store = env.store();
    let example = example_store(&store);
    let running = store
        .load_trace(example)
        .unwrap()
        .spans
        .into_iter()
        .find(|s| s.status == SpanStatus::Running)
        .unwrap();
    let dir = store.artifacts_dir(running.id);
    std::fs::create_dir_all(&dir).unwrap();
    let log = agent_log();
    assert!(log.len() > 100_000, "more than the tail the page reads");
    std::fs::write(dir.join("agent.log"), &log).unwrap();
    let dash = Dashboard::start(&env, &[], &[]);

    let now = dash.get("/", &[]);
    assert_eq!(now.status, 200, "{}", now.body);
    let shown = "<q class=\"agent-said\" title=\"written by the agent\">\
                 &lt;script&gt;document.title=&#39;pwned&#39;&lt;/script&gt; all red</q>";
    assert!(now.body.contains(shown), "{}", now.body);
    assert!(!now.body.contains("<script>document"));
    assert!(!now.body.contains('\u{1b}') && !now.body.contains("[31m"));

    // The live stream carries it too, and the line after the agent's next output.
    let mut conn = TcpStream::connect(dash.addr).unwrap();
    conn.set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    write!(
        conn,
        "GET /live HTTP/1.1\r\nHost: {}\r\nAccept: text/event-stream\r\n\r\n",
        dash.addr
    )
    .unwrap();
    let mut stream = BufReader::new(conn);
    let first = read_until(&mut stream, "event: now");
    assert!(first.contains(shown), "{first}");
    let tool = json!({"type": "assistant", "message": {"content": [
        {"type": "tool_use", "name": "Edit", "input": {"file_path": "src/lib.rs"}}]}});
    let mut file = std::fs::OpenOptions::new()
        .append(true)
        .open(dir.join("agent.log"))
        .unwrap();
    writeln!(file, "{tool}").unwrap();
    // A span written wakes the stream; the agent's line is read again with it.
    store.write_span(&running).unwrap();
    let next = read_until(&mut stream, "Edit: src/lib.rs");
    assert!(next.contains("agent-said"), "{next}");
}
