//! Parser tests on every captured CLI output in `tests/fixtures/{claude,codex}`.

use std::path::PathBuf;

use super::types::{AgentStep, ErrorClass, ParseError, ToolPolicy};
use super::{claude, codex, AgentRequest};

fn fixture(path: &str) -> Vec<u8> {
    let full = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(path);
    std::fs::read(&full).unwrap_or_else(|err| panic!("read {}: {err}", full.display()))
}

fn claude_ok(path: &str) -> super::AgentResponse {
    claude::parse_output(&fixture(path)).unwrap_or_else(|err| panic!("{path}: {err}"))
}

#[test]
fn claude_plain_results_in_all_three_output_shapes() {
    for (path, session) in [
        ("claude/json.out", "010e5bfd-1655-4f8d-815f-cecc433ca986"),
        (
            "claude/json_verbose.out",
            "b57b7292-2ae4-4043-98ff-1b40841da425",
        ),
        (
            "claude/stream_text.jsonl",
            "d7ea7b84-e81c-4c52-9beb-77e3a8967f21",
        ),
    ] {
        let response = claude_ok(path);
        assert!(!response.is_error, "{path}");
        assert_eq!(response.text, "Hello from fake model.", "{path}");
        assert_eq!(response.session_id.as_deref(), Some(session), "{path}");
        assert_eq!(response.usage.input, 12, "{path}");
        assert_eq!(response.usage.output, 7, "{path}");
        assert_eq!(response.usage.cached, 0, "{path}");
        assert_eq!(response.cost_usd, Some(0.000_235), "{path}");
        assert_eq!(response.turns, Some(1), "{path}");
        assert!(response.duration_ms.is_some(), "{path}");
        assert!(response.structured.is_none(), "{path}");
        assert!(response.permission_denials.is_empty(), "{path}");
    }
}

#[test]
fn claude_structured_output_from_stream_and_json() {
    for path in ["claude/schema.jsonl", "claude/schema.json"] {
        let response = claude_ok(path);
        assert!(!response.is_error);
        assert_eq!(
            response.structured,
            Some(serde_json::json!({"decision": "approve", "reason": "looks fine"})),
            "{path}"
        );
        assert_eq!(response.turns, Some(2));
    }
    assert_eq!(claude_ok("claude/schema.jsonl").tool_calls, 1);
}

#[test]
fn claude_schema_asked_but_missing_is_success_without_structured_output() {
    let response = claude_ok("claude/schema_fail.json");
    assert!(!response.is_error);
    assert!(response.structured.is_none());
    assert_eq!(response.text, "Hello from fake model.");
}

#[test]
fn claude_tool_use_and_permission_denials() {
    let ok = claude_ok("claude/tool_ok.jsonl");
    assert!(!ok.is_error);
    assert_eq!(ok.tool_calls, 1);
    assert!(ok.permission_denials.is_empty());
    assert_eq!(ok.usage.input, 24);
    let denied = claude_ok("claude/tool_denied.jsonl");
    assert!(!denied.is_error, "a denial is not a failure of the run");
    assert_eq!(denied.permission_denials.len(), 1);
    assert_eq!(denied.permission_denials[0].tool_name, "Bash");
    assert_eq!(
        denied.permission_denials[0].tool_input["command"],
        "touch created-by-tool.txt && git init -q sub"
    );
}

#[test]
fn claude_api_errors_are_decided_by_is_error_not_subtype() {
    for (path, class) in [
        ("claude/err_400.json", ErrorClass::BadRequest),
        ("claude/err_401.json", ErrorClass::Auth),
        ("claude/err_529.json", ErrorClass::Overloaded),
    ] {
        let response = claude_ok(path);
        assert!(
            response.is_error,
            "{path}: subtype is success but is_error true"
        );
        assert_eq!(response.error_class, Some(class), "{path}");
        assert!(response
            .error_message
            .as_deref()
            .is_some_and(|m| m.contains("API Error")));
    }
}

#[test]
fn claude_max_turns_has_errors_and_no_result_text() {
    let response = claude_ok("claude/maxturns.json");
    assert!(response.is_error);
    assert_eq!(response.error_class, Some(ErrorClass::MaxTurns));
    assert_eq!(
        response.error_message.as_deref(),
        Some("Reached maximum number of turns (2)")
    );
    assert_eq!(response.text, "");
    assert_eq!(response.turns, Some(3));
}

#[test]
fn claude_bypass_root_refusal_is_not_a_result_but_the_sandbox_run_is() {
    // Captured stderr of a refused run: plain text, never a result.
    assert_eq!(
        claude::parse_output(&fixture("claude/bypass_root.jsonl")),
        Err(ParseError::NoResult { lines: 1 })
    );
    let response = claude_ok("claude/bypass_root2.json");
    assert!(!response.is_error);
    assert_eq!(response.usage.input, 24);
}

#[test]
fn claude_truncated_or_doubled_streams_are_rejected() {
    let full = fixture("claude/stream_text.jsonl");
    let cut = &full[..full.len() - 200];
    assert!(matches!(
        claude::parse_output(cut),
        Err(ParseError::NoResult { lines: 3 })
    ));
    let result_line = String::from_utf8_lossy(&full)
        .lines()
        .last()
        .expect("result line")
        .to_owned();
    let doubled = format!(
        "{}\n{result_line}\n",
        String::from_utf8_lossy(&full).trim_end()
    );
    assert_eq!(
        claude::parse_output(doubled.as_bytes()),
        Err(ParseError::ManyResults { count: 2 })
    );
}

#[test]
fn claude_help_documents_every_flag_we_pass() {
    let help = String::from_utf8(fixture("claude/help.txt")).expect("utf8");
    let mut req = AgentRequest::new("/tmp", "p");
    req.system_prompt = "sys".into();
    req.schema = Some(serde_json::json!({"type": "object"}));
    req.model = Some("opus".into());
    req.max_turns = Some(3);
    req.tools = ToolPolicy::FullEdit;
    req.resume_session = Some("abc".into());
    for arg in claude::host_args(&req) {
        let Some(flag) = arg.strip_prefix("--").or_else(|| arg.strip_prefix('-')) else {
            continue;
        };
        let flag = flag.split('=').next().expect("split has a first part");
        if flag == "max-turns" {
            continue; // hidden flag: accepted but not in --help (INTERFACES A.1)
        }
        let short = format!("-{flag},");
        let long = format!("--{flag}");
        assert!(
            help.contains(&long) || help.contains(&short),
            "{arg} not in claude --help"
        );
    }
}

#[test]
fn host_calls_offer_no_tool_and_load_no_project_settings() {
    let mut req = AgentRequest::new("/tmp", "p");
    req.system_prompt = "You are rover's planner.".into();
    req.tools = ToolPolicy::None;
    let args = claude::host_args(&req);
    for wanted in [
        "--tools=",
        "--setting-sources=user",
        "--strict-mcp-config",
        "--system-prompt=You are rover's planner.",
    ] {
        assert!(
            args.contains(&wanted.to_owned()),
            "{wanted} missing: {args:?}"
        );
    }
    assert!(!args.iter().any(|a| a.starts_with("--allowedTools")
        || a.starts_with("--append-system-prompt")
        || a == "--dangerously-skip-permissions"));
    // In the sandbox the coding agent keeps Claude Code's prompt and its edit tools.
    req.tools = ToolPolicy::FullEdit;
    let inside = claude::sandbox_args(&req, "p".into());
    assert!(inside.contains(&"--append-system-prompt=You are rover's planner.".to_owned()));
    assert!(!inside.iter().any(|a| a.starts_with("--setting-sources")));
    // codex: read-only, and no tool that runs or reads anything on the host.
    req.tools = ToolPolicy::None;
    let codex = codex::host_args(&req, None, false);
    assert_eq!(&codex[..4], ["exec", "--json", "-s", "read-only"]);
    for feature in ["shell_tool", "unified_exec", "view_image"] {
        assert!(
            codex.contains(&format!("features.{feature}=false")),
            "{codex:?}"
        );
    }
}

#[test]
fn the_sandboxed_reviewer_is_offered_its_read_only_list_alone_whatever_the_repository_says() {
    let mut req = AgentRequest::new("/workspace", "p");
    req.system_prompt = "Role: rover reviewer".into();
    req.tools = AgentStep::Review.tools();
    assert_eq!(req.tools, ToolPolicy::ReadOnly);
    let inside = claude::sandbox_args(&req, "p".into());
    for wanted in [
        "--tools=Read,Glob,Grep",
        "--allowedTools=Read,Glob,Grep",
        "--setting-sources=user",
        "--strict-mcp-config",
        "--system-prompt=Role: rover reviewer",
    ] {
        assert!(
            inside.contains(&wanted.to_owned()),
            "{wanted} missing: {inside:?}"
        );
    }
    assert!(!inside
        .iter()
        .any(|a| a.starts_with("--append-system-prompt")
            || a == "--permission-mode"
            || a.contains("Edit")
            || a.contains("Write")
            || a.contains("Bash")));
    let codex = codex::sandbox_args(&req, "p".into());
    assert_eq!(&codex[..4], ["exec", "--json", "-s", "read-only"]);
    assert!(
        !codex.iter().any(|a| a.contains("dangerously")),
        "{codex:?}"
    );
}

#[test]
fn codex_text_stream_takes_the_last_agent_message_and_usage() {
    let response = codex::parse_output(&fixture("codex/text.jsonl"), false).expect("parses");
    assert!(!response.is_error);
    assert_eq!(response.text, "Hello from fake codex model.");
    assert_eq!(
        response.session_id.as_deref(),
        Some("01a20355-19e6-7640-ae58-74610d216277")
    );
    assert_eq!(response.usage.input, 60);
    assert_eq!(response.usage.cached, 40);
    assert_eq!(response.usage.output, 20);
    assert_eq!(
        response.warnings.len(),
        1,
        "the error item is a warning, not fatal"
    );
    assert_eq!(response.cost_usd, None);
}

#[test]
fn codex_turn_failed_is_fatal_and_classified() {
    let response = codex::parse_output(&fixture("codex/turn_failed.jsonl"), false).expect("parses");
    assert!(response.is_error);
    assert_eq!(response.error_class, Some(ErrorClass::Auth));
    assert!(response
        .error_message
        .as_deref()
        .is_some_and(|m| m.contains("401")));
}

/// Real codex 0.169 against a loopback model API answering each status (the 401: no
/// `Authorization` header because only `OPENAI_API_KEY` was set).
#[test]
fn codex_api_failures_are_classified_like_the_real_cli_prints_them() {
    for (path, class, needle) in [
        (
            "codex/err_400_schema.jsonl",
            ErrorClass::BadRequest,
            "invalid_request_error",
        ),
        (
            "codex/err_401_no_key.jsonl",
            ErrorClass::Auth,
            "Missing bearer",
        ),
        ("codex/err_404.jsonl", ErrorClass::BadRequest, "404"),
        ("codex/err_422.jsonl", ErrorClass::BadRequest, "422"),
        ("codex/err_429.jsonl", ErrorClass::RateLimited, "429"),
        ("codex/err_500.jsonl", ErrorClass::Overloaded, "high demand"),
        ("codex/err_503.jsonl", ErrorClass::Overloaded, "503"),
    ] {
        let response = codex::parse_output(&fixture(path), false).expect(path);
        assert!(response.is_error, "{path}");
        assert_eq!(response.error_class, Some(class), "{path}");
        let message = response.error_message.expect("message");
        assert!(message.contains(needle), "{path}: {message}");
        // The reconnect notices before the failure stay warnings.
        assert!(
            response
                .warnings
                .iter()
                .all(|w| w.starts_with("Reconnecting") || *w == message),
            "{path}: {:?}",
            response.warnings
        );
    }
}

#[test]
fn codex_top_level_error_before_turn_completed_is_not_fatal() {
    let text = String::from_utf8(fixture("codex/text.jsonl")).expect("utf8");
    let with_reconnect = text.replacen(
        "{\"type\":\"turn.started\"}",
        "{\"type\":\"error\",\"message\":\"Reconnecting... 2/5\"}\n{\"type\":\"turn.started\"}",
        1,
    );
    let response = codex::parse_output(with_reconnect.as_bytes(), false).expect("parses");
    assert!(!response.is_error);
    assert_eq!(response.warnings.len(), 2);
}

#[test]
fn codex_partial_streams_have_no_result() {
    for path in [
        "codex/command.jsonl",
        "codex/patch.jsonl",
        "codex/schema_message.jsonl",
    ] {
        let err = codex::parse_output(&fixture(path), true).expect_err(path);
        assert!(matches!(err, ParseError::NoResult { .. }), "{path}");
    }
    let mut stream = codex::CodexStream::new(false);
    for line in String::from_utf8(fixture("codex/command.jsonl"))
        .expect("utf8")
        .lines()
    {
        assert!(!stream.push_line(line));
    }
    assert!(!stream.push_line("{\"type\":\"turn.completed\",\"usage\":{}}") || stream.has_result());
    let response = stream.finish().expect("completed");
    assert_eq!(response.tool_calls, 2);
}

#[test]
fn codex_schema_message_is_read_as_json_when_asked() {
    let mut text = String::from_utf8(fixture("codex/schema_message.jsonl")).expect("utf8");
    text.push_str(
        "{\"type\":\"turn.completed\",\"usage\":{\"input_tokens\":1,\"output_tokens\":1}}\n",
    );
    let response = codex::parse_output(text.as_bytes(), true).expect("parses");
    assert_eq!(
        response.structured,
        Some(serde_json::json!({"decision": "approve", "reason": "ok"}))
    );
    let plain = codex::parse_output(text.as_bytes(), false).expect("parses");
    assert!(plain.structured.is_none());
}

#[test]
fn codex_stderr_and_human_output_are_never_results() {
    for path in [
        "codex/human.err",
        "codex/misc.err",
        "codex/text.err",
        "codex/tool.err",
        "codex/human.out",
    ] {
        assert!(
            matches!(
                codex::parse_output(&fixture(path), true),
                Err(ParseError::NoResult { .. })
            ),
            "{path}"
        );
        assert!(claude::parse_output(&fixture(path)).is_err(), "{path}");
    }
}

#[test]
fn codex_argv_matches_exec_help_and_avoids_removed_flags() {
    let help = String::from_utf8(fixture("codex/exec-help.txt")).expect("utf8");
    let resume_help = String::from_utf8(fixture("codex/exec-resume-help.txt")).expect("utf8");
    assert!(!help.contains("--full-auto"));
    let mut req = AgentRequest::new("/tmp", "do it");
    req.model = Some("gpt-5".into());
    req.tools = ToolPolicy::ReadBash;
    let args = codex::host_args(&req, Some(std::path::Path::new("/tmp/s.json")), false);
    assert_eq!(&args[..4], ["exec", "--json", "-s", "workspace-write"]);
    assert!(args.contains(&"--skip-git-repo-check".to_owned()));
    for arg in &args {
        if arg.starts_with('-') && arg != "--" {
            assert!(
                help.contains(arg.as_str()),
                "{arg} not in codex exec --help"
            );
        }
    }
    assert!(!codex::host_args(&req, None, true).contains(&"--skip-git-repo-check".to_owned()));
    assert!(resume_help.contains("[SESSION_ID] [PROMPT]"));
    req.resume_session = Some("thread-1".into());
    let args = codex::host_args(&req, None, true);
    let at = args.iter().position(|a| a == "resume").expect("resume");
    assert_eq!(&args[at..], ["resume", "--", "thread-1", "do it"]);
}

#[test]
fn sandbox_argv_puts_the_prompt_last_and_bounds_it() {
    let mut req = AgentRequest::new("/workspace", "x".repeat(300 * 1024));
    req.tools = ToolPolicy::FullEdit;
    req.schema = Some(serde_json::json!({"type": "object"}));
    let argv = super::sandbox_argv(super::AgentKind::Claude, &req, None);
    assert_eq!(argv[0], "claude");
    assert_eq!(argv[argv.len() - 2], "--");
    let prompt = argv.last().expect("prompt");
    assert!(prompt.len() <= super::MAX_SANDBOX_PROMPT_BYTES);
    assert!(prompt.contains("truncated by rover"));
    let argv = super::sandbox_argv(super::AgentKind::Codex, &req, None);
    assert_eq!(argv[0], "codex");
    assert!(argv.contains(&"--skip-git-repo-check".to_owned()));
    assert!(!argv.iter().any(|a| a == "--output-schema"));
    assert!(argv.last().expect("prompt").len() <= super::MAX_SANDBOX_PROMPT_BYTES);
    req.prompt = "short".into();
    let argv = super::sandbox_argv(super::AgentKind::Codex, &req, None);
    assert!(argv.last().expect("prompt").contains("JSON schema"));
}

#[test]
fn every_fixture_file_is_used_by_these_tests() {
    let source = include_str!("parse_tests.rs");
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures");
    for dir in ["claude", "codex"] {
        for entry in std::fs::read_dir(root.join(dir)).expect("fixture dir") {
            let name = entry
                .expect("entry")
                .file_name()
                .to_string_lossy()
                .into_owned();
            let reference = format!("{dir}/{name}");
            assert!(
                source.contains(&reference),
                "fixture {reference} is not tested"
            );
        }
    }
}

/// Parsing a line at a time from a reader gives what parsing the whole output gives, for every
/// fixture; a cut note and a truncated line in the middle change nothing.
#[test]
fn reading_a_line_at_a_time_gives_the_same_answers() {
    use super::{parse_output, parse_output_reader, AgentKind};
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures");
    for (kind, sub) in [(AgentKind::Claude, "claude"), (AgentKind::Codex, "codex")] {
        for entry in std::fs::read_dir(dir.join(sub)).expect("fixtures") {
            let path = entry.expect("entry").path();
            let bytes = std::fs::read(&path).expect("read");
            for expect_json in [true, false] {
                let whole = parse_output(kind, &bytes, expect_json).map_err(|e| e.to_string());
                let lines = parse_output_reader(kind, bytes.as_slice(), expect_json)
                    .map_err(|e| e.to_string());
                assert_eq!(lines, whole, "{}", path.display());
            }
        }
    }
    let stream = fixture("claude/schema.jsonl");
    let mut cut = b"{\"type\":\"assistant\",\"mess".to_vec();
    // The line a capped container log has where bytes were cut (`sandbox::logcap::cut_note`).
    cut.extend(b"\n[rover: 10 bytes cut here; this stream passed its limit of 20 bytes (autopilot.sandbox.logLimitMb); rover kept the first 5 and the last 5 bytes]\n");
    cut.extend(b"xxxx\n");
    cut.extend(&stream);
    assert_eq!(
        parse_output_reader(AgentKind::Claude, cut.as_slice(), true).map(|r| r.structured),
        claude::parse_output(&stream).map(|r| r.structured)
    );
}

#[test]
fn the_last_activity_is_the_last_text_or_tool_call_of_either_cli() {
    let text = |path: &str| String::from_utf8(fixture(path)).unwrap();
    let claude = text("claude/tool_ok.jsonl");
    assert_eq!(
        super::last_activity(&claude).as_deref(),
        Some("Hello from fake model.")
    );
    // Cut after the tool call: the tool and its command.
    let upto_tool = claude.lines().take(2).collect::<Vec<_>>().join("\n");
    assert_eq!(
        super::last_activity(&upto_tool).as_deref(),
        Some("Bash: echo hello-from-tool")
    );
    assert_eq!(
        super::last_activity(&text("codex/text.jsonl")).as_deref(),
        Some("Hello from fake codex model.")
    );
    assert_eq!(
        super::last_activity(&text("codex/command.jsonl")).as_deref(),
        Some("/bin/bash -lc 'echo oops >&2; exit 3'")
    );
    assert_eq!(
        super::last_activity("not json\n{\"type\":\"system\"}"),
        None
    );
}
