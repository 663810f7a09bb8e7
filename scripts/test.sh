#!/usr/bin/env bash
# Installs what is missing, builds (RelWithDebInfo, ccache, all cores), checks formatting, runs every test.
#   scripts/test.sh              unit + e2e tests (gpu tests skip without a GPU)
#   scripts/test.sh --sanitize   the same, built with TILER_SANITIZE=address,undefined in build-asan/
#   scripts/test.sh -L unit      extra arguments go to ctest
set -euo pipefail
cd "$(dirname "$0")/.."
sanitize=""
if [ "${1:-}" = "--sanitize" ]; then sanitize="address,undefined"; shift; fi
bash scripts/setup-deps.sh
build=build
[ -n "$sanitize" ] && build=build-asan
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_COMPILER_LAUNCHER=ccache \
  -DTILER_SANITIZE="$sanitize" >/dev/null
cmake --build "$build" -j "$(nproc)"

echo "== clang-format check"
files=$(git ls-files '*.cpp' '*.hpp' 2>/dev/null || find include src tests -name '*.[ch]pp')
clang-format --dry-run --Werror $files

echo "== tests"
# Leak checking is off: LibTorch's and OpenCV's global registries are never freed (not our leaks). SEGV
# handling is off because the crash tests raise SIGSEGV on purpose and expect the signal, not an ASan report.
# No other suppressions are needed.
export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=0:handle_segv=0}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"
cd "$build"
ctest --output-on-failure -j "$(nproc)" "$@"
