// The one GeoJSON writer: its text is JSON that json parsers read, one feature a line, members in one order,
// non-finite measurements left out, the CRS where there is one.
#include "tiler/io/geojson.hpp"

#include <gtest/gtest.h>

#include <limits>
#include <nlohmann/json.hpp>

namespace tiler {
namespace {

std::string written(const std::vector<GeoJsonFeature>& features, const std::string& crs = "") {
  std::string text;
  GeoJsonWriter writer([&text](const std::string& piece) { text += piece; }, crs);
  for (const auto& f : features) writer.add(f);
  EXPECT_EQ(writer.features(), int64_t(features.size()));
  writer.finish();
  return text;
}

TEST(GeoJson, AnEmptyCollectionIsValidJson) {
  const auto j = nlohmann::json::parse(written({}));
  EXPECT_EQ(j["type"], "FeatureCollection");
  EXPECT_TRUE(j["features"].empty());
  EXPECT_FALSE(j.contains("crs"));
}

TEST(GeoJson, MembersComeInOneOrderAndEachFeatureOnALine) {
  const ClassInfo tumour{"tum\"our", {255, 128, 0}, true};
  GeoJsonFeature a;
  a.id = 7;
  a.geometry = quadGeometry({{{0, 0}, {2.5, 0}, {2.5, 4}, {0, 4}}});
  a.object_type = "detection";
  a.properties = "\"class\": 1";
  a.classification = &tumour;
  a.measurements = GeoJsonMeasurements().add("area", 10.0).add("score", 0.5f).add("count", 3);
  GeoJsonFeature b;
  b.geometry = quadGeometry({{{1, 1}, {2, 1}, {2, 2}, {1, 2}}});
  const std::string text = written({a, b}, "EPSG:32633");
  EXPECT_EQ(
      text,
      "{\"type\": \"FeatureCollection\", \"crs\": {\"type\": \"name\", \"properties\": {\"name\": "
      "\"EPSG:32633\"}}, \"features\": [\n"
      "{\"type\": \"Feature\", \"id\": 7, \"geometry\": {\"type\": \"Polygon\", \"coordinates\": "
      "[[[0,0],[2.5,0],[2.5,4],[0,4],[0,0]]]}, \"properties\": {\"id\": 7, \"objectType\": \"detection\", "
      "\"class\": 1, \"classification\": {\"name\": \"tum\\\"our\", \"color\": [255,128,0]}, "
      "\"measurements\": {\"area\": 10, \"score\": 0.5, \"count\": 3}}},\n"
      "{\"type\": \"Feature\", \"geometry\": {\"type\": \"Polygon\", \"coordinates\": "
      "[[[1,1],[2,1],[2,2],[1,2],[1,1]]]}, \"properties\": {}}\n]}\n");
  const auto j = nlohmann::json::parse(text);
  EXPECT_EQ(j["features"][0]["properties"]["classification"]["name"], "tum\"our");
  EXPECT_EQ(j["crs"]["properties"]["name"], "EPSG:32633");
}

TEST(GeoJson, MeasurementsThatAreNotFiniteNumbersAreLeftOut) {
  GeoJsonFeature f;
  f.geometry = quadGeometry({{{0, 0}, {1, 0}, {1, 1}, {0, 1}}});
  f.measurements = GeoJsonMeasurements()
                       .add("nan", std::numeric_limits<float>::quiet_NaN())
                       .add("inf", std::numeric_limits<double>::infinity())
                       .add("prob_\xc3\xa9", 0.25f);
  const auto j = nlohmann::json::parse(written({f}));
  const auto& m = j["features"][0]["properties"]["measurements"];
  EXPECT_EQ(m.size(), 1u);
  EXPECT_EQ(m["prob_\xc3\xa9"], 0.25);
  // Present but empty where every score was left out: QuPath reads each missing one as NaN.
  f.measurements = GeoJsonMeasurements().add("nan", std::numeric_limits<double>::quiet_NaN());
  EXPECT_TRUE(nlohmann::json::parse(written({f}))["features"][0]["properties"]["measurements"].empty());
}

}  // namespace
}  // namespace tiler
