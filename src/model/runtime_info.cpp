#include "tiler/model/runtime_info.hpp"

#include <torch/cuda.h>

#include <sstream>

#include "tiler/core/platform.hpp"
#include "tiler/core/version.hpp"
#include "tiler/io/catalog.hpp"
#include "tiler/model/model_runtime.hpp"
#include "tiler/model/torch_compat.hpp"

namespace tiler {

std::string runtimeInfo(const std::string& tool) {
  std::ostringstream os;
  os << buildInfo(tool);
  const bool cuda = torch::cuda::is_available();
  os << "CUDA usable: "
     << (cuda ? "yes (" + std::to_string(torch::cuda::device_count()) + " device(s))" : "no") << "\n";
  os << "NCCL usable: " << (compat::kNcclCompiled && cuda ? "yes" : "no") << "\n";
  os << "c10d backends: gloo" << (compat::kNcclCompiled ? ", nccl" : "") << "\n";
  os << "Model runtimes: torchscript" << (pt2Supported() ? ", pt2 (AOTInductor packages)" : "") << "\n";
  os << "Bundled samples: " << bundledSamplesDir() << "\n";
  return os.str();
}

}  // namespace tiler
