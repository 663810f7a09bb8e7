#!/usr/bin/env bash
# Installs the Debian packages tiler needs, only those missing. Idempotent; fast when all are there.
set -euo pipefail
packages=(
  build-essential cmake ninja-build ccache pkg-config file dpkg-dev clang-format libtiff-tools
  libtorch-dev libopencv-dev libopenblas0-openmp
  libtiff-dev libzstd-dev libjpeg-dev libgloo-dev libcli11-dev libgtest-dev libspdlog-dev nlohmann-json3-dev libgdal-dev
  libopenslide-dev libhdf5-dev gdal-bin libvips-tools openslide-tools hdf5-tools python3-h5py python3-torch
  python3-setuptools python3-pil util-linux python3-zarr python3-jsonschema openmpi-bin
  libyaml-cpp-dev libminizip-dev libssl-dev python3-yaml
  libcpp-httplib-dev libsqlite3-dev chromium chromium-driver python3-selenium pybind11-dev python3-dev
  python3-shapely
)
# tiler view's page: OpenSeadragon, pinned, from npm into .deps/viewer (CMake copies it beside the binary). npm
# itself from Debian where no Node.js is installed (a NodeSource Node.js brings its own).
osd_version=6.1.1
command -v npm >/dev/null 2>&1 || packages+=(npm)
# --print: the list, one line, for scripts that install the same packages elsewhere (test-torch2.sh).
if [ "${1:-}" = "--print" ]; then
  echo "${packages[*]}"
  exit 0
fi
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
install_viewer() {
  local root dir
  root=$(cd "$(dirname "$0")/.." && pwd)
  dir=$root/.deps/viewer
  [ -f "$dir/node_modules/openseadragon/build/openseadragon/openseadragon.min.js" ] &&
    grep -q "\"version\": \"$osd_version\"" "$dir/node_modules/openseadragon/package.json" && return 0
  echo "setup-deps: npm install openseadragon@$osd_version into $dir"
  mkdir -p "$dir"
  npm install --prefix "$dir" --no-audit --no-fund --no-save "openseadragon@$osd_version" >/dev/null
}
if [ ${#missing[@]} -eq 0 ]; then
  install_viewer
  exit 0
fi
echo "setup-deps: installing ${missing[*]}"
sudo=""
[ "$(id -u)" -ne 0 ] && sudo="sudo"
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
install_viewer
