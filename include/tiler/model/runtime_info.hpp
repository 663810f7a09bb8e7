// runtime_info: `tiler --version`'s second half, what LibTorch finds usable on this machine now (CUDA
// devices, NCCL, c10d's backends, the runtimes), after version.hpp's buildInfo. Needs LibTorch.
#pragma once

#include <string>

namespace tiler {

// buildInfo plus CUDA devices usable now, NCCL usable, c10d backends available.
std::string runtimeInfo(const std::string& tool);

}  // namespace tiler
