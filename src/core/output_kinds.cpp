#include "tiler/core/output_kinds.hpp"

#include "tiler/core/error.hpp"

namespace tiler {

const std::vector<OutputKind>& outputKinds() {
  static const std::vector<OutputKind> kinds = {
      {"labels", "{stem}_labels.{format}", false, "", {}, true},
      {"probs", "{stem}_probs.tif", false, "", {}, true},
      // Traced from a scratch labels TIFF of its own when labels are not saved.
      {"polygons", "{stem}_polygons.geojson", false, "gdal", {".labels.tif"}, true},
      {"zarr", "{stem}.ome.zarr", true, "", {}, false, ".zattrs"},
      {"features", "{stem}.h5", false, "hdf5"},
      // The rows go to a scratch file until the archive is written.
      {"features_pt", "{stem}.pt", false, "", {".rows"}},
      {"csv", "{stem}.csv"},
      {"tiles", "{stem}_tiles.geojson"},
      {"heatmap", "{stem}_heatmap.tif"},
      {"objects", "{stem}_objects.geojson"},
      {"objects_csv", "{stem}_objects.csv"},
      {"coco", "{stem}_coco.json"},
      {"instances", "{stem}_instances.tif", false, "", {}, true},
  };
  return kinds;
}

const OutputKind* findOutputKind(const std::string& name) {
  const std::string bare = name.substr(name.find('/') + 1);  // a head's kind is its kind's row
  for (const OutputKind& kind : outputKinds())
    if (bare == kind.name) return &kind;
  return nullptr;
}

std::string headKind(const std::string& head, const std::string& kind) {
  return head.empty() ? kind : head + "/" + kind;
}

std::string outputFileName(const std::string& kind, const std::string& stem, const std::string& format) {
  const OutputKind* row = findOutputKind(kind);
  TILER_CHECK(row != nullptr, ConfigError, "no output kind '" << kind << "'");
  std::string name = row->pattern;
  const size_t slash = kind.find('/');
  const std::string named = slash == std::string::npos ? stem : stem + "_" + kind.substr(0, slash);
  const std::pair<std::string, std::string> fields[] = {{"{stem}", named}, {"{format}", format}};
  for (const auto& [key, value] : fields) {
    const size_t at = name.find(key);
    if (at != std::string::npos) name.replace(at, key.size(), value);
  }
  return name;
}

std::vector<std::string> partialPaths(const OutputKind& kind, const std::string& path) {
  std::vector<std::string> bases = {path};
  for (const char* suffix : kind.scratch) bases.push_back(path + suffix);
  std::vector<std::string> paths;
  for (const std::string& base : bases) {
    paths.push_back(base + ".partial");
    for (int level = 1; kind.tiff_levels && level <= kMaxTiffLevels; ++level)
      paths.push_back(base + ".level" + std::to_string(level) + ".partial");
  }
  return paths;
}

}  // namespace tiler
