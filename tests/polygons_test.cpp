// Polygons: GeoJSON outlines of a labels raster whose areas are pixel counts.
#include "tiler/io/polygons.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "test_util.hpp"
#include "tiler/core/error.hpp"
#include "tiler/io/image_io.hpp"

namespace fs = std::filesystem;

namespace tiler {
namespace {

// Two classes: a 10x10 square of class 2 with a 4x4 hole, and an L of class 1 touching it diagonally only.
TEST(Polygons, RegionsAreExactPixelOutlinesWithHoles) {
  TILER_SKIP_WITHOUT_FEATURE("gdal");
  const std::string dir = test::scratchDir("polygons");
  cv::Mat labels = cv::Mat::zeros(40, 50, CV_8U);
  labels(cv::Rect(5, 5, 10, 10)).setTo(2);
  labels(cv::Rect(8, 8, 4, 4)).setTo(0);
  labels(cv::Rect(15, 15, 3, 8)).setTo(1);
  labels(cv::Rect(18, 20, 6, 3)).setTo(1);
  ImageWriter w(dir + "/l.tif", 50, 40, 1, SampleType::kU8);
  w.writeRows(labels);
  w.close();
  PolygonOptions o;
  o.palette = labelPalette(3, {});
  o.input_pixels_per_label_pixel = 2.0;  // a model at half the input's resolution
  EXPECT_EQ(writePolygons(dir + "/l.tif", dir + "/p.geojson", o), 2);
  auto j = nlohmann::json::parse(test::slurp(dir + "/p.geojson"));
  ASSERT_EQ(j["features"].size(), 2u);
  for (const auto& f : j["features"]) {
    const auto& rings = f["geometry"]["coordinates"];
    double area = 0;
    for (size_t i = 0; i < rings.size(); ++i) {
      double a = 0;
      for (size_t k = 0; k + 1 < rings[i].size(); ++k)
        a += rings[i][k][0].get<double>() * rings[i][k + 1][1].get<double>() -
             rings[i][k + 1][0].get<double>() * rings[i][k][1].get<double>();
      area += (i == 0 ? 1 : -1) * std::abs(a) / 2;
    }
    const int k = f["properties"]["class"];
    // Input pixels: label pixels x 2 a side, so areas x 4.
    if (k == 2) {
      EXPECT_EQ(rings.size(), 2u) << "the hole is kept";
      EXPECT_EQ(area, (100 - 16) * 4.0);
    } else {
      EXPECT_EQ(k, 1);
      EXPECT_EQ(area, (24 + 18) * 4.0);
      EXPECT_EQ(f["properties"]["name"], "class_1");
    }
  }
  EXPECT_THROW(writePolygons(dir + "/missing.tif", dir + "/x.geojson", o), IoError);
  // A link planted at the output's name is replaced, never written through.
  std::ofstream(dir + "/victim") << "precious";
  fs::create_symlink(dir + "/victim", dir + "/linked.geojson");
  EXPECT_EQ(writePolygons(dir + "/l.tif", dir + "/linked.geojson", o), 2);
  EXPECT_EQ(test::slurp(dir + "/victim"), "precious");
  EXPECT_FALSE(fs::is_symlink(dir + "/linked.geojson"));
  EXPECT_EQ(nlohmann::json::parse(test::slurp(dir + "/linked.geojson"))["features"].size(), 2u);
  removeTree(dir);
}

// Regions whose background meets other background, or the outside, only at a pixel's corner, and regions of
// two classes in a checkerboard: every polygon valid as a consumer's GEOS judges it (ogrinfo's ST_IsValid, as
// shapely's is_valid), exact and simplified.
TEST(Polygons, EveryPolygonIsValidWhereRegionsAndHolesMeetAtCorners) {
  TILER_SKIP_WITHOUT_FEATURE("gdal");
  const std::string dir = test::scratchDir("polygons_valid");
  cv::Mat labels = cv::Mat::zeros(30, 40, CV_8U);
  const auto draw = [&](int x, int y, const std::vector<std::string>& rows) {
    for (size_t r = 0; r < rows.size(); ++r)
      for (size_t c = 0; c < rows[r].size(); ++c)
        if (rows[r][c] != '.') labels.at<uint8_t>(y + int(r), x + int(c)) = uint8_t(rows[r][c] - '0');
  };
  draw(2, 2, {"11111", "1.111", "11.11", "111.1", "1111."});   // pockets corner to corner out to the outside
  draw(10, 2, {"22222", "2.2.2", "22.22", "2.2.2", "22222"});  // background in an X
  draw(18, 2, {"1212", "2121", "1212", "2121"});               // two classes in a checkerboard
  draw(2, 12, {"2222222", "2.....2", "2.1.1.2", "2..1..2", "2.1.1.2", "2.....2", "2222222"});  // in a hole
  draw(12, 12, {"1111.", "1..1.", "1..1.", "111..", "....."});  // a ring whose gap closes at a corner
  ImageWriter w(dir + "/l.tif", 40, 30, 1, SampleType::kU8);
  w.writeRows(labels);
  w.close();
  PolygonOptions o;
  o.palette = labelPalette(3, {});
  for (double simplify : {0.0, 1.0}) {
    o.simplify = simplify;
    const std::string path = dir + "/p" + std::to_string(int(simplify)) + ".geojson";
    const int64_t n = writePolygons(dir + "/l.tif", path, o);
    EXPECT_EQ(n, 2 + 16 + 6 + 1) << "one polygon per 4-connected region";
    const std::vector<std::string> reasons = test::geometryValidity(path);
    if (reasons.empty()) GTEST_SKIP() << "no ogrinfo with SpatiaLite here";
    EXPECT_EQ(reasons, std::vector<std::string>(size_t(n), "Valid Geometry")) << "--simplify " << simplify;
  }
  removeTree(dir);
}

}  // namespace
}  // namespace tiler
