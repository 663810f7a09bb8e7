// version: what `--version` prints. buildInfo() needs no LibTorch at run time (ctrun uses it);
// runtimeInfo() asks LibTorch what is usable on this machine (tiler uses it).
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

// buildInfo plus CUDA devices usable now, NCCL usable, c10d backends available.
std::string runtimeInfo(const std::string& tool);

}  // namespace tiler
