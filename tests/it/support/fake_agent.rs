//! A temp dir with the fake agent under the names `claude` and `codex`, a record dir and a
//! working dir, plus helpers to read the fake's records and check processes are gone.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use rover::agents::{AgentKind, AgentSettings, ClaudeAgent, CliAgent, CodexAgent};
use serde_json::Value;

/// The `OPENAI_API_KEY` the helpers give codex adapters.
pub const FAKE_OPENAI_KEY: &str = "sk-fake-openai-key";

/// One test's fake-agent world.
pub struct FakeAgentEnv {
    /// Keeps the temp dir alive.
    pub root: tempfile::TempDir,
    /// Where `claude` and `codex` symlinks live.
    pub bin_dir: PathBuf,
    /// `ROVER_FAKE_AGENT_LOG`.
    pub log: PathBuf,
    /// The agent's working directory (not a git repository).
    pub workdir: PathBuf,
}

impl FakeAgentEnv {
    pub fn new() -> Self {
        let root = tempfile::tempdir().expect("tempdir");
        let bin_dir = root.path().join("bin");
        let log = root.path().join("log");
        let workdir = root.path().join("work");
        for dir in [&bin_dir, &log, &workdir] {
            std::fs::create_dir_all(dir).expect("mkdir");
        }
        let fake = PathBuf::from(env!("CARGO_BIN_EXE_rover-fake-agent"));
        for name in ["claude", "codex"] {
            std::os::unix::fs::symlink(&fake, bin_dir.join(name)).expect("symlink");
        }
        Self {
            root,
            bin_dir,
            log,
            workdir,
        }
    }

    /// The fake under the given personality's name.
    pub fn binary(&self, kind: AgentKind) -> PathBuf {
        self.bin_dir.join(kind.default_binary())
    }

    /// An adapter of `kind` running the fake with `script` (inline JSON).
    pub fn agent(
        &self,
        kind: AgentKind,
        script: &Value,
        settings: &AgentSettings,
    ) -> Box<dyn rover::agents::Agent> {
        let binary = Some(self.binary(kind));
        let script = script.to_string();
        let log = self.log.display().to_string();
        if kind == AgentKind::Claude {
            Box::new(
                ClaudeAgent::new(binary, settings)
                    .with_host(rover::host_env::HostEnv::from_process())
                    .with_env("ROVER_FAKE_AGENT_SCRIPT", script)
                    .with_env("ROVER_FAKE_AGENT_LOG", log),
            )
        } else {
            Box::new(
                self.codex_keyed(
                    CodexAgent::new(binary, settings)
                        .with_host(rover::host_env::HostEnv::from_process())
                        .with_env("ROVER_FAKE_AGENT_SCRIPT", script)
                        .with_env("ROVER_FAKE_AGENT_LOG", log),
                ),
            )
        }
    }

    /// A codex adapter given only `OPENAI_API_KEY` (the fake, like codex 0.169, demands
    /// `CODEX_API_KEY`: rover must map it) and an empty `CODEX_HOME` (no `codex login`).
    pub fn codex_keyed(&self, agent: CliAgent) -> CliAgent {
        agent
            .with_env("CODEX_API_KEY", "")
            .with_env("OPENAI_API_KEY", FAKE_OPENAI_KEY)
            .with_env("CODEX_HOME", self.codex_home().display().to_string())
    }

    /// An empty `CODEX_HOME` of this test.
    pub fn codex_home(&self) -> PathBuf {
        let dir = self.root.path().join("codex-home");
        std::fs::create_dir_all(&dir).expect("mkdir codex home");
        dir
    }

    /// The fake's records, in invocation order.
    pub fn calls(&self) -> Vec<Value> {
        let mut calls: Vec<Value> = std::fs::read_dir(&self.log)
            .expect("log dir")
            .filter_map(Result::ok)
            .filter(|e| {
                let path = e.path();
                let name = e.file_name().to_string_lossy().into_owned();
                name.starts_with("call-")
                    && path
                        .extension()
                        .is_some_and(|ext| ext.eq_ignore_ascii_case("json"))
            })
            .map(|e| {
                serde_json::from_slice(&std::fs::read(e.path()).expect("read record"))
                    .expect("record is json")
            })
            .collect();
        calls.sort_by_key(|c| c["invocation"].as_u64());
        calls
    }

    /// The pid of the grandchild a hanging invocation started, if it did.
    pub fn grandchild(&self, invocation: u64) -> Option<i32> {
        std::fs::read_to_string(self.log.join(format!("call-{invocation}.grandchild")))
            .ok()?
            .trim()
            .parse()
            .ok()
    }
}

/// The state letter of a process (`R`, `S`, `Z`, ...), or `None` when it no longer exists.
pub fn process_state(pid: i32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name is in parentheses and may contain spaces: the state follows the last `)`.
    let after = stat.rsplit_once(')')?.1;
    after.trim_start().chars().next()
}

/// Waits (bounded, for not hanging) until the process is gone or a zombie someone else owns.
pub fn wait_dead(pid: i32, limit: Duration) -> Option<char> {
    let start = Instant::now();
    loop {
        let state = process_state(pid);
        if matches!(state, None | Some('Z' | 'X')) || start.elapsed() > limit {
            return state;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Waits (bounded) until the process no longer exists at all: our own child must be reaped.
pub fn wait_gone(pid: i32, limit: Duration) -> Option<char> {
    let start = Instant::now();
    loop {
        let state = process_state(pid);
        if state.is_none() || start.elapsed() > limit {
            return state;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Reads a file next to a transcript.
pub fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|err| panic!("read {}: {err}", path.display()))
}
