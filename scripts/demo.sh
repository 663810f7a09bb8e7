#!/usr/bin/env bash
# Installs what is missing, builds, and runs tiler on the bundled samples with two ranks through ctrun.
#   scripts/demo.sh [TILER FLAGS...]                 from the build tree
#   scripts/demo.sh --prefix DIR [TILER FLAGS...]    installs to DIR first (cmake --install) and runs DIR/bin/tiler
set -euo pipefail
cd "$(dirname "$0")/.."
prefix=""
if [ "${1:-}" = "--prefix" ]; then prefix="$(realpath -m "$2")"; shift 2; fi
bash scripts/setup-deps.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_COMPILER_LAUNCHER=ccache >/dev/null
cmake --build build -j "$(nproc)" --target tiler ctrun
bin=./build
if [ -n "$prefix" ]; then
  cmake --install build --prefix "$prefix" >/dev/null
  bin="$prefix/bin"
fi
samples="$("$bin/tiler" --version | sed -n 's/^Bundled samples: //p')"
rm -rf tiler-out
"$bin/ctrun" --nproc_per_node=2 "$bin/tiler" --threads 1 --save labels,probs "$@"
"$bin/tiler" overlay "$samples/images/blobs_4096.tif" tiler-out/blobs_4096_labels.tif tiler-out/blobs_4096_overlay.png
echo
echo "outputs:  $(pwd)/tiler-out/  (labels, probabilities, report.json)"
echo "overlay:  $(pwd)/tiler-out/blobs_4096_overlay.png"
