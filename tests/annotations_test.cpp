// Vector labels: QuPath GeoJSON annotations (level-0 pixels, or a georeferenced scene's CRS) drawn per
// window, later annotations over earlier ones, holes out, unknown classes named.
#include "tiler/io/annotations.hpp"

#include <gtest/gtest.h>

#include <fstream>
#include <opencv2/imgcodecs.hpp>

#include "qupath_util.hpp"
#include "test_util.hpp"
#include "tiler/core/error.hpp"
#include "tiler/io/image_io.hpp"

namespace tiler {
namespace {

using test::square;
using test::writeQuPathGeoJson;

TEST(Annotations, LaterAnnotationsWinHolesStayOutAndUnknownClassesAreNamed) {
  const std::string dir = test::scratchDir("annotations");
  ImageInfo info;
  info.path = dir + "/image.png";  // not georeferenced: level-0 pixels
  const std::string file = writeQuPathGeoJson(
      dir + "/a.geojson", {{"Stroma", {square(0, 0, 40, 40), square(10, 10, 20, 20)}},  // a hole
                           {"Tumor", {square(30, 0, 60, 40)}}});                        // over Stroma
  const auto labels = AnnotationLabels::read(file, info, {"Background", "Stroma", "Tumor"});
  cv::Mat classes, covered;
  // Pixels of 2 level-0 pixels (0.5 per level-0 pixel), the window from x 4 (level-0 x 8).
  labels.rasterize({4, 0, 30, 25}, 0.5, classes, covered);
  ASSERT_EQ(classes.size(), cv::Size(30, 25));
  EXPECT_EQ(classes.at<float>(2, 0), 1.0f) << "Stroma at level-0 (9, 5)";
  EXPECT_EQ(covered.at<float>(7, 3), 0.0f) << "the hole at level-0 (15, 15) is unlabelled";
  EXPECT_EQ(classes.at<float>(7, 3), 0.0f);
  EXPECT_EQ(classes.at<float>(10, 12), 2.0f) << "Tumor, drawn later, wins at level-0 (33, 21)";
  EXPECT_EQ(classes.at<float>(10, 10), 1.0f) << "Stroma alone at level-0 (29, 21)";
  EXPECT_EQ(covered.at<float>(22, 5), 0.0f) << "below every annotation";
  // Centres at level-0 x 9, 11, .. 59 (26 columns) and y 1, 3, .. 39 (20 rows), less the hole's 5 x 5.
  EXPECT_EQ(cv::countNonZero(covered), 26 * 20 - 25);
  try {
    AnnotationLabels::read(file, info, {"Background", "Tumor"});
    ADD_FAILURE() << "an unknown class was taken";
  } catch (const Error& e) {
    EXPECT_NE(e.message().find("'" + file + "': class 'Stroma' is not one of --classes (Background, Tumor)"),
              std::string::npos)
        << e.message();
  }
}

// A GeoTIFF scene's vector layer is in its CRS: the annotations are moved to its pixels by its geotransform.
TEST(Annotations, AGeoreferencedSceneTakesItsLayerInItsCrs) {
  TILER_SKIP_WITHOUT_FEATURE("gdal");
  if (test::runCommand("command -v gdal_translate").code != 0) GTEST_SKIP() << "no gdal_translate here";
  const std::string dir = test::scratchDir("annotations_crs");
  ASSERT_TRUE(cv::imwrite(dir + "/plain.tif", cv::Mat(100, 200, CV_8UC3, cv::Scalar(1, 2, 3))));
  // 2 m pixels, north up, the top-left corner at (1000, 6000): pixel (x, y) is (1000 + 2x, 6000 - 2y).
  const auto r = test::runCommand("gdal_translate -q -a_srs EPSG:32633 -a_ullr 1000 6000 1400 5800 " + dir +
                                  "/plain.tif " + dir + "/scene.tif");
  ASSERT_EQ(r.code, 0) << r.output;
  // A field of pixels x 10..30, y 20..40 in metres, classed Wheat.
  const std::string file = writeQuPathGeoJson(
      dir + "/fields.geojson", {{"Wheat", {{{1020, 5960}, {1060, 5960}, {1060, 5920}, {1020, 5920}}}}});
  ImageInfo info;
  info.path = dir + "/scene.tif";
  const auto labels = AnnotationLabels::read(file, info, {"Other", "Wheat"});
  cv::Mat classes, covered;
  labels.rasterize({0, 0, 50, 50}, 1.0, classes, covered);
  EXPECT_EQ(cv::countNonZero(covered), 20 * 20);
  EXPECT_EQ(classes.at<float>(20, 10), 1.0f);
  EXPECT_EQ(classes.at<float>(39, 29), 1.0f);
  EXPECT_EQ(covered.at<float>(40, 29), 0.0f);
  EXPECT_EQ(covered.at<float>(19, 10), 0.0f);
}

// --window_labels' CSV: classes by name or index, quoted fields, and each refusal with its line.
TEST(WindowLabels, NamesOrIndicesAndEachBadRowByItsLine) {
  const std::string dir = test::scratchDir("window_labels");
  auto write = [&](const std::string& text) {
    std::ofstream(dir + "/w.csv") << text;
    return dir + "/w.csv";
  };
  const auto rows = readWindowLabels(write("image,x,y,label\r\n\n\"a, b.png\", 512 ,1024.0,Tumor\nc,0,0,0\n"),
                                     {"Other", "Tumor"});
  ASSERT_EQ(rows.size(), 2u);
  // Excel's "CSV UTF-8" starts with a byte order mark.
  EXPECT_EQ(
      readWindowLabels(write("\xEF\xBB\xBFimage,x,y,label\r\na,0,0,Tumor\r\n"), {"Other", "Tumor"}).size(),
      1u);
  EXPECT_EQ(rows[0].image, "a, b.png");
  EXPECT_EQ(rows[0].x, 512);
  EXPECT_EQ(rows[0].y, 1024);
  EXPECT_EQ(rows[0].label, 1);
  EXPECT_EQ(rows[0].line, 3);
  EXPECT_EQ(rows[1].label, 0);
  const std::pair<std::string, std::string> bad[] = {
      {"x,y,label\n", "line 1: the header must be 'image,x,y,label'"},
      {"image,x,y,label\na,1,2\n", "line 2: 4 fields (image,x,y,label) wanted"},
      {"image,x,y,label\na,1,nan,0\n", "line 2: x and y must be numbers"},
      {"image,x,y,label\na,1,2,Stroma\n", "line 2: label 'Stroma' is neither a class of --classes nor"},
      {"image,x,y,label\na,1,2,-1\n", "line 2: label '-1' is neither"},
      {"image,x,y,label\na,1,2,0\na,1,2,1\n", "line 3: the window (1, 2) of 'a' is labelled twice"},
      {"", "empty"}};
  for (const auto& [text, expected] : bad) {
    try {
      readWindowLabels(write(text), {"Other", "Tumor"});
      ADD_FAILURE() << "taken: " << text;
    } catch (const IoError& e) {
      EXPECT_NE(e.message().find("window labels '" + dir + "/w.csv'"), std::string::npos) << e.message();
      EXPECT_NE(e.message().find(expected), std::string::npos) << e.message();
    }
  }
  for (const auto& [path, why] : {std::pair<std::string, std::string>{"/dev/null", "is a character device"},
                                  {dir + "/none.csv", "not found"}}) {
    try {
      readWindowLabels(path, {"Other"});
      ADD_FAILURE() << "taken: " << path;
    } catch (const IoError& e) {
      EXPECT_NE(e.message().find("window labels '" + path + "': " + why), std::string::npos) << e.message();
    }
  }
}

}  // namespace
}  // namespace tiler
