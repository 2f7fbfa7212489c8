#!/usr/bin/env bash
# Make sure a Docker engine answers on this machine (fresh Debian, run as root).
# Idempotent and quiet: does nothing when `docker info` already answers.
set -euo pipefail

log_file="${ROVER_DOCKERD_LOG:-/tmp/rover-dockerd.log}"

engine_answers() {
    docker info >/dev/null 2>&1
}

if command -v docker >/dev/null 2>&1 && engine_answers; then
    exit 0
fi

if [ "$(id -u)" -ne 0 ]; then
    echo "setup-docker: no Docker engine answers and this script is not root; start dockerd yourself or rerun as root" >&2
    exit 1
fi

missing=()
command -v dockerd >/dev/null 2>&1 || missing+=(docker.io)
[ -x /bin/busybox ] || missing+=(busybox-static)
if [ "${#missing[@]}" -gt 0 ]; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >/dev/null
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

if ! pgrep -x dockerd >/dev/null 2>&1; then
    args=()
    # overlay2 needs a filesystem that supports it; fall back to vfs otherwise (e.g. overlay-on-overlay).
    if [ -n "${ROVER_DOCKERD_STORAGE_DRIVER:-}" ]; then
        args+=(--storage-driver "$ROVER_DOCKERD_STORAGE_DRIVER")
    elif grep -q ' / overlay ' /proc/mounts 2>/dev/null && ! grep -qw overlay /proc/filesystems 2>/dev/null; then
        args+=(--storage-driver vfs)
    fi
    nohup dockerd "${args[@]}" >"$log_file" 2>&1 </dev/null &
fi

for _ in $(seq 1 60); do
    if engine_answers; then
        exit 0
    fi
    sleep 1
done

echo "setup-docker: dockerd did not answer within 60 s; see $log_file (last lines below)" >&2
tail -n 20 "$log_file" >&2 2>/dev/null || true
exit 1
