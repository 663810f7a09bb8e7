// output_kinds: how an output is named from its kind's naming row (the rows themselves: formats_test).
#include "tiler/core/output_kinds.hpp"

#include <gtest/gtest.h>

#include <algorithm>

using namespace tiler;

namespace {

const OutputKind kFile{"mask", "{stem}_mask.{format}", false, {}, true};
const OutputKind kStore{"store", "{stem}.store", true, {}, false, ".done"};
const OutputKind kScratched{"traced", "{stem}_traced.json", false, {".raster.tif"}, true};
const OutputKind kPlain{"table", "{stem}.csv", false, {".rows"}};

}  // namespace

TEST(OutputKinds, FileNamesComeFromTheRow) {
  EXPECT_EQ(outputFileName(kFile, "mask", "a", "png"), "a_mask.png");
  EXPECT_EQ(outputFileName(kStore, "store", "a", "png"), "a.store");
  EXPECT_EQ(outputFileName(kPlain, "table", "slide.v2", "tif"), "slide.v2.csv");
}

// A head of a model with several outputs writes its kinds under <stem>_<head>_...
TEST(OutputKinds, AHeadsKindsAreNamedAfterTheStemAndTheHead) {
  EXPECT_EQ(headKind("np", "mask"), "np/mask");
  EXPECT_EQ(headKind("", "mask"), "mask");
  EXPECT_EQ(bareKind("np/mask"), "mask");
  EXPECT_EQ(bareKind("mask"), "mask");
  EXPECT_EQ(outputFileName(kFile, headKind("np", "mask"), "slide", "tif"), "slide_np_mask.tif");
  EXPECT_EQ(outputFileName(kStore, headKind("hv", "store"), "slide", "tif"), "slide_hv.store");
}

// The stale-partial sweep reads what each writer leaves from its row: scratch files and TIFF levels, a
// scratch's levels too.
TEST(OutputKinds, PartialPathsComeFromTheRow) {
  const auto has = [](const std::vector<std::string>& paths, const std::string& path) {
    return std::find(paths.begin(), paths.end(), path) != paths.end();
  };
  const auto traced = partialPaths(kScratched, "o/s_traced.json");
  EXPECT_EQ(traced.front(), "o/s_traced.json.partial");
  EXPECT_TRUE(has(traced, "o/s_traced.json.raster.tif.partial"));
  EXPECT_TRUE(has(traced, "o/s_traced.json.raster.tif.level1.partial"));
  EXPECT_TRUE(has(traced, "o/s_traced.json.raster.tif.level" + std::to_string(kMaxTiffLevels) + ".partial"));
  EXPECT_EQ(traced.size(), size_t(2 * (1 + kMaxTiffLevels)));
  EXPECT_EQ(partialPaths(kPlain, "o/s.csv"),
            (std::vector<std::string>{"o/s.csv.partial", "o/s.csv.rows.partial"}));
  EXPECT_EQ(partialPaths(kStore, "o/s.store"), std::vector<std::string>{"o/s.store.partial"});
  EXPECT_TRUE(has(partialPaths(kFile, "o/s_mask.tif"), "o/s_mask.tif.level3.partial"));
}
