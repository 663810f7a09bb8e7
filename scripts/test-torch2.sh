#!/usr/bin/env bash
# Builds tiler against Debian trixie's LibTorch 2.x (CPU, gloo) and runs the whole test suite there.
# The root is made once from Debian's archive with mmdebstrap and kept where every clone on this machine finds
# it, as ccache and the dependency bundle are (~/.cache/tiler-torch2/root; TILER_TORCH2_ROOT): a fresh clone,
# CI's, reuses its packages, its compiler cache and its build tree. One run at a time uses it (a lock).
#   scripts/test-torch2.sh            build + all tests against LibTorch 2.x
#   scripts/test-torch2.sh -L unit    extra arguments go to ctest
# Exit 0 only when every test passes; 3 when Debian's archive cannot be reached to make the root.
# Needs root. Cold, it makes the root and builds everything; warm, it builds what changed and runs the tests
# (the minutes of each: docs/performance.md, "CI and build times").
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/trixie-root.sh
root=${TILER_TORCH2_ROOT:-${XDG_CACHE_HOME:-$HOME/.cache}/tiler-torch2/root}
mkdir -p "$(dirname "$root")"
exec 9>"$root.lock"
flock 9
trixie_root "$root" $(bash scripts/setup-deps.sh --print) || exit $?
trixie_copy_source "$root"
trixie_run "$root" "$@" <<'BUILD'
set -euo pipefail
cmake -S . -B build-torch2 -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_COMPILER_LAUNCHER=ccache \
  -DTILER_TEST_PER_SUITE=ON >/dev/null
cmake --build build-torch2 -j "$(nproc)"
echo "== built with"
build-torch2/tiler --version | head -2
cd build-torch2
ASAN_OPTIONS=detect_leaks=0 ctest --output-on-failure -j "$(nproc)" "$@"
BUILD
