//! Agent-call overhead: one call through rover's adapter (spawn in its own process group, env
//! allow-list, concurrent stream reading, parsing, reaping) minus the same fake agent process run
//! bare (spawn, stdin, wait for output), for both CLIs.

use std::io::Write;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use rover::agents::{Agent, AgentKind, AgentRequest, AgentSettings, ClaudeAgent, CodexAgent};
use serde_json::json;

const CALLS: u32 = 50;

pub fn run() {
    println!("\n== agents (the fake agent, {CALLS} calls each)");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let work = dir.path().join("work");
    std::fs::create_dir_all(&work).unwrap();
    let script = json!([{"text": "ok"}]).to_string();
    for kind in [AgentKind::Claude, AgentKind::Codex] {
        let bin = dir.path().join(kind.default_binary());
        let _ = std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_rover-fake-agent"), &bin);
        let settings = AgentSettings::default();
        let agent: Box<dyn Agent> = if kind == AgentKind::Claude {
            Box::new(
                ClaudeAgent::new(Some(bin.clone()), &settings)
                    .with_host(rover::host_env::HostEnv::from_process())
                    .with_env("ROVER_FAKE_AGENT_SCRIPT", script.clone()),
            )
        } else {
            Box::new(
                CodexAgent::new(Some(bin.clone()), &settings)
                    .with_host(rover::host_env::HostEnv::from_process())
                    .with_env("ROVER_FAKE_AGENT_SCRIPT", script.clone())
                    // Like codex 0.169 the fake wants CODEX_API_KEY; rover maps this one.
                    .with_env("OPENAI_API_KEY", "sk-bench"),
            )
        };
        let request = || {
            let mut req = AgentRequest::new(&work, "hi");
            req.system_prompt = "You are a benchmark agent.".into();
            req.timeout = Duration::from_secs(60);
            req
        };
        let through = rt.block_on(async {
            let start = Instant::now();
            for _ in 0..CALLS {
                agent
                    .run(request())
                    .await
                    .expect("a call through the adapter");
            }
            start.elapsed()
        });
        let args: Vec<String> = if kind == AgentKind::Claude {
            rover::agents::claude::host_args(&request())
        } else {
            rover::agents::codex::host_args(&request(), None, false)
        };
        let start = Instant::now();
        for _ in 0..CALLS {
            let mut child = Command::new(&bin)
                .args(&args)
                .current_dir(&work)
                .env_clear()
                .env("CODEX_API_KEY", "sk-bench")
                .env("ROVER_FAKE_AGENT_SCRIPT", &script)
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap();
            let mut stdin = child.stdin.take().unwrap();
            if kind == AgentKind::Claude {
                stdin.write_all(b"hi").unwrap();
            }
            drop(stdin);
            assert!(child.wait_with_output().unwrap().status.success());
        }
        let bare = start.elapsed();
        let per = |d: Duration| d.as_secs_f64() * 1000.0 / f64::from(CALLS);
        println!(
            "{:<7} one call {:>5.2} ms through the adapter, {:>5.2} ms bare: overhead {:>5.2} ms (bar: a few ms)",
            kind.default_binary(),
            per(through),
            per(bare),
            per(through) - per(bare)
        );
    }
}
