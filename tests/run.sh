#!/usr/bin/env bash
# The whole test suite, on a fresh Debian machine as on a developer's: installs and starts what the
# tests need (a Docker engine, when a setup script for it exists), then runs every test.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -f tests/setup-docker.sh ]; then
  bash tests/setup-docker.sh
fi
cargo test --locked
