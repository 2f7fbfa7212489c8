#!/usr/bin/env bash
# rover's main job, end to end, on this machine, with no GitHub and no model account:
# a bundled example repository, a local request submitted with `rover autopilot submit`, the
# test fake agent standing in for the model (scripted in docs/demo/agent-script.json), workflows
# in a real local Docker sandbox, and at the end `rover autopilot trace` showing the whole trace.
#
#   bash docs/demo/run.sh            # builds rover, then runs the demo (root on Debian: it can
#                                    # install and start Docker, like the test command)
#   ROVER_DEMO_BIN_DIR=target/debug bash docs/demo/run.sh    # use already built binaries
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
top="$(cd "$here/../.." && pwd)"

if [ -z "${ROVER_DEMO_BIN_DIR:-}" ]; then
  echo "== building rover"
  (cd "$top" && cargo build --quiet --bins --features test-support)
  ROVER_DEMO_BIN_DIR="$top/target/debug"
fi
rover="$ROVER_DEMO_BIN_DIR/rover"
fake="$ROVER_DEMO_BIN_DIR/rover-fake-agent"

echo "== a Docker engine"
bash "$top/tests/setup-docker.sh"

work="$(mktemp -d "${TMPDIR:-/tmp}/rover-demo.XXXXXX")"
echo "== the example repository in $work"
export GIT_CONFIG_GLOBAL=/dev/null GIT_CONFIG_NOSYSTEM=1
git init -q --bare -b main "$work/origin.git"
cp -r "$here/widgets" "$work/widgets"
chmod +x "$work/widgets/src/export.sh"
git -C "$work/widgets" init -q -b main
git -C "$work/widgets" config user.name "Demo User"
git -C "$work/widgets" config user.email "demo@example.com"
git -C "$work/widgets" add -A
git -C "$work/widgets" commit -q -m "Initial commit"
git -C "$work/widgets" remote add origin "$work/origin.git"
git -C "$work/widgets" push -q -u origin main

echo "== the sandbox image: busybox and the fake agent as claude, imported without a registry"
rootfs="$work/rootfs"
mkdir -p "$rootfs/bin" "$rootfs/usr/local/bin" "$rootfs/tmp" "$rootfs/workspace"
cp "$(command -v busybox)" "$rootfs/bin/busybox"
for applet in sh cat ls echo test mkdir rm; do ln -sf busybox "$rootfs/bin/$applet"; done
cp "$fake" "$rootfs/usr/local/bin/claude"
# The fake agent is a dynamically linked Rust binary: bring its libraries along.
for lib in $(ldd "$fake" | grep -o '/[^ ]*'); do
  mkdir -p "$rootfs$(dirname "$lib")"
  cp -L "$lib" "$rootfs$lib"
done
image="rover-demo:$(tar -C "$rootfs" -c . | sha256sum | cut -c1-12)"
if ! docker image inspect "$image" >/dev/null 2>&1; then
  tar -C "$rootfs" -c . | docker import - "$image" >/dev/null
  # Every rebuild of the fake agent makes a new image: the one made here goes when the demo
  # ends (an image that was already there, another run's, stays).
  trap 'docker rmi "$image" >/dev/null 2>&1 || true' EXIT
fi

cat > "$work/widgets/rover.json" <<JSON
{
  "autopilot": {
    "agent": {"extraEnv": ["ROVER_FAKE_AGENT_SCRIPT"]},
    "sandbox": {"image": "$image", "network": "none", "memoryMb": 256, "timeoutSecs": 120,
                "envAllow": ["ROVER_FAKE_AGENT_SCRIPT"]},
    "pipeline": {"fallbackIntervalSecs": 1}
  }
}
JSON

mkdir -p "$work/bin"
ln -sf "$fake" "$work/bin/claude"
export ROVER_DATA_DIR="$work/data"
export ROVER_CLAUDE_BIN="$work/bin/claude"
export ROVER_FAKE_AGENT_SCRIPT
ROVER_FAKE_AGENT_SCRIPT="$(cat "$here/agent-script.json")"
cd "$work/widgets"

echo "== rover autopilot submit"
"$rover" autopilot submit "Add a --json flag to the export command" | tee "$work/submit.out"
trace="$(awk '/submitted trace/ {print $3}' "$work/submit.out")"

echo "== rover autopilot start --once --local (again, as cron would, until the trace ends)"
for _ in $(seq 1 15); do
  "$rover" autopilot start --once --local
  outcome="$("$rover" autopilot trace "$trace" --json | sed -n 's/.*"state": "\([a-z]*\)".*/\1/p' | head -1)"
  [ "$outcome" = "finished" ] && break
  sleep 1
done

echo "== rover autopilot trace $trace"
"$rover" autopilot trace "$trace"

branch="$(git -C "$work/origin.git" for-each-ref --format='%(refname:short)' refs/heads/rover/ | head -1)"
echo "== the branch rover pushed: $branch"
git -C "$work/origin.git" log --oneline -n 2 "$branch"
git -C "$work/origin.git" show "$branch:src/export.sh" | head -6
echo "== done: everything is under $work (the store is $work/data)"
echo "== the trace as a timeline, in a browser:"
echo "   cd $work/widgets && ROVER_DATA_DIR=$ROVER_DATA_DIR $rover autopilot dashboard"
echo "   then open http://127.0.0.1:8790/trace/$trace"
