# Sourced by test-torch2.sh and check-cuda-build.sh: a Debian trixie root made with mmdebstrap from Debian's
# archive (reused while its package list is unchanged), the source copied in, commands run inside it.
# Needs root (mmdebstrap, chroot, mounts).
trixie_mirror=${TILER_DEBIAN_MIRROR:-http://deb.debian.org/debian}

# trixie_root ROOT PACKAGES...: makes ROOT (or adds what its package list lacks). Returns 3 when the archive
# cannot be reached, so callers can tell a missing network from a failed build.
trixie_root() {
  local root=$1
  shift
  local packages="$*" stamp="$root/.tiler-packages"
  [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$packages" ] && return 0
  if ! command -v mmdebstrap >/dev/null; then
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends mmdebstrap || return 3
  fi
  if [ -f "$stamp" ]; then
    echo "== adding packages to $root"
    cp /etc/resolv.conf "$root/etc/resolv.conf"
    chroot "$root" bash -c "apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
      apt-get install -y -qq --no-install-recommends $packages" || return 3
  else
    echo "== making the trixie root $root (a download of 1-3 GB, once)"
    rm -rf "$root"
    mkdir -p "$(dirname "$root")"
    mmdebstrap --variant=apt --components=main,contrib,non-free,non-free-firmware \
      --include="$(echo "$packages" | tr -s ' ' ',' | sed 's/^,//;s/,$//')" \
      --aptopt='APT::Install-Recommends "false"' trixie "$root" "$trixie_mirror" || {
      rm -rf "$root"
      return 3
    }
  fi
  echo "$packages" >"$stamp"
}

# trixie_copy_source ROOT: the tracked and unignored files into ROOT/src/tiler, in place of the last copy's
# (whose build trees, build-*, stay: ninja and ccache then rebuild only what changed; mtimes are kept).
trixie_copy_source() {
  mkdir -p "$1/src/tiler"
  find "$1/src/tiler" -mindepth 1 -maxdepth 1 ! -name 'build-*' -exec rm -rf {} +
  git ls-files -co --exclude-standard -z | tar --null -T - -cf - | tar -xpf - -C "$1/src/tiler"
}

# trixie_run ROOT ARGS... < SCRIPT: runs the bash SCRIPT from stdin in ROOT's /src/tiler with ARGS, in a
# mount namespace of its own (its /proc, /dev and /tmp vanish with it).
trixie_run() {
  local root=$1
  shift
  unshare --mount --propagation private bash -c '
    set -e
    root=$1; shift
    mount -t proc proc "$root/proc"
    mount --rbind /dev "$root/dev"
    mount -t tmpfs tmpfs "$root/tmp"
    exec chroot "$root" env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root LANG=C.UTF-8 \
      CCACHE_DIR=/src/ccache bash -c "cd /src/tiler && bash -s \"\$@\"" bash "$@"' bash "$root" "$@"
}
