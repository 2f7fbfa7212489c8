#!/usr/bin/env bash
# The whole test suite, on a fresh Debian machine as on a developer's: installs and starts what the
# tests need (a Docker engine, the pinned real claude CLI from npm, the real sandbox image), then
# runs every test, prints the ten slowest, and fails if the suite left a container, network or
# volume of rover's behind.
set -euo pipefail
cd "$(dirname "$0")/.."
started=$SECONDS
if [ -f tests/setup-docker.sh ]; then
  bash tests/setup-docker.sh
fi
# Headless chromium and its WebDriver, for the dashboard's browser test.
bash tests/setup-browser.sh
# The real claude and codex CLIs (pinned, from npm, cached) for the tests that drive them, and the real
# sandbox image (docs/sandbox/Dockerfile on a debootstrapped Debian, cached by content hash).
ROVER_TEST_CLAUDE_BIN="$(bash tests/setup-clis.sh)"
ROVER_TEST_CODEX_BIN="$(bash tests/setup-clis.sh codex)"
ROVER_TEST_DEVCONTAINER_BIN="$(bash tests/setup-clis.sh devcontainer)"
export ROVER_TEST_CLAUDE_BIN ROVER_TEST_CODEX_BIN ROVER_TEST_DEVCONTAINER_BIN
ROVER_TEST_SANDBOX_IMAGE="$(bash tests/setup-sandbox-image.sh)"
ROVER_TEST_SANDBOX_BASE="$(bash tests/setup-sandbox-image.sh --base)"
export ROVER_TEST_SANDBOX_IMAGE ROVER_TEST_SANDBOX_BASE
# What rover's containers, networks and volumes there are before (another rover's may be running).
leftovers_before="$(bash tests/leftovers.sh count)"
echo "setup: $((SECONDS - started)) s"
# Most tests wait on processes, containers and sockets, not on the 2 cores: twice as many
# threads as cores (ROVER_TEST_THREADS to change it; at 6 the container tests' own waits ran out).
export RUST_TEST_THREADS="${ROVER_TEST_THREADS:-4}"
log="$(mktemp /tmp/rover-tests.XXXXXX)"
cluster_log="$(mktemp /tmp/rover-tests-cluster.XXXXXX)"
status=0
cargo test --locked --no-run 2>&1 | tee "$log"
echo "build: $((SECONDS - started)) s"
it_bin="$(sed -nE 's#^ *Executable tests/it/main.rs \((.*)\)$#\1#p' "$log" | tail -n 1)"
# The swarm tests (cluster::) are one chain: they share the two-node test swarm one at a time.
# They run in a process of their own beside the rest, on one thread, so none of the other
# tests' threads waits on them; their output follows the rest's. The tests that sweep the whole
# engine with a real `gc` (engine_gc::, soak::) take the engine exclusively across processes,
# so they wait while a swarm test holds it shared: they run in the same one-thread process,
# after the swarm's, instead of holding up to four of the other tests' threads while they wait.
bash tests/timed.sh "$it_bin" cluster:: engine_gc:: soak:: --test-threads 1 >"$cluster_log" 2>&1 &
cluster=$!
cargo test --locked --config "target.'cfg(all())'.runner = ['bash', '$PWD/tests/timed.sh']" \
  -- --skip cluster:: --skip engine_gc:: --skip soak:: 2>&1 | tee "$log" || status=$?
wait "$cluster" || status=1
echo
echo "the swarm and engine-sweep tests (cluster::, engine_gc::, soak::, beside the rest):"
cat "$cluster_log"
cat "$cluster_log" >>"$log"
echo
echo "the ten slowest tests:"
# awk reads all of sort's output: `head` would close the pipe early, and under pipefail the
# SIGPIPE sort then gets (exit 141) would fail the run after every test passed.
sed -nE 's/^test (.*) \.\.\. (ok|FAILED) <([0-9.]+)s>$/\3 \1/p' "$log" | sort -rn \
  | awk 'NR <= 10 { printf "  %8.1f s  %s\n", $1, $2 }'
rm -f "$log" "$cluster_log"
bash tests/leftovers.sh check "$leftovers_before" || status=1
echo "bash tests/run.sh: $((SECONDS - started)) s"
exit "$status"
