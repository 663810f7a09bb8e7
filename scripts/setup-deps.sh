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
  libsqlite3-dev python3-shapely
)
# --print: the list, one line, for scripts that install the same packages elsewhere (test-torch2.sh).
if [ "${1:-}" = "--print" ]; then
  echo "${packages[*]}"
  exit 0
fi
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
echo "setup-deps: installing ${missing[*]}"
sudo=""
[ "$(id -u)" -ne 0 ] && sudo="sudo"
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
