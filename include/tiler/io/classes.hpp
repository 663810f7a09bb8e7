// classes: the classes a model's outputs are named and coloured by (--classes, the default names, the labels
// palette), which every output that names a class shares. Promise: one name and one colour per class in every
// output; --classes refused (ConfigError) where a name would break a CSV or JSON. No LibTorch.
#pragma once

#include <array>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

namespace tiler {

// A class as --classes names it: "name" or "name:#rrggbb".
struct ClassInfo {
  std::string name;
  std::array<uint8_t, 3> color{0, 0, 0};
  bool colored = false;  // the colour was given (name:#rrggbb)
};
// Parses --classes; classes without a colour get the default palette's (class 0: black). Refuses
// (ConfigError) an empty name, a repeated one (the scores are keyed by name), control characters (they break
// the CSV) and text that is not UTF-8 (the report and GeoJSON are JSON).
std::vector<ClassInfo> parseClasses(const std::string& text);
// The class of the highest of `count` scores (the first of equals). NaN never wins: -1 when every score is
// NaN, or there are none.
template <typename Score>
int highestClass(const Score* scores, size_t count) {
  int best = -1;
  for (size_t k = 0; k < count; ++k)
    if (!std::isnan(scores[k]) && (best < 0 || scores[k] > scores[size_t(best)])) best = int(k);
  return best;
}
// The name of class k where --classes names none: "class_<k>", in every output.
std::string defaultClassName(int k);
// The k-th of 20 colours far apart (k = 0, 1, ...), for classes that are all real (no background).
std::array<uint8_t, 3> distinctColor(int k);
// The labels palette for `classes` classes: class 0 black, then 20 distinct colours in turn, with --classes'
// colours where given.
std::vector<std::array<uint8_t, 3>> labelPalette(int classes, const std::vector<ClassInfo>& named);

}  // namespace tiler
