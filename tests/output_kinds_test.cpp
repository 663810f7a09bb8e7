// output_kinds: the one table of --save's kinds.
#include "tiler/core/output_kinds.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <set>

#include "tiler/core/error.hpp"

using namespace tiler;

TEST(OutputKinds, FileNamesComeFromTheRow) {
  EXPECT_EQ(outputFileName("instances", "a", "png"), "a_instances.tif");
  EXPECT_EQ(outputFileName("features", "a", "tif"), "a.h5");
  EXPECT_EQ(outputFileName("features_pt", "a", "tif"), "a.pt");
  EXPECT_EQ(outputFileName("tiles", "a", "tif"), "a_tiles.geojson");
  EXPECT_EQ(outputFileName("heatmap", "a", "png"), "a_heatmap.tif");
}

// Every row is whole: a name once, a file name once (which tasks write it is theirs: tasks_test).
TEST(OutputKinds, TheTableIsConsistent) {
  std::set<std::string> names, patterns;
  for (const OutputKind& kind : outputKinds()) {
    EXPECT_TRUE(names.insert(kind.name).second) << kind.name;
    EXPECT_TRUE(patterns.insert(kind.pattern).second) << kind.name;
  }
  EXPECT_EQ(findOutputKind("nothing"), nullptr);
  EXPECT_THROW(outputFileName("nothing", "a", "tif"), ConfigError);
}

TEST(OutputKinds, AStoreIsADirectory) {
  const OutputKind* zarr = findOutputKind("zarr");
  ASSERT_NE(zarr, nullptr);
  EXPECT_TRUE(zarr->directory);
  EXPECT_EQ(outputFileName("zarr", "slide", "png"), "slide.ome.zarr");
  EXPECT_FALSE(findOutputKind("labels")->directory);
  EXPECT_EQ(std::string(findOutputKind("polygons")->feature), "gdal");
  EXPECT_EQ(std::string(findOutputKind("features")->feature), "hdf5");
}

// The stale-partial sweep reads what each writer leaves from its row: scratch files and TIFF levels, a
// scratch's levels too (polygons' own labels TIFF under --pyramid).
TEST(OutputKinds, PartialPathsComeFromTheRow) {
  const auto has = [](const std::vector<std::string>& paths, const std::string& path) {
    return std::find(paths.begin(), paths.end(), path) != paths.end();
  };
  const auto polygons = partialPaths(*findOutputKind("polygons"), "o/s_polygons.geojson");
  EXPECT_EQ(polygons.front(), "o/s_polygons.geojson.partial");
  EXPECT_TRUE(has(polygons, "o/s_polygons.geojson.labels.tif.partial"));
  EXPECT_TRUE(has(polygons, "o/s_polygons.geojson.labels.tif.level1.partial"));
  EXPECT_TRUE(
      has(polygons, "o/s_polygons.geojson.labels.tif.level" + std::to_string(kMaxTiffLevels) + ".partial"));
  const auto pt = partialPaths(*findOutputKind("features_pt"), "o/s.pt");
  EXPECT_EQ(pt, (std::vector<std::string>{"o/s.pt.partial", "o/s.pt.rows.partial"}));
  EXPECT_TRUE(has(partialPaths(*findOutputKind("probs"), "o/s_probs.tif"), "o/s_probs.tif.level3.partial"));
  EXPECT_EQ(partialPaths(*findOutputKind("zarr"), "o/s.ome.zarr"),
            std::vector<std::string>{"o/s.ome.zarr.partial"});
  EXPECT_EQ(partialPaths(*findOutputKind("csv"), "o/s.csv"), std::vector<std::string>{"o/s.csv.partial"});
}

// A head of a model with several outputs writes its kinds under <stem>_<head>_...; its kind is its row's.
TEST(OutputKinds, AHeadsKindsAreNamedAfterTheStemAndTheHead) {
  EXPECT_EQ(headKind("np", "labels"), "np/labels");
  EXPECT_EQ(headKind("", "labels"), "labels");
  EXPECT_EQ(outputFileName(headKind("np", "labels"), "slide", "tif"), "slide_np_labels.tif");
  EXPECT_EQ(outputFileName(headKind("hv", "zarr"), "slide", "tif"), "slide_hv.ome.zarr");
  EXPECT_EQ(outputFileName(headKind("0", "features"), "slide", "tif"), "slide_0.h5");
  ASSERT_NE(findOutputKind("np/zarr"), nullptr);
  EXPECT_TRUE(findOutputKind("np/zarr")->directory);
  EXPECT_EQ(findOutputKind("np/nothing"), nullptr);
}
