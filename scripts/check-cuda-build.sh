#!/usr/bin/env bash
# Compiles tiler, ctrun and the tests against Debian trixie's CUDA LibTorch 2.x (libtorch-cuda-dev, with
# the CUDA toolkit and NCCL) in a root of its own (build-torch2/cuda-root, ignored), and checks that tiler
# links libtorch_cuda and NCCL and reports both compiled. Nothing runs on a GPU: this machine has none.
# Exit 0 when all of that holds; 3 when Debian's archive cannot be reached to make the root. Needs root.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/trixie-root.sh
root=${TILER_CUDA_ROOT:-$(pwd)/build-torch2/cuda-root}
packages="$(bash scripts/setup-deps.sh --print | sed 's/\blibtorch-dev\b/libtorch-cuda-dev/; s/\blibgloo-dev\b/libgloo-cuda-dev/') nvidia-cuda-toolkit libnccl-dev"
trixie_root "$root" $packages || exit $?
trixie_copy_source "$root"
trixie_run "$root" <<'BUILD'
set -euo pipefail
cmake -S . -B build-cuda -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_COMPILER_LAUNCHER=ccache
cmake --build build-cuda -j "$(nproc)"
echo "== what tiler links"
ldd build-cuda/tiler | grep -E "libtorch_cuda|libc10_cuda|libnccl|libcudart" | sed 's/ (0x.*//'
ldd build-cuda/tiler | grep -q libtorch_cuda || { echo "tiler does not link libtorch_cuda"; exit 1; }
# NCCL is linked into libtorch_cuda itself (Debian links libnccl.so.2 from it).
ldd build-cuda/tiler | grep -q libnccl || { echo "tiler does not load NCCL"; exit 1; }
echo "== tiler --version"
build-cuda/tiler --version | tee /tmp/version.txt
grep -q "CUDA compiled: yes" /tmp/version.txt && grep -q "NCCL compiled: yes" /tmp/version.txt
echo "== CUDA build checked: tiler, ctrun and the tests compiled and linked against CUDA LibTorch"
BUILD
