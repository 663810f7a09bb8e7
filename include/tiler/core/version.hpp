// version: what `--version` prints of the build: buildInfo() and the optional features need no LibTorch
// (ctrun uses them); runtime_info.hpp adds what LibTorch finds usable on this machine (tiler's --version).
#pragma once

#include <string>
#include <vector>

namespace tiler {

// tiler version, LibTorch version compiled against, CUDA/NCCL and the optional features compiled in.
std::string buildInfo(const std::string& tool);
// The optional features (CMake's TILER_WITH_GDAL, _OPENSLIDE, _HDF5) and whether this build has each.
struct OptionalFeature {
  std::string name;    // "gdal", "openslide", "hdf5"
  bool built;          // compiled in
  std::string serves;  // what needs it
  std::string option;  // the CMake option, and the Debian package that provides the library
};
const std::vector<OptionalFeature>& optionalFeatures();
// Throws ConfigError when feature `name` is not built in: one line naming `needed_by`, the feature, and how
// to build it in. Does nothing when it is.
void requireFeature(const std::string& name, const std::string& needed_by);

}  // namespace tiler
