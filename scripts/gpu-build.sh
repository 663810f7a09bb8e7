#!/usr/bin/env bash
# One command on a GPU machine that has a compiler, CMake, CUDA and PyTorch but none of tiler's other libraries
# (no network, no root needed):
#   scripts/gpu-build.sh [--bench] [--tests gpu|unit|all|none] [--bundle FILE] [--out DIR]
# Unpacks the dependency bundle (scripts/build-deps.sh: .deps/tiler-deps-<arch>.tar.xz), configures tiler against
# the LibTorch of the python3 that holds torch, builds with every core, runs `ctest -L gpu` (or more, or none:
# the tools alone, when a device call's minutes are for measuring) and
# scripts/gpu-check.sh, and with --bench `scripts/bench.sh gpu`. The Python module `tiler` is built for that
# python3 too (against the wheel's LibTorch, as the tools) when it has pybind11's CMake files (pip's pybind11)
# and Python's headers, and tests/python_module_test.py runs under it (not with --tests none). Writes DIR/gpu-build.log (everything) and
# DIR/gpu-build.json (each stage's seconds and outcome); exits 1 if a stage failed. DIR: $OUT or gpu-out.
set -uo pipefail
cd "$(dirname "$0")/.."
root=$PWD
bench=0
tests=gpu
bundle=$root/.deps/tiler-deps-$(uname -m).tar.xz
out=${OUT:-$root/gpu-out}
while [ $# -gt 0 ]; do
  case $1 in
    --bench) bench=1; shift ;;
    --tests) tests=$2; shift 2 ;;
    --bundle) bundle=$(realpath "$2"); shift 2 ;;
    --out) out=$2; shift 2 ;;
    *) echo "gpu-build: unknown argument '$1'" >&2; exit 2 ;;
  esac
done
case $tests in
  gpu | unit | all | none) ;;
  *) echo "gpu-build: --tests takes gpu, unit, all or none; got '$tests'" >&2; exit 2 ;;
esac
mkdir -p "$out"
out=$(realpath "$out")
log=$out/gpu-build.log
summary=$out/gpu-build.json
: >"$log"
stages=()
failed=0
# stage NAME CMD...: runs CMD with its output in the log, records its seconds and exit code.
stage() {
  local name=$1 t0 rc
  shift
  echo "== $name: $*" | tee -a "$log"
  t0=$(date +%s.%N)
  "$@" >>"$log" 2>&1
  rc=$?
  local s
  s=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
  echo "== $name: exit $rc in $s s" | tee -a "$log"
  stages+=("{\"stage\": \"$name\", \"seconds\": $s, \"exit\": $rc}")
  [ $rc -eq 0 ] || failed=1
  return $rc
}
finish() {
  {
    echo "{\"machine\": {\"cores\": $(nproc), \"gpu\": \"$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)\","
    echo " \"torch\": \"$(python3 -c 'import torch; print(torch.__version__)' 2>/dev/null)\", \"compiler\": \"$(c++ -dumpfullversion 2>/dev/null)\"},"
    echo " \"stages\": ["
    local IFS=,
    echo "  ${stages[*]}"
    echo " ], \"failed\": $failed}"
  } >"$summary"
  cat "$summary"
  exit $failed
}

deps=/tmp/tiler-deps-unpacked
build=$root/build-gpu
[ -f "$bundle" ] || { echo "gpu-build: no bundle at $bundle (make it with scripts/build-deps.sh)" | tee -a "$log"; failed=1; finish; }
unpack() { rm -rf "$deps" && mkdir -p "$deps" && tar -xJf "$bundle" -C "$deps"; }
stage unpack unpack || finish
# LibTorch's CMake config looks for the CUDA toolkit (nvcc) of a CUDA wheel.
[ -x /usr/local/cuda/bin/nvcc ] && ! command -v nvcc >/dev/null && export PATH=/usr/local/cuda/bin:$PATH
torch_prefix=$(python3 -c 'import torch; print(torch.utils.cmake_prefix_path)')
# The tests that export .pt2 packages use this Python (the wheel's), not the system's.
TILER_PYTHON=$(command -v python3)
export TILER_PYTHON
# The module for this Python (python/): pybind11's CMake files from its pip package; without them, none.
pybind11_dir=$(python3 -c 'import pybind11; print(pybind11.get_cmake_dir())' 2>/dev/null)
nvidia-smi >>"$log" 2>&1
configure() {
  # The wheel's CUDA: CMake's CUDA language is not used, but LibTorch's config looks for the toolkit. Unity
  # units off: the CUDA paths have never been compiled as one unit, and a GPU machine has the cores.
  cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DTILER_DEPS="$deps/tiler-deps" -DTILER_REQUIRE_CUDA=ON \
    -DTILER_UNITY_BUILD=OFF \
    -DCMAKE_PREFIX_PATH="$torch_prefix" ${CUDA_HOME:+-DCUDAToolkit_ROOT="$CUDA_HOME"} \
    -DPython3_EXECUTABLE="$TILER_PYTHON" ${pybind11_dir:+-Dpybind11_DIR="$pybind11_dir"}
}
stage configure configure || finish
# Whether the configuration found pybind11 and Python's headers: the module's target exists.
module=0
grep -q '^build tiler_python:' "$build/build.ninja" 2>/dev/null && module=1
echo "== python module: $module (python3 $TILER_PYTHON, pybind11 ${pybind11_dir:-not found})" | tee -a "$log"
# --tests gpu builds only what the GPU suites and gpu-check run (the rest of the suite is CPU-only).
targets=()
[ "$tests" = gpu ] && targets=(--target tiler ctrun tiler_bench ctrun_helper compute_tests launcher_test)
[ "$tests" = none ] && targets=(--target tiler ctrun tiler_bench ctrun_helper)
[ ${#targets[@]} -gt 0 ] && [ $module = 1 ] && targets+=(tiler_python)
stage build cmake --build "$build" -j "$(nproc)" "${targets[@]}" || finish
stage version "$build/tiler" --version
if [ $module = 1 ] && [ "$tests" != none ]; then
  # The module next to the wheel's torch in one process, and its outputs against the command's.
  stage python-module "$TILER_PYTHON" tests/python_module_test.py "$build/python" "$build/tiler" "$build/ctrun"
fi
case $tests in
  gpu) stage ctest-gpu ctest --test-dir "$build" -L gpu --output-on-failure ;;
  unit) stage ctest-unit ctest --test-dir "$build" -L "unit|gpu" -j "$(nproc)" --output-on-failure ;;
  all) stage ctest-all ctest --test-dir "$build" -j "$(nproc)" --output-on-failure --timeout 600 ;;
esac
stage gpu-check scripts/gpu-check.sh "$build"
if [ $bench = 1 ]; then
  stage bench env TILER_BUILD_DIR="$build" BENCH_RESULTS="$out" scripts/bench.sh gpu
fi
finish
