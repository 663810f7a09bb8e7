#include "tiler/io/classes.hpp"

#include <algorithm>
#include <sstream>

#include "tiler/core/error.hpp"

namespace tiler {

namespace {

// 20 colours far apart (Tableau-like), for classes 1..; class 0 stays black.
constexpr std::array<std::array<uint8_t, 3>, 20> kPalette{
    {{31, 119, 180},  {255, 127, 14},  {44, 160, 44},   {214, 39, 40},   {148, 103, 189},
     {140, 86, 75},   {227, 119, 194}, {127, 127, 127}, {188, 189, 34},  {23, 190, 207},
     {174, 199, 232}, {255, 187, 120}, {152, 223, 138}, {255, 152, 150}, {197, 176, 213},
     {196, 156, 148}, {247, 182, 210}, {199, 199, 199}, {219, 219, 141}, {158, 218, 229}}};

std::array<uint8_t, 3> defaultColor(int k) {
  return k == 0 ? std::array<uint8_t, 3>{0, 0, 0} : distinctColor(k - 1);
}

}  // namespace

std::string defaultClassName(int k) {
  return "class_" + std::to_string(k);
}

std::array<uint8_t, 3> distinctColor(int k) {
  return kPalette[size_t(k) % kPalette.size()];
}

std::vector<ClassInfo> parseClasses(const std::string& text) {
  std::vector<ClassInfo> out;
  if (text.empty()) return out;
  std::stringstream ss(text);
  std::string part;
  while (std::getline(ss, part, ',')) {
    ClassInfo c;
    const auto colon = part.find(":#");
    c.name = part.substr(0, colon);
    c.color = defaultColor(int(out.size()));
    if (colon != std::string::npos) {
      const std::string hex = part.substr(colon + 2);
      unsigned v = 0;
      size_t used = 0;
      try {
        v = unsigned(std::stoul(hex, &used, 16));
      } catch (const std::exception&) {
        used = 0;
      }
      TILER_CHECK(hex.size() == 6 && used == 6, ConfigError,
                  "--classes: '" << part << "': a colour is #rrggbb (six hex digits)");
      c.color = {uint8_t(v >> 16), uint8_t(v >> 8), uint8_t(v)};
      c.colored = true;
    }
    TILER_CHECK(!c.name.empty(), ConfigError, "--classes: empty class name in '" << utf8Safe(text) << "'");
    TILER_CHECK(isUtf8(c.name), ConfigError, "--classes: '" << utf8Safe(c.name) << "' is not UTF-8 text");
    TILER_CHECK(std::none_of(c.name.begin(), c.name.end(),
                             [](char ch) { return static_cast<unsigned char>(ch) < 0x20 || ch == 0x7f; }),
                ConfigError,
                "--classes: class " << out.size() << " holds a control character (a line break?)");
    for (const auto& earlier : out)
      TILER_CHECK(earlier.name != c.name, ConfigError,
                  "--classes: '" << c.name << "' is named twice (each class needs a name of its own)");
    out.push_back(c);
  }
  return out;
}

std::vector<std::array<uint8_t, 3>> labelPalette(int classes, const std::vector<ClassInfo>& named) {
  std::vector<std::array<uint8_t, 3>> palette;
  for (int k = 0; k < classes; ++k)
    palette.push_back(k < int(named.size()) ? named[size_t(k)].color : defaultColor(k));
  return palette;
}

}  // namespace tiler
