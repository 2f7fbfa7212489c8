//! `rover-fake-agent`: a scripted stand-in for the `claude` and `codex` CLIs, for tests only.
//!
//! Personality: the basename of argv[0] (`claude` or `codex`), else `ROVER_FAKE_AGENT_AS`.
//! Script: `ROVER_FAKE_AGENT_SCRIPT`, a file path or inline JSON: a list of rules (or
//! `{"strict": bool, "rules": [...]}`), the first rule matching the prompt substring (or every
//! substring of a list) and/or the
//! invocation number says what to answer, which failure to act out, which files to write or
//! delete in the cwd (a file written as `{{prompt}}` gets the prompt), which shell commands to run there. Log: `ROVER_FAKE_AGENT_LOG` names a dir
//! that receives `call-<n>.json` (argv, cwd, selected env, prompt) per invocation; its count is
//! the invocation number.
//!
//! Like the real CLIs, it loads configuration from its working directory and runs what that
//! configuration starts: claude the `SessionStart` hooks of `.claude/settings.json` and
//! `.claude/settings.local.json` (unless `--setting-sources` leaves out `project`/`local`, or
//! `--settings` has `disableAllHooks`) and the servers of `.mcp.json` (unless
//! `--strict-mcp-config`); codex the commands of `.codex/config.toml`. The escape proofs rely on
//! this to show rover's host-side calls load nothing from a repository.

mod claude;
mod codex;

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::{json, Map, Value};

/// Environment variable naming the personality when argv[0] does not.
const AS_ENV: &str = "ROVER_FAKE_AGENT_AS";
/// Environment variable with the script (path or inline JSON).
const SCRIPT_ENV: &str = "ROVER_FAKE_AGENT_SCRIPT";
/// Environment variable naming the record dir.
const LOG_ENV: &str = "ROVER_FAKE_AGENT_LOG";
/// Env names whose values are recorded (everything else: only the name).
const RECORDED_ENV: &[&str] = &[
    "GITHUB_TOKEN",
    "GH_TOKEN",
    "ANTHROPIC_API_KEY",
    "OPENAI_API_KEY",
    "CODEX_API_KEY",
    "OPENAI_BASE_URL",
    "CODEX_HOME",
    "HOME",
    "PATH",
    "IS_SANDBOX",
];

/// What one invocation was asked, for the record and for rule matching.
#[derive(Debug, Default)]
pub struct Call {
    pub prompt: String,
    pub system_prompt: Option<String>,
    pub schema: Option<Value>,
    pub model: Option<String>,
    pub resume: Option<String>,
    pub max_turns: Option<u32>,
    pub tools: Vec<String>,
    pub sandbox: Option<String>,
    pub output_format: String,
    pub verbose: bool,
    pub output_last: Option<String>,
    /// `--tools` (claude): the tools offered to the model; `None` when not given (all).
    pub offered_tools: Option<Vec<String>>,
    /// `--setting-sources` (claude), as given.
    pub setting_sources: Option<String>,
    /// `--settings` (claude), as given.
    pub settings: Option<String>,
    /// `--strict-mcp-config` (claude).
    pub strict_mcp: bool,
}

/// The rule that decides an invocation's behaviour.
#[derive(Debug, Clone, Default)]
pub struct Rule {
    pub mode: String,
    pub text: Option<String>,
    pub structured: Option<Value>,
    pub status: u16,
    pub exit: Option<i32>,
    pub delay_ms: u64,
    pub lines: usize,
    pub bytes: usize,
    pub write: Vec<(String, String)>,
    pub delete: Vec<String>,
    /// Shell commands run with `sh -c` in the cwd after the writes (an agent's Bash tool);
    /// their failures are ignored (attacks are expected to fail).
    pub run: Vec<String>,
}

impl Rule {
    fn from_value(value: &Value) -> Rule {
        let str_of = |key: &str| value.get(key).and_then(Value::as_str).map(str::to_owned);
        let num = |key: &str| value.get(key).and_then(Value::as_u64);
        Rule {
            mode: str_of("mode").unwrap_or_else(|| "ok".to_owned()),
            text: str_of("text"),
            structured: value.get("structured").cloned(),
            status: num("status")
                .and_then(|n| u16::try_from(n).ok())
                .unwrap_or(401),
            exit: value
                .get("exit")
                .and_then(Value::as_i64)
                .and_then(|n| i32::try_from(n).ok()),
            delay_ms: num("delay_ms").unwrap_or(0),
            lines: num("lines")
                .and_then(|n| usize::try_from(n).ok())
                .unwrap_or(5),
            bytes: num("bytes")
                .and_then(|n| usize::try_from(n).ok())
                .unwrap_or(8 * 1024 * 1024),
            write: value
                .get("write")
                .and_then(Value::as_object)
                .map(|map| {
                    map.iter()
                        .map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_owned()))
                        .collect()
                })
                .unwrap_or_default(),
            run: strings(value, "run"),
            delete: strings(value, "delete"),
        }
    }

    /// The answer text: the scripted text, else the structured JSON, else a greeting.
    pub fn answer(&self, personality: &str) -> String {
        if let Some(text) = &self.text {
            return text.clone();
        }
        if let Some(value) = &self.structured {
            return value.to_string();
        }
        if personality == "codex" {
            "Hello from fake codex model.".to_owned()
        } else {
            "Hello from fake model.".to_owned()
        }
    }
}

/// The strings of the list at `key` (none when absent).
fn strings(value: &Value, key: &str) -> Vec<String> {
    value
        .get(key)
        .and_then(Value::as_array)
        .map(|list| {
            list.iter()
                .filter_map(Value::as_str)
                .map(str::to_owned)
                .collect()
        })
        .unwrap_or_default()
}

/// Prints to stderr and exits with `code` (usage errors and refusals).
pub fn fail(message: &str, code: i32) -> ! {
    eprintln!("{message}");
    std::process::exit(code);
}

/// Prints one stdout line and flushes it (the daemon reads line by line).
pub fn emit(line: &str) {
    let mut out = std::io::stdout().lock();
    // A closed stdout means the reader is gone; nothing useful to do about it.
    let _ = out.write_all(line.as_bytes());
    let _ = out.write_all(b"\n");
    let _ = out.flush();
}

/// Prints without a newline (a truncated last line).
pub fn emit_partial(text: &str) {
    let mut out = std::io::stdout().lock();
    let _ = out.write_all(text.as_bytes());
    let _ = out.flush();
}

/// Stderr noise like the real CLIs print, including a JSON-looking line that must never be
/// parsed as a result.
pub fn stderr_noise() {
    eprintln!("warning: fake agent noise on stderr (never parse stderr)");
    eprintln!(
        r#"{{"type":"result","subtype":"success","is_error":true,"result":"stderr must not be parsed"}}"#
    );
    eprintln!(r#"{{"type":"turn.failed","error":{{"message":"stderr must not be parsed"}}}}"#);
}

pub fn sleep_ms(ms: u64) {
    std::thread::sleep(Duration::from_millis(ms));
}

/// Hangs: optionally ignoring SIGTERM (blocked, so only SIGKILL ends it), with a grandchild
/// in the same process group that must be stopped too.
pub fn hang(ignore_term: bool, log: Option<&Path>, invocation: u32) -> ! {
    if ignore_term {
        let mut set = nix::sys::signal::SigSet::empty();
        set.add(nix::sys::signal::Signal::SIGTERM);
        let _ = nix::sys::signal::sigprocmask(
            nix::sys::signal::SigmaskHow::SIG_BLOCK,
            Some(&set),
            None,
        );
    }
    if let Ok(child) = std::process::Command::new("sleep")
        .arg("600")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
    {
        if let Some(dir) = log {
            let _ = std::fs::write(
                dir.join(format!("call-{invocation}.grandchild")),
                child.id().to_string(),
            );
        }
    }
    loop {
        sleep_ms(1000);
    }
}

/// Applies the rule's file writes and deletions in the cwd (relative paths only).
pub fn apply_files(rule: &Rule) -> Vec<(String, &'static str)> {
    let mut changes = Vec::new();
    for (path, content) in &rule.write {
        let path_ref = Path::new(path);
        if path_ref.is_absolute() || path.contains("..") {
            fail(
                &format!("fake agent: refusing to write outside the cwd: {path}"),
                98,
            );
        }
        let existed = path_ref.exists();
        if let Some(parent) = path_ref.parent().filter(|p| !p.as_os_str().is_empty()) {
            let _ = std::fs::create_dir_all(parent);
        }
        if let Err(err) = std::fs::write(path_ref, content) {
            fail(&format!("fake agent: cannot write {path}: {err}"), 98);
        }
        changes.push((path.clone(), if existed { "update" } else { "add" }));
    }
    for path in &rule.delete {
        if Path::new(path).is_absolute() || path.contains("..") {
            fail(
                &format!("fake agent: refusing to delete outside the cwd: {path}"),
                98,
            );
        }
        let _ = std::fs::remove_file(path);
        changes.push((path.clone(), "delete"));
    }
    for command in &rule.run {
        run_configured("command", command);
    }
    changes
}

/// Runs `command` with `sh -c` in the cwd, ignoring how it ends (the agent's own command, or
/// a hook or server the CLI starts from its configuration).
pub fn run_configured(what: &str, command: &str) {
    let status = std::process::Command::new("sh")
        .arg("-c")
        .arg(command)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .status();
    eprintln!("fake agent: started {what} `{command}`: {status:?}");
}

/// Reads all of stdin (the real CLIs wait for EOF).
pub fn read_stdin() -> String {
    let mut text = String::new();
    let _ = std::io::stdin().read_to_string(&mut text);
    text
}

/// Whether stdin is a pipe or a file (not /dev/null or a terminal).
pub fn stdin_is_piped() -> bool {
    use std::os::unix::fs::FileTypeExt;
    std::fs::metadata("/proc/self/fd/0")
        .is_ok_and(|meta| meta.file_type().is_fifo() || meta.file_type().is_file())
}

pub fn new_id() -> String {
    uuid::Uuid::new_v4().to_string()
}

/// The record dir, if any.
pub fn log_dir() -> Option<PathBuf> {
    std::env::var_os(LOG_ENV).map(PathBuf::from)
}

/// Whether a session id was created by an earlier invocation (always true without a log dir).
pub fn session_known(id: &str) -> bool {
    log_dir().is_none_or(|dir| dir.join("sessions").join(id).exists())
}

/// Remembers a session id for later resumes.
pub fn remember_session(id: &str) {
    if let Some(dir) = log_dir() {
        let sessions = dir.join("sessions");
        let _ = std::fs::create_dir_all(&sessions);
        let _ = std::fs::write(sessions.join(id), b"");
    }
}

/// Claims the next invocation number and writes the record of this call.
fn record(personality: &str, argv: &[String], call: &Call) -> u32 {
    let Some(dir) = log_dir() else {
        return 1;
    };
    let _ = std::fs::create_dir_all(&dir);
    let mut env = Map::new();
    for name in RECORDED_ENV {
        if let Ok(value) = std::env::var(name) {
            env.insert((*name).to_owned(), Value::String(value));
        }
    }
    let mut names: Vec<String> = std::env::vars_os()
        .filter_map(|(name, _)| name.into_string().ok())
        .collect();
    names.sort();
    let body = json!({
        "personality": personality,
        "argv": argv,
        "cwd": std::env::current_dir().map(|p| p.display().to_string()).unwrap_or_default(),
        "env": env,
        "envNames": names,
        "prompt": call.prompt,
        "systemPrompt": call.system_prompt,
        "schema": call.schema,
        "model": call.model,
        "resume": call.resume,
        "maxTurns": call.max_turns,
        "tools": call.tools,
        "sandbox": call.sandbox,
        "outputFormat": call.output_format,
        "offeredTools": call.offered_tools,
        "settingSources": call.setting_sources,
        "settings": call.settings,
        "strictMcp": call.strict_mcp,
        "pid": std::process::id(),
    });
    for n in 1..100_000_u32 {
        let path = dir.join(format!("call-{n}.json"));
        match std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&path)
        {
            Ok(mut file) => {
                let mut body = body;
                body["invocation"] = json!(n);
                let _ = file.write_all(body.to_string().as_bytes());
                return n;
            }
            Err(err) if err.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(err) => fail(
                &format!("fake agent: cannot write {}: {err}", path.display()),
                98,
            ),
        }
    }
    fail("fake agent: too many invocations", 98)
}

/// Loads the script and picks the rule for this call.
fn pick_rule(call: &Call, invocation: u32) -> Rule {
    let Ok(source) = std::env::var(SCRIPT_ENV) else {
        return Rule {
            mode: "ok".to_owned(),
            ..Rule::default()
        };
    };
    let text = if source.trim_start().starts_with(['[', '{']) {
        source
    } else {
        std::fs::read_to_string(&source).unwrap_or_else(|err| {
            fail(
                &format!("fake agent: cannot read script {source}: {err}"),
                98,
            )
        })
    };
    let script: Value = serde_json::from_str(&text)
        .unwrap_or_else(|err| fail(&format!("fake agent: script is not json: {err}"), 98));
    let (strict, rules) = match &script {
        Value::Array(rules) => (false, rules.clone()),
        other => (
            other
                .get("strict")
                .and_then(Value::as_bool)
                .unwrap_or(false),
            other
                .get("rules")
                .and_then(Value::as_array)
                .cloned()
                .unwrap_or_default(),
        ),
    };
    for rule in &rules {
        // One substring, or a list of them that must all be there.
        let by_prompt = match rule.get("prompt_contains") {
            None => true,
            Some(Value::String(needle)) => call.prompt.contains(needle.as_str()),
            Some(Value::Array(needles)) => needles
                .iter()
                .all(|n| n.as_str().is_some_and(|n| call.prompt.contains(n))),
            Some(_) => false,
        };
        let by_number = rule
            .get("invocation")
            .and_then(Value::as_u64)
            .is_none_or(|n| n == u64::from(invocation));
        if by_prompt && by_number {
            let mut rule = Rule::from_value(rule);
            // A file written as `{{prompt}}` holds the prompt (a sandboxed run's prompt, which
            // the log outside the container cannot receive, comes back with the worktree).
            for (_, content) in &mut rule.write {
                if content == "{{prompt}}" {
                    content.clone_from(&call.prompt);
                }
            }
            return rule;
        }
    }
    if strict {
        fail(
            &format!("fake agent: no rule matches invocation {invocation} (strict script)"),
            99,
        );
    }
    Rule {
        mode: "ok".to_owned(),
        ..Rule::default()
    }
}

fn main() {
    let argv: Vec<String> = std::env::args().collect();
    let name = argv
        .first()
        .map(|a| {
            Path::new(a)
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default()
        })
        .unwrap_or_default();
    let personality = match name.as_str() {
        "claude" | "codex" => name,
        _ => std::env::var(AS_ENV).unwrap_or_default(),
    };
    let args = &argv[1..];
    let (call, cwd) = match personality.as_str() {
        "claude" => (claude::parse(args), None),
        "codex" => codex::parse(args),
        other => fail(
            &format!("fake agent: unknown personality `{other}`: name the binary claude or codex, or set {AS_ENV}"),
            98,
        ),
    };
    if let Some(dir) = cwd {
        if std::env::set_current_dir(&dir).is_err() {
            fail(&format!("Error: cannot change to {}", dir.display()), 1);
        }
    }
    if personality == "codex" {
        codex::check_repo(args);
        codex::load_project_config();
    } else {
        claude::load_project_config(&call);
    }
    let invocation = record(&personality, args, &call);
    let rule = pick_rule(&call, invocation);
    stderr_noise();
    if rule.mode == "crash" {
        // A refusal before any output, like a usage or environment error of the real CLIs.
        fail(&rule.answer(&personality), rule.exit.unwrap_or(1));
    }
    if rule.delay_ms > 0 && rule.mode == "ok" {
        sleep_ms(rule.delay_ms);
    }
    let log = log_dir();
    match personality.as_str() {
        "claude" => claude::respond(&call, &rule, log.as_deref(), invocation),
        _ => codex::respond(&call, &rule, log.as_deref(), invocation),
    }
}
