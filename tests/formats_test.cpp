// writers/formats: the one table of --save's formats.
#include "tiler/writers/formats.hpp"

#include <gtest/gtest.h>

#include <cstring>
#include <set>

#include "tiler/core/error.hpp"

using namespace tiler;

// Every row is whole: a name once, a file name once, one opener for what it consumes (the instance formats
// are written by the instances consumer itself), and any `after` an earlier row.
TEST(Formats, EveryRowIsWhole) {
  std::set<std::string> names, patterns;
  for (const OutputFormat& format : outputFormats()) {
    const std::string name = format.naming.name;
    EXPECT_TRUE(names.insert(name).second) << name;
    EXPECT_TRUE(patterns.insert(format.naming.pattern).second) << name;
    EXPECT_GT(std::strlen(format.summary), 10u) << name;
    const int openers =
        int(format.open.map != nullptr) + int(format.open.row != nullptr) + int(format.open.box != nullptr);
    // Objects and classified windows alike (objects_store): a row and a box opener.
    if (format.consumes == Consumes::kStoredObjects)
      EXPECT_TRUE(format.open.row != nullptr && format.open.box != nullptr && format.open.map == nullptr)
          << name;
    else
      EXPECT_LE(openers, 1) << name;
    const bool map = format.consumes == Consumes::kMapValues || format.consumes == Consumes::kMapLabels;
    const bool row =
        format.consumes == Consumes::kWindowScores || format.consumes == Consumes::kWindowVectors;
    if (map) EXPECT_NE(format.open.map, nullptr) << name;
    if (row) EXPECT_NE(format.open.row, nullptr) << name;
    if (format.consumes == Consumes::kBoxes) EXPECT_NE(format.open.box, nullptr) << name;
    if (*format.after) EXPECT_TRUE(names.count(format.after)) << name << " reads " << format.after;
    EXPECT_TRUE(std::strcmp(format.after, format.naming.name) != 0) << name;
  }
  EXPECT_EQ(findOutputFormat("nothing"), nullptr);
  EXPECT_THROW(outputNaming("nothing"), ConfigError);
}

TEST(Formats, AHeadsKindIsItsKindsRow) {
  const OutputFormat* zarr = findOutputFormat("np/zarr");
  ASSERT_NE(zarr, nullptr);
  EXPECT_EQ(zarr, findOutputFormat("zarr"));
  EXPECT_TRUE(zarr->naming.directory);
  EXPECT_STRNE(zarr->naming.complete_when, "");
  EXPECT_EQ(findOutputFormat("np/nothing"), nullptr);
  EXPECT_EQ(outputFileName(outputNaming("np/labels"), "np/labels", "slide", "png"), "slide_np_labels.png");
}

// The polygons are traced from the labels file when both are saved: the labels writer must exist first.
TEST(Formats, PolygonsAreMadeAfterTheLabelsTheyRead) {
  const OutputFormat* polygons = findOutputFormat("polygons");
  ASSERT_NE(polygons, nullptr);
  EXPECT_STREQ(polygons->after, "labels");
  EXPECT_STREQ(polygons->feature, "gdal");
  EXPECT_LT(findOutputFormat("labels"), polygons);
  EXPECT_STREQ(findOutputFormat("features")->feature, "hdf5");
}
