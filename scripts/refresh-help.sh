#!/usr/bin/env bash
# Rewrites tests/data/help.txt, the golden copy of every command's --help that install_test compares with the
# built binaries' (a flag's help is part of the interface: review the diff). Run after a build:
#   scripts/refresh-help.sh [BUILD_DIR]     (default: build)
set -euo pipefail
cd "$(dirname "$0")/.."
bin="$(realpath "${1:-build}")"
version=$(sed -n 's/^#define CLI11_VERSION "\(.*\)"/\1/p' /usr/include/CLI/Version.hpp)
{
  echo "# --help as CLI11 $version prints it: scripts/refresh-help.sh rewrites this file, install_test compares it"
  for command in "tiler" "tiler infer" "tiler finetune" "tiler info" "tiler overlay" "tiler check-model" "tiler view" "ctrun"; do
    echo "== $command --help"
    set -- $command
    # A clean environment: ctrun's defaults come from PET_* variables where they are set.
    env -i PATH=/usr/bin:/bin bash -c 'exec -a "$0" "$@"' "$1" "$bin/$1" "${@:2}" --help
  done
} >tests/data/help.txt
echo "tests/data/help.txt: $(wc -l <tests/data/help.txt) lines"
