#!/usr/bin/env bash
# The whole test suite, on a fresh Debian machine as on a developer's: installs and starts what the
# tests need (a Docker engine, the pinned real claude CLI from npm, the real sandbox image), then
# runs every test.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -f tests/setup-docker.sh ]; then
  bash tests/setup-docker.sh
fi
# The real claude and codex CLIs (pinned, from npm, cached) for the tests that drive them, and the real
# sandbox image (docs/sandbox/Dockerfile on a debootstrapped Debian, cached by content hash).
ROVER_TEST_CLAUDE_BIN="$(bash tests/setup-clis.sh)"
ROVER_TEST_CODEX_BIN="$(bash tests/setup-clis.sh codex)"
ROVER_TEST_DEVCONTAINER_BIN="$(bash tests/setup-clis.sh devcontainer)"
export ROVER_TEST_CLAUDE_BIN ROVER_TEST_CODEX_BIN ROVER_TEST_DEVCONTAINER_BIN
ROVER_TEST_SANDBOX_IMAGE="$(bash tests/setup-sandbox-image.sh)"
export ROVER_TEST_SANDBOX_IMAGE
cargo test --locked
