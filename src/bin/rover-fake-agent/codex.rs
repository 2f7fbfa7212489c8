//! The `codex` personality: clap-style `exec` argv, prompt argument (stdin appended when
//! piped), JSONL events or the human mode.

use std::path::{Path, PathBuf};

use serde_json::{json, Value};

use crate::{
    apply_files, emit, emit_partial, fail, hang, new_id, read_stdin, remember_session,
    session_known, sleep_ms, stdin_is_piped, Call, Rule,
};

const USAGE: &str = "Usage: codex exec [OPTIONS] [PROMPT]\n       codex exec [OPTIONS] <COMMAND> [ARGS]\n\nFor more information, try '--help'.";

fn unexpected(arg: &str) -> ! {
    fail(
        &format!(
            "error: unexpected argument '{arg}' found\n\n  tip: to pass '{arg}' as a value, use '-- {arg}'\n\n{USAGE}"
        ),
        2,
    )
}

/// Options after `exec` (and after `resume`), by how many values they take.
const SWITCHES: &[&str] = &[
    "--json",
    "--experimental-json",
    "--dangerously-bypass-approvals-and-sandbox",
    "--skip-git-repo-check",
    "--ephemeral",
    "--oss",
    "--ignore-user-config",
    "--ignore-rules",
    "--strict-config",
    "--approve-for-me",
    "--last",
    "--all",
    "--trust",
];
const VALUED: &[&str] = &[
    "--output-schema",
    "-o",
    "--output-last-message",
    "-s",
    "--sandbox",
    "-m",
    "--model",
    "-C",
    "--cd",
    "--add-dir",
    "-c",
    "--config",
    "--color",
    "-i",
    "--image",
    "-p",
    "--profile",
    "--enable",
    "--disable",
    "--local-provider",
];

/// Parses `codex exec ...` like clap; returns the call and the `-C` dir.
pub fn parse(args: &[String]) -> (Call, Option<PathBuf>) {
    match args.first().map(String::as_str) {
        Some("--version" | "-V") => {
            emit("codex-cli 0.169.0");
            std::process::exit(0);
        }
        Some("exec") => {}
        Some(other) => fail(
            &format!("error: unrecognized subcommand '{other}'\n\n{USAGE}"),
            2,
        ),
        None => fail("fake codex: only `codex exec` is supported", 2),
    }
    let mut call = Call {
        output_format: "human".to_owned(),
        ..Call::default()
    };
    let mut cd = None;
    let mut output_last = None;
    let mut resume = false;
    let mut positional: Vec<String> = Vec::new();
    let mut i = 1;
    while i < args.len() {
        let arg = &args[i];
        i += 1;
        if arg == "--" {
            positional.extend(args[i..].iter().cloned());
            break;
        }
        if arg == "resume" && !resume && positional.is_empty() {
            resume = true;
            continue;
        }
        if !arg.starts_with('-') || arg == "-" {
            positional.push(arg.clone());
            continue;
        }
        let (flag, inline) = match arg.split_once('=') {
            Some((flag, value)) if arg.starts_with("--") => {
                (flag.to_owned(), Some(value.to_owned()))
            }
            _ => (arg.clone(), None),
        };
        let flag = flag.as_str();
        if matches!(flag, "--version" | "-V") {
            emit("codex-cli 0.169.0");
            std::process::exit(0);
        }
        if SWITCHES.contains(&flag) {
            if matches!(flag, "--json" | "--experimental-json") {
                "json".clone_into(&mut call.output_format);
            }
            if flag == "--dangerously-bypass-approvals-and-sandbox" {
                call.sandbox = Some("danger-full-access".to_owned());
            }
            continue;
        }
        if !VALUED.contains(&flag) {
            unexpected(flag);
        }
        let value = inline.unwrap_or_else(|| {
            let next = args.get(i).cloned().unwrap_or_else(|| {
                fail(
                    &format!(
                        "error: a value is required for '{flag}' but none was supplied\n\n{USAGE}"
                    ),
                    2,
                )
            });
            i += 1;
            next
        });
        match flag {
            "-s" | "--sandbox" => {
                if !matches!(
                    value.as_str(),
                    "read-only" | "workspace-write" | "danger-full-access"
                ) {
                    fail(&format!("error: invalid value '{value}' for '--sandbox <SANDBOX_MODE>'\n  [possible values: read-only, workspace-write, danger-full-access]\n\n{USAGE}"), 2);
                }
                call.sandbox = Some(value);
            }
            "-m" | "--model" => call.model = Some(value),
            "-C" | "--cd" => cd = Some(PathBuf::from(value)),
            "-o" | "--output-last-message" => output_last = Some(value),
            "--output-schema" => {
                let text = std::fs::read_to_string(&value).unwrap_or_else(|err| {
                    fail(
                        &format!("Error: failed to read output schema file {value}: {err}"),
                        1,
                    )
                });
                call.schema = Some(serde_json::from_str(&text).unwrap_or_else(|err| {
                    fail(
                        &format!("Error: output schema file {value} is not valid JSON: {err}"),
                        1,
                    )
                }));
            }
            _ => {}
        }
    }
    let prompt_arg = if resume {
        let mut rest = positional.into_iter();
        let id = rest.next();
        let prompt = rest.next();
        if let Some(extra) = rest.next() {
            unexpected(&extra);
        }
        call.resume = id;
        prompt
    } else {
        if positional.len() > 1 {
            unexpected(&positional[1]);
        }
        positional.into_iter().next()
    };
    call.prompt = match prompt_arg.as_deref() {
        None | Some("-") => read_stdin(),
        Some(text) if stdin_is_piped() => {
            // A piped stdin is waited for and appended, like the real CLI.
            let stdin = read_stdin();
            if stdin.is_empty() {
                text.to_owned()
            } else {
                format!("{text}\n\n<stdin>\n{stdin}\n</stdin>")
            }
        }
        Some(text) => text.to_owned(),
    };
    if call.prompt.trim().is_empty() {
        fail(
            "No prompt provided. Either specify one as an argument or pipe the prompt into stdin.",
            1,
        );
    }
    if let Some(id) = &call.resume {
        if !session_known(id) {
            fail(&format!("Error: thread/resume: thread/resume failed: no rollout found for thread id {id} (code -32600)"), 1);
        }
    }
    call.output_last = output_last;
    (call, cd)
}

/// Outside a git repository codex refuses to run without `--skip-git-repo-check`.
pub fn check_repo(args: &[String]) {
    if args.iter().any(|a| a == "--skip-git-repo-check") {
        return;
    }
    let cwd = std::env::current_dir().unwrap_or_default();
    if !cwd.ancestors().any(|dir| dir.join(".git").exists()) {
        fail(
            "Not inside a trusted directory and --skip-git-repo-check was not specified.",
            1,
        );
    }
}

/// Whether the real CLI would have credentials: `CODEX_API_KEY` (it ignores `OPENAI_API_KEY`)
/// or a `codex login` in `$CODEX_HOME/auth.json` (default `~/.codex`).
fn has_credentials() -> bool {
    let set = |name: &str| std::env::var(name).is_ok_and(|v| !v.trim().is_empty());
    if set("CODEX_API_KEY") {
        return true;
    }
    let home = std::env::var_os("CODEX_HOME")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|home| PathBuf::from(home).join(".codex")));
    home.is_some_and(|dir| dir.join("auth.json").is_file())
}

/// The `turn.failed` message of an API error, as codex 0.169 prints it (real captures in
/// `tests/fixtures/codex/err_*.jsonl`), and whether codex reconnected first.
fn api_error_message(status: u16) -> (String, bool) {
    const URL: &str = "http://127.0.0.1:9/v1/responses";
    match status {
        // A 400 shows as the API's raw JSON error body, without retries.
        400 => (
            json!({"error": {"message": "Invalid schema for response_format 'codex_output_schema': fake rejection",
                "type": "invalid_request_error", "param": "text.format.schema", "code": "invalid_json_schema"}})
            .to_string(),
            false,
        ),
        429 => (
            "exceeded retry limit, last status: 429 Too Many Requests".to_owned(),
            false,
        ),
        500 => (
            "We\u{2019}re currently experiencing high demand, which may cause temporary errors."
                .to_owned(),
            true,
        ),
        _ => {
            let reason = match status {
                401 => "401 Unauthorized",
                403 => "403 Forbidden",
                404 => "404 Not Found",
                422 => "422 Unprocessable Entity",
                502 => "502 Bad Gateway",
                503 => "503 Service Unavailable",
                529 => "529 Site Overloaded",
                other => return (format!("unexpected status {other}: fake error, url: {URL}"), true),
            };
            (
                format!("unexpected status {reason}: fake error, url: {URL}"),
                true,
            )
        }
    }
}

/// Acts out a failed turn: reconnect notices, `error`, `turn.failed`, exit 1.
fn fail_turn(out: &dyn Fn(Value), json_mode: bool, message: &str, reconnects: bool) -> ! {
    out(json!({"type": "turn.started"}));
    if reconnects {
        for n in 1..=5 {
            out(json!({"type": "error", "message": format!("Reconnecting... {n}/5 ({message})")}));
        }
    }
    out(json!({"type": "error", "message": message}));
    out(json!({"type": "turn.failed", "error": {"message": message}}));
    if !json_mode {
        eprintln!("ERROR: {message}");
    }
    std::process::exit(1);
}

fn item(id: usize, body: Value) -> Value {
    let mut item = body;
    item["id"] = json!(format!("item_{id}"));
    json!({"type": "item.completed", "item": item})
}

/// Acts out the rule on stdout and exits.
pub fn respond(call: &Call, rule: &Rule, log: Option<&Path>, invocation: u32) -> ! {
    let json_mode = call.output_format == "json";
    let thread = call.resume.clone().unwrap_or_else(new_id);
    remember_session(&thread);
    let out = |value: Value| {
        if json_mode {
            emit(&value.to_string());
        }
    };
    out(json!({"type": "thread.started", "thread_id": thread}));
    if !json_mode {
        eprintln!("OpenAI Codex v0.169.0\n--------\nsession id: {thread}\n--------");
    }
    if !has_credentials() {
        // What the API answers a request without a bearer token.
        fail_turn(
            &out,
            json_mode,
            "unexpected status 401 Unauthorized: Missing bearer or basic authentication in header, url: https://api.openai.com/v1/responses",
            true,
        );
    }
    match rule.mode.as_str() {
        "hang" => hang(false, log, invocation),
        "hang_ignore_term" => hang(true, log, invocation),
        "killed" => {
            let _ = nix::sys::signal::raise(nix::sys::signal::Signal::SIGKILL);
            std::process::exit(137);
        }
        "exit_137" => std::process::exit(137),
        "truncated" => {
            let line = item(
                1,
                json!({"type": "agent_message", "text": rule.answer("codex")}),
            )
            .to_string();
            emit_partial(&line[..line.len() / 2]);
            std::process::exit(rule.exit.unwrap_or(1));
        }
        "max_turns" => fail_turn(
            &out,
            json_mode,
            "the model kept calling tools: turn limit reached",
            false,
        ),
        "api_error" => {
            let (message, reconnects) = api_error_message(rule.status);
            fail_turn(&out, json_mode, &message, reconnects);
        }
        "ok" | "slow" | "huge_line" | "denied" | "invalid_structured" | "exit_after_success"
        | "hang_after_result" => {}
        other => fail(&format!("fake agent: unknown mode `{other}`"), 98),
    }
    // A non-fatal reconnect notice, as the real CLI prints before falling back to HTTPS.
    out(json!({"type": "error", "message": "Reconnecting... 1/5 (fake)"}));
    out(json!({"type": "turn.started"}));
    let mut n = 0;
    let mut next = || {
        n += 1;
        n
    };
    out(item(
        next(),
        json!({"type": "reasoning", "text": "**Thinking about it**"}),
    ));
    if rule.mode == "slow" {
        for k in 0..rule.lines {
            sleep_ms(rule.delay_ms);
            out(item(
                next(),
                json!({"type": "reasoning", "text": format!("working {k}")}),
            ));
        }
    }
    if rule.mode == "huge_line" {
        out(item(
            next(),
            json!({"type": "reasoning", "text": "x".repeat(rule.bytes)}),
        ));
    }
    let changes = apply_files(rule);
    if !changes.is_empty() {
        let cwd = std::env::current_dir().unwrap_or_default();
        let list: Vec<Value> = changes
            .iter()
            .map(|(path, kind)| json!({"path": cwd.join(path).display().to_string(), "kind": kind}))
            .collect();
        out(item(
            next(),
            json!({"type": "file_change", "changes": list, "status": "completed"}),
        ));
    }
    let text = match (&call.schema, rule.mode.as_str()) {
        (_, "invalid_structured") => rule
            .text
            .clone()
            .unwrap_or_else(|| "this is not json {".to_owned()),
        (Some(_), _) => rule
            .structured
            .as_ref()
            .map_or_else(|| rule.answer("codex"), Value::to_string),
        (None, _) => rule.answer("codex"),
    };
    out(item(next(), json!({"type": "agent_message", "text": text})));
    if let Some(path) = &call.output_last {
        let _ = std::fs::write(path, &text);
    }
    out(
        json!({"type": "turn.completed", "usage": {"input_tokens": 100, "cached_input_tokens": 40,
        "cache_write_input_tokens": 0, "output_tokens": 20, "reasoning_output_tokens": 5}}),
    );
    if !json_mode {
        emit(&text);
    }
    match rule.mode.as_str() {
        "exit_after_success" => std::process::exit(rule.exit.unwrap_or(3)),
        "hang_after_result" => hang(false, log, invocation),
        _ => std::process::exit(0),
    }
}

/// What codex would start from a project's `.codex/config.toml` in its working directory (MCP
/// servers, notify programs): each `command = "..."` line is run.
pub fn load_project_config() {
    let Ok(text) = std::fs::read_to_string(".codex/config.toml") else {
        return;
    };
    for line in text.lines() {
        let Some(rest) = line.trim().strip_prefix("command") else {
            continue;
        };
        let Some(value) = rest.trim_start().strip_prefix('=') else {
            continue;
        };
        let command = value.trim().trim_matches('"');
        if !command.is_empty() {
            crate::run_configured("project config command", command);
        }
    }
}
