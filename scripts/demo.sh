#!/usr/bin/env bash
# Installs what is missing, builds, and runs tiler on the bundled samples with two ranks through ctrun.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup-deps.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_COMPILER_LAUNCHER=ccache >/dev/null
cmake --build build -j "$(nproc)" --target tiler ctrun
rm -rf tiler-out
./build/ctrun --nproc_per_node=2 ./build/tiler --threads 1 --save labels,probs "$@"
./build/tiler overlay samples/images/blobs_4096.tif tiler-out/blobs_4096_labels.tif tiler-out/blobs_4096_overlay.png
echo
echo "outputs:  $(pwd)/tiler-out/  (labels, probabilities, report.json)"
echo "overlay:  $(pwd)/tiler-out/blobs_4096_overlay.png"
