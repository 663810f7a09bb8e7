#include "tiler/cli.hpp"

#include <sstream>

namespace tiler {

std::string flagNames(const std::string& names) {
  std::string out = names;
  std::stringstream ss(names);
  std::string part;
  while (std::getline(ss, part, ',')) {
    if (part.rfind("--", 0) != 0 || part.find('_') == std::string::npos) continue;
    std::string kebab = part;
    for (auto& c : kebab) c = c == '_' ? '-' : c;
    out += "," + kebab;
  }
  return out;
}

}  // namespace tiler
