// version: what `--version` prints. buildInfo() needs no LibTorch at run time (ctrun uses it);
// runtimeInfo() asks LibTorch what is usable on this machine (tiler uses it).
#pragma once

#include <string>

namespace tiler {

// tiler version, LibTorch version compiled against, CUDA/NCCL compiled in.
std::string buildInfo(const std::string& tool);
// buildInfo plus CUDA devices usable now, NCCL usable, c10d backends available.
std::string runtimeInfo(const std::string& tool);

}  // namespace tiler
