#include "tiler/core/output_kinds.hpp"

#include <utility>

namespace tiler {

std::string headKind(const std::string& head, const std::string& kind) {
  return head.empty() ? kind : head + "/" + kind;
}

std::string bareKind(const std::string& kind) {
  return kind.substr(kind.find('/') + 1);
}

std::string outputFileName(const OutputKind& row, const std::string& kind, const std::string& stem,
                           const std::string& format) {
  std::string name = row.pattern;
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
