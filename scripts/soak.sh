#!/usr/bin/env bash
# The README's suite, run again and again: a test that fails once in N runs is a bug to find, not to retry.
#   scripts/soak.sh            10 runs of every test (scripts/test.sh once, which installs and builds, then
#                              ctest 9 more times), each run on a machine loaded by one busy process a core
#   scripts/soak.sh 20 --quiet 20 runs on an otherwise idle machine
#   scripts/soak.sh 50 -R launcher_test   extra arguments go to ctest
# Stops at the first failing run, its output kept in build/soak-<n>.log; prints "N passed, 0 failed" at the end.
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${1:-10}
[ $# -gt 0 ] && shift
load=1
if [ "${1:-}" = "--quiet" ]; then
  load=0
  shift
fi
busy=()
stop_load() { [ ${#busy[@]} -eq 0 ] || kill "${busy[@]}" 2>/dev/null || true; }
trap stop_load EXIT
if [ $load -eq 1 ]; then
  for _ in $(seq "$(nproc)"); do
    (while :; do :; done) &
    busy+=($!)
  done
fi
mkdir -p build
for run in $(seq "$runs"); do
  log="build/soak-$run.log"
  start=$SECONDS
  if [ "$run" -eq 1 ]; then
    bash scripts/test.sh "$@" >"$log" 2>&1 || status=$?
  else
    (cd build && ctest --output-on-failure -j "$(nproc)" "$@") >"$log" 2>&1 || status=$?
  fi
  if [ "${status:-0}" -ne 0 ]; then
    echo "soak: run $run of $runs failed after $((SECONDS - start)) s (exit $status): $log"
    grep -E "^\[  FAILED  \]|The following tests FAILED|^\s+[0-9]+ - " "$log" | head -20 || true
    echo "$((run - 1)) passed, 1 failed"
    exit 1
  fi
  echo "soak: run $run of $runs passed in $((SECONDS - start)) s"
done
echo "$runs passed, 0 failed"
