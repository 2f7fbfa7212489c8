#!/usr/bin/env bash
# Make sure a headless browser and its WebDriver are on this machine (fresh Debian, run as root):
# Debian's chromium and chromium-driver, for the dashboard's browser test (tests/it/dashboard_browser.rs).
# Idempotent and quiet: does nothing when both are installed. Prints nothing on success; exits
# non-zero with the reason when they cannot be installed.
set -euo pipefail

if command -v chromium >/dev/null 2>&1 && command -v chromedriver >/dev/null 2>&1; then
    exit 0
fi

if [ "$(id -u)" -ne 0 ]; then
    echo "setup-browser: chromium and chromium-driver are missing and this script is not root; install them yourself (apt-get install chromium chromium-driver) or rerun as root" >&2
    exit 1
fi

export DEBIAN_FRONTEND=noninteractive
apt-get update -qq >/dev/null
apt-get install -y -qq --no-install-recommends chromium chromium-driver >/dev/null
command -v chromedriver >/dev/null 2>&1 || {
    echo "setup-browser: chromium-driver installed but chromedriver is not on PATH" >&2
    exit 1
}
