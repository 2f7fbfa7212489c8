//! AI coding agents: one `Agent` interface over the Claude Code and Codex CLIs.
