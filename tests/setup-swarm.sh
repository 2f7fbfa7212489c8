#!/usr/bin/env bash
# A real two-node Docker Swarm on this one machine, for the tests of rover's swarm sandbox backend.
#
# Two extra Docker engines, each in its own network namespace with its own data root, exec root,
# pid file and unix socket, joined by a veth pair:
#
#   rover-swarm-mgr  10.215.0.1  the swarm's manager (it also runs tasks)  /run/rover-swarm/mgr/docker.sock
#   rover-swarm-wkr  10.215.0.2  a worker                                  /run/rover-swarm/wkr/docker.sock
#
# Why the manager is a third engine and not the suite's main engine (/var/run/docker.sock):
# - The main engine is shared by every other test (and, on a developer's machine, by the other
#   work running there). `docker swarm init` changes it for all of them: it creates the `ingress`
#   overlay and a `docker_gwbridge` bridge (which takes a /16 from the engine's local pools, the
#   same pools `docker network create` draws from), starts the raft store and the dispatcher,
#   and `swarm leave --force` on a shared engine would end any service another test runs.
# - Swarm allocates overlay subnets from its own pool (10.0.0.0/8 by default) without asking the
#   engines' local IPAM, so an overlay could be given a slice of 10.213.0.0/16, the range rover
#   cuts its per-run internal bridges from (src/sandbox/runnet.rs): the same addresses twice on
#   one host. This swarm's pool is 10.214.0.0/16 (`--default-addr-pool`), and since neither of
#   its engines shares a network namespace with the main engine, their bridges, the ingress
#   network and the gateway bridge cannot clash with the main engine's networks at all.
# - A node lost mid-task is tested by stopping the worker's engine; a separate manager keeps the
#   swarm (and its raft quorum of one) while the main engine is never touched.
# The cost is one more dockerd (about 60 MB of memory). The nodes reach nothing but each other:
# no default route, no link to the host's network namespace. Everything rover does with them goes
# through their unix sockets (the engine API), and the agent's only way out is rover's relay, a
# container on the manager that hands connections to the proxy's unix socket on the shared file
# system (see docs/scale.md).
#
# Idempotent: a node whose engine answers is kept; a stopped one (its engine killed by a test)
# is restarted. Needs root, iproute2 and the Docker engine tests/setup-docker.sh installs.
# Prints nothing on success; `ROVER_SWARM_VERBOSE=1` prints what it does.
set -euo pipefail

base_run="${ROVER_SWARM_RUN_DIR:-/run/rover-swarm}"
base_lib="${ROVER_SWARM_LIB_DIR:-/var/lib/rover-swarm}"
pool="10.214.0.0/16"

say() {
    if [ "${ROVER_SWARM_VERBOSE:-}" = "1" ]; then echo "setup-swarm: $*" >&2; fi
}

if [ "$(id -u)" -ne 0 ]; then
    echo "setup-swarm: needs root (network namespaces and extra Docker engines)" >&2
    exit 1
fi
if ! command -v dockerd >/dev/null 2>&1 || ! command -v docker >/dev/null 2>&1; then
    echo "setup-swarm: no dockerd or docker; run tests/setup-docker.sh first" >&2
    exit 1
fi
if ! command -v ip >/dev/null 2>&1; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >/dev/null
    apt-get install -y -qq --no-install-recommends iproute2 >/dev/null
fi

# node name → netns, address
netns_of() { echo "rover-swarm-$1"; }
addr_of() { case "$1" in mgr) echo 10.215.0.1 ;; wkr) echo 10.215.0.2 ;; esac; }
sock_of() { echo "$base_run/$1/docker.sock"; }
dk() {
    local node="$1"
    shift
    docker -H "unix://$(sock_of "$node")" "$@"
}

ensure_netns() {
    local mgr wkr
    mgr="$(netns_of mgr)"
    wkr="$(netns_of wkr)"
    for ns in "$mgr" "$wkr"; do
        if ! ip netns list | grep -qw "$ns"; then
            say "making network namespace $ns"
            ip netns add "$ns"
        fi
        ip -n "$ns" link set lo up
    done
    if ! ip -n "$mgr" link show rsw0 >/dev/null 2>&1; then
        # A half-made pair (one end left in the host) is removed first.
        ip link del rsw0 >/dev/null 2>&1 || true
        ip link del rsw1 >/dev/null 2>&1 || true
        ip -n "$wkr" link del rsw1 >/dev/null 2>&1 || true
        say "linking $mgr and $wkr"
        ip link add rsw0 type veth peer name rsw1
        ip link set rsw0 netns "$mgr"
        ip link set rsw1 netns "$wkr"
    fi
    ip -n "$mgr" addr replace "$(addr_of mgr)/30" dev rsw0
    ip -n "$wkr" addr replace "$(addr_of wkr)/30" dev rsw1
    ip -n "$mgr" link set rsw0 up
    ip -n "$wkr" link set rsw1 up
}

engine_answers() {
    dk "$1" info >/dev/null 2>&1
}

# Starts node $1's engine in its namespace unless it answers; waits up to 60 s.
ensure_engine() {
    local node="$1"
    local ns run lib log pid=""
    ns="$(netns_of "$node")"
    run="$base_run/$node"
    lib="$base_lib/$node"
    log="/tmp/rover-swarm-$node.log"
    if engine_answers "$node"; then
        return 0
    fi
    mkdir -p "$run" "$lib"
    if [ -f "$run/dockerd.pid" ] && kill -0 "$(cat "$run/dockerd.pid")" 2>/dev/null; then
        say "engine $node is starting; waiting"
    else
        rm -f "$run/dockerd.pid" "$(sock_of "$node")"
        say "starting engine $node in $ns (log $log)"
        # The engine gets the node's network namespace and mount and UTS namespaces of its own
        # (slave to the host's mounts: it sees the host's files, the host does not see its
        # mounts). Not `ip netns exec`: its fresh /sys hides the cgroup hierarchies dockerd
        # needs, so /sys is remounted here (for the namespace's own /sys/class/net) with the
        # host's cgroup mounts moved back under it. The hostname is the namespace's name, which
        # `docker node ls` and rover's `status` show. Its containerd is its own (under its exec
        # root): there is no system containerd socket to share.
        # DOCKER_SERVICE_PREFER_OFFLINE_IMAGE is not set: rover names images by id where no
        # registry is configured, which the engine never tries to pull.
        nohup nsenter --net="/var/run/netns/$ns" \
            unshare --mount --uts --propagation slave \
            sh -c 'set -e
                mkdir -p "$1/cgroup"
                mount --rbind /sys/fs/cgroup "$1/cgroup"
                mount -t sysfs sysfs /sys
                mount --move "$1/cgroup" /sys/fs/cgroup
                hostname "$0"
                shift
                exec dockerd "$@"' "$ns" "$run" \
            --data-root "$lib" \
            --exec-root "$run/exec" \
            --pidfile "$run/dockerd.pid" \
            --host "unix://$(sock_of "$node")" \
            --cgroup-parent "/rover-swarm-$node" \
            ${ROVER_DOCKERD_STORAGE_DRIVER:+--storage-driver "$ROVER_DOCKERD_STORAGE_DRIVER"} \
            >>"$log" 2>&1 </dev/null &
        pid=$!
    fi
    for _ in $(seq 1 60); do
        engine_answers "$node" && return 0
        if [ -n "$pid" ] && ! kill -0 "$pid" 2>/dev/null; then
            break
        fi
        sleep 1
    done
    echo "setup-swarm: engine $node did not answer on $(sock_of "$node") within 60 s; see $log (last lines below)" >&2
    tail -n 20 "$log" >&2 || true
    return 1
}

swarm_state() {
    dk "$1" info --format '{{.Swarm.LocalNodeState}}' 2>/dev/null || echo unknown
}

ensure_swarm() {
    if [ "$(swarm_state mgr)" != "active" ]; then
        say "initialising the swarm on mgr (pool $pool)"
        dk mgr swarm init \
            --advertise-addr "$(addr_of mgr)" \
            --listen-addr "$(addr_of mgr):2377" \
            --default-addr-pool "$pool" \
            --default-addr-pool-mask-length 24 >/dev/null
    fi
    local state
    state="$(swarm_state wkr)"
    if [ "$state" = "active" ]; then
        return 0
    fi
    if [ "$state" != "inactive" ]; then
        # A worker the manager no longer knows (a new swarm), or one stuck pending.
        dk wkr swarm leave --force >/dev/null 2>&1 || true
    fi
    local token
    token="$(dk mgr swarm join-token -q worker)"
    say "joining wkr to the swarm"
    dk wkr swarm join --token "$token" --advertise-addr "$(addr_of wkr)" \
        --listen-addr "$(addr_of wkr):2377" "$(addr_of mgr):2377" >/dev/null
}

# A node label per engine (`rover.node=mgr|wkr`), for placement constraints in tests.
label_nodes() {
    local id
    for node in mgr wkr; do
        id="$(dk "$node" info --format '{{.Swarm.NodeID}}')"
        dk mgr node update --label-add "rover.node=$node" "$id" >/dev/null
    done
}

wait_ready() {
    local wid
    wid="$(dk wkr info --format '{{.Swarm.NodeID}}')"
    for _ in $(seq 1 60); do
        if [ "$(dk mgr node inspect "$wid" --format '{{.Status.State}}' 2>/dev/null)" = "ready" ]; then
            return 0
        fi
        sleep 1
    done
    echo "setup-swarm: the worker did not become ready within 60 s" >&2
    dk mgr node ls >&2 || true
    return 1
}

ensure_netns
ensure_engine mgr
ensure_engine wkr
ensure_swarm
label_nodes
wait_ready
say "swarm ready: manager $(sock_of mgr), worker $(sock_of wkr)"
