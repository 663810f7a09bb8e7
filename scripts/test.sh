#!/usr/bin/env bash
# Installs what is missing, builds (RelWithDebInfo, ccache, all cores), checks formatting, runs every test.
#   scripts/test.sh              unit + e2e tests (gpu tests skip without a GPU)
#   scripts/test.sh --sanitize   the same, built with TILER_SANITIZE=address,undefined in build-asan/
#   scripts/test.sh --tsan       ThreadSanitizer (build-tsan/) over the suites of tiler's own threads: the
#                                loader's read-ahead and read threads, the TIFF reader's shared tile cache,
#                                the output stage, the tile compression pool, the stitcher's row pieces,
#                                the readers' handle pools
#                                and the pyramid's level thread
#                                (LibTorch and gloo are not built with TSan, so the dist and exchange
#                                tests drown in their false reports)
#   scripts/test.sh --features-off  tiler and the suites that see the optional features, built without GDAL,
#                                OpenSlide and HDF5 (build-nofeatures/): what needs one says so and skips
#   scripts/test.sh --bundle DIR the unit tests built against a dependency bundle (scripts/build-deps.sh's
#                                prefix DIR) instead of the system's libraries (build-bundle/)
#   scripts/test.sh -L unit      extra arguments go to ctest (tests are named by executable: -R pipeline_test,
#                                -R io_tests for the io floor's unit tests; GTEST_FILTER=Pipeline.Resume* or
#                                GTEST_FILTER='Mask.*' picks tests inside them)
set -euo pipefail
cd "$(dirname "$0")/.."
sanitize=""
# The unit tests as one executable per floor (core_tests, io_tests, writers_tests, compute_tests, jobs_tests);
# the stages that run a few build one per test file instead (queue_test, ...).
per_floor=ON
targets=()
filter=()
# A test process spends longer starting (LibTorch's registrations; more under a sanitizer) than most tests
# take: ctest runs one process per test executable (pipeline_test in 3 shards), each running its tests in turn
# (TILER_TEST_PER_SUITE); a stage that runs some tests chooses them with GTEST_FILTER.
if [ "${1:-}" = "--sanitize" ]; then
  sanitize="address,undefined"
  shift
fi
if [ "${1:-}" = "--tsan" ]; then
  sanitize="thread"
  per_floor=OFF
  targets=(--target queue_test handle_pool_test loader_test outputs_test image_io_test blend_test)
  filter=(-R "^(queue|handle_pool|loader|outputs|image_io|blend)_test$")
  export GTEST_FILTER="Queue.*:HandlePool.*:Loader.*:Outputs.*:*LoaderThreads*:*Pyramid*:ImageReader.Concurrent*:\
ImageReader.ACorruptTileFails*:ImageWriter.Pooled*:Stitcher.RowPieces*"
  shift
fi
features=()
bundle=()
if [ "${1:-}" = "--features-off" ]; then
  features=(-DTILER_WITH_GDAL=OFF -DTILER_WITH_OPENSLIDE=OFF -DTILER_WITH_HDF5=OFF)
  per_floor=OFF
  targets=(--target tiler ctrun version_test readers_test window_outputs_test polygons_test pipeline_test)
  filter=(-R "^(version|readers|window_outputs|polygons|pipeline)_test")
  export GTEST_FILTER="Version.*:Readers.*:WindowOutputs.*:Polygons.*:*AFeatureThisBuildLacks*:*PolygonsOutline*:\
*EmbedWrites*"
  shift
fi
if [ "${1:-}" = "--bundle" ]; then
  bundle=(-DTILER_DEPS="$(realpath "$2")")
  filter=(-L unit)
  shift 2
fi
# Only the unit tests asked for (the bundle stage, `-L unit`): build just what they need.
if [ ${#targets[@]} -eq 0 ] && [[ " ${filter[*]} $* " == *" -L unit "* ]]; then targets=(--target unit_tests); fi
bash scripts/setup-deps.sh
# One cache for every clone on this machine (CI builds a fresh clone each time): paths relative to the clone.
export CCACHE_BASEDIR="$PWD" CCACHE_NOHASHDIR=1
build=build
[ "$sanitize" = "address,undefined" ] && build=build-asan
[ "$sanitize" = "thread" ] && build=build-tsan
[ ${#features[@]} -gt 0 ] && build=build-nofeatures
[ ${#bundle[@]} -gt 0 ] && build=build-bundle
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_COMPILER_LAUNCHER=ccache \
  -DTILER_SANITIZE="$sanitize" -DTILER_TEST_PER_SUITE=ON \
  -DTILER_UNIT_TESTS_PER_FLOOR=$per_floor "${features[@]}" "${bundle[@]}" >/dev/null
cmake --build "$build" -j "$(nproc)" "${targets[@]}"

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
export TSAN_OPTIONS="${TSAN_OPTIONS:-halt_on_error=1}"
ctest --output-on-failure -j "$(nproc)" "${filter[@]}" "$@"
