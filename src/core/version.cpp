#include "tiler/core/version.hpp"

#include <sstream>

#include "tiler/core/error.hpp"

namespace tiler {

std::string buildInfo(const std::string& tool) {
  std::ostringstream os;
  os << tool << " " << TILER_VERSION << "\n";
  os << "LibTorch: " << TILER_TORCH_VERSION << "\n";
  os << "CUDA compiled: " << (TILER_WITH_CUDA ? "yes" : "no") << "\n";
  os << "NCCL compiled: " << (TILER_WITH_NCCL ? "yes" : "no") << "\n";
  os << "Optional features:";
  for (const OptionalFeature& f : optionalFeatures()) os << " " << f.name << (f.built ? " yes" : " no");
  os << "\n";
  return os.str();
}

const std::vector<OptionalFeature>& optionalFeatures() {
  static const std::vector<OptionalFeature> features = {
      {"gdal", TILER_WITH_GDAL != 0, "--save polygons, remote inputs",
       "-DTILER_WITH_GDAL=ON with libgdal-dev"},
      {"openslide", TILER_WITH_OPENSLIDE != 0, "vendor whole-slide formats (.svs, .ndpi, .mrxs, ...)",
       "-DTILER_WITH_OPENSLIDE=ON with libopenslide-dev"},
      {"hdf5", TILER_WITH_HDF5 != 0, "--save features", "-DTILER_WITH_HDF5=ON with libhdf5-dev"},
  };
  return features;
}

void requireFeature(const std::string& name, const std::string& needed_by) {
  for (const OptionalFeature& f : optionalFeatures()) {
    if (f.name != name) continue;
    TILER_CHECK(f.built, ConfigError,
                needed_by << " needs " << f.name << ", which this tiler was built without (it serves "
                          << f.serves << "): rebuild with " << f.option);
    return;
  }
  TILER_THROW(ConfigError, "unknown optional feature '" << name << "'");
}

}  // namespace tiler
