#!/usr/bin/env bash
# A private image registry for the test swarm of tests/setup-swarm.sh, reachable by the suite's
# main engine (where rover builds and pushes) and by both swarm nodes (which pull), at the same
# name everywhere: 127.0.0.1:5415, with a user and password (basic auth: user `rover`, password
# `rover-test-registry`).
#
# The nodes live in network namespaces with no route to the host's, on purpose (setup-swarm.sh).
# Rather than link them, each of the three namespaces (the host's, rover-swarm-mgr,
# rover-swarm-wkr) gets an instance of the registry on its own loopback, all three serving one
# storage directory: one registry's content at one name. A loopback registry is the one kind
# every Docker engine talks to over plain HTTP without `--insecure-registries` (127.0.0.0/8 is
# trusted by default), so no engine's flags change. A real swarm has one registry with TLS at a
# name every node resolves; what rover does with it is the same.
#
# The registry is Debian's `docker-registry` (the CNCF distribution registry), installed when
# missing. Idempotent; prints nothing on success (`ROVER_SWARM_VERBOSE=1` says what it does).
# Needs root; run after tests/setup-swarm.sh.
#
# `ROVER_REGISTRY_PORT` and `ROVER_REGISTRY_STORAGE` make another one (the bench's, empty, on a
# port of its own); `bash tests/setup-registry.sh stop` stops the instances of that port.
set -euo pipefail

base_run="${ROVER_SWARM_RUN_DIR:-/run/rover-swarm}"
base_lib="${ROVER_SWARM_LIB_DIR:-/var/lib/rover-swarm}"
port="${ROVER_REGISTRY_PORT:-5415}"
dir="$base_run/registry-$port"
storage="${ROVER_REGISTRY_STORAGE:-$base_lib/registry}"

say() {
    if [ "${ROVER_SWARM_VERBOSE:-}" = "1" ]; then echo "setup-registry: $*" >&2; fi
}

if [ "${1:-}" = stop ]; then
    for where in host mgr wkr; do
        if [ -f "$dir/$where.pid" ]; then
            kill "$(cat "$dir/$where.pid")" 2>/dev/null || true
            rm -f "$dir/$where.pid"
        fi
    done
    # Instances whose pid file is gone serve the same config file.
    pkill -f "docker-registry serve $dir/config.yml" 2>/dev/null || true
    exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
    echo "setup-registry: needs root (network namespaces)" >&2
    exit 1
fi
for ns in rover-swarm-mgr rover-swarm-wkr; do
    if [ ! -e "/var/run/netns/$ns" ]; then
        echo "setup-registry: no network namespace $ns; run tests/setup-swarm.sh first" >&2
        exit 1
    fi
done
if ! command -v docker-registry >/dev/null 2>&1; then
    say "installing Debian's docker-registry"
    export DEBIAN_FRONTEND=noninteractive
    # The package's own service (on :5000) is not started: policy-rc.d or no init in a container;
    # when it is, it does not matter (another port).
    apt-get install -y -qq --no-install-recommends docker-registry >/dev/null 2>&1 || {
        apt-get update -qq >/dev/null
        apt-get install -y -qq --no-install-recommends docker-registry >/dev/null
    }
fi
if ! command -v curl >/dev/null 2>&1; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y -qq --no-install-recommends curl >/dev/null
fi

mkdir -p "$dir" "$storage"
# bcrypt of `rover-test-registry` (python3's crypt.crypt with METHOD_BLOWFISH).
printf '%s\n' 'rover:$2b$12$Z0o0mkQIU/HMkqdl7ExpDuRNtsMUpihs5PV2EEhCEJRLjwHH0fMqq' >"$dir/htpasswd"
cat >"$dir/config.yml" <<EOF
version: 0.1
log:
  level: warn
storage:
  filesystem:
    rootdirectory: $storage
  delete:
    enabled: true
http:
  addr: 127.0.0.1:$port
auth:
  htpasswd:
    realm: rover-test
    path: $dir/htpasswd
EOF

# `in_ns <where> <command…>`: the command in the host's namespace (`host`) or a node's, in place
# of the calling (sub)shell, so that a background call's `$!` is the command's pid.
in_ns() {
    local where="$1"
    shift
    if [ "$where" = host ]; then
        exec "$@"
    else
        exec nsenter --net="/var/run/netns/rover-swarm-$where" "$@"
    fi
}

# The registry answers /v2/ with 401 (it wants the user and password) once it is up.
answers() {
    [ "$( (in_ns "$1" curl -s -o /dev/null -w '%{http_code}' --max-time 2 "http://127.0.0.1:$port/v2/"))" = 401 ]
}

ensure_instance() {
    local where="$1" pid
    local pidfile="$dir/$where.pid" log="/tmp/rover-registry-$port-$where.log"
    if answers "$where"; then
        return 0
    fi
    if [ -f "$pidfile" ] && kill -0 "$(cat "$pidfile")" 2>/dev/null; then
        kill "$(cat "$pidfile")" 2>/dev/null || true
        sleep 0.2
    fi
    say "starting the registry in $where's namespace (log $log)"
    (in_ns "$where" nohup docker-registry serve "$dir/config.yml") >>"$log" 2>&1 </dev/null &
    pid=$!
    echo "$pid" >"$pidfile"
    for _ in $(seq 1 50); do
        answers "$where" && return 0
        if ! kill -0 "$pid" 2>/dev/null; then
            break
        fi
        sleep 0.2
    done
    echo "setup-registry: the registry in $where's namespace did not answer on 127.0.0.1:$port; see $log (last lines below)" >&2
    tail -n 20 "$log" >&2 || true
    return 1
}

for where in host mgr wkr; do
    ensure_instance "$where"
done
say "registry ready at 127.0.0.1:$port in the host's, rover-swarm-mgr's and rover-swarm-wkr's namespaces"
