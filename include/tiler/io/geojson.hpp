// geojson: the one GeoJSON writer of every vector output (the stitched map's polygons, a classifier's tiles,
// detected and instance objects).
// Promise: one text form for all of them: a FeatureCollection (with the CRS's name where coordinates are in
// one), one Feature a line, its members in one order (`id`, `geometry`, `properties`: `id`, `objectType`, the
// output's own, QuPath's `classification {name, color}`, `measurements`), and measurements that are not
// finite numbers left out (JSON has no NaN; QuPath reads a missing measurement as NaN). The text goes to the
// caller's sink in order, a feature at a time: memory holds one feature. No LibTorch.
#pragma once

#include <array>
#include <cmath>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>

#include "tiler/io/classes.hpp"

namespace tiler {

// A feature's measurements, as JSON members' text; a value that is not a finite number is left out.
class GeoJsonMeasurements {
 public:
  template <typename Number>
  GeoJsonMeasurements& add(std::string_view name, Number value) {
    static_assert(std::is_arithmetic_v<Number>);
    if constexpr (std::is_floating_point_v<Number>)
      if (!std::isfinite(value)) return *this;
    addText(name, numberText(value));
    return *this;
  }
  const std::string& text() const { return text_; }

 private:
  static std::string numberText(double value);
  static std::string numberText(float value);
  static std::string numberText(int64_t value);
  template <typename Integer>
  static std::string numberText(Integer value) {
    return numberText(int64_t(value));
  }
  void addText(std::string_view name, const std::string& value);
  std::string text_;
};

struct GeoJsonFeature {
  std::optional<int64_t>
      id;                   // the feature's id, also as a property (GeoPandas and other tables read it there)
  std::string geometry;     // the geometry object's JSON text
  std::string object_type;  // QuPath's objectType ("tile", "detection"); empty: none
  std::string properties;   // the output's own properties, JSON members' text ("\"class\": 1"); may be empty
  const ClassInfo* classification = nullptr;        // not owned; null: none (e.g. every score was NaN)
  std::optional<GeoJsonMeasurements> measurements;  // absent: no `measurements` member
};

// A Polygon's geometry text from its four corners in order (the ring is closed here).
std::string quadGeometry(const std::array<std::array<double, 2>, 4>& corners);

// Writes one FeatureCollection through `sink`, a piece of text at a time.
class GeoJsonWriter {
 public:
  // `crs`: the coordinates' CRS name (written as the collection's `crs`); empty: pixels.
  explicit GeoJsonWriter(std::function<void(const std::string&)> sink, const std::string& crs = "");
  void add(const GeoJsonFeature& feature);
  // Closes the collection; the writer takes no more features.
  void finish();
  int64_t features() const { return features_; }

 private:
  std::function<void(const std::string&)> sink_;
  int64_t features_ = 0;
};

}  // namespace tiler
