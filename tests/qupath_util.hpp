// QuPath's GeoJSON export written for tests: a FeatureCollection of annotations, each a Polygon with
// properties.objectType "annotation" and classification.name, as QuPath writes it.
#pragma once

#include <array>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace tiler::test {

struct QuPathFeature {
  std::string name;
  std::vector<std::vector<std::array<double, 2>>> rings;  // outer ring, then holes (closed by this writer)
};

inline std::string writeQuPathGeoJson(const std::string& path, const std::vector<QuPathFeature>& features) {
  nlohmann::json fc = {{"type", "FeatureCollection"}, {"features", nlohmann::json::array()}};
  for (const auto& f : features) {
    nlohmann::json rings = nlohmann::json::array();
    for (auto ring : f.rings) {
      ring.push_back(ring.front());
      rings.push_back(ring);
    }
    fc["features"].push_back(
        {{"type", "Feature"},
         {"geometry", {{"type", "Polygon"}, {"coordinates", rings}}},
         {"properties",
          {{"objectType", "annotation"}, {"classification", {{"name", f.name}, {"color", {1, 2, 3}}}}}}});
  }
  std::ofstream(path) << fc.dump(1);
  return path;
}

inline std::vector<std::array<double, 2>> square(double x0, double y0, double x1, double y1) {
  return {{x0, y0}, {x1, y0}, {x1, y1}, {x0, y1}};
}

}  // namespace tiler::test
