#!/usr/bin/env bash
# Make sure a Docker engine answers on this machine (fresh Debian, run as root).
# Idempotent and quiet: does nothing when `docker info` already answers. Otherwise installs
# docker.io and busybox-static when missing, starts dockerd in the background (log under /tmp),
# and waits up to 60 s for it; exits non-zero with the reason when it does not come up.
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
command -v docker >/dev/null 2>&1 || missing+=(docker.io)
[ -x /bin/busybox ] || missing+=(busybox-static)
if [ "${#missing[@]}" -gt 0 ]; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >/dev/null
    # shellcheck disable=SC2046
    apt-get install -y -qq --no-install-recommends $(printf '%s\n' "${missing[@]}" | sort -u) >/dev/null
fi

# Starts dockerd with the given extra arguments and waits up to $1 seconds for it to answer.
# Returns 0 when it answers, 1 when it died, 2 when it is still silent.
start_and_wait() {
    local seconds="$1"
    shift
    nohup dockerd "$@" >>"$log_file" 2>&1 </dev/null &
    local pid=$!
    for _ in $(seq 1 "$seconds"); do
        engine_answers && return 0
        kill -0 "$pid" 2>/dev/null || return 1
        sleep 1
    done
    return 2
}

# The main engine's own pid file, not `pgrep dockerd`: the engines of tests/setup-swarm.sh are
# dockerd processes too, and must not be taken for this one starting.
if [ -f /var/run/docker.pid ] && kill -0 "$(cat /var/run/docker.pid)" 2>/dev/null; then
    # A dockerd is starting (another caller, or a service): just wait for it.
    for _ in $(seq 1 60); do
        engine_answers && exit 0
        sleep 1
    done
else
    args=()
    if [ -n "${ROVER_DOCKERD_STORAGE_DRIVER:-}" ]; then
        args+=(--storage-driver "$ROVER_DOCKERD_STORAGE_DRIVER")
    fi
    status=0
    start_and_wait 40 "${args[@]}" || status=$?
    [ "$status" -eq 0 ] && exit 0
    if [ "$status" -eq 1 ] && [ "${#args[@]}" -eq 0 ]; then
        # The default storage driver (overlay2) is not usable everywhere (e.g. overlay on overlay).
        echo "setup-docker: dockerd exited with the default storage driver; retrying with vfs" >>"$log_file"
        status=0
        start_and_wait 20 --storage-driver vfs || status=$?
        [ "$status" -eq 0 ] && exit 0
    fi
fi

echo "setup-docker: no Docker engine answered within 60 s; see $log_file (last lines below)" >&2
tail -n 20 "$log_file" >&2 2>/dev/null || true
exit 1
