#include "tiler/version.hpp"

#include <sstream>

namespace tiler {

std::string buildInfo(const std::string& tool) {
  std::ostringstream os;
  os << tool << " " << TILER_VERSION << "\n";
  os << "LibTorch: " << TILER_TORCH_VERSION << "\n";
  os << "CUDA compiled: " << (TILER_WITH_CUDA ? "yes" : "no") << "\n";
  os << "NCCL compiled: " << (TILER_WITH_NCCL ? "yes" : "no") << "\n";
  return os.str();
}

}  // namespace tiler
