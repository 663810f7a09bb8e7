#!/usr/bin/env bash
# Compiles tiler, ctrun and the tests against Debian trixie's CUDA LibTorch 2.x (libtorch-cuda-dev, with
# the CUDA toolkit and NCCL) in a root of its own (build-torch2/cuda-root, ignored), and checks that tiler
# links libtorch_cuda and NCCL and reports both compiled. Nothing runs on a GPU: this machine has none.
# Exit 0 when all of that holds; 3 when Debian's archive cannot be reached to make the root. Needs root.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/trixie-root.sh
root=${TILER_CUDA_ROOT:-$(pwd)/build-torch2/cuda-root}
# libtorch-cuda-dev comes after the root is made: it depends on nvidia-cudnn, a contrib package that downloads
# cuDNN from NVIDIA when installed, which this machine cannot reach (Debian's archive only).
packages="$(bash scripts/setup-deps.sh --print | sed 's/\blibtorch-dev\b//; s/\blibgloo-dev\b/libgloo-cuda-dev/') nvidia-cuda-toolkit libnccl-dev"
trixie_root "$root" $packages || exit $?
trixie_copy_source "$root"
if ! chroot "$root" dpkg -s libtorch-cuda-dev >/dev/null 2>&1; then
  cp /etc/resolv.conf "$root/etc/resolv.conf"
  trixie_run "$root" <<'CUDNN' || exit 3
set -euo pipefail
# A stand-in for the downloader package, so that libtorch-cuda-dev installs; the library comes below.
mkdir -p /tmp/cudnn/DEBIAN
cat >/tmp/cudnn/DEBIAN/control <<'CONTROL'
Package: nvidia-cudnn
Version: 9.0.0.312~cuda12+tiler.stub
Architecture: amd64
Maintainer: tiler <tiler@localhost>
Provides: libcudnn-dev, libcudnn.so, libcudnn.so.9
Description: stand-in for NVIDIA's cuDNN downloader, for tiler's CUDA link check only
CONTROL
dpkg-deb --build /tmp/cudnn /tmp/nvidia-cudnn-stub.deb >/dev/null
dpkg -i /tmp/nvidia-cudnn-stub.deb >/dev/null
apt-get update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends libtorch-cuda-dev >/dev/null
CUDNN
fi
trixie_run "$root" <<'STUB'
set -euo pipefail
# The stub cuDNN: every cudnn* symbol libtorch_cuda imports, under cuDNN's symbol version, each returning
# CUDNN_STATUS_NOT_INITIALIZED. Remade each time (a second): it never leaves this root.
lib=/usr/lib/x86_64-linux-gnu
nm -D --undefined-only $lib/libtorch_cuda.so | awk '{print $2}' | grep '^cudnn' | sed 's/@.*//' | sort -u |
  sed 's/.*/int &(void) { return 1; }/' >/tmp/cudnn_stub.c
echo 'libcudnn.so.9 { global: *; };' >/tmp/cudnn.map
gcc -shared -fPIC -Wl,-soname,libcudnn.so.9 -Wl,--version-script=/tmp/cudnn.map -o $lib/libcudnn.so.9 \
  /tmp/cudnn_stub.c
ln -sf libcudnn.so.9 $lib/libcudnn.so
echo "== cuDNN stub: $(wc -l </tmp/cudnn_stub.c) symbols"
STUB
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
