#!/usr/bin/env bash
# Build the real sandbox image (docs/sandbox/Dockerfile) for the tests, without a registry:
# a Debian bookworm base made with debootstrap from Debian's archive and `docker import`, then
# the Dockerfile FROM it with the pinned claude and codex executables that tests/setup-clis.sh
# installed on the host from npm (CLAUDE_CODE_VERSION=vendor, CODEX_VERSION=vendor: a build
# container may not reach the npm registry through this machine's TLS proxy). Tagged by a hash of everything that goes into it, so a rerun with nothing
# changed costs one `docker image inspect`. Prints the image name; with `--base`, the Debian
# base's name instead (after making both), for a build of rover's own image over the same base.
set -euo pipefail
cd "$(dirname "$0")/.."

CLAUDE_VERSION="${ROVER_TEST_CLAUDE_VERSION:-2.1.197}"
CODEX_VERSION="${ROVER_TEST_CODEX_VERSION:-0.169.0}"
SUITE="bookworm"
MIRROR="${ROVER_DEBIAN_MIRROR:-http://deb.debian.org/debian}"
log="${ROVER_SANDBOX_BUILD_LOG:-/tmp/rover-sandbox-build.log}"

claude_bin="$(bash tests/setup-clis.sh)"
claude_exe="$(readlink -f "$claude_bin")"
codex_bin="$(bash tests/setup-clis.sh codex)"
codex_dir="$(dirname "$(readlink -f "$codex_bin")")/../../codex-linux-x64/vendor/x86_64-unknown-linux-musl"
hash="$( { cat docs/sandbox/Dockerfile; echo "$CLAUDE_VERSION $CODEX_VERSION $SUITE minbase git,ca-certificates"; } | sha256sum | cut -c1-12)"
image="rover-sandbox-real:$hash"
base="local/bookworm-minbase:$(echo "$SUITE minbase git,ca-certificates" | sha256sum | cut -c1-12)"

print_name() {
    if [ "${1:-}" = --base ]; then echo "$base"; else echo "$image"; fi
}

if docker image inspect "$image" >/dev/null 2>&1; then
    print_name "${1:-}"
    exit 0
fi

if ! docker image inspect "$base" >/dev/null 2>&1; then
    if ! command -v debootstrap >/dev/null 2>&1; then
        if [ "$(id -u)" -ne 0 ]; then
            echo "setup-sandbox-image: debootstrap is missing and this script is not root" >&2
            exit 1
        fi
        export DEBIAN_FRONTEND=noninteractive
        apt-get update -qq >/dev/null
        apt-get install -y -qq --no-install-recommends debootstrap >/dev/null
    fi
    rootfs="$(mktemp -d /tmp/rover-rootfs.XXXXXX)"
    trap 'rm -rf "$rootfs"' EXIT
    debootstrap --variant=minbase --include=git,ca-certificates "$SUITE" "$rootfs" "$MIRROR" >>"$log" 2>&1 \
        || { echo "setup-sandbox-image: debootstrap failed; see $log" >&2; exit 1; }
    tar -C "$rootfs" -c . | docker import - "$base" >>"$log"
fi

context="$(mktemp -d /tmp/rover-sandbox-context.XXXXXX)"
trap 'rm -rf "$context" ${rootfs:+"$rootfs"}' EXIT
cp docs/sandbox/Dockerfile "$context/"
mkdir -p "$context/vendor"
cp "$claude_exe" "$context/vendor/claude"
cp -r "$codex_dir" "$context/vendor/codex"
docker build -q --build-arg "BASE=$base" --build-arg CLAUDE_CODE_VERSION=vendor \
    --build-arg CODEX_VERSION=vendor -t "$image" "$context" >>"$log" 2>&1 \
    || { echo "setup-sandbox-image: docker build failed; see $log" >&2; tail -n 20 "$log" >&2; exit 1; }
print_name "${1:-}"
