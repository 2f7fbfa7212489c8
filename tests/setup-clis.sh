#!/usr/bin/env bash
# Install the pinned real agent CLIs the suite drives (from the npm registry) into a cache dir,
# once; prints nothing when they are there already. The tests find them through
# ROVER_TEST_CLAUDE_BIN / ROVER_TEST_CODEX_BIN (exported by tests/run.sh) or in the default cache
# dir. `setup-clis.sh` prints the claude path; `setup-clis.sh codex` installs codex and prints its;
# `setup-clis.sh devcontainer` the dev container CLI (ROVER_TEST_DEVCONTAINER_BIN).
set -euo pipefail

CLAUDE_VERSION="${ROVER_TEST_CLAUDE_VERSION:-2.1.197}"
CODEX_VERSION="${ROVER_TEST_CODEX_VERSION:-0.169.0}"
cache="${ROVER_TEST_CLI_CACHE:-${HOME:-/root}/.cache/rover-test-clis}"
claude_dir="$cache/claude-$CLAUDE_VERSION"
claude_bin="$claude_dir/node_modules/.bin/claude"

if [ ! -x "$claude_bin" ]; then
    if ! command -v npm >/dev/null 2>&1; then
        if [ "$(id -u)" -ne 0 ]; then
            echo "setup-clis: npm is missing and this script is not root; install nodejs and npm" >&2
            exit 1
        fi
        export DEBIAN_FRONTEND=noninteractive
        apt-get update -qq >/dev/null
        apt-get install -y -qq --no-install-recommends nodejs npm >/dev/null
    fi
    mkdir -p "$claude_dir"
    npm install --silent --no-audit --no-fund --prefix "$claude_dir" \
        "@anthropic-ai/claude-code@$CLAUDE_VERSION" >/dev/null 2>&1 \
        || { echo "setup-clis: npm install @anthropic-ai/claude-code@$CLAUDE_VERSION failed" >&2; exit 1; }
fi
"$claude_bin" --version >/dev/null

# The dev container CLI (the spec's reference implementation) only when asked for
# (`devcontainer` as the first argument): rover builds repositories' environments with it.
if [ "${1:-}" = devcontainer ]; then
    DEVCONTAINER_VERSION="${ROVER_TEST_DEVCONTAINER_VERSION:-0.89.0}"
    dc_dir="$cache/devcontainer-$DEVCONTAINER_VERSION"
    dc_bin="$dc_dir/node_modules/.bin/devcontainer"
    if [ ! -x "$dc_bin" ]; then
        mkdir -p "$dc_dir"
        npm install --silent --no-audit --no-fund --prefix "$dc_dir" \
            "@devcontainers/cli@$DEVCONTAINER_VERSION" >/dev/null 2>&1 \
            || { echo "setup-clis: npm install @devcontainers/cli@$DEVCONTAINER_VERSION failed" >&2; exit 1; }
    fi
    "$dc_bin" --version >/dev/null
    echo "$dc_bin"
    exit 0
fi

# codex only when asked for (`codex` as the first argument): it is 400 MB.
if [ "${1:-}" = codex ]; then
    codex_dir="$cache/codex-$CODEX_VERSION"
    codex_bin="$codex_dir/node_modules/.bin/codex"
    if [ ! -x "$codex_bin" ]; then
        mkdir -p "$codex_dir"
        npm install --silent --no-audit --no-fund --prefix "$codex_dir" \
            "@openai/codex@$CODEX_VERSION" >/dev/null 2>&1 \
            || { echo "setup-clis: npm install @openai/codex@$CODEX_VERSION failed" >&2; exit 1; }
    fi
    "$codex_bin" --version >/dev/null
    echo "$codex_bin"
    exit 0
fi
echo "$claude_bin"
