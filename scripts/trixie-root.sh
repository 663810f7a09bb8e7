# Sourced by test-torch2.sh and check-cuda-build.sh: a Debian trixie root made with mmdebstrap from Debian's
# archive (reused while its package list is unchanged), the source copied in, commands run inside it.
# Needs root (mmdebstrap, chroot, mounts).
# The archive is the one this machine's apt uses (its first "debian" source, deb822 or one-line form), or
# TILER_DEBIAN_MIRROR.
apt_debian_mirror() {
  local files=() f
  for f in /etc/apt/sources.list.d/*.sources /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
    [ -f "$f" ] && files+=("$f")
  done
  [ ${#files[@]} -gt 0 ] || return 0
  awk '/^URIs:/ { for (i = 2; i <= NF; i++) if ($i !~ /security/) { print $i; exit } }
       /^deb / { for (i = 2; i <= NF; i++) if ($i ~ /^[a-z]+:\/\//) { if ($i !~ /security/) { print $i; exit } break } }' \
    "${files[@]}" 2>/dev/null | head -n 1
}
trixie_mirror=${TILER_DEBIAN_MIRROR:-$(apt_debian_mirror)}
if [ -z "$trixie_mirror" ]; then
  echo "trixie-root: no Debian archive among this machine's apt sources; set TILER_DEBIAN_MIRROR" >&2
fi

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

# trixie_copy_source ROOT: the tracked and unignored files, and .deps/viewer, into ROOT/src/tiler, where the last
# copy and its build trees (build-*) stay. A file whose bytes did not change keeps the last copy's mtime, so a fresh clone (whose
# files are all new to make) rebuilds only what changed since the last run here, even with an empty compiler
# cache; a changed or new file (or mode) gets the time of the copy (not its own mtime, which can be older than
# a build another tree made here since: ninja would keep the old object), a file gone from the tree goes.
trixie_copy_source() {
  local dest="$1/src/tiler" incoming="$1/src/incoming"
  rm -rf "$incoming"
  mkdir -p "$dest" "$incoming"
  # The tree, and what setup-deps.sh put in .deps/viewer (npm's OpenSeadragon: the root has no npm).
  { git ls-files -co --exclude-standard -z; [ ! -d .deps/viewer ] || find .deps/viewer -type f -print0; } |
    tar --null -T - -cf - | tar -xpf - -C "$incoming"
  (cd "$dest" && find . -path './build-*' -prune -o \( -type f -o -type l \) -print0) |
    while IFS= read -r -d '' f; do [ -e "$incoming/$f" ] || [ -L "$incoming/$f" ] || rm -f "$dest/$f"; done
  (cd "$incoming" && find . \( -type f -o -type l \) -print0) |
    while IFS= read -r -d '' f; do
      if [ -L "$incoming/$f" ] || [ -L "$dest/$f" ] || ! cmp -s "$incoming/$f" "$dest/$f" ||
        [ "$(stat -c %a "$incoming/$f")" != "$(stat -c %a "$dest/$f")" ]; then
        mkdir -p "$(dirname "$dest/$f")"
        rm -f "$dest/$f"
        cp -P --preserve=mode "$incoming/$f" "$dest/$f"
      fi
    done
  rm -rf "$incoming"
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
      CCACHE_DIR=/src/ccache bash -c "cd /src/tiler && bash -s -- \"\$@\"" bash "$@"' bash "$root" "$@"
}
