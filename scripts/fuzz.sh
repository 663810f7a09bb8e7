#!/usr/bin/env bash
# Fuzzes ImageReader with libFuzzer for SECONDS (default 60): scripts/fuzz.sh [SECONDS]
#   scripts/fuzz.sh --ci   what CI runs: a fixed seed and run count from the committed corpus alone, so
#                          that a run is repeatable, OpenSlide's own decoding left out
# Builds the reader (no LibTorch) with clang, ASan and UBSan into build-fuzz/, starts from tests/fuzz/corpus/
# and writes any crashing input to tests/fuzz/regressions/, which image_io_test replays in CI.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds="${1:-60}"
limits=(-max_total_time="$seconds")
if [ "$seconds" = "--ci" ]; then
  seconds=120
  limits=(-seed=1 -runs=60000 -max_total_time=300)
  rm -rf build-fuzz/corpus
  # OpenSlide trusts its JPEG tiles' headers (a fuzzed Aperio tile asked for 17 GB): CI fuzzes tiler's own
  # reading (libtiff, libjpeg, OpenCV) and OpenSlide's vendor detection, not OpenSlide's decoding.
  export TILER_FUZZ_SKIP_OPENSLIDE=1
fi
bash scripts/setup-deps.sh
need=()
for p in clang libclang-rt-14-dev; do dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || need+=("$p"); done
if [ ${#need[@]} -gt 0 ]; then
  sudo=""; [ "$(id -u)" -ne 0 ] && sudo=sudo
  $sudo apt-get install -y -qq --no-install-recommends "${need[@]}"
fi
mkdir -p build-fuzz tests/fuzz/regressions
# The readers and what they stand on (the registry, every backend, the shared libtiff support), no LibTorch.
clang++ -std=c++17 -O1 -g -fsanitize=fuzzer,address,undefined -fno-omit-frame-pointer \
  -Iinclude -Isrc -Itests/fuzz -I/usr/include/opencv4 $(pkg-config --cflags openslide) \
  -DTILER_VERSION=\"fuzz\" -DTILER_SOURCE_DIR=\"$PWD\" -DTILER_WITH_OPENSLIDE=1 \
  tests/fuzz/image_reader_fuzzer.cpp src/io/readers/*.cpp src/io/image_io.cpp \
  src/core/{platform,error,fault,grid}.cpp \
  -o build-fuzz/image_reader_fuzzer \
  -ltiff -ljpeg $(pkg-config --libs openslide) -lopencv_imgcodecs -lopencv_imgproc -lopencv_core -lspdlog -lfmt
work=build-fuzz/corpus
mkdir -p "$work"
./build-fuzz/image_reader_fuzzer "${limits[@]}" -rss_limit_mb=2048 -timeout=10 \
  -artifact_prefix=tests/fuzz/regressions/ "$work" tests/fuzz/corpus
echo "fuzzed (${limits[*]}); crashes (if any) are in tests/fuzz/regressions/ and replayed by image_io_test"
