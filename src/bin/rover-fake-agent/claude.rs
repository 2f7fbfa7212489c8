//! The `claude` personality: commander-style argv, prompt on stdin, `-p` output formats.

use std::path::Path;

use serde_json::{json, Value};

use crate::{
    apply_files, emit, emit_partial, fail, hang, new_id, read_stdin, remember_session,
    session_known, sleep_ms, Call, Rule,
};

const VALUE_FLAGS: &[&str] = &[
    "--output-format",
    "--input-format",
    "--json-schema",
    "--append-system-prompt",
    "--system-prompt",
    "--model",
    "--session-id",
    "--max-turns",
    "--permission-mode",
    "--fallback-model",
    "--max-budget-usd",
    "--settings",
    "--setting-sources",
    "--effort",
];
const VARIADIC_FLAGS: &[&str] = &[
    "--allowedTools",
    "--allowed-tools",
    "--disallowedTools",
    "--disallowed-tools",
    "--add-dir",
    "--mcp-config",
    "--tools",
    "--betas",
];
const SWITCHES: &[&str] = &[
    "--no-session-persistence",
    "-c",
    "--continue",
    "--fork-session",
    "--bare",
    "--strict-mcp-config",
    "--include-partial-messages",
    "--replay-user-messages",
];

/// Parsed flags the responder needs beyond the shared `Call`.
struct Flags {
    verbose: bool,
    print: bool,
    skip_permissions: bool,
    session_id: Option<String>,
}

/// Parses argv like the real CLI (commander): unknown options fail with exit 1, variadic
/// options swallow following non-option arguments, `--` ends options.
pub fn parse(args: &[String]) -> Call {
    let mut call = Call {
        output_format: "text".to_owned(),
        ..Call::default()
    };
    let mut flags = Flags {
        verbose: false,
        print: false,
        skip_permissions: false,
        session_id: None,
    };
    let positional = read_args(args, &mut call, &mut flags);
    check_flags(&call, &flags);
    call.prompt = if positional.is_empty() {
        read_stdin()
    } else {
        positional.join(" ")
    };
    if call.prompt.trim().is_empty() {
        fail(
            "Error: Input must be provided either through stdin or as a prompt argument when using --print",
            1,
        );
    }
    if let Some(id) = &call.resume {
        if !session_known(id) {
            fail(&format!("No conversation found with session ID: {id}"), 1);
        }
    }
    if let Some(id) = &flags.session_id {
        if crate::log_dir().is_some() && session_known(id) {
            fail(&format!("Error: Session ID {id} is already in use."), 1);
        }
        call.resume.get_or_insert_with(|| id.clone());
    }
    call.verbose = flags.verbose;
    call
}

/// Reads the options into `call` and `flags`; returns the positional arguments.
fn read_args(args: &[String], call: &mut Call, flags: &mut Flags) -> Vec<String> {
    let mut positional: Vec<String> = Vec::new();
    let mut i = 0;
    while i < args.len() {
        let arg = &args[i];
        i += 1;
        if arg == "--" {
            positional.extend(args[i..].iter().cloned());
            break;
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
        i = read_option(args, i, (&flag, inline), call, flags);
    }
    positional
}

/// One option (`flag`, with the value written after its `=`), `i` the index past it: takes its
/// values and returns the index past them.
fn read_option(
    args: &[String],
    mut i: usize,
    (flag, inline): (&str, Option<String>),
    call: &mut Call,
    flags: &mut Flags,
) -> usize {
    match flag {
        "-p" | "--print" => flags.print = true,
        "--verbose" => flags.verbose = true,
        "-v" | "--version" => {
            emit("2.1.197 (Claude Code)");
            std::process::exit(0);
        }
        "-h" | "--help" => {
            emit("Usage: claude [options] [command] [prompt]");
            std::process::exit(0);
        }
        "--dangerously-skip-permissions" | "--allow-dangerously-skip-permissions" => {
            flags.skip_permissions = true;
        }
        "-r" | "--resume" => {
            let value = inline.or_else(|| {
                let next = args.get(i).filter(|a| !a.starts_with('-'))?.clone();
                i += 1;
                Some(next)
            });
            call.resume = Some(value.unwrap_or_else(|| {
                fail(
                    "Error: --resume without an id needs an interactive terminal",
                    1,
                )
            }));
        }
        "--strict-mcp-config" => call.strict_mcp = true,
        _ if SWITCHES.contains(&flag) => {}
        _ if VALUE_FLAGS.contains(&flag) => {
            let value = inline.unwrap_or_else(|| {
                let next = args.get(i).cloned().unwrap_or_else(|| {
                    fail(
                        &format!("error: option '{flag} <value>' argument missing"),
                        1,
                    )
                });
                i += 1;
                next
            });
            apply_value(call, flags, flag, value);
        }
        _ if VARIADIC_FLAGS.contains(&flag) => {
            let mut values: Vec<String> = inline.into_iter().collect();
            while let Some(next) = args.get(i).filter(|a| !a.starts_with('-')) {
                values.push(next.clone());
                i += 1;
            }
            apply_values(call, flag, &values);
        }
        _ => fail(&format!("error: unknown option '{flag}'"), 1),
    }
    i
}

/// A variadic option's values: the tools offered or allowed.
fn apply_values(call: &mut Call, flag: &str, values: &[String]) {
    if values.is_empty() {
        fail(
            &format!("error: option '{flag} <values...>' argument missing"),
            1,
        );
    }
    let tools = || {
        values
            .iter()
            .flat_map(|v| v.split([',', ' ']))
            .filter(|t| !t.is_empty())
            .map(str::to_owned)
    };
    if flag == "--tools" {
        call.offered_tools = Some(tools().collect());
    }
    if flag.starts_with("--allowed") {
        call.tools.extend(tools());
    }
}

/// Refuses what the real CLI refuses: an interactive run, an unknown output format,
/// stream-json without `--verbose`, skipped permissions as root outside a sandbox.
fn check_flags(call: &Call, flags: &Flags) {
    if !flags.print {
        fail("fake claude: only non-interactive -p runs are supported", 1);
    }
    if !matches!(call.output_format.as_str(), "text" | "json" | "stream-json") {
        fail(
            &format!(
                "error: option '--output-format <format>' argument '{}' is invalid. Allowed choices are text, json, stream-json.",
                call.output_format
            ),
            1,
        );
    }
    if call.output_format == "stream-json" && !flags.verbose {
        fail(
            "Error: When using --print, --output-format=stream-json requires --verbose",
            1,
        );
    }
    if flags.skip_permissions
        && nix::unistd::geteuid().is_root()
        && std::env::var("IS_SANDBOX").as_deref() != Ok("1")
    {
        fail(
            "--dangerously-skip-permissions cannot be used with root/sudo privileges for security reasons",
            1,
        );
    }
}

fn apply_value(call: &mut Call, flags: &mut Flags, flag: &str, value: String) {
    match flag {
        "--output-format" => call.output_format = value,
        "--json-schema" => {
            call.schema = Some(serde_json::from_str(&value).unwrap_or_else(|err| {
                fail(&format!("Error: --json-schema is not valid JSON: {err}"), 1)
            }));
        }
        "--append-system-prompt" | "--system-prompt" => call.system_prompt = Some(value),
        "--model" => call.model = Some(value),
        "--max-turns" => {
            call.max_turns = Some(value.parse().unwrap_or_else(|_| {
                fail(
                    &format!("error: --max-turns expects a number, got '{value}'"),
                    1,
                )
            }));
        }
        "--permission-mode" if value == "bypassPermissions" => flags.skip_permissions = true,
        "--session-id" => flags.session_id = Some(value),
        "--setting-sources" => call.setting_sources = Some(value),
        "--settings" => call.settings = Some(value),
        _ => {}
    }
}

/// What the real CLI loads from its working directory at start in `-p` mode (the workspace
/// trust dialog is skipped): `SessionStart` hooks of the project and local settings, and the
/// project's MCP servers. Each configured command is run.
pub fn load_project_config(call: &Call) {
    let sources: Vec<String> = call.setting_sources.as_deref().map_or_else(
        || vec!["user".into(), "project".into(), "local".into()],
        |s| {
            s.split(',')
                .map(|p| p.trim().to_owned())
                .filter(|p| !p.is_empty())
                .collect()
        },
    );
    let hooks_disabled = call
        .settings
        .as_deref()
        .and_then(|s| serde_json::from_str::<Value>(s).ok())
        .and_then(|v| v.get("disableAllHooks").and_then(Value::as_bool))
        .unwrap_or(false);
    for (source, file) in [
        ("project", ".claude/settings.json"),
        ("local", ".claude/settings.local.json"),
    ] {
        if hooks_disabled || !sources.iter().any(|s| s == source) {
            continue;
        }
        let Some(settings) = std::fs::read_to_string(file)
            .ok()
            .and_then(|t| serde_json::from_str::<Value>(&t).ok())
        else {
            continue;
        };
        let groups = settings
            .pointer("/hooks/SessionStart")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        for group in groups {
            for hook in group
                .get("hooks")
                .and_then(Value::as_array)
                .cloned()
                .unwrap_or_default()
            {
                if let Some(command) = hook.get("command").and_then(Value::as_str) {
                    crate::run_configured("SessionStart hook", command);
                }
            }
        }
    }
    if call.strict_mcp {
        return;
    }
    let Some(mcp) = std::fs::read_to_string(".mcp.json")
        .ok()
        .and_then(|t| serde_json::from_str::<Value>(&t).ok())
    else {
        return;
    };
    if let Some(servers) = mcp.get("mcpServers").and_then(Value::as_object) {
        for server in servers.values() {
            let Some(command) = server.get("command").and_then(Value::as_str) else {
                continue;
            };
            let args: Vec<String> = server
                .get("args")
                .and_then(Value::as_array)
                .map(|a| {
                    a.iter()
                        .filter_map(Value::as_str)
                        .map(str::to_owned)
                        .collect()
                })
                .unwrap_or_default();
            let status = std::process::Command::new(command)
                .args(&args)
                .stdin(std::process::Stdio::null())
                .stdout(std::process::Stdio::null())
                .status();
            eprintln!("fake agent: started MCP server `{command}`: {status:?}");
        }
    }
}

/// Writes messages the way the chosen output format does.
struct Out {
    format: String,
    verbose: bool,
    messages: Vec<Value>,
}

impl Out {
    fn push(&mut self, value: Value) {
        if self.format == "stream-json" {
            emit(&value.to_string());
        } else {
            self.messages.push(value);
        }
    }

    fn finish(mut self, result: Value) {
        match self.format.as_str() {
            "json" if self.verbose => {
                self.messages.push(result);
                emit(&Value::Array(self.messages).to_string());
            }
            "json" | "stream-json" => emit(&result.to_string()),
            _ => {
                let text = result
                    .get("result")
                    .and_then(Value::as_str)
                    .map_or_else(|| format!("Error: {}", result["errors"]), str::to_owned);
                emit(&text);
            }
        }
    }
}

#[allow(
    clippy::needless_pass_by_value,
    reason = "call sites build the content inline"
)]
fn assistant(session: &str, model: &str, content: Value, error: Option<&str>) -> Value {
    let mut line = json!({
        "type": "assistant",
        "message": {"id": format!("msg_fake{}", &new_id()[..8]), "type": "message", "role": "assistant",
            "model": model, "content": [content], "stop_reason": null, "stop_sequence": null,
            "usage": {"input_tokens": 12, "output_tokens": 1, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0},
            "context_management": null},
        "parent_tool_use_id": null, "session_id": session, "uuid": new_id(), "request_id": "req_fake123"
    });
    if let Some(code) = error {
        line["error"] = json!(code);
    }
    line
}

fn tool_result(session: &str, id: &str, content: &str, is_error: bool) -> Value {
    json!({"type": "user", "message": {"role": "user", "content": [
        {"tool_use_id": id, "type": "tool_result", "content": content, "is_error": is_error}]},
        "parent_tool_use_id": null, "session_id": session, "uuid": new_id(),
        "tool_use_result": content})
}

fn result(session: &str, model: &str, turns: u32) -> Value {
    json!({"type": "result", "subtype": "success", "is_error": false, "api_error_status": null,
        "duration_ms": 150, "duration_api_ms": 30, "num_turns": turns, "result": "",
        "stop_reason": "end_turn", "session_id": session, "total_cost_usd": 0.000_235,
        "usage": {"input_tokens": 12, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 3, "output_tokens": 7},
        "modelUsage": {model: {"inputTokens": 12, "outputTokens": 7, "cacheReadInputTokens": 3,
            "cacheCreationInputTokens": 0, "webSearchRequests": 0, "costUSD": 0.000_235,
            "contextWindow": 200_000, "maxOutputTokens": 64000}},
        "permission_denials": [], "terminal_reason": "completed", "uuid": new_id()})
}

/// The session a run writes its messages in.
struct Session {
    id: String,
    model: String,
}

impl Session {
    /// An assistant message of the session's model.
    fn says(&self, content: Value) -> Value {
        assistant(&self.id, &self.model, content, None)
    }
}

/// Acts out the rule on stdout and exits.
pub fn respond(call: &Call, rule: &Rule, log: Option<&Path>, invocation: u32) -> ! {
    let session = call.resume.clone().unwrap_or_else(new_id);
    remember_session(&session);
    let model = call
        .model
        .clone()
        .unwrap_or_else(|| "claude-fake".to_owned());
    let session = Session { id: session, model };
    let cwd = std::env::current_dir()
        .map(|p| p.display().to_string())
        .unwrap_or_default();
    let mut out = Out {
        format: call.output_format.clone(),
        verbose: call.verbose,
        messages: Vec::new(),
    };
    out.push(json!({"type": "system", "subtype": "init", "cwd": cwd, "session_id": session.id,
        "tools": ["Bash", "Edit", "Glob", "Grep", "Read", "Write"], "mcp_servers": [], "model": session.model,
        "permissionMode": "default", "apiKeySource": "ANTHROPIC_API_KEY",
        "claude_code_version": "2.1.197", "uuid": new_id()}));
    match rule.mode.as_str() {
        "hang" => hang(false, log, invocation),
        "hang_ignore_term" => hang(true, log, invocation),
        "killed" => {
            let _ = nix::sys::signal::raise(nix::sys::signal::Signal::SIGKILL);
            std::process::exit(137);
        }
        "exit_137" => std::process::exit(137),
        "truncated" => {
            let line = session
                .says(json!({"type": "text", "text": rule.answer("claude")}))
                .to_string();
            emit_partial(&line[..line.len() / 2]);
            std::process::exit(rule.exit.unwrap_or(1));
        }
        "api_error" => api_error(rule, &session, out),
        "max_turns" => max_turns(call, &session, out),
        "ok" | "slow" | "huge_line" | "denied" | "invalid_structured" | "exit_after_success"
        | "hang_after_result" => {}
        other => fail(&format!("fake agent: unknown mode `{other}`"), 98),
    }
    let mut res = result(&session.id, &session.model, 1);
    let turns = work(rule, &session, &mut out, &mut res);
    apply_files(rule);
    let turns = turns + answer(call, rule, &session, &mut out, &mut res);
    res["num_turns"] = json!(turns);
    out.finish(res);
    match rule.mode.as_str() {
        "exit_after_success" => std::process::exit(rule.exit.unwrap_or(3)),
        "hang_after_result" => hang(false, log, invocation),
        _ => std::process::exit(0),
    }
}

/// The API refused the call (`rule.status`): the error as the CLI reports it, exit 1.
fn api_error(rule: &Rule, session: &Session, mut out: Out) -> ! {
    let (code, text) = match rule.status {
        401 | 403 => (
            "authentication_failed",
            format!(
                "Failed to authenticate. API Error: {} fake authentication_error",
                rule.status
            ),
        ),
        429 => (
            "rate_limit",
            "API Error: 429 fake rate_limit_error".to_owned(),
        ),
        529 | 500 | 503 => (
            "server_error",
            format!("API Error: {} fake overloaded_error", rule.status),
        ),
        _ => (
            "unknown",
            format!("API Error: {} fake invalid_request_error", rule.status),
        ),
    };
    if rule.status == 429 {
        out.push(
            json!({"type": "rate_limit_event", "rate_limit_info": {"status": "rejected",
            "resetsAt": 4_102_444_800_i64, "rateLimitType": "five_hour"},
            "session_id": session.id, "uuid": new_id()}),
        );
    }
    out.push(assistant(
        &session.id,
        "<synthetic>",
        json!({"type": "text", "text": text}),
        Some(code),
    ));
    let mut res = result(&session.id, &session.model, 1);
    res["is_error"] = json!(true);
    res["api_error_status"] = json!(rule.status);
    res["result"] = json!(text);
    res["total_cost_usd"] = json!(0);
    res["modelUsage"] = json!({});
    res["stop_reason"] = json!("stop_sequence");
    out.finish(res);
    std::process::exit(1);
}

/// The run reached `--max-turns` with a tool call pending: exit 1.
fn max_turns(call: &Call, session: &Session, mut out: Out) -> ! {
    let limit = call.max_turns.unwrap_or(1);
    out.push(session.says(json!({"type": "tool_use", "id": "toolu_fake1",
        "name": "Bash", "input": {"command": "ls"}})));
    let mut res = result(&session.id, &session.model, limit + 1);
    res["subtype"] = json!("error_max_turns");
    res["is_error"] = json!(true);
    res["stop_reason"] = json!("tool_use");
    res["terminal_reason"] = json!("max_turns");
    res["errors"] = json!([format!("Reached maximum number of turns ({limit})")]);
    if let Some(map) = res.as_object_mut() {
        map.remove("result");
        map.remove("api_error_status");
    }
    out.finish(res);
    std::process::exit(1);
}

/// The messages of the work before the answer (slow lines, a huge line, a denied tool call,
/// the scripted writes); returns the turns, the first included.
fn work(rule: &Rule, session: &Session, out: &mut Out, res: &mut Value) -> u32 {
    let mut turns = 1;
    if rule.mode == "slow" {
        for n in 0..rule.lines {
            sleep_ms(rule.delay_ms);
            out.push(session.says(json!({"type": "text", "text": format!("working {n}")})));
        }
    }
    if rule.mode == "huge_line" {
        out.push(session.says(json!({"type": "text", "text": "x".repeat(rule.bytes)})));
    }
    if rule.mode == "denied" {
        let input = json!({"command": "touch created-by-tool.txt && git init -q sub"});
        out.push(session.says(
            json!({"type": "tool_use", "id": "toolu_denied", "name": "Bash", "input": input}),
        ));
        out.push(tool_result(
            &session.id,
            "toolu_denied",
            "This Bash command requires approval",
            true,
        ));
        res["permission_denials"] =
            json!([{"tool_name": "Bash", "tool_use_id": "toolu_denied", "tool_input": input}]);
        turns += 1;
    }
    for (n, (path, content)) in rule.write.iter().enumerate() {
        let id = format!("toolu_write{n}");
        out.push(
            session.says(json!({"type": "tool_use", "id": id, "name": "Write",
            "input": {"file_path": path, "content": content}})),
        );
        out.push(tool_result(
            &session.id,
            &id,
            "File created successfully",
            false,
        ));
        turns += 1;
    }
    turns
}

/// The answer: the scripted structure through the `StructuredOutput` tool when a schema was
/// given, else the text; returns the turns it took beyond the first.
fn answer(call: &Call, rule: &Rule, session: &Session, out: &mut Out, res: &mut Value) -> u32 {
    let structured = match (&call.schema, rule.mode.as_str()) {
        (Some(_), "invalid_structured") => Some(
            rule.structured
                .clone()
                .unwrap_or(json!({"unexpected": true})),
        ),
        (Some(_), _) => rule.structured.clone(),
        (None, _) => None,
    };
    if let Some(value) = structured {
        out.push(
            session.says(json!({"type": "tool_use", "id": "toolu_structured",
            "name": "StructuredOutput", "input": value})),
        );
        out.push(tool_result(
            &session.id,
            "toolu_structured",
            "Structured output provided successfully",
            false,
        ));
        res["result"] = json!(value.to_string());
        res["structured_output"] = value;
        res["stop_reason"] = json!("tool_use");
        1
    } else {
        // With a schema but no scripted structure this is the "schema asked, answer missing" case.
        let text = rule.answer("claude");
        out.push(session.says(json!({"type": "text", "text": text})));
        res["result"] = json!(text);
        0
    }
}
