#!/usr/bin/env bash
# Builds tiler's dependency bundle: everything a run needs besides LibTorch, static and position-independent,
# so that tiler builds on a machine that has only a compiler, CMake and PyTorch (a GPU image, a cluster without
# root). From Debian's own source packages, fetched through this machine's apt sources (no host named here):
#   zlib and its contrib/minizip (zipped model packages), zstd, libdeflate, libjpeg-turbo, libpng, libtiff (zlib,
#   JPEG, zstd, libdeflate), OpenCV core/imgproc/imgcodecs (no IPP, TBB, OpenCL, GDAL), HDF5's C library,
#   OpenSSL's libcrypto (model cards' sha256), GoogleTest, yaml-cpp,
#   and the headers of CLI11, nlohmann_json, spdlog (trixie's: it compiles against the fmt 12 of PyTorch's
#   wheels) and gloo (trixie's, which matches the wheels' c10d headers).
# Not in it: GDAL and OpenSlide (tiler builds without them: TILER_WITH_GDAL/OPENSLIDE), fmt (LibTorch's or the
# system's).
#
# Usage: scripts/build-deps.sh [--prefix DIR] [--tarball FILE | --no-tarball]
#   The sources, the build trees and by default the prefix live in $TILER_DEPS_CACHE (~/.cache/tiler-deps),
#   shared by every clone on the machine like the compiler cache; the tarball (relocatable: unpack anywhere and
#   configure tiler with -DTILER_DEPS=<its tiler-deps directory>) goes to .deps/tiler-deps-<arch>.tar.xz in
#   the repository, where scripts/gpu-build.sh looks for it. A second run with nothing changed does nothing.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
arch=$(uname -m)
cache=${TILER_DEPS_CACHE:-$HOME/.cache/tiler-deps}
prefix=$cache/tiler-deps
tarball=$root/.deps/tiler-deps-$arch.tar.xz
while [ $# -gt 0 ]; do
  case $1 in
    --prefix) prefix=$(realpath -m "$2"); shift 2 ;;
    --tarball) tarball=$(realpath -m "$2"); shift 2 ;;
    --no-tarball) tarball=""; shift ;;
    *) echo "build-deps: unknown argument '$1' (usage: build-deps.sh [--prefix DIR] [--tarball FILE | --no-tarball])" >&2
      exit 2 ;;
  esac
done
work=$cache/work
jobs=$(nproc)

# The bundle's identity: this script, the compiler and the source versions apt would fetch. Same key, no work.
stamp_key() {
  { sha256sum "$0" | cut -d' ' -f1; g++ -dumpfullversion; echo "$arch"; cat "$work/versions" 2>/dev/null; } |
    sha256sum | cut -d' ' -f1
}

sudo=""
[ "$(id -u)" -ne 0 ] && sudo="sudo"
tools=(build-essential cmake ninja-build nasm dpkg-dev xz-utils)
missing=()
for p in "${tools[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "build-deps: installing ${missing[*]}"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# Private apt state: deb-src twins of this machine's own Debian sources (all its suites: security fixes
# included), and a second list for trixie (the same archive, one release on) for spdlog and gloo.
mkdir -p "$work/apt-own/lists/partial" "$work/apt-trixie/lists/partial" "$work/src"
own_sources=$work/apt-own/sources.list
trixie_sources=$work/apt-trixie/sources.list
: >"$own_sources"
: >"$trixie_sources"
shopt -s nullglob
for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
  [ -f "$f" ] && sed -n 's/^deb \(.*\)$/deb-src \1/p' "$f" >>"$own_sources"
done
for f in /etc/apt/sources.list.d/*.sources; do
  # deb822 stanzas, one line each: URIs, Suites, Components, Signed-By.
  awk 'BEGIN{RS=""; FS="\n"} {
         u=s=c=k=""; deb=0
         for (i=1;i<=NF;i++) {
           if ($i ~ /^Types:.*deb( |$)/) deb=1
           if ($i ~ /^URIs:/) { u=$i; sub(/^URIs: */,"",u) }
           if ($i ~ /^Suites:/) { s=$i; sub(/^Suites: */,"",s) }
           if ($i ~ /^Components:/) { c=$i; sub(/^Components: */,"",c) }
           if ($i ~ /^Signed-By:/) { k=$i; sub(/^Signed-By: */,"",k) }
         }
         if (deb && u != "" && s != "") {
           n=split(s, suites, " ")
           for (j=1;j<=n;j++) printf "deb-src %s%s %s %s\n", (k!="" ? "[signed-by=" k "] " : ""), u, suites[j], c
         }
       }' "$f" >>"$own_sources"
done
# trixie: the archive that serves this machine's main suite (not -security, -updates).
grep -E '^deb-src .* [a-z]+ main' "$own_sources" | grep -v -E -- '-(security|updates|backports) ' | head -1 |
  sed -E 's/^(deb-src (\[[^]]*\] )?[^ ]+) [a-z]+ /\1 trixie /' >"$trixie_sources"
[ -s "$own_sources" ] && [ -s "$trixie_sources" ] ||
  { echo "build-deps: no Debian sources found in /etc/apt (need a 'deb' line or a .sources stanza)" >&2; exit 1; }

apt_in() {  # apt_in own|trixie apt-get|apt-cache ARGS...: apt over one private list
  local d=$work/apt-$1 tool=$2
  shift 2
  "$tool" -o Dir::Etc::SourceList="$d/sources.list" -o Dir::Etc::SourceParts=/dev/null \
    -o Dir::State::Lists="$d/lists" -o APT::Sandbox::User=root -qq "$@"
}
own_packages=(zlib libzstd libdeflate libjpeg-turbo libpng1.6 tiff opencv hdf5 openssl googletest yaml-cpp cli11 nlohmann-json3)
trixie_packages=(spdlog gloo)
# Update the indices at most once a day; the versions they name are part of the stamp.
for list in own trixie; do
  if [ -z "$(find "$work/apt-$list/lists" -maxdepth 1 -name '*Sources*' -mtime -1 2>/dev/null)" ]; then
    apt_in "$list" apt-get update
  fi
done
version_of() {
  local v
  v=$(apt_in "$1" apt-cache showsrc "$2" | awk '/^Version:/{print $2}' | sort -V | tail -1)
  [ -n "$v" ] || { echo "build-deps: no source package '$2' in the $1 sources" >&2; return 1; }
  echo "$v"
}
: >"$work/versions.new"
for p in "${own_packages[@]}"; do v=$(version_of own "$p") && echo "$p $v" >>"$work/versions.new"; done
for p in "${trixie_packages[@]}"; do v=$(version_of trixie "$p") && echo "$p $v" >>"$work/versions.new"; done
mv "$work/versions.new" "$work/versions"
key=$(stamp_key)
if [ -f "$prefix/.stamp" ] && [ "$(cat "$prefix/.stamp")" = "$key" ] &&
  { [ -z "$tarball" ] || [ "$tarball" -nt "$prefix/.stamp" ]; }; then
  echo "build-deps: $prefix${tarball:+ and $tarball} are up to date"
  exit 0
fi

# Sources, unpacked with Debian's patches applied, one directory per package.
# Some mirrors lack a package's .dsc but serve its tarballs: unpack the upstream tarball, then Debian's
# (format 3.0 (quilt)) and apply its patches in their series order, as dpkg-source would.
unpack_without_dsc() {  # unpack_without_dsc DOWNLOAD_DIR DEST
  local dl=$1 dir=$2 orig debian p
  orig=$(ls "$dl"/*.orig.tar.* 2>/dev/null | head -1)
  debian=$(ls "$dl"/*.debian.tar.* 2>/dev/null | head -1)
  [ -n "$orig" ] && [ -n "$debian" ] || return 1
  # Upstream tarballs have one top directory, or none.
  local strip=0
  [ "$(tar -tf "$orig" | cut -d/ -f1 | sort -u | wc -l)" = 1 ] && strip=1
  mkdir -p "$dir" && tar -xf "$orig" -C "$dir" --strip-components=$strip && tar -xf "$debian" -C "$dir" || return 1
  [ -f "$dir/debian/patches/series" ] || return 0
  for p in $(sed -e 's/#.*//' "$dir/debian/patches/series"); do
    patch -d "$dir" -p1 -s <"$dir/debian/patches/$p" || return 1
  done
}
fetch() {  # fetch own|trixie PACKAGE -> prints the unpacked directory
  local list=$1 pkg=$2 version dir dl
  # The newest version first; an older one where a mirror lacks it (security pools lag behind their indices).
  for version in $(apt_in "$list" apt-cache showsrc "$pkg" | awk '/^Version:/{print $2}' | sort -rV | uniq); do
    dir=$work/src/$pkg-$version
    [ -d "$dir" ] && { echo "$pkg $version" >>"$work/used"; echo "$dir"; return 0; }
    dl=$work/src/dl-$pkg
    rm -rf "$dl" && mkdir -p "$dl"
    (cd "$dl" && apt_in "$list" apt-get source --download-only "$pkg=$version" >/dev/null 2>&1)
    if { [ -f "$(echo "$dl"/*.dsc)" ] && (cd "$dl" && dpkg-source --no-check -x ./*.dsc "$dir" >/dev/null); } ||
      unpack_without_dsc "$dl" "$dir"; then
      rm -rf "$dl"
      echo "$pkg $version" >>"$work/used"
      echo "$dir"
      return 0
    fi
    echo "build-deps: could not fetch $pkg $version; trying an older version" >&2
    rm -rf "$dl" "$dir"
  done
  echo "build-deps: no version of source package '$pkg' could be fetched" >&2
  return 1
}

mkdir -p "$prefix/include" "$prefix/lib" "$prefix/.built" "$work/build"
: >"$work/used"
rm -f "$prefix/.stamp"
export CFLAGS="-O2 -fPIC" CXXFLAGS="-O2 -fPIC"
# Each step is redone when its source version or recipe changed, or a step before it was redone (a failed
# run resumes where it stopped).
redone=0
needs_build() {  # needs_build NAME RECIPE...: true when the step must run; then done_step NAME after it
  local name=$1 key
  shift
  # Where the cache and the prefix are does not change what is built.
  key=$(echo "$*" | sed -e "s|$prefix|PREFIX|g" -e "s|$work|WORK|g" | sha256sum | cut -c1-16)
  if [ $redone = 0 ] && [ "$(cat "$prefix/.built/$name" 2>/dev/null)" = "$key" ]; then
    echo "build-deps: $name is up to date"
    return 1
  fi
  redone=1
  echo "$key" >"$prefix/.built/$name.pending"
  echo "build-deps: $name"
}
done_step() { mv "$prefix/.built/$1.pending" "$prefix/.built/$1"; }
cmake_build() {  # cmake_build NAME SOURCE_DIR ARGS...
  local name=$1 src=$2
  shift 2
  needs_build "$name" "$src" "$@" || return 0
  rm -rf "$work/build/$name"
  cmake -S "$src" -B "$work/build/$name" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_INSTALL_PREFIX="$prefix" \
    -DCMAKE_INSTALL_LIBDIR=lib -DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_POSITION_INDEPENDENT_CODE=ON \
    -DBUILD_SHARED_LIBS=OFF -DCMAKE_FIND_PACKAGE_PREFER_CONFIG=OFF "$@" >"$work/build/$name.log" 2>&1 ||
    { tail -30 "$work/build/$name.log"; return 1; }
  cmake --build "$work/build/$name" -j "$jobs" >>"$work/build/$name.log" 2>&1 &&
    cmake --install "$work/build/$name" >>"$work/build/$name.log" 2>&1 ||
    { tail -30 "$work/build/$name.log"; return 1; }
  done_step "$name"
}
lib=$prefix/lib
inc=$prefix/include

src=$(fetch own zlib)
if needs_build zlib "$src" configure-static; then
  (cd "$src" && make distclean >/dev/null 2>&1; ./configure --static --prefix="$prefix" --libdir="$lib" >/dev/null &&
    make -j "$jobs" libz.a >/dev/null && cp libz.a "$lib/" && cp zlib.h zconf.h "$inc/")
  done_step zlib
fi
# Zipped bioimage.io packages: minizip's unzip, from the same zlib source (Debian's libminizip-dev is built so).
if needs_build minizip "$src" unzip-static; then
  mkdir -p "$inc/minizip" "$work/build/minizip"
  (cd "$work/build/minizip" && for f in ioapi unzip; do
    gcc -O2 -fPIC -D_LARGEFILE64_SOURCE -I"$inc" -c "$src/contrib/minizip/$f.c" -o "$f.o" || exit 1
  done && ar rcs "$lib/libminizip.a" ioapi.o unzip.o) || exit 1
  cp "$src/contrib/minizip/"{ioapi.h,unzip.h,crypt.h} "$inc/minizip/"
  done_step minizip
fi

src=$(fetch own libzstd)
cmake_build zstd "$src/build/cmake" -DZSTD_BUILD_PROGRAMS=OFF -DZSTD_BUILD_SHARED=OFF \
  -DZSTD_BUILD_STATIC=ON -DZSTD_BUILD_TESTS=OFF -DZSTD_LEGACY_SUPPORT=OFF -DZSTD_MULTITHREAD_SUPPORT=ON

src=$(fetch own libdeflate)
if [ -f "$src/CMakeLists.txt" ]; then
  cmake_build libdeflate "$src" -DLIBDEFLATE_BUILD_SHARED_LIB=OFF -DLIBDEFLATE_BUILD_GZIP=OFF
elif needs_build libdeflate "$src" make-static; then
  (cd "$src" && make clean >/dev/null 2>&1; make -j "$jobs" libdeflate.a >/dev/null && cp libdeflate.a "$lib/" &&
    cp libdeflate.h "$inc/")
  done_step libdeflate
fi

src=$(fetch own libjpeg-turbo)
cmake_build libjpeg-turbo "$src" -DENABLE_SHARED=OFF -DENABLE_STATIC=ON \
  -DWITH_TURBOJPEG=OFF -DREQUIRE_SIMD=ON -DCMAKE_INSTALL_DEFAULT_LIBDIR=lib -DCMAKE_INSTALL_LIBDIR="$lib"

src=$(fetch own libpng1.6)
cmake_build libpng "$src" -DPNG_SHARED=OFF -DPNG_STATIC=ON -DPNG_TESTS=OFF \
  -DPNG_EXECUTABLES=OFF -DZLIB_ROOT="$prefix"

# The bundle's own codecs, never the system's: CMAKE_PREFIX_PATH is searched first, directory by directory, and
# holds only static libraries.
codec_paths=(-DZLIB_ROOT="$prefix" -DJPEG_ROOT="$prefix" -DPNG_ROOT="$prefix" -DTIFF_ROOT="$prefix")
src=$(fetch own tiff)
cmake_build libtiff "$src" "${codec_paths[@]}" -Dtiff-tools=OFF -Dtiff-tests=OFF -Dtiff-contrib=OFF \
  -Dtiff-docs=OFF -Dtiff-opengl=OFF -Dcxx=OFF -Djbig=OFF -Dlzma=OFF -Dwebp=OFF -Dlerc=OFF -Djpeg12=OFF \
  -Dzstd=ON -Djpeg=ON -Dzlib=ON -Dlibdeflate=ON

opencv_off=()
for w in IPP ITT TBB OPENMP OPENCL VA LAPACK EIGEN WEBP OPENEXR JASPER OPENJPEG GDAL GDCM PROTOBUF QUIRC ADE GTK QT \
  FFMPEG GSTREAMER V4L 1394 CUDA VTK OPENVX HALIDE VULKAN AVIF SPNG OBSENSOR GPHOTO2 ONNX CAROTENE IMGCODEC_SUNRASTER \
  IMGCODEC_PFM; do
  opencv_off+=("-DWITH_$w=OFF")
done
src=$(fetch own opencv)
cmake_build opencv "$src" "${codec_paths[@]}" "${opencv_off[@]}" \
  -DBUILD_LIST=core,imgproc,imgcodecs \
  -DWITH_PNG=ON -DWITH_JPEG=ON -DWITH_TIFF=ON -DWITH_PTHREADS_PF=ON -DBUILD_ZLIB=OFF -DBUILD_PNG=OFF \
  -DBUILD_JPEG=OFF -DBUILD_TIFF=OFF -DBUILD_OPENJPEG=OFF -DBUILD_WEBP=OFF -DBUILD_IPP_IW=OFF -DBUILD_ITT=OFF \
  -DBUILD_TESTS=OFF -DBUILD_PERF_TESTS=OFF -DBUILD_EXAMPLES=OFF -DBUILD_DOCS=OFF -DBUILD_opencv_apps=OFF \
  -DBUILD_JAVA=OFF -DBUILD_opencv_python3=OFF -DBUILD_opencv_python2=OFF -DOPENCV_GENERATE_PKGCONFIG=OFF \
  -DCV_TRACE=OFF -DOPENCV_LIB_INSTALL_PATH=lib -DOPENCV_3P_LIB_INSTALL_PATH=lib/opencv4/3rdparty

# HDF5's C library through its autotools build (its CMake checks fail on CMake 3.25), the library alone.
src=$(fetch own hdf5)
if needs_build hdf5 "$src" autotools-c-only; then
  rm -rf "$work/build/hdf5" && mkdir -p "$work/build/hdf5"
  (cd "$work/build/hdf5" && "$src/configure" --prefix="$prefix" --libdir="$lib" --disable-shared --enable-static \
    --with-pic --disable-fortran --disable-cxx --disable-hl --disable-java --disable-tests --disable-tools \
    --without-zlib --without-szlib --disable-maintainer-mode &&
    make -C src -j "$jobs" && make -C src install) >"$work/build/hdf5.log" 2>&1 ||
    { tail -30 "$work/build/hdf5.log"; exit 1; }
  done_step hdf5
fi

src=$(fetch own googletest)
cmake_build googletest "$src" -DBUILD_GMOCK=ON -DINSTALL_GTEST=ON

# Model cards' sha256: OpenSSL's libcrypto alone (no apps, tests or engines as modules).
src=$(fetch own openssl)
if needs_build openssl "$src" libcrypto-static; then
  (cd "$src" && make distclean >/dev/null 2>&1; ./config no-shared no-tests no-module --prefix="$prefix" \
    --libdir=lib >"$work/build/openssl.log" 2>&1 && make -j "$jobs" build_generated >>"$work/build/openssl.log" 2>&1 &&
    make -j "$jobs" libcrypto.a >>"$work/build/openssl.log" 2>&1 && cp libcrypto.a "$lib/" &&
    rm -rf "$inc/openssl" && cp -r include/openssl "$inc/") || { tail -30 "$work/build/openssl.log"; exit 1; }
  done_step openssl
fi

# Model cards' YAML (bioimage.io's rdf.yaml): the library alone.
src=$(fetch own yaml-cpp)
cmake_build yaml-cpp "$src" -DYAML_CPP_BUILD_TESTS=OFF -DYAML_CPP_BUILD_TOOLS=OFF -DYAML_CPP_BUILD_CONTRIB=OFF \
  -DYAML_BUILD_SHARED_LIBS=OFF

cli11=$(fetch own cli11)
json=$(fetch own nlohmann-json3)
spdlog=$(fetch trixie spdlog)
src=$(fetch trixie gloo)
if needs_build headers "$cli11" "$json" "$spdlog" "$src" tcp-only; then
  rm -rf "$inc/CLI" "$inc/nlohmann" "$inc/spdlog" "$inc/gloo"
  cp -r "$cli11/include/CLI" "$json/include/nlohmann" "$spdlog/include/spdlog" "$inc/"
  (cd "$src" && find gloo -name '*.h' ! -path '*/test/*' ! -path '*/benchmark/*' -exec cp --parents {} "$inc/" \;)
  # gloo's config.h is generated by its build: here from its template, the TCP transport alone (as PyTorch
  # builds gloo on Linux) and the version its CMakeLists sets.
  sed_args=(-e 's/#cmakedefine01 GLOO_HAVE_TRANSPORT_TCP$/#define GLOO_HAVE_TRANSPORT_TCP 1/'
    -e 's/#cmakedefine01 \([A-Z_]*\)/#define \1 0/')
  for part in MAJOR MINOR PATCH; do
    v=$(sed -n "s/^set(GLOO_VERSION_$part \([0-9]*\))/\1/p" "$src/CMakeLists.txt")
    sed_args+=(-e "s/@GLOO_VERSION_$part@/${v:-0}/")
  done
  sed "${sed_args[@]}" "$src/gloo/config.h.in" >"$inc/gloo/config.h"
  done_step headers
fi

# What tiler's CMake reads (-DTILER_DEPS=DIR): imported targets over the static libraries, paths relative to
# this file, so the bundle works wherever it is unpacked. OpenCV's and GoogleTest's own config files are
# relocatable already; the OpenCV targets get their codec libraries here.
strip --strip-debug "$lib"/*.a "$lib"/opencv4/3rdparty/*.a 2>/dev/null || true
opencv_3rdparty=$(find "$lib/opencv4/3rdparty" -name "*.a" -printf "opencv4/3rdparty/%f " 2>/dev/null || true)
mkdir -p "$lib/cmake/TilerDeps"
cat >"$lib/cmake/TilerDeps/TilerDepsConfig.cmake" <<EOF
# Generated by tiler's scripts/build-deps.sh. Debian sources: $(sort -u "$work/used" | tr '\n' ',' | sed 's/,$//; s/,/, /g').
get_filename_component(_td "\${CMAKE_CURRENT_LIST_DIR}/../../.." ABSOLUTE)
set(TilerDeps_ARCH "$arch")
set(TilerDeps_COMPILER "GNU $(g++ -dumpfullversion)")
set(TilerDeps_CXX11_ABI 1)
set(TilerDeps_FEATURES hdf5)
set(TilerDeps_INCLUDE_DIR "\${_td}/include")
function(_tiler_deps_static name file)
  if(NOT TARGET \${name})
    add_library(\${name} STATIC IMPORTED GLOBAL)
    set_target_properties(\${name} PROPERTIES IMPORTED_LOCATION "\${_td}/lib/\${file}"
      INTERFACE_INCLUDE_DIRECTORIES "\${_td}/include" INTERFACE_LINK_LIBRARIES "\${ARGN}")
  endif()
endfunction()
function(_tiler_deps_headers name)
  if(NOT TARGET \${name})
    add_library(\${name} INTERFACE IMPORTED GLOBAL)
    set_target_properties(\${name} PROPERTIES INTERFACE_INCLUDE_DIRECTORIES "\${_td}/include"
      INTERFACE_COMPILE_DEFINITIONS "\${ARGN}")
  endif()
endfunction()
find_package(Threads REQUIRED)
_tiler_deps_static(ZLIB::ZLIB libz.a)
_tiler_deps_static(zstd::libzstd_static libzstd.a Threads::Threads)
_tiler_deps_static(TilerDeps::deflate libdeflate.a)
_tiler_deps_static(JPEG::JPEG libjpeg.a)
_tiler_deps_static(PNG::PNG libpng16.a ZLIB::ZLIB m)
_tiler_deps_static(TIFF::TIFF libtiff.a zstd::libzstd_static TilerDeps::deflate JPEG::JPEG ZLIB::ZLIB m)
_tiler_deps_static(TilerDeps::hdf5 libhdf5.a \${CMAKE_DL_LIBS} m Threads::Threads)
set(_ocv_3p "")
foreach(f $opencv_3rdparty)
  list(APPEND _ocv_3p "\${_td}/lib/\${f}")
endforeach()
_tiler_deps_static(opencv_core libopencv_core.a ZLIB::ZLIB \${_ocv_3p} \${CMAKE_DL_LIBS} Threads::Threads m)
_tiler_deps_static(opencv_imgproc libopencv_imgproc.a opencv_core)
_tiler_deps_static(opencv_imgcodecs libopencv_imgcodecs.a opencv_imgproc opencv_core TIFF::TIFF PNG::PNG JPEG::JPEG)
set_property(TARGET opencv_core APPEND PROPERTY INTERFACE_INCLUDE_DIRECTORIES "\${_td}/include/opencv4")
_tiler_deps_static(yaml-cpp libyaml-cpp.a)
_tiler_deps_static(TilerDeps::minizip libminizip.a ZLIB::ZLIB)
set_property(TARGET TilerDeps::minizip APPEND PROPERTY INTERFACE_INCLUDE_DIRECTORIES "\${_td}/include/minizip")
_tiler_deps_static(OpenSSL::Crypto libcrypto.a \${CMAKE_DL_LIBS} Threads::Threads)
_tiler_deps_headers(CLI11::CLI11)
_tiler_deps_headers(nlohmann_json::nlohmann_json)
# spdlog header-only over LibTorch's (or the system's) fmt, itself header-only: no spdlog or fmt library.
_tiler_deps_headers(spdlog::spdlog SPDLOG_HEADER_ONLY SPDLOG_FMT_EXTERNAL FMT_HEADER_ONLY)
_tiler_deps_headers(TilerDeps::gloo_headers)
set(GTest_DIR "\${_td}/lib/cmake/GTest")
unset(_td)
EOF
# Only TilerDeps' and GoogleTest's config files stay: the others (OpenCV's, HDF5's, ...) name this machine's
# paths and are not used. Nothing left may name them.
find "$lib/cmake" -mindepth 1 -maxdepth 1 ! -name TilerDeps ! -name GTest -exec rm -rf {} +
rm -rf "$lib/pkgconfig" "$lib/libpng" "$lib"/*.la "$lib"/*.settings "$prefix/share" "$prefix/bin" "$prefix/cmake" \
  "$prefix"/*.txt "$prefix"/*.cmake
if grep -rlIF "$prefix" "$prefix"; then
  echo "build-deps: the files above name $prefix: the bundle would not be relocatable" >&2
  exit 1
fi
stamp_key >"$prefix/.stamp"
if [ -n "$tarball" ]; then
  mkdir -p "$(dirname "$tarball")"
  # One top directory, tiler-deps, whatever the prefix is called.
  tar -C "$(dirname "$prefix")" --transform "s|^$(basename "$prefix")|tiler-deps|" -cf - "$(basename "$prefix")" |
    xz -T0 -6 >"$tarball.partial"
  mv "$tarball.partial" "$tarball"
fi
echo "build-deps: $prefix ($(du -sh "$prefix" | cut -f1))${tarball:+, $tarball ($(du -h "$tarball" | cut -f1))}"
