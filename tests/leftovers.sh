#!/usr/bin/env bash
# What of rover's is on the Docker engine (DOCKER_HOST, else the local socket): containers in
# every state, networks and volumes carrying a label of rover's (a key beginning with `rover.`:
# rover.project, rover.store, rover.proxy.*, rover.env.*, rover.swarm*, rover.test, and
# rover.image inherited from rover's images).
#
#   tests/leftovers.sh count          prints `containers=N networks=N volumes=N since=EPOCH`
#   tests/leftovers.sh check BEFORE   BEFORE: what `count` printed before the suite. Exits 1
#                                     naming each one of rover's made since then that is still
#                                     there (another rover on the engine meanwhile counts too).
set -euo pipefail

# Lines `kind<TAB>name<TAB>created<TAB>labels` for every resource of `kind` with a rover label.
list() {
  local kind=$1 ids format
  case "$kind" in
    container)
      ids=$(docker ps -aq)
      format='{{.Name}}	{{.Created}}	{{range $k, $v := .Config.Labels}}{{$k}}={{$v}} {{end}}'
      ;;
    network)
      ids=$(docker network ls -q)
      format='{{.Name}}	{{.Created}}	{{range $k, $v := .Labels}}{{$k}}={{$v}} {{end}}'
      ;;
    volume)
      ids=$(docker volume ls -q)
      format='{{.Name}}	{{.CreatedAt}}	{{range $k, $v := .Labels}}{{$k}}={{$v}} {{end}}'
      ;;
  esac
  [ -n "$ids" ] || return 0
  # One may go between the listing and the inspection: the others are still printed.
  # shellcheck disable=SC2086
  docker "$kind" inspect --format "$format" $ids 2>/dev/null |
    awk -F '\t' -v OFS='\t' -v kind="$kind" '$3 ~ /(^| )rover\./ { sub(/^\//, "", $1); print kind, $0 }' || true
}

all() {
  list container
  list network
  list volume
}

counts() {
  local lines=$1
  printf 'containers=%s networks=%s volumes=%s' \
    "$(grep -c '^container	' <<<"$lines" || true)" \
    "$(grep -c '^network	' <<<"$lines" || true)" \
    "$(grep -c '^volume	' <<<"$lines" || true)"
}

case "${1:-}" in
  count)
    since=$(date +%s)
    echo "$(counts "$(all)") since=$since"
    ;;
  check)
    before=${2:?usage: tests/leftovers.sh check "<what count printed>"}
    since=""
    for field in $before; do
      case "$field" in since=*) since=${field#since=} ;; esac
    done
    [ -n "$since" ] || { echo "leftovers: no since=EPOCH in: $before" >&2; exit 2; }
    now=$(all)
    new=""
    while IFS=$'\t' read -r kind name created labels; do
      [ -n "$kind" ] || continue
      # Networks print `2026-11-28 15:34:48.47 +0000 UTC`, which date reads without the zone.
      made=$(date -d "${created% UTC}" +%s 2>/dev/null || echo 0)
      if [ "$made" -ge "$since" ]; then
        new+="  $kind $name  $labels"$'\n'
      fi
    done <<<"$now"
    if [ -n "$new" ]; then
      echo "leftovers: the suite left these of rover's on the engine (before: $before; now: $(counts "$now")):" >&2
      printf '%s' "$new" >&2
      exit 1
    fi
    echo "leftovers: none ($(counts "$now"); before: ${before% since=*})"
    ;;
  *)
    echo "usage: tests/leftovers.sh count | check BEFORE" >&2
    exit 2
    ;;
esac
