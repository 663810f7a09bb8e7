#include "tiler/io/geojson.hpp"

#include <spdlog/fmt/fmt.h>

#include <nlohmann/json.hpp>

namespace tiler {

std::string GeoJsonMeasurements::numberText(double value) {
  return fmt::format("{}", value);
}
std::string GeoJsonMeasurements::numberText(float value) {
  return fmt::format("{}", value);
}
std::string GeoJsonMeasurements::numberText(int64_t value) {
  return std::to_string(value);
}

void GeoJsonMeasurements::addText(std::string_view name, const std::string& value) {
  text_ +=
      fmt::format("{}{}: {}", text_.empty() ? "" : ", ", nlohmann::json(std::string(name)).dump(), value);
}

std::string quadGeometry(const std::array<std::array<double, 2>, 4>& c) {
  return fmt::format(
      "{{\"type\": \"Polygon\", \"coordinates\": [[[{},{}],[{},{}],[{},{}],[{},{}],[{},{}]]]}}", c[0][0],
      c[0][1], c[1][0], c[1][1], c[2][0], c[2][1], c[3][0], c[3][1], c[0][0], c[0][1]);
}

GeoJsonWriter::GeoJsonWriter(std::function<void(const std::string&)> sink, const std::string& crs)
    : sink_(std::move(sink)) {
  sink_(std::string("{\"type\": \"FeatureCollection\", ") +
        (crs.empty() ? ""
                     : "\"crs\": {\"type\": \"name\", \"properties\": {\"name\": " +
                           nlohmann::json(crs).dump() + "}}, ") +
        "\"features\": [");
}

void GeoJsonWriter::add(const GeoJsonFeature& f) {
  std::string properties;
  const auto member = [&properties](const std::string& text) {
    if (text.empty()) return;
    properties += (properties.empty() ? "" : ", ") + text;
  };
  if (f.id) member(fmt::format("\"id\": {}", *f.id));
  if (!f.object_type.empty()) member("\"objectType\": " + nlohmann::json(f.object_type).dump());
  member(f.properties);
  if (f.classification) {
    const auto& c = f.classification->color;
    member(fmt::format("\"classification\": {{\"name\": {}, \"color\": [{},{},{}]}}",
                       nlohmann::json(f.classification->name).dump(), c[0], c[1], c[2]));
  }
  if (f.measurements) member("\"measurements\": {" + f.measurements->text() + "}");
  sink_(fmt::format("{}\n{{\"type\": \"Feature\", {}\"geometry\": {}, \"properties\": {{{}}}}}",
                    features_ ? "," : "", f.id ? fmt::format("\"id\": {}, ", *f.id) : "", f.geometry,
                    properties));
  ++features_;
}

void GeoJsonWriter::finish() {
  sink_("\n]}\n");
}

}  // namespace tiler
