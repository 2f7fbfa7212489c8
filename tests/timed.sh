#!/usr/bin/env bash
# cargo's runner for the test binaries of tests/run.sh: each test binary prints every test's time
# (libtest's `--report-time`, e.g. `test x ... ok <1.234s>`), which run.sh sorts for the ten
# slowest. That flag is unstable: RUSTC_BOOTSTRAP=1 lets a stable toolchain's libtest take it
# at run time; nothing is compiled with it.
bin="$1"
shift
RUSTC_BOOTSTRAP=1 exec "$bin" "$@" -Z unstable-options --report-time
